"""`recast serve-reward` against hostile and broken clients (issue 30): raw sockets on loopback.

A slow-loris client loses its reader slot at the request deadline (408) and the others are
served; an idle connection makes room for a new one, and only when every connection is busy
with a request is one more answered 503; a too-deeply nested body is 400; a body cut short is
400; a client that leaves before its reply is one log line. Never a traceback. Deadlines are
made small through ``make_server``'s parameters so the tests take seconds (the attacks of issue
40 are in ``test_server_hostile.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from recast_cli.rewards import build_scorer
from recast_cli.rewards.base import Scorer
from recast_cli.rewards.server import make_server
from recast_cli.rewards.transport import png_base64
from tests.rewards.conftest import noise_images
from tests.rewards.fakes import running

PROMPT = "a red circle on a white background"


@contextlib.contextmanager
def serving(scorer: Scorer | None = None, **limits):
    """A real reward server (toy_color unless told) on 127.0.0.1; yields its port."""
    with running(make_server(scorer or build_scorer("toy_color"), **limits)) as url:
        yield int(url.rsplit(":", 1)[1])


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=20)


def head(length: int) -> bytes:
    return (f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def score_body(size: int = 32) -> bytes:
    return json.dumps({"prompts": [PROMPT], "images": [png_base64(noise_images(1, size=size)[0])]}).encode()


def read_reply(sock: socket.socket) -> tuple[int, dict]:
    """(status, JSON body) of one reply read from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a reply: {data!r}"
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-reply"
        body += chunk
    return int(lines[0].split()[1]), json.loads(body[:length])


def exchange(port: int, data: bytes, half_close: bool = False) -> tuple[int, dict]:
    """Send ``data`` on a new connection (then close the write side if told) and read the reply;
    a 503 from a connection cap whose previous holder is still closing (or the reset of such a
    connection) is tried again."""
    for _ in range(50):
        try:
            with connect(port) as sock:
                sock.sendall(data)
                if half_close:
                    sock.shutdown(socket.SHUT_WR)
                status, body = read_reply(sock)
        except OSError:
            # a connection turned away at the cap can be reset before its 503 is read (the server
            # closes it with our bytes unread; shutting down our side then fails too): under load
            # that is the same answer as a 503
            status, body = 503, {}
        if status != 503:
            return status, body
        time.sleep(0.1)
    return status, body


def hold_a_connection(port: int) -> socket.socket:
    """An idle connection the server has accepted (not refused: a refusal is answered at once)."""
    for _ in range(50):
        sock = connect(port)
        if not select.select([sock], [], [], 0.3)[0]:
            return sock
        sock.close()
        time.sleep(0.1)
    raise AssertionError("the server never accepted an idle connection")


def trickle_until_answered(sock: socket.socket, data: bytes, every: float = 0.1, limit: float = 15.0) -> float:
    """Send ``data`` one byte every ``every`` seconds until the server answers; seconds it took."""
    started = time.monotonic()
    for byte in data:
        if select.select([sock], [], [], every)[0]:
            break
        sock.send(bytes([byte]))
        assert time.monotonic() - started < limit, "the server let a trickling client go on"
    else:
        raise AssertionError("the trickle ended before the server answered")
    return time.monotonic() - started


def stderr_lines(capsys, needle: str, wait: float = 5.0) -> tuple[list[str], str]:
    """(lines of captured stderr holding ``needle``, all of it), waiting up to ``wait`` s for one."""
    err = ""
    deadline = time.monotonic() + wait
    while True:
        err += capsys.readouterr().err
        if needle in err or time.monotonic() > deadline:
            return [line for line in err.splitlines() if needle in line], err
        time.sleep(0.05)


def test_a_slow_loris_loses_its_reader_slot_at_the_deadline_and_the_others_are_served(capsys):
    with serving(readers=1, grace=1.0) as port, connect(port) as loris:
        loris.sendall(head(5000) + b"{")  # holds the only reader slot, then trickles
        time.sleep(0.3)
        honest: dict = {}

        def call() -> None:
            honest["reply"] = exchange(port, head(len(body := score_body())) + body)
            honest["at"] = time.monotonic()

        thread = threading.Thread(target=call)
        thread.start()
        took = trickle_until_answered(loris, b'"prompts": ' + b" " * 4000)
        answered = time.monotonic()
        status, reply = read_reply(loris)
        thread.join(timeout=20)
    assert status == 408 and "request not received in time" in reply["error"]
    assert 0.5 < took < 10  # the whole request's deadline (1 s), not a per-read timeout
    assert honest["reply"][0] == 200 and len(honest["reply"][1]["scores"]) == 1
    assert honest["at"] >= answered - 0.5  # it was served once the slow loris lost the slot
    lines, err = stderr_lines(capsys, "not received in time")
    assert len(lines) == 1 and "Traceback" not in err


def test_a_request_line_trickled_byte_by_byte_is_408_at_the_deadline():
    with serving(header_s=0.5) as port, connect(port) as loris:
        took = trickle_until_answered(loris, b"POST /v1/score HTTP/1.1\r\n" * 10)
        status, reply = read_reply(loris)
        assert loris.recv(1) == b""  # and closed
    assert status == 408 and "bytes in" in reply["error"]
    assert took < 10


def test_a_large_upload_slower_than_the_grace_but_faster_than_the_minimum_rate_is_served():
    body = score_body(size=512)  # about 1 MB
    assert len(body) > 16 * 64 * 1024
    with serving(grace=0.3, min_rate=64 * 1024) as port, connect(port) as sock:
        started = time.monotonic()
        sock.sendall(head(len(body)))
        for at in range(0, len(body), 64 * 1024):  # ~16 chunks, 0.05 s apart: ~20 times the minimum rate
            sock.sendall(body[at:at + 64 * 1024])
            time.sleep(0.05)
        status, reply = read_reply(sock)
        took = time.monotonic() - started
    assert status == 200 and len(reply["scores"]) == 1
    assert took > 0.3  # longer than the grace alone allows


def test_a_body_of_deeply_nested_brackets_is_400_and_the_connection_keeps_serving(capsys):
    nested = b"[" * 100_000
    with serving() as port, connect(port) as sock:
        sock.sendall(head(len(nested)) + nested)
        status, reply = read_reply(sock)
        sock.sendall(head(len(body := score_body())) + body)  # same connection: the handler lives on
        again, scores = read_reply(sock)
    assert status == 400 and reply == {"error": "request body nests too deeply"}
    assert again == 200 and len(scores["scores"]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("half_close", [True, False])
def test_a_body_shorter_than_its_content_length_is_400_and_one_log_line(capsys, half_close):
    with serving() as port:
        with connect(port) as sock:
            sock.sendall(head(1000) + b'{"prompts": ')
            if half_close:  # the client still reads: it gets the 400
                sock.shutdown(socket.SHUT_WR)
                status, reply = read_reply(sock)
                assert status == 400 and reply["error"] == "body ended after 12 of 1000 bytes"
        lines, err = stderr_lines(capsys, "body ended after 12 of 1000 bytes")
        assert exchange(port, head(len(body := score_body())) + body)[0] == 200
    assert len(lines) == 1 and "Traceback" not in err


class Gate(Scorer):
    """Scores 0.5 once the test opens the gate: the reply waits while the client leaves."""

    name = "gate"
    output_range = (0.0, 1.0)

    def __init__(self) -> None:
        self.entered, self.open = threading.Event(), threading.Event()

    def score(self, images, prompts) -> np.ndarray:
        self.entered.set()
        self.open.wait(timeout=10)
        return np.full(len(images), 0.5)


def test_a_client_that_leaves_before_its_reply_is_one_log_line_and_no_traceback(capsys):
    gate = Gate()
    with serving(gate) as port:
        sock = connect(port)
        sock.sendall(head(len(body := score_body())) + body)
        assert gate.entered.wait(timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset: the reply cannot be delivered
        time.sleep(0.1)
        gate.open.set()
        lines, err = stderr_lines(capsys, "not delivered")
        assert exchange(port, head(len(body)) + body) == (200, {"scores": [0.5], "extras": {}})
    assert len(lines) == 1 and "POST /v1/score 200 not delivered: client disconnected" in lines[0]
    assert "Traceback" not in err


def test_connections_all_busy_with_requests_answer_one_more_503_and_the_server_recovers(capsys):
    gate = Gate()
    server = make_server(gate, max_connections=2)
    with running(server) as url:
        port = int(url.rsplit(":", 1)[1])
        replies: list = []
        callers = [threading.Thread(target=lambda: replies.append(exchange(port, head(len(body)) + body)))
                   for body in (score_body(), score_body())]
        for caller in callers:
            caller.start()
            while len(server.admission.authenticated) < len(replies) + callers.index(caller) + 1:
                time.sleep(0.01)  # one at a time: the second would close the first while it is unauthenticated
        assert gate.entered.wait(timeout=10)  # the second request waits for the scorer: both are authenticated
        with connect(port) as third:
            status, reply = read_reply(third)
            assert third.recv(1) == b""
        gate.open.set()
        for caller in callers:
            caller.join(timeout=10)
        remote = build_scorer(f"gate@http://127.0.0.1:{port}", retries=10, backoff=0.05)
        assert remote.score(noise_images(1, size=32), [PROMPT]).tolist() == [0.5]
    assert status == 503 and "all 2 connections are busy with requests" in reply["error"]
    assert [status for status, _ in replies] == [200, 200]
    lines, err = stderr_lines(capsys, "refused: all 2 connections are busy")
    assert len(lines) == 1 and "Traceback" not in err


def test_serve_reward_through_the_cli_survives_hostile_clients():
    """`recast serve-reward` itself: an idle connection makes room (--max-connections 1), nested and
    cut-short bodies, no traceback."""
    recast = str(Path(sys.executable).parent / "recast")
    proc = subprocess.Popen([recast, "serve-reward", "toy_color", "--port", "0", "--max-connections", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        line = proc.stdout.readline()
        assert "serving toy_color on http://127.0.0.1:" in line, line + proc.stderr.read()
        port = int(line.split(" on ", 1)[1].split(" ", 1)[0].rsplit(":", 1)[1])
        with hold_a_connection(port) as idle:
            status, reply = exchange(port, head(len(body := score_body())) + body)
            assert status == 200 and len(reply["scores"]) == 1
            assert idle.recv(1) == b""  # closed to make room for the request
        nested = b"[" * 100_000
        assert exchange(port, head(len(nested)) + nested) == (400, {"error": "request body nests too deeply"})
        assert exchange(port, head(100) + b"{", half_close=True) == (400, {"error": "body ended after 1 of 100 bytes"})
        status, reply = exchange(port, head(len(body := score_body())) + body)
        assert status == 200 and len(reply["scores"]) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    assert "Traceback" not in err
    assert "closed: no authenticated request yet, to make room for a new connection" in err
    assert "nests too deeply" in err and "body ended after 1 of 100 bytes" in err
