"""``hps``: HPSv2.1 through open_clip directly, cos(f_img, f_txt).

score = ⟨f_img/‖f_img‖, f_txt/‖f_txt‖⟩, the diagonal of HPSv2's ``image_features @
text_features.T`` (no logit scale); range [-1, 1], HPSv2.1 scores of real images lie near
0.2–0.35.

Model: open_clip ``ViT-H-14`` with the ``HPS_v2.1_compressed.pt`` state dict (a
``{"state_dict": ...}`` checkpoint, read with ``torch.load(weights_only=True)`` so loading
runs no code). ``arch`` may name another open_clip model or a JSON model config file (used by
the tests' tiny model; registered with ``open_clip.add_model_config``).

Preprocessing (HPSv2's ``preprocess_val``): resize the longest edge to the model's image
size (bicubic), pad to a square with 0, ``ToTensor``, CLIP mean/std; text through the
open_clip tokenizer of the architecture (context 77).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recast_cli.errors import BadInput
from recast_cli.rewards.base import BatchedScorer, check_batch_size, torch_device
from recast_cli.rewards.weights import WeightSpec, resolve

HPS_WEIGHTS = WeightSpec("hps", "HPSv2.1 checkpoint HPS_v2.1_compressed.pt", "weights", "RECAST_HPS_PATH",
                         "xswu/HPSv2", "HPS_v2.1_compressed.pt")
HPS_ARCH = "ViT-H-14"


class HpsScore(BatchedScorer):
    """cos(image, text) of the HPSv2.1 open_clip model."""

    name = "hps"
    output_range = (-1.0, 1.0)

    def __init__(self, weights: str | Path | None = None, arch: str = HPS_ARCH, device: str = "cpu",
                 batch_size: int = 16) -> None:
        import open_clip

        self.device = torch_device(self.name, device)
        self.batch_size = check_batch_size(self.name, batch_size)
        path = resolve(HPS_WEIGHTS, weights)
        model_name = _register_arch(open_clip, arch)
        model = open_clip.create_model(model_name, pretrained=None, load_weights=False, output_dict=True)
        _load_state_dict(path, model)
        self.model = model.eval().requires_grad_(False).to(self.device)
        self.tokenizer = open_clip.get_tokenizer(model_name)
        self.preprocess = open_clip.image_transform(self.model.visual.image_size, is_train=False,
                                                    mean=getattr(self.model.visual, "image_mean", None),
                                                    std=getattr(self.model.visual, "image_std", None),
                                                    resize_mode="longest")

    @torch.inference_mode()
    def score_chunk(self, images: list, prompts: list[str]) -> np.ndarray:
        pixels = torch.stack([self.preprocess(im) for im in images]).to(self.device)
        text = self.tokenizer(prompts).to(self.device)
        return hps_cosine(self.model, pixels, text).double().cpu().numpy()


def hps_cosine(model, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """cos(image, text) per (image, prompt) row [B] of an open_clip model."""
    return (model.encode_image(pixels, normalize=True) * model.encode_text(text, normalize=True)).sum(dim=-1)


def architecture_config(arch: str) -> dict:
    """The open_clip model config of ``arch`` (a known model name, or a JSON config file it registers)."""
    import open_clip

    return open_clip.get_model_config(_register_arch(open_clip, arch))


def build_architecture(config: dict):
    """The ``open_clip.CLIP`` that ``create_model(arch, pretrained=None)`` builds from ``config``, without
    its move to a device, so it can be built on the meta device (``recast preflight``)."""
    from open_clip.model import CLIP

    return CLIP(**config, output_dict=True)


def _register_arch(open_clip, arch: str) -> str:
    """The open_clip model name for ``arch``: a known name, or the stem of a JSON config file it registers."""
    if arch in open_clip.list_models():
        return arch
    config = Path(arch)
    if config.suffix == ".json" and config.is_file():
        open_clip.add_model_config(config)
        return config.stem
    raise BadInput(f"hps: arch {arch!r} is neither an open_clip model name nor a JSON model config file")


def _load_state_dict(path: Path, model: torch.nn.Module) -> None:
    """Load ``path`` (a state dict, or a checkpoint holding one under "state_dict") into ``model``, strictly."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a corrupt or pickled-code file raises one of many types
        raise BadInput(f"hps: cannot read {path} as a weights-only torch checkpoint ({type(exc).__name__})") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise BadInput(f"hps: {path} holds no state dict")
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise BadInput(f"hps: {path} does not fit the {type(model).__name__} architecture ({first})") from None
