"""Scripted loopback HTTP servers speaking the OpenAI Images and Gemini generateContent protocols.

Bound to 127.0.0.1 on a free port; the serving loop is bounded (``max_requests`` and a
deadline) so a server stops by itself even if a test forgets it.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image

KEY = "sk-test-SECRET-0123456789abcdef"


def png(width: int = 48, height: int = 40, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A small non-square PNG (so normalisation has to crop and resize)."""
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    truncate: bool = False  # announce the full length, send half, hang up


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict


#: answer(request number from 0, what was asked) -> Reply
Script = Callable[[int, Seen], Reply]


@contextlib.contextmanager
def serve(script: Script, max_requests: int = 60, deadline: float = 60.0) -> Iterator[tuple[str, list[Seen]]]:
    """Yield (base URL, the requests seen) while a scripted server answers."""
    seen: list[Seen] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw or b"{}"))
            with lock:
                number = len(seen)
                seen.append(request)
            reply = script(number, request)
            payload = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if reply.truncate:
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.timeout = 0.1
    server.daemon_threads = True
    stop = threading.Event()
    end = time.monotonic() + deadline

    def loop() -> None:
        while not stop.is_set() and len(seen) < max_requests and time.monotonic() < end:
            server.handle_request()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        stop.set()
        thread.join(timeout=5)
        server.server_close()


# --------------------------------------------------------------------------- the two protocols


def openai_image(data: bytes) -> Reply:
    return Reply(200, {"created": 1, "data": [{"b64_json": base64.b64encode(data).decode()}]})


def openai_error(status: int, code: str, message: str = "no") -> Reply:
    return Reply(status, {"error": {"code": code, "message": message, "type": "error", "param": None}})


def gemini_image(data: bytes) -> Reply:
    part = {"inlineData": {"mimeType": "image/png", "data": base64.b64encode(data).decode()}}
    return Reply(200, {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP"}]})


def gemini_error(status: int, name: str, message: str = "no") -> Reply:
    return Reply(status, {"error": {"code": status, "message": message, "status": name}})


@dataclass(frozen=True)
class Flavour:
    """One protocol: how it answers an image, a refusal, a rate limit and a server error."""

    source: str
    image: Callable[[bytes], Reply]
    refusal: Reply
    rate_limited: Reply
    server_error: Reply
    env: Callable[[str], dict[str, str]]


OPENAI = Flavour(
    "openai", openai_image, openai_error(400, "moderation_blocked", "Your request was rejected by the safety system"),
    openai_error(429, "rate_limit_exceeded"), openai_error(500, "server_error"),
    lambda url: {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": url + "/v1"})
GEMINI = Flavour(
    "gemini", gemini_image, Reply(200, {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}),
    gemini_error(429, "RESOURCE_EXHAUSTED"), gemini_error(500, "INTERNAL"),
    lambda url: {"GEMINI_API_KEY": KEY, "GOOGLE_GEMINI_BASE_URL": url})
