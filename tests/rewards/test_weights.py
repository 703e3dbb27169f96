"""Weights come from the option, an environment variable or the local HF cache; nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from recast_cli.errors import BadInput
from recast_cli.rewards import build_scorer, scorer_names
from tests.rewards.conftest import noise_images


def test_the_registry_names_every_scorer_of_the_paper():
    assert {"clip", "hps", "pick", "ocr", "geneval", "aesthetic", "imagereward", "hpsv3",
            "unifiedreward"} <= set(scorer_names())


def test_an_unknown_scorer_is_bad_input():
    with pytest.raises(BadInput, match="unknown scorer 'clipp'"):
        build_scorer("clipp")


def test_a_missing_required_option_is_bad_input():
    with pytest.raises(BadInput, match="remote: needs option url"):
        build_scorer("remote")


def test_an_unknown_option_is_bad_input():
    with pytest.raises(BadInput, match="clip: unknown option colour"):
        build_scorer("clip", colour="red")


@pytest.mark.parametrize(("name", "needles"), [
    ("clip", ["--reward-weights clip=PATH", "RECAST_CLIP_PATH", "openai/clip-vit-large-patch14"]),
    ("pick", ["--reward-weights pick=PATH", "RECAST_PICK_PATH", "yuvalkirstain/PickScore_v1"]),
    ("hps", ["--reward-weights hps=PATH", "RECAST_HPS_PATH", "xswu/HPSv2/HPS_v2.1_compressed.pt"]),
    ("aesthetic", ["--opt aesthetic.clip=PATH", "RECAST_CLIP_PATH"]),
])
def test_missing_weights_name_the_flag_the_variable_and_the_cache_entry(empty_hf_cache, name, needles):
    with pytest.raises(BadInput) as caught:
        build_scorer(name)
    message = str(caught.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_a_weight_path_that_does_not_exist_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        build_scorer("clip", weights=tmp_path / "nowhere")


def test_a_folder_without_a_model_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="not a transformers CLIP model folder"):
        build_scorer("clip", weights=tmp_path)


def test_the_environment_variable_points_at_the_weights(empty_hf_cache, tiny_clip_dir, monkeypatch):
    monkeypatch.setenv("RECAST_CLIP_PATH", str(tiny_clip_dir))
    images = noise_images(2)
    np.testing.assert_array_equal(build_scorer("clip").score(images, ["a", "b"]),
                                  build_scorer("clip", weights=tiny_clip_dir).score(images, ["a", "b"]))


def test_weights_are_found_in_the_local_hf_cache(empty_hf_cache, tiny_clip_dir):
    snapshot = empty_hf_cache / "models--openai--clip-vit-large-patch14" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for item in tiny_clip_dir.iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    refs = empty_hf_cache / "models--openai--clip-vit-large-patch14" / "refs"
    refs.mkdir()
    (refs / "main").write_text("0123abc")
    images = noise_images(2)
    np.testing.assert_array_equal(build_scorer("clip").score(images, ["a", "b"]),
                                  build_scorer("clip", weights=tiny_clip_dir).score(images, ["a", "b"]))


def test_images_and_prompts_must_pair_up(tiny_clip_dir):
    with pytest.raises(BadInput, match="2 images but 1 prompts"):
        build_scorer("clip", weights=tiny_clip_dir).score(noise_images(2), ["a"])
