"""``recast study-makefile``: a setting's whole study as a Make graph over artifact files.

``make all SETTING=S`` writes this graph to ``artifacts/S/study.mk`` and runs it, so Make's
dependency tracking on the artifacts decides what is left to do: an interrupted study
resumes without redoing finished artifacts (each stage is itself resumable or atomic).

    warmup (static λ, base model)  →  positives  →  estimate at the warmup checkpoint
      →  solve-w for every budget × mode  →  train every budget × mode × seed (from the warmup)
      →  evaluate every run (+ the base model)
      →  estimate D at the base model and at the first budget's and seed's static and ReCAST
         checkpoints (Table 6 / Fig. 5)  →  report

Runs write ``.done`` stamps only after ``recast train`` exits 0 (it trains to max_steps and
saves its last checkpoint), so a killed run is resumed with ``--resume``, not skipped.

A changed setting leaves no stale file behind: every target also depends on the stamps
``$(R)/.setting/PART.sha256`` of the parts of the setting its recipe reads (:func:`setting_stamps`),
rewritten by make only when their digest changes, and a run folder started under other stamps
is refused, not resumed (:data:`TRAINED_UNDER`).

The sweep is the setting's ``[study]`` table (``load_study`` → ``StudySpec``).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from recast_cli import bounds
from recast_cli.errors import BadInput, shown
from recast_cli.settings import Setting, digest, file_digest, load_setting, parse_table, policy_content, world_of
from recast_cli.train.config import config_from_setting, skip_clean_of

#: the arms a study trains by default, in the order its Make graph lists them (each one of artifacts.MODES)
STUDY_MODES = ("static", "recast", "nosink", "reversed")
SAMPLINGS = ("pplus", "pold")
STUDY_GAINS = ("estimate", "exact")
PLAIN_SOURCES = ("renderer", "openai", "gemini", "self")
PATH_SOURCES = ("folder", "diffusers")


KERNELS = ("exp", "power")
#: a number of a "LO:HI" seeds string: ASCII digits, no more than ``int`` reads (4300)
DIGITS = r"[0-9]{1,4300}"


@dataclass(frozen=True)
class ArmSpec:
    """One arm of ``recast study``: the solve-w mode and kernel, and what W is solved from (the exact
    gains of the analytic world, or the sampled estimate at the base policy). ``label`` names it."""

    mode: str
    kernel: str
    gains: str
    label: str

    @classmethod
    def parse(cls, text: str) -> ArmSpec:
        """``MODE[:KERNEL[:GAINS]]`` → the arm, labelled by its parts joined with '-' (``recast:power`` →
        ``recast-power``); BadInput for an unknown part."""
        parts = text.split(":") if isinstance(text, str) else []
        if not 1 <= len(parts) <= 3 or parts[0] not in STUDY_MODES:
            raise BadInput(f"arm {shown(text)}: expected MODE[:KERNEL[:GAINS]] with MODE one of {', '.join(STUDY_MODES)}")
        kernel = parts[1] if len(parts) > 1 else "exp"
        gains = parts[2] if len(parts) > 2 else "exact"
        if kernel not in KERNELS or gains not in STUDY_GAINS:
            raise BadInput(f"arm {text!r}: the kernel must be one of {', '.join(KERNELS)} and the gains one of "
                           f"{', '.join(STUDY_GAINS)}")
        return cls(parts[0], kernel, gains, "-".join(parts))


@dataclass(frozen=True)
class StudySpec:
    """The sweep of one setting: budgets × seeds × modes after one static warmup (METHOD.md §6–7).

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
    tau: float = 1.0
    gains: str = "estimate"  # what W is solved from: the sampled estimate, or (flow1d) the exact table
    control: str | None = None  # flow1d: another flow1d setting whose study runs beside this one
    # ``recast study`` (the batched engine of the 1-D world) only:
    arms: tuple[str, ...] = ()  # MODE[:KERNEL[:GAINS]] each; default: the modes, kernel exp, W from ``gains``
    group_sizes: tuple[int, ...] = ()  # G per cell at [train]'s G × prompts_per_step rollouts; default [train]'s
    eval_n: int | None = None  # evaluation samples per checkpoint; default [evaluate] n
    learning_rates: tuple[tuple[str, float], ...] = ()  # arm label (or ARM@G) → its learning rate

    @staticmethod
    def label(budget: tuple[float, ...]) -> str:
        """A budget as a file-name part: (1, 1, 1, 2) → ``1-1-1-2``."""
        return "-".join(f"{x:g}" for x in budget)

    @staticmethod
    def lambda_arg(budget: tuple[float, ...]) -> str:
        """A budget as ``--lambda`` takes it: (1, 1, 1, 2) → ``1,1,1,2``."""
        return ",".join(f"{x:g}" for x in budget)

    def arm_specs(self) -> tuple[ArmSpec, ...]:
        """The arms ``recast study`` trains: ``arms``, or every mode with the exp kernel and W from ``gains``."""
        if self.arms:
            return tuple(ArmSpec.parse(a) for a in self.arms)
        return tuple(ArmSpec(mode, "exp", self.gains, mode) for mode in self.modes)

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

    def budgets(value: Any) -> tuple[tuple[float, ...], ...]:
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

    def no_budgets() -> NoReturn:
        raise BadInput(f"{where} needs budgets = [[λ per reward], ...]")

    def seeds(value: Any) -> tuple[int, ...]:
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

    def arms(value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            raise BadInput(f"{where} arms must be a non-empty list of \"MODE[:KERNEL[:GAINS]]\" strings")
        labels = [ArmSpec.parse(v).label for v in value]
        if len(set(labels)) != len(labels):
            raise BadInput(f"{where} arms lists an arm twice")
        if setting.policy.kind != "flow1d":
            raise BadInput(f"{where} arms are for recast study, the batched engine of the 1-D world (flow1d)")
        return tuple(value)

    def group_sizes(value: Any) -> tuple[int, ...]:
        sizes = _int_list(value, f"{where} group_sizes")
        if not sizes or len(set(sizes)) != len(sizes):
            raise BadInput(f"{where} group_sizes must be distinct integers, got {shown(value)}")
        for i, g in enumerate(sizes):
            bounds.check("group_size", g, f"{where} group_sizes[{i}]")
            if g < 2:
                raise BadInput(f"{where} group_sizes[{i}] = {g}: a group needs at least 2 samples")
        return tuple(sizes)

    def learning_rates(value: Any) -> tuple[tuple[str, float], ...]:
        if not isinstance(value, dict) or not value:
            raise BadInput(f"{where} learning_rates must be a table of arm label = learning rate")
        return tuple((str(k), _positive(v, f"{where} learning_rates.{k}")) for k, v in value.items())

    parse = {"budgets": budgets, "seeds": seeds, "modes": modes, "arms": arms, "group_sizes": group_sizes,
             "eval_n": lambda v: bounds.check("images_per_prompt", v, f"{where} eval_n"), "learning_rates": learning_rates,
             **{key: (lambda v, key=key, kind=kind: bounds.check(kind, v, f"{where} {key}"))
                for key, kind in (("warmup_steps", "warmup_steps"), ("estimate_steps", "steps"),
                                  ("n", "positives_per_prompt"), ("k", "rollouts"), ("p", "prompts"))},
             **{key: (lambda v, key=key: _positive(v, f"{where} {key}")) for key in ("alpha", "tau")},
             "sampling": lambda v: _one_of(v, SAMPLINGS, f"{where} sampling"),
             "positives": lambda v: _positives_source(v, setting.file, where),
             "gains": gains, "control": control}
    return parse_table(StudySpec, table, unknown, parse, absent={"budgets": no_budgets}, rewards=rewards)


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


# --------------------------------------------------------------------------- the Make graph


#: The characters a path may hold to be written into the Makefile as it is: anything else would
#: be read by make (``$``, ``#``, ``:``, spaces) or by the shell (``;``, quotes, ``&``, ...).
SAFE_PATH = re.compile(r"[A-Za-z0-9._/+=,@~-]+")


def make_path(value: str | Path, what: str) -> str:
    """``value`` as a word of the generated Makefile; BadInput naming the first unsafe character."""
    text = str(value)
    if not SAFE_PATH.fullmatch(text):
        bad = next((c for c in text if not SAFE_PATH.fullmatch(c)), "")
        raise BadInput(f"{what} {text!r}: the character {bad!r} is not allowed in a study's paths (make or the "
                       "shell would read it); use letters, digits and ._/+=,@~-")
    return shlex.quote(text)


#: The stamps of a study's Make graph: ``$(R)/.setting/PART.sha256`` holds the digest of one part of
#: the setting, rewritten only when it changes, and every target lists the parts its recipe reads
#: beyond its command line as prerequisites: a setting change makes exactly those targets stale.
STAMPS = ".setting"
POLICY_PARTS = ("world", "policy", "rewards")  # what every recipe that samples or scores reads
#: A run's target reads [train] whole (``train``: a longer max_steps trains on), but the run folder is of
#: what ``recast train --resume`` keeps (``trainkey``: the run key and the prompts' content).
RUN_PARTS = (*POLICY_PARTS, "train", "trainkey")


def setting_stamps(setting: Setting, study: StudySpec, steps: int, skip: int) -> dict[str, str]:
    """Part → the digest of what the recipes that depend on it read from the setting (the values their
    command lines take from ``[study]`` included: make does not compare recipes)."""
    raw = setting.raw
    return {"world": digest(world_of(setting)), "policy": digest(policy_content(setting)),
            "rewards": digest(raw.get("rewards")), "train": digest(table_content(setting, "train")),
            "trainkey": digest([config_from_setting(setting).run_key(), table_content(setting, "train")["prompts"]]),
            "evaluate": digest(table_content(setting, "evaluate")),
            "exact": digest([getattr(study, k) for k in EXACT_KEYS]),
            "estimate": digest({"study": [getattr(study, k) for k in ESTIMATE_KEYS],
                                "positives": table_content(setting, "positives")}),
            "solve": digest({"tau": study.tau, "gains": study.gains, "steps": steps, "skip": skip}),
            "warmup": digest(study.warmup_steps)}


def rule(target: str, *prerequisites: str) -> str:
    """A rule's first line: ``target:`` and the prerequisites given (empty ones left out)."""
    return " ".join([f"{target}:", *(p for p in prerequisites if p)])


def stamp_files(R: str, *parts: str) -> str:
    """The stamp files of ``parts``, as prerequisites."""
    return " ".join(f"{R}/{STAMPS}/{part}.sha256" for part in parts)


def stamp_rules(R: str, stamps: dict[str, str]) -> list[str]:
    """One rule per stamp, remade on every make (FORCE) but rewriting its file only when the digest
    differs, so the file's time moves exactly when that part of the setting changed. ``+``: it runs
    under ``make -n`` and ``-q`` too, which then say what a real make would redo."""
    lines = []
    for part, value in stamps.items():
        lines += [f"{stamp_files(R, part)}: FORCE",
                  f'\t+@mkdir -p $(@D) && {{ [ "$$(cat $@ 2>/dev/null)" = {value} ] || '
                  f"{{ echo {value} > $@.tmp && mv $@.tmp $@; }}; }}", ""]
    return lines


#: The first recipe line of every training run (``recast train --resume`` continues any run of the same W
#: and ``[train]``): a run folder is resumed only under the stamps it was started under (its
#: prerequisites ending .sha256, recorded in ``RUN.setting`` beside it); another one, started before a
#: setting change or by an older recast, is refused (one line, exit 2), never resumed.
TRAINED_UNDER = (
    "TRAINED_UNDER = @if [ -e $(@D) ] && "
    "[ \"$$(cat $(filter-out %/train.sha256,$(filter %.sha256,$^)))\" != \"$$(cat $(@D).setting 2>/dev/null)\" ]; "
    "then echo \"$(@D) was trained under another [policy], [world], [rewards.*], [train] (beyond its step budget, "
    "checkpoints and logging) or [study] warmup_steps, or by an older recast; remove it and $(@D).setting to train "
    "it again\" >&2; exit 2; fi; "
    "mkdir -p $(dir $(@D)) && cat $(filter-out %/train.sha256,$(filter %.sha256,$^)) > $(@D).setting")


def study_makefile(setting_name: str, root: Path, recast: str = "recast") -> str:
    """The Make fragment of a setting's study (see the module docstring)."""
    setting = load_setting(setting_name)
    study = load_study(setting)
    root = Path(make_path(root, "--root"))
    recast = make_path(recast, "--recast")
    make_path(setting.file, "the setting")
    for path in (study.positives_path(), study.control):
        if path is not None:
            make_path(path, "the study's")
    if setting.policy.kind == "flow1d":
        return analytic_study_makefile(setting, study, root, recast)
    steps = setting.policy.steps
    # W lives on the steps the trainer trains (E13): the cleanest ones it skips get no weight
    skip = skip_clean_of(steps, config_from_setting(setting).train_fraction)
    q = shlex.quote
    S = q(str(setting.file))
    R = str(root)
    rewards = ",".join(study.rewards)
    lines = [
        f"# generated by `recast study-makefile --setting {setting.name}`; regenerated by `make all`",
        f"RECAST ?= {recast}",
        f"R := {R}",
        "",
        ".PHONY: all FORCE",
        "all: $(R)/report/report.md",
        "FORCE:",
        TRAINED_UNDER,
        "",
        *stamp_rules("$(R)", setting_stamps(setting, study, steps, skip)),
    ]
    reads = stamp_files("$(R)", *POLICY_PARTS)  # what a recipe that samples or scores reads of the setting
    # warmup: static W with the setting's λ, from the base model
    warm = "$(R)/warmup"
    if study.warmup_steps > 0:
        lines += [
            rule(f"{warm}/.done", stamp_files("$(R)", *RUN_PARTS, "warmup")),
            "\t$(TRAINED_UNDER)",
            f"\t$(RECAST) train --setting {S} --weights static --seed 0 --out {warm} "
            f"--max-steps {study.warmup_steps} --resume --quiet",
            "\ttouch $@",
            "",
        ]
        policy, init, warm_dep = warm, f" --init {warm}", f"{warm}/.done"
    else:
        policy, init, warm_dep = S, "", ""
    # positives and the gain table at the warmup checkpoint
    gains = "$(R)/gains.parquet"
    positives_dep = ""
    estimate_src = ""
    if study.sampling == "pplus":
        source = study.positives or "renderer"
        if Path(source).is_dir():
            estimate_src = f" --positives {q(source)}"
        else:
            positives_dep = "$(R)/positives/manifest.parquet"
            lines += [
                rule(positives_dep, reads, stamp_files("$(R)", "estimate")),
                f"\t$(RECAST) sample-positive --setting {S} --source {q(source)} --n {study.n} --out $(R)/positives",
                "",
            ]
            estimate_src = " --positives $(R)/positives"
    p_flag = f" --p {study.p}" if study.p else ""

    def estimate(target: str, at: str, deps: str) -> list[str]:
        return [rule(target, *deps.split(), reads, stamp_files("$(R)", "estimate")),
                f"\t$(RECAST) estimate --policy {at} --rewards {rewards}{estimate_src} --sampling {study.sampling} "
                f"--steps {study.estimate_steps} --n {study.n} --k {study.k}{p_flag} --alpha {study.alpha:g} --out $@",
                ""]

    lines += estimate(gains, policy, f"{warm_dep} {positives_dep}")
    # Table 6 / Fig. 5: D at the base model and at the trained checkpoints of the first budget and seed
    d_tables = ["$(R)/gains/base.parquet"] if study.warmup_steps > 0 else []
    lines += estimate("$(R)/gains/base.parquet", S, positives_dep) if d_tables else []
    # W per budget and mode, runs per budget × mode × seed, evaluations
    evals, runs = ["$(R)/evals/base.parquet"], []
    evaluated = f"{reads} {stamp_files('$(R)', 'evaluate')}"
    lines += [
        f"$(R)/evals/base.parquet: {evaluated}",
        f"\t$(RECAST) evaluate --setting {S} --out $@ --quiet",
        "",
    ]
    for budget in study.budgets:
        label, lam = study.label(budget), ",".join(f"{x:g}" for x in budget)
        for mode in study.modes:
            W = f"$(R)/W/{label}-{mode}.safetensors"
            lines += [
                f"{W}: {gains} {stamp_files('$(R)', 'solve')}",
                f"\t$(RECAST) solve-w --gains {gains} --lambda {lam} --mode {mode} --tau {study.tau:g} "
                f"--steps {steps} --skip-clean {skip} --out $@",
                "",
            ]
            for seed in study.seeds:
                run = f"$(R)/runs/{label}/{mode}-s{seed}"
                if budget == study.budgets[0] and seed == study.seeds[0] and mode in ("static", "recast"):
                    d_tables.append(f"$(R)/gains/{label}-{mode}-s{seed}.parquet")
                    lines += estimate(d_tables[-1], run, f"{run}/.done {positives_dep}")
                ev = f"$(R)/evals/{label}/{mode}-s{seed}.parquet"
                runs.append(run)
                evals.append(ev)
                lines += [
                    rule(f"{run}/.done", W, warm_dep, stamp_files("$(R)", *RUN_PARTS)),
                    "\t$(TRAINED_UNDER)",
                    f"\t$(RECAST) train --setting {S} --weights {W}{init} --seed {seed} --lambda {lam} "
                    f"--out {run} --resume --quiet",
                    "\ttouch $@",
                    "",
                    f"{ev}: {run}/.done {evaluated}",
                    f"\t$(RECAST) evaluate --run {run} --out $@ --quiet",
                    "",
                ]
    gain_input = " " + " ".join([gains, *d_tables])
    lines += [
        f"RUNS := {' '.join(runs)}",
        f"EVALS := {' '.join(evals)}",
        "",
        f"$(R)/report/report.md: $(EVALS) $(addsuffix /.done,$(RUNS)){gain_input}",
        f"\t$(RECAST) report $(EVALS) $(RUNS){gain_input} --out $(R)/report",
        "",
    ]
    return "\n".join(lines)


def analytic_study_makefile(setting, study, root: Path, recast: str = "recast", header: bool = True) -> str:
    """The study of a flow1d setting: no warmup, W from the exact (or the sampled) gains at the
    base policy, every budget × mode × seed trained from the exact π^old, each run evaluated
    at every checkpoint under the training sampler and at its last under the ODE.

        exact gains (recast estimate --exact: gmm1d, or the setting's [world])   sampled gains at the base policy
              →  solve-w per budget × mode (and ReCAST's W from the sampled gains, for the report)
              →  train budget × mode × seed  →  evaluate: curve (sde, every checkpoint), final (ode)
              →  report;  a ``control`` setting's study runs the same way under $(R)/control/
    """
    steps = setting.policy.steps
    train = config_from_setting(setting)
    skip = skip_clean_of(steps, train.train_fraction)
    saved = train.max_steps // train.save_every
    if train.keep_checkpoints < saved:
        raise BadInput(f"{setting.file}: the study evaluates every checkpoint, but [train] keep_checkpoints = "
                       f"{train.keep_checkpoints} keeps fewer than the {saved} a run saves; set keep_checkpoints = {saved}")
    q = shlex.quote
    S = q(str(setting.file))
    rewards = ",".join(study.rewards)
    R = "$(R)" if header else str(root)
    lines = []
    if header:
        lines += [f"# generated by `recast study-makefile --setting {setting.name}`; regenerated by `make all`",
                  f"RECAST ?= {recast}", f"R := {root}", "", ".PHONY: all FORCE",
                  "all: $(R)/report/report.md" + (" $(R)/control/report/report.md" if study.control else ""),
                  "FORCE:", TRAINED_UNDER, ""]
    lines += stamp_rules(R, setting_stamps(setting, study, steps, skip))
    reads, evaluated = stamp_files(R, *POLICY_PARTS), stamp_files(R, *POLICY_PARTS, "evaluate")
    exact, sampled = f"{R}/gains/exact.parquet", f"{R}/gains.parquet"
    exact_policy = "gmm1d" if setting.policy.world is None else S  # a [world] of its own: the setting's exact curves
    p_flag = f" --p {study.p}" if study.p else ""
    lines += [
        f"{exact}: {stamp_files(R, 'world', 'exact')}",
        f"	$(RECAST) estimate --policy {exact_policy} --rewards {rewards} --exact --steps {study.estimate_steps} "
        f"--alpha {study.alpha:g} --out $@",
        "",
        f"{sampled}: {reads} {stamp_files(R, 'estimate')}",
        f"	$(RECAST) estimate --policy {S} --rewards {rewards} --sampling {study.sampling} "
        f"--steps {study.estimate_steps} --n {study.n} --k {study.k}{p_flag} --alpha {study.alpha:g} --out $@",
        "",
        f"{R}/evals/base.parquet: {evaluated}",
        f"	$(RECAST) evaluate --setting {S} --sampler sde,ode --out $@ --quiet",
        "",
    ]
    w_gains = exact if study.gains == "exact" else sampled
    solved = stamp_files(R, "solve")
    solve = f"--tau {study.tau:g} --steps {steps} --skip-clean {skip} --out $@"
    inputs, runs = [f"{R}/evals/base.parquet"], []
    for budget in study.budgets:
        label, lam = study.label(budget), study.lambda_arg(budget)
        if study.gains == "exact" and "recast" in study.modes:  # what the sampled estimator would have given
            shown = f"{R}/W/{label}-recast-sampled.safetensors"
            lines += [f"{shown}: {sampled} {solved}",
                      f"	$(RECAST) solve-w --gains {sampled} --lambda {lam} --mode recast {solve}", ""]
            inputs.append(shown)
        for mode in study.modes:
            W = f"{R}/W/{label}-{mode}.safetensors"
            lines += [f"{W}: {w_gains} {solved}",
                      f"	$(RECAST) solve-w --gains {w_gains} --lambda {lam} --mode {mode} {solve}", ""]
            for seed in study.seeds:
                run = f"{R}/runs/{label}/{mode}-s{seed}"
                curve, final = f"{R}/evals/{label}/{mode}-s{seed}.parquet", f"{R}/evals/{label}/{mode}-s{seed}-ode.parquet"
                runs.append(run)
                inputs += [curve, final]
                lines += [
                    f"{run}/.done: {W} {stamp_files(R, *RUN_PARTS)}",
                    "	$(TRAINED_UNDER)",
                    f"	$(RECAST) train --setting {S} --weights {W} --seed {seed} --lambda {lam} --out {run} "
                    "--resume --quiet",
                    "	touch $@",
                    "",
                    f"{curve}: {run}/.done {evaluated}",
                    f"	$(RECAST) evaluate --run {run} --checkpoints all --sampler sde --out $@ --quiet",
                    "",
                    f"{final}: {run}/.done {evaluated}",
                    f"	$(RECAST) evaluate --run {run} --sampler ode --out $@ --quiet",
                    "",
                ]
    name = "CONTROL_" if not header else ""
    lines += [
        f"{name}RUNS := {' '.join(runs)}",
        f"{name}INPUTS := {' '.join(inputs)} {exact} {sampled}",
        "",
        f"{R}/report/report.md: $({name}INPUTS) $(addsuffix /.done,$({name}RUNS))",
        f"	$(RECAST) report $({name}INPUTS) $({name}RUNS) --out {R}/report",
        "",
    ]
    if header and study.control:
        control = load_setting(study.control)
        lines.append(analytic_study_makefile(control, load_study(control), Path("$(R)/control"), recast, header=False))
    return "\n".join(lines)
