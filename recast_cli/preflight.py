"""``recast preflight``: a setting's policy at its real architecture, checked before real weights.

Phase ``build`` (the one implemented so far): every component of the setting's pipeline is
built from its config on the ``meta`` device — shapes, no memory, no weights, seconds even for
SD3.5-Medium's 2.2 B-parameter transformer and 4.8 B-parameter T5-XXL encoder — and counted:
parameters per component, the LoRA parameters ``[train]`` would train (rank r on every
targeted linear layer: r·(in + out) each), and the bytes of the weights at the setting's
precision. Configs come from the setting's model folder when it is there, else from the shipped
architecture configs (``pipelines/configs/``); ``--scale tiny`` builds the ``recast tiny-model``
architecture of the same family instead.

The JSON written is ``recast.preflight/1``: recast/torch/diffusers versions, device, dtype,
engine, the configs' source, and per phase its seconds and numbers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from recast_cli import __version__
from recast_cli.artifacts import atomic_write_bytes
from recast_cli.errors import BadInput
from recast_cli.settings import PIPELINES

PREFLIGHT_SCHEMA = "recast.preflight/1"
PHASES = ("build",)  # estimate, train and evaluate at the setting's budget are not written yet
SCALES = ("full", "tiny")
SHIPPED = {"sd3": PIPELINES / "configs" / "stable-diffusion-3.5-medium"}
BYTES = {"bf16": 2, "fp16": 2, "no": 4, "fp32": 4}
#: component folder → how its config builds a module (library, class)
SD3_COMPONENTS = {
    "transformer": ("diffusers", "SD3Transformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
    "text_encoder": ("transformers", "CLIPTextModelWithProjection"),
    "text_encoder_2": ("transformers", "CLIPTextModelWithProjection"),
    "text_encoder_3": ("transformers", "T5EncoderModel"),
}


def parse_phases(text: str) -> tuple[str, ...]:
    phases = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in phases if p not in ("build", "estimate", "train", "evaluate")]
    if not phases or unknown:
        raise BadInput(f"--phases takes build,estimate,train,evaluate (comma-separated), got {text!r}")
    missing = [p for p in phases if p not in PHASES]
    if missing:
        raise BadInput(f"--phases {','.join(missing)}: not available yet; this recast runs the build phase only "
                       "(--phases build)")
    return phases


def config_folder(setting, scale: str) -> tuple[Path | None, str]:
    """(the folder whose component configs to build, what it is); None for the tiny architecture."""
    spec = setting.policy
    if spec.kind != "sd3":
        raise BadInput(f"setting {setting.name!r}: recast preflight builds sd3 policies; {spec.kind!r} has no "
                       "architecture to check (the analytic worlds are exact)")
    if scale == "tiny":
        return None, "the recast tiny-model sd3 architecture"
    if spec.path is not None and (Path(spec.path) / "model_index.json").is_file():
        return Path(spec.path), f"the model folder {spec.path}"
    return SHIPPED["sd3"], f"the shipped configs {SHIPPED['sd3'].relative_to(PIPELINES.parent)} (no model folder at {spec.path})"


def _module_on_meta(folder: Path, name: str):
    import torch

    library, cls_name = SD3_COMPONENTS[name]
    path = folder / name / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from None
    with torch.device("meta"):
        if library == "diffusers":
            import diffusers

            return getattr(diffusers, cls_name).from_config(config)
        import transformers

        cls = getattr(transformers, cls_name)
        return cls(cls.config_class(**{k: v for k, v in config.items() if k != "architectures"}))


def _components(folder: Path | None) -> dict[str, Any]:
    if folder is None:
        import torch

        from recast_cli.policy.tiny import build_pipeline
        from recast_cli.toy.pretrain import toy_words

        with torch.device("meta"):
            pipe = build_pipeline("sd3", toy_words())
        return {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    present = [n for n in SD3_COMPONENTS if (folder / n / "config.json").is_file()]
    if "transformer" not in present:
        raise BadInput(f"{folder}: no transformer/config.json")
    return {name: _module_on_meta(folder, name) for name in present}


def lora_parameters(transformer, targets: tuple[str, ...], rank: int) -> tuple[int, int]:
    """(LoRA parameters, targeted linear layers) of rank ``rank`` on the modules peft would match."""
    import torch

    total = layers = 0
    for name, module in transformer.named_modules():
        if isinstance(module, torch.nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            total += rank * (module.in_features + module.out_features)
            layers += 1
    return total, layers


def build_phase(setting, cfg, scale: str) -> dict[str, Any]:
    """The ``build`` phase's numbers (nothing is allocated: every tensor lives on ``meta``)."""
    t0 = time.perf_counter()
    folder, source = config_folder(setting, scale)
    modules = _components(folder)
    counts = {name: {"class": type(m).__name__, "parameters": sum(p.numel() for p in m.parameters()),
                     "on_meta": all(p.device.type == "meta" for p in m.parameters())} for name, m in modules.items()}
    lora, layers = lora_parameters(modules["transformer"], tuple(cfg.lora_targets), cfg.lora_rank) \
        if cfg.lora_rank > 0 else (counts["transformer"]["parameters"], 0)
    total = sum(c["parameters"] for c in counts.values())
    precision = setting.policy.precision or "no"
    return {"seconds": round(time.perf_counter() - t0, 3), "configs": source, "components": counts,
            "parameters_total": total, "trainable": lora, "lora_rank": cfg.lora_rank, "lora_layers": layers,
            "precision": precision, "weights_bytes": total * BYTES.get(precision, 4)}


def preflight(setting_name: str, out: Path, scale: str = "full", phases: str = "build",
              random_weights: bool = True) -> dict[str, Any]:
    """Run the phases, write ``out/preflight.json`` atomically, return its record."""
    import diffusers
    import torch

    from recast_cli.settings import load_setting
    from recast_cli.train.config import config_from_setting

    if scale not in SCALES:
        raise BadInput(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if not random_weights:
        raise BadInput("recast preflight runs on random weights only (--random-weights); real weights are what it "
                       "checks for")
    chosen = parse_phases(phases)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: not a directory")
    setting = load_setting(setting_name)
    cfg = config_from_setting(setting.raw, setting.file)
    record: dict[str, Any] = {
        "schema": PREFLIGHT_SCHEMA, "recast_version": __version__, "torch": torch.__version__,
        "diffusers": diffusers.__version__, "setting": str(setting.file), "scale": scale, "device": "meta",
        "dtype": setting.policy.precision or "no", "engine": "single", "phases": {}}
    if "build" in chosen:
        record["phases"]["build"] = build_phase(setting, cfg, scale)
    atomic_write_bytes(out / "preflight.json", (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return record
