"""Files a user (or an attacker) leaves where recast looks: a file or link named like recast's output
lock, metadata nested 200 000 levels deep, a disk that fills while an estimate writes its parts
(issue 40, findings 4, 13 and 14). Each is one line and exit 2, or the right result, and every file
of the user's is left byte for byte as it was."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recast_cli.artifacts.locks import LOCK_MARK
from recast_cli.artifacts.jsonio import MAX_JSON_DEPTH, json_too_deep
from tests.test_silent_errors import GMM, assert_bad, files, gains, invoke, run_ok, sha  # noqa: F401 (gains: a fixture)

DEEP = b"[" * 200_000


def solve(gains_path: Path, out: Path):
    return invoke("solve-w", "--gains", gains_path, "--lambda", "1,1", "--out", out)


# ------------------------------------------------------------------ finding 4: the output lock


def test_a_users_file_named_like_the_lock_is_used_and_kept(gains, tmp_path):
    lock = tmp_path / ".W.safetensors.lock"
    lock.write_bytes(b"my notes, not a lock\n")
    before = sha(lock)
    run_ok("solve-w", "--gains", gains, "--lambda", "1,1", "--out", tmp_path / "W.safetensors")
    assert (tmp_path / "W.safetensors").is_file()
    assert sha(lock) == before


def test_a_lock_left_by_a_killed_recast_is_taken_and_removed(gains, tmp_path):
    lock = tmp_path / ".W.safetensors.lock"
    lock.write_bytes(LOCK_MARK)
    run_ok("solve-w", "--gains", gains, "--lambda", "1,1", "--out", tmp_path / "W.safetensors")
    assert not lock.exists()


def test_a_new_lock_is_marked_while_held_and_gone_after(gains, tmp_path):
    from recast_cli.artifacts.locks import hold_output_lock, lock_path, release_output_lock

    out = tmp_path / "sub" / "W.safetensors"
    hold_output_lock(out)
    try:
        assert lock_path(out).read_bytes() == LOCK_MARK
    finally:
        release_output_lock(out)
    assert not (tmp_path / "sub").exists()  # the folder made for it, and the lock, are gone


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_link_pipe_or_folder_at_the_lock_is_refused_untouched(gains, tmp_path, kind):
    lock = tmp_path / ".W.safetensors.lock"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    assert_bad(solve(gains, tmp_path / "W.safetensors"), ".W.safetensors.lock", "not a regular file")
    assert victim.read_bytes() == b"precious" and not (tmp_path / "W.safetensors").exists()
    assert lock.is_symlink() if kind == "symlink" else lock.is_fifo() if kind == "fifo" else lock.is_dir()


# ------------------------------------------------------------------ finding 14: nesting bounded


def test_the_nesting_check_counts_brackets_outside_strings_only():
    assert not json_too_deep(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)
    assert json_too_deep(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))
    assert not json_too_deep(b'["' + b"[" * 10_000 + b'"]')  # text, not nesting
    assert not json_too_deep(b'["\\"' + b"{" * 10_000 + b'"]')  # an escaped quote does not end the string
    assert json_too_deep(DEEP)
    # an unterminated string of escaped quotes is one pass, not one match attempt per quote (quadratic: minutes)
    assert json_too_deep(b"{" * (MAX_JSON_DEPTH + 1) + b'"' + b'\\"' * 200_000)


def deep_parquet(path: Path, key: bytes) -> Path:
    meta = {b"schema": b'"recast.gains/1"', key: DEEP}
    pq.write_table(pa.table({"reward": ["a"]}).replace_schema_metadata(meta), path)
    return path


def deep_safetensors(path: Path) -> Path:
    header = b'{"__metadata__":{"schema":' + DEEP + b'},"W":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}'
    path.write_bytes(struct.pack("<Q", len(header)) + header + np.zeros(1).tobytes())
    return path


def gains_ok(tmp_path: Path) -> Path:
    from recast_cli.artifacts import write_gains
    from tests.conftest import bump_gains, make_table

    path = tmp_path / "ok.parquet"
    write_gains(path, make_table(0.05 * bump_gains([5], [2], 6), ("coarse",)), config={"test": True})
    return path


@pytest.mark.parametrize("key", [b"schema", b"provenance"])
def test_deep_parquet_metadata_is_one_line_for_reading_and_for_out(tmp_path, key):
    table = deep_parquet(tmp_path / "g.parquet", key)
    before = sha(table)
    assert_bad(invoke("solve-w", "--gains", table, "--lambda", "1", "--out", tmp_path / "W.safetensors"),
               "nested deeper than")
    assert_bad(invoke("inspect", table), "nested deeper than")
    assert_bad(invoke("solve-w", "--gains", gains_ok(tmp_path), "--lambda", "1", "--out", table), "g.parquet")
    assert sha(table) == before


def test_a_deep_safetensors_header_is_one_line_for_inspect_and_for_out(gains, tmp_path):
    w = deep_safetensors(tmp_path / "W.safetensors")
    before = sha(w)
    assert_bad(invoke("inspect", w), "W.safetensors")
    assert_bad(solve(gains, w), "W.safetensors")  # the --out check reads its schema: refused, not replaced
    assert sha(w) == before


# ------------------------------------------------------------------ finding 13: a full disk mid-estimate


def test_a_full_disk_while_writing_an_estimate_part_is_one_line(tmp_path, monkeypatch):
    real = Path.write_bytes

    def full(self, data):
        if self.name.endswith(".tmp") and ".safetensors." in self.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    out = tmp_path / "g.parquet"
    result = invoke(*GMM, "--out", out)
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.stderr
    error = [line for line in result.stderr.splitlines() if "error" in line]  # the rest: the progress bar
    assert len(error) == 1 and "no space left writing" in error[0] and "prompt-000000.safetensors" in error[0], error
    assert not out.exists()
    assert not [f for f in files(tmp_path) if f.endswith(".tmp")]
