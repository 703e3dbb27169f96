"""Settings: one TOML file per setting in ``pipelines/`` (toy.toml, ocr.toml, geneval.toml).

A setting names its policy and the defaults of every stage. ``--setting NAME`` reads
``pipelines/NAME.toml`` of this checkout; ``--setting PATH.toml`` reads any file. Paths inside
a setting are relative to the file, so a setting folder can be moved as a whole.

This module reads the ``[policy]`` table and hands ``[world]`` (an analytic world's mixture and
rewards) to its parser in ``policy/world_table.py``; every other table has its parser beside the code that
uses it (``[train]`` in ``train/config.py``, ``[evaluate]`` in ``evaluate/config.py``, ``[study]`` in
``study/spec.py``, ``[rewards.NAME]`` in ``rewards/options.py``), each built with ``parse_table``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from recast_cli import bounds
from recast_cli.errors import BadInput, cut
from recast_cli.hub import HubRef, cached, hub_id_of, name_setting, resolve_hub
from recast_cli.policy.families import FAMILIES, policy_class
from recast_cli.policy.world1d import DEFAULT_WORLD, World1D
from recast_cli.policy.world_table import world_from_table
from recast_cli.rewards.options import reward_options as reward_tables

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"
ANALYTIC_KINDS = ("gmm1d", "flow1d")
PROMPT_CHECKS = ("none", "toy")
#: The tables a setting may hold; any other (a typo such as [trian]) is refused by name.
KNOWN_TABLES = ("policy", "train", "rewards", "positives", "study", "evaluate", "world")
#: Names no reward of a [world] may take: every column label of a curve table is a scorer or this.
RESERVED_REWARDS = ("aggregate",)
#: The type of each [policy] key (int keys refuse booleans and floats, number keys take ints too).
POLICY_TYPES = {"kind": str, "path": str, "steps": int, "guidance_scale": float, "resolution": int,
                "max_sequence_length": int, "precision": str, "noise_level": float, "prompt_check": str,
                "features": int, "hidden": int, "offload_text_encoders": bool}


#: A [world] reward's name: it goes into --rewards lists, tables and file names.
WORLD_REWARD_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

T = TypeVar("T")


def parse_table(cls: type[T], table: dict[str, Any], unknown: Callable[[list[str], list[str]], str],
                parse: Mapping[str, Callable[[Any], Any]], absent: Mapping[str, Callable[[], Any]] | None = None,
                names: Mapping[str, str] | None = None, **given: Any) -> T:
    """A TOML ``table`` as the frozen dataclass ``cls``, checked once, in this order:

    1. keys that name no field of ``cls`` (``names`` maps a key to its field, ``lambda`` → ``lam``,
       whose own name reads too; the fields ``given`` are no keys):
       BadInput(``unknown(keys in table order, allowed keys)``);
    2. for every key of ``parse``, in its order: ``parse[key](value)``, or for a key the table
       leaves out ``absent[key]()`` where given (each raises BadInput with the table's message);
       any other field keeps its default;
    3. ``cls(**given, **values)``.
    """
    names = names or {}
    key_of = {name: key for key, name in names.items()}
    allowed = [key_of.get(f.name, f.name) for f in fields(cls) if f.name not in given]
    bad = [key for key in table if key not in allowed and key not in names.values()]
    if bad:
        raise BadInput(unknown(bad, allowed))
    values = {}
    for key, check in parse.items():
        if key in table:
            values[names.get(key, key)] = check(table[key])
        elif absent and key in absent:
            values[names.get(key, key)] = absent[key]()
    return cls(**given, **values)


def check_finite_numbers(raw: dict[str, Any], path: Path) -> None:
    """BadInput naming the first value of the setting, in any table or list, that is ``inf`` or ``nan``.

    TOML spells both (``learning_rate = inf``); no option of recast means anything there, and a
    run would go on silently (a non-finite adapter). Walked with a stack, not recursion, so a deeply
    nested array cannot exhaust Python's stack here.
    """
    stack: list[tuple[str, Any]] = [(key, value) for key, value in reversed(raw.items())]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise BadInput(f"{path}: {where} = {value} is not a finite number")
        if isinstance(value, dict):
            stack.extend((f"{where}.{key}", item) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(value))))


@dataclass(frozen=True)
class PolicySpec:
    """How to build the setting's policy (see ``build_policy``)."""

    kind: str
    path: Path | None = None
    steps: int = 10
    guidance_scale: float = 4.5
    resolution: int | None = None
    max_sequence_length: int = 256
    precision: str = "auto"
    noise_level: float = 0.7
    prompt_check: str = "none"
    features: int = 6  # flow1d: geometric Fourier frequencies of x and σ in the residual MLP
    hidden: int = 32  # flow1d: its hidden width
    world: World1D | None = None  # gmm1d, flow1d: the setting's [world]; None: the default world (docs/method.md §4)
    #: image policies: the text encoders on the host between encodes; None: ``offload_by_default``
    offload_text_encoders: bool | None = None
    hub: HubRef | None = None  # ``path`` named a Hub repo id (and no local folder of that name exists)

    def folder(self, required: bool = True) -> Path | None:
        """The model folder: the local ``path``, or the cached snapshot of ``hub`` (recast_cli/hub.py).
        A repo missing from the cache is BadInput naming it, or None when not ``required``."""
        if self.hub is None:
            return self.path
        if not required:
            return cached(self.hub, "diffusers")
        return resolve_hub(self.hub, "diffusers", "[policy] path")

    def model_name(self) -> str | None:
        """How the setting names the model: the repo id (with its revision) or the local folder."""
        return str(self.hub) if self.hub is not None else (str(self.path) if self.path is not None else None)


@dataclass(frozen=True)
class Setting:
    name: str
    file: Path
    policy: PolicySpec
    raw: dict[str, Any] = field(default_factory=dict)


def setting_path(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml":
        return candidate.resolve()
    return PIPELINES / f"{name_or_path}.toml"


def load_setting(name_or_path: str) -> Setting:
    """Read and check a setting; BadInput names the file and the problem."""
    path = setting_path(name_or_path)
    if not path.is_file():
        known = sorted(p.stem for p in PIPELINES.glob("*.toml"))
        raise BadInput(f"no setting {name_or_path!r} (looked for {path}); known: {', '.join(known) or 'none'}")
    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8-sig"))  # a byte-order mark is no content
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text (byte {exc.start}); a setting is a UTF-8 TOML file") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot be read ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: an integer of more than 4300 digits
        raise BadInput(f"{path}: not valid TOML ({cut(str(exc))})") from None
    except RecursionError:
        raise BadInput(f"{path}: not valid TOML (arrays or tables nested too deeply)") from None
    check_finite_numbers(raw, path)
    unknown_tables = [t for t in raw if t not in KNOWN_TABLES]
    if unknown_tables:
        raise BadInput(f"{path}: unknown table [{unknown_tables[0]}]; known: {', '.join(KNOWN_TABLES)}")
    table = raw.get("policy")
    if not isinstance(table, dict):
        raise BadInput(f"{path}: no [policy] table")
    spec = policy_spec(table, path)
    if "world" in raw:
        spec = replace(spec, world=world_spec(raw["world"], spec.kind, path))
    name_setting(name_or_path)
    return Setting(name=path.stem, file=path, policy=spec, raw=raw)


def world_spec(table: Any, kind: str, path: Path) -> World1D:
    """The ``[world]`` table of an analytic setting (docs/settings.md "[world]"): the parser of
    ``policy/world_table.py``, then the reward names against the scorer registry (a world's reward
    may reuse only the analytic world's own names: coarse, mid, fine, fine_wide)."""
    if kind not in ANALYTIC_KINDS:
        raise BadInput(f"{path}: [world] defines an analytic world; a {kind} policy has none "
                       f"(only {' and '.join(ANALYTIC_KINDS)} take it)")
    try:
        world = world_from_table(table, label=f"the [world] of {path.name}")
    except BadInput as exc:
        raise BadInput(f"{path}: {exc}") from None
    from recast_cli.rewards.registry import scorer_names

    taken = [n for n in scorer_names() if n not in DEFAULT_WORLD.reward_names] + list(RESERVED_REWARDS)
    for name in world.reward_names:
        if not WORLD_REWARD_NAME.fullmatch(name):
            raise BadInput(f"{path}: [world.rewards.{name}]: a reward name is lower-case letters, digits and _, "
                           "starting with a letter")
        if name in taken:
            raise BadInput(f"{path}: [world.rewards.{name}]: {name!r} is the name of another scorer; name the "
                           "world's reward otherwise")
    return world


def analytic_world(spec: PolicySpec) -> World1D:
    """The world of a gmm1d or flow1d setting: its ``[world]``, else the default (docs/method.md §4)."""
    if spec.kind not in ANALYTIC_KINDS:
        raise BadInput(f"a {spec.kind} policy has no analytic world (only {' and '.join(ANALYTIC_KINDS)})")
    return spec.world if spec.world is not None else DEFAULT_WORLD


def build_reward(spec: PolicySpec, name: str, **options: Any):
    """The scorer ``name`` of a setting: for a gmm1d or flow1d policy a reward of its world (BadInput
    if the world has none of that name), else the scorer registry's (``rewards.build_scorer``)."""
    if spec.kind in ANALYTIC_KINDS:
        from recast_cli.policy.gmm1d import GMM1DReward

        if options:
            raise BadInput(f"reward {name!r} of the analytic world takes no options, got {', '.join(options)}")
        return GMM1DReward(name, analytic_world(spec))
    from recast_cli.rewards import build_scorer

    return build_scorer(name, **options)


def policy_spec(table: dict[str, Any], path: Path) -> PolicySpec:
    """The ``[policy]`` table as a :class:`PolicySpec` (through :func:`parse_table`, like every table):
    unknown keys, then each key's type, then ``kind`` and ``prompt_check`` against their choices;
    ``path`` is resolved against the setting file's folder; one that exists nowhere there but reads as
    a Hub repo id (``owner/name[@revision]``) becomes ``hub``, resolved from the cache when used.
    ``world`` is no key (``[world]`` is a table)."""

    def typed(key: str) -> Callable[[Any], Any]:
        kind = POLICY_TYPES[key]

        def check(value: Any) -> Any:
            ok = (isinstance(value, str) if kind is str else isinstance(value, bool) if kind is bool else
                  isinstance(value, int) and not isinstance(value, bool) if kind is int else
                  isinstance(value, (int, float)) and not isinstance(value, bool))
            if not ok:
                expected = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}[kind]
                raise BadInput(f"{path}: [policy] {key} = {cut(json.dumps(value, default=str))} is not {expected}")
            if kind is int:
                bounds.check(key, value, f"{path}: [policy] {key}")
            return value
        return check

    def unknown(keys: list[str], allowed: list[str]) -> str:
        return f"{path}: unknown [policy] keys {', '.join(sorted(keys))}; allowed: {', '.join(sorted(allowed))}"

    parse = {key: typed(key) for key in POLICY_TYPES}
    parse["path"] = lambda value: (path.parent / typed("path")(value)).resolve()
    spec = parse_table(PolicySpec, table, unknown, parse, absent={"kind": lambda: None}, hub=None, world=None)
    try:
        ref = hub_id_of(table["path"], path.parent) if "path" in table else None
    except BadInput as exc:  # shaped like a repo id, but not one the Hub allows
        raise BadInput(f"{path}: [policy] path: {exc}") from None
    if ref is not None:  # a repo id, no local folder of that name: the cache resolves it when it is used
        spec = replace(spec, path=None, hub=ref)
    if spec.kind not in FAMILIES and spec.kind not in ANALYTIC_KINDS:  # the choices after every type check
        raise BadInput(f"{path}: [policy] kind must be one of {', '.join((*FAMILIES, *ANALYTIC_KINDS))}")
    if spec.prompt_check not in PROMPT_CHECKS:
        raise BadInput(f"{path}: [policy] prompt_check must be one of {', '.join(PROMPT_CHECKS)}")
    if "guidance_scale" not in table and spec.kind in FAMILIES:  # each family's own default
        spec = replace(spec, guidance_scale=FAMILIES[spec.kind].guidance)
    return spec


def reward_options(setting: Setting) -> dict[str, dict[str, Any]]:
    """The ``[rewards.NAME]`` option tables of a setting, weight paths made absolute against its folder."""
    return reward_tables(setting.raw, setting.file)


def check_prompts(spec: PolicySpec, prompts: list[str]) -> None:
    """The setting's prompt check (the toy world accepts only its vocabulary)."""
    if spec.prompt_check == "toy":
        from recast_cli.toy.renderer import parse_prompt

        for prompt in prompts:
            parse_prompt(prompt)


def build_policy(spec: PolicySpec, device: str | None = None, steps: int | None = None,
                 guidance_scale: float | None = None, trainable: Callable[[Any], int] | None = None):
    """The setting's policy, with optional overrides of its sampling steps and CFG scale.

    ``trainable(transformer)``: the parameters the caller will train (the trainer's LoRA), which
    ``[policy] offload_text_encoders`` left unset weighs against the text encoders.
    """
    steps = spec.steps if steps is None else steps
    if spec.kind == "gmm1d":
        from recast_cli.policy.gmm1d import GMM1DPolicy

        return GMM1DPolicy(steps=steps, world=analytic_world(spec))
    if spec.kind == "flow1d":
        from recast_cli.policy.flow1d import Flow1DPolicy

        return Flow1DPolicy(steps=steps, features=spec.features, hidden=spec.hidden, world=analytic_world(spec))
    folder = spec.folder()
    if folder is None:
        raise BadInput(f"an {spec.kind} policy needs [policy] path = the model folder or a Hub repo id")
    return policy_class(spec.kind).from_pretrained(
        folder, steps=steps, guidance_scale=spec.guidance_scale if guidance_scale is None else guidance_scale,
        resolution=spec.resolution, max_sequence_length=spec.max_sequence_length, precision=spec.precision,
        device=device, offload_text_encoders=spec.offload_text_encoders, trainable=trainable)


# --------------------------------------------------------------------------- what a setting's runs are made of


def digest(value: Any) -> str:
    """The sha256 of ``value`` as canonical JSON (sorted keys, no spaces; tuples as lists; a dataclass as
    its compared fields; a path, or a TOML date, as its text): equal exactly when the content is."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_canonical)
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in fields(value) if f.compare}  # a world's label is no part
    return str(value)


def world_of(setting: Setting) -> Any:
    """The analytic world a gmm1d or flow1d setting's runs live in, resolved (its ``[world]``, or
    docs/method.md §4's: a ``[world]`` equal to the default is the same world); None for an image policy."""
    return analytic_world(setting.policy) if setting.policy.kind in ANALYTIC_KINDS else None


def file_digest(path: str | Path) -> str | None:
    """The sha256 of the file at ``path``; None when there is none (a named prompt set such as ``toy``)."""
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def policy_inputs(setting: Setting) -> dict[str, str]:
    """Label → digest of the policy and the world a setting's runs live in: its resolved ``[policy]``
    (less its world) and ``[world]`` (the analytic world; docs/method.md §4's when the setting has none). What
    ``recast study`` records per cell and gain table, ``recast estimate`` in its run id and ``recast
    train`` per run: a file made under others is never reused. Left out: ``offload_text_encoders``
    (the same images either way, docs/policies.md) and where the checkout is: a local model path counts
    relative to the setting's folder, so a moved checkout or another worktree is the same policy."""
    return {label: digest(value) for label, value in policy_values(setting).items()}


def policy_values(setting: Setting) -> dict[str, Any]:
    """Label → what :func:`policy_inputs` digests, as plain JSON data (``digest`` of each value is its
    digest there): ``recast train`` records them beside the digests, so that a command refusing a run's
    setting edited since (``artifacts.run.setting_changes``) names the key that changed."""
    return {"[policy]": canonical(policy_content(setting)), "[world]": canonical(world_of(setting))}


def canonical(value: Any) -> Any:
    """``value`` as the plain JSON data :func:`digest` hashes: ``digest(canonical(v)) == digest(v)``."""
    return json.loads(json.dumps(value, sort_keys=True, allow_nan=False, default=_canonical))


def policy_content(setting: Setting) -> PolicySpec:
    """The setting's policy less what does not change its results (:func:`policy_inputs`)."""
    spec, path = setting.policy, setting.policy.path
    if path is not None:
        path = Path(os.path.relpath(path, setting.file.parent))
    return replace(spec, world=None, offload_text_encoders=None, path=path)
