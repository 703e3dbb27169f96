"""Provenance and atomic output: what every artifact records about itself, and how it is written.

Every artifact carries ``schema``, ``recast_version``, ``created_at``, the ``config`` that made it
and its ``sources`` (path + sha256 of each input; ARCHITECTURE.md, "Artifacts"). Writes are
atomic: a temporary file beside the target, fsynced and renamed into place, so a crashed stage
never leaves a half-written artifact.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from recast_cli import __version__
from recast_cli.errors import BadInput

# The process umask, read once (os.umask can only be read by setting it).
_UMASK = os.umask(0)
os.umask(_UMASK)

#: The metadata keys of :meth:`Provenance.to_metadata`, in every artifact.
PROVENANCE_KEYS = ("schema", "recast_version", "created_at", "config", "sources")


# --------------------------------------------------------------------------- provenance


@dataclass(frozen=True)
class Source:
    """An input artifact: the path as given and the sha256 of its bytes."""

    path: str
    sha256: str

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> Source:
        return cls(path=str(path), sha256=sha256_file(path))

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256}


def created_at() -> str:
    """Now, UTC, to the second; or ``SOURCE_DATE_EPOCH`` where it is set (the reproducible-builds
    convention), so two runs of the same inputs can be compared byte for byte."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        try:
            when = datetime.fromtimestamp(int(epoch), timezone.utc)
        except (ValueError, OverflowError, OSError):
            raise BadInput(f"SOURCE_DATE_EPOCH must be a whole number of seconds since 1970, got {epoch[:40]!r}") from None
    else:
        when = datetime.now(timezone.utc)
    return when.isoformat(timespec="seconds")


@dataclass(frozen=True)
class Provenance:
    """What made an artifact: its schema tag, the recast version, when, from what, and how."""

    schema: str
    recast_version: str
    created_at: str
    config: dict[str, Any]
    sources: tuple[Source, ...]

    @classmethod
    def new(
        cls,
        schema: str,
        config: Mapping[str, Any] | None = None,
        sources: Sequence[Source | str | os.PathLike[str]] = (),
    ) -> Provenance:
        return cls(
            schema=schema,
            recast_version=__version__,
            created_at=created_at(),
            config=dict(config or {}),
            sources=tuple(s if isinstance(s, Source) else Source.of(s) for s in sources),
        )

    def to_metadata(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "recast_version": self.recast_version,
            "created_at": self.created_at,
            "config": self.config,
            "sources": [s.to_json() for s in self.sources],
        }

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], where: str) -> Provenance:
        sources = meta["sources"]
        if not isinstance(sources, list) or not all(
            isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("sha256"), str)
            for s in sources
        ):
            raise BadInput(f"{where}: metadata 'sources' must be a list of {{path, sha256}} objects")
        if not isinstance(meta["config"], dict):
            raise BadInput(f"{where}: metadata 'config' must be a JSON object")
        return cls(
            schema=meta["schema"],
            recast_version=str(meta["recast_version"]),
            created_at=str(meta["created_at"]),
            config=meta["config"],
            sources=tuple(Source(s["path"], s["sha256"]) for s in sources),
        )


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------- atomic output


def check_writable(path: str | os.PathLike[str],
                   inputs: Sequence[str | os.PathLike[str] | None] = ()) -> Path:
    """Check, before any work is done and without touching the disk, that ``path`` can be written.

    Missing parent folders are fine (they are created at write time); a parent that is a
    file, a path that is a folder, or a folder without write permission is BadInput, and so
    is a ``path`` that is one of the command's ``inputs`` (it would be overwritten).
    """
    out = Path(path)
    for given in inputs:
        if given is not None and _same_file(out, Path(given)):
            raise BadInput(f"cannot write {out}: it is also an input of this command ({given}); write elsewhere")
    if out.is_dir():
        raise BadInput(f"cannot write {out}: it is a directory")
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BadInput(f"cannot write {out}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise BadInput(f"cannot write {out}: no write permission in {ancestor}")
    return out


class FolderLock:
    """An exclusive advisory lock on a folder (flock on the folder itself): one writer per output.

    A second process that wants the same folder gets one line (BadInput, exit 2) naming ``what``
    holds it, before it writes anything. Released by ``release`` or when the process exits.
    """

    def __init__(self, folder: str | os.PathLike[str], what: str = "another recast process"):
        import fcntl

        self.fd: int | None = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            raise BadInput(f"{folder} is being written by {what} (it holds the folder's lock); wait for it to "
                           "finish or choose another --out") from None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __del__(self) -> None:
        self.release()


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it into place.

    If the body raises, the temporary file is removed and ``path`` is untouched, so a
    crashed stage never leaves a half-written artifact. A full disk or quota (ENOSPC, EDQUOT),
    met by the body's write or by the fsync, is BadInput, one line: the old file is kept. A
    ``path`` that exists and is not a regular file (a device node, a pipe, a symbolic link) is
    never replaced. An output lock this process holds on ``path`` (``claim_output``) is
    released once ``path`` is written.
    """
    out = check_writable(path)
    refuse_non_regular(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(out)
        fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp")
    except OSError as exc:
        _refuse_when_full(exc, out)
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; artifacts get the usual permissions
        refuse_non_regular(out)  # again: something may have appeared there while the stage ran
        os.replace(tmp, out)
    except OSError as exc:
        _refuse_when_full(exc, out)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    release_output_lock(out)


#: The errors of a full disk or an exhausted quota (EDQUOT is absent on some platforms).
NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _refuse_when_full(exc: OSError, out: Path) -> None:
    """BadInput (one line, exit 2) when ``exc`` says the disk or the quota is full; nothing else."""
    if exc.errno in NO_SPACE:
        kept = "the old file is kept" if out.exists() else "nothing was written"
        raise BadInput(f"no space left writing {out} ({exc.strerror or 'disk full'}); {kept}") from None


def refuse_non_regular(out: Path) -> None:
    """BadInput when ``out`` exists and is not a regular file: recast never replaces one."""
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise BadInput(f"cannot write {out}: it is a symbolic link; recast replaces only regular files it wrote")
    if not stat.S_ISREG(mode):
        raise BadInput(f"cannot write {out}: it is not a regular file (a device, pipe, socket or folder); "
                       "recast replaces only files it wrote")


def _temp_pattern(name: str) -> re.Pattern[str]:
    """The names of :func:`atomic_output`'s temporary files for ``name``: ``.NAME.PID.RANDOM.tmp``
    (RANDOM: the 8 characters of ``tempfile.mkstemp``)."""
    return re.compile(rf"\.{re.escape(name)}\.([0-9]+)\.[a-z0-9_]{{8}}\.tmp")


def temp_target(name: str) -> str | None:
    """The file an :func:`atomic_output` temporary file named ``name`` was to become (None: ``name``
    is not of that form)."""
    match = re.fullmatch(r"\.(.+)\.[0-9]+\.[a-z0-9_]{8}\.tmp", name)
    return match.group(1) if match else None


def clean_stale_temps(out: Path) -> list[Path]:
    """Remove the temporary files of earlier writes of ``out`` whose writer is gone (killed).

    Only names of exactly recast's own form, ``.NAME.PID.RANDOM.tmp`` with the PID of a process
    that no longer runs, are removed; a live writer's and every other file are kept.
    """
    pattern = _temp_pattern(out.name)
    removed = []
    for tmp in out.parent.glob(f".{glob_escape(out.name)}.*.tmp"):
        match = pattern.fullmatch(tmp.name)
        if match is None or _alive(int(match.group(1))) or not tmp.is_file() or tmp.is_symlink():
            continue
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass
    return removed


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


# --------------------------------------------------------------------------- output locks

#: The output locks this process holds, by output path: fd of ``.NAME.lock``, whether that file is
#: recast's own (created here, or carrying :data:`LOCK_MARK`), and the folders made for it.
_OUTPUT_LOCKS: dict[Path, tuple[int, bool, list[Path]]] = {}
#: The first bytes of every lock file recast creates: a file at ``.NAME.lock`` without them is the
#: user's, used as a lock only (flock writes nothing) and never deleted.
LOCK_MARK = b"recast output lock (removed when the write ends)\n"


def lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def hold_output_lock(out: str | os.PathLike[str]) -> None:
    """Take the exclusive lock of the single-file output ``out`` for this process, or BadInput if
    another process holds it. Held until ``out`` is written (:func:`atomic_output`) or
    :func:`release_output_locks`; taking it again in the same process is a no-op. The lock file is
    created with O_EXCL and marked (:data:`LOCK_MARK`); a file already there is flocked but never
    written, and removed on release only when it carries the mark (a killed recast's lock)."""
    import fcntl

    out = Path(out).absolute()
    if out in _OUTPUT_LOCKS or os.environ.get("RANK", "0") != "0":
        return  # held already; in a distributed launch only rank 0 writes (and locks)
    lock = lock_path(out)
    made = [d for d in (out.parent, *out.parent.parents) if not d.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from None
    while True:
        opened = _open_lock_file(out, lock)
        if opened is None:
            continue  # the file went between our two opens: a holder released it
        fd, created = opened
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BadInput(f"{out} is being written by another recast process (it holds {lock.name}); wait for it "
                           "to finish or choose another --out") from None
        except OSError as exc:  # a file system without locks, or a read-only descriptor where flock needs more
            os.close(fd)
            raise BadInput(f"cannot write {out}: cannot lock {lock.name} ({exc.strerror or exc})") from None
        # The holder before us removes the lock file when it is done: make sure ours is still the file there.
        if _is_file_at(fd, lock):
            _OUTPUT_LOCKS[out] = (fd, created or _marked(fd), made)
            return
        os.close(fd)


def _open_lock_file(out: Path, lock: Path) -> tuple[int, bool] | None:
    """(fd, created) of ``lock``: a new file made with O_EXCL and marked, else the regular file
    already there (never followed through a symbolic link, never a pipe or device); None when
    that file vanished between the two opens."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666 & ~_UMASK)
    except FileExistsError:
        pass
    except OSError as exc:
        raise BadInput(f"cannot write {out}: cannot create its lock file {lock.name} "
                       f"({exc.strerror or exc})") from None
    else:
        try:
            os.write(fd, LOCK_MARK)
        except OSError as exc:
            os.close(fd)
            lock.unlink(missing_ok=True)
            _refuse_when_full(exc, out)
            raise BadInput(f"cannot write {out}: cannot write its lock file {lock.name} ({exc.strerror or exc})") from None
        return fd, True
    try:
        mode = os.lstat(lock).st_mode
        if not stat.S_ISREG(mode):
            raise BadInput(f"cannot write {out}: {lock.name} beside it is not a regular file (recast keeps its lock "
                           "there); move it away")
        fd = _open_existing(lock)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadInput(f"cannot write {out}: cannot open its lock file {lock.name} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for something else between lstat and open
        os.close(fd)
        raise BadInput(f"cannot write {out}: {lock.name} beside it is not a regular file; move it away")
    return fd, False


def _open_existing(lock: Path) -> int:
    """The file at ``lock`` opened without creating, truncating or following it: for writing where we may
    (NFS emulates flock with fcntl locks, which need a writable descriptor; nothing is ever written),
    else read-only."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        return os.open(lock, os.O_RDWR | flags)
    except PermissionError:
        return os.open(lock, os.O_RDONLY | flags)
    except OSError as exc:
        if exc.errno != errno.EROFS:
            raise
        return os.open(lock, os.O_RDONLY | flags)


def _marked(fd: int) -> bool:
    """True when the open file starts with :data:`LOCK_MARK`: a lock file recast made."""
    try:
        return os.pread(fd, len(LOCK_MARK), 0) == LOCK_MARK
    except OSError:
        return False


def _is_file_at(fd: int, path: Path) -> bool:
    """True when ``path`` (not followed if a link) is the very file open as ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


def release_output_lock(out: str | os.PathLike[str]) -> None:
    """Drop this process's lock on ``out`` (if held), remove its lock file when it is recast's own and
    still the file there, and the folders made for it that stayed empty (a command that stopped on
    bad input leaves no trace). A user's file at ``.NAME.lock`` is never removed."""
    out = Path(out).absolute()
    held = _OUTPUT_LOCKS.pop(out, None)
    if held is not None:
        fd, owned, made = held
        if owned and _is_file_at(fd, lock_path(out)):
            with contextlib.suppress(OSError):
                os.unlink(lock_path(out))  # unlinked while still locked: a waiter re-checks the file (above)
        os.close(fd)
        for folder in made:  # innermost first; a folder that holds anything stays
            try:
                folder.rmdir()
            except OSError:
                break


def release_output_locks() -> None:
    """Drop every output lock this process holds (a command ended, written or not), the latest first: a
    folder made for the first one is removed once the later ones' lock files in it are gone."""
    for out in reversed(list(_OUTPUT_LOCKS)):
        release_output_lock(out)


atexit.register(release_output_locks)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


# --------------------------------------------------------------------------- JSON


#: The deepest nesting of arrays and objects a metadata value may have. recast writes at most a few
#: levels; 200 000 nested ``[`` would exhaust the JSON parser's stack (a RecursionError traceback).
MAX_JSON_DEPTH = 64
#: A JSON string literal (its brackets are text, not nesting); the closing quote is optional so that an
#: unterminated string is consumed in one pass (else each of its quotes restarts the match: quadratic).
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.DOTALL)


def json_too_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the arrays and objects of the JSON text ``raw`` nest deeper than ``limit``, told
    without parsing it: brackets inside strings are skipped (an unterminated string counts as text)."""
    import numpy as np

    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    if data.count(b"[") + data.count(b"{") <= limit:
        return False  # too few brackets to nest that deep: no scan needed
    codes = np.frombuffer(_JSON_STRING.sub(b'""', data), dtype=np.uint8)
    step = ((codes == ord("[")) | (codes == ord("{"))).astype(np.int64) - ((codes == ord("]")) | (codes == ord("}")))
    return int(np.cumsum(step).max(initial=0)) > limit


def json_loads(raw: bytes | str, where: str) -> Any:
    """``json.loads(raw)`` for metadata read from a file: BadInput (naming ``where``) when it nests
    deeper than :data:`MAX_JSON_DEPTH`, before the parser sees it. Malformed JSON raises
    ``json.JSONDecodeError`` as ``json.loads`` does (callers name what was malformed)."""
    if json_too_deep(raw):
        raise BadInput(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels (not written by recast)")
    return json.loads(raw)


def json_dumps(value: Any) -> str:
    """A metadata value as artifacts store it: JSON with sorted keys, no NaN or inf."""
    return json.dumps(value, sort_keys=True, allow_nan=False)
