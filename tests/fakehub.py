"""Loopback HTTP servers that speak what ``recast fetch`` calls: the Hugging Face Hub's model API and
file resolver (as huggingface_hub reads them), and a plain file server with Range, dropped
connections and 401s. No network beyond 127.0.0.1.

Hub (``HF_ENDPOINT=hub.url``):

* ``GET /api/models/{repo}[/revision/{rev}]`` → ``{"id", "sha", "siblings": [{"rfilename", "size", "blobId"}]}``
  (``HfApi.model_info(files_metadata=True)``);
* ``HEAD|GET /{repo}/resolve/{rev}/{path}`` → the file, with ``X-Repo-Commit``, ``ETag`` (its
  sha256, quoted, as the Hub sends for LFS files), ``Content-Length``; ``Range: bytes=N-`` → 206;
* a gated repo answers 401 with ``X-Error-Code: GatedRepo``; an unknown one 401 with ``RepoNotFound``
  (what the Hub answers without a token);
* ``any_revision``: every revision resolves to the repo's commit (a hostile Hub: ``../../x`` too).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        # a short poll: close() (shutdown) waits up to one poll, after every test
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _send_range(handler: BaseHTTPRequestHandler, data: bytes, extra: dict[str, str], body: bool,
                cut_at: int | None = None, stall: bool = False, ignore_range: bool = False) -> None:
    """Send ``data`` (or its ``Range: bytes=N-`` tail) with ``extra`` headers; ``cut_at``: close the
    connection after that many body bytes; ``stall``: then hang instead; ``ignore_range``: always whole."""
    start = 0
    match = None if ignore_range else re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range") or "")
    if match:
        start = int(match[1])
        if start >= len(data):
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{len(data)}")
            handler.end_headers()
            return
    part = data[start:]
    handler.send_response(206 if match else 200)
    for key, value in extra.items():
        handler.send_header(key, value)
    if match:
        handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
    handler.send_header("Content-Length", str(len(part)))
    handler.send_header("Accept-Ranges", "bytes")
    handler.end_headers()
    if not body:
        return
    if cut_at is not None and cut_at < len(part):
        handler.wfile.write(part[:cut_at])
        handler.wfile.flush()
        if stall:
            time.sleep(3600)
        handler.close_connection = True
        return
    handler.wfile.write(part)


class FakeHub(_Server):
    """Repos are folders: ``add_repo("org/name", folder)`` serves every file under it at one commit."""

    def __init__(self) -> None:
        self.repos: dict[str, tuple[str, dict[str, bytes]]] = {}
        self.gated: set[str] = set()
        self.any_revision = False
        super().__init__(_HubHandler)

    def add_repo(self, repo: str, folder: Path, extra: dict[str, bytes] | None = None) -> str:
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        files.update(extra or {})
        commit = hashlib.sha1(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in files.items()}, sort_keys=True).encode() + repo.encode()).hexdigest()
        self.repos[repo] = (commit, files)
        return commit


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        return None

    def _deny(self, repo: str) -> bool:
        hub = self.server.owner
        if repo in hub.repos and repo not in hub.gated:
            return False
        code = "GatedRepo" if repo in hub.gated else "RepoNotFound"
        self.send_response(401)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", "Access to this model is restricted" if code == "GatedRepo"
                         else "Repository not found")
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def _handle(self, body: bool) -> None:
        hub = self.server.owner
        raw = urlsplit(self.path).path
        path = unquote(raw)
        hub.requests.append((self.command, path, self.headers.get("Range")))
        # OWNER/NAME, or a legacy id without an owner (bert-base-uncased)
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+|[^/]+)(?:/revision/(.+))?", path)
        resolve = re.fullmatch(r"/((?:[^/]+/)?[^/]+)/resolve/([^/]+)/(.+)", raw)  # the revision is quoted whole
        resolve = resolve and [None, *map(unquote, resolve.groups())]
        if api:
            if self._deny(api[1]):
                return
            commit, files = hub.repos[api[1]]
            siblings = [{"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
                        for name, data in files.items()]
            payload = json.dumps({"id": api[1], "sha": commit, "private": False, "siblings": siblings}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self.wfile.write(payload)
            return
        if resolve:
            if self._deny(resolve[1]):
                return
            commit, files = hub.repos[resolve[1]]
            known = hub.any_revision or resolve[2] in ("main", commit)
            if not known or resolve[3] not in files:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound" if known else "RevisionNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = files[resolve[3]]
            _send_range(self, data, {"X-Repo-Commit": commit,
                                     "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}, body)
            return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._handle(body=True)

    def do_HEAD(self) -> None:
        self._handle(body=False)


class FileServer(_Server):
    """``files[path] = bytes``; ``cut[path] = n``: the first request for it closes after n bytes
    (``stall``: hangs there instead); ``denied``: paths answered with 401; ``ignore_range``: every answer
    is 200 and whole; ``endless``: paths answered with a chunked body that never ends (until the client
    hangs up, or ``ENDLESS_SAFETY`` bytes); ``trickle``: paths whose body is sent a byte every
    ``trickle_s`` seconds (each read well within any timeout)."""

    ENDLESS_SAFETY = 64 << 20

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.stall = False
        self.denied: set[str] = set()
        self.ignore_range = False
        self.endless: set[str] = set()
        self.trickle: set[str] = set()
        self.trickle_s = 0.05
        super().__init__(_FileHandler)


class _FileHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        return None

    def do_GET(self) -> None:
        server = self.server.owner
        path = urlsplit(self.path).path
        server.requests.append(("GET", path, self.headers.get("Range")))
        if path in server.endless:
            self._send_endless(path)
            return
        if path in server.trickle:
            self._send_trickle(server.files[path], server.trickle_s)
            return
        if path in server.denied or path not in server.files:
            self.send_response(401 if path in server.denied else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        _send_range(self, server.files[path], {}, True, cut_at=server.cut.pop(path, None), stall=server.stall,
                    ignore_range=server.ignore_range)

    def _send_trickle(self, data: bytes, pause: float) -> None:
        """``data`` whole, its Content-Length declared, one byte every ``pause`` seconds."""
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.close_connection = True
        try:
            for i in range(len(data)):
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                time.sleep(pause)
        except OSError:  # the client hung up: what it should do
            return

    def _send_endless(self, path: str) -> None:
        """A chunked body of prompt lines that goes on until the client hangs up."""
        server = self.server.owner
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"a sign that says 'more'\n" * 1000
        self.close_connection = True
        try:
            for _ in range(server.ENDLESS_SAFETY // len(chunk)):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:  # the client hung up: what it should do
            return
