"""The resumable OUT.parts/ folder (artifacts/parts.py) that estimate and evaluate share."""

from __future__ import annotations

import json

import pytest

from recast_cli.artifacts.parts import LEGACY_MARKER_NAME, MARKER_NAME, finish_parts, open_parts, parts_dir
from recast_cli.errors import BadInput

OPTS = {"pieces": "piece-*.bin", "writer": "another test", "what": "run"}


def test_a_run_takes_the_folder_resumes_it_and_finishes(tmp_path):
    out = tmp_path / "T.parquet"
    lock = open_parts(out, "abc", {"config": {"k": 1}}, **OPTS)
    parts = parts_dir(out)
    assert json.loads((parts / MARKER_NAME).read_text()) == {"run_id": "abc", "config": {"k": 1}}
    with pytest.raises(BadInput, match="is being written by another test"):
        open_parts(out, "abc", {}, **OPTS)  # one writer per output
    (parts / "piece-1.bin").write_bytes(b"done")
    lock.release()
    open_parts(out, "abc", {}, **OPTS).release()  # the same run resumes, its pieces kept
    assert (parts / "piece-1.bin").is_file()
    finish_parts(out, ["piece-1.bin"])
    assert not parts.exists()


@pytest.mark.parametrize("marker", [MARKER_NAME, LEGACY_MARKER_NAME, None])
def test_pieces_of_another_run_are_refused_untouched(tmp_path, marker):
    out = tmp_path / "T.parquet"
    parts = parts_dir(out)
    parts.mkdir()
    if marker is not None:
        (parts / marker).write_text(json.dumps({"run_id": "other"}))
    (parts / "piece-1.bin").write_bytes(b"theirs")
    with pytest.raises(BadInput, match="holds partial results of another run; remove it or rerun with the same flags"):
        open_parts(out, "mine", {}, **OPTS)
    assert (parts / "piece-1.bin").read_bytes() == b"theirs"


def test_an_older_marker_of_the_same_run_resumes_and_is_renamed(tmp_path):
    out = tmp_path / "T.parquet"
    parts = parts_dir(out)
    parts.mkdir()
    (parts / LEGACY_MARKER_NAME).write_text(json.dumps({"run_id": "mine"}))
    (parts / "piece-1.bin").write_bytes(b"ours")
    open_parts(out, "mine", {}, **OPTS).release()
    assert sorted(p.name for p in parts.iterdir()) == [MARKER_NAME, "piece-1.bin"]


def test_a_marker_of_a_run_that_finished_nothing_blocks_nothing(tmp_path):
    out = tmp_path / "T.parquet"
    parts = parts_dir(out)
    parts.mkdir()
    (parts / MARKER_NAME).write_text("not json")
    open_parts(out, "mine", {}, **OPTS).release()
    assert json.loads((parts / MARKER_NAME).read_text())["run_id"] == "mine"
