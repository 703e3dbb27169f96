"""``recast study-makefile``: a setting's whole study as a Make graph over artifact files.

``make all SETTING=S`` writes this graph to ``artifacts/S/study.mk`` and runs it, so Make's
dependency tracking on the artifacts decides what is left to do: an interrupted study
resumes without redoing finished artifacts (each stage is itself resumable or atomic).

    warmup (static λ, base model)  →  positives  →  estimate at the warmup checkpoint
      →  solve-w for every budget × arm  →  train every budget × arm × seed (from the warmup)
      →  evaluate every run (+ the base model)
      →  estimate D at the base model and at the first budget's and seed's static and ReCAST
         checkpoints (Table 6 / Fig. 5)  →  report

Runs write ``.done`` stamps only after ``recast train`` exits 0 (it trains to max_steps and
saves its last checkpoint), so a killed run is resumed with ``--resume``, not skipped.

A changed setting leaves no stale file behind: every target also depends on the stamps
``$(R)/.setting/PART.sha256`` of the parts of the setting its recipe reads (:func:`setting_stamps`),
rewritten by make only when their digest changes, and a run folder started under other stamps
is refused, not resumed (:data:`TRAINED_UNDER`).

The sweep is the setting's ``[study]`` table, planned once (``StudySpec.cells``, the cells ``recast
study`` runs too): one W per cell, one run per cell and seed. What of that plan one run per seed
cannot hold (several group sizes, per-arm learning rates, two arms of one mode, an ``eval_n`` other
than ``[evaluate]`` n) is refused, one line (:func:`make_cells`), never ignored.
"""

from __future__ import annotations

import re
import shlex
from itertools import groupby
from pathlib import Path

from recast_cli.errors import BadInput
from recast_cli.setting.load import Setting, digest, load_setting, policy_content, world_of
from recast_cli.study.spec import ESTIMATE_KEYS, EXACT_KEYS, ArmSpec, StudyCell, StudySpec, load_study, table_content
from recast_cli.train.config import TrainConfig, config_from_setting, skip_clean_of


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
    solve = {"tau": study.tau, "gains": study.gains, "steps": steps, "skip": skip}
    if study.arms:  # an arm names its gains or takes exact ones, whatever [study] gains says
        solve["arms"] = list(study.arms)
    return {"world": digest(world_of(setting)), "policy": digest(policy_content(setting)),
            "rewards": digest(raw.get("rewards")), "train": digest(table_content(setting, "train")),
            "trainkey": digest([config_from_setting(setting).run_key(), table_content(setting, "train")["prompts"]]),
            "evaluate": digest(table_content(setting, "evaluate")),
            "exact": digest([getattr(study, k) for k in EXACT_KEYS]),
            "estimate": digest({"study": [getattr(study, k) for k in ESTIMATE_KEYS],
                                "positives": table_content(setting, "positives")}),
            "solve": digest(solve),
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
    return image_study_makefile(setting, study, root, recast)


def make_cells(setting: Setting, study: StudySpec, train: TrainConfig) -> tuple[StudyCell, ...]:
    """The study's one plan (``StudySpec.cells``, as ``recast study`` runs it) as the Make graph runs it:
    one ``recast train`` run per cell and seed under the setting's ``[train]`` recipe, evaluated with its
    ``[evaluate]`` n, the report telling the arms apart by W's mode. What of the plan it cannot run that
    way is refused, one line (``recast study``, the 1-D world's batched engine, runs it), never ignored."""
    name = setting.file.name
    cells = study.cells(train, name)
    batched = "`recast study` (the batched engine of the 1-D world) runs"
    sizes = sorted({c.group_size for c in cells})
    if sizes != [train.group_size]:
        raise BadInput(f"{name}: [study] group_sizes = {sizes}: a study's Make graph trains at [train] group_size = "
                       f"{train.group_size} only; {batched} other group sizes")
    if study.learning_rate_ladder:
        raise BadInput(f"{name}: [study] learning_rate_ladder: a study's Make graph trains every arm at [train] "
                       f"learning_rate = {train.learning_rate:g}; {batched} a ladder of rates")
    if any(c.learning_rate != train.learning_rate for c in cells):
        raise BadInput(f"{name}: [study] learning_rates: a study's Make graph trains every arm at [train] "
                       f"learning_rate = {train.learning_rate:g}; {batched} per-arm learning rates")
    modes = [a.mode for a in study.arm_specs()]
    if len(set(modes)) != len(modes):
        twice = next(m for m in modes if modes.count(m) > 1)
        raise BadInput(f"{name}: [study] arms: two arms of mode {twice}; a study's Make graph and its report tell "
                       f"runs apart by mode; {batched} them")
    if study.eval_n is not None:
        from recast_cli.evaluate.config import config_from_setting as eval_config

        n = eval_config(setting)[0].n
        if study.eval_n != n:
            raise BadInput(f"{name}: [study] eval_n = {study.eval_n}: a study's Make graph evaluates [evaluate] "
                           f"n = {n}; {batched} eval_n")
    return cells


def graph_header(setting: Setting, recast: str, root: Path, *targets: str) -> list[str]:
    """The first lines of a study's graph: its origin, the recast it calls, the root, ``all`` and FORCE."""
    return [f"# generated by `recast study-makefile --setting {setting.name}`; regenerated by `make all`",
            f"RECAST ?= {recast}",
            "# how a run is trained: `make all LAUNCH=...` sets it to an accelerate launch of recast_cli",
            "RECAST_TRAIN ?= $(RECAST) train", f"R := {root}", "", ".PHONY: all FORCE", " ".join(["all:", *targets]), "FORCE:",
            TRAINED_UNDER, ""]


def solve_rule(W: str, gains: str, lam: str, arm: ArmSpec, *, R: str, tau: float, steps: int, skip: int) -> list[str]:
    """The rule of one W: ``solve-w`` with the arm's mode and kernel, on the training grid (T, clean steps
    skipped)."""
    return [f"{W}: {gains} {stamp_files(R, 'solve')}",
            f"\t$(RECAST) solve-w --gains {gains} --lambda {lam} --mode {arm.mode} --kernel {arm.kernel} "
            f"--tau {tau:g} --steps {steps} --skip-clean {skip}{variant_flags(arm)} --out $@",
            ""]


def variant_flags(arm: ArmSpec) -> str:
    """The solve-w flags of an arm's share or variant: ``--shrink γ`` (E12s), ``--shrink auto`` (E12u),
    ``--conflicts static`` (E12c, the conflicts read from the estimate's own table)."""
    if arm.variant == "shrinkauto":
        return " --shrink auto"
    if arm.variant == "conflict":
        return " --conflicts static"
    return "" if arm.shrink == 1 else f" --shrink {arm.shrink:g}"


def train_rule(run: str, W: str, *, R: str, S: str, seed: int, lam: str, warm_dep: str = "",
               init: str = "") -> list[str]:
    """The rule of one run: refused when started under other stamps (:data:`TRAINED_UNDER`), else trained
    (or resumed) to ``[train]`` max_steps, stamped ``.done``."""
    return [rule(f"{run}/.done", W, warm_dep, stamp_files(R, *RUN_PARTS)),
            "\t$(TRAINED_UNDER)",
            f"\t$(RECAST_TRAIN) --setting {S} --weights {W}{init} --seed {seed} --lambda {lam} --out {run} "
            "--resume --progress lines",
            "\ttouch $@",
            ""]


def image_study_makefile(setting: Setting, study: StudySpec, root: Path, recast: str) -> str:
    """The study of an image setting (the module docstring's graph): warmup, positives, the estimate at the
    warmup checkpoint, then per cell its W, its runs per seed and their evaluations, then the report."""
    steps = setting.policy.steps
    train = config_from_setting(setting)
    # W lives on the steps the trainer trains (E13): the cleanest ones it skips get no weight
    skip = skip_clean_of(steps, train.train_fraction)
    cells = make_cells(setting, study, train)
    S = shlex.quote(str(setting.file))
    lines = [*graph_header(setting, recast, root, "$(R)/report/report.md"),
             *stamp_rules("$(R)", setting_stamps(setting, study, steps, skip))]
    # warmup: static W with the setting's λ, from the base model
    warm = "$(R)/warmup"
    if study.warmup_steps > 0:
        lines += [
            rule(f"{warm}/.done", stamp_files("$(R)", *RUN_PARTS, "warmup")),
            "\t$(TRAINED_UNDER)",
            f"\t$(RECAST_TRAIN) --setting {S} --weights static --seed 0 --out {warm} "
            f"--max-steps {study.warmup_steps} --resume --progress lines",
            "\ttouch $@",
            "",
        ]
        policy, init, warm_dep = warm, f" --init {warm}", f"{warm}/.done"
    else:
        policy, init, warm_dep = S, "", ""
    positives, positives_dep, source = positives_rules(study, S)
    lines += positives

    def estimate(target: str, at: str, deps: str) -> list[str]:
        return estimate_rule(study, target, at, deps, source=source)

    # the gain table at the warmup checkpoint; Table 6 / Fig. 5: D at the base model and at the trained
    # checkpoints of the first budget and seed
    gains = "$(R)/gains.parquet"
    lines += estimate(gains, policy, f"{warm_dep} {positives_dep}")
    d_tables = ["$(R)/gains/base.parquet"] if study.warmup_steps > 0 else []
    lines += estimate("$(R)/gains/base.parquet", S, positives_dep) if d_tables else []
    evals, runs = ["$(R)/evals/base.parquet"], []
    evaluated = stamp_files("$(R)", *POLICY_PARTS, "evaluate")
    # the training rewards only: the held-out judges are added later by `make judges` (evaluate --add-judges)
    lines += [f"$(R)/evals/base.parquet: {evaluated}",
              f"\t$(RECAST) evaluate --setting {S} --judges '' --out $@ --quiet", ""]
    for cell in cells:  # W per cell (budget × arm), runs per cell × seed, evaluations
        label, lam, arm = study.label(cell.budget), study.lambda_arg(cell.budget), cell.arm
        W = f"$(R)/W/{cell.weights_name}.safetensors"
        lines += solve_rule(W, gains, lam, arm, R="$(R)", tau=study.tau, steps=steps, skip=skip)
        for seed in study.seeds:
            run = f"$(R)/runs/{label}/{arm.label}-s{seed}"
            if cell.budget == study.budgets[0] and seed == study.seeds[0] and arm.label in ("static", "recast"):
                d_tables.append(f"$(R)/gains/{label}-{arm.label}-s{seed}.parquet")
                lines += estimate(d_tables[-1], run, f"{run}/.done {positives_dep}")
            ev = f"$(R)/evals/{label}/{arm.label}-s{seed}.parquet"
            runs.append(run)
            evals.append(ev)
            lines += [*train_rule(run, W, R="$(R)", S=S, seed=seed, lam=lam, warm_dep=warm_dep, init=init),
                      f"{ev}: {run}/.done {evaluated}", f"\t$(RECAST) evaluate --run {run} --judges '' --out $@ --quiet",
                      ""]
    gain_input = " " + " ".join([gains, *d_tables])
    lines += [f"RUNS := {' '.join(runs)}", f"EVALS := {' '.join(evals)}", "",
              f"$(R)/report/report.md: $(EVALS) $(addsuffix /.done,$(RUNS)){gain_input}",
              f"\t$(RECAST) report $(EVALS) $(RUNS){gain_input} --out $(R)/report", ""]
    lines += judges_rules(evals, f"$(RECAST) report $(EVALS) $(RUNS){gain_input} --out $(R)/report")
    return "\n".join(lines)


def judges_rules(evals: list[str], report: str) -> list[str]:
    """``judges``: every evaluation of ``all`` gets the setting's held-out judges (``recast evaluate
    --add-judges``, stamped ``EVAL.judged``), then the report is written again with them. An evaluation that
    ``all`` redoes is judged again (its stamp is older than it)."""
    lines = [".PHONY: judges", f"judges: {' '.join(f'{ev}.judged' for ev in evals)}", f"\t{report}", ""]
    for ev in evals:
        lines += [f"{ev}.judged: {ev}", "\t$(RECAST) evaluate --add-judges $< --quiet", "\ttouch $@", ""]
    return lines


def positives_rules(study: StudySpec, S: str) -> tuple[list[str], str, str]:
    """The positives an image study's estimates read: (their rule, the prerequisite it makes, the estimate's
    ``--positives`` flag); a folder of the user's own is read as it is (no rule)."""
    if study.sampling != "pplus":
        return [], "", ""
    source = study.positives or "renderer"
    if Path(source).is_dir():
        return [], "", f" --positives {shlex.quote(source)}"
    target = "$(R)/positives/manifest.parquet"
    return ([rule(target, stamp_files("$(R)", *POLICY_PARTS), stamp_files("$(R)", "estimate")),
             f"\t$(RECAST) sample-positive --setting {S} --source {shlex.quote(source)} --n {study.n} "
             "--out $(R)/positives",
             ""], target, " --positives $(R)/positives")


def estimate_rule(study: StudySpec, target: str, at: str, deps: str, *, source: str) -> list[str]:
    """The rule of one gain table of an image study: ``recast estimate`` at ``at`` (a model or a checkpoint)
    with the study's estimate options."""
    p_flag = f" --p {study.p}" if study.p else ""
    return [rule(target, *deps.split(), stamp_files("$(R)", *POLICY_PARTS), stamp_files("$(R)", "estimate")),
            f"\t$(RECAST) estimate --policy {at} --rewards {','.join(study.rewards)}{source} --sampling "
            f"{study.sampling} --steps {study.estimate_steps} --n {study.n} --k {study.k}{p_flag} "
            f"--alpha {study.alpha:g} --out $@",
            ""]


def analytic_study_makefile(setting: Setting, study: StudySpec, root: Path, recast: str = "recast",
                            header: bool = True) -> str:
    """The study of a flow1d setting: no warmup, W from the exact (or the sampled) gains at the
    base policy, every cell × seed trained from the exact π^old, each run evaluated
    at every checkpoint under the training sampler and at its last under the ODE.

        exact gains (recast estimate --exact: gmm1d, or the setting's [world])   sampled gains at the base policy
              →  solve-w per budget × arm (and ReCAST's W from the sampled gains, for the report)
              →  train budget × arm × seed  →  evaluate: curve (sde, every checkpoint), final (ode)
              →  report;  a ``control`` setting's study runs the same way under $(R)/control/
    """
    steps = setting.policy.steps
    train = config_from_setting(setting)
    skip = skip_clean_of(steps, train.train_fraction)
    saved = train.max_steps // train.save_every
    if train.keep_checkpoints < saved:
        raise BadInput(f"{setting.file}: the study evaluates every checkpoint, but [train] keep_checkpoints = "
                       f"{train.keep_checkpoints} keeps fewer than the {saved} a run saves; set keep_checkpoints = {saved}")
    cells = make_cells(setting, study, train)
    R = "$(R)" if header else str(root)
    lines = graph_header(setting, recast, root, "$(R)/report/report.md",
                         *(["$(R)/control/report/report.md"] if study.control else [])) if header else []
    lines += stamp_rules(R, setting_stamps(setting, study, steps, skip))
    lines += analytic_gain_rules(setting, study, R)
    exact, sampled = f"{R}/gains/exact.parquet", f"{R}/gains.parquet"
    evaluated = stamp_files(R, *POLICY_PARTS, "evaluate")
    S = shlex.quote(str(setting.file))
    solve = {"R": R, "tau": study.tau, "steps": steps, "skip": skip}
    inputs, runs = [f"{R}/evals/base.parquet"], []
    for budget, group in groupby(cells, key=lambda c: c.budget):
        group = list(group)
        label, lam = study.label(budget), study.lambda_arg(budget)
        exact_recast = next((c.arm for c in group if c.arm.mode == "recast" and c.arm.gains == "exact"), None)
        if exact_recast is not None:  # what the sampled estimator would have given
            inputs.append(f"{R}/W/{label}-recast-sampled.safetensors")
            lines += solve_rule(inputs[-1], sampled, lam, exact_recast, **solve)
        for cell in group:
            W = f"{R}/W/{cell.weights_name}.safetensors"
            lines += solve_rule(W, exact if cell.arm.gains == "exact" else sampled, lam, cell.arm, **solve)
            for seed in study.seeds:
                run = f"{R}/runs/{label}/{cell.arm.label}-s{seed}"
                curve, final = (f"{R}/evals/{label}/{cell.arm.label}-s{seed}{end}.parquet" for end in ("", "-ode"))
                runs.append(run)
                inputs += [curve, final]
                lines += [
                    *train_rule(run, W, R=R, S=S, seed=seed, lam=lam),
                    f"{curve}: {run}/.done {evaluated}",
                    f"\t$(RECAST) evaluate --run {run} --checkpoints all --sampler sde --out $@ --quiet",
                    "",
                    f"{final}: {run}/.done {evaluated}",
                    f"\t$(RECAST) evaluate --run {run} --sampler ode --out $@ --quiet",
                    "",
                ]
    name = "CONTROL_" if not header else ""
    lines += [f"{name}RUNS := {' '.join(runs)}", f"{name}INPUTS := {' '.join(inputs)} {exact} {sampled}", "",
              f"{R}/report/report.md: $({name}INPUTS) $(addsuffix /.done,$({name}RUNS))",
              f"\t$(RECAST) report $({name}INPUTS) $({name}RUNS) --out {R}/report", ""]
    if header and study.control:
        control = load_setting(study.control)
        lines.append(analytic_study_makefile(control, load_study(control), Path("$(R)/control"), recast, header=False))
    return "\n".join(lines)


def analytic_gain_rules(setting: Setting, study: StudySpec, R: str) -> list[str]:
    """A flow1d study's gain tables and base evaluation: the exact gains (gmm1d's, or the setting's [world]'s),
    the sampled estimate at the base policy, the base policy evaluated under both samplers."""
    S = shlex.quote(str(setting.file))
    exact_policy = "gmm1d" if setting.policy.world is None else S  # a [world] of its own: the setting's exact curves
    rewards, p_flag = ",".join(study.rewards), f" --p {study.p}" if study.p else ""
    return [
        f"{R}/gains/exact.parquet: {stamp_files(R, 'world', 'exact')}",
        f"\t$(RECAST) estimate --policy {exact_policy} --rewards {rewards} --exact --steps {study.estimate_steps} "
        f"--alpha {study.alpha:g} --out $@",
        "",
        f"{R}/gains.parquet: {stamp_files(R, *POLICY_PARTS)} {stamp_files(R, 'estimate')}",
        f"\t$(RECAST) estimate --policy {S} --rewards {rewards} --sampling {study.sampling} "
        f"--steps {study.estimate_steps} --n {study.n} --k {study.k}{p_flag} --alpha {study.alpha:g} --out $@",
        "",
        f"{R}/evals/base.parquet: {stamp_files(R, *POLICY_PARTS, 'evaluate')}",
        f"\t$(RECAST) evaluate --setting {S} --sampler sde,ode --out $@ --quiet",
        "",
    ]
