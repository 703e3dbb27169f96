"""What a ``recast estimate`` run is given: its configuration, the gain options, and their checks.

Kept apart from :mod:`~recast_cli.estimate.stage` so the world builders (``estimate.worlds``),
which the stage imports, can name the configuration they are built from.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from recast_cli import bounds
from recast_cli.errors import BadInput, refuse_duplicates, shown
from recast_cli.estimate.gains import BOOTSTRAP_OVER, MONOTONE, SAMPLINGS

#: The largest Rényi order α (the orders in use are 0.25 to 4): the log-weights α·r/β of E4–E8 stay far
#: inside float64 for every reward the checks admit.
MAX_ALPHA = 1000.0


@dataclass(frozen=True)
class EstimateConfig:
    """Every knob of a run; the part that fixes the rollouts is hashed into the run id."""

    policy: str
    rewards: tuple[str, ...]
    steps: int = 25
    N: int = 8
    K: int = 16
    P: int | None = None
    sampling: str = "pplus"
    crn: bool = True
    rollout_noise: float = 1.414
    guidance_scale: float | None = None
    seed: int = 0
    batch_size: int = 64
    positives: str | None = None
    prompts_file: str | None = None

    def run_id(self, made_from: Mapping[str, str] | None = None) -> str:
        """Identifies the rollouts: shards of one run share it (batch size does not change results).

        ``made_from``: label → digest of what fixes them beyond these flags, which name files and
        settings by path (``estimate.stage.rollout_inputs``: a setting's resolved ``[policy]`` and
        ``[world]``, the model's weights, ...): the parts of a run whose setting changed since are
        another run's, never resumed. None or empty (``--policy gmm1d``): the flags alone."""
        fixed: dict[str, object] = {k: v for k, v in asdict(self).items() if k != "batch_size"}
        if made_from:
            fixed["made_from"] = dict(made_from)
        return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class GainOptions:
    alphas: tuple[float, ...] = (2.0,)
    beta: float | None = None
    standardise: bool | None = None
    monotone: str = "isotonic"
    bootstrap: int = 200
    jackknife: bool = False
    bootstrap_over: str = "auto"


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/n"`` → (i, n) with 0 ≤ i < n; None → (0, 1)."""
    if text is None:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise BadInput(f"--shard {text!r}: expected i/n, e.g. 0/4") from None
    if not (n >= 1 and 0 <= i < n):
        raise BadInput(f"--shard {text!r}: need 0 <= i < n")
    return i, n


def check_config(cfg: EstimateConfig, opts: GainOptions) -> None:
    if not cfg.rewards:
        raise BadInput("--rewards names no reward")
    refuse_duplicates(cfg.rewards, "--rewards")
    bounds.check_all(("steps", "--steps", cfg.steps), ("positives_per_prompt", "--n", cfg.N),
                     ("rollouts", "--k", cfg.K), ("prompts", "--p", cfg.P), ("seed", "--seed", cfg.seed),
                     ("batch", "--batch-size", cfg.batch_size))
    check_score_cells(cfg, cfg.P or 1)
    check_bootstrap_cells(opts.bootstrap, cfg.steps, len(cfg.rewards))
    if cfg.sampling not in SAMPLINGS:
        raise BadInput(f"--sampling must be one of {', '.join(SAMPLINGS)}")
    if not (math.isfinite(cfg.rollout_noise) and cfg.rollout_noise >= 0):
        raise BadInput(f"--rollout-noise must be >= 0, got {cfg.rollout_noise}")
    check_gain_options(opts)


def check_score_cells(cfg: EstimateConfig, prompts: int) -> None:
    """The scores array P·N·(T+1)·K·m within its ceiling (``bounds.PRODUCTS``), before any rollout."""
    bounds.check_product("score_cells", {"P": prompts, "N": cfg.N, "T+1": cfg.steps + 1, "K": cfg.K,
                                         "m": len(cfg.rewards)})


def check_bootstrap_cells(bootstrap: int, T: int, m: int) -> None:
    """The bootstrap's resampled curves (bootstrap × (T+1) × m) within their ceiling, before any work."""
    bounds.check_product("bootstrap_cells", {"--bootstrap": bootstrap, "T+1": T + 1, "m": m})


def check_alphas(alphas, where: str = "--alpha") -> None:
    """BadInput unless ``alphas`` holds Rényi orders, each finite in (0, MAX_ALPHA] (a larger α makes
    α·r/β overflow: the gain table would be NaN; checked before any work)."""
    bad = [a for a in alphas if not (math.isfinite(a) and 0 < a <= MAX_ALPHA)]
    if not alphas or bad:
        raise BadInput(f"{where} must be positive numbers, at most {MAX_ALPHA:g} (the Rényi order α), got "
                       f"{bad[0] if bad else 'none'}")


def check_gain_options(opts: GainOptions) -> None:
    check_alphas(opts.alphas)
    if opts.beta is not None and not (math.isfinite(opts.beta) and opts.beta > 0):
        raise BadInput(f"--beta must be positive, got {opts.beta}")
    if opts.monotone not in MONOTONE:
        raise BadInput(f"--monotone must be one of {', '.join(MONOTONE)}")
    bounds.check("bootstrap", opts.bootstrap, "--bootstrap")
    if opts.bootstrap == 1:  # its intervals would have zero width, and the table no draws for solve-w
        raise BadInput("--bootstrap 1: one resample measures no spread (zero-width intervals, no draws for solve-w); "
                       "give 0 (none) or 2 and more")
    if opts.bootstrap_over not in BOOTSTRAP_OVER:
        raise BadInput(f"--bootstrap-over must be one of {', '.join(BOOTSTRAP_OVER)}, got {shown(opts.bootstrap_over)}")


def parse_alphas(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise BadInput(f"--alpha {text!r}: expected numbers, e.g. 2 or 0.5,2,4") from None
    check_alphas(values)
    return values
