"""One pinned file over plain HTTP(S): resumable, bounded, checked, then renamed into place — written
through a partial file only recast made.

The bytes go to ``.TARGET.recast-part`` beside the target, a name of recast's own, created with
``O_CREAT|O_EXCL|O_NOFOLLOW`` when the first bytes arrive; beside it, its claim
``.TARGET.recast-part.claim`` (JSON: the URL, the device and inode of the part, and the SHA-256 of
its first bytes), created the same way, says recast made it (the data file itself carries nothing).
A partial file is resumed, restarted or removed only while its claim matches it: a regular file
with one link, the claimed inode, and the claimed first bytes (an inode number is reused once its
file is gone). Anything else at either name — a file recast did not make, a symbolic link, a hard
link, a folder, a FIFO or a device — is never opened for writing, truncated or removed: BadInput,
one line (only a regular file is ever opened, read-only and ``O_NONBLOCK``, to compare it with its
claim). A file named ``TARGET.part`` is not recast's and is never touched.

A run that stops (a dropped connection, or the process killed) leaves the part; the next attempt,
in this run or the next, asks for the rest with ``Range: bytes=N-`` (a server that answers 200
instead sends it whole, and the part restarts). The bytes are counted as they arrive: more than the
pinned size (``PromptFile.size``), or than ``MAX_UNPINNED_BYTES`` where none is pinned, stops the
download, removes the part and is BadInput; so does a full disk or quota. Once complete, the part is
checked against the pinned git blob id and SHA-256: a mismatch removes it and is BadInput; a match
is fsynced and renamed onto the target, so the target is only ever a whole, checked file.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from recast_cli.artifacts.io import NO_SPACE
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.errors import BadInput

CHUNK = 1 << 16
ATTEMPTS = 5
TIMEOUT_S = 60.0
#: The slowest a download may be, on average over a request once ``TIMEOUT_S`` has passed: a server that
#: trickles its body (a byte every few seconds, each read within its timeout) is cut off and retried,
#: not waited on for days. 8 KiB/s moves the largest pinned prompt file (2.9 MB) in six minutes.
MIN_RATE = 8 << 10
#: The most bytes a prompt file without a pinned size may have (the largest pinned one is 2.9 MB):
#: a server that sends more (an endless body) is cut off there.
MAX_UNPINNED_BYTES = 64 << 20
#: What a claim file says it is; a claim larger than ``CLAIM_MAX_BYTES`` is not one recast wrote.
CLAIM_KIND = "recast fetch partial download"
CLAIM_MAX_BYTES = 4096
#: How many first bytes of its part a claim pins by their SHA-256.
HEAD_BYTES = 4096
#: A full disk, an exhausted quota, or a file size limit (``ulimit -f``): the part is removed.
FULL = NO_SPACE | {errno.EFBIG}


def _digests(fh: BinaryIO) -> tuple[str, str]:
    """(git blob id, sha256) of the open file ``fh``, read from its start."""
    fh.seek(0)
    size = os.fstat(fh.fileno()).st_size
    blob, sha = hashlib.sha1(f"blob {size}\0".encode()), hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        blob.update(block)
        sha.update(block)
    return blob.hexdigest(), sha.hexdigest()


def _mismatch(fh: BinaryIO, git_blob: str, sha256: str | None) -> str | None:
    """None when the open file ``fh`` matches its pins, else what differs."""
    blob, sha = _digests(fh)
    if blob != git_blob:
        return f"git blob id {blob} (pinned {git_blob})"
    if sha256 is not None and sha != sha256:
        return f"sha256 {sha} (pinned {sha256})"
    return None


def check_pins(path: Path, git_blob: str, sha256: str | None) -> str | None:
    """None when ``path`` matches its pins, else what differs."""
    with open(path, "rb") as fh:
        return _mismatch(fh, git_blob, sha256)


def part_path(target: Path) -> Path:
    """Where the bytes of ``target`` arrive: ``.TARGET.recast-part`` (module docstring)."""
    return target.with_name(f".{target.name}.recast-part")


def claim_path(target: Path) -> Path:
    """The claim that says recast made ``part_path(target)``: ``.TARGET.recast-part.claim``."""
    return target.with_name(f".{target.name}.recast-part.claim")


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _foreign(path: Path, mode: int) -> BadInput:
    """The one line for a path at recast's own partial-file names that recast did not make."""
    kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else
            "a file recast did not make" if stat.S_ISREG(mode) else "a FIFO, socket or device")
    return BadInput(f"cannot download to {path}: it is {kind}, not a partial download recast made; recast never "
                    "writes into or removes it: remove it yourself if it is not needed, or point the setting elsewhere")


def _read_claim(claim: Path) -> dict | None:
    """The claim at ``claim`` (None: there is none); BadInput when something else is there."""
    st = _lstat(claim)
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > CLAIM_MAX_BYTES:
        raise _foreign(claim, st.st_mode)
    try:
        fd = os.open(claim, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # swapped for a link or removed since the lstat
        raise _foreign(claim, stat.S_IFLNK) from None
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the lstat
            raise _foreign(claim, os.fstat(fd).st_mode)
        text = fh.read(CLAIM_MAX_BYTES + 1)
    try:
        data = json_loads(text, str(claim))
    except ValueError:  # not JSON, or nested too deeply (BadInput is a ValueError): not recast's claim
        data = None
    if not isinstance(data, dict) or data.get("recast") != CLAIM_KIND:
        raise _foreign(claim, st.st_mode)
    return data


def _head(fd: int, size: int) -> str:
    """The SHA-256 of the first ``size`` bytes of the open file ``fd``."""
    return hashlib.sha256(os.pread(fd, size, 0)).hexdigest()


def _claims(claim: dict | None, fd: int) -> bool:
    """Whether ``claim`` is the claim of the open file ``fd``: a regular file with one link, the claimed
    inode, and at least the claimed first bytes."""
    st = os.fstat(fd)
    size = claim.get("head_size") if claim is not None else None
    return (isinstance(size, int) and stat.S_ISREG(st.st_mode) and st.st_nlink == 1
            and claim.get("dev") == st.st_dev and claim.get("ino") == st.st_ino
            and 0 <= size <= st.st_size and _head(fd, size) == claim.get("head"))


def _open_claimed(part: Path, claim: dict | None, flags: int) -> int:
    """The part at ``part``, opened with ``flags`` (and never through a link, never blocking), when ``claim``
    is its claim; BadInput, the part closed and kept, otherwise. Only a regular file is opened."""
    st = _lstat(part)
    if st is None or claim is None or not stat.S_ISREG(st.st_mode):
        raise _foreign(part, st.st_mode if st is not None else stat.S_IFREG)
    try:
        fd = os.open(part, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:  # no permission, or swapped for a link since the lstat
        raise BadInput(f"cannot open the partial download {part}: {exc.strerror or exc}") from None
    if not _claims(claim, fd):  # another file, or swapped since the lstat
        mode = os.fstat(fd).st_mode
        os.close(fd)
        raise _foreign(part, mode)
    return fd


def check_part(target: Path) -> None:
    """BadInput when ``target``'s partial-file names hold anything recast did not make (module docstring);
    nothing is opened but a claim and a regular file, read-only. Called before any download, and again
    when the part is opened to be resumed."""
    claim = _read_claim(claim_path(target))
    if _lstat(part_path(target)) is not None:
        os.close(_open_claimed(part_path(target), claim, os.O_RDONLY))


class PartFile:
    """recast's own partial download of one target (module docstring): made when the first bytes arrive."""

    def __init__(self, target: Path, url: str) -> None:
        """Open the claimed part of ``target`` to resume it (one for another URL is removed: it restarts)."""
        self.path, self.claim, self.url, self.fd = part_path(target), claim_path(target), url, -1
        claim = _read_claim(self.claim)
        if _lstat(self.path) is not None:
            self.fd = _open_claimed(self.path, claim, os.O_RDWR)
            if claim.get("url") == url:
                os.lseek(self.fd, 0, os.SEEK_END)  # resumed: the bytes go after those there
                return
            self.remove()
        elif claim is not None:
            self.claim.unlink(missing_ok=True)  # recast's own claim whose part is gone (killed between the two removals)

    def _create(self, first: bytes) -> None:
        """A new part holding ``first``, then its claim, each created only where nothing is (``O_EXCL``)."""
        flags = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        made: list[Path] = []
        try:
            self.fd = os.open(self.path, os.O_RDWR | flags, 0o666)
            made.append(self.path)
            self._write(first)
            st, size = os.fstat(self.fd), min(len(first), HEAD_BYTES)
            claim = {"recast": CLAIM_KIND, "url": self.url, "dev": st.st_dev, "ino": st.st_ino, "head_size": size,
                     "head": hashlib.sha256(first[:size]).hexdigest()}
            fd = os.open(self.claim, os.O_WRONLY | flags, 0o666)
            made.append(self.claim)
            try:
                os.write(fd, json.dumps(claim).encode())  # a few hundred bytes: one write
            finally:
                os.close(fd)
        except OSError as exc:
            self.close()
            for path in made:  # both made just now, by this process (O_EXCL)
                path.unlink(missing_ok=True)
            raise self.failed(exc) from None

    @property
    def size(self) -> int:
        return os.fstat(self.fd).st_size if self.fd >= 0 else 0

    def write(self, block: bytes) -> None:
        """Append ``block`` (the first one makes the part): in the OS's hands when this returns, so a killed
        process leaves it in the part."""
        if self.fd < 0:
            self._create(block)
            return
        try:
            self._write(block)
        except OSError as exc:
            raise self.failed(exc) from None

    def _write(self, block: bytes) -> None:
        view = memoryview(block)
        while view:
            view = view[os.write(self.fd, view):]

    def sync(self) -> None:
        """fsync the part (made empty if no byte came: an empty file)."""
        if self.fd < 0:
            self._create(b"")
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise self.failed(exc) from None

    def mismatch(self, git_blob: str, sha256: str | None) -> str | None:
        with open(os.dup(self.fd), "rb") as fh:
            return _mismatch(fh, git_blob, sha256)

    def failed(self, exc: OSError) -> BadInput:
        """The one line for a local write that failed; a full disk or quota removes the part first."""
        if exc.errno in FULL:
            self.remove()
            return BadInput(f"no space left writing {self.path} ({exc.strerror or 'disk full'}); removed the "
                            "partial download")
        return BadInput(f"cannot write {self.path}: {exc.strerror or exc}")

    def remove(self) -> None:
        """Remove the part and its claim, each only while it is still recast's own (same inode); the next
        write makes a new part (the server sent the file whole, or the pin changed)."""
        if self.fd < 0:
            return
        st = os.fstat(self.fd)
        self.close()
        found = _lstat(self.path)
        if found is not None and os.path.samestat(found, st):
            self.path.unlink(missing_ok=True)
        try:
            claim = _read_claim(self.claim)
        except BadInput:
            return
        if claim is not None and claim.get("dev") == st.st_dev and claim.get("ino") == st.st_ino:
            self.claim.unlink(missing_ok=True)

    def rename_onto(self, target: Path) -> None:
        """Put the checked part in place of ``target`` (absent: recast replaces no file it did not write)."""
        if _lstat(target) is not None:
            self.remove()
            raise BadInput(f"{target} appeared during the download; kept it, and removed the download")
        if not os.path.samestat(os.lstat(self.path), os.fstat(self.fd)):
            raise _foreign(self.path, os.lstat(self.path).st_mode)
        os.replace(self.path, target)
        self.claim.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def download(url: str, target: Path, git_blob: str, sha256: str | None,
             advance: Callable[[int], None] = lambda n: None, size: int | None = None) -> None:
    """Fetch ``url`` to ``target`` through recast's own part (resumed), at most ``size`` bytes (the pinned
    size; None: ``MAX_UNPINNED_BYTES``), checked against the pins (module docstring).
    ``advance(n)``: n more bytes are on disk (n < 0: the part restarted)."""
    limit = size if size is not None else MAX_UNPINNED_BYTES
    target.parent.mkdir(parents=True, exist_ok=True)
    part = PartFile(target, url)
    try:
        if part.size:
            advance(part.size)
        _fetch_into(url, part, limit, advance)
        part.sync()
        wrong = part.mismatch(git_blob, sha256)
        if wrong is not None:
            part.remove()
            raise BadInput(f"{url}: checksum mismatch: got {wrong}; removed the partial file {part.path}")
        part.rename_onto(target)
    finally:
        part.close()


def _fetch_into(url: str, part: PartFile, limit: int, advance: Callable[[int], None]) -> None:
    """Requests until ``part`` is complete: a dropped connection is retried with Range (``ATTEMPTS`` in all)."""
    for attempt in range(ATTEMPTS):
        try:
            if _transfer(url, part, limit, advance):
                return
        except (http.client.HTTPException, ConnectionError, TimeoutError, urllib.error.URLError) as exc:
            if isinstance(exc, urllib.error.HTTPError):
                raise _http_error(url, exc) from None
            if attempt == ATTEMPTS - 1:
                reason = getattr(exc, "reason", None) or exc
                raise BadInput(f"{url}: the download failed {ATTEMPTS} times ({type(exc).__name__}: {reason}); "
                               f"run recast fetch again to resume from {part.path}") from None
    raise BadInput(f"{url}: the server kept ending the download early; run recast fetch again to resume "
                   f"from {part.path}")


def _transfer(url: str, part: PartFile, limit: int, advance: Callable[[int], None]) -> bool:
    """One request for the rest of ``part``, cut off past ``limit`` bytes; True when the part is complete."""
    have = part.size
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
            part.remove()
            advance(-have)
            have = 0
        length = response.headers.get("Content-Length", "")
        expected = have + int(length) if length.isdigit() else None
        if expected is not None and expected > limit:
            raise _too_big(url, part, limit)
        started, first = time.monotonic(), have
        for block in iter(lambda: response.read1(CHUNK), b""):
            have += len(block)
            if have > limit:
                raise _too_big(url, part, limit)
            part.write(block)
            advance(len(block))
            elapsed = time.monotonic() - started
            if elapsed > TIMEOUT_S and (have - first) / elapsed < MIN_RATE:
                raise TimeoutError(f"the server sent {have - first} bytes in {elapsed:.0f} s, slower than "
                                   f"{MIN_RATE >> 10} KiB/s")
        part.sync()
    return expected is None or have >= expected


def _too_big(url: str, part: PartFile, limit: int) -> BadInput:
    """The one line for a download past its size cap; the part is removed first."""
    part.remove()
    return BadInput(f"{url}: the server sends more than the {limit} bytes this file may have (its pinned size, "
                    f"else MAX_UNPINNED_BYTES); stopped, and removed the partial file {part.path}")


def _http_error(url: str, exc: urllib.error.HTTPError) -> BadInput:
    if exc.code in (401, 403):
        return BadInput(f"{url}: HTTP {exc.code} (the server asks for credentials; the pinned files are public, so "
                        "check a proxy or mirror in between)")
    return BadInput(f"{url}: HTTP {exc.code} {exc.reason}")
