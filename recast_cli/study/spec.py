"""The ``[study]`` table of a setting: its budgets, seeds, arms and the estimate that W is solved from
(``load_study`` → ``StudySpec``), the one plan of its cells (``StudySpec.cells``: what ``recast study``
and the Make graph both run), and what of a setting determines each of a study's artifacts."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from recast_cli import bounds
from recast_cli.artifacts.cells import DEFAULT_LOST_DELTA
from recast_cli.artifacts.weights import DEFAULT_KERNEL, DEFAULT_TAU, KERNELS, MODES
from recast_cli.errors import BadInput, shown
from recast_cli.setting.load import Setting, file_digest, parse_table

if TYPE_CHECKING:
    from recast_cli.train.config import TrainConfig

#: the arms a study trains by default, in the order its Make graph lists them and its cells run (outputs
#: follow it): the static baseline first, then the other modes of ``artifacts.MODES`` in their order
STUDY_MODES = ("static", *(m for m in MODES if m != "static"))
SAMPLINGS = ("pplus", "pold")
STUDY_GAINS = ("estimate", "exact")
#: the variants of W an arm may name as its fourth part: E12u (``solve-w --shrink auto``), E12c (``--conflicts static``)
VARIANTS = ("shrinkauto", "conflict")
PLAIN_SOURCES = ("renderer", "openai", "gemini", "self")
PATH_SOURCES = ("folder", "diffusers")

#: a number of a "LO:HI" seeds string: ASCII digits, no more than ``int`` reads (4300)
DIGITS = r"[0-9]{1,4300}"


@dataclass(frozen=True)
class ArmSpec:
    """One arm of ``recast study``: the solve-w mode and kernel, what W is solved from (the exact
    gains of the analytic world, or the sampled estimate at the base policy), and the share γ of the
    solved W kept against static (``solve-w --shrink``, E12s; 1: W as solved), or a variant of W
    (``shrinkauto``: E12u, ``solve-w --shrink auto``; ``conflict``: E12c, ``solve-w --conflicts static``).
    ``label`` names it."""

    mode: str
    kernel: str
    gains: str
    label: str
    shrink: float = 1.0
    variant: str = ""

    @classmethod
    def parse(cls, text: str) -> ArmSpec:
        """``MODE[:KERNEL[:GAINS[:shrinkγ|shrinkauto|conflict]]]`` → the arm, labelled by its parts joined with
        '-' (``recast:power`` → ``recast-power``; ``recast:power:estimate:shrink0.5`` →
        ``recast-power-estimate-shrink0.5``); BadInput for an unknown part."""
        parts = text.split(":") if isinstance(text, str) else []
        if not 1 <= len(parts) <= 4 or parts[0] not in STUDY_MODES:
            raise BadInput(f"arm {shown(text)}: expected MODE[:KERNEL[:GAINS[:shrinkγ|shrinkauto|conflict]]] with "
                           f"MODE one of {', '.join(STUDY_MODES)}")
        kernel = parts[1] if len(parts) > 1 else DEFAULT_KERNEL
        gains = parts[2] if len(parts) > 2 else "exact"
        if kernel not in KERNELS or gains not in STUDY_GAINS:  # the kernel table (recast_cli/kernels.py)
            raise BadInput(f"arm {text!r}: the kernel must be one of {', '.join(KERNELS)} and the gains one of "
                           f"{', '.join(STUDY_GAINS)}")
        if len(parts) > 3 and parts[3] in VARIANTS:
            if parts[0] != "recast" or gains != "estimate":
                raise BadInput(f"arm {shown(text)}: the variant {parts[3]} is of ReCAST's W from the sampled estimate "
                               "(its bootstrap, its conflicts): recast:KERNEL:estimate:" + parts[3])
            return cls(parts[0], kernel, gains, "-".join(parts), 1.0, parts[3])
        shrink = _shrink(parts[3], text) if len(parts) > 3 else 1.0
        return cls(parts[0], kernel, gains, "-".join(parts), shrink)


@dataclass(frozen=True)
class StudyCell:
    """One cell of a study's plan: a budget × arm × group size G, trained at ``[train]``'s rollouts per
    step (G × ``prompts_per_step`` = ``[train]``'s group_size × prompts_per_step) with the arm's learning
    rate. ``recast study`` trains every seed of a cell as one computation; the Make graph, one run per seed."""

    budget: tuple[float, ...]
    arm: ArmSpec
    group_size: int
    prompts_per_step: int
    learning_rate: float
    rung: bool = False  # a rung of [study] learning_rate_ladder: the rate is part of the cell's name

    @property
    def weights_name(self) -> str:
        """``BUDGET-ARM``, the name of the cell's W (one per budget × arm, whatever G)."""
        return f"{StudySpec.label(self.budget)}-{self.arm.label}"

    @property
    def name(self) -> str:
        """``BUDGET-ARM-gG`` (on a learning-rate ladder ``BUDGET-ARM-gG-lrRATE``), the name of the cell's
        file (``recast study``)."""
        rate = f"-lr{self.learning_rate:g}" if self.rung else ""
        return f"{self.weights_name}-g{self.group_size}{rate}"


@dataclass(frozen=True)
class StudySpec:
    """The sweep of one setting: budgets × seeds × modes after one static warmup (docs/method.md §6–7).

    ``budgets`` hold one λ per reward of ``rewards`` (the ``[train]`` order). The warmup trains
    ``warmup_steps`` steps with static W and ``[train] lambda`` from the base model; W is then
    estimated at the warmup checkpoint (``estimate_steps``, ``alpha``, ``n``, ``k``, ``p``,
    ``sampling``, positives from ``positives``, a ``recast sample-positive --source`` value) and
    solved per budget and mode with temperature ``tau``.
    """

    rewards: tuple[str, ...]
    budgets: tuple[tuple[float, ...], ...]
    seeds: tuple[int, ...] = (0,)
    modes: tuple[str, ...] = STUDY_MODES
    warmup_steps: int = 0
    estimate_steps: int = 25
    alpha: float = 2.0
    n: int = 8
    k: int = 16
    p: int | None = None
    sampling: str = "pplus"
    positives: str | None = None
    tau: float = DEFAULT_TAU
    gains: str = "estimate"  # what W is solved from: the sampled estimate, or (flow1d) the exact table
    control: str | None = None  # flow1d: another flow1d setting whose study runs beside this one
    # ``recast study`` (the batched engine of the 1-D world) only:
    arms: tuple[str, ...] = ()  # MODE[:KERNEL[:GAINS]] each; default: the modes, kernel exp, W from ``gains``
    group_sizes: tuple[int, ...] = ()  # G per cell at [train]'s G × prompts_per_step rollouts; default [train]'s
    eval_n: int | None = None  # evaluation samples per checkpoint; default [evaluate] n
    learning_rates: tuple[tuple[str, float], ...] = ()  # arm label (or ARM@G) → its learning rate
    learning_rate_ladder: tuple[float, ...] = ()  # every arm × G at every one of these rates (one shared ladder)
    lost_delta: float = DEFAULT_LOST_DELTA  # the report's lost reward: normalised final ODE gain below this

    @staticmethod
    def label(budget: tuple[float, ...]) -> str:
        """A budget as a file-name part: (1, 1, 1, 2) → ``1-1-1-2``."""
        return "-".join(f"{x:g}" for x in budget)

    @staticmethod
    def lambda_arg(budget: tuple[float, ...]) -> str:
        """A budget as ``--lambda`` takes it: (1, 1, 1, 2) → ``1,1,1,2``."""
        return ",".join(f"{x:g}" for x in budget)

    def arm_specs(self) -> tuple[ArmSpec, ...]:
        """The arms a study trains: ``arms``, or every mode with the default kernel and W from ``gains``."""
        if self.arms:
            return tuple(ArmSpec.parse(a) for a in self.arms)
        return tuple(ArmSpec(mode, DEFAULT_KERNEL, self.gains, mode) for mode in self.modes)

    def cells(self, train: TrainConfig, where: str) -> tuple[StudyCell, ...]:
        """The study's plan, the only place ``[study]`` becomes cells: every budget × arm × group size
        (``group_sizes``, or ``[train]``'s G), in that order, each with its learning rate (``learning_rates``
        by ``ARM@G``, then by arm, else ``[train]``'s) — or, with a ``learning_rate_ladder``, each of them at
        every rung of the ladder (the rung last). BadInput (``where``: the setting file's name) for
        a G that does not divide ``[train]``'s rollouts per step, or a learning rate naming no arm."""
        rollouts = train.group_size * train.prompts_per_step
        sizes = self.group_sizes or (train.group_size,)
        for g in sizes:
            if rollouts % g:
                raise BadInput(f"{where}: [study] group_sizes: G = {g} does not divide the "
                               f"{rollouts} rollouts per step ([train] group_size × prompts_per_step)")
        arms = self.arm_specs()
        rates = dict(self.learning_rates)
        unknown = sorted(set(rates) - {a.label for a in arms} - {f"{a.label}@{g}" for a in arms for g in sizes})
        if unknown:
            raise BadInput(f"{where}: [study] learning_rates names no arm: {', '.join(unknown)} "
                           f"(arms: {', '.join(a.label for a in arms)})")
        if self.learning_rate_ladder:
            return tuple(StudyCell(budget, arm, g, rollouts // g, rate, rung=True) for budget in self.budgets
                         for arm in arms for g in sizes for rate in self.learning_rate_ladder)
        return tuple(StudyCell(budget, arm, g, rollouts // g, rates.get(f"{arm.label}@{g}",
                                                                          rates.get(arm.label, train.learning_rate)))
                     for budget in self.budgets for arm in arms for g in sizes)

    def positives_path(self) -> Path | None:
        """The folder of a ``folder:DIR`` / ``diffusers:PATH`` source (already resolved), else None."""
        if self.positives and self.positives.split(":", 1)[0] in PATH_SOURCES:
            return Path(self.positives.split(":", 1)[1])
        return None


def load_study(setting: Setting) -> StudySpec:
    """The ``[study]`` table, checked (BadInput names the key); paths resolved against the setting."""
    where = f"{setting.file.name}: [study]"
    table = setting.raw.get("study")
    if not isinstance(table, dict):
        raise BadInput(f"{setting.file}: no [study] table")
    rewards = _train_rewards(setting)
    if "arms" in table and "modes" in table:  # arms replace modes: one of the two would be dropped unsaid
        raise BadInput(f"{where}: arms and modes: give one of them (the arms name each arm's mode, "
                       "MODE[:KERNEL[:GAINS]]), not both")

    def no_budgets() -> NoReturn:
        raise BadInput(f"{where} needs budgets = [[λ per reward], ...]")

    def modes(value: Any) -> tuple[str, ...]:
        if (not isinstance(value, list) or not value or len(set(map(str, value))) != len(value)
                or any(m not in STUDY_MODES for m in value)):
            raise BadInput(f"{where} modes must be distinct values of {', '.join(STUDY_MODES)}, got {value!r}")
        return tuple(value)

    def gains(value: Any) -> str:
        _one_of(value, STUDY_GAINS, f"{where} gains")
        if value == "exact" and setting.policy.kind != "flow1d":
            raise BadInput(f"{where} gains = \"exact\" needs the analytic world (a flow1d policy)")
        return value

    def control(value: Any) -> str:
        if setting.policy.kind != "flow1d" or not isinstance(value, str):
            raise BadInput(f"{where} control names another flow1d setting (a .toml path) of a flow1d study")
        path = (setting.file.parent / value).resolve()
        if not path.is_file():
            raise BadInput(f"{where} control = {value!r}: no such setting ({path})")
        if path == setting.file.resolve():
            raise BadInput(f"{where} control names the setting itself")
        return str(path)

    def unknown(keys: list[str], allowed: list[str]) -> str:
        return f"{where}: unknown key {', '.join(sorted(keys))}; allowed: {', '.join(sorted(allowed))}"

    def learning_rates(value: Any) -> tuple[tuple[str, float], ...]:
        if not isinstance(value, dict) or not value:
            raise BadInput(f"{where} learning_rates must be a table of arm label = learning rate")
        return tuple((str(k), _positive(v, f"{where} learning_rates.{k}")) for k, v in value.items())

    def ladder(value: Any) -> tuple[float, ...]:
        if not isinstance(value, list) or not value or "learning_rates" in table:
            raise BadInput(f"{where} learning_rate_ladder must be a non-empty list of learning rates (every arm "
                           "runs at each), and excludes learning_rates")
        rates = tuple(_positive(v, f"{where} learning_rate_ladder[{i}]") for i, v in enumerate(value))
        if len(set(rates)) != len(rates) or list(rates) != sorted(rates):
            raise BadInput(f"{where} learning_rate_ladder must be distinct rates in ascending order, got {shown(value)}")
        return rates

    def lost_delta(value: Any) -> float:
        if not _is_number(value) or not 0 < value < 1:
            raise BadInput(f"{where} lost_delta must lie in (0, 1) (a share of a reward's headroom), got {value!r}")
        return float(value)

    parse = {"budgets": lambda v: _budgets(v, rewards, where), "seeds": lambda v: _seeds(v, where), "modes": modes,
             "learning_rate_ladder": ladder, "lost_delta": lost_delta,
             "arms": lambda v: _arms(v, setting, where), "group_sizes": lambda v: _group_sizes(v, where),
             "eval_n": lambda v: bounds.check("images_per_prompt", v, f"{where} eval_n"), "learning_rates": learning_rates,
             **{key: (lambda v, key=key, kind=kind: bounds.check(kind, v, f"{where} {key}"))
                for key, kind in (("warmup_steps", "warmup_steps"), ("estimate_steps", "steps"),
                                  ("n", "positives_per_prompt"), ("k", "rollouts"), ("p", "prompts"))},
             **{key: (lambda v, key=key: _positive(v, f"{where} {key}")) for key in ("alpha", "tau")},
             "sampling": lambda v: _one_of(v, SAMPLINGS, f"{where} sampling"),
             "positives": lambda v: _positives_source(v, setting.file, where),
             "gains": gains, "control": control}
    return parse_table(StudySpec, table, unknown, parse, absent={"budgets": no_budgets}, rewards=rewards)


def _budgets(value: Any, rewards: tuple[str, ...], where: str) -> tuple[tuple[float, ...], ...]:
    """``budgets``: distinct lists of one positive λ per reward of ``rewards``."""
    if not isinstance(value, list) or not value:
        raise BadInput(f"{where} budgets must be a non-empty list of λ lists")
    parsed = []
    for i, budget in enumerate(value):
        if not isinstance(budget, list) or not all(_is_number(x) for x in budget):
            raise BadInput(f"{where} budgets[{i}] = {budget!r} is not a list of numbers")
        if len(budget) != len(rewards):
            raise BadInput(f"{where} budgets[{i}] has {len(budget)} values for {len(rewards)} rewards "
                           f"({', '.join(rewards)})")
        if not all(math.isfinite(x) and x > 0 for x in budget):
            raise BadInput(f"{where} budgets[{i}] = {budget} must hold positive numbers")
        parsed.append(tuple(float(x) for x in budget))
    if len(set(parsed)) != len(parsed):
        raise BadInput(f"{where} budgets lists a budget twice")
    return tuple(parsed)


def _shrink(part: str, text: str) -> float:
    """γ of an arm's ``shrinkγ`` part: a number in (0, 1)."""
    number = part[len("shrink"):] if part.startswith("shrink") else ""
    try:
        gamma = float(number) if re.fullmatch(r"[0-9.]{1,20}", number) else math.nan
    except ValueError:
        gamma = math.nan
    if not 0 < gamma < 1:
        raise BadInput(f"arm {shown(text)}: the fourth part must be shrinkγ with γ in (0, 1), e.g. shrink0.5, or a "
                       f"variant: {', '.join(VARIANTS)}")
    return gamma


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    """``seeds``: distinct integers, or ``"LO:HI"`` (a half-open range), within the bounds."""
    if isinstance(value, str):  # "LO:HI", a half-open range: the hundreds of seeds of a batched study
        lo, sep, hi = (part.strip() for part in value.partition(":"))
        if not sep or not re.fullmatch(DIGITS, lo) or not re.fullmatch(DIGITS, hi) or int(lo) >= int(hi):
            raise BadInput(f"{where} seeds = {shown(value)}: a string must be \"LO:HI\" with LO < HI")
        value = list(bounds.seed_range(int(lo), int(hi), f"{where} seeds"))
    seeds = _int_list(value, f"{where} seeds")
    if not seeds or len(set(seeds)) != len(seeds):
        raise BadInput(f"{where} seeds must be distinct integers, got {shown(value)}")
    bounds.check("study_seeds", len(seeds), f"{where} seeds (how many)")
    for i, seed in enumerate(seeds):
        bounds.check("seed", seed, f"{where} seeds[{i}]")
    return tuple(seeds)


def _arms(value: Any, setting: Setting, where: str) -> tuple[str, ...]:
    """``arms``: distinct ``MODE[:KERNEL[:GAINS]]`` strings (:meth:`ArmSpec.parse`), on a flow1d setting."""
    if not isinstance(value, list) or not value:
        raise BadInput(f"{where} arms must be a non-empty list of \"MODE[:KERNEL[:GAINS]]\" strings")
    labels = [ArmSpec.parse(v).label for v in value]
    if len(set(labels)) != len(labels):
        raise BadInput(f"{where} arms lists an arm twice")
    if setting.policy.kind != "flow1d":
        raise BadInput(f"{where} arms are for recast study, the batched engine of the 1-D world (flow1d)")
    return tuple(value)


def _group_sizes(value: Any, where: str) -> tuple[int, ...]:
    """``group_sizes``: distinct group sizes G ≥ 2 within the bounds."""
    sizes = _int_list(value, f"{where} group_sizes")
    if not sizes or len(set(sizes)) != len(sizes):
        raise BadInput(f"{where} group_sizes must be distinct integers, got {shown(value)}")
    for i, g in enumerate(sizes):
        bounds.check("group_size", g, f"{where} group_sizes[{i}]")
        if g < 2:
            raise BadInput(f"{where} group_sizes[{i}] = {g}: a group needs at least 2 samples")
    return tuple(sizes)


def _train_rewards(setting: Setting) -> tuple[str, ...]:
    rewards = setting.raw.get("train", {}).get("rewards") if isinstance(setting.raw.get("train"), dict) else None
    if not isinstance(rewards, list) or not rewards or not all(isinstance(r, str) for r in rewards):
        raise BadInput(f"{setting.file.name}: [study] budgets need [train] rewards = [\"name\", ...]")
    return tuple(rewards)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _one_of(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise BadInput(f"{where} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise BadInput(f"{where} must be a list of integers, got {shown(value)}")
    return value


def _positive(value: Any, where: str) -> float:
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise BadInput(f"{where} must be a positive number, got {value!r}")
    return float(value)


def _positives_source(value: Any, setting_file: Path, where: str) -> str:
    """A ``recast sample-positive --source`` value; the path of folder:/diffusers: resolved."""
    if not isinstance(value, str):
        raise BadInput(f"{where} positives must be a string, got {value!r}")
    kind, _, rest = value.partition(":")
    if kind in PATH_SOURCES and rest:
        return f"{kind}:{(setting_file.parent / rest).resolve()}"
    if value in PLAIN_SOURCES:
        return value
    raise BadInput(f"{where} positives = {value!r}: expected one of {', '.join(PLAIN_SOURCES)}, folder:DIR or "
                   "diffusers:PATH (the sources of recast sample-positive)")


# --------------------------------------------------------------------------- what determines an artifact


def table_content(setting: Setting, name: str) -> dict[str, Any]:
    """The setting's table ``name`` as written, and the content of the prompts file it names (a file's
    content is what a recipe reads, not its name)."""
    table = setting.raw.get(name)
    prompts = table.get("prompts") if isinstance(table, dict) else None
    return {"table": table, "prompts": file_digest(setting.file.parent / prompts) if isinstance(prompts, str) else None}


#: the ``[study]`` keys the gain tables are estimated with (the exact table: the first three)
ESTIMATE_KEYS = ("rewards", "estimate_steps", "alpha", "n", "k", "p", "sampling", "positives")
EXACT_KEYS = ESTIMATE_KEYS[:3]
