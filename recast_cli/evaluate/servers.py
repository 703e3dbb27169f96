"""``recast serve-judges``: the servers a setting's judges score through, running for as long as a command runs.

``make judges`` runs the study's judge recipes inside ``recast serve-judges --setting S -- make … judges``.
A judge whose scorer class names what serves it (``served_by = ("vllm", WEIGHTS)``: ``unifiedreward``) and
whose ``url`` is on this host gets that server started when nothing answers there::

    vllm serve WEIGHTS --host HOST --port PORT --served-model-name MODEL
         --gpu-memory-utilization SHARE --max-model-len 8192

MODEL is the judge's ``model`` option, the name its requests carry (vLLM's own default name would be
WEIGHTS, and every request would be a 404). The server's output goes to ``LOGS/JUDGE.log``; an API key
(the judge's ``api_key`` option, else ``$RECAST_VLM_API_KEY``) reaches it as ``VLLM_API_KEY`` in its
environment, never on its command line; the judges' ``PYTHONPATH`` (their side package sets) is not
passed to it, as vLLM brings its own transformers. The command starts once every such server answers ``GET
{url}/models`` and lists the judge's model; the servers are stopped when it ends, however it ends
(:mod:`recast_cli.processes`: the servers and the command each run in a process group of their own;
Ctrl-C, SIGTERM or SIGHUP to recast reaches the command's group, and the servers' groups get SIGTERM, then
SIGKILL after a grace; recast exits 128 + the signal). The log is a regular file of recast's own: a
symbolic link, FIFO or hard link at its name is refused. A server that already answers is used
as it is, after the same check of its model; one on another host is the user's to start. Without a
command the servers run until interrupted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from recast_cli import processes
from recast_cli.artifacts.regular import open_append
from recast_cli.errors import BadInput
from recast_cli.evaluate.config import config_from_setting
from recast_cli.setting.environment import (other_model, served_endpoint, served_model_problem, served_models,
                                             unreachable)
from recast_cli.setting.load import Setting

#: Hosts a server is started on; a url elsewhere names a server the user runs.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")
#: The GPU-memory share of a judge's vLLM server: about 24 GB of an 80 GB GPU, the 7 B model in bf16 and
#: its KV cache (docs/gpu.md), leaving the rest to the judges scored in process.
DEFAULT_SHARE = 0.3
#: Context the server is sized for: a 512 px image is a few hundred tokens, the question and reply < 1 k.
DEFAULT_MAX_MODEL_LEN = 8192
#: Seconds a server may take to load its weights and answer (a 7 B model loads in minutes).
DEFAULT_START_TIMEOUT = 1800.0
STOP_GRACE = 30.0


@dataclass(frozen=True)
class JudgeServer:
    """One judge's server: where it answers, the model name its requests carry, what serves it and from
    which weights, and ``state``: ``up`` (answers now), ``start`` (on this host, to be started) or
    ``remote`` (elsewhere, not answering: the user's to start)."""

    judge: str
    url: str
    model: str
    launcher: str
    weights: str
    api_key: str | None
    state: str

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)


def plan_servers(setting: Setting) -> list[JudgeServer]:
    """The servers of the setting's ``[evaluate] judges`` that recast knows how to start, each with its
    state now (one HTTP try each)."""
    from recast_cli.rewards.registry import scorer_class

    cfg, train = config_from_setting(setting)
    plans = []
    for name in cfg.judges:
        if "@" in name:  # NAME@URL: a recast serve-reward server the user runs in the judge's environment
            continue
        cls = scorer_class(name)
        served = getattr(cls, "served_by", None)
        if served is None:
            continue
        url, model, key = served_endpoint(cls, dict(train.reward_options.get(name, {})))
        local = urlsplit(url).hostname in LOCAL_HOSTS
        state = "up" if unreachable(url) is None else ("start" if local else "remote")
        plans.append(JudgeServer(name, url, model, served[0], served[1], key, state))
    return plans


def server_command(server: JudgeServer, launcher: str, share: float, max_model_len: int) -> list[str]:
    """The command line that starts ``server`` (no secret on it)."""
    if server.launcher != "vllm":
        raise BadInput(f"judge {server.judge}: recast cannot start a {server.launcher!r} server")
    return [launcher, "serve", server.weights, "--host", server.host, "--port", str(server.port),
            "--served-model-name", server.model, "--gpu-memory-utilization", f"{share:g}",
            "--max-model-len", str(max_model_len)]


@contextmanager
def serving(servers: Sequence[JudgeServer], launcher: str, logs: Path, *, share: float = DEFAULT_SHARE,
            max_model_len: int = DEFAULT_MAX_MODEL_LEN, start_timeout: float = DEFAULT_START_TIMEOUT,
            poll: float = 1.0, say=None) -> Iterator[None]:
    """Start every ``start`` server, wait until each answers with its model, yield, and stop them; a
    server that is ``up`` is checked, a ``remote`` one that does not answer is BadInput."""
    for server in servers:
        if server.state == "remote":
            raise BadInput(f"judge {server.judge}: its server {server.url} does not answer and is not on this "
                           "host; start it there")
        if server.state == "up" and (why := served_model_problem(server.url, server.model, server.api_key)):
            raise BadInput(f"judge {server.judge}: {why}")
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    to_start = [s for s in servers if s.state == "start"]
    if to_start and shutil.which(launcher) is None:
        raise BadInput(f"judge {to_start[0].judge}: its server {to_start[0].url} does not answer and {launcher} "
                       "is not an executable here; `make side-vllm` builds .side/vllm (or give --vllm PATH, or "
                       "start the server yourself: " + " ".join(server_command(to_start[0], "vllm", share,
                                                                              max_model_len)) + ")")
    started: list[tuple[JudgeServer, subprocess.Popen, Path]] = []
    try:
        for server in to_start:
            started.append(_start(server, launcher, logs, share, max_model_len, say))
        for server, process, log in started:
            _wait_until_serving(server, process, log, start_timeout, poll)
            say(f"judge {server.judge}: {server.url} serves {server.model}")
        yield
    finally:
        for server, process, _ in started:
            processes.stop(process, grace=STOP_GRACE)
            say(f"judge {server.judge}: server stopped")


def _start(server: JudgeServer, launcher: str, logs: Path, share: float, max_model_len: int,
           say) -> tuple[JudgeServer, subprocess.Popen, Path]:
    """Start ``server``'s process (its own process group, stopped if recast dies), its output appended to
    ``LOGS/JUDGE.log``: a regular file of recast's own (never a link, a FIFO or another name of a file)."""
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--logs {logs}: cannot create it ({exc.strerror or exc})") from None
    log = logs / f"{server.judge}.log"
    # its own environment: not the judges' side package sets (PYTHONPATH: another transformers)
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "PYTHONPATH", "PYTHONHOME")}
    if server.api_key:
        env["VLLM_API_KEY"] = server.api_key
    command = server_command(server, launcher, share, max_model_len)
    with open_append(log, f"judge {server.judge}'s log") as sink:
        process = processes.start(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    say(f"judge {server.judge}: started {' '.join(command)} (pid {process.pid}; log {log})")
    return server, process, log


def _wait_until_serving(server: JudgeServer, process: subprocess.Popen, log: Path, timeout: float,
                        poll: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        code = process.poll()
        if code is not None:
            raise BadInput(f"judge {server.judge}: its server exited with code {code} before answering; "
                           f"{log}: {_last_line(log)}")
        answer = "no answer"
        if unreachable(server.url, timeout=min(5.0, poll * 5)) is None:
            ids, answer = served_models(server.url, server.api_key)
            if ids is not None:  # its list of models is final: the judge's is in it or never will be
                if server.model in ids:
                    return
                raise BadInput(f"judge {server.judge}: {other_model(server.url, server.model, ids)}")
        if time.monotonic() > deadline:
            raise BadInput(f"judge {server.judge}: its server did not serve at {server.url} within {timeout:g} s "
                           f"(--start-timeout; {answer}); {log}: {_last_line(log)}")
        time.sleep(poll)


def _last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return " ".join((lines[-1] if lines else "empty").split())[:200]


def run_with_servers(setting: Setting, command: Sequence[str], launcher: str, logs: Path, **options) -> int:
    """Run ``command`` while the setting's judge servers run (:func:`serving`); its exit code. Without a
    command, serve until interrupted (exit 0)."""
    servers = plan_servers(setting)
    with serving(servers, launcher, logs, **options):
        if not command:
            if not servers:
                print(f"{setting.file.name}: no judge of [evaluate] judges is served by a server recast starts")
                return 0
            print("serving until interrupted (Ctrl-C, SIGTERM or SIGHUP stops the servers)")
            while True:
                time.sleep(3600)
        sys.stdout.flush()
        try:  # in a process group of its own: a stop signal reaches it once, from here, and all it started
            return processes.run(command, grace=STOP_GRACE)
        except FileNotFoundError:
            raise BadInput(f"{command[0]}: no such command") from None
        except PermissionError:
            raise BadInput(f"{command[0]}: not an executable") from None
