"""``imagereward``: ImageReward-v1.0 through its published package (``image-reward``).

score = (MLP(h) − 0.16717362830052426) / 1.0333394966054072, with h the first-token state
of BLIP's BERT text encoder (prompt padded/truncated to 35 tokens) cross-attending to the
BLIP ViT-L/16 image tokens, the package's ``ImageReward.score_gard``; unbounded (real images
mostly lie in [-2, 2]).

Preprocessing (the package's own ``preprocess``): bicubic resize of the shortest edge to
224, centre crop 224, CLIP mean/std.

Weights: ``ImageReward.pt`` and ``med_config.json`` (THUDM/ImageReward), and BLIP's
tokenizer ``bert-base-uncased`` from the local HF cache. The package pins timm==0.6.13 and
fairscale==0.4.13 and imports transformers 4.x internals, so it rarely imports next to
recast's stack: install it in a separate environment, run ``recast serve-reward
imagereward`` there and score with ``imagereward@http://127.0.0.1:PORT``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recast_cli.errors import BadInput
from recast_cli.rewards.base import BatchedScorer, check_batch_size, torch_device
from recast_cli.rewards.weights import WeightSpec, resolve

IR_WEIGHTS = WeightSpec("imagereward", "ImageReward checkpoint ImageReward.pt", "weights", "RECAST_IMAGEREWARD_PATH",
                        "THUDM/ImageReward", "ImageReward.pt")
IR_MED_CONFIG = WeightSpec("imagereward", "ImageReward med_config.json", "med_config",
                           "RECAST_IMAGEREWARD_MED_CONFIG", "THUDM/ImageReward", "med_config.json")
PROMPT_TOKENS = 35
#: the package's standardisation of the MLP output
REWARD_MEAN, REWARD_STD = 0.16717362830052426, 1.0333394966054072
#: BLIP's ``create_vit("large", 224)``: ViT-L/16 at 224 pixels
VIT_LARGE = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
             "image_size": 224, "patch_size": 16, "layer_norm_eps": 1e-6}
SEPARATE_PROCESS = ("install image-reward==1.5 with its pins in a separate environment, run `recast serve-reward "
                    "imagereward` there and score with imagereward@http://127.0.0.1:PORT")


class ImageRewardScore(BatchedScorer):
    """ImageReward-v1.0's standardised reward for (image, prompt)."""

    name = "imagereward"
    requires = ("ImageReward",)
    fetch_also = (("bert-base-uncased", "processor"),)  # BLIP's tokenizer, by this id (ImageReward/models/BLIP)
    provided_by = ("`make judges` scores it with its side package set (.side/, built by `make side`); or "
                   + SEPARATE_PROCESS)

    def __init__(self, weights: str | Path | None = None, med_config: str | Path | None = None,
                 device: str = "cpu", batch_size: int = 16) -> None:
        self.device = torch_device(self.name, device)
        self.batch_size = check_batch_size(self.name, batch_size)
        checkpoint, config = resolve(IR_WEIGHTS, weights), resolve(IR_MED_CONFIG, med_config)
        try:
            import ImageReward as RM
        except Exception as exc:  # ImportError, or the AttributeError of a transformers API it expects
            raise BadInput(f"imagereward: the image-reward package does not import here ({type(exc).__name__}); "
                           f"{SEPARATE_PROCESS}") from None
        try:
            self.model = RM.load(str(checkpoint), device=str(self.device), med_config=str(config))
        except OSError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInput(f"imagereward: cannot load the model ({first}); BLIP's tokenizer needs "
                           "bert-base-uncased in the local HF cache") from None
        self.model.requires_grad_(False)

    @torch.inference_mode()
    def score_chunk(self, images: list, prompts: list[str]) -> np.ndarray:
        text = self.model.blip.tokenizer(prompts, padding="max_length", truncation=True,
                                         max_length=PROMPT_TOKENS, return_tensors="pt").to(self.device)
        pixels = torch.stack([self.model.preprocess(im) for im in images]).to(self.device)
        rewards = self.model.score_gard(text.input_ids, text.attention_mask, pixels)
        return rewards.squeeze(-1).double().cpu().numpy()


class ImageRewardArchitecture(torch.nn.Module):
    """ImageReward-v1.0's network, for ``recast preflight`` (the package does not import beside recast's
    stack): the package's ``BLIP_Pretrain(vit="large")`` — ViT-L/16, the BERT text encoder of
    ``med_config`` cross-attending to it (no pooler), ``vision_proj`` and ``text_proj`` to 256 — and
    its MLP head, built from transformers' port of BLIP's own modules (``BlipVisionModel``,
    ``BlipTextModel``), which hold the same layers. ``forward`` is the package's ``score_gard``.
    """

    def __init__(self, med_config: dict, vision: dict | None = None, embed_dim: int = 256) -> None:
        from transformers import BlipTextConfig, BlipVisionConfig
        from transformers.models.blip.modeling_blip import BlipVisionModel
        from transformers.models.blip.modeling_blip_text import BlipTextModel

        from recast_cli.rewards.aesthetic import AestheticMLP  # ImageReward's MLP is the same five layers

        super().__init__()
        vision_config = BlipVisionConfig(**(VIT_LARGE if vision is None else vision))
        text_config = BlipTextConfig(
            vocab_size=med_config["vocab_size"], hidden_size=med_config["hidden_size"],
            intermediate_size=med_config["intermediate_size"], num_hidden_layers=med_config["num_hidden_layers"],
            num_attention_heads=med_config["num_attention_heads"],
            max_position_embeddings=med_config["max_position_embeddings"],
            layer_norm_eps=med_config.get("layer_norm_eps", 1e-12), hidden_act=med_config.get("hidden_act", "gelu"),
            encoder_hidden_size=vision_config.hidden_size,  # BLIP sets encoder_width to the ViT's width
            is_decoder=bool(med_config.get("add_cross_attention", True)))  # the cross-attention layers
        self.visual_encoder = BlipVisionModel(vision_config)
        self.text_encoder = BlipTextModel(text_config, add_pooling_layer=False)
        self.vision_proj = torch.nn.Linear(vision_config.hidden_size, embed_dim)
        self.text_proj = torch.nn.Linear(text_config.hidden_size, embed_dim)
        self.mlp = AestheticMLP(text_config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        """The standardised reward [B, 1] (the package's ``score_gard``)."""
        image_embeds = self.visual_encoder(pixel_values=pixels).last_hidden_state
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=pixels.device)
        text = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask,
                                 encoder_hidden_states=image_embeds, encoder_attention_mask=image_atts,
                                 is_decoder=False).last_hidden_state
        return (self.mlp(text[:, 0, :]) - REWARD_MEAN) / REWARD_STD
