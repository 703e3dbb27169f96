"""The toy world's tiny SD3-architecture model: configs, an offline word-level tokenizer, the folder.

Same classes as SD3.5-Medium (``SD3Transformer2DModel`` with RMS q/k-norm and a dual-attention
layer, ``AutoencoderKL``, two ``CLIPTextModelWithProjection``, optional ``T5EncoderModel``,
``FlowMatchEulerDiscreteScheduler`` with shift 3), scaled down to 32 x 32 images and 4 x 8 x 8
latents, and saved with ``save_pretrained`` so it loads through ``SD3Policy.from_pretrained``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")  # eos id 3: CLIP pools at the first eos
MAX_TOKENS = 16
IMAGE_SIZE = 32
LATENT_CHANNELS = 4
CLIP_HIDDEN = 32
T5_HIDDEN = 64


def word_tokenizer(words: Sequence[str], max_length: int = MAX_TOKENS):
    """A lower-casing, whitespace-splitting word-level tokenizer built offline (no vocabulary download)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in sorted({w.lower() for w in words}):
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>", model_max_length=max_length)


def build_pipeline(words: Sequence[str], with_t5: bool = False, seed: int = 0, image_size: int = IMAGE_SIZE):
    """A randomly initialised tiny ``StableDiffusion3Pipeline`` (deterministic from ``seed``)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    tokenizer = word_tokenizer(words)
    vocab_size = len(tokenizer)

    def clip_encoder() -> CLIPTextModelWithProjection:
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=vocab_size, hidden_size=CLIP_HIDDEN, intermediate_size=2 * CLIP_HIDDEN, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=MAX_TOKENS, projection_dim=CLIP_HIDDEN,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id))

    vae = tiny_vae(image_size)
    latent_size = image_size // 4
    transformer = SD3Transformer2DModel(
        sample_size=latent_size, patch_size=2, in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS,
        num_layers=4, attention_head_dim=32, num_attention_heads=4, joint_attention_dim=T5_HIDDEN,
        caption_projection_dim=128, pooled_projection_dim=2 * CLIP_HIDDEN, pos_embed_max_size=latent_size,
        qk_norm="rms_norm", dual_attention_layers=(0,))
    text_encoder_3 = tokenizer_3 = None
    if with_t5:
        text_encoder_3 = tiny_t5(tokenizer)
        tokenizer_3 = word_tokenizer(words)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=clip_encoder(), tokenizer=tokenizer, text_encoder_2=clip_encoder(), tokenizer_2=word_tokenizer(words),
        text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3)


def tiny_vae(image_size: int = IMAGE_SIZE):
    """The toy world's ``AutoencoderKL``: 3 blocks (×4 down), LATENT_CHANNELS latents, no scaling."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32), layers_per_block=1, norm_num_groups=8, sample_size=image_size,
        use_quant_conv=False, use_post_quant_conv=False, scaling_factor=1.0, shift_factor=0.0)


def tiny_t5(tokenizer):
    """A one-layer ``T5EncoderModel`` of width T5_HIDDEN over ``tokenizer``'s vocabulary."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=T5_HIDDEN, d_kv=16, d_ff=128, num_layers=1, num_heads=4,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=0))


def save_pipeline(pipe, folder: str | Path) -> Path:
    """Write the pipeline in diffusers' folder layout (safetensors weights, JSON configs)."""
    folder = Path(folder)
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder
