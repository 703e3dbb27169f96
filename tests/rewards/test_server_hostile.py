"""`recast serve-reward` cannot be held by idle or slow clients (issue 40, findings 11 and 12).

Two token holders that declare a large body and upload below the rate floor are cut at the first
check after the grace, and a legitimate request is served at once; a client ahead of the floor's
schedule may pause while its lead lasts, and is cut at the first check after it runs out; the
body's deadline is fixed by its declared length and never grows with bytes received, and its cap
covers the largest body at a lowered floor; a flood of idle sockets
without a token cannot keep a ``RemoteScorer`` out; a head over its byte cap is 431; the body
limit is the largest body our client sends for the server's batch. Every deadline and rate is
scaled down through ``make_server``'s parameters, so each test takes well under a second.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time

import pytest
from PIL import Image
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.rewards import build_scorer
from recast_cli.rewards.serve_limits import (MAX_BATCH, PROMPT_ROOM, Admission, Pace, RequestDeadline, RequestReader,
                                             body_limit, png_limit)
from recast_cli.rewards.server import make_server
from recast_cli.rewards.transport import png_base64
from tests.rewards.conftest import noise_images
from tests.rewards.fakes import running
from tests.rewards.test_serve_limits import PROMPT, connect, read_reply, stderr_lines, trickle_until_answered

TOKEN = "t0ken-for-the-hostile-tests"
KIB = 1024


@contextlib.contextmanager
def server(**limits):
    """A real toy_color reward server with ``limits``; yields (server, URL)."""
    made = make_server(build_scorer("toy_color"), **limits)
    with running(made) as url:
        yield made, url


def post_head(length: int, token: str = TOKEN) -> bytes:
    return (f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


# ------------------------------------------------------------------ finding 11: slow token holders


def test_two_slow_uploaders_below_the_rate_floor_are_cut_and_a_legitimate_request_is_served_at_once(capsys):
    pace = {"grace": 0.15, "window": 0.15, "min_rate": 64 * KIB}  # 9.6 KiB due per window after the grace
    declared = 50_000_000  # about 760 s at the floor: only the schedule checks can cut them
    with server(token=TOKEN, readers=2, **pace) as (_, url):
        port = int(url.rsplit(":", 1)[1])
        trickler, staller = connect(port), connect(port)
        for sock in (trickler, staller):  # each first sends a lead of at most 0.125 s at the floor
            sock.sendall(post_head(declared) + b" " * (8 * KIB))
        cut: dict = {}

        def trickle() -> None:
            cut["trickler"] = trickle_until_answered(trickler, b" " * 100_000, every=0.01)  # ~100 B/s

        def stall() -> None:
            started = time.monotonic()
            select.select([staller], [], [], 5)
            cut["staller"] = time.monotonic() - started

        threads = [threading.Thread(target=trickle), threading.Thread(target=stall)]
        for thread in threads:
            thread.start()
        started = time.monotonic()  # both hold the two reader slots
        scores = build_scorer(f"toy_color@{url}", token=TOKEN, retries=1).score(noise_images(1, size=32), [PROMPT])
        took = time.monotonic() - started
        for thread in threads:
            thread.join(timeout=5)
        replies = [read_reply(sock) for sock in (trickler, staller)]
        trickler.close()
        staller.close()
    assert scores.shape == (1,)
    assert took < 1.5  # the slots were freed after grace + a window or two, not after seconds (or a 503)
    assert cut["trickler"] < 1.5 and cut["staller"] < 1.5
    for status, reply in replies:
        assert status == 408 and "request not received in time (upload below 64 KiB/s" in reply["error"]
    lines, err = stderr_lines(capsys, "upload below 64 KiB/s")
    assert len(lines) == 2 and "Traceback" not in err


def test_a_body_deadline_is_fixed_by_its_declared_length_and_never_grows_with_bytes_received():
    pace = Pace(header_s=1.0, grace=0.2, min_rate=1000.0, window=10.0, max_s=30.0)
    near, far = socket.socketpair()
    with near, far:
        reader = RequestReader(near, pace, write_timeout=1.0)
        assert reader.deadline == pytest.approx(reader.started + 1.0)  # the head's deadline
        reader.start_body(5000)
        fixed = reader.deadline
        assert fixed - reader.started == pytest.approx(0.2 + 5000 / 1000.0)
        buffer = bytearray(100_000)
        for sent in (60_000, 120_000, 180_000):  # each batch: ~1 min of credit under a growing deadline
            far.sendall(b"x" * 60_000)
            while reader.received < sent:
                reader.readinto(buffer)
            assert reader.deadline == fixed
        reader.start_body(10**9)  # the cap, whatever the length
        assert reader.deadline - reader.started == pytest.approx(30.0)
    assert pace.body_seconds(0) == 0.2 and pace.body_seconds(10**12) == 30.0


def test_a_body_that_stalls_after_a_fast_start_is_cut_at_the_first_check_after_its_lead_runs_out():
    pace = Pace(grace=0.05, min_rate=10 * KIB, window=0.05, max_s=30.0)  # checks every 0.05 s from 0.1 s
    near, far = socket.socketpair()
    with near, far:
        reader = RequestReader(near, pace, write_timeout=1.0)
        reader.start_body(100_000)  # a deadline of about 10 s
        far.sendall(b"x" * 1792)  # a lead of 0.175 s at the floor: on schedule until 0.225 s
        got = reader.readinto(bytearray(9000))
        with pytest.raises(RequestDeadline, match=r"upload below 10 KiB/s: 1792 bytes of the body in 0\.\d s, "
                                                  r"\d+ due after a 0.05 s grace"):
            while True:
                reader.readinto(bytearray(100))
        took = time.monotonic() - reader.started
    assert got == 1792 and 0.2 < took < 0.6  # not at the first checks while ahead, nor at the 10 s deadline


def test_an_upload_ahead_of_the_floor_survives_a_pause_of_several_windows_and_is_served():
    """The review's case, scaled: 2/3 of the body at once (a lead until ~0.75 s), no byte for 4
    windows (a TCP stall), then the rest: ~2.5 times the floor on average, well inside its deadline
    (a per-window rule cut it at 0.3 s with a 408)."""
    body = json.dumps({"prompts": [PROMPT], "images": [png_base64(noise_images(1, size=512)[0])]}).encode()
    assert 1_000_000 < len(body) < 1_100_000  # about 1 s at the floor: a deadline of about 1.1 s
    with server(token=TOKEN, grace=0.1, window=0.1, min_rate=1024 * KIB) as (_, url), \
            connect(int(url.rsplit(":", 1)[1])) as sock:
        started = time.monotonic()
        sock.sendall(post_head(len(body)) + body[:2 * len(body) // 3])
        time.sleep(0.4)
        with contextlib.suppress(OSError):  # a server that cut it has closed: its 408 is read below
            sock.sendall(body[2 * len(body) // 3:])
        status, reply = read_reply(sock)
        took = time.monotonic() - started
    assert (status, len(reply.get("scores", []))) == (200, 1), reply
    assert took > 0.4


def test_a_lowered_rate_floor_raises_the_request_cap_so_the_largest_body_at_the_floor_fits():
    largest = body_limit()  # about 90 MB at the defaults
    slow = Pace(min_rate=256 * KIB).covering(largest)
    assert slow.body_seconds(largest) == pytest.approx(5.0 + largest / (256 * KIB)) and slow.max_s > 340  # not 300
    assert Pace().covering(largest) == Pace()  # at 1 MiB/s the largest body needs ~91 s: the 300 s cap stays
    made = make_server(build_scorer("toy_color"), min_rate=256 * KIB)
    made.server_close()
    assert made.RequestHandlerClass.request_pace == slow


def test_the_head_must_arrive_in_its_byte_budget_before_authentication(capsys):
    with server(token=TOKEN) as (_, url), connect(int(url.rsplit(":", 1)[1])) as sock:
        sock.sendall(b"GET /v1/info HTTP/1.1\r\n" + b"X-Pad: " + b"a" * (40 * KIB))
        status, reply = read_reply(sock)
        assert sock.recv(1) == b""
    assert status == 431 and reply["error"].startswith("request line and headers too large (more than 32768 bytes")
    lines, err = stderr_lines(capsys, "too large")
    assert len(lines) == 1 and "Traceback" not in err


# ------------------------------------------------------------------ finding 12: idle sockets without a token


class IdleFlood:
    """Keeps ``count`` idle connections without a token open to a port, reopening each one the
    server closes, in a daemon thread, until stopped."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count, self.opened = port, count, 0
        self.stop = threading.Event()
        self.sockets: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> None:
        with contextlib.suppress(OSError):
            self.sockets.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
            self.opened += 1

    def _run(self) -> None:
        while not self.stop.is_set():
            closed = select.select(self.sockets, [], [], 0)[0] if self.sockets else []
            for sock in closed:
                self.sockets.remove(sock)
                sock.close()
            for _ in range(self.count - len(self.sockets)):
                self._open()
            time.sleep(0.005)

    def __enter__(self) -> IdleFlood:
        for _ in range(self.count):
            self._open()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for sock in self.sockets:
            sock.close()


def test_many_idle_sockets_without_a_token_do_not_starve_a_remote_scorer(capsys):
    with server(token=TOKEN, max_connections=16) as (made, url), \
            IdleFlood(int(url.rsplit(":", 1)[1]), 64) as flood:
        time.sleep(0.1)
        remote_scorer = build_scorer(f"toy_color@{url}", token=TOKEN, retries=3, backoff=0.05)
        started = time.monotonic()
        served = [remote_scorer.score(noise_images(1, size=32, seed=i), [PROMPT]).shape for i in range(8)]
        took = time.monotonic() - started
        waiting = len(made.admission.waiting)
    assert served == [(1,)] * 8  # 8 of 8 legitimate requests (the issue: 8 of 8 got 503)
    assert took < 3 and flood.opened > 64
    assert waiting <= 8  # unauthenticated connections hold at most half of the 16
    lines, err = stderr_lines(capsys, "to make room for a new connection")
    assert lines and "Traceback" not in err and "503" not in err


def test_an_idle_connection_without_a_token_is_closed_at_the_head_deadline(capsys):
    with server(token=TOKEN, header_s=0.2) as (made, url), connect(int(url.rsplit(":", 1)[1])) as sock:
        started = time.monotonic()
        status, reply = read_reply(sock)
        took = time.monotonic() - started
        assert sock.recv(1) == b""
    assert status == 408 and "a request's line and headers get 0.2 s" in reply["error"]
    assert 0.15 < took < 1.0 and not made.admission.waiting
    lines, err = stderr_lines(capsys, "line and headers get")
    assert len(lines) == 1 and "Traceback" not in err


def test_a_new_connection_closes_an_idle_unauthenticated_one_of_the_busiest_address_first():
    admission = Admission(8)  # 4 unauthenticated at most, 2 of one address
    pairs = [socket.socketpair() for _ in range(7)]
    socks = [pair[0] for pair in pairs]
    try:
        assert admission.enter(socks[0], ("10.0.0.1", 1)) and admission.enter(socks[1], ("10.0.0.1", 2))
        admission.heard(socks[0])  # the older one is reading its head: the idle one goes
        assert admission.enter(socks[2], ("10.0.0.1", 3))
        assert list(admission.waiting) == [socks[0], socks[2]] and socks[1].recv(1) == b""
        assert admission.authenticate(socks[0]) and not admission.authenticate(socks[1])
        for i, sock in enumerate(socks[3:6]):
            assert admission.enter(sock, ("10.0.0.2" if i < 2 else "10.0.0.3", i))
        pairs[3][1].sendall(b"GET")  # its head waits in the kernel: not idle
        assert admission.enter(socks[6], ("10.0.0.4", 1))  # 4 unauthenticated: the busiest address pays
        assert list(admission.waiting) == [socks[2], socks[3], socks[5], socks[6]] and socks[4].recv(1) == b""
        full = Admission(1)
        assert full.enter(socks[0], ("10.0.0.1", 1)) and full.authenticate(socks[0])
        assert not full.enter(socks[1], ("10.0.0.1", 2))  # all busy with requests: the caller answers 503
    finally:
        for pair in pairs:
            for sock in pair:
                sock.close()


# ------------------------------------------------------------------ the body limit follows the batch


@pytest.mark.parametrize("size", [(1, 4096), (4096, 1), (64, 64)])
def test_the_body_limit_holds_the_largest_body_our_client_sends_for_the_batch(size):
    image = Image.frombytes("RGB", size, noise_images(1, size=64)[0].tobytes())  # 4096 noisy pixels
    encoded = png_base64(image)
    assert len(encoded) <= 4 * (png_limit(4096) + 2) // 3
    body = json.dumps({"prompts": ["é" * (PROMPT_ROOM // 6)] * 3, "images": [encoded] * 3}).encode()
    assert len(body) <= body_limit(3, 4096)


def test_the_default_body_limit_is_one_scorer_batch_and_clients_send_at_most_the_servers_batch():
    assert MAX_BATCH == 16 and 85_000_000 < body_limit() < 95_000_000  # was 270 MB for 64 images
    assert body_limit(64) > 4 * body_limit(16) - 4 * (1 << 16)
    with server(max_batch=2) as (_, url):
        remote_scorer = build_scorer(f"toy_color@{url}", batch_size=8)
        assert remote_scorer.batch_size == 2  # from /v1/info: 8 per request would be refused (400)
        assert remote_scorer.score(noise_images(5, size=16), [PROMPT] * 5).shape == (5,)


def test_serve_reward_takes_its_batch_as_max_batch_and_a_minimum_upload_rate(monkeypatch):
    given: dict = {}
    monkeypatch.setattr("recast_cli.rewards.server.serve", lambda *args, **kwargs: given.update(kwargs))
    result = CliRunner().invoke(app, ["serve-reward", "toy_color", "--batch-size", "4", "--min-upload-rate", "100"])
    assert result.exit_code == 0, result.stderr
    assert given["max_batch"] == 4 and given["min_rate"] == 100 * 1024
    refused = CliRunner().invoke(app, ["serve-reward", "toy_color", "--min-upload-rate", "0"])
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "--min-upload-rate" in refused.stderr and "Traceback" not in refused.stderr
