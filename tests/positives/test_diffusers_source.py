"""diffusers:PATH: a local text-to-image pipeline (a tiny SD3) as the strong generator, seeds recorded."""

from __future__ import annotations

from PIL import Image

from recast_cli.artifacts import read_positives
from tests.positives.common import assert_one_line_exit_2, prompts_file, recast


def test_diffusers_pipeline_positives_record_their_seeds(tmp_path, tiny_pipeline):
    result = recast("sample-positive", "--prompts", prompts_file(tmp_path), "--source", f"diffusers:{tiny_pipeline}",
                    "--resolution", 16, "--n", 2, "--steps", 1, "--batch", 3, "--device", "cpu", "--seed", 5,
                    "--out", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    positives = read_positives(tmp_path / "out")
    assert [s.seed for s in positives.samples] == [5, 6, 100_005, 100_006]
    assert {s.source for s in positives.samples} == {"diffusers"}
    with Image.open(tmp_path / "out" / positives.samples[0].image_path) as image:
        assert image.size == (16, 16)  # the pipeline's 32 x 32 output, resized
    assert positives.meta["source"] == {"kind": "diffusers", "path": str(tiny_pipeline.resolve()), "steps": 1,
                                        "cfg": None}


def test_a_folder_without_model_index_is_bad_input(tmp_path):
    result = recast("sample-positive", "--prompts", prompts_file(tmp_path), "--source", f"diffusers:{tmp_path}",
                    "--resolution", 16, "--n", 1, "--out", tmp_path / "out")
    assert_one_line_exit_2(result, "no model_index.json")
    assert not (tmp_path / "out").exists()
