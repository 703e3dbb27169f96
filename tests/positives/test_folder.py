"""The folder:DIR source: a metadata.jsonl or a positives manifest, every path and image checked first."""

from __future__ import annotations

import json

from PIL import Image

from recast_cli.artifacts import read_positives
from tests.positives.common import assert_one_line_exit_2, prompts_file, recast

PROMPTS = ["a cat", "a dog"]


def image_folder(tmp_path, size=(40, 24)):
    folder = tmp_path / "src"
    folder.mkdir()
    lines = []
    for p, prompt in enumerate(PROMPTS):
        for s in range(2):
            Image.new("RGB", size, (50 * p, 100, 20 * s)).save(folder / f"{p}-{s}.png")
            lines.append(json.dumps({"file_name": f"{p}-{s}.png", "prompt": prompt}))
    (folder / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def run(tmp_path, folder, n=2, out="out"):
    return recast("sample-positive", "--prompts", prompts_file(tmp_path, PROMPTS), "--source", f"folder:{folder}",
                  "--resolution", 16, "--n", n, "--out", tmp_path / out)


def test_folder_with_metadata_becomes_normalised_positives(tmp_path):
    folder = image_folder(tmp_path)
    result = run(tmp_path, folder)
    assert result.exit_code == 0, result.stderr
    positives = read_positives(tmp_path / "out")
    assert positives.prompts() == PROMPTS and len(positives.samples) == 4
    with Image.open(tmp_path / "out" / positives.for_prompt(1)[1].image_path) as image:
        assert image.size == (16, 16) and image.getpixel((8, 8)) == (50, 100, 20)
    assert any(s["path"].endswith("metadata.jsonl") for s in [x.to_json() for x in positives.provenance.sources])


def test_a_positives_folder_is_a_folder_source_too(tmp_path):
    assert run(tmp_path, image_folder(tmp_path)).exit_code == 0
    result = run(tmp_path, tmp_path / "out", n=1, out="again")
    assert result.exit_code == 0, result.stderr
    assert len(read_positives(tmp_path / "again").samples) == 2


def test_missing_image_is_named_and_nothing_is_written(tmp_path):
    folder = image_folder(tmp_path)
    (folder / "1-1.png").unlink()
    assert_one_line_exit_2(run(tmp_path, folder), "1-1.png is missing")
    assert not (tmp_path / "out").exists()


def test_undecodable_image_is_named_and_nothing_is_written(tmp_path):
    folder = image_folder(tmp_path)
    (folder / "0-1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    assert_one_line_exit_2(run(tmp_path, folder), "0-1.png cannot be decoded")
    assert not (tmp_path / "out").exists()


def test_too_few_images_for_a_prompt(tmp_path):
    assert_one_line_exit_2(run(tmp_path, image_folder(tmp_path), n=3), "has 2 image(s) for prompt 'a cat'")


def test_manifest_whose_sha256_does_not_match_its_image_is_bad_input(tmp_path):
    assert run(tmp_path, image_folder(tmp_path)).exit_code == 0
    first = read_positives(tmp_path / "out").samples[0].image_path
    Image.new("RGB", (16, 16)).save(tmp_path / "out" / first)
    assert_one_line_exit_2(run(tmp_path, tmp_path / "out", out="again"), "does not match its sha256")
    assert not (tmp_path / "again").exists()


def test_metadata_paths_may_not_leave_the_folder(tmp_path):
    folder = image_folder(tmp_path)
    (folder / "metadata.jsonl").write_text(json.dumps({"file_name": "../x.png", "prompt": "a cat"}) + "\n")
    assert_one_line_exit_2(run(tmp_path, folder), "leaves the folder")
