"""The resumable ``OUT.parts/`` folder of a long stage (``estimate``, ``evaluate``), written once.

A stage that writes ``OUT`` keeps its finished pieces (one file per prompt or chunk) in the
sibling folder ``OUT.parts/`` until the whole table is written, so a killed run resumes where
it stopped. The folder's marker, ``parts.json``, names the run (a key of everything that
determines the results); its exclusive lock makes one writer per output.

* A marker of the same run: resume from the pieces there.
* A marker of another run (or of an older recast, which called it ``run.json``), or pieces and no
  marker: refuse while it holds pieces; one that finished no piece (it stopped on bad input)
  blocks nothing.
* Done: the stage writes ``OUT``, then removes the folder (:func:`finish_parts`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recast_cli.artifacts.io import FolderLock, atomic_write_bytes
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
                value = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
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


def finish_parts(out: str | Path) -> None:
    """Remove ``OUT.parts/`` once ``OUT`` is written."""
    shutil.rmtree(parts_dir(out), ignore_errors=True)
