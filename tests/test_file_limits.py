"""Files recast writes or reads beside its outputs, under limits and plants (issue 51, items 14 and 15):
a file size limit (``ulimit -f``) while writing estimate's parts is one line, not an EFBIG traceback; a
run that fails before any part is done leaves no ``OUT.parts/`` behind; fetch's sha256 record is read
only up to a record's size, and a symbolic link there is refused before anything is downloaded."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from recast_cli.cli import app
from tests.test_fetch import PINNED_CLI, assert_one_line_2, files, git_blob, run  # noqa: F401 (files: fixture)

ROOT = Path(__file__).resolve().parents[1]
GMM = ["estimate", "--policy", "gmm1d", "--rewards", "coarse,mid", "--n", "8", "--k", "2", "--p", "4", "--steps", "6",
       "--bootstrap", "0"]


def limited(size: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))


def test_a_file_size_limit_while_writing_parts_is_one_line_and_leaves_no_parts_folder(tmp_path):
    out = tmp_path / "g.parquet"
    done = subprocess.run([sys.executable, "-m", "recast_cli", *GMM, "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, preexec_fn=limited(512))
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("recast: error: the file size limit (ulimit -f) was reached writing") and "Traceback" \
        not in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no parts folder, no marker, no temporary file


def test_a_full_disk_before_the_first_part_leaves_no_parts_folder_but_a_users_file_stays(tmp_path, monkeypatch):
    real = Path.write_bytes

    def full(self, data):
        if self.name.endswith(".tmp") and "prompt-" in self.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    out = tmp_path / "g.parquet"
    result = CliRunner().invoke(app, [*GMM, "--out", str(out)])
    assert result.exit_code == 2 and "no space left writing" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
    parts = tmp_path / "g.parquet.parts"
    parts.mkdir()
    (parts / "notes.txt").write_text("mine")
    assert CliRunner().invoke(app, [*GMM, "--out", str(out)]).exit_code == 2
    assert sorted(p.name for p in parts.iterdir()) == ["notes.txt"]  # the user's file and its folder stay


TRAIN = "".join(f'A shop sign that reads "OPEN {i}"\n' for i in range(40)).encode()


def fetch_setting(files, tmp_path):
    files.files["/ocr/train.txt"] = TRAIN
    pins = {"ocr/train.txt": [f"{files.url}/ocr/train.txt", git_blob(TRAIN), None]}
    setting = tmp_path / "s.toml"
    setting.write_text('[policy]\nkind = "gmm1d"\n[train]\nprompts = "data/ocr/train.txt"\n')
    target = tmp_path / "data" / "ocr" / "train.txt"
    return pins, setting, target, target.with_name(".train.txt.recast-sha256")


def fetch(pins, setting):
    return run(["-c", PINNED_CLI, json.dumps(pins), "fetch", str(setting)], {"HF_ENDPOINT": "http://127.0.0.1:9"})


def peak_fetch(pins, setting) -> tuple[subprocess.CompletedProcess, float]:
    """``recast fetch`` run as the child of a small wrapper that reports its children's peak memory; the
    result and that peak in MiB."""
    measured = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
                "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    done = subprocess.run([sys.executable, "-c", measured, sys.executable, "-c", PINNED_CLI, json.dumps(pins),
                           "fetch", str(setting)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT)})
    peak = int(done.stdout.split()[-1]) / 1024
    done.stdout = ""
    return done, peak


def test_a_huge_sha256_record_is_refused_without_reading_it_whole(files, tmp_path):
    pins, setting, target, record = fetch_setting(files, tmp_path)
    assert fetch(pins, setting).returncode == 0
    checked, baseline = peak_fetch(pins, setting)  # the same check with the record recast wrote
    assert checked.returncode == 0, checked.stderr
    with open(record, "wb") as fh:  # 400 MB (sparse): reading it whole took 1.4 GB
        fh.write(f"{hashlib.sha256(TRAIN).hexdigest()}  train.txt\n".encode())
        fh.truncate(400 << 20)
    done, peak = peak_fetch(pins, setting)
    assert_one_line_2(done, "is not the sha256 record recast writes")
    assert peak < baseline + 100, f"fetch peaked at {peak:.0f} MiB, {baseline:.0f} MiB with a real record"


def test_a_symlinked_sha256_record_is_refused_before_the_download(files, tmp_path):
    pins, setting, target, record = fetch_setting(files, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's\n")
    record.parent.mkdir(parents=True)
    record.symlink_to(victim)
    assert_one_line_2(fetch(pins, setting), "symbolic link")
    assert not target.exists() and files.requests == []  # nothing downloaded, nothing put in place
    assert victim.read_text() == "the user's\n"
    record.unlink()
    assert fetch(pins, setting).returncode == 0
    record.unlink()
    os.mkfifo(record)  # a FIFO where the record is read: refused, never blocking
    assert_one_line_2(fetch(pins, setting), "not a regular file")


#: recast's main with fetch's time limits shortened (a request's first 0.3 s free, then at least 8 KiB/s).
QUICK_CLI = "from recast_cli.fetch import http; http.TIMEOUT_S = 0.3; " + PINNED_CLI


def test_a_server_that_trickles_a_prompt_file_is_cut_off_not_waited_on(files, tmp_path):
    """Each byte comes well within the read timeout, so only a floor on the whole request's rate ends it:
    every attempt is cut off, and the download is one line naming the rate, with nothing put in place."""
    pins, setting, target, record = fetch_setting(files, tmp_path)
    files.trickle.add("/ocr/train.txt")
    done = subprocess.run([sys.executable, "-c", QUICK_CLI, json.dumps(pins), "fetch", str(setting)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT)})
    assert_one_line_2(done, "the download failed 5 times (TimeoutError", "slower than 8 KiB/s",
                      "run recast fetch again to resume")
    assert not target.exists() and len(files.requests) == 5
