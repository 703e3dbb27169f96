"""One pinned file over plain HTTP(S): resumable, checked, then renamed into place.

The bytes go to ``TARGET.part`` beside the target. A run that stops (a dropped connection, or the
process killed) leaves the ``.part``; the next attempt, in this run or the next, asks for the rest
with ``Range: bytes=N-`` (a server that answers 200 instead sends it whole, and the part restarts).
Once complete, the part is checked against the pinned git blob id and SHA-256: a mismatch removes
it and is BadInput; a match is fsynced and renamed onto the target, so the target is only ever a
whole, checked file.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from recast_cli.errors import BadInput

CHUNK = 1 << 16
ATTEMPTS = 5
TIMEOUT_S = 60.0


def digests(path: Path) -> tuple[str, str]:
    """(git blob id, sha256) of the file at ``path``."""
    size = path.stat().st_size
    blob, sha = hashlib.sha1(f"blob {size}\0".encode()), hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            blob.update(block)
            sha.update(block)
    return blob.hexdigest(), sha.hexdigest()


def check_pins(path: Path, git_blob: str, sha256: str | None) -> str | None:
    """None when ``path`` matches its pins, else what differs."""
    blob, sha = digests(path)
    if blob != git_blob:
        return f"git blob id {blob} (pinned {git_blob})"
    if sha256 is not None and sha != sha256:
        return f"sha256 {sha} (pinned {sha256})"
    return None


def part_path(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def download(url: str, target: Path, git_blob: str, sha256: str | None,
             advance: Callable[[int], None] = lambda n: None) -> None:
    """Fetch ``url`` to ``target`` through ``TARGET.part`` (resumed), checked against the pins (module docstring).
    ``advance(n)``: n more bytes are on disk (n < 0: the part restarted)."""
    part = part_path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if have:
        advance(have)
    for attempt in range(ATTEMPTS):
        try:
            if _transfer(url, part, advance):
                break
        except (http.client.HTTPException, ConnectionError, TimeoutError, urllib.error.URLError) as exc:
            if isinstance(exc, urllib.error.HTTPError):
                raise _http_error(url, exc) from None
            if attempt == ATTEMPTS - 1:
                reason = getattr(exc, "reason", None) or exc
                raise BadInput(f"{url}: the download failed {ATTEMPTS} times ({type(exc).__name__}: {reason}); "
                               f"run recast fetch again to resume from {part}") from None
    else:
        raise BadInput(f"{url}: the server kept ending the download early; run recast fetch again to resume "
                       f"from {part}")
    wrong = check_pins(part, git_blob, sha256)
    if wrong is not None:
        part.unlink()
        raise BadInput(f"{url}: checksum mismatch: got {wrong}; removed the partial file {part}")
    with open(part, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(part, target)


def _transfer(url: str, part: Path, advance: Callable[[int], None]) -> bool:
    """One request for the rest of ``part``; True when the part is complete."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Accept-Encoding": "identity",
                                                   **({"Range": f"bytes={have}-"} if have else {})})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to send: the part is whole
            return True
        raise
    with response:
        if response.status == 200 and have:  # the server ignored the range: start over
            advance(-have)
            have = 0
        length = response.headers.get("Content-Length")
        expected = have + int(length) if length is not None else None
        with open(part, "ab" if have else "wb") as fh:
            for block in iter(lambda: response.read1(CHUNK), b""):
                fh.write(block)
                fh.flush()  # in the OS's hands: a killed process leaves every byte it received in the part
                advance(len(block))
            fh.flush()
            os.fsync(fh.fileno())
    return expected is None or part.stat().st_size >= expected


def _http_error(url: str, exc: urllib.error.HTTPError) -> BadInput:
    if exc.code in (401, 403):
        return BadInput(f"{url}: HTTP {exc.code} (the server asks for credentials; the pinned files are public, so "
                        "check a proxy or mirror in between)")
    return BadInput(f"{url}: HTTP {exc.code} {exc.reason}")
