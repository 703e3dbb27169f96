"""The run driver: renderer positives, normalisation, the manifest, and resuming an interrupted run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from PIL import Image

from recast_cli.artifacts import read_positives
from recast_cli.errors import BadInput
from recast_cli.positives.collect import JOURNAL_NAME, Job, Outcome, collect, normalise
from recast_cli.positives.renderer import RendererSource
from recast_cli.toy.renderer import all_prompts, render
from tests.positives.common import TOY_PROMPTS, prompts_file, recast


class Interrupting(RendererSource):
    """The renderer, stopped by Ctrl-C after ``after`` images."""

    def __init__(self, resolution: int, after: int):
        super().__init__(resolution)
        self.after = after

    def produce(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        for count, outcome in enumerate(super().produce(jobs)):
            if count == self.after:
                raise KeyboardInterrupt
            yield outcome


def rows(folder):
    return [(s.prompt_id, s.sample_id, s.image_path, s.seed, s.sha256) for s in read_positives(folder).samples]


def test_renderer_positives_through_the_cli_match_the_renderer(tmp_path):
    result = recast("sample-positive", "--setting", "toy", "--prompts", prompts_file(tmp_path), "--source", "renderer",
                    "--n", 3, "--out", tmp_path / "out", "--seed", 7)
    assert result.exit_code == 0, result.stderr
    positives = read_positives(tmp_path / "out")
    assert positives.prompts() == list(TOY_PROMPTS) and len(positives.samples) == 6
    assert positives.meta["resolution"] == 32 and positives.rewards() == ()
    sample = positives.for_prompt(1)[2]
    assert sample.seed == 7 + 100_000 + 2
    with Image.open(tmp_path / "out" / sample.image_path) as image:
        assert image.tobytes() == render(TOY_PROMPTS[1], sample.seed, 32).tobytes()
    assert not (tmp_path / "out" / JOURNAL_NAME).exists()
    assert "made now" in result.stdout


def test_the_toy_setting_without_a_prompts_file_uses_the_toy_vocabulary(tmp_path):
    result = recast("sample-positive", "--setting", "toy", "--source", "renderer", "--n", 1, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert read_positives(tmp_path / "out").prompts() == all_prompts()


def test_interrupted_run_resumes_to_the_same_manifest(tmp_path):
    prompts = list(TOY_PROMPTS)
    collect(RendererSource(32), prompts, 3, tmp_path / "whole", 32)
    with pytest.raises(KeyboardInterrupt):
        collect(Interrupting(32, after=4), prompts, 3, tmp_path / "part", 32)
    assert not (tmp_path / "part" / "manifest.parquet").exists() and (tmp_path / "part" / JOURNAL_NAME).exists()
    with open(tmp_path / "part" / JOURNAL_NAME, "a") as fh:
        fh.write('{"row": {"prompt_id": 1, "prom')  # the line being written when the run stopped
    report = collect(RendererSource(32), prompts, 3, tmp_path / "part", 32)
    assert (report.kept, report.new, report.redone) == (4, 2, 0)
    assert rows(tmp_path / "part") == rows(tmp_path / "whole")


def test_tampered_image_is_made_again_and_growing_n_keeps_the_rest(tmp_path):
    prompts = list(TOY_PROMPTS)
    collect(RendererSource(32), prompts, 2, tmp_path / "out", 32)
    before = rows(tmp_path / "out")
    (tmp_path / "out" / before[1][2]).write_bytes(b"not the image")
    report = collect(RendererSource(32), prompts, 3, tmp_path / "out", 32)
    assert (report.kept, report.redone, report.new) == (3, 1, 3)
    after = rows(tmp_path / "out")
    assert [r for r in after if r[1] < 2] == before and len(after) == 6


def test_a_folder_made_with_other_settings_is_refused(tmp_path):
    collect(RendererSource(32), list(TOY_PROMPTS), 1, tmp_path / "out", 32)
    with pytest.raises(BadInput, match="other resolution"):
        collect(RendererSource(16), list(TOY_PROMPTS), 1, tmp_path / "out", 16)
    with pytest.raises(BadInput, match="other seed"):
        collect(RendererSource(32), list(TOY_PROMPTS), 1, tmp_path / "out", 32, seed=3)


def test_normalise_centre_crops_then_resizes():
    image = Image.new("RGB", (60, 30), (0, 0, 255))
    image.paste((255, 0, 0), (15, 0, 45, 30))  # the centred 30 x 30 square is red, the sides blue
    out = normalise(image, 10)
    assert out.size == (10, 10) and out.mode == "RGB"
    assert {tuple(p) for p in np.asarray(out).reshape(-1, 3)} == {(255, 0, 0)}
    rgba = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    assert (np.asarray(normalise(rgba, 8)) == 255).all()  # transparency becomes white
