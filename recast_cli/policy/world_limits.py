"""What a 1-D world may be: its limits, and the checks that hold every world to them as it is built.

A :class:`~recast_cli.policy.world1d.World1D` runs :func:`check_world` on construction — a setting's
``[world]`` table (:mod:`~recast_cli.policy.world_table`, whose parser reads the keys and forms) and a
world built in code alike — so no world the exact code cannot use exists: BadInput, one line, starting
``[world]`` or ``[world.rewards.NAME]``. The limits are docs/settings.md's ("[world]", "Work limits"):
numbers far inside float64, a bounded number of cells and components, and an exact estimate whose work,
known from the definition before any array is built (:meth:`World1D.exact_work`), is bounded per noise
level (:func:`check_level_work`) and per gain table (:func:`check_exact_work`); the terms that work is
counted in (``QUAD_STEP``, ``POSTERIOR_COST``, :func:`held_levels`) are here too, for ``exact_work`` to
count with. This module sits below ``world1d`` (it reads a world only through its methods), so that the
world can check itself.
"""

from __future__ import annotations

import math

import numpy as np

from recast_cli.errors import BadInput
from recast_cli.policy.step_reward import REACH, StepReward

#: The most cells a reward may have: its explicit cells, or its periodic cells over the support.
MAX_CELLS = 10_000
#: The most mixture components a world may have (the posterior holds N × J numbers).
MAX_COMPONENTS = 100
#: |Σ w_j − 1| allowed.
WEIGHT_TOLERANCE = 1e-9
#: A cell has appreciable mass when π^old gives it at least this probability.
MASS_FLOOR = 1e-12

# The work limits (docs/settings.md "[world]", "Work limits"): every world is bounded by the work it
# implies, checked when it is defined, before any array is built.

#: The largest |number| a world may place on the line (a mean, an edge, an interval end, a phase) and the
#: largest std or cell width: (x − μ)², μ ± REACH·s and (e − μ)/s then stay far inside float64.
MAX_COORDINATE = 1e6
#: The smallest std: (e − μ)/s stays finite for every edge e and mean μ within ±MAX_COORDINATE.
MIN_STD = 1e-6
#: The largest tilt (r_max − r_min)/β of a reward: every exp of a reward over β is taken relative to one of
#: its values (rejection's exp((r − r_max)/β), the π⁺ CDF's and cell sampler's, the exact D's
#: expm1((u − u_0)/β)), so it stays within e^{±700} ≈ 1e±304, inside float64 (largest about e^709.8) with
#: room for a factor of 10⁴ (the KL's ratio·log ratio, at most e^700·700).
MAX_TILT = 700.0
#: The largest |r| of a reward value, like MAX_COORDINATE for places: r/β and its α-multiples (the sampled
#: estimate's log-weights, ``estimate.gains.MAX_LOG_WEIGHT``), the trainer's advantages and means stay far
#: inside float64.
MAX_VALUE = 1e6
#: The exact estimate's quadrature step over x_σ (E4).
QUAD_STEP = 5e-4
#: The cost of the posterior at one quadrature point and component, in units of one cell's Gaussian mass
#: there (measured: a two-cell reward costs as much per point as about ten cells' masses).
POSTERIOR_COST = 8
#: The most work the exact D of one reward may take at one noise level: quadrature points × components ×
#: (cells enumerated + levels they hold + POSTERIOR_COST), a few seconds on one CPU core (a level's sum
#: costs about as much as a cell's mass).
MAX_LEVEL_WORK = 1e8
#: The most work one exact gain table may take: the sum over its rewards, noise levels and α (minutes).
MAX_EXACT_WORK = 2e10
#: The noise levels the per-level work of a world is checked at, 0.01 apart over (0, 1]: the work varies
#: smoothly in σ, and each exact table checks its own grid σ_t = t/T in full (``check_exact_work``).
WORK_SIGMAS = np.linspace(0.0, 1.0, 101)[1:]


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_world(world) -> None:
    """BadInput (one line, ``[world] …``) unless ``world`` (a World1D) is a world the exact code can use."""
    J = len(world.means)
    if not 1 <= J <= MAX_COMPONENTS:
        raise BadInput(f"[world] means must hold 1 to {MAX_COMPONENTS} components, got {J}")
    if len(world.weights) != J or len(world.stds) != J:
        raise BadInput(f"[world] weights, means and stds must have one entry per component: "
                       f"{len(world.weights)}, {J} and {len(world.stds)} given")
    for key in ("weights", "means", "stds"):
        bad = [v for v in getattr(world, key) if not _finite(v)]
        if bad:
            raise BadInput(f"[world] {key} must be finite numbers, got {bad[0]!r}")
    if min(world.stds) <= 0:
        raise BadInput(f"[world] stds must be > 0, got {min(world.stds)!r}")
    _check_within("[world] means", world.means)
    bad = [v for v in world.stds if not MIN_STD <= v <= MAX_COORDINATE]
    if bad:
        raise BadInput(f"[world] stds must be from {MIN_STD:g} to {MAX_COORDINATE:g}, got {bad[0]!r}")
    if min(world.weights) <= 0:
        raise BadInput(f"[world] weights must be > 0, got {min(world.weights)!r}")
    if abs(math.fsum(world.weights) - 1) > WEIGHT_TOLERANCE:
        raise BadInput(f"[world] weights sum to {math.fsum(world.weights)!r}, not 1 (within {WEIGHT_TOLERANCE:g})")
    if not world.rewards:
        raise BadInput("[world] defines no reward: add [world.rewards.NAME] tables")
    names = [name for name, _ in world.rewards]
    twice = [n for n in names if names.count(n) > 1]
    if twice:
        raise BadInput(f"[world] reward {twice[0]!r} is defined twice")
    lo, hi = world.support()
    for name, reward in world.rewards:
        check_reward(name, reward, lo, hi, world.beta)
        masses = world.cell_masses(reward)
        seen = {value for mass, value in masses if mass >= MASS_FLOOR}
        if len(seen) < 2:
            only = next(iter(seen), reward.values[0])
            raise BadInput(f"[world.rewards.{name}] is constant on the support: every cell π^old gives mass >= "
                           f"{MASS_FLOOR:g} holds {only!r} (a constant reward tilts nothing)")
        check_level_work(world, name)


def held_levels(reward: StepReward, cells: np.ndarray) -> np.ndarray:
    """How many levels above the lowest ``cells`` enumerated cells of ``reward`` can hold: all of them for
    explicit cells, at most one per cell for a periodic pattern (of 10⁴ values, a few near the means)."""
    return np.minimum(cells, len(reward.levels) - 1)


def check_level_work(world, name: str) -> None:
    """BadInput unless the exact D of reward ``name`` takes at most MAX_LEVEL_WORK at every noise level
    (:meth:`World1D.exact_work`): a world whose quadrature grid or cell enumeration is too large is
    refused when it is defined, naming the number that is too large."""
    points, cells, work = world.exact_work(name, WORK_SIGMAS)
    i = int(np.argmax(work))
    if work[i] > MAX_LEVEL_WORK:
        lo, hi = (float(end[0]) for end in world.quadrature_span(WORK_SIGMAS[i:i + 1]))
        levels = held_levels(world.reward(name), cells[i])
        raise BadInput(f"[world.rewards.{name}]: its exact estimate needs {points[i]:.3g} quadrature points "
                       f"(x_σ in [{lo:.4g}, {hi:.4g}] by {QUAD_STEP:g}) × {len(world.means)} components × "
                       f"({cells[i]:.3g} cells + {levels:.3g} levels + {POSTERIOR_COST}) = {work[i]:.3g} "
                       f"evaluations at σ = {WORK_SIGMAS[i]:.2f}; at most {MAX_LEVEL_WORK:g} per noise level are "
                       "allowed (bring the means closer, or use fewer components, cells or distinct values)")


def check_exact_work(world, rewards, sigmas: np.ndarray, alphas: int) -> None:
    """BadInput unless one exact gain table — ``rewards`` on the grid ``sigmas``, for ``alphas``
    orders α — takes at most MAX_EXACT_WORK in all (checked before any quadrature)."""
    total = alphas * sum(float(world.exact_work(name, sigmas)[2].sum()) for name in rewards)
    if total > MAX_EXACT_WORK:
        raise BadInput(f"the exact estimate of {world.label} needs {total:.3g} evaluations for {len(rewards)} "
                       f"reward(s) × {len(sigmas)} noise levels × {alphas} α; at most {MAX_EXACT_WORK:g} are "
                       "allowed: use fewer --steps, rewards or α")


def check_tilt(where: str, reward: StepReward, beta: float, fix: str = "scale the reward down") -> None:
    """BadInput unless ``reward``'s values span at most MAX_TILT·β: every exp of a value over β is taken
    relative to another value, so only the spread (r_max − r_min)/β can overflow — (200, 201) tilts as
    (0, 1) does. Names the real cause before any exp overflows (``fix``: what to do); Python floats, so
    an absurd spread warns of nothing."""
    low, high = min(reward.values), max(reward.values)
    tilt = (high - low) / beta
    if not tilt <= MAX_TILT:
        raise BadInput(f"{where} values span {low:g} to {high:g}, too wide for β = {beta:g}: the tilt "
                       f"exp((r − r_min)/β) reaches e^{tilt:.4g} and overflows float64; keep (r_max − r_min)/β "
                       f"<= {MAX_TILT:g} (a spread <= {MAX_TILT * beta:g}): {fix}")


def _check_within(where: str, values, limit: float = MAX_COORDINATE) -> None:
    """BadInput unless every number of ``values`` lies within ±``limit`` (a place on the line by default)."""
    bad = [v for v in values if abs(v) > limit]
    if bad:
        raise BadInput(f"{where} must lie within ±{limit:g}, got {bad[0]!r}")


def check_reward(name: str, reward: StepReward, lo: float, hi: float, beta: float) -> None:
    """BadInput (one line, ``[world.rewards.NAME] …``) unless reward ``name`` is well formed, its numbers
    within the limits, its spread within MAX_TILT·``beta`` and its cells over the support [lo, hi] at most
    MAX_CELLS."""
    where = f"[world.rewards.{name}]"
    if reward.cell is None:
        if len(reward.values) != len(reward.edges) + 1:
            raise BadInput(f"{where} needs one value per cell, len(edges) + 1 = {len(reward.edges) + 1}; "
                           f"got {len(reward.values)} values")
        bad = [e for e in reward.edges if not _finite(e)]
        if bad:
            raise BadInput(f"{where} edges must be finite numbers, got {bad[0]!r}")
        _check_within(f"{where} edges", reward.edges)
        if any(b <= a for a, b in zip(reward.edges, reward.edges[1:])):
            raise BadInput(f"{where} edges must be strictly increasing (sorted, no repeats), got "
                           f"{_short(reward.edges)}")
    else:
        if not (_finite(reward.cell) and reward.cell > 0) or not _finite(reward.phase):
            raise BadInput(f"{where} needs cell > 0 and a finite phase, got cell = {reward.cell!r}, "
                           f"phase = {reward.phase!r}")
        if not reward.values:
            raise BadInput(f"{where} needs a pattern: the values of consecutive cells, repeated")
        _check_within(f"{where} cell and phase", (reward.cell, reward.phase))
    bad = [v for v in reward.values if not _finite(v)]
    if bad:
        raise BadInput(f"{where} values must be finite numbers, got {bad[0]!r}")
    check_tilt(where, reward, beta)
    _check_within(f"{where} values", reward.values, MAX_VALUE)
    cells = reward.count_cells(lo, hi)
    if cells > MAX_CELLS:
        shown = "more than 10^300" if not math.isfinite(cells) else f"{int(cells)}"
        raise BadInput(f"{where} has {shown} cells over the support [{lo:g}, {hi:g}] (π^old's means ± {REACH} "
                       f"stds); at most {MAX_CELLS} are allowed")


def _short(items) -> str:
    text = "[" + ", ".join(f"{x:g}" for x in items[:8]) + (", …]" if len(items) > 8 else "]")
    return text
