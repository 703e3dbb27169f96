"""The resumable ``OUT.parts/`` folder of a long stage (``estimate``, ``evaluate``), written once.

A stage that writes ``OUT`` keeps its finished pieces (one file per prompt or chunk) in the
sibling folder ``OUT.parts/`` until the whole table is written, so a killed run resumes where
it stopped. The folder's marker, ``parts.json``, names the run (a key of everything that
determines the results); its exclusive lock makes one writer per output.

* A marker of the same run: resume from the pieces there.
* A marker of another run (or of an older recast, which called it ``run.json``), or pieces and no
  marker: refuse while it holds pieces; one that finished no piece (it stopped on bad input)
  blocks nothing.
* Resuming, the stage reads every finished piece it will use before any new work; one that is
  truncated or corrupt is named (:func:`bad_piece`: delete it to recompute it).
* Done: the stage writes ``OUT``, then removes its own files from the folder, and the folder if
  that empties it (:func:`finish_parts`); a file the user put there stays.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli.artifacts.io import atomic_write_bytes, temp_target

from recast_cli.artifacts.locks import FolderLock
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.errors import BadInput

MARKER_NAME = "parts.json"
LEGACY_MARKER_NAME = "run.json"  # what recast before 2026-12 called the marker


def parts_dir(out: str | Path) -> Path:
    """``OUT.parts/`` beside ``OUT``."""
    out = Path(out)
    return out.with_name(out.name + ".parts")


def marker_run_id(parts: Path) -> str | None:
    """The run id the folder's marker names (None: no readable marker)."""
    for name in (MARKER_NAME, LEGACY_MARKER_NAME):
        path = parts / name
        if path.is_file():
            try:
                value = json_loads(path.read_text(encoding="utf-8"), str(path))
            except (OSError, UnicodeDecodeError, ValueError):  # ValueError: not JSON, or nested too deeply
                return None
            return value.get("run_id") if isinstance(value, dict) else None
    return None


def open_parts(out: str | Path, run_id: str, record: Mapping[str, Any], *, pieces: str, writer: str,
               what: str) -> FolderLock:
    """Take ``OUT.parts/`` for the run ``run_id``: check it, create it, lock it, write its marker.

    ``pieces`` is the glob of the finished pieces (``prompt-*.safetensors``), ``writer`` names the
    command in the lock's message, ``what`` the run in the refusal ("run", "evaluation"). Returns
    the lock; the caller releases it when it returns.
    """
    parts = parts_dir(out)
    if parts.is_dir() and marker_run_id(parts) != run_id and any(parts.glob(pieces)):
        raise BadInput(f"{parts} holds partial results of another {what}; remove it or rerun with the same "
                       f"{'flags' if what == 'run' else 'options'}")
    parts.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(parts, writer)
    try:
        (parts / LEGACY_MARKER_NAME).unlink(missing_ok=True)
        atomic_write_bytes(parts / MARKER_NAME, json.dumps({"run_id": run_id, **record}, sort_keys=True).encode())
    except BaseException:
        lock.release()
        raise
    return lock


def bad_piece(path: Path, why: str) -> BadInput:
    """The one line for a finished piece that cannot be used: which file, why, and what to do."""
    return BadInput(f"{path}: a finished part of this run cannot be used ({why}); delete that file to recompute "
                    "it, then rerun")


def read_array_piece(path: Path, key: str, shape: tuple[int, ...]) -> np.ndarray:
    """The array ``key`` of the safetensors piece ``path`` (estimate's ``prompt-N.safetensors``), or
    BadInput (:func:`bad_piece`) when the file is unreadable (truncated, corrupt) or holds no ``key``
    of ``shape``."""
    from safetensors.numpy import load_file

    try:
        tensors = load_file(path)
    except Exception as exc:  # safetensors raises its own error type (and OSError) for a damaged file
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise bad_piece(path, f"not a readable safetensors file: {why}") from None
    value = tensors.get(key)
    if value is None or value.shape != shape:
        held = "no " + repr(key) if value is None else f"{key!r} of shape {tuple(value.shape)}"
        raise bad_piece(path, f"it holds {held}, this run needs shape {shape}")
    return value


def finish_parts(out: str | Path, pieces: Iterable[str]) -> None:
    """Once ``OUT`` is written, remove recast's own files from ``OUT.parts/``: the marker, the finished
    pieces (``pieces``: the names of every piece the run wrote) and the temporary files of their writes;
    then the folder, if that left it empty. Anything else in it (a user's file) is kept, with the folder."""
    parts = parts_dir(out)
    if not parts.is_dir():
        return
    own = {MARKER_NAME, LEGACY_MARKER_NAME, *pieces}
    for path in parts.iterdir():
        if (temp_target(path.name) or path.name) in own and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        parts.rmdir()
