"""Logs, locks and records recast keeps open: opened as fetch opens its partial files — never through a
symbolic link, never a FIFO, device, socket or folder, never a file with a second hard link (another
name of a user's file) — so that a name planted where recast writes cannot make it append to a user's
file or block forever. Anything else at the name is BadInput, one line naming it and what to do."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

from recast_cli.errors import BadInput


def open_regular(path: str | os.PathLike[str], what: str, *, write: bool = True, create: bool = True,
                 append: bool = False) -> int:
    """A descriptor of the regular file at ``path`` (``what`` names it in errors): opened read-write (or
    read-only; appending with ``append``), created with mode 0644 when absent and ``create``, never followed through a symbolic link
    and never blocking on a FIFO (O_NONBLOCK, cleared once the file is known to be regular)."""
    path = Path(path)
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if create:
        flags |= os.O_CREAT
    if append:
        flags |= os.O_APPEND
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if os.path.islink(path):
            raise BadInput(f"{what} {path} is a symbolic link; recast does not write through one: remove it") from None
        if os.path.isdir(path):
            raise BadInput(f"{what} {path} is a folder; move it away") from None
        raise BadInput(f"cannot open {what} {path} ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        kind = "a file with another name (a hard link)" if stat.S_ISREG(info.st_mode) else "not a regular file"
        raise BadInput(f"{what} {path} is {kind}; recast writes only a regular file of its own there: move it away")
    os.set_blocking(fd, True)
    return fd


def open_append(path: str | os.PathLike[str], what: str, *, text: bool = False) -> IO:
    """The regular file at ``path`` (created when absent) opened for appending, as :func:`open_regular`
    opens it; a binary file object, or a UTF-8 text one with ``text``."""
    fd = open_regular(path, what, append=True)
    return open(fd, "a", encoding="utf-8") if text else open(fd, "ab")  # noqa: SIM115 (the caller closes it)
