"""Every request recast makes to a server has one deadline for the whole of it and a cap on the answer
(issue 51, items 2, 6, 7 and 8).

A hostile server on loopback (a raw socket: it sends what it likes, when it likes) answers
``serve-judges``' and ``check-setting``'s checks of a judge's vLLM server (``GET {url}/models``) and a
remote scorer's requests (``recast score --rewards NAME@URL``):

* item 2: a head, then ``Content-Length: 100`` and one byte every 0.3 s (or a head that trickles): a socket
  timeout never fired; now the whole request has ``$RECAST_CHECK_SECONDS`` (the scorers: their ``timeout``);
* item 6: a model list nested 100 000 deep was a RecursionError traceback; now it is read through the
  bounded JSON reader, with a size cap (an answer declaring 50 MB is refused before it is read);
* item 7: a judge url with port 99999, or ``http://[::1``, was a ValueError traceback; now one line naming
  the judge's table and the url;
* item 8: model ids went to the terminal raw (an ESC colour sequence got through), uncut; now escaped, each
  id and the list cut short.

Every command runs as ``python -m recast_cli`` in a folder outside the checkout, so that $PYTHONPATH picks
the code under test; each must end within seconds (the old code hung: the subprocess timeout fails it).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
ESC_ID = "\x1b[31mred-model\x1b[0m" + "x" * 5000  # an ESC colour sequence, and far too long to show whole
NESTED = b"[" * 100_000


def _answer(conn: socket.socket, mode: str, path: str, stop: threading.Event) -> None:
    """What the hostile server sends for ``mode`` to a request for ``path``."""
    def send_json(payload, status: str = "200 OK") -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + body)

    def trickle(data: bytes) -> None:
        for byte in data:
            if stop.wait(0.3):
                return
            conn.sendall(bytes([byte]))

    probe = not path.endswith(("/models", "/v1/info", "/score"))  # check-setting's "does it answer" GET
    if mode == "trickle-head":
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        trickle(b"X-Slow: " + b"a" * 200)
    elif mode == "trickle-body" or (mode == "trickle-models" and not probe):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        trickle(b" " * 100)
    elif probe:
        send_json({})
    elif mode == "nested":
        send_json(NESTED)
    elif mode == "huge":
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 50000000\r\n\r\n")
        trickle(b" " * 100)
    elif mode == "ids":
        send_json({"data": [{"id": ESC_ID}] + [{"id": f"model-{i}"} for i in range(40)]})
    elif mode == "error-esc":
        send_json({"error": "\x1b[2J\x1b[31mboom " + "y" * 3000}, "400 Bad Request")


@contextlib.contextmanager
def hostile(mode: str):
    """A raw HTTP server on 127.0.0.1 answering every request as ``mode`` says; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            _answer(conn, mode, head.split(b" ", 2)[1].decode("latin-1"), stop)
            stop.wait(0.5)  # then close

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def setting(tmp_path: Path, url: str, rewards: str = '"toy_color"') -> Path:
    """A toy setting whose held-out judge is unifiedreward at ``url``, training on ``rewards``."""
    path = tmp_path / "judged.toml"
    path.write_text(
        f'[policy]\nkind = "sd3"\npath = "{ROOT}/pipelines/toy/model"\nsteps = 4\nresolution = 32\n'
        'max_sequence_length = 1\nprecision = "no"\nprompt_check = "toy"\n'
        f'[train]\nrewards = [{rewards}]\nlambda = [1]\nprompts = "toy"\n'
        '[evaluate]\njudges = ["unifiedreward"]\n'
        f'[rewards.unifiedreward]\nurl = "{url}"\nretries = 1\ntimeout = 10\n')
    return path


def recast(tmp_path: Path, *args: str, seconds: float = 15.0) -> subprocess.CompletedProcess:
    """``python -m recast_cli ARGS`` in ``tmp_path`` (not the checkout: $PYTHONPATH's recast_cli, else the
    installed one), each server request given 1 s; fails the test past ``seconds``."""
    env = {**os.environ, "RECAST_CHECK_SECONDS": "1"}
    env.pop("RECAST_VLM_API_KEY", None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "recast_cli", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=seconds)
    done.took = time.monotonic() - started
    return done


def one_error_line(done: subprocess.CompletedProcess) -> str:
    """The one line of a refusal (exit 2, no traceback, nothing a terminal would obey)."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout and "\x1b" not in done.stderr + done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("recast: error:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def serve_judges(tmp_path: Path, url: str) -> subprocess.CompletedProcess:
    return recast(tmp_path, "serve-judges", "--setting", str(setting(tmp_path, url)), "--vllm",
                  str(tmp_path / "no-vllm"), "--logs", str(tmp_path / "logs"), "--", sys.executable, "-c", "")


# ------------------------------------------------------------------ item 2: one deadline for the whole request


def test_serve_judges_gives_up_on_a_server_that_trickles_its_model_list(tmp_path):
    with hostile("trickle-models") as port:
        done = serve_judges(tmp_path, f"http://127.0.0.1:{port}/v1")
    line = one_error_line(done)
    assert f"judge unifiedreward: GET http://127.0.0.1:{port}/v1/models failed (timed out after 1 s)" in line
    assert done.took < 12


def test_check_setting_gives_up_on_a_trickling_server_and_lists_a_judge_whose_models_nest_deep(tmp_path):
    with hostile("trickle-head") as slow, hostile("nested") as nested:
        url = f"http://127.0.0.1:{slow}"
        done = recast(tmp_path, "check-setting", str(setting(tmp_path, f"http://127.0.0.1:{nested}/v1",
                                                              f'"toy_color@{url}"')), seconds=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert f"its server {url} does not answer (timed out after 1 s)" in done.stderr  # the training reward
    shown = " ".join(done.stdout.split())  # the judge, listed for make judges (item 6)
    assert ("judge unifiedreward: the answer to GET http://127.0.0.1:"
            f"{nested}/v1/models is JSON nested deeper than 64 levels") in shown


@pytest.mark.parametrize("scorer", ["toy_color@{url}", "unifiedreward"])
def test_a_remote_scorer_or_chat_judge_gives_up_on_a_server_that_trickles_within_its_timeout(tmp_path, scorer):
    Image.new("RGB", (8, 8), "red").save(tmp_path / "a.png")
    with hostile("trickle-body") as port:
        url = f"http://127.0.0.1:{port}"
        name = scorer.format(url=url)
        options = ["--opt", f"unifiedreward.url={url}/v1"] if name == "unifiedreward" else []
        base = name.split("@")[0]
        done = recast(tmp_path, "score", "--rewards", name, *options, "--opt", f"{base}.timeout=1", "--opt",
                      f"{base}.retries=1", "--images", str(tmp_path / "a.png"), "--prompt",
                      "a red circle on a white background", "--out", str(tmp_path / "S.parquet"))
    assert "unreachable after 1 tries (last: timed out)" in one_error_line(done)
    assert done.took < 12


# ------------------------------------------------------------------ item 6: the bounded JSON reader, a size cap


@pytest.mark.parametrize("mode, needle", [
    ("nested", "the answer to GET http://127.0.0.1:{port}/v1/models is JSON nested deeper than 64 levels"),
    ("huge", "/v1/models failed (answered 50000000 bytes, more than the 1048576 allowed)"),
])
def test_serve_judges_refuses_a_model_list_nested_too_deep_or_too_large(tmp_path, mode, needle):
    with hostile(mode) as port:
        done = serve_judges(tmp_path, f"http://127.0.0.1:{port}/v1")
    assert needle.format(port=port) in one_error_line(done) and "RecursionError" not in done.stderr


@pytest.mark.parametrize("mode, needle", [
    ("nested", "toy_color: the server's reply is JSON nested deeper than 64 levels"),
    ("huge", "answered 50000000 bytes, more than the 16777216 allowed"),
])
def test_a_remote_scorer_refuses_a_reply_nested_too_deep_or_too_large(tmp_path, mode, needle):
    Image.new("RGB", (8, 8), "red").save(tmp_path / "a.png")
    with hostile(mode) as port:
        done = recast(tmp_path, "score", "--rewards", f"toy_color@http://127.0.0.1:{port}", "--opt",
                      "toy_color.retries=1", "--images", str(tmp_path / "a.png"), "--prompt",
                      "a red circle on a white background", "--out", str(tmp_path / "S.parquet"))
    assert needle in one_error_line(done)


# ------------------------------------------------------------------ item 7: a malformed url is one line


@pytest.mark.parametrize("url, why", [("http://127.0.0.1:99999/v1", "has a port that is not a number in 1..65535"),
                                      ("http://[::1", "is not a well-formed URL")])
def test_serve_judges_refuses_a_malformed_judge_url_in_one_line(tmp_path, url, why):
    line = one_error_line(serve_judges(tmp_path, url))
    assert f"[rewards.unifiedreward] url {url!r} {why}" in line


def test_check_setting_names_malformed_server_urls_in_one_line_each(tmp_path):
    done = recast(tmp_path, "check-setting", str(setting(tmp_path, "http://127.0.0.1:99999/v1",
                                                          '"toy_color@http://[::1"')), seconds=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert "its server url 'http://[::1' is not a well-formed URL" in done.stderr  # the training reward
    assert ("judge unifiedreward: its server url 'http://127.0.0.1:99999/v1' has a port that is not a number in "
            "1..65535") in " ".join(done.stdout.split())


def test_a_judges_malformed_url_fails_check_setting_though_judges_are_listed_apart(tmp_path):
    """What a judge lacks (its server, its weights) is for make judges and does not fail the check; a url that
    can never work is a typo in the setting, and does."""
    done = recast(tmp_path, "check-setting", str(setting(tmp_path, "http://127.0.0.1:99999/v1")), seconds=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert ("[rewards.unifiedreward] url 'http://127.0.0.1:99999/v1' has a port that is not a number in 1..65535"
            in " ".join(done.stderr.split()))


@pytest.mark.parametrize("url, why", [("http://127.0.0.1:99999", "has a port that is not a number in 1..65535"),
                                      ("http://[::1", "is not a well-formed URL")])
def test_score_refuses_a_malformed_server_url_in_one_line(tmp_path, url, why):
    Image.new("RGB", (8, 8), "red").save(tmp_path / "a.png")
    scored = recast(tmp_path, "score", "--rewards", f"toy_color@{url}", "--images", str(tmp_path / "a.png"),
                    "--prompt", "a red circle on a white background", "--out", str(tmp_path / "S.parquet"))
    assert f"{url!r} {why}" in one_error_line(scored)


# ------------------------------------------------------------------ item 8: what a server sends is shown safely


def test_model_ids_a_server_sends_are_escaped_and_cut(tmp_path):
    with hostile("ids") as port:
        done = serve_judges(tmp_path, f"http://127.0.0.1:{port}/v1")
    line = one_error_line(done)
    assert "serves \\x1b[31mred-model\\x1b[0mxxx" in line and f"({len(ESC_ID) - 100} more characters)" in line
    assert "model-6 and 33 more, not 'UnifiedReward-2.0-qwen-7b'" in line and len(line) < 1000


def test_a_remote_scorers_error_text_is_escaped_and_cut(tmp_path):
    Image.new("RGB", (8, 8), "red").save(tmp_path / "a.png")
    with hostile("error-esc") as port:
        done = recast(tmp_path, "score", "--rewards", f"toy_color@http://127.0.0.1:{port}", "--opt",
                      "toy_color.retries=1", "--images", str(tmp_path / "a.png"), "--prompt",
                      "a red circle on a white background", "--out", str(tmp_path / "S.parquet"))
    line = one_error_line(done)
    assert "answered HTTP 400: \\x1b[2J\\x1b[31mboom yyy" in line and "more characters)" in line
