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

import re
import shlex
from pathlib import Path

from recast_cli.errors import BadInput
from recast_cli.setting.load import Setting, digest, load_setting, policy_content, world_of
from recast_cli.study.spec import ESTIMATE_KEYS, EXACT_KEYS, StudySpec, load_study, table_content
from recast_cli.train.config import config_from_setting, skip_clean_of


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
