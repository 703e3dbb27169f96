"""clip, pick, hps and aesthetic on tiny same-architecture models loaded through the production loaders.

Each score is checked against a direct computation of its documented formula through a
different code path (the models' own forward passes and processors).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from recast_cli.errors import BadInput
from recast_cli.rewards import build_scorer
from tests.rewards.conftest import noise_images
from tests.rewards.tiny_models import HPS_ARCH, IMAGE_SIZE

PROMPTS = ["a red cube", "two cats on a sofa", 'a sign that says "recast"', "x"]
CLIP_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)
CLIP_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)


def normalised_pixels(images: list[Image.Image]) -> torch.Tensor:
    """(x/255 − mean)/std for images already at the model's input size (resize and crop are identities)."""
    x = torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255 for im in images])
    return (x - CLIP_MEAN) / CLIP_STD


def hf_clip(path):
    from transformers import CLIPModel, CLIPProcessor

    return CLIPModel.from_pretrained(path).eval(), CLIPProcessor.from_pretrained(path)


def test_clip_score_is_logits_per_image_over_30(tiny_clip_dir):
    images = noise_images(4)
    scores = build_scorer("clip", weights=tiny_clip_dir).score(images, PROMPTS)
    model, processor = hf_clip(tiny_clip_dir)
    text = processor.tokenizer(PROMPTS, padding="max_length", max_length=77, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(pixel_values=normalised_pixels(images), **text).logits_per_image
    assert scores.dtype == np.float64 and scores.shape == (4,)
    np.testing.assert_allclose(scores, logits.diagonal().double().numpy() / 30, rtol=1e-5, atol=1e-6)
    cos = logits.diagonal().double().numpy() / 50.0
    np.testing.assert_allclose(scores, 50.0 * cos / 30, rtol=1e-5, atol=1e-6)


def test_clip_scores_the_centre_crop_of_a_wide_image(tiny_clip_dir):
    scorer = build_scorer("clip", weights=tiny_clip_dir)
    centre, left, right = noise_images(3, seed=5)
    wide = Image.new("RGB", (3 * IMAGE_SIZE, IMAGE_SIZE))
    for i, part in enumerate((left, centre, right)):
        wide.paste(part, (i * IMAGE_SIZE, 0))
    np.testing.assert_allclose(scorer.score([wide], ["a cat"]), scorer.score([centre], ["a cat"]), rtol=1e-6)


def test_clip_output_range_is_exp_logit_scale_over_30(tiny_clip_dir):
    scorer = build_scorer("clip", weights=tiny_clip_dir)
    assert scorer.output_range == pytest.approx((-50 / 30, 50 / 30))


def test_pick_score_is_exp_logit_scale_times_cosine_over_26(tiny_clip_dir):
    images = noise_images(4, size=40, seed=3)
    scores = build_scorer("pick", weights=tiny_clip_dir, processor=tiny_clip_dir).score(images, PROMPTS)
    model, processor = hf_clip(tiny_clip_dir)
    inputs = processor(text=PROMPTS, images=images, padding=True, truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        out = model(**inputs)
    cos = (out.image_embeds * out.text_embeds).sum(-1).double()
    np.testing.assert_allclose(scores, (50.0 * cos / 26).numpy(), rtol=1e-5, atol=1e-6)


def test_aesthetic_is_the_mlp_of_normalised_clip_image_features(tiny_clip_dir, tiny_aesthetic_head):
    from recast_cli.rewards.aesthetic import AestheticMLP

    images = noise_images(3, size=48, seed=4)
    scores = build_scorer("aesthetic", weights=tiny_aesthetic_head, clip=tiny_clip_dir).score(images, ["", "", ""])
    model, processor = hf_clip(tiny_clip_dir)
    head = AestheticMLP(16).eval()
    head.load_state_dict(torch.load(tiny_aesthetic_head, weights_only=True))
    with torch.no_grad():
        embeds = model(**processor(text=["a"] * 3, images=images, return_tensors="pt")).image_embeds
        expected = head(embeds).squeeze(1).double().numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


def test_aesthetic_reads_the_head_from_safetensors_too(tiny_clip_dir, tiny_aesthetic_head, tmp_path):
    from safetensors.torch import save_file

    st = tmp_path / "head.safetensors"
    save_file(torch.load(tiny_aesthetic_head, weights_only=True), st)
    images = noise_images(2)
    a = build_scorer("aesthetic", weights=tiny_aesthetic_head, clip=tiny_clip_dir).score(images, ["", ""])
    b = build_scorer("aesthetic", weights=st, clip=tiny_clip_dir).score(images, ["", ""])
    np.testing.assert_array_equal(a, b)


def test_hps_is_the_cosine_of_normalised_open_clip_features(tiny_hps):
    import open_clip

    config, checkpoint = tiny_hps
    images = noise_images(4, seed=6)
    scores = build_scorer("hps", weights=checkpoint, arch=str(config)).score(images, PROMPTS)
    model = open_clip.create_model(HPS_ARCH, pretrained=None, output_dict=True).eval()
    model.load_state_dict(torch.load(checkpoint, weights_only=True)["state_dict"])
    with torch.no_grad():
        out = model(normalised_pixels(images), open_clip.get_tokenizer(HPS_ARCH)(PROMPTS))
    expected = (out["image_features"] @ out["text_features"].T).diagonal().double().numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(scores) <= 1)


def test_hps_pads_a_wide_image_to_a_square_after_resizing_its_longest_edge(tiny_hps):
    config, checkpoint = tiny_hps
    scorer = build_scorer("hps", weights=checkpoint, arch=str(config))
    strip = Image.new("RGB", (2 * IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    padded = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (0, 0, 0))
    padded.paste(Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE // 2), (255, 255, 255)), (0, IMAGE_SIZE // 4))
    np.testing.assert_allclose(scorer.score([strip], ["a"]), scorer.score([padded], ["a"]), atol=1e-5)


def test_hps_refuses_a_checkpoint_that_would_run_code_when_unpickled(tiny_hps, tmp_path):
    config, _ = tiny_hps
    evil = tmp_path / "evil.pt"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "hook": math.floor}, evil)
    with pytest.raises(BadInput, match="weights-only"):
        build_scorer("hps", weights=evil, arch=str(config))


def test_hps_refuses_a_checkpoint_of_another_architecture(tiny_hps, tmp_path):
    config, _ = tiny_hps
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {"visual.proj": torch.zeros(3, 3)}}, other)
    with pytest.raises(BadInput, match="does not fit"):
        build_scorer("hps", weights=other, arch=str(config))


@pytest.mark.parametrize("name", ["clip", "pick"])
def test_batched_scores_equal_one_at_a_time_scores(tiny_clip_dir, name):
    options = {"weights": tiny_clip_dir} | ({"processor": tiny_clip_dir} if name == "pick" else {})
    images = noise_images(4, seed=7)
    batched = build_scorer(name, batch_size=3, **options).score(images, PROMPTS)
    single = build_scorer(name, batch_size=1, **options).score(images, PROMPTS)
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-6)


def test_a_float_tensor_batch_scores_like_the_same_pil_images(tiny_clip_dir):
    images = noise_images(2, seed=8)
    tensor = torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255 for im in images])
    scorer = build_scorer("clip", weights=tiny_clip_dir)
    np.testing.assert_allclose(scorer.score(tensor, PROMPTS[:2]), scorer.score(images, PROMPTS[:2]), rtol=1e-6)
