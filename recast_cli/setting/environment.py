"""What a scorer needs around it, checked by ``recast check-setting`` without building it: the packages its
class ``requires`` (imported in a process of its own, so a package that pins another transformers cannot
break this one), the server it scores through (``NAME@URL`` or a ``url`` option: one HTTP answer, any
status), and the key of an image API the positives come from, each with what provides it.

Every request to a server is one ``exchange`` (``rewards/exchange.py``): the whole of it within
``check_seconds()`` (``$RECAST_CHECK_SECONDS``, default 10: a server that trickles its answer is cut
there), a model list of at most ``MODELS_LIMIT`` bytes read with its nesting bounded, and the model ids
a server sends shown with their control characters escaped, each and the list cut short."""

from __future__ import annotations

import inspect
import math
import os
from typing import Any

from recast_cli.errors import BadInput, shown
from recast_cli.rewards.exchange import url_problem

#: The environment variables an API source of positives reads its key from (positives/openai_images.py,
#: positives/gemini_images.py: their ``key_vars``).
API_KEYS = {"openai": ("OPENAI_API_KEY",), "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY")}

#: Seconds one request to a server may take, whole (its answer's head and body), unless
#: ``$RECAST_CHECK_SECONDS`` says otherwise.
CHECK_SECONDS = 10.0
CHECK_SECONDS_ENV = "RECAST_CHECK_SECONDS"
#: Bytes a ``GET {url}/models`` answer may have: vLLM lists one model in a few hundred bytes.
MODELS_LIMIT = 1024 * 1024
#: The most model ids a line shows, and the most characters of each.
SHOWN_IDS, ID_CHARS = 8, 100

#: What starts the server of a scorer that scores over HTTP, by scorer (docs/rewards.md).
SERVER_HINTS = {
    "unifiedreward": "`make judges` starts its vLLM server (recast serve-judges); by hand: `vllm serve "
                     "CodeGoat24/UnifiedReward-2.0-qwen-7b --port 8000 --served-model-name UnifiedReward-2.0-qwen-7b "
                     "--gpu-memory-utilization 0.3 --max-model-len 8192` (docs/gpu.md)",
    "geneval": "start the GenEval detector server (docs/rewards.md)",
}


def environment_problems(name: str, options: dict[str, Any]) -> list[str]:
    """What scorer ``name`` needs around it and does not have, one line each, with what provides it: each
    package of its class's ``requires`` must import (in a process of its own: a package that pins another
    transformers must not break this one), its server (``NAME@URL``, or a ``url`` option) must answer."""
    from recast_cli.rewards.registry import scorer_class

    cls = scorer_class(name)
    problems = []
    for package in getattr(cls, "requires", ()):
        why = import_problem(package)
        if why is not None:
            hint = getattr(cls, "provided_by", "") or f"install {package}"
            problems.append(f"package {package} does not import here ({why}); {hint}")
    base = name.split("@", 1)[0]
    if "@" in name:
        url, hint = name.split("@", 1)[1], f"start `recast serve-reward {base} --port PORT` where its package imports"
    else:
        default = inspect.signature(cls).parameters.get("url")
        url = options.get("url", default.default if default is not None else None)
        hint = SERVER_HINTS.get(base, "start its server")
    if isinstance(url, str) and (why := url_problem(url)) is not None:
        problems.append(f"its server url {shown(url)} {why}")
    elif isinstance(url, str) and url.startswith(("http://", "https://")):
        why = unreachable(url)
        if why is not None:
            problems.append(f"its server {url} does not answer ({why}); {hint}")
        elif getattr(cls, "served_by", None) is not None:
            _, model, key = served_endpoint(cls, options)
            why = served_model_problem(url, model, key)
            if why is not None:
                problems.append(why)
    return problems


def served_endpoint(cls: type, options: dict[str, Any]) -> tuple[str, str, str | None]:
    """(url, the model name its requests carry, API key) of a scorer that scores through a chat server (a
    class with ``url`` and ``model`` parameters): its options, else its defaults; the key from its
    ``api_key`` option, else the environment. A malformed url is BadInput naming the scorer's table."""
    from recast_cli.rewards.chat import API_KEY_ENV

    defaults = inspect.signature(cls).parameters
    url = options.get("url", defaults["url"].default)
    why = url_problem(url)
    if why is not None:
        raise BadInput(f"[rewards.{getattr(cls, 'name', cls.__name__)}] url {shown(url)} {why}")
    return (url, str(options.get("model", defaults["model"].default)),
            options.get("api_key") or os.environ.get(API_KEY_ENV) or None)


def check_seconds() -> float:
    """Seconds one request to a server may take: ``$RECAST_CHECK_SECONDS``, else :data:`CHECK_SECONDS`."""
    raw = os.environ.get(CHECK_SECONDS_ENV, "").strip()
    if not raw:
        return CHECK_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 3600:
        raise BadInput(f"${CHECK_SECONDS_ENV} = {shown(raw)}: expected seconds in (0, 3600]")
    return seconds


def served_models(url: str, api_key: str | None = None, timeout: float | None = None) -> tuple[list[str] | None, str]:
    """(the model names the OpenAI-compatible server at ``url`` lists under ``GET {url}/models``, "") or
    (None, why it gave no list), within ``timeout`` seconds in all (default: :func:`check_seconds`)."""
    from recast_cli.rewards.exchange import NoAnswer, exchange, json_of

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    seconds = check_seconds() if timeout is None else timeout
    try:
        status, body = exchange(url, "GET", "/models", headers=headers, seconds=seconds, max_bytes=MODELS_LIMIT)
    except NoAnswer as exc:
        return None, f"GET {url}/models failed ({exc}{f' after {seconds:g} s' if str(exc) == 'timed out' else ''})"
    if status != 200:
        return None, f"GET {url}/models answered HTTP {status}"
    try:
        data = json_of(body, f"the answer to GET {url}/models")
    except BadInput as exc:  # nested too deeply
        return None, str(exc)
    except ValueError:  # not JSON, or not UTF-8
        return None, f"GET {url}/models gave no JSON"
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None, f"GET {url}/models gave no model list"
    return [str(m.get("id")) for m in data["data"] if isinstance(m, dict)], ""


def served_model_problem(url: str, model: str, api_key: str | None = None,
                         timeout: float | None = None) -> str | None:
    """None when the server at ``url`` lists ``model`` (the name a chat scorer's requests carry), else why
    not, with the flag that fixes it."""
    ids, why = served_models(url, api_key, timeout)
    if ids is None:
        return why
    return None if model in ids else other_model(url, model, ids)


def other_model(url: str, model: str, ids: list[str]) -> str:
    """The line for a server at ``url`` that lists ``ids`` but not ``model``, with the flag that fixes it;
    the ids as the server sent them are shown escaped and cut (at most :data:`SHOWN_IDS` of
    :data:`ID_CHARS` characters each)."""
    from recast_cli.rewards.exchange import server_text

    listed = ", ".join(server_text(i, ID_CHARS) for i in ids[:SHOWN_IDS]) or "no model"
    if len(ids) > SHOWN_IDS:
        listed += f" and {len(ids) - SHOWN_IDS} more"
    return (f"the server at {url} serves {listed}, not {model!r}: start it with "
            f"--served-model-name {model}, or set the judge's model option")


def import_problem(package: str) -> str | None:
    """None when ``package`` imports in a fresh process of this Python, else the last line of its error."""
    import subprocess
    import sys

    if not all(part.isidentifier() for part in package.split(".")):
        return f"{package!r} is not a module name"
    done = subprocess.run([sys.executable, "-c", "import importlib, sys; importlib.import_module(sys.argv[1])",
                           package], capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return " ".join((lines[-1] if lines else f"exit code {done.returncode}").split())[:160]


def unreachable(url: str, timeout: float | None = None) -> str | None:
    """None when an HTTP server answers at ``url`` (any status: its answer's head, within ``timeout``
    seconds in all, default :func:`check_seconds`), else why not (one try)."""
    from recast_cli.rewards.exchange import NoAnswer, exchange

    seconds = check_seconds() if timeout is None else timeout
    try:
        exchange(url, "GET", seconds=seconds, max_bytes=0, read_body=False)
    except NoAnswer as exc:
        return f"{exc} after {seconds:g} s" if str(exc) == "timed out" else str(exc)
    return None
