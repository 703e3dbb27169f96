"""The toy world's procedural renderer: vocabulary, determinism, geometry and batch form."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recast_cli.errors import BadInput
from recast_cli.toy.renderer import (AREA_RANGE, BACKGROUNDS, COLOR_JITTER, COLORS, SHAPES, all_prompts, coverage,
                                     parse_prompt, render, render_batch)


def test_vocabulary_has_every_colour_shape_background_prompt_once():
    prompts = all_prompts()
    assert len(prompts) == len(set(prompts)) == 4 * 3 * 2
    assert {parse_prompt(p) for p in prompts} == {(c, s, b) for c in COLORS for s in SHAPES for b in BACKGROUNDS}
    assert parse_prompt("A  Red circle on a WHITE background ") == ("red", "circle", "white")


@pytest.mark.parametrize("prompt", ["a purple circle on a white background", "a red star on a black background",
                                    "a red circle on a grey background", "red circle", ""])
def test_prompt_outside_the_vocabulary_is_bad_input_listing_it(prompt):
    with pytest.raises(BadInput) as err:
        parse_prompt(prompt)
    message = str(err.value)
    assert "\n" not in message
    assert all(word in message for word in (*COLORS, *SHAPES, *BACKGROUNDS))


def test_render_is_deterministic_in_the_seed_and_varies_with_it():
    prompt = "a blue square on a white background"
    first, again = np.asarray(render(prompt, 7)), np.asarray(render(prompt, 7))
    assert render(prompt, 7).mode == "RGB" and first.shape == (32, 32, 3)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, np.asarray(render(prompt, 8)))


@pytest.mark.parametrize("size", [32, 64])
def test_border_is_the_background_and_the_interior_the_prompted_colour(size):
    for i, prompt in enumerate(all_prompts()):
        color, _, bg = parse_prompt(prompt)
        img = np.asarray(render(prompt, 100 + i, size)).astype(int)
        border = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
        assert (border == BACKGROUNDS[bg]).all()
        inside = coverage(parse_prompt(prompt)[1], 100 + i, size) == 1.0
        assert inside.sum() > 0.05 * size * size
        assert np.abs(img[inside] - np.array(COLORS[color])).max() <= COLOR_JITTER + 1


def test_geometry_varies_with_the_seed_and_is_shared_across_prompts():
    masks = np.stack([coverage("triangle", seed, 32) for seed in range(200)])
    area = masks.sum((1, 2)) / 32**2
    assert AREA_RANGE[0] - 0.02 < area.min() and area.max() < AREA_RANGE[1] + 0.02
    assert area.std() > 0.02
    ys, xs = np.mgrid[0:32, 0:32]
    cx = (masks * xs).sum((1, 2)) / masks.sum((1, 2))
    assert cx.max() - cx.min() > 5.0  # positions spread over pixels, not a fixed layout
    # Anti-aliased edges: partial coverage exists.
    assert ((masks > 0.05) & (masks < 0.95)).any(axis=(1, 2)).all()
    red = np.asarray(render("a red triangle on a black background", 5)).astype(int)
    blue = np.asarray(render("a blue triangle on a white background", 5)).astype(int)
    np.testing.assert_array_equal(red.any(-1), (blue != 255).any(-1))


def test_squares_and_triangles_are_rotated_by_small_seed_dependent_angles():
    masks = [coverage("square", seed, 64) for seed in range(40)]
    ys, xs = np.mgrid[0:64, 0:64] + 0.5
    angles = []
    for m in masks:
        z = (xs - (m * xs).sum() / m.sum()) + 1j * (ys - (m * ys).sum() / m.sum())
        angles.append(np.degrees(np.angle(-(m * z**4).sum())) / 4)  # 4-fold orientation of a square
    angles = np.abs(np.array(angles))
    assert angles.max() < 16.0 and angles.max() > 8.0


def test_render_batch_matches_render_pixel_for_pixel():
    prompts = all_prompts()[:6]
    seeds = [3, 1, 4, 1, 5, 9]
    batch = render_batch(prompts, seeds, 64)
    assert batch.shape == (6, 3, 64, 64) and batch.dtype == torch.float32
    assert 0.0 <= float(batch.min()) and float(batch.max()) <= 1.0
    for i, (p, s) in enumerate(zip(prompts, seeds)):
        expected = torch.from_numpy(np.array(render(p, s, 64))).permute(2, 0, 1).float() / 255
        torch.testing.assert_close(batch[i], expected, rtol=0, atol=0)


def test_bad_seed_size_and_lengths_are_bad_input():
    prompt = all_prompts()[0]
    with pytest.raises(BadInput, match="seed"):
        render(prompt, -1)
    with pytest.raises(BadInput, match="size"):
        render(prompt, 0, size=4)
    with pytest.raises(BadInput, match="one seed per prompt"):
        render_batch([prompt, prompt], [0])
    with pytest.raises(BadInput, match="toy vocabulary"):
        render_batch(["a cat"], [0])
