"""`recast score` and `recast serve-reward` through the real CLI, and their bad-input contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from recast_cli.rewards import build_scorer
from recast_cli.artifacts import IMAGE_SCORES_SCHEMA, read_image_scores
from tests.rewards.conftest import noise_images, text_image
from tests.test_cli import assert_one_line_exit_2, recast


@pytest.fixture
def image_dir(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    text_image("Hello World").save(folder / "a.png")
    text_image("Helo Wrld").save(folder / "b.png")
    noise_images(1)[0].save(folder / "c.png")
    return folder


def test_score_writes_one_row_per_image_and_scorer(image_dir, tiny_clip_dir, tmp_path):
    out = tmp_path / "S.parquet"
    result = recast("score", "--rewards", "ocr,clip", "--images", image_dir, "--prompt", 'a sign "Hello World"',
                    "--reward-weights", f"clip={tiny_clip_dir}", "--batch-size", "2", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "wrote" in result.stdout and "ocr" in result.stdout
    table = read_image_scores(out)
    rows = table.to_pylist()
    assert [(r["image"].rsplit("/", 1)[1], r["scorer"]) for r in rows] == [
        ("a.png", "ocr"), ("a.png", "clip"), ("b.png", "ocr"), ("b.png", "clip"), ("c.png", "ocr"), ("c.png", "clip")]
    ocr = {r["image"].rsplit("/", 1)[1]: r for r in rows if r["scorer"] == "ocr"}
    assert ocr["a.png"]["score"] == 1.0 and ocr["b.png"]["score"] == pytest.approx(0.8)
    assert ocr["c.png"]["ocr_text"] == "" and ocr["b.png"]["ocr_text"] == "Helo Wrld"
    assert all(r["ocr_text"] is None for r in rows if r["scorer"] == "clip")
    clip = build_scorer("clip", weights=tiny_clip_dir)
    images = [text_image("Hello World"), text_image("Helo Wrld"), noise_images(1)[0]]
    np.testing.assert_allclose([r["score"] for r in rows if r["scorer"] == "clip"],
                               clip.score(images, ['a sign "Hello World"'] * 3), rtol=1e-5)
    meta = table.schema.metadata
    assert json.loads(meta[b"schema"]) == IMAGE_SCORES_SCHEMA
    assert len(json.loads(meta[b"sources"])) == 3


def test_score_takes_image_files_and_a_prompts_file_in_order(image_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('"Helo Wrld"\n"Hello World"\n')
    out = tmp_path / "S.parquet"
    result = recast("score", "--rewards", "ocr", "--images", image_dir / "b.png", image_dir / "a.png",
                    "--prompts", prompts, "--out", out)
    assert result.exit_code == 0, result.stderr
    assert pq.read_table(out).column("score").to_pylist() == [1.0, 1.0]


def test_score_scores_through_a_reward_server(image_dir, tmp_path):
    from recast_cli.rewards.server import make_server
    from tests.rewards.fakes import running

    out = tmp_path / "S.parquet"
    with running(make_server(build_scorer("ocr"), token="t0k")) as url:
        result = recast("score", "--rewards", f"ocr@{url}", "--opt", "ocr.token=t0k", "--images", image_dir / "a.png",
                        "--prompt", '"hello world"', "--out", out)
    assert result.exit_code == 0, result.stderr
    rows = pq.read_table(out).to_pylist()
    assert [(r["scorer"], r["score"], r["ocr_text"]) for r in rows] == [("ocr", 1.0, "Hello World")]
    assert b"t0k" not in out.read_bytes()


def test_the_deprecated_weights_flag_still_scores_and_warns_once(image_dir, tiny_clip_dir, tmp_path):
    """--weights means W in train and report; score took it for a scorer's weights: it still works, with a warning."""
    new, old = tmp_path / "new.parquet", tmp_path / "old.parquet"
    common = ["--rewards", "clip", "--images", image_dir, "--prompt", "a sign", "--batch-size", "2"]
    assert recast("score", *common, "--reward-weights", f"clip={tiny_clip_dir}", "--out", new).exit_code == 0
    result = recast("score", *common, "--weights", f"clip={tiny_clip_dir}", "--out", old)
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip().splitlines() == ["warning: --weights is deprecated for score; use --reward-weights"]
    assert [r["score"] for r in read_image_scores(old).to_pylist()] == \
        [r["score"] for r in read_image_scores(new).to_pylist()]


def test_serve_reward_refuses_both_weights_flags(tmp_path):
    result = recast("serve-reward", "toy_color", "--reward-weights", "a", "--weights", "b")
    assert_one_line_exit_2(result, "give --reward-weights (not the deprecated --weights) once")


@pytest.mark.parametrize(("args", "needle"), [
    (["--rewards", "ocr,nope"], "unknown scorer 'nope'"),
    (["--rewards", "clip", "--reward-weights", "clip=/no/such/model"], "does not exist"),
    (["--rewards", "ocr", "--prompt", "no quotes here"], "no quoted text"),
    (["--rewards", "ocr", "--prompt", '"x"', "--prompts", "p.txt"], "exactly one of --prompt"),
    (["--rewards", "ocr", "--opt", "clip.device=cpu"], "not in --rewards"),
    (["--rewards", "ocr", "--opt", "ocr.colour=red"], "ocr: unknown option colour"),
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(image_dir, tmp_path, args, needle):
    out = tmp_path / "S.parquet"
    if "--prompt" not in args and "--prompts" not in args:
        args = [*args, "--prompt", '"x"']
    result = recast("score", *args, "--images", image_dir, "--out", out)
    assert_one_line_exit_2(result, needle)
    assert not out.exists()


def test_an_image_that_cannot_be_decoded_is_bad_input(image_dir, tmp_path):
    broken = image_dir / "broken.png"
    broken.write_bytes(b"\x89PNG not really")
    result = recast("score", "--rewards", "ocr", "--images", broken, "--prompt", '"x"', "--out", tmp_path / "S.parquet")
    assert_one_line_exit_2(result, "broken.png: cannot decode the image")


def test_a_prompts_file_of_another_length_is_bad_input(image_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('"a"\n"b"\n')
    result = recast("score", "--rewards", "ocr", "--images", image_dir, "--prompts", prompts,
                    "--out", tmp_path / "S.parquet")
    assert_one_line_exit_2(result, "2 prompts for 3 images")


def test_an_unreachable_reward_server_is_bad_input(image_dir, tmp_path):
    from tests.rewards.test_remote import free_port

    result = recast("score", "--rewards", f"ocr@http://127.0.0.1:{free_port()}", "--opt", "ocr.retries=1",
                    "--images", image_dir, "--prompt", '"x"', "--out", tmp_path / "S.parquet")
    assert_one_line_exit_2(result, "unreachable after 1 tries")


def test_serve_reward_of_an_unknown_scorer_is_bad_input():
    assert_one_line_exit_2(recast("serve-reward", "nope", "--port", "0"), "unknown scorer 'nope'")


def test_serve_reward_serves_a_scorer_until_stopped(tmp_path):
    env = {**os.environ, "RECAST_REWARD_TOKEN": "env-token"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "recast"), "serve-reward", "ocr", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "serving ocr on http://127.0.0.1:" in line and "token required" in line and "env-token" not in line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        remote = build_scorer(f"ocr@{url}", token="env-token")
        assert remote.score([text_image("RECAST")], ['"recast"']).tolist() == [1.0]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stdout.close()
        proc.stderr.close()
