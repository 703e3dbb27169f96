"""Provenance and atomic output: what every artifact records about itself, and how it is written.

Every artifact carries ``schema``, ``recast_version``, ``created_at``, the ``config`` that made it
and its ``sources`` (path + sha256 of each input; ARCHITECTURE.md, "Artifacts"). Writes are
atomic: a temporary file beside the target, fsynced and renamed into place, so a crashed stage
never leaves a half-written artifact.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
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
from recast_cli.artifacts.locks import UMASK, release_output_lock
from recast_cli.errors import BadInput


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


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it into place.

    If the body raises, the temporary file is removed and ``path`` is untouched, so a
    crashed stage never leaves a half-written artifact. A full disk or quota (ENOSPC, EDQUOT) or the
    file size limit (EFBIG), met by the body's write or by the fsync, is BadInput, one line: the old
    file is kept. A
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
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600 files; artifacts get the usual permissions
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
    """BadInput (one line, exit 2) when ``exc`` says the disk or the quota is full, or that the process's file
    size limit is reached (EFBIG: ``ulimit -f``); nothing else."""
    if exc.errno in NO_SPACE or exc.errno == errno.EFBIG:
        kept = "the old file is kept" if out.exists() else "nothing was written"
        what = ("the file size limit (ulimit -f) was reached" if exc.errno == errno.EFBIG else "no space left")
        raise BadInput(f"{what} writing {out} ({exc.strerror or 'disk full'}); {kept}") from None


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


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
