"""The trainer's configuration: a setting's ``[train]`` table, then command-line overrides.

Every knob of ``recast train`` lives in ``TrainConfig``; a setting gives the defaults
(``pipelines/NAME.toml``, table ``[train]``) and ``--set KEY=VALUE`` or the named flags
override them. The resolved configuration is written to ``RUN/config.toml`` so a run folder
says exactly what ran.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from typing import Any

from recast_cli import bounds
from recast_cli.errors import BadInput, shown
from recast_cli.rewards.options import reward_options
from recast_cli.setting.load import Setting, parse_table
from recast_cli.train.loggers import LOGGERS
from recast_cli.train.stall import DEFAULT_SMOOTHING, DEFAULT_THRESHOLD, DEFAULT_WINDOW, StallRule

KL_FORMS = ("exact", "flowgrpo")
ADV_STD = ("group", "global")
LR_SCHEDULES = ("constant", "warmup")
#: The stall detector's keys: it only observes, so none of them is part of the run key.
STALL_KEYS = ("stall_detector", "stall_window", "stall_threshold", "stall_smoothing")
#: Flow-GRPO's LoRA targets for SD3: the joint attention's image and text projections.
DEFAULT_LORA_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                        "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides a training run (docs/method.md §6).

    ``prompts_per_step`` groups of ``group_size`` images are sampled per iteration (the
    global batch, split across processes by whole groups); every iteration ends with
    ``updates_per_step`` optimizer steps over its samples.
    """

    rewards: tuple[str, ...] = ()
    lam: tuple[float, ...] = ()
    prompts: str = ""
    max_steps: int = 100
    group_size: int = 8
    prompts_per_step: int = 8
    noise_level: float | None = None  # None: the setting's [policy] noise_level
    train_fraction: float | None = None  # None: every step but the last (the cleanest)
    micro_batch: int = 64  # (sample, step) pairs per forward/backward
    sample_batch: int = 64  # images per sampling call
    updates_per_step: int = 1
    learning_rate: float = 3e-4
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    clip_range: float = 1e-4  # PPO ratio clip ε (Flow-GRPO's default)
    adv_clip: float = 5.0
    adv_std: str = "group"
    beta_kl: float = 0.04
    kl_form: str = "exact"
    lora_rank: int = 32  # 0: full fine-tuning of the transformer
    lora_alpha: float = 64.0
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    ema_decay: float = 0.0  # 0: no EMA
    save_every: int = 20
    keep_checkpoints: int = 2
    seed: int = 0
    compile: bool = False  # torch.compile the denoiser for sampling and the update
    compile_backend: str = "inductor"
    gradient_checkpointing: bool = False  # recompute each transformer block in the backward (memory for time)
    logger: tuple[str, ...] = ("tensorboard",)  # where scalars and pictures go besides metrics.parquet (train/loggers)
    log_images_every: int = 10  # a grid of samples to the loggers every N steps; 0: never
    wandb_project: str = "recast"
    stall_detector: bool = True  # watch for a reward that stalls while another rises (train/stall)
    stall_window: int = DEFAULT_WINDOW  # steps over which a reward's progress is measured
    stall_threshold: float = DEFAULT_THRESHOLD  # in units of each reward's within-group std at the start
    stall_smoothing: int = DEFAULT_SMOOTHING  # span in steps of the moving average of each reward's mean
    reward_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def run_key(self) -> str:
        """What a resumed run must share with the run it resumes.

        Everything but the step budget, the checkpoint cadence, how the denoiser executes
        (``compile``, ``compile_backend``: compiled kernels round differently, so a run resumed
        with another choice continues to within float rounding rather than bit for bit;
        ``gradient_checkpointing`` recomputes the same forward in the backward), where the run
        is logged besides ``metrics.parquet`` (``logger``, ``log_images_every``, ``wandb_project``) and
        the stall detector, which only watches (``stall_*``).
        """
        loose = ("max_steps", "save_every", "keep_checkpoints", "compile", "compile_backend", "gradient_checkpointing",
                 "logger", "log_images_every", "wandb_project", *STALL_KEYS)
        fixed = {k: v for k, v in asdict(self).items() if k not in loose}
        return hashlib.sha256(json.dumps(fixed, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def stall_rule(self) -> StallRule | None:
        """The stall detector's rule, or None when ``stall_detector`` is off."""
        if not self.stall_detector:
            return None
        return StallRule(self.stall_window, self.stall_threshold, self.stall_smoothing)

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of training step ``step + 1`` (``warmup``: linear over ``warmup_steps``)."""
        if self.lr_schedule == "warmup" and self.warmup_steps > 0:
            return self.learning_rate * min(1.0, (step + 1) / self.warmup_steps)
        return self.learning_rate

    def to_toml(self) -> str:
        lines = ["[train]"]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "reward_options":
                continue
            if value is None:
                lines.append(f"# {f.name} = (setting default)")
                continue
            lines.append(f"{'lambda' if f.name == 'lam' else f.name} = {_toml_value(value)}")
        for name, opts in sorted(self.reward_options.items()):
            lines.append(f"\n[rewards.{json.dumps(name)}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in sorted(opts.items()))
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


_TYPES = {f.name: f.type for f in fields(TrainConfig)}
#: The bound (``recast_cli.bounds``) of every integer key, checked wherever a value comes from.
BOUND_OF = {"max_steps": "training_steps", "group_size": "group_size", "prompts_per_step": "prompts_per_step",
            "micro_batch": "batch", "sample_batch": "batch", "updates_per_step": "updates_per_step",
            "warmup_steps": "warmup_steps", "lora_rank": "lora_rank", "save_every": "save_every",
            "keep_checkpoints": "keep_checkpoints", "seed": "seed", "log_images_every": "log_images_every",
            "stall_window": "training_steps", "stall_smoothing": "training_steps"}


def _coerce(key: str, value: Any, where: str) -> Any:
    kind = _TYPES[key]
    try:
        if kind.startswith("tuple"):
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                raise TypeError
            inner = _finite if "float" in kind else str
            return tuple(inner(v.strip() if isinstance(v, str) else v) for v in value)
        if kind == "bool":
            if not isinstance(value, bool):
                raise TypeError
            return value
        if value is None:
            if "None" in kind:
                return None
            raise TypeError
        if kind.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            label = where if where.startswith("--") else f"{where}: [train] {key}"
            return bounds.check(BOUND_OF[key], int(value), label)
        if kind.startswith("float"):
            return _finite(value)
        if kind.startswith("str"):
            return str(value)
    except BadInput:  # a value of the right type out of its bounds
        raise
    except (TypeError, ValueError):
        pass
    else:
        return value
    if kind.startswith("float") and isinstance(value, (int, float)) and not isinstance(value, bool):
        raise BadInput(f"{where}: {key} = {shown(value)} is not a finite number")
    raise BadInput(f"{where}: {key} = {shown(value)} is not a valid {kind}")


def _finite(value: Any) -> float:
    """``float(value)``, or ValueError when that is inf or nan (``--set learning_rate=inf``): a training
    option at infinity trains nothing, silently."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(value)
    return number


def config_from_setting(setting: Setting, *, required: bool = True) -> TrainConfig:
    """The ``[train]`` table (and ``[rewards.NAME]`` option tables) of a loaded setting; values checked in
    table order. Not ``required``: a setting without the table gets the defaults (``[evaluate]`` of a base
    model still resolves its judges' ``[rewards.NAME]`` options)."""
    raw, setting_file = setting.raw, setting.file
    table = raw.get("train", None if required else {})
    if not isinstance(table, dict):
        raise BadInput(f"{setting_file}: no [train] table (the trainer's defaults: rewards, lambda, prompts, ...)")

    def parse(key: str, given: Any) -> Any:
        value = _coerce("lam" if key == "lambda" else key, given, str(setting_file))
        if key == "prompts" and value != "toy":
            return str((setting_file.parent / value).resolve())
        return value

    def unknown(keys: list[str], allowed: list[str]) -> str:
        return f"{setting_file}: unknown [train] key {keys[0]!r}; allowed: {', '.join(sorted(allowed))}"

    cfg = parse_table(TrainConfig, table, unknown, {key: partial(parse, key) for key in table},
                      names={"lambda": "lam"}, reward_options={})
    return replace(cfg, reward_options=reward_options(raw, setting_file))


def apply_overrides(cfg: TrainConfig, pairs: list[str], flags: dict[str, Any]) -> TrainConfig:
    """``--set KEY=VALUE`` pairs (TOML values) and named flags, in that order."""
    values: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise BadInput(f"--set {pair!r}: expected KEY=VALUE, e.g. --set learning_rate=1e-4")
        key, text = (s.strip() for s in pair.split("=", 1))
        name = "lam" if key == "lambda" else key
        if name not in _TYPES or name == "reward_options":
            raise BadInput(f"--set {key}: no such training option")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except (tomllib.TOMLDecodeError, ValueError):
            value = text
        except RecursionError:
            raise BadInput(f"--set {key}: the value nests arrays or tables too deeply") from None
        values[name] = _coerce(name, value, f"--set {key}")
    for name, value in flags.items():
        if value is not None:
            values[name] = _coerce(name, value, f"--{name.replace('_', '-')}")
    return replace(cfg, **values)


def check_config(cfg: TrainConfig) -> None:
    """BadInput for any value the trainer cannot run with."""
    if not cfg.rewards:
        raise BadInput("the setting's [train] rewards list is empty")
    if len(set(cfg.rewards)) != len(cfg.rewards):
        raise BadInput(f"rewards must be distinct, got {list(cfg.rewards)}")
    if len(cfg.lam) != len(cfg.rewards):
        raise BadInput(f"lambda has {len(cfg.lam)} values for {len(cfg.rewards)} rewards ({', '.join(cfg.rewards)})")
    if not all(math.isfinite(x) and x > 0 for x in cfg.lam):
        raise BadInput(f"lambda must be positive numbers, got {list(cfg.lam)}")
    for key, kind in BOUND_OF.items():  # each was checked where it was given; a config built in code too
        bounds.check(kind, getattr(cfg, key), key)
    bounds.check_product("images_per_step", {"group_size": cfg.group_size, "prompts_per_step": cfg.prompts_per_step})
    checks = [
        (cfg.learning_rate > 0, "learning_rate must be > 0"),
        (cfg.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}"),
        (0 <= cfg.weight_decay and cfg.grad_clip > 0, "weight_decay must be >= 0 and grad_clip > 0"),
        (cfg.clip_range > 0 and cfg.adv_clip > 0, "clip_range and adv_clip must be > 0"),
        (cfg.adv_std in ADV_STD, f"adv_std must be one of {', '.join(ADV_STD)}"),
        (cfg.beta_kl >= 0, "beta_kl must be >= 0"),
        (cfg.kl_form in KL_FORMS, f"kl_form must be one of {', '.join(KL_FORMS)}"),
        (cfg.lora_alpha > 0, "lora_alpha must be > 0"),
        (bool(cfg.lora_targets), "lora_targets names no module"),
        (0 <= cfg.ema_decay < 1, "ema_decay must lie in [0, 1)"),
        (cfg.noise_level is None or cfg.noise_level > 0, "noise_level must be > 0 (the trainer needs the SDE)"),
        (cfg.train_fraction is None or 0 < cfg.train_fraction <= 1, "train_fraction must lie in (0, 1]"),
        (bool(cfg.wandb_project.strip()), "wandb_project must name a W&B project"),
        (cfg.stall_threshold >= 0, "stall_threshold must be >= 0 (in units of each reward's within-group std)"),
    ]
    for ok, message in checks:
        if not ok:
            raise BadInput(message)
    unknown = [name for name in cfg.logger if name not in LOGGERS]
    if unknown or len(set(cfg.logger)) != len(cfg.logger):
        what = f"unknown logger {shown(unknown[0])}" if unknown else f"a logger named twice in {list(cfg.logger)}"
        raise BadInput(f"logger: {what}; known: {', '.join(LOGGERS)} (an empty list: metrics.parquet alone)")
    if cfg.compile:
        check_compile_backend(cfg.compile_backend)


def check_compile_backend(name: str) -> None:
    """BadInput unless ``name`` is a torch.compile backend (``inductor``, ``aot_eager``, ...)."""
    from torch._dynamo import list_backends
    from torch._dynamo.backends.registry import lookup_backend

    try:
        lookup_backend(name)
    except Exception:  # torch raises its own InvalidBackend type
        raise BadInput(f"compile_backend {name!r} is not a torch.compile backend; "
                       f"e.g. {', '.join(dict.fromkeys(['inductor', 'aot_eager', *list_backends()]))}") from None


def trained_steps(T: int, fraction: float | None) -> list[int]:
    """The steps t the loss covers, noisiest first: all but t = 1 by default, or int(T·f) of them."""
    count = max(T - 1, 1) if fraction is None else max(1, int(T * fraction))
    return list(range(T, T - count, -1))


def skip_clean_of(T: int, fraction: float | None) -> int:
    """How many of the cleanest steps t = 1 … K the trainer leaves untrained: ``solve-w --skip-clean K``
    gives a W on exactly :func:`trained_steps`."""
    return T - len(trained_steps(T, fraction))
