"""The image APIs (openai, gemini) under one deadline per request and a cap on the answer's bytes
(issue 51): a server that trickles its head or its body, and answers larger than one image's.

Each case runs ``python -m recast_cli sample-positive`` in a subprocess with a time limit, so that code
without the deadline fails the test instead of hanging it. The fake server speaks raw HTTP/1.1 on a
loopback socket (``fakes.serve`` answers whole, at once).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.positives.fakes import GEMINI, OPENAI, Flavour, png

FLAVOURS = pytest.mark.parametrize("flavour", [OPENAI, GEMINI], ids=lambda f: f.source)
ROOT = Path(__file__).resolve().parents[2]
#: --timeout in these tests: the whole request's deadline, in seconds.
DEADLINE = 2
#: How long a trickling or stalling server keeps going; far past what the deadline allows.
SERVER_PATIENCE = 60.0
#: The subprocess's limit: two attempts at DEADLINE, the backoff and the start, with room to spare.
RUN_LIMIT = 40.0
#: One byte more than the cap (deadline.MAX_ANSWER_BYTES, 64 MiB): what an answer over it sends.
OVER_CAP = 64 * 2**20 + 1

#: answer(socket, the request's head, the server's stop): writes the answer; returns when done or stopped.
Answer = Callable[[socket.socket, bytes, threading.Event], None]


@contextlib.contextmanager
def raw_server(answer: Answer) -> Iterator[tuple[str, list[bytes]]]:
    """(base URL, the heads of the requests seen) while ``answer`` answers each request on 127.0.0.1."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop, heads = threading.Event(), []

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(SERVER_PATIENCE)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536) or b"\r\n\r\n"
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536) or b" " * length
                heads.append(head)
                answer(conn, head, stop)
            except OSError:  # the client went away: what a deadline or a cap does
                pass

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", heads
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _trickle(conn: socket.socket, data: bytes, stop: threading.Event) -> None:
    """``data`` one byte every 0.5 s, for at most SERVER_PATIENCE seconds."""
    end = time.monotonic() + SERVER_PATIENCE
    for byte in data:
        if stop.is_set() or time.monotonic() > end:
            return
        conn.sendall(bytes([byte]))
        time.sleep(0.5)


def trickled_head(conn: socket.socket, head: bytes, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    _trickle(conn, b"X-Slow: " + b"x" * 1000, stop)


def trickled_body(conn: socket.socket, head: bytes, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    _trickle(conn, b" " * 1000, stop)


def declared_over_cap(conn: socket.socket, head: bytes, stop: threading.Event) -> None:
    """Declares one byte more than the cap, sends the start and stalls (code that reads on waits for it)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{" % OVER_CAP)
    stop.wait(SERVER_PATIENCE)


def _huge_json() -> Iterator[bytes]:
    """An image answer whose base64 runs past the cap: JSON, so only its size is wrong."""
    yield b'{"created": 1, "data": [{"b64_json": "'
    for _ in range(OVER_CAP // 2**20 + 1):
        yield b"A" * 2**20
    yield b'"}]}'


def streamed_over_cap(conn: socket.socket, head: bytes, stop: threading.Event) -> None:
    """Chunked, no length declared: the cap is met while reading."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    for piece in _huge_json():
        if stop.is_set():
            return
        conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
    conn.sendall(b"0\r\n\r\n")


@functools.cache
def _bomb() -> bytes:
    return gzip.compress(b"".join(_huge_json()), compresslevel=1)


def gzip_over_cap(conn: socket.socket, head: bytes, stop: threading.Event) -> None:
    """A small gzip answer (about 0.3 MB) that decodes to more than the cap."""
    body = _bomb()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def image_answer(flavour: Flavour) -> Answer:
    def answer(conn: socket.socket, head: bytes, stop: threading.Event) -> None:
        body = json.dumps(flavour.image(png()).body).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body))
    return answer


def sample(flavour: Flavour, url: str, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """``recast sample-positive`` of one image from ``flavour`` at ``url`` (--timeout DEADLINE, one retry)
    in a subprocess: (its result, seconds it took); the test fails if it runs past RUN_LIMIT."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one prompt\n")
    clean = {k: v for k, v in os.environ.items() if k.upper() not in (
        "OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL",
        "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")}
    args = [sys.executable, "-m", "recast_cli", "sample-positive", "--prompts", str(prompts), "--source",
            flavour.source, "--resolution", "32", "--n", "1", "--out", str(tmp_path / "out"), "--timeout",
            str(DEADLINE), "--retries", "1", "--backoff", "0.01", "--concurrency", "1"]
    start = time.monotonic()
    try:
        result = subprocess.run(args, cwd=ROOT, env={**clean, **flavour.env(url), **env}, capture_output=True,
                                text=True, timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"sample-positive --source {flavour.source} still waited on the server after {RUN_LIMIT:g} s")
    return result, time.monotonic() - start


@FLAVOURS
@pytest.mark.parametrize("answer", [trickled_head, trickled_body], ids=["head", "body"])
def test_an_answer_trickled_past_the_deadline_fails_the_image_in_time(flavour, answer, tmp_path):
    with raw_server(answer) as (url, heads):
        result, seconds = sample(flavour, url, tmp_path)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "1 image(s) failed" in result.stderr and f"no whole answer within {DEADLINE} s" in result.stderr
    assert "(after 2 attempts)" in result.stderr and len(heads) == 2 and "Traceback" not in result.stderr
    assert seconds < 2 * DEADLINE + 15  # two attempts of DEADLINE each, the start and the backoff


@FLAVOURS
@pytest.mark.parametrize("answer", [declared_over_cap, streamed_over_cap, gzip_over_cap],
                         ids=["declared", "streamed", "gzip"])
def test_an_answer_over_the_cap_stops_with_one_line(flavour, answer, tmp_path):
    with raw_server(answer) as (url, heads):
        result, seconds = sample(flavour, url, tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{flavour.source}: the answer" in lines[0] and "64 MiB" in lines[0], lines[0]
    assert len(heads) == 1  # not retried: the same request would get the same answer
    assert not (tmp_path / "out").exists()


@FLAVOURS
def test_a_proxy_from_the_environment_is_still_used(flavour, tmp_path):
    """The SDKs' default clients honour HTTP_PROXY; the bounded client does too."""
    with raw_server(image_answer(flavour)) as (proxy, heads):
        result, _ = sample(flavour, "http://images.invalid", tmp_path, HTTP_PROXY=proxy)
    assert result.returncode == 0, result.stderr
    assert heads and heads[0].split(b" ")[1].startswith(b"http://images.invalid/")  # absolute form: a proxy's
