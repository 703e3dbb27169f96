"""``recast preflight``: the setting's rewards and judges at their real architectures, on random weights.

Every name in ``[train] rewards`` and ``[evaluate] judges`` is placed once (:func:`placement`):

* **model**: an in-process scorer whose network recast can build from a config —
  ``clip`` (CLIP ViT-L/14, transformers ``CLIPModel``), ``pick`` (PickScore_v1, a CLIP-ViT-H/14
  ``CLIPModel``), ``hps`` (HPSv2.1, open_clip ``ViT-H-14``), ``aesthetic`` (CLIP ViT-L/14 and the
  LAION MLP head) and ``imagereward`` (ImageReward's BLIP ViT-L/16 + BERT cross-attention + MLP,
  :class:`~recast_cli.rewards.imagereward.ImageRewardArchitecture`). Each is built by its reward
  module's own builder, from the config in its weights folder when the setting's folder has one,
  else from the shipped ``pipelines/configs/`` (``--scale tiny``: small configs of the same classes);
* **served**: ``NAME@URL``, ``remote``, ``unifiedreward`` (a vLLM server) and ``geneval`` (a
  detector server) run outside this process: named in the table, not counted;
* **host**: ``ocr`` (ONNX runtime on the CPU) and the weight-free toy scorers: no device memory;
* **not built**: ``hpsv3`` (Qwen2-VL-7B inside its own package, which pins another transformers)
  and any plug-in: named, not counted.

The ``build`` phase counts each model on the meta device (parameters, bytes at fp32: the scorers
load their checkpoints in fp32). The device phases use ``preflight.phases.ArchitectureScorer``: the model
materialised with random weights where the setting puts it (``[rewards.NAME] device``), scoring with
the reward module's own tensor function (``hfclip.scaled_cosine``, ``hps_cosine``,
``aesthetic_score``, ImageReward's ``score_gard``) on the images resized to the model's input and
fixed-length token ids — the shapes of the real scorer, so its memory and images/s are the run's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recast_cli.errors import BadInput
from recast_cli.setting.load import PIPELINES

CONFIGS = PIPELINES / "configs"
#: the scorers load their checkpoints in fp32
REWARD_BYTES = 4
SERVED = {"remote": "a recast serve-reward server", "unifiedreward": "a vLLM server (UnifiedReward-2)",
          "geneval": "a GenEval detector server"}
HOST = {"ocr": "ONNX runtime on the host CPU", "toy_color": "weight-free", "toy_shape": "weight-free",
        "toy_sharpness": "weight-free"}
NOT_BUILT = {"hpsv3": "Qwen2-VL-7B inside the hpsv3 package (it pins transformers 4.45): serve it, hpsv3@URL"}
MODELS = ("clip", "pick", "hps", "aesthetic", "imagereward")

_TINY_CLIP = {
    "projection_dim": 16,
    "text_config": {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "max_position_embeddings": 77, "bos_token_id": 509,
                    "eos_token_id": 510, "pad_token_id": 511},
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "image_size": 32, "patch_size": 8},
}
_TINY_OPEN_CLIP = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 8,
                                                   "patch_size": 8},
                   "text_cfg": {"context_length": 77, "vocab_size": 512, "width": 32, "heads": 4, "layers": 2}}
_TINY_MED = {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "max_position_embeddings": 64, "add_cross_attention": True}
_TINY_VIT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "image_size": 32, "patch_size": 8}


def empty():
    """Parameters on ``meta``, buffers built on the CPU with their values (position ids, causal masks)."""
    from accelerate import init_empty_weights

    return init_empty_weights(include_buffers=False)


def placement(name: str) -> tuple[str, str]:
    """(``model`` | ``served`` | ``host`` | ``not built``, why) for a reward or judge name."""
    base = name.split("@", 1)[0]
    if "@" in name:
        return "served", f"served at {name.split('@', 1)[1]}: outside this process, not counted"
    if base in SERVED:
        return "served", f"{SERVED[base]}: outside this process, not counted"
    if base in HOST:
        return "host", f"{HOST[base]}: no device memory"
    if base in MODELS:
        return "model", ""
    return "not built", f"{NOT_BUILT.get(base, 'an architecture preflight does not know')}: not counted"


@dataclass
class RewardModel:
    """One in-process reward network: built on ``meta`` by :func:`build_reward_model`."""

    name: str
    configs: str  # which config it was built from
    module: torch.nn.Module
    image_size: int
    text_tokens: int  # 0: the score reads no text
    vocab: int
    score: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    label: str = ""  # the classes, where the module is a container of two

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from None


def _found(spec, given: Any) -> Path | None:
    """Where the scorer would find its weight (option, environment variable, HF cache, as it resolves
    them), or None where it would find none: preflight then builds from the shipped config."""
    from recast_cli.rewards.weights import resolve

    try:
        return resolve(spec, given)
    except BadInput:
        return None


def _shipped(*parts: str) -> tuple[dict[str, Any], str]:
    path = CONFIGS.joinpath(*parts)
    return _read(path), str(path.relative_to(PIPELINES.parent))


def _clip_config(spec, given: Any, shipped: str, scale: str) -> tuple[dict[str, Any], str]:
    """A CLIP folder's config.json where the scorer would find the folder, else the shipped one (tiny: small)."""
    if scale == "tiny":
        return _TINY_CLIP, "tiny"
    folder = _found(spec, given)
    if folder is not None and (folder / "config.json").is_file():
        return _read(folder / "config.json"), str(folder / "config.json")
    return _shipped(shipped, "config.json")


def build_reward_model(name: str, options: dict[str, Any], scale: str) -> RewardModel:
    """Reward ``name``'s network built by its module's builder from its config (call inside :func:`empty`)."""
    from recast_cli.rewards import hfclip

    if name in ("clip", "pick", "aesthetic"):
        from recast_cli.rewards.aesthetic import AESTHETIC_CLIP, AestheticMLP, aesthetic_score
        from recast_cli.rewards.clip import CLIP_WEIGHTS, LOGIT_DIVISOR
        from recast_cli.rewards.pick import PICK_DIVISOR, PICK_WEIGHTS

        spec = {"clip": CLIP_WEIGHTS, "pick": PICK_WEIGHTS, "aesthetic": AESTHETIC_CLIP}[name]
        config, source = _clip_config(spec, options.get(spec.option), "PickScore_v1" if name == "pick"
                                      else "clip-vit-large-patch14", scale)
        clip = hfclip.build_model(config)
        size, vocab = clip.config.vision_config.image_size, clip.config.text_config.vocab_size
        if name == "aesthetic":
            module = torch.nn.ModuleDict({"clip": clip, "head": AestheticMLP(clip.config.projection_dim)})
            return RewardModel(name, source, module, size, 0, vocab,
                               lambda m, pixels, ids, mask: aesthetic_score(m["clip"], m["head"], pixels),
                               "CLIPModel + AestheticMLP")
        divisor = PICK_DIVISOR if name == "pick" else LOGIT_DIVISOR
        return RewardModel(name, source, clip, size, clip.config.text_config.max_position_embeddings, vocab,
                           lambda m, pixels, ids, mask: hfclip.scaled_cosine(m, pixels, ids, mask, divisor))
    if name == "hps":
        from recast_cli.rewards.hps import HPS_ARCH, architecture_config, build_architecture, hps_cosine

        arch = options.get("arch", HPS_ARCH)
        config, source = (_TINY_OPEN_CLIP, "tiny") if scale == "tiny" else (architecture_config(arch),
                                                                              f"open_clip {arch}")
        module = build_architecture(config)
        return RewardModel(name, source, module, config["vision_cfg"]["image_size"],
                           config["text_cfg"]["context_length"], config["text_cfg"]["vocab_size"],
                           lambda m, pixels, ids, mask: hps_cosine(m, pixels, ids))
    if name == "imagereward":
        from recast_cli.rewards.imagereward import IR_MED_CONFIG, PROMPT_TOKENS, ImageRewardArchitecture

        found = None if scale == "tiny" else _found(IR_MED_CONFIG, options.get("med_config"))
        if scale == "tiny":
            med, vision, source = _TINY_MED, _TINY_VIT, "tiny"
        elif found is not None and found.is_file():
            med, vision, source = _read(found), None, str(found)
        else:
            (med, source), vision = _shipped("ImageReward", "med_config.json"), None
        module = ImageRewardArchitecture(med, vision)
        return RewardModel(name, source, module, module.visual_encoder.config.image_size, PROMPT_TOKENS,
                           med["vocab_size"], lambda m, pixels, ids, mask: m(ids, mask, pixels).squeeze(-1))
    raise BadInput(f"preflight builds the networks of {', '.join(MODELS)}, not {name!r}")


def scorer_roles(setting) -> dict[str, tuple[str, ...]]:
    """Every reward and judge name of the setting → its roles (``reward``, ``judge``), rewards first."""
    from recast_cli.evaluate.config import config_from_setting

    ecfg, tcfg = config_from_setting(setting)
    roles: dict[str, tuple[str, ...]] = {}
    for name in tcfg.rewards:
        roles[name] = roles.get(name, ()) + ("reward",)
    for name in ecfg.judges:
        roles[name] = roles.get(name, ()) + ("judge",)
    return roles


def reward_options(setting) -> dict[str, dict[str, Any]]:
    from recast_cli.rewards.options import reward_options as tables

    return tables(setting.raw, setting.file)


def where(options: dict[str, Any]) -> str:
    """Where the run puts an in-process model: its ``device`` option (the scorers' default is the CPU)."""
    return "cuda" if str(options.get("device", "cpu")).startswith("cuda") else "cpu"


def rewards_build(setting, scale: str) -> dict[str, Any]:
    """The build phase's reward table: every reward and judge placed; the models counted on meta."""
    roles, options = scorer_roles(setting), reward_options(setting)
    rows: dict[str, Any] = {}
    for name, role in roles.items():
        kind, why = placement(name)
        row: dict[str, Any] = {"roles": list(role), "placement": kind}
        if kind == "model":
            with empty():
                model = build_reward_model(name, options.get(name, {}), scale)
            row.update({"class": model.label or type(model.module).__name__, "configs": model.configs,
                        "parameters": model.parameters, "weights_bytes": model.parameters * REWARD_BYTES,
                        "device": where(options.get(name, {}))})
        else:
            row["note"] = why
        rows[name] = row
    models = [r for r in rows.values() if r["placement"] == "model"]

    def gpu(role: str | None) -> int:
        return sum(r["weights_bytes"] for r in models if r["device"] == "cuda" and (role is None or role in r["roles"]))

    # recast train holds its rewards; recast evaluate its rewards and judges
    return {"scorers": rows, "dtype": "fp32", "train_device_bytes": gpu("reward"), "evaluate_device_bytes": gpu(None),
            "host_weights_bytes": sum(r["weights_bytes"] for r in models if r["device"] == "cpu"),
            "not_counted": [n for n, r in rows.items() if r["placement"] in ("served", "not built")]}
