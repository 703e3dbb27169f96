"""transformers CLIP pieces shared by ``clip``, ``pick`` and ``aesthetic``: loading and projected features."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from recast_cli.errors import BadInput


def load_model(scorer: str, path: Path, device: torch.device):
    """A ``CLIPModel`` from a local folder (config.json + weights), in eval mode on ``device``."""
    from transformers import CLIPModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # transformers ≥ 5.2x draws a "Loading weights" bar on stderr
    try:
        model = CLIPModel.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise BadInput(f"{scorer}: {path} is not a transformers CLIP model folder ({_first_line(exc)})") from None
    return model.eval().requires_grad_(False).to(device)


def build_model(config: dict):
    """A ``CLIPModel`` of the architecture a CLIP folder's ``config.json`` describes, weights not loaded
    (``recast preflight`` builds it on the meta device)."""
    from transformers import CLIPConfig, CLIPModel

    return CLIPModel(CLIPConfig(**{k: v for k, v in config.items() if k != "architectures"}))


def load_processor(scorer: str, path: Path):
    """A ``CLIPProcessor`` (tokenizer + image processor) from a local folder."""
    from transformers import CLIPProcessor

    try:
        return CLIPProcessor.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise BadInput(f"{scorer}: {path} holds no CLIP processor ({_first_line(exc)})") from None


def tokenize(processor, model, prompts: Sequence[str], padding: str, device: torch.device) -> dict[str, torch.Tensor]:
    """Token ids and attention mask, truncated to the text model's context length (77 for CLIP)."""
    length = model.config.text_config.max_position_embeddings
    tokens = processor.tokenizer(list(prompts), padding=padding, truncation=True, max_length=length,
                                 return_tensors="pt")
    return {"input_ids": tokens["input_ids"].to(device), "attention_mask": tokens["attention_mask"].to(device)}


def image_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """Projected image embeddings [B, d] (not normalised): visual_projection(pooled vision output)."""
    return model.visual_projection(model.vision_model(pixel_values=pixel_values).pooler_output)


def text_features(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Projected text embeddings [B, d] (not normalised): text_projection(pooled text output)."""
    return model.text_projection(model.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output)


def scaled_cosine(model, pixel_values: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  divisor: float) -> torch.Tensor:
    """exp(logit_scale)·cos(image, text) / divisor per (image, prompt) row: ``clip`` (30) and ``pick`` (26)."""
    cos = cosine(image_features(model, pixel_values), text_features(model, input_ids, attention_mask))
    return model.logit_scale.exp() * cos / divisor


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity of two [B, d] batches."""
    return (a / a.norm(dim=-1, keepdim=True) * (b / b.norm(dim=-1, keepdim=True))).sum(dim=-1)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
