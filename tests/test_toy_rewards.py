"""Toy rewards: high on renderer images, low on mismatches, and sensitive at their own scale.

The timing claim (colour coarse, shape mid, sharpness fine) is checked as sensitivity to
perturbations of different spatial scale: a colour shift (coarse) against blurs of growing
width (fine first, then mid).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

from recast_cli.errors import BadInput
from recast_cli.rewards.registry import build_scorer
from recast_cli.toy.renderer import COLORS, SHAPES, all_prompts, parse_prompt, render
from recast_cli.toy.rewards import ToyColor, ToyShape, ToySharpness

SCORERS = {"color": ToyColor(), "shape": ToyShape(), "sharpness": ToySharpness()}


@pytest.fixture(scope="module")
def rendered() -> tuple[list[Image.Image], list[str]]:
    prompts = [all_prompts()[i % 24] for i in range(240)]
    return [render(p, seed) for seed, p in enumerate(prompts)], prompts


def scores(images, prompts) -> dict[str, np.ndarray]:
    return {key: scorer.score(images, prompts) for key, scorer in SCORERS.items()}


def swap(prompt: str, colour: bool = False, shape: bool = False) -> str:
    c, s, b = parse_prompt(prompt)
    colours = list(COLORS)
    c = colours[(colours.index(c) + 1) % len(colours)] if colour else c
    s = SHAPES[(SHAPES.index(s) + 1) % len(SHAPES)] if shape else s
    return f"a {c} {s} on a {b} background"


def blur(images, radius):
    return [im.filter(ImageFilter.GaussianBlur(radius)) for im in images]


def colour_shift(images):
    """Rotate the RGB channels: every palette colour becomes another hue; edges stay where they are."""
    return [Image.fromarray(np.asarray(im)[..., [1, 2, 0]]) for im in images]


def test_registry_builds_the_three_toy_scorers():
    for name, cls in (("toy_color", ToyColor), ("toy_shape", ToyShape), ("toy_sharpness", ToySharpness)):
        scorer = build_scorer(name)
        assert isinstance(scorer, cls) and scorer.name == name and scorer.output_range == (0.0, 1.0)


def test_renderer_images_score_high_on_all_three(rendered):
    got = scores(*rendered)
    for values in got.values():
        assert values.dtype == np.float64 and values.shape == (240,)
        assert ((values >= 0) & (values <= 1)).all()
    assert got["color"].mean() >= 0.95 and got["color"].min() >= 0.9
    assert got["shape"].mean() >= 0.9 and got["shape"].min() >= 0.8
    assert got["sharpness"].mean() >= 0.8


def test_wrong_colour_prompts_score_low_on_colour_only(rendered):
    images, prompts = rendered
    right, wrong = scores(images, prompts), scores(images, [swap(p, colour=True) for p in prompts])
    assert wrong["color"].mean() < 0.05 and wrong["color"].max() < 0.2
    np.testing.assert_array_equal(wrong["shape"], right["shape"])
    np.testing.assert_array_equal(wrong["sharpness"], right["sharpness"])


def test_wrong_shape_prompts_score_low_on_shape_only(rendered):
    images, prompts = rendered
    right, wrong = scores(images, prompts), scores(images, [swap(p, shape=True) for p in prompts])
    assert wrong["shape"].mean() < 0.05 and wrong["shape"].max() < 0.3
    np.testing.assert_array_equal(wrong["color"], right["color"])


def test_pure_noise_scores_low_on_shape_and_chance_on_colour(rendered):
    _, prompts = rendered
    rng = np.random.default_rng(0)
    noise = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in prompts]
    got = scores(noise, prompts)
    assert got["shape"].mean() < 0.3
    assert got["color"].mean() < 0.4  # four colours: chance is 1/4


def test_blank_images_score_zero():
    prompts = ["a red circle on a white background", "a blue square on a black background"]
    blank = [Image.new("RGB", (32, 32), (255, 255, 255)), Image.new("RGB", (32, 32), (0, 0, 0))]
    for values in scores(blank, prompts).values():
        np.testing.assert_array_equal(values, 0.0)


def test_blur_lowers_sharpness_and_keeps_colour(rendered):
    images, prompts = rendered
    sharp, blurred = scores(images, prompts), scores(blur(images, 1.0), prompts)
    assert blurred["sharpness"].mean() < 0.5 * sharp["sharpness"].mean()
    assert (blurred["sharpness"] < sharp["sharpness"]).all()
    assert blurred["color"].mean() > 0.95


def test_coarse_perturbation_moves_colour_and_fine_perturbation_moves_sharpness(rendered):
    images, prompts = rendered
    base = scores(images, prompts)
    coarse, fine = scores(colour_shift(images), prompts), scores(blur(images, 0.7), prompts)
    drop = {key: {"coarse": base[key].mean() - coarse[key].mean(), "fine": base[key].mean() - fine[key].mean()}
            for key in base}
    assert drop["color"]["coarse"] > 0.9 and abs(drop["color"]["fine"]) < 0.02
    assert drop["sharpness"]["fine"] > 0.3 and abs(drop["sharpness"]["coarse"]) < 0.02
    assert abs(drop["shape"]["coarse"]) < 0.02  # a hue change does not move the outline


def test_growing_blur_removes_sharpness_first_then_shape_then_colour(rendered):
    images, prompts = rendered
    base = scores(images, prompts)
    for radius in (0.7, 1.5, 2.5):
        kept = {key: values.mean() / base[key].mean() for key, values in scores(blur(images, radius), prompts).items()}
        assert kept["sharpness"] < kept["shape"] < kept["color"], (radius, kept)
    assert kept["shape"] < 0.6 and kept["color"] > 0.9


def test_scores_do_not_depend_on_the_batch_and_mix_sizes(rendered):
    images, prompts = rendered
    big = [render(p, 1000 + i, 64) for i, p in enumerate(prompts[:4])]
    mixed_images = [images[0], big[0], images[1], big[1]]
    mixed_prompts = [prompts[0], prompts[0], prompts[1], prompts[1]]
    for scorer in SCORERS.values():
        together = scorer.score(mixed_images, mixed_prompts)
        alone = np.array([scorer.score([im], [p])[0] for im, p in zip(mixed_images, mixed_prompts)])
        np.testing.assert_allclose(together, alone, rtol=1e-6, atol=1e-9)
        assert (together > 0.7).all() or scorer.name == "toy_sharpness"


def test_mismatched_lengths_and_unknown_prompts_are_bad_input(rendered):
    images, prompts = rendered
    for scorer in SCORERS.values():
        with pytest.raises(BadInput, match="2 images but 1 prompts"):
            scorer.score(images[:2], prompts[:1])
        with pytest.raises(BadInput, match="toy vocabulary"):
            scorer.score(images[:1], ["a photo of a cat"])


def test_tensor_batches_score_like_pil_images(rendered):
    images, prompts = rendered
    tensor = torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255 for im in images[:24]])
    for scorer in SCORERS.values():
        np.testing.assert_allclose(scorer.score(tensor, prompts[:24]), scorer.score(images[:24], prompts[:24]),
                                   rtol=1e-5, atol=1e-6)
