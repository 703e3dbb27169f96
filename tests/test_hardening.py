"""Resource limits and bad positives through the real CLI and server (issue 17).

A PNG whose header declares 12000 x 12000 pixels is a few hundred bytes here: every reader
refuses it from the header, before decoding; the reward server answers 413; a corrupt or
wrong-size positive is named before any rollout, and a failed run leaves nothing that blocks
the corrected command.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from recast_cli.artifacts import FolderLock, read_positives
from recast_cli.cli import app
from recast_cli.images import ImageTooLarge, read_image

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def bomb_png(width: int = 12000, height: int = 12000) -> bytes:
    """A valid PNG header declaring width x height RGB pixels, followed by a tiny IDAT."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + \
        chunk(b"IEND", b"")


def test_the_reader_refuses_from_the_header(tmp_path, monkeypatch):
    path = tmp_path / "bomb.png"
    path.write_bytes(bomb_png())
    assert path.stat().st_size < 200
    with pytest.raises(ImageTooLarge, match="12000 x 12000 pixels is more than the limit of 16777216"):
        read_image(path)
    monkeypatch.setenv("RECAST_MAX_IMAGE_PIXELS", "100")
    small = tmp_path / "small.png"
    Image.new("RGB", (16, 16)).save(small)
    with pytest.raises(ImageTooLarge, match="16 x 16 pixels is more than the limit of 100"):
        read_image(small)


def test_score_refuses_a_huge_image_with_one_line(tmp_path):
    (tmp_path / "bomb.png").write_bytes(bomb_png())
    result = invoke("score", "--rewards", "toy_color", "--images", tmp_path / "bomb.png", "--prompt",
                    "a red circle on a white background", "--out", tmp_path / "s.parquet")
    assert result.exit_code == 2 and "12000 x 12000 pixels is more than the limit" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.parquet").exists()


# ------------------------------------------------------------------ the reward server


@pytest.fixture
def toy_server():
    from recast_cli.rewards import build_scorer
    from recast_cli.rewards.server import make_server
    from tests.rewards.fakes import running

    with running(make_server(build_scorer("toy_color"), token="tok", max_batch=4, max_pixels=64 * 64,
                             timeout=1.0, grace=1.0)) as url:
        yield url


def post(url: str, body: bytes, auth: str = "Bearer tok"):
    from recast_cli.rewards.transport import Endpoint, request

    return request(Endpoint(url, timeout=5.0, retries=1), "POST", "/v1/score", "test", body,
                   {"Authorization": auth, "Content-Type": "application/json"})


def png_b64(image: Image.Image) -> str:
    from recast_cli.rewards.transport import png_base64

    return png_base64(image)


def test_the_server_answers_413_for_an_image_larger_than_its_limit(toy_server):
    body = json.dumps({"prompts": ["a red circle on a white background"],
                       "images": [base64.b64encode(bomb_png()).decode()]}).encode()
    reply = post(toy_server, body)
    assert reply.status == 413 and "12000 x 12000 pixels is more than the limit of 4096" in reply.json("t")["error"]


def test_the_server_limits_batches_and_bodies_and_takes_the_scheme_in_any_case(toy_server):
    from recast_cli.rewards.serve_limits import body_limit

    prompt = "a red circle on a white background"
    one = png_b64(Image.new("RGB", (32, 32), (255, 0, 0)))
    ok = post(toy_server, json.dumps({"prompts": [prompt], "images": [one]}).encode(), auth="bearer tok")
    assert ok.status == 200 and len(ok.json("t")["scores"]) == 1
    assert post(toy_server, b"{}", auth="Basic tok").status == 401
    five = json.dumps({"prompts": [prompt] * 5, "images": [one] * 5}).encode()
    reply = post(toy_server, five)
    assert reply.status == 400 and "at most 4 images" in reply.json("t")["error"]
    limit = body_limit(4, 64 * 64)
    assert limit < 200_000  # derived from the batch: 4 images of 64 x 64, not hundreds of megabytes
    big = post(toy_server, b"x" * (limit + 1))
    assert big.status == 413


def test_a_connection_that_never_sends_its_body_is_answered_408_and_dropped_at_the_deadline(toy_server):
    from urllib.parse import urlparse

    parts = urlparse(toy_server)
    with socket.create_connection((parts.hostname, parts.port), timeout=5.0) as conn:
        conn.sendall(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\nContent-Length: 10\r\n\r\n")
        conn.settimeout(5.0)
        reply = b""
        while chunk := conn.recv(4096):  # the server answers (1 s deadline) and closes
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408 ") and b"request not received in time" in reply


# ------------------------------------------------------------------ positives for recast estimate


@pytest.fixture
def positives(tmp_path) -> Path:
    out = tmp_path / "pos"
    result = invoke("sample-positive", "--setting", "toy", "--source", "renderer", "--n", "2", "--out", out)
    assert result.exit_code == 0, result.stderr
    return out


def _replace_image(folder: Path, data: bytes) -> Path:
    """Swap the first positive's file for ``data`` and re-sign the manifest, so only decoding can tell."""
    import pyarrow.parquet as pq

    first = read_positives(folder).samples[0]
    (folder / first.image_path).write_bytes(data)
    table = pq.read_table(folder / "manifest.parquet")
    digest = hashlib.sha256(data).hexdigest()
    sha = [digest if p == first.image_path else s
           for p, s in zip(table.column("image_path").to_pylist(), table.column("sha256").to_pylist())]
    table = table.set_column(table.schema.get_field_index("sha256"), "sha256", [sha]).replace_schema_metadata(
        table.schema.metadata)
    pq.write_table(table, folder / "manifest.parquet")
    return folder / first.image_path


@pytest.mark.parametrize("case, needle", [
    ("corrupt", "cannot decode the image"),
    ("empty", "cannot decode the image"),
    ("not an image", "cannot decode the image (not an image)"),
    ("wrong size", "is 16 x 16, the policy samples 32 x 32"),
    ("bomb", "12000 x 12000 pixels is more than the limit"),
])
def test_a_bad_positive_is_named_before_any_rollout_and_blocks_nothing(positives, tmp_path, case, needle):
    import io

    good = (positives / read_positives(positives).samples[0].image_path).read_bytes()
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, format="PNG")
    data = {"corrupt": good[:40], "empty": b"", "not an image": b"hello", "wrong size": buffer.getvalue(),
            "bomb": bomb_png()}[case]
    path = _replace_image(positives, data)
    out = tmp_path / "g.parquet"
    args = ["estimate", "--policy", "toy", "--rewards", "toy_color", "--positives", positives, "--n", "2", "--k", "1",
            "--p", "1", "--steps", "2", "--out", out]
    result = invoke(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert needle in result.stderr and str(path) in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and not out.with_name("g.parquet.parts").exists()
    _replace_image(positives, good)  # corrected: the same command now runs
    assert invoke(*args).exit_code == 0


def test_a_stale_marker_without_results_does_not_block_and_a_held_folder_does(positives, tmp_path):
    out = tmp_path / "g.parquet"
    parts = tmp_path / "g.parquet.parts"
    parts.mkdir()
    (parts / "run.json").write_text(json.dumps({"run_id": "another"}))  # the marker's name before 2026-12
    args = ["estimate", "--policy", "toy", "--rewards", "toy_color", "--positives", positives, "--n", "2", "--k", "1",
            "--p", "1", "--steps", "2", "--out", out]
    held = FolderLock(parts)
    try:
        result = invoke(*args)
        assert result.exit_code == 2 and "is being written by another recast estimate" in result.stderr
    finally:
        held.release()
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    assert out.is_file() and not parts.exists()


def test_the_temporary_files_of_killed_writes_of_an_output_are_cleaned(tmp_path):
    import os

    from tests.conftest import EXAMPLE

    dead = next(pid for pid in range(4_000_000, 4_100_000) if not Path(f"/proc/{pid}").exists())
    out = tmp_path / "W.safetensors"
    stale = [tmp_path / f".W.safetensors.{dead}.a1b2c3d4.tmp"]  # recast's own form, PID gone (issue 30: nothing else)
    live = tmp_path / f".W.safetensors.{os.getpid()}.q1w2e3r4.tmp"  # a writer that is still running
    other = tmp_path / f".other.safetensors.{dead}.a1b2c3d4.tmp"  # another output's: not ours to clean
    for path in (*stale, live, other):
        path.write_bytes(b"partial")
    assert invoke("solve-w", "--gains", EXAMPLE, "--lambda", "1,1,1", "--out", out).exit_code == 0
    assert out.is_file() and not any(p.exists() for p in stale) and live.exists() and other.exists()
