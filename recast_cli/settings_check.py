"""``recast check-setting``: a setting and every path it names, checked without loading a weight.

Also the parser of the ``[study]`` table (``load_study``) that the pipeline driver shares with
the check; ``[evaluate]`` is parsed by ``recast_cli.evaluate.stage.config_from_setting``. Tables
of a setting:

* ``[policy]``  the model (``recast_cli.settings``);
* ``[train]``   the trainer's defaults (``recast_cli.train.config``);
* ``[rewards.NAME]`` the constructor options of scorer NAME (model paths, device, server url);
* ``[positives]`` ``prompts`` (the estimation prompts) and ``rewards`` (for ``--source self``);
* ``[study]``   budgets, seeds, modes, warmup and the estimate's budget (``StudySpec``);
* ``[evaluate]`` held-out prompts, sampling and judges (``recast evaluate``).

Paths are relative to the setting file. docs/settings.md lists every key.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import typer

from recast_cli.errors import BadInput
from recast_cli.settings import KNOWN_TABLES, Setting, check_prompts, load_setting

POSITIVES_KEYS = ("prompts", "rewards")
MODES = ("static", "recast", "nosink", "reversed")
SAMPLINGS = ("pplus", "pold")
STUDY_GAINS = ("estimate", "exact")
PLAIN_SOURCES = ("renderer", "openai", "gemini", "self")
PATH_SOURCES = ("folder", "diffusers")
#: Scorer options that name a file but have no WeightSpec (those are found in the scorer's module).
EXTRA_PATH_OPTIONS = {"geneval": ("metadata",), "hpsv3": ("config",)}
#: Options that hold a model name or, ending in .json, a config file path.
CONFIG_OR_NAME_OPTIONS = {"hps": ("arch",)}
#: What a folder-valued weight must hold to be a transformers model (or processor) folder.
#: (transformers 5 writes processor_config.json where older releases wrote preprocessor_config.json)
FOLDER_MARKERS = {("pick", "processor"): ("preprocessor_config.json", "processor_config.json")}


# --------------------------------------------------------------------------- [study] and [evaluate]


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
    modes: tuple[str, ...] = MODES
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

    @staticmethod
    def label(budget: tuple[float, ...]) -> str:
        """A budget as a file-name part: (1, 1, 1, 2) → ``1-1-1-2``."""
        return "-".join(f"{x:g}" for x in budget)

    @staticmethod
    def lambda_arg(budget: tuple[float, ...]) -> str:
        """A budget as ``--lambda`` takes it: (1, 1, 1, 2) → ``1,1,1,2``."""
        return ",".join(f"{x:g}" for x in budget)

    def positives_path(self) -> Path | None:
        """The folder of a ``folder:DIR`` / ``diffusers:PATH`` source (already resolved), else None."""
        if self.positives and self.positives.split(":", 1)[0] in PATH_SOURCES:
            return Path(self.positives.split(":", 1)[1])
        return None


def load_study(setting: Setting) -> StudySpec:
    """The ``[study]`` table, checked (BadInput names the key); paths resolved against the setting."""
    where = f"{setting.file.name}: [study]"
    table = _table(setting, "study")
    rewards = _train_rewards(setting)
    _no_unknown(table, StudySpec, where, skip=("rewards",))
    if "budgets" not in table:
        raise BadInput(f"{where} needs budgets = [[λ per reward], ...]")
    budgets = table["budgets"]
    if not isinstance(budgets, list) or not budgets:
        raise BadInput(f"{where} budgets must be a non-empty list of λ lists")
    parsed = []
    for i, budget in enumerate(budgets):
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
    values: dict[str, Any] = {"rewards": rewards, "budgets": tuple(parsed)}
    if "seeds" in table:
        seeds = _int_list(table["seeds"], f"{where} seeds")
        if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
            raise BadInput(f"{where} seeds must be distinct integers >= 0, got {table['seeds']!r}")
        values["seeds"] = tuple(seeds)
    if "modes" in table:
        modes = table["modes"]
        if (not isinstance(modes, list) or not modes or len(set(map(str, modes))) != len(modes)
                or any(m not in MODES for m in modes)):
            raise BadInput(f"{where} modes must be distinct values of {', '.join(MODES)}, got {modes!r}")
        values["modes"] = tuple(modes)
    for key, low in (("warmup_steps", 0), ("estimate_steps", 1), ("n", 1), ("k", 1), ("p", 1)):
        if key in table:
            values[key] = _int(table[key], f"{where} {key}", low)
    for key in ("alpha", "tau"):
        if key in table:
            values[key] = _positive(table[key], f"{where} {key}")
    if "sampling" in table:
        if table["sampling"] not in SAMPLINGS:
            raise BadInput(f"{where} sampling must be one of {', '.join(SAMPLINGS)}, got {table['sampling']!r}")
        values["sampling"] = table["sampling"]
    if "positives" in table:
        values["positives"] = _positives_source(table["positives"], setting.file, where)
    if "gains" in table:
        if table["gains"] not in STUDY_GAINS:
            raise BadInput(f"{where} gains must be one of {', '.join(STUDY_GAINS)}, got {table['gains']!r}")
        if table["gains"] == "exact" and setting.policy.kind != "flow1d":
            raise BadInput(f"{where} gains = \"exact\" needs the analytic world (a flow1d policy)")
        values["gains"] = table["gains"]
    if "control" in table:
        if setting.policy.kind != "flow1d" or not isinstance(table["control"], str):
            raise BadInput(f"{where} control names another flow1d setting (a .toml path) of a flow1d study")
        control = (setting.file.parent / table["control"]).resolve()
        if not control.is_file():
            raise BadInput(f"{where} control = {table['control']!r}: no such setting ({control})")
        if control == setting.file.resolve():
            raise BadInput(f"{where} control names the setting itself")
        values["control"] = str(control)
    return StudySpec(**values)


def _table(setting: Setting, name: str) -> dict[str, Any]:
    table = setting.raw.get(name)
    if not isinstance(table, dict):
        raise BadInput(f"{setting.file}: no [{name}] table")
    return table


def _train_rewards(setting: Setting) -> tuple[str, ...]:
    rewards = setting.raw.get("train", {}).get("rewards") if isinstance(setting.raw.get("train"), dict) else None
    if not isinstance(rewards, list) or not rewards or not all(isinstance(r, str) for r in rewards):
        raise BadInput(f"{setting.file.name}: [study] budgets need [train] rewards = [\"name\", ...]")
    return tuple(rewards)


def _no_unknown(table: dict[str, Any], cls: type, where: str, skip: tuple[str, ...] = ()) -> None:
    allowed = sorted(f.name for f in fields(cls) if f.name not in skip)
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise BadInput(f"{where}: unknown key {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value: Any, where: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise BadInput(f"{where} must be an integer >= {low}, got {value!r}")
    return value


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise BadInput(f"{where} must be a list of integers, got {value!r}")
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


# --------------------------------------------------------------------------- scorer options


def weight_specs(name: str) -> list:
    """The ``WeightSpec``s of scorer ``name``: the weights it resolves (found in its module)."""
    from recast_cli.rewards.registry import scorer_class
    from recast_cli.rewards.weights import WeightSpec

    module = importlib.import_module(scorer_class(name).__module__)
    return [v for v in vars(module).values() if isinstance(v, WeightSpec) and v.scorer == name]


def reward_path_options(name: str) -> frozenset[str]:
    """Options of scorer ``name`` that hold paths (resolved relative to the setting file)."""
    return frozenset({s.option for s in weight_specs(name)} | set(EXTRA_PATH_OPTIONS.get(name, ())))


def resolve_reward_options(name: str, options: dict[str, Any], base: Path) -> dict[str, Any]:
    """``options`` with every relative path option made absolute against ``base`` (the setting's folder)."""
    paths = reward_path_options(name) if "@" not in name else frozenset()
    # options that name a model or a JSON config file (hps `arch`): a path when it ends in .json
    paths |= {k for k, v in options.items() if k in CONFIG_OR_NAME_OPTIONS.get(name.split("@")[0], ())
              and isinstance(v, str) and v.endswith(".json")}
    return {k: (str((base / Path(v).expanduser()).resolve()) if (k in paths or k.endswith("path")) and isinstance(v, str)
                else v) for k, v in options.items()}


def check_scorer(name: str, options: dict[str, Any], needed: bool) -> str:
    """Options and weight paths of scorer ``name`` (resolved options); returns what was found.

    ``needed``: the setting uses this scorer, so weights it leaves to the environment or the
    HF cache must be found there too. Nothing is loaded.
    """
    from recast_cli.rewards.registry import scorer_class
    from recast_cli.rewards.weights import resolve

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
        except BadInput:
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
        from recast_cli.rewards.geneval import _read_metadata

        found.append(f"metadata={options['metadata']} ({len(_read_metadata(Path(options['metadata'])))} prompts)")
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
        from recast_cli.rewards.geneval import _read_metadata

        known = _read_metadata(Path(options["metadata"])) if options.get("metadata") else {}
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


class _Checker:
    def __init__(self, file: Path, stop_at_first: bool) -> None:
        self.report = CheckReport(file)
        self.stop = stop_at_first

    def step(self, check: str, subject: str, fn: Callable[[], Any]) -> Any:
        """Run one check; a BadInput becomes a problem line (raised at once unless collecting all)."""
        try:
            result = fn()
        except BadInput as exc:
            line = self.line(check, str(exc))
            self.report.rows.append((check, subject, "FAIL"))
            self.report.problems.append(line)
            if self.stop:
                raise BadInput(line) from None
            return None
        detail = result[1] if isinstance(result, tuple) else (result if isinstance(result, str) else "ok")
        self.report.rows.append((check, subject, detail))
        return result[0] if isinstance(result, tuple) else result

    def line(self, check: str, message: str) -> str:
        """One line: the setting's file name, the check, the message (without repeating either)."""
        file = self.report.file
        message = " ".join(message.split())
        for prefix in (str(file), file.name):
            if message.startswith(prefix) and message[len(prefix):len(prefix) + 1] in (":", " "):
                message = message[len(prefix):].lstrip(": ")
                break
        if message.startswith(check.split()[0]):
            return f"{file.name}: {message}"
        return f"{file.name}: {check}: {message}"


def check_setting(name_or_path: str, stop_at_first: bool = True) -> CheckReport:
    """Check a setting and every path it names; BadInput on the first problem unless collecting all."""
    from recast_cli.prompts import load_prompts
    from recast_cli.train.config import check_config, config_from_setting

    setting = load_setting(name_or_path)
    c = _Checker(setting.file, stop_at_first)
    base = setting.file.parent
    c.step("tables", ", ".join(setting.raw), lambda: _check_tables(setting))
    c.step("[policy]", setting.policy.kind, lambda: _check_policy(setting))
    cfg = c.step("[train]", "config", lambda: _train_config(setting, config_from_setting, check_config))
    options = {}
    rewards_table = setting.raw.get("rewards", {})
    if isinstance(rewards_table, dict):
        options = {n: resolve_reward_options(n, o, base) for n, o in rewards_table.items()
                   if isinstance(o, dict) and _registered(n)}
    evaluate = c.step("[evaluate]", "table", lambda: _optional(setting, "evaluate", _evaluate_config))
    study = c.step("[study]", "table", lambda: _optional(setting, "study", load_study))
    used = list(cfg.rewards) if cfg is not None else []
    used += [j for j in (evaluate.judges if evaluate else ()) if j not in used]
    for name in dict.fromkeys(used + list(options)):
        c.step(f"scorer {name}", "options, weights", lambda n=name: check_scorer(n, options.get(n, {}), n in used))
    if cfg is not None:
        c.step("[train] prompts", cfg.prompts, lambda: _check_prompt_file(
            setting, cfg.prompts, cfg.rewards, options, load_prompts))
    c.step("[positives]", "table", lambda: _check_positives(setting, cfg.rewards if cfg else (), options))
    if study is not None:
        c.step("[study] positives", study.positives or "none", lambda: _check_study_sources(setting, study))
    if evaluate is not None:
        train_rewards = cfg.rewards if cfg is not None else ()
        c.step("[evaluate] prompts", evaluate.prompts, lambda: _check_prompt_file(
            setting, evaluate.prompts, train_rewards, options, load_prompts))
    return c.report


def _registered(name: str) -> bool:
    from recast_cli.rewards.registry import SCORERS

    return name.split("@", 1)[0] in SCORERS


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
    if spec.steps < 1 or spec.guidance_scale < 0 or spec.noise_level <= 0 or spec.max_sequence_length < 1:
        raise BadInput("steps and max_sequence_length must be >= 1, guidance_scale >= 0, noise_level > 0")
    if spec.kind != "sd3":
        return f"{spec.kind}, {spec.steps} steps"
    from recast_cli.policy.sd3 import PRECISIONS, check_model_folder

    if spec.precision not in ("auto", *PRECISIONS):
        raise BadInput(f"precision must be one of auto, {', '.join(PRECISIONS)}; got {spec.precision!r}")
    if spec.path is None:
        raise BadInput("an sd3 policy needs path = the model folder")
    folder = check_model_folder(spec.path)
    step = _pixel_step(folder)
    if spec.resolution is not None and (spec.resolution < step or spec.resolution % step):
        raise BadInput(f"resolution {spec.resolution} is not a positive multiple of {step} (VAE scale x patch size)")
    return f"model folder {folder}"


def _pixel_step(folder: Path) -> int:
    """VAE downscale × transformer patch size of a diffusers SD3 folder (1 where a config says nothing)."""
    def config(part: str) -> dict[str, Any]:
        try:
            return json.loads((folder / part / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            raise BadInput(f"{folder}/{part}/config.json is missing or not JSON") from None

    blocks = config("vae").get("block_out_channels") or [0]
    return 2 ** (len(blocks) - 1) * int(config("transformer").get("patch_size") or 1)


def _train_config(setting: Setting, config_from_setting, check_config):
    cfg = config_from_setting(setting.raw, setting.file)
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


def _evaluate_config(setting: Setting):
    from recast_cli.evaluate.stage import config_from_setting

    return config_from_setting(setting)[0]


def _check_prompt_file(setting: Setting, source: str, rewards, options, load_prompts) -> str:
    if source != "toy" and not Path(source).is_file():
        raise BadInput(f"prompts file {source or '(none)'} does not exist")
    prompts, _ = load_prompts(source)
    check_prompts(setting.policy, prompts)
    for name in rewards:
        check_reward_prompts(name, options.get(name, {}), prompts)
    return f"{len(prompts)} prompts"


def _check_positives(setting: Setting, rewards, options) -> str:
    table = setting.raw.get("positives")
    if table is None:
        return "absent"
    if not isinstance(table, dict):
        raise BadInput("[positives] must be a table")
    unknown = sorted(set(table) - set(POSITIVES_KEYS))
    if unknown:
        raise BadInput(f"unknown key {', '.join(unknown)}; allowed: {', '.join(POSITIVES_KEYS)}")
    names = table.get("rewards", [])
    if not isinstance(names, list) or not all(isinstance(n, str) and _registered(n) for n in names):
        raise BadInput(f"rewards must be a list of registered scorer names, got {names!r}")
    if "prompts" not in table:
        return "no prompts file"
    if not isinstance(table["prompts"], str):
        raise BadInput(f"prompts must be a file name, got {table['prompts']!r}")
    from recast_cli.positives.collect import read_prompts_file

    path = (setting.file.parent / table["prompts"]).resolve()
    if not path.is_file():
        raise BadInput(f"prompts file {path} does not exist")
    prompts = read_prompts_file(path)
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
        table = setting.raw.get("positives")
        if not (isinstance(table, dict) and table.get("rewards")):
            raise BadInput("positives = \"self\" (SIR from the policy) needs [positives] rewards = the rewards "
                           "that tilt the samples")
    if study.positives == "renderer" and setting.policy.prompt_check != "toy":
        raise BadInput("positives = \"renderer\" draws only the toy vocabulary (policy prompt_check = \"toy\")")
    path = study.positives_path()
    if path is not None:
        if not path.is_dir():
            raise BadInput(f"positives folder {path} does not exist")
        if study.positives.startswith("diffusers:") and not (path / "model_index.json").is_file():
            raise BadInput(f"{path} is not a diffusers pipeline folder (no model_index.json)")
    return study.positives


# --------------------------------------------------------------------------- the command


def check_setting_command(
    setting: str = typer.Argument(..., help="Setting name (pipelines/NAME.toml) or a .toml path."),
    all_problems: bool = typer.Option(False, "--all", help="List every problem (one line each), not just the first."),
) -> None:
    """Check a setting and every model, prompt and data path it names (no weights are loaded)."""
    import sys

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    report = check_setting(setting, stop_at_first=not all_problems)
    table = Table(title=f"check-setting {report.file}", title_justify="left")
    for column in ("check", "subject", "result"):
        table.add_column(column, overflow="fold")
    for row in report.rows:
        table.add_row(*(Text(cell) for cell in row), style="red" if row[2] == "FAIL" else None)
    Console().print(table)
    if report.problems:
        for line in report.problems:
            sys.stderr.write(f"recast: error: {line}\n")
        raise typer.Exit(2)
    Console().print(f"{report.file.name}: all {len(report.rows)} checks passed")


def register(app: typer.Typer) -> None:
    app.command("check-setting")(check_setting_command)
