"""What a scorer needs around it, checked by ``recast check-setting`` without building it: the packages its
class ``requires`` (imported in a process of its own, so a package that pins another transformers cannot
break this one), the server it scores through (``NAME@URL`` or a ``url`` option: one HTTP answer, any
status), and the key of an image API the positives come from, each with what provides it."""

from __future__ import annotations

import inspect
import os
from typing import Any

#: The environment variables an API source of positives reads its key from (positives/openai_images.py,
#: positives/gemini_images.py: their ``key_vars``).
API_KEYS = {"openai": ("OPENAI_API_KEY",), "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY")}

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
    if isinstance(url, str) and url.startswith(("http://", "https://")):
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
    ``api_key`` option, else the environment."""
    from recast_cli.rewards.chat import API_KEY_ENV

    defaults = inspect.signature(cls).parameters
    return (str(options.get("url", defaults["url"].default)), str(options.get("model", defaults["model"].default)),
            options.get("api_key") or os.environ.get(API_KEY_ENV) or None)


def served_models(url: str, api_key: str | None = None, timeout: float = 10.0) -> tuple[list[str] | None, str]:
    """(the model names the OpenAI-compatible server at ``url`` lists under ``GET {url}/models``, "") or
    (None, why it gave no list)."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url.rstrip("/") + "/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 (the setting's own url)
            data = json.loads(reply.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        return None, f"GET {url}/models answered HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return None, f"GET {url}/models failed ({type(exc).__name__})"
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None, f"GET {url}/models gave no model list"
    return [str(m.get("id")) for m in data["data"] if isinstance(m, dict)], ""


def served_model_problem(url: str, model: str, api_key: str | None = None, timeout: float = 10.0) -> str | None:
    """None when the server at ``url`` lists ``model`` (the name a chat scorer's requests carry), else why
    not, with the flag that fixes it."""
    ids, why = served_models(url, api_key, timeout)
    if ids is None:
        return why
    return None if model in ids else other_model(url, model, ids)


def other_model(url: str, model: str, ids: list[str]) -> str:
    """The line for a server at ``url`` that lists ``ids`` but not ``model``, with the flag that fixes it."""
    return (f"the server at {url} serves {', '.join(ids) or 'no model'}, not {model!r}: start it with "
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


def unreachable(url: str, timeout: float = 5.0) -> str | None:
    """None when an HTTP server answers at ``url`` (any status), else why not (one try)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        conn = conn_cls(parts.hostname, parts.port, timeout=timeout)
    except (ValueError, OSError) as exc:
        return type(exc).__name__
    try:
        conn.request("GET", parts.path or "/")
        conn.getresponse().read()
        return None
    except (OSError, http.client.HTTPException) as exc:
        return "refused" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__
    finally:
        conn.close()
