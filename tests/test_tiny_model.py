"""``recast tiny-model``: each family's real pipeline class, random weights, CPU-sized, loaded by the
family's own ``from_pretrained`` and run for a step; whole-or-nothing writes."""

from __future__ import annotations

import hashlib
import json

import pytest

from recast_cli.policy.families import FAMILIES
from recast_cli.policy.tiny import MANIFEST
from tests.test_cli import assert_one_line_exit_2, recast

PROMPT = "a red circle on a white background"


def pipeline_class(family: str):
    import diffusers

    return {"sd3": diffusers.StableDiffusion3Pipeline, "flux": diffusers.FluxPipeline,
            "qwenimage": diffusers.QwenImagePipeline}[family]


def run_one_step(family: str, folder):
    pipe = pipeline_class(family).from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    import torch

    options = {"sd3": {"guidance_scale": 4.5, "max_sequence_length": 16},
               "flux": {"guidance_scale": 3.5, "max_sequence_length": 16},
               "qwenimage": {"true_cfg_scale": 4.0, "negative_prompt": "a blue square"}}[family]
    return pipe(PROMPT, num_inference_steps=2, height=32, width=32, output_type="pt",
                generator=torch.Generator().manual_seed(0), **options).images


def weights_digest(folder) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_loads_with_its_own_from_pretrained_and_samples(family, tmp_path):
    out = tmp_path / family
    result = recast("tiny-model", "--family", family, "--out", out)
    assert result.exit_code == 0, result.stderr
    record = json.loads((out / MANIFEST).read_text())
    assert record["family"] == family and record["pipeline"] == pipeline_class(family).__name__
    assert 0 < record["parameters"]["transformer"] < 5_000_000  # seconds on a CPU
    images = run_one_step(family, out)
    assert tuple(images.shape) == (1, 3, 32, 32)
    again = tmp_path / f"{family}-again"
    assert recast("tiny-model", "--family", family, "--out", again).exit_code == 0
    assert weights_digest(out) == weights_digest(again)  # the seed fixes every weight


def test_bad_input_is_one_line_and_nothing_is_deleted(tmp_path):
    assert_one_line_exit_2(recast("tiny-model", "--family", "dalle", "--out", tmp_path / "m"),
                           "--family must be one of sd3, flux, qwenimage")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert_one_line_exit_2(recast("tiny-model", "--family", "sd3", "--out", taken), "is not an empty folder")
    assert (taken / "notes.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


# The README's smoke test (check-setting → estimate → solve-w → train → evaluate on a tiny folder)
# runs for every family in tests/test_families.py.
