"""``recast serve-judges`` (what ``make judges`` runs its judges inside) against a fake ``vllm``.

The fake is an executable Python script standing where ``--vllm`` points: it records its command line and
whether it was given an API key, then serves an OpenAI-compatible endpoint (``GET /v1/models`` lists the
``--served-model-name`` it was started with; chat completions answer "Final Score: 4") on the host and
port it was given, until it is signalled. The real ``unifiedreward`` scorer asks it, so the whole path
is the one a GPU node takes, short of vLLM itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_VLLM = textwrap.dedent('''\
    #!{python}
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    args = sys.argv[1:]
    record = os.environ["FAKE_VLLM_RECORD"]
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    with open(record, "w") as f:
        json.dump({{"argv": args, "api_key": os.environ.get("VLLM_API_KEY"),
                   "pythonpath": os.environ.get("PYTHONPATH"), "pid": os.getpid()}}, f)
    print("INFO loading weights", args[1], flush=True)
    if mode == "crash":
        print("ValueError: CUDA out of memory while loading", flush=True)
        sys.exit(3)
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0.5")))
    value = lambda flag: args[args.index(flag) + 1]
    served = "someone-else" if mode == "wrong-model" else value("--served-model-name")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.send(200, {{"data": [{{"id": served}}]}} if self.path == "/v1/models" else {{}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body["model"] != served:
                return self.send(404, {{"error": {{"message": "The model does not exist."}}}})
            with open(record + ".chats", "a") as f:
                f.write("1\\n")
            self.send(200, {{"choices": [{{"message": {{"content": "Final Score: 4"}}}}]}})

    ThreadingHTTPServer((value("--host"), int(value("--port"))), Handler).serve_forever()
''')


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port: int) -> bool:
    with closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def world(tmp_path):
    """A setting whose only judge is unifiedreward at a free local port, and the fake vllm."""
    port = free_port()
    setting = tmp_path / "judged.toml"
    setting.write_text(
        f'[policy]\nkind = "sd3"\npath = "{ROOT}/pipelines/toy/model"\nsteps = 4\nresolution = 32\n'
        'max_sequence_length = 1\nprecision = "no"\nprompt_check = "toy"\n'
        '[train]\nrewards = ["toy_color"]\nlambda = [1]\nprompts = "toy"\n'
        '[evaluate]\njudges = ["aesthetic", "unifiedreward"]\n'
        f'[rewards.unifiedreward]\nurl = "http://127.0.0.1:{port}/v1"\nretries = 1\ntimeout = 10\n')
    vllm = tmp_path / "bin" / "vllm"
    vllm.parent.mkdir()
    vllm.write_text(FAKE_VLLM.format(python=sys.executable))
    vllm.chmod(0o755)
    record = tmp_path / "record.json"
    env = {**os.environ, "FAKE_VLLM_RECORD": str(record)}
    env.pop("RECAST_VLM_API_KEY", None)
    return {"setting": setting, "vllm": vllm, "record": record, "port": port, "env": env, "logs": tmp_path / "logs"}


def serve(world, *command, env=None, extra=()):
    return subprocess.run([sys.executable, "-m", "recast_cli", "serve-judges", "--setting", str(world["setting"]),
                           "--vllm", str(world["vllm"]), "--logs", str(world["logs"]), *extra, "--", *command],
                          capture_output=True, text=True, env=env or world["env"], cwd=ROOT, timeout=300)


#: What runs while the server runs: the real unifiedreward scorer, with its default model name, on two images.
SCORE = ("import sys; from PIL import Image; from recast_cli.rewards import build_scorer; "
         "s = build_scorer('unifiedreward', url=sys.argv[1], retries=1); "
         "print('scores', [float(v) for v in s.score([Image.new('RGB', (8, 8))] * 2, ['a cat', 'a dog'])])")


def test_a_judge_server_is_started_for_the_command_and_stopped_after(world):
    url = f"http://127.0.0.1:{world['port']}/v1"
    env = {**world["env"], "RECAST_VLM_API_KEY": "sekrit-key", "PYTHONPATH": str(ROOT)}  # as make judges' side sets
    done = serve(world, sys.executable, "-c", SCORE, url, env=env)
    assert done.returncode == 0, done.stderr
    assert "scores [0.8, 0.8]" in done.stdout  # s / 5 with s = 4, asked under the judge's model name
    record = json.loads(world["record"].read_text())
    argv = record["argv"]
    assert argv[:2] == ["serve", "CodeGoat24/UnifiedReward-2.0-qwen-7b"]
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags == {"--host": "127.0.0.1", "--port": str(world["port"]),
                     "--served-model-name": "UnifiedReward-2.0-qwen-7b", "--gpu-memory-utilization": "0.3",
                     "--max-model-len": "8192"}
    assert record["api_key"] == "sekrit-key" and "sekrit-key" not in done.stderr + done.stdout  # env, not argv
    assert record["pythonpath"] is None  # the server runs in its own environment, not the judges' side sets
    assert (world["logs"] / "unifiedreward.log").read_text().startswith("INFO loading weights")
    assert "server stopped" in done.stderr and not answers(world["port"])
    with pytest.raises(ProcessLookupError):
        os.kill(record["pid"], 0)


def test_the_command_exit_code_is_kept_and_the_server_still_stopped(world):
    done = serve(world, sys.executable, "-c", "import sys; sys.exit(5)", extra=("--share", "0.45"))
    assert done.returncode == 5
    assert "--gpu-memory-utilization 0.45" in done.stderr
    assert not answers(world["port"])


def test_needs_lists_what_must_be_started_and_a_running_server_is_used_as_it_is(world):
    needs = subprocess.run([sys.executable, "-m", "recast_cli", "serve-judges", "--setting", str(world["setting"]),
                            "--needs"], capture_output=True, text=True, env=world["env"], cwd=ROOT, timeout=120)
    assert needs.returncode == 0 and needs.stdout.split() == ["vllm"]
    first = world["record"].with_name("first.json")
    server = subprocess.Popen([str(world["vllm"]), "serve", "weights", "--host", "127.0.0.1", "--port",
                               str(world["port"]), "--served-model-name", "UnifiedReward-2.0-qwen-7b"],
                              env={**world["env"], "FAKE_VLLM_RECORD": str(first), "FAKE_VLLM_DELAY": "0"})
    try:
        deadline = time.monotonic() + 30
        while not answers(world["port"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        again = subprocess.run([sys.executable, "-m", "recast_cli", "serve-judges", "--setting",
                                str(world["setting"]), "--needs"], capture_output=True, text=True, env=world["env"],
                               cwd=ROOT, timeout=120)
        assert again.returncode == 0 and again.stdout.strip() == ""
        done = serve(world, sys.executable, "-c", SCORE, f"http://127.0.0.1:{world['port']}/v1")
        assert done.returncode == 0 and "scores [0.8, 0.8]" in done.stdout, done.stderr
        assert not world["record"].exists()  # nothing was started
        assert server.poll() is None  # and the user's server is left running
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.parametrize("mode, needle", [
    ("crash", "its server exited with code 3 before answering; {logs}/unifiedreward.log: ValueError: CUDA out of "
              "memory while loading"),
    ("wrong-model", "serves someone-else, not 'UnifiedReward-2.0-qwen-7b': start it with --served-model-name"),
    ("missing", "is not an executable here; `make side-vllm` builds .side/vllm"),
])
def test_a_server_that_cannot_serve_the_judge_is_one_line_and_the_command_never_runs(world, mode, needle):
    env = {**world["env"], "FAKE_VLLM_MODE": mode}
    if mode == "missing":
        world["vllm"].unlink()
    marker = world["record"].with_name("ran")
    done = serve(world, sys.executable, "-c", f"open({str(marker)!r}, 'w')", env=env,
                 extra=("--start-timeout", "20"))
    assert done.returncode == 2, done.stderr
    assert needle.format(logs=world["logs"]) in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("recast: error: judge unifiedreward:")
    assert not marker.exists() and not answers(world["port"])


def test_a_server_on_another_host_is_the_users(world):
    world["setting"].write_text(world["setting"].read_text().replace("http://127.0.0.1", "http://192.0.2.1"))
    done = serve(world, "true")
    assert done.returncode == 2
    assert "does not answer and is not on this host; start it there" in done.stderr
    assert not world["record"].exists()


@pytest.mark.parametrize("flag, value, needle", [("--share", "0", "--share must be in (0, 1]"),
                                                 ("--max-model-len", "10", "--max-model-len must be in"),
                                                 ("--start-timeout", "-1", "--start-timeout must be > 0")])
def test_bad_flags_are_one_line(world, flag, value, needle):
    from typer.testing import CliRunner

    from recast_cli.cli import app

    result = CliRunner().invoke(app, ["serve-judges", "--setting", str(world["setting"]), flag, value, "--", "true"])
    assert result.exit_code == 2 and needle in result.output


def test_check_setting_names_a_server_that_serves_another_model(world):
    """A server started by hand without --served-model-name answers under the weights' name: every request
    of the judge would be a 404, so check-setting says so, with the flag."""
    server = subprocess.Popen([str(world["vllm"]), "serve", "weights", "--host", "127.0.0.1", "--port",
                               str(world["port"]), "--served-model-name", "UnifiedReward-2.0-qwen-7b"],
                              env={**world["env"], "FAKE_VLLM_MODE": "wrong-model", "FAKE_VLLM_DELAY": "0"})
    try:
        deadline = time.monotonic() + 30
        while not answers(world["port"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        done = subprocess.run([sys.executable, "-m", "recast_cli", "check-setting", str(world["setting"])],
                              capture_output=True, text=True, env=world["env"], cwd=ROOT, timeout=300)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr  # a judge's problem is listed for make judges, not failing the check
    shown = " ".join(done.stdout.split())
    assert "judge unifiedreward: the server at" in shown and "serves someone-else" in shown
    assert "--served-model-name UnifiedReward-2.0-qwen-7b" in shown
