"""``recast inspect``: a summary rendered with rich (a provenance panel and a per-reward table)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from recast_cli.grid import GridSpec
from recast_cli.inspect.summarise import sparkline
from recast_cli.solve.conflict import compact_steps

#: A kind's renderer: adds its facts to the provenance grid and returns its table (or None).
Renderer = Callable[[dict[str, Any], Table], Table | None]


def render_summary(summary: dict[str, Any], path: str, console: Console, renderer: Renderer) -> None:
    """Print a summary as a provenance panel (common to every kind) and its kind's table (``renderer``)."""
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("schema", summary.get("schema") or "?")
    if "created_at" in summary:
        facts.add_row("created", f"{summary['created_at']} by recast {summary.get('recast_version', '?')}")
    # provenance sources are {path, sha256}; a positives summary's "sources" names its image generators instead
    sources = [s for s in summary.get("sources", []) if isinstance(s, dict)]
    for source in sources if len(sources) <= 5 else sources[:3]:
        facts.add_row("source", f"{source['path']}  sha256:{source['sha256'][:12]}")
    if len(sources) > 5:
        facts.add_row("source", f"… and {len(sources) - 3} more (--json lists them all)")
    if "sigmas" in summary:
        sig = summary["sigmas"]
        family = (summary.get("run") or {}).get("grid") if isinstance(summary.get("run"), dict) else None
        shown = f" ({GridSpec.from_json(family).describe()})" if isinstance(family, dict) else ""
        facts.add_row("grid", f"T = {summary['T']}, σ from {min(sig):.4g} to {max(sig):.4g}{shown}")
    table = renderer(summary, facts)
    console.print(Panel(facts, title=f"{path}", title_align="left", expand=False))
    if table is not None:
        console.print(table)


def render_positives(summary: dict[str, Any], facts: Table) -> Table | None:
    """A positives folder: images per prompt, sources, reward sets (facts only)."""
    facts.add_row("images", f"{summary['images']} for {summary['prompts']} prompts "
                            f"({summary['per_prompt'][0]}–{summary['per_prompt'][1]} per prompt)")
    facts.add_row("sources", ", ".join(summary["sources"]))
    facts.add_row("reward sets", ", ".join(summary["reward_sets"]) or "one set for every reward")
    return None


def render_scores(summary: dict[str, Any], facts: Table) -> Table | None:
    """A scores table: the run, and the mean raw score per reward."""
    run = summary["run"]
    facts.add_row("run", ", ".join(f"{k}={run[k]}" for k in ("run_id", "N", "K", "P", "sampling", "crn",
                                                               "rollout_noise", "shard") if k in run))
    table = Table(title="mean raw score per reward", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("reward", "samples (t = 0)", "rollouts from noise (t = T)", "all rollouts"):
        table.add_column(col, justify="left" if col == "reward" else "right", no_wrap=True)
    for r in summary["rewards"]:
        table.add_row(r["reward"], f"{r['mean_t0']:.4g}", f"{r['mean_tT']:.4g}", f"{r['mean_rollouts']:.4g}")
    return table


def render_gains(summary: dict[str, Any], facts: Table) -> Table | None:
    """A gain table: the run, and D_0, the peak step and the gain profile per reward."""
    run = summary["run"]
    facts.add_row("run", ", ".join(f"{k}={run[k]}" for k in ("alpha", "beta", "N", "K", "P", "sampling",
                                                               "crn", "monotone") if k in run))
    if run.get("bootstrap"):
        draws = "draws kept for solve-w --bootstrap" if summary.get("draws") else "no draws kept (recast.gains/1)"
        facts.add_row("bootstrap", f"{run['bootstrap']} resamples over {run.get('bootstrap_over', 'prompts')}; {draws}")
    if run.get("advantage_corr") is not None:
        found = summary.get("conflicts") or []
        facts.add_row("conflicts", "; ".join(f"{c['pair'][0]}–{c['pair'][1]} at steps {compact_steps(c['steps'])} "
                                            f"(lowest ρ {c['rho_min']:+.2f})" for c in found)
                      or "none (no pair's advantages anti-correlate at any step, E14)")
    table = Table(title="per reward", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("reward", style="bold", no_wrap=True)
    table.add_column("D_0", justify="right")
    table.add_column("peak t", justify="right")
    table.add_column("gain: clean → noisy", no_wrap=True)
    for r in summary["rewards"]:
        d0 = f"{r['D0']:.4g}"
        if "D0_interval" in r:
            d0 += f" [{r['D0_interval'][0]:.3g}, {r['D0_interval'][1]:.3g}]"
        table.add_row(r["reward"], d0, str(r["peak_t"]), sparkline(np.array(r["gain"])))
    return table


def render_weights(summary: dict[str, Any], facts: Table) -> Table | None:
    """A weight matrix: the solve, the trained steps, the marginals, and W per reward."""
    solver = summary["solver"]
    facts.add_row("mode", f"{summary['mode']}, {summary['kernel']} kernel, τ = {summary['tau']:g}")
    if solver:
        facts.add_row("solver", f"{solver.get('iterations', 0)} iterations, "
                                f"max marginal error {solver.get('marginal_error', float('nan')):.2e}")
    steps = summary.get("trained_steps") or list(range(1, summary["T"] + 1))
    Tp = len(steps)
    skipped = summary["T"] - Tp
    note = "" if summary.get("trained_steps_recorded", True) else " (not recorded: a file from before trained_steps)"
    facts.add_row("trained", (f"t = {steps[0]}…{steps[-1]}: {Tp} of T = {summary['T']} steps, the {skipped} "
                              f"cleanest get W = 0 (--skip-clean {skipped})" if skipped else
                              f"every step, T' = T = {summary['T']}") + note)
    col = np.array(summary["column_sums"])[np.array(steps) - 1]
    facts.add_row("columns", f"T'·Σ_i W_it over the trained steps from {col.min() * Tp:.6f} to {col.max() * Tp:.6f}")
    row_err = max(abs(r["row_sum"] - r["lambda_hat"]) for r in summary["rewards"])
    facts.add_row("rows", f"max |Σ_t W_it − λ̂_i| = {row_err:.1e}")
    variant = solver.get("variant") if solver else None
    if variant:
        what = (", ".join(f"{r} γ = {g:.2f}" for r, g in variant["gamma"].items()) if "gamma" in variant else
                f"static on steps {compact_steps(variant['static_steps']) or 'none'}")
        facts.add_row("variant", f"{variant['name']} ({variant['tag']}): {what}")
    boot = solver.get("bootstrap") if solver else None
    if boot and boot.get("samples_for_tv"):
        parts = ", ".join(f"≤ {t}: N ≥ {n:,.0f}" for t, n in boot["samples_for_tv"].items() if n is not None)
        facts.add_row("budget", f"N = {boot['samples']} samples per prompt now; for a median row spread {parts} "
                                "(lower bounds: the spread shrinks more slowly than 1/√N, docs/trust.md)")
    for c in (solver or {}).get("conflicts", []):
        facts.add_row("conflict", f"{c['pair'][0]}–{c['pair'][1]} at steps {compact_steps(c['steps'])} "
                                  f"(lowest ρ {c['rho_min']:+.2f}, E14)")
    for c in (solver or {}).get("settled_by_timing", []):
        facts.add_row("by timing", f"W gives {', '.join(sorted(set(c['owner'])))} most of steps "
                                   f"{compact_steps(c['steps'])}, where {c['pair'][0]} and {c['pair'][1]} conflict")
    table = Table(title="per reward (spill: share of W where the gain is < 1% of its peak)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("reward", style="bold", no_wrap=True)
    for name in ("λ", "D_0", "peak t", "spill"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("W: clean → noisy", no_wrap=True)
    table.add_column("max T'·W", justify="right")
    if boot:
        facts.add_row("bootstrap", f"W solved on {boot['draws']} draws of the gains; per reward, the TV of its row to "
                                   "W's (spread) and to static, median or point [90%]:")
        for r in summary["rewards"]:
            u = boot["rows"][r["reward"]]
            facts.add_row("", f"{r['reward']}: spread {u['tv_point'][1]:.3f} [{u['tv_point'][0]:.3f}, "
                              f"{u['tv_point'][2]:.3f}], to static {u['tv_static']:.3f} [{u['tv_static_range'][0]:.3f}, "
                              f"{u['tv_static_range'][1]:.3f}]: {u['verdict']}")
    for r in summary["rewards"]:
        spill = "—" if r["spill_share"] is None else f"{100 * r['spill_share']:.1f}%"
        cells = [r["reward"], f"{r['lambda']:g}", f"{r['D0']:.4g}", str(r["peak_t"]), spill, sparkline(np.array(r["W"])),
                 f"{max(r['W']) * len(summary.get('trained_steps') or r['W']):.3f}"]
        table.add_row(*cells)
    return table


def _num(value: Any, spec: str = ".4g") -> str:
    """A number for a table cell; "—" for a missing one (NaN in the data)."""
    return "—" if value is None else format(value, spec)


def _stats_table(title: str, rows: list[dict[str, Any]], first: str, extra: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(first, style="bold", no_wrap=True)
    if extra:
        table.add_column(extra, no_wrap=True)
    for name in ("mean", "std", "n"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        cells = [r[first]] + ([r[extra]] if extra else [])
        table.add_row(*cells, _num(r["mean"]), _num(r["std"]), str(r["n"]))
    return table


def render_eval(summary: dict[str, Any], facts: Table) -> Table:
    what = summary["evaluated"]
    setting = what.get("setting") or {}
    if isinstance(setting, dict):
        facts.add_row("setting", f"{setting.get('name', '?')} ({setting.get('path', '?')})")
    if what.get("mode") == "base":
        facts.add_row("evaluated", "the base model")
    else:
        facts.add_row("evaluated", f"{what.get('mode')} run {what.get('run')}, train seed {what.get('train_seed')}")
    checkpoint = what.get("checkpoint")
    if isinstance(checkpoint, dict):
        facts.add_row("checkpoint", f"step {checkpoint.get('step')}: {checkpoint.get('path')}")
    sampling = summary.get("sampling")
    if isinstance(sampling, dict):
        facts.add_row("sampling", ", ".join(f"{k}={sampling[k]}" for k in ("steps", "guidance_scale", "resolution",
                                                                          "n", "seed") if k in sampling))
    facts.add_row("images", f"{summary['images']} for {summary['prompts']} prompts "
                            f"({summary['per_prompt'][0]}–{summary['per_prompt'][1]} per prompt), "
                            f"{summary['seeds']} seeds")
    if summary["rewards"]:
        facts.add_row("λ", ", ".join(f"{r}={lam:g}" for r, lam in zip(summary["rewards"], summary["lambda"])))
    table = _stats_table("per scorer (over images)", summary["scorers"], "scorer", "kind")
    if "aggregate" in summary:
        a = summary["aggregate"]
        table.add_row("Σλ·r", "aggregate", _num(a["mean"]), _num(a["std"]), str(a["n"]))
    return table


def render_curve(summary: dict[str, Any], facts: Table) -> Table:
    what = summary["evaluated"]
    setting = what.get("setting") or {}
    if isinstance(setting, dict):
        facts.add_row("setting", f"{setting.get('name', '?')} ({setting.get('path', '?')})")
    facts.add_row("evaluated", "the base policy" if what.get("mode") == "base" else
                  f"{what.get('mode')} run {what.get('run')}, train seed {what.get('train_seed')}")
    facts.add_row("samples", f"n = {summary['n']} per point, seeds seed + k")
    facts.add_row("λ", ", ".join(f"{r}={lam:g}" for r, lam in zip(summary["rewards"], summary["lambda"])))
    table = Table(title="mean per (step, sampler)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("step", "sampler", *summary["rewards"], "Σλ·r"):
        table.add_column(name, justify="right")
    for p in summary["points"]:
        table.add_row(str(p["step"]), p["sampler"], *(_num(p[r]) for r in summary["rewards"]), _num(p["aggregate"]))
    return table


def render_cell(summary: dict[str, Any], facts: Table) -> Table:
    """A ``recast study`` cell: the arm and recipe, and each scorer at the last SDE point over seeds."""
    arm = summary["arm"]
    facts.add_row("cell", f"{arm['arm']} (mode {arm['mode']}, kernel {arm['kernel']}, W from {arm['gains']} gains), "
                          f"λ = {summary['lambda']}, G = {summary['group_size']} × {summary['prompts_per_step']} groups")
    facts.add_row("seeds", f"{summary['seeds']} trained {summary['training_steps']} steps; n = {summary['n']} "
                           f"evaluation samples at {len(summary['points'])} points")
    return _stats_table(f"over seeds at step {summary['last_sde_step']} (SDE)", summary["scorers"], "scorer")


def render_metrics(m: dict[str, Any], facts: Table) -> Table | None:
    steps = m["steps"]
    if not steps["count"]:
        facts.add_row("steps", "none yet")
        return None
    facts.add_row("steps", f"{steps['first']} (1 step)" if steps["count"] == 1 else
                  f"{steps['first']}..{steps['last']} ({steps['count']} steps)")
    facts.add_row("aggregate", f"Σλ·r {_num(m['aggregate']['first'])} → {_num(m['aggregate']['last'])}")
    last = m["last_step"]
    facts.add_row("last step", f"loss {_num(last['loss'])}, kl {_num(last['kl'])}, "
                               f"clip_frac {_num(last['clip_frac'])}; mean kl over steps {_num(m['kl_mean'])}")
    window = m["stall_window"]
    stalls = [_stall_note(r) for r in m["rewards"] if r["stalled_steps"]]
    if stalls:
        facts.add_row("stalls", "; ".join(stalls))
    table = Table(title=f"reward_mean per reward (progress: smoothed, over the last {window} steps; "
                        "stalled: at the last step, as the stall detector flagged it)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("reward", style="bold", no_wrap=True)
    for name in ("start", "end", "best", "progress", "stalled"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("over steps (min → max)", no_wrap=True)
    for r in m["rewards"]:
        stalled = "—" if r["stalled"] is None else ("yes" if r["stalled"] else "no")
        table.add_row(r["reward"], _num(r["first"], ".3g"), _num(r["last"], ".3g"), _num(r["max"], ".3g"),
                      _num(r["progress"], "+.2g"), stalled, r["sparkline"])
    return table


def _stall_note(r: dict[str, Any]) -> str:
    """A reward the stall detector flagged: since which step it is stalled, or which steps it was."""
    if r["stalled"]:
        return f"{r['reward']} stalled since step {r['stalled_since']} ({r['stalled_steps']} steps flagged)"
    return f"{r['reward']} stalled for {r['stalled_steps']} steps from step {r['first_stalled_step']}, then rose"


def render_image_scores(summary: dict[str, Any], facts: Table) -> Table:
    facts.add_row("images", f"{summary['images']} images, {summary['prompts']} distinct prompts")
    if summary["extras"]:
        facts.add_row("extras", ", ".join(summary["extras"]))
    return _stats_table("per scorer (over images)", summary["scorers"], "scorer")


def render_judgements(summary: dict[str, Any], facts: Table) -> Table:
    facts.add_row("pairs", f"{summary['pairs']} pairs, {summary['verdicts']} verdicts")
    if summary["labels"]:
        facts.add_row("labels", f"a = {summary['labels'][0]}, b = {summary['labels'][1]}")
    table = Table(title="stored summary per criterion (agree: both orders agree; 1st: non-tie verdicts for the "
                        "image shown first)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("criterion", style="bold", no_wrap=True)
    for name in ("a wins", "b wins", "ties", "win rate a", "agree", "1st"):
        table.add_column(name, justify="right", no_wrap=True)
    for c in summary["criteria"]:
        table.add_row(c["criterion"], *(str(c.get(k, "—")) for k in ("a_wins", "b_wins", "ties")),
                      *(_num(c.get(k), ".3f") for k in ("win_rate_a", "order_agreement", "first_position_share")))
    return table


def _checkpoint_rows(c: dict[str, Any], facts: Table, label: str) -> None:
    verdict = "manifest verifies" if c["verified"] else f"DOES NOT VERIFY: {c['problem']}"
    facts.add_row(label, f"step {c['step']}: {verdict}")
    state = {k: v for k, v in c["state"].items() if v is not None}
    if state:
        facts.add_row("state", ", ".join(f"{k}={v}" for k, v in state.items()))


def render_checkpoint(summary: dict[str, Any], facts: Table) -> None:
    _checkpoint_rows(summary, facts, "checkpoint")
    facts.add_row("files", f"{len(summary['files'])} in the manifest")
    if summary["run"]:
        facts.add_row("run", summary["run"])


def render_run(summary: dict[str, Any], facts: Table) -> Table | None:
    facts.add_row("setting", str(summary["setting"]))
    copy = f" (copied to {summary['weights_file']})" if summary["weights_file"] else ""
    facts.add_row("W", f"{summary['mode']}: {summary['weights']}{copy}")
    rewards, lam = summary["rewards"] or [], summary["lambda"] or []
    facts.add_row("λ", ", ".join(f"{r}={x:g}" for r, x in zip(rewards, lam)))
    facts.add_row("seed", str(summary["seed"]))
    steps = summary["checkpoints"]
    shown = ", ".join(map(str, steps[-8:]))
    facts.add_row("checkpoints", f"steps {'…, ' if len(steps) > 8 else ''}{shown}" if steps else "none")
    if summary["latest"] is not None:
        _checkpoint_rows(summary["latest"], facts, "latest")
    if summary["metrics"] is None:
        facts.add_row("metrics", "no metrics.parquet")
        return None
    return render_metrics(summary["metrics"], facts)

