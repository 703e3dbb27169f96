"""Checks run by ``test_isolated_scorers`` in a subprocess: recast's adapters against the real packages.

Each builds a randomly initialised model with the package's own classes, saves it the way
the real weights ship, loads it through recast's loader and compares recast's batched
scores with the package's own one-image scoring.

* ``imagereward``: ImageReward (BLIP ViT-L + a 2-layer BERT cross-attention encoder + MLP),
  with a tiny bert-base-uncased tokenizer in the HF cache at $HF_HUB_CACHE;
* ``hpsv3``: HPSv3's ``Qwen2VLRewardModelBT`` on a tiny Qwen2-VL (byte-level BPE, 2 layers),
  configured by a copy of the package's HPSv3_7B.yaml pointing at it.

Usage: HF_HUB_CACHE=DIR/hf HF_HUB_OFFLINE=1 python -m tests.rewards.package_checks imagereward|hpsv3 DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

PROMPTS = ["a photo of a cat", "a red dog", "cat"]


def sample_images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (96 + 32 * i, 128, 3), dtype=np.uint8)) for i in range(3)]


def save_bert_vocab(cache: Path) -> list[str]:
    repo = cache / "models--bert-base-uncased"
    snapshot = repo / "snapshots" / "0000"
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("0000")
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *"0123456789", *("##" + c for c in letters),
             "a", "photo", "of", "cat", "dog", "red"]
    (snapshot / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return vocab


def check_imagereward(folder: Path) -> None:
    vocab = save_bert_vocab(Path(os.environ["HF_HUB_CACHE"]))
    med_config = folder / "med_config.json"
    med_config.write_text(json.dumps({
        "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu", "hidden_size": 768,
        "intermediate_size": 1024, "num_attention_heads": 12, "num_hidden_layers": 2, "layer_norm_eps": 1e-12,
        "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1, "initializer_range": 0.02,
        "max_position_embeddings": 512, "pad_token_id": 0, "type_vocab_size": 2,
        "vocab_size": len(vocab) + 2, "encoder_width": 1024, "add_cross_attention": True,
    }))
    from ImageReward.ImageReward import ImageReward

    torch.manual_seed(0)
    model = ImageReward(med_config=str(med_config))
    with torch.no_grad():
        for p in model.mlp.parameters():
            p.normal_(0, 0.05)  # the package's init makes every reward equal; spread them
    checkpoint = folder / "ImageReward.pt"
    torch.save(model.state_dict(), checkpoint)

    from recast_cli.rewards import build_scorer

    images, prompts = sample_images(), PROMPTS
    scorer = build_scorer("imagereward", weights=checkpoint, med_config=med_config, batch_size=2)
    ours = scorer.score(images, prompts)
    theirs = np.array([scorer.model.score(p, im) for p, im in zip(prompts, images)])
    print("recast", ours.tolist(), "package", theirs.tolist())
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    assert np.ptp(ours) > 1e-4, "scores should differ between images"
    print("OK")


def save_tiny_qwen2vl(folder: Path) -> Path:
    """A 2-layer Qwen2-VL with a byte-level BPE tokenizer (no merges) and the chat-template tokens HPSv3 uses."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (Qwen2TokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                              Qwen2VLImageProcessor, Qwen2VLProcessor)
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>"]
    bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(bytes_to_unicode().values())}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(specials)
    template = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
                "{{ message['content'] }}{% else %}{% for c in message['content'] %}{% if c['type'] == 'image' %}"
                "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
                "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    tokenizer = Qwen2TokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None, chat_template=template)
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in specials}
    config = Qwen2VLConfig(
        vocab_size=len(tokenizer) + 8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rope_scaling={"type": "mrope", "mrope_section": [2, 2, 4]},
        vision_config={"depth": 1, "embed_dim": 32, "num_heads": 2, "hidden_size": 64, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(config).save_pretrained(folder)
    Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tokenizer,
                     chat_template=template).save_pretrained(folder)
    return folder


def check_hpsv3(folder: Path) -> None:
    import hpsv3
    import safetensors.torch
    import yaml
    from hpsv3.train import create_model_and_processor
    from hpsv3.utils.parser import DataConfig, ModelConfig, PEFTLoraConfig, TrainingConfig, parse_args_with_yaml

    base = save_tiny_qwen2vl(folder / "tiny-qwen2vl")
    config = yaml.safe_load((Path(hpsv3.__file__).parent / "config" / "HPSv3_7B.yaml").read_text())
    config.update(model_name_or_path=str(base), bf16=False, torch_dtype="float32", disable_flash_attn2=True,
                  deepspeed=None, gradient_checkpointing=False, report_to="none")
    config_path = folder / "HPSv3_tiny.yaml"
    config_path.write_text(yaml.safe_dump(config))
    (_, training_args, model_config, lora_config), _ = parse_args_with_yaml(
        (DataConfig, TrainingConfig, ModelConfig, PEFTLoraConfig), str(config_path), is_train=False)
    model, _, _ = create_model_and_processor(model_config=model_config, peft_lora_config=lora_config,
                                             training_args=training_args)
    checkpoint = folder / "HPSv3.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, checkpoint)

    from recast_cli.rewards import build_scorer

    images, prompts = sample_images(), PROMPTS
    scorer = build_scorer("hpsv3", weights=checkpoint, config=config_path, batch_size=2)
    ours = scorer.score(images, prompts)
    with torch.inference_mode():
        theirs = np.array([float(scorer.inferencer.reward([im], [p])[0, 0]) for im, p in zip(images, prompts)])
    print("recast", ours.tolist(), "package", theirs.tolist())
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)
    print("OK")


CHECKS = {"imagereward": check_imagereward, "hpsv3": check_hpsv3}

if __name__ == "__main__":
    CHECKS[sys.argv[1]](Path(sys.argv[2]))
