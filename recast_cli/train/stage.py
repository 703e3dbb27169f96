"""The ``recast train`` stage, top to bottom (docs/method.md §6): the one function its command calls.

1. Load the setting, once: its ``[train]`` table, then ``--set KEY=VALUE`` and the named flags.
2. Plan the run (``train/plan``): every check before a byte is written, on that setting object.
3. Build the trainer and open the run in it (``with Trainer(plan)``: the run folder's lock is held
   until the block ends), train to ``max_steps``.
4. Say what was trained: the steps, the W, and the aggregate reward Σλ·r at the start and the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.setting.load import load_setting
from recast_cli.train.config import apply_overrides, config_from_setting


def train(setting_name: str, weights: str, out: Path, *, resume: bool = False, init: str | None = None,
          overrides: list[str] | None = None, flags: dict[str, Any] | None = None, device: str | None = None,
          quiet: bool = False, lines: bool = False) -> str | None:
    """Train a run of the setting ``setting_name`` with W ``weights`` (a file, or ``static``) into ``out``.

    Returns the line to print (None on the processes but the first, after training); BadInput for
    anything the user can fix, before a byte is written.
    """
    from recast_cli.train.plan import plan_run
    from recast_cli.train.trainer import Trainer  # torch: loaded once the command runs

    setting = load_setting(setting_name)
    cfg = apply_overrides(config_from_setting(setting), overrides or [], flags or {})
    if device not in (None, "cpu", "cuda"):
        raise BadInput(f"--device must be cpu or cuda, got {device!r}")
    plan = plan_run(setting, cfg, weights, out, resume, init, device)
    with Trainer(plan, quiet=quiet, lines=lines) as trainer:
        start = trainer.iteration
        if start >= cfg.max_steps:
            return f"{out} is already at step {start} (max_steps {cfg.max_steps}); nothing to do"
        trainer.train()
        return summary(trainer, start, out) if trainer.rank == 0 else None


def summary(trainer, start: int, out: Path) -> str:
    """The steps trained from ``start`` on, the W, and the aggregate reward Σλ·r over the first and the
    last pass over the prompts (per-step means differ by prompt; pass means compare)."""
    cfg = trainer.cfg
    rows = {r["step"]: r["aggregate"] for r in trainer.metrics.rows}
    steps = sorted(rows)
    k = min(-(-len(trainer.plan.prompts) // cfg.prompts_per_step), max(len(steps) // 2, 1))
    head, tail = steps[:k], steps[-k:]

    def mean(s: list[int]) -> float:
        return sum(rows[i] for i in s) / len(s)

    def span(s: list[int]) -> str:
        return f"step {s[0]}" if len(s) == 1 else f"steps {s[0]}-{s[-1]}"

    what = (f"{span(head)}: {mean(head):.4f}" if head == tail else
            f"mean over {span(head)}: {mean(head):.4f}, {span(tail)}: {mean(tail):.4f}")
    end = trainer.iteration
    trained = f"step {end}" if end == start + 1 else f"steps {start + 1}..{end}"
    return f"trained {trained} ({trainer.plan.weights.mode} W) → {out}; aggregate reward Σλ·r, {what}"
