"""Locks: one writer per output. :class:`FolderLock` holds an output folder (flock on the folder);
:func:`hold_output_lock` holds a single-file output through ``.NAME.lock`` beside it, a file recast
creates with ``O_EXCL`` and marks as its own (:data:`LOCK_MARK`), and deletes on release only when
it is still that file: a user's file of that name is used as the lock but never written or deleted."""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import stat
from pathlib import Path

from recast_cli.errors import BadInput

#: The process umask, read once (os.umask can only be read by setting it).
UMASK = os.umask(0)
os.umask(UMASK)


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
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666 & ~UMASK)
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
