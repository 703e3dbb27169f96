"""Bad input to `recast sample-positive`: one line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import pytest

from tests.positives.common import assert_one_line_exit_2, prompts_file, recast


def run(tmp_path, *args):
    return recast("sample-positive", "--out", tmp_path / "out", *args)


@pytest.mark.parametrize("source", ["dalle", "folder", "diffusers", "renderer:x", ""])
def test_unknown_source(tmp_path, source):
    assert_one_line_exit_2(run(tmp_path, "--setting", "toy", "--source", source, "--n", 1), "unknown source")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("n", [0, -3])
def test_n_below_one(tmp_path, n):
    assert_one_line_exit_2(run(tmp_path, "--setting", "toy", "--source", "renderer", "--n", n),
                           "--n must be an integer from 1 to 100000")
    assert not (tmp_path / "out").exists()


def test_empty_prompts_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    assert_one_line_exit_2(run(tmp_path, "--prompts", empty, "--resolution", 32, "--source", "renderer", "--n", 1),
                           "holds no prompt")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["missing", "directory", "binary"])
def test_unreadable_prompts_file(tmp_path, kind):
    path = tmp_path / "prompts.txt"
    if kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\xfa not utf-8")
    assert_one_line_exit_2(run(tmp_path, "--prompts", path, "--resolution", 32, "--source", "renderer", "--n", 1),
                           "cannot read prompts file")
    assert not (tmp_path / "out").exists()


def test_prompt_outside_the_setting_vocabulary(tmp_path):
    bad = prompts_file(tmp_path, ["a purple hexagon"])
    assert_one_line_exit_2(run(tmp_path, "--setting", "toy", "--prompts", bad, "--source", "renderer", "--n", 1),
                           "outside the toy vocabulary")


def test_prompts_without_a_setting_need_a_resolution(tmp_path):
    assert_one_line_exit_2(run(tmp_path, "--prompts", prompts_file(tmp_path), "--source", "renderer", "--n", 1),
                           "--resolution")


def test_neither_setting_nor_prompts(tmp_path):
    assert_one_line_exit_2(run(tmp_path, "--source", "renderer", "--n", 1), "give --setting S or --prompts FILE")


def test_out_is_a_file(tmp_path):
    (tmp_path / "out").write_text("x")
    assert_one_line_exit_2(run(tmp_path, "--setting", "toy", "--source", "renderer", "--n", 1), "not a directory")


def test_self_without_rewards(tmp_path):
    assert_one_line_exit_2(run(tmp_path, "--setting", "toy", "--source", "self", "--n", 1), "--rewards")
