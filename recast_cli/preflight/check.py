"""``recast check-setting``: a setting and every path it names, checked without loading a weight.

Each table is read by its own parser, the one its stage uses, and then checked here:

* ``[policy]``  the model (``recast_cli.setting.load``);
* ``[world]``   a gmm1d or flow1d setting's analytic world: mixture and step-function rewards
  (``recast_cli.policy.world1d``, read with the setting); its rewards are the training rewards' scorers;
* ``[train]``   the trainer's defaults (``recast_cli.train.config``);
* ``[rewards.NAME]`` the constructor options of scorer NAME (model paths, device, server url;
  ``recast_cli.rewards.options``);
* ``[positives]`` ``prompts`` (the estimation prompts) and ``rewards`` (for ``--source self``);
* ``[study]``   budgets, seeds, modes, warmup and the estimate's budget (``recast_cli.study``);
* ``[evaluate]`` held-out prompts, sampling and judges (``recast_cli.evaluate.config``).

Paths are relative to the setting file. docs/settings.md lists every key.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recast_cli.errors import BadInput, shown
from recast_cli.hub import hub_id_of
from recast_cli.policy.families import FAMILIES, policy_class
from recast_cli.evaluate.config import config_from_setting as evaluate_config
from recast_cli.positives.config import config_from_setting as positives_config
from recast_cli.setting.environment import API_KEYS, environment_problems
from recast_cli.setting.prompts import load_prompts
from recast_cli.rewards.options import (
    CONFIG_OR_NAME_OPTIONS,
    EXTRA_PATH_OPTIONS,
    resolve_reward_options,
    weight_specs,
)
from recast_cli.rewards.weights import resolve
from recast_cli.setting.load import ANALYTIC_KINDS, KNOWN_TABLES, Setting, analytic_world, check_prompts, load_setting
from recast_cli.study.spec import StudySpec, load_study
from recast_cli.train.config import check_config, config_from_setting as train_config

#: What a folder-valued weight must hold to be a transformers model (or processor) folder.
#: (transformers 5 writes processor_config.json where older releases wrote preprocessor_config.json)
FOLDER_MARKERS = {("pick", "processor"): ("preprocessor_config.json", "processor_config.json")}


# --------------------------------------------------------------------------- scorer options


def check_scorer(name: str, options: dict[str, Any], needed: bool) -> str:
    """Options and weight paths of scorer ``name`` (resolved options); returns what was found.

    ``needed``: the setting uses this scorer, so weights it leaves to the environment or the
    HF cache must be found there too. Nothing is loaded.
    """
    from recast_cli.rewards.registry import scorer_class  # the registry imports torch

    cls = scorer_class(name)
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            raise BadInput(f"unknown option {', '.join(unknown)}; {name} takes {', '.join(params) or 'none'}")
    if "@" in name:
        return f"remote scorer at {name.split('@', 1)[1]}"
    found = []
    for option in CONFIG_OR_NAME_OPTIONS.get(name, ()):
        value = options.get(option)
        if isinstance(value, str) and value.endswith(".json"):
            if not Path(value).is_file():
                raise BadInput(f"{option}: config file {value} does not exist")
            found.append(f"{option} {value}")
    for spec in weight_specs(name):
        given = options.get(spec.option)
        if given is None and not needed:
            continue
        try:
            path = resolve(spec, given)
        except BadInput as exc:
            if given is not None and hub_id_of(given) is not None:
                raise BadInput(f"{spec.option}: {exc}") from None  # names the repo and `recast fetch`
            if given is not None:
                raise BadInput(f"{spec.option}: {spec.what} {given} does not exist") from None
            raise BadInput(f"no {spec.what}: set {spec.option} = PATH, or ${spec.env}, or put "
                           f"{spec.cache_name()} in the local Hugging Face cache") from None
        _check_weight_shape(name, spec, path)
        found.append(f"{spec.option}={path}")
    for option in EXTRA_PATH_OPTIONS.get(name, ()):
        if options.get(option) is not None and not Path(options[option]).is_file():
            raise BadInput(f"{option}: file {options[option]} does not exist")
    if name == "geneval" and options.get("metadata") is not None:
        from recast_cli.rewards.geneval import read_metadata

        found.append(f"metadata={options['metadata']} ({len(read_metadata(Path(options['metadata'])))} prompts)")
    own_check = getattr(cls, "check_options", None)
    if callable(own_check):
        own_check(**options)
    if not found and isinstance(options.get("url"), str):
        found.append(f"server {options['url']}")
    return "; ".join(found) or "no weights"


def _check_weight_shape(name: str, spec, path: Path) -> None:
    if spec.hf_file is None:
        markers = FOLDER_MARKERS.get((name, spec.option), ("config.json",))
        if not path.is_dir():
            raise BadInput(f"{spec.option}: {spec.what} {path} is not a folder")
        if not any((path / marker).is_file() for marker in markers):
            raise BadInput(f"{spec.option}: {path} has no {' or '.join(markers)} (not a {spec.what})")
    elif not path.is_file():
        raise BadInput(f"{spec.option}: {spec.what} {path} is not a file")


def check_reward_prompts(name: str, options: dict[str, Any], prompts: list[str]) -> None:
    """The prompt checks a scorer makes before any work, done without building it.

    ``ocr``: every prompt quotes its text. ``geneval``: every prompt is GenEval metadata JSON or
    has an entry in the ``metadata`` file (the trainer and the evaluator pass prompt texts only).
    """
    base = name.split("@", 1)[0]
    if base == "ocr":
        from recast_cli.rewards.ocr import quoted_target

        for prompt in prompts:
            quoted_target(prompt)
    elif base == "geneval":
        from recast_cli.rewards.geneval import read_metadata

        known = read_metadata(Path(options["metadata"])) if options.get("metadata") else {}
        for prompt in prompts:
            if prompt in known or prompt.lstrip().startswith("{"):
                continue
            raise BadInput(f"geneval has no metadata for prompt {prompt[:60]!r} (set [rewards.geneval] "
                           "metadata = the .jsonl that holds it)")


# --------------------------------------------------------------------------- the check


@dataclass
class CheckReport:
    """What was checked (rows of check, subject, result) and the problems found, one line each."""

    file: Path
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: what the held-out judges still need: they are scored by ``make judges``, not by ``make all``
    judges: list[str] = field(default_factory=list)


class _Checker:
    def __init__(self, file: Path, stop_at_first: bool, name: str | None = None) -> None:
        self.report = CheckReport(file)
        self.stop = stop_at_first
        self.name = name or str(file)  # as the user named the setting: `recast fetch NAME` in the hints
        self.seen: set[str] = set()

    def step(self, check: str, subject: str, fn: Callable[[], Any]) -> Any:
        """Run one check; a BadInput becomes a problem line (raised at once unless collecting all)."""
        try:
            result = fn()
        except BadInput as exc:
            line = self.line(check, str(exc))
            self.report.rows.append((check, subject, "FAIL"))
            core = " ".join(str(exc).split())
            if core not in self.seen:  # a later table that parses an earlier one fails with its message again
                self.seen.add(core)
                self.report.problems.append(line)
            if self.stop:
                raise BadInput(line) from None
            return None
        detail = result[1] if isinstance(result, tuple) else (result if isinstance(result, str) else "ok")
        self.report.rows.append((check, subject, detail))
        return result[0] if isinstance(result, tuple) else result

    def judge(self, name: str, fn: Callable[[], str]) -> None:
        """A held-out judge's checks: what it lacks is listed for ``make judges``, and does not fail the setting."""
        try:
            result = fn()
        except BadInput as exc:
            self.report.rows.append((f"judge {name}", "for make judges", "MISSING"))
            message = " ".join(str(exc).split()).replace("`recast fetch SETTING`", f"`recast fetch {self.name}`")
            self.report.judges.append(f"judge {name}: {message}")
            return
        self.report.rows.append((f"judge {name}", "for make judges", result))

    def line(self, check: str, message: str) -> str:
        """One line: the setting's file name, the check, the message (without repeating either)."""
        file = self.report.file
        message = " ".join(message.split()).replace("`recast fetch SETTING`", f"`recast fetch {self.name}`")
        for prefix in (str(file), file.name):
            if message.startswith(prefix) and message[len(prefix):len(prefix) + 1] in (":", " "):
                message = message[len(prefix):].lstrip(": ")
                break
        if message.startswith(check.split()[0]):
            return f"{file.name}: {message}"
        return f"{file.name}: {check}: {message}"


def check_setting(name_or_path: str, stop_at_first: bool = True) -> CheckReport:
    """Check a setting and every path it names; BadInput on the first problem unless collecting all."""
    setting = load_setting(name_or_path)
    c = _Checker(setting.file, stop_at_first, name_or_path)
    base = setting.file.parent
    c.step("tables", ", ".join(setting.raw), lambda: _check_tables(setting))
    if c.report.problems:  # an unknown table or scorer: every later table would fail with it
        return c.report
    c.step("[policy]", setting.policy.kind, lambda: _check_policy(setting))
    analytic = setting.policy.kind in ANALYTIC_KINDS
    if analytic:
        c.step("[world]", "mixture, rewards", lambda: _describe_world(setting))
    cfg = c.step("[train]", "config", lambda: _train_config(setting))
    options = {}
    rewards_table = setting.raw.get("rewards", {})
    if isinstance(rewards_table, dict):
        options = {n: resolve_reward_options(n, o, base) for n, o in rewards_table.items()
                   if isinstance(o, dict) and _registered(n)}
    evaluate = c.step("[evaluate]", "table", lambda: _optional(setting, "evaluate", lambda s: evaluate_config(s)[0]))
    study = c.step("[study]", "table", lambda: _optional(setting, "study", _study))
    used = list(cfg.rewards) if cfg is not None else []
    used += [j for j in (evaluate.judges if evaluate else ()) if j not in used]
    judges = [j for j in (evaluate.judges if evaluate else ()) if cfg is None or j not in cfg.rewards]
    for name in dict.fromkeys(used + list(options)):
        if analytic and name in used:  # the samples x_0 are scored by the world's own rewards
            c.step(f"reward {name}", "of the analytic world", lambda n=name: _world_reward(setting, n))
            continue
        if name in judges:
            if _given_url(name, options.get(name, {})) is not None:  # a typo in the setting fails it, judge or not
                c.step(f"judge {name} url", "well formed", lambda n=name: _check_url(n, options.get(n, {})))
            c.judge(name, lambda n=name: _ready(n, options.get(n, {}), True, judge=True))
            continue
        c.step(f"scorer {name}", "options, weights", lambda n=name: _ready(n, options.get(n, {}), n in used))
    if cfg is not None:
        c.step("[train] prompts", cfg.prompts, lambda: _check_prompt_file(setting, cfg.prompts, cfg.rewards, options))
    c.step("[positives]", "table", lambda: _check_positives(setting, cfg.rewards if cfg else (), options))
    if study is not None:
        c.step("[study] positives", study.positives or "none", lambda: _check_study_sources(setting, study))
    if evaluate is not None:
        train_rewards = cfg.rewards if cfg is not None else ()
        c.step("[evaluate] prompts", evaluate.prompts,
               lambda: _check_prompt_file(setting, evaluate.prompts, train_rewards, options))
    return c.report


def _given_url(name: str, options: dict[str, Any]) -> Any:
    """The server url the setting gives a scorer (``NAME@URL``, or its ``url`` option), or None."""
    return name.split("@", 1)[1] if "@" in name else options.get("url")


def _check_url(name: str, options: dict[str, Any]) -> str:
    """BadInput when the url the setting gives ``name`` is malformed (a bad port, an unclosed ``[``): a typo
    in the setting, not something ``make judges`` provides later."""
    from recast_cli.rewards.exchange import url_problem

    url = _given_url(name, options)
    why = url_problem(url)
    if why is not None:
        where = f"judge {shown(name)}" if "@" in name else f"[rewards.{name}] url {shown(url)}"
        raise BadInput(f"{where} {why}")
    return "well formed"


def _ready(name: str, options: dict[str, Any], needed: bool, judge: bool = False) -> str:
    """A scorer's options and weights (:func:`check_scorer`), then, for one the setting uses, its packages and
    server (:func:`environment_problems`): every problem in one line."""
    problems = []
    try:
        found = check_scorer(name, options, needed)
    except BadInput as exc:
        if not judge:
            raise
        found, problems = "", [str(exc)]
    if needed:
        problems += environment_problems(name, options)
    if problems:
        raise BadInput("; and ".join(problems))
    return found


def _registered(name: str) -> bool:
    from recast_cli.rewards.registry import is_known

    return is_known(name)


def _check_tables(setting: Setting) -> str:
    unknown = [t for t in setting.raw if t not in KNOWN_TABLES]
    if unknown:
        raise BadInput(f"unknown table [{unknown[0]}]; known: {', '.join(KNOWN_TABLES)}")
    rewards = setting.raw.get("rewards", {})
    if not isinstance(rewards, dict) or not all(isinstance(v, dict) for v in rewards.values()):
        raise BadInput("[rewards.NAME] tables must hold the options of scorer NAME")
    for name in rewards:
        if not _registered(name):
            from recast_cli.rewards.registry import scorer_names

            raise BadInput(f"[rewards.{name}]: no scorer {name!r}; known: {', '.join(scorer_names())}")
    return "ok"


def _check_policy(setting: Setting) -> str:
    spec = setting.policy
    if spec.guidance_scale < 0 or spec.noise_level <= 0:  # the counts are bounded as the table is read
        raise BadInput("guidance_scale must be >= 0 and noise_level > 0")
    if spec.kind not in FAMILIES:
        return f"{spec.kind}, {spec.steps} steps"
    from recast_cli.policy.pipeline import PRECISIONS

    if spec.precision not in ("auto", *PRECISIONS):
        raise BadInput(f"precision must be one of auto, {', '.join(PRECISIONS)}; got {spec.precision!r}")
    folder = spec.folder()
    if folder is None:
        raise BadInput(f"an {spec.kind} policy needs path = the model folder or a Hub repo id")
    # the folder, its family and the resolution against its VAE and patch size, then the grid
    _, grid = policy_class(spec.kind).folder_grid(folder, spec.steps, spec.resolution)
    named = f" ({spec.hub})" if spec.hub is not None else ""
    return f"{spec.kind} model folder {folder}{named}; grid {grid.describe()}"


def _describe_world(setting: Setting) -> str:
    """The world's size and the exact estimate's heaviest noise level (its limits are checked as the
    world is read: docs/settings.md "Work limits")."""
    from recast_cli.policy.world_limits import MAX_LEVEL_WORK, WORK_SIGMAS

    world = analytic_world(setting.policy)
    lo, hi = world.support()
    which = "the default world (docs/method.md §4)" if setting.policy.world is None else "[world]"
    cells = ", ".join(f"{name} ({int(reward.count_cells(lo, hi))} cells)" for name, reward in world.rewards)
    work = max(float(world.exact_work(name, WORK_SIGMAS)[2].max()) for name in world.reward_names)
    return (f"{which}: {len(world.means)} components; rewards {cells}; exact estimate ≤ {work:.3g} evaluations "
            f"per noise level (limit {MAX_LEVEL_WORK:g})")


def _world_reward(setting: Setting, name: str) -> str:
    """A reward of the analytic world, and how its π⁺ is drawn: by rejection, or, where rejection would
    accept too few π^old draws (a rare cell of high value), by the tilted cells' exact inverse CDF."""
    from recast_cli.policy.world1d import MIN_ACCEPTANCE

    world = analytic_world(setting.policy)
    world.check_reward(name)
    low, high = world.reward_range(name)
    acceptance = world.positive_acceptance(name)
    method = "rejection" if acceptance >= MIN_ACCEPTANCE else "the exact inverse CDF of its tilted cells"
    return f"step function, values {low:g} to {high:g}; π⁺ by {method} (rejection accepts {acceptance:.3g})"


def _study(setting: Setting) -> StudySpec:
    """The ``[study]`` table (``load_study``), its α (a Rényi order within ``estimate.config.MAX_ALPHA``),
    on an analytic world the work of the exact gain table the study computes, and its cells (``StudySpec.cells``)."""
    from recast_cli.estimate.config import check_alphas
    from recast_cli.policy.world_limits import check_exact_work

    study = load_study(setting)
    check_alphas((study.alpha,), "[study] alpha")
    if setting.policy.kind in ANALYTIC_KINDS:
        world = analytic_world(setting.policy)
        check_exact_work(world, study.rewards, world.grid.sigmas(study.estimate_steps), 1)
    try:
        train = train_config(setting)
    except BadInput:
        return study  # [train]'s own row names its problem
    study.cells(train, setting.file.name)  # the plan: group sizes against the rollouts, learning rates against the arms
    return study


def _train_config(setting: Setting):
    cfg = train_config(setting)
    check_config(cfg)
    lam = ", ".join(f"{r}={x:g}" for r, x in zip(cfg.rewards, cfg.lam))
    return cfg, f"λ {lam}; G {cfg.group_size} x {cfg.prompts_per_step} prompts; {cfg.max_steps} steps"


def _optional(setting: Setting, name: str, loader):
    if name not in setting.raw:
        return None, "absent"
    spec = loader(setting)
    if isinstance(spec, StudySpec):
        return spec, (f"{len(spec.budgets)} budgets x {len(spec.seeds)} seeds x {', '.join(spec.modes)}; "
                      f"warmup {spec.warmup_steps}, estimate T {spec.estimate_steps}")
    steps = "policy" if spec.steps is None else spec.steps
    cfg_scale = "policy" if spec.guidance_scale is None else f"{spec.guidance_scale:g}"
    return spec, f"{spec.n} x prompts, {steps} steps, CFG {cfg_scale}, judges {', '.join(spec.judges) or 'none'}"


def _check_prompt_file(setting: Setting, source: str, rewards, options) -> str:
    if source != "toy" and not Path(source).is_file():
        raise BadInput(f"prompts file {source or '(none)'} does not exist")
    prompts, _ = load_prompts(source)
    check_prompts(setting.policy, prompts)
    for name in rewards:
        check_reward_prompts(name, options.get(name, {}), prompts)
    return f"{len(prompts)} prompts"


def _check_positives(setting: Setting, rewards, options) -> str:
    if setting.raw.get("positives") is None:
        return "absent"
    table = positives_config(setting)
    if not all(_registered(n) for n in table.rewards):
        raise BadInput(f"rewards must be a list of registered scorer names, got {list(table.rewards)!r}")
    if table.prompts is None:
        return "no prompts file"
    from recast_cli.setting.prompts import read_prompt_file

    path = table.prompts.resolve()
    if not path.is_file():
        raise BadInput(f"prompts file {path} does not exist")
    prompts = read_prompt_file(path)[0]
    check_prompts(setting.policy, prompts)
    for name in rewards:
        check_reward_prompts(name, options.get(name, {}), prompts)
    return f"{len(prompts)} prompts"


def _check_study_sources(setting: Setting, study: StudySpec) -> str:
    if setting.policy.kind == "flow1d":
        if study.positives is not None:
            raise BadInput("a flow1d study draws its own π⁺ samples (exact at the base policy); it takes no positives")
        return "exact π⁺ (the analytic world)"
    if study.positives is None:
        if study.sampling == "pplus" and setting.policy.prompt_check != "toy":
            raise BadInput("π⁺-sampling (sampling = \"pplus\") needs positives = a recast sample-positive source")
        return "none"
    if study.positives == "self":
        if not positives_config(setting).rewards:
            raise BadInput("positives = \"self\" (SIR from the policy) needs [positives] rewards = the rewards "
                           "that tilt the samples")
    if study.positives in API_KEYS:
        from recast_cli.positives.api import env_key

        try:
            env_key(*API_KEYS[study.positives])
        except BadInput as exc:
            raise BadInput(f"positives = \"{study.positives}\" calls an image API: {exc} (never written in the "
                           "setting), or use positives = \"self\" or a folder of your own") from None
    if study.positives == "renderer" and setting.policy.prompt_check != "toy":
        raise BadInput("positives = \"renderer\" draws only the toy vocabulary (policy prompt_check = \"toy\")")
    path = study.positives_path()
    if path is not None:
        if not path.is_dir():
            raise BadInput(f"positives folder {path} does not exist")
        if study.positives.startswith("diffusers:") and not (path / "model_index.json").is_file():
            raise BadInput(f"{path} is not a diffusers pipeline folder (no model_index.json)")
    return study.positives
