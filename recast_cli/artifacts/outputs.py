"""What a command's output path may replace: only a recast artifact of the same kind, never a user's file.

Every ``--out`` (and every implicit second output, such as estimate's ``G.scores.parquet``) is
claimed with :func:`claim_output` before any work is done. The rules (README, "Reliability"):

* a path that exists and is not a regular file (a device node, a pipe, a socket, a symbolic
  link, a folder) is refused;
* an existing regular file is replaced only if it is a recast artifact of the schema the command
  writes (a gain table by a gain table, Fig. 1 by a figure); anything else is refused;
* a path inside another recast artifact folder (a positives folder, a run or one of its
  checkpoints, an ``OUT.parts/`` folder, an evaluation's ``OUT.images/``, the toy model) is
  refused: those folders belong to the command that wrote them;
* the claim holds an exclusive lock on the output (``.NAME.lock`` beside it, removed on
  release) until the output is written or the command ends, so two writers of one file cannot
  both succeed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from recast_cli.artifacts.evaluation import EVAL_SCHEMA
from recast_cli.artifacts.io import check_writable, refuse_non_regular
from recast_cli.artifacts.locks import hold_output_lock
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.artifacts.kinds import FOLDER_MARKERS, artifact_schema
from recast_cli.artifacts.parts import MARKER_NAME as PARTS_MARKER
from recast_cli.artifacts.positives import JOURNAL_NAME, POSITIVES_SCHEMA
from recast_cli.errors import BadInput

#: Recast's PNG figures (Fig. 1, D curves, report figures) carry this tag in a PNG text chunk.
FIGURE_SCHEMA = "recast.figure/1"
#: The images ``recast sample`` writes carry this tag in a PNG text chunk.
IMAGE_SCHEMA = "recast.image/1"
#: ``recast report``'s report.md starts with this line.
REPORT_SCHEMA = "recast.report/1"
REPORT_MARK = f"<!-- {REPORT_SCHEMA} -->"
#: ``recast report``'s endpoints.csv of a study: a plain CSV (a comment line would stop a plain
#: ``pandas.read_csv``), recognised by its header, whose columns start with ``ENDPOINTS_HEAD`` and
#: hold ``ENDPOINTS_MIDDLE`` (a file of an older recast, which began with ``REPORT_MARK``, also counts).
ENDPOINTS_SCHEMA = "recast.endpoints/1"
ENDPOINTS_HEAD = "arm,lambda_"
ENDPOINTS_MIDDLE = ",seed,primary,secondary,worst_gain,lost,lost_rewards,"
#: The text-chunk keyword that carries a PNG's schema tag.
PNG_SCHEMA_KEY = "schema"

TOY_MODEL_MARK = "PROVENANCE.json"


def claim_output(path: str | os.PathLike[str], schema: str,
                 inputs: Sequence[str | os.PathLike[str] | None] = ()) -> Path:
    """Check that ``path`` may receive a ``schema`` artifact, and lock it for this process.

    BadInput (one line, before any work) when it may not: see the module docstring.
    """
    out = check_writable(path, inputs)
    refuse_foreign_file(out, schema)
    folder = enclosing_artifact_folder(out.parent)
    if folder is not None:
        where, tag = folder
        raise BadInput(f"cannot write {out}: it is inside {where}, a {tag} folder that another recast command "
                       "wrote; write outside it")
    hold_output_lock(out)
    return out


def claim_folder(folder: str | os.PathLike[str], kind: str | None) -> Path:
    """Check a command's output folder before any work: not a file, not inside another recast
    artifact folder, and absent, empty or a ``kind`` artifact folder already (the command resumes or
    replaces its own). ``kind`` None: a plain folder of files (``recast sample``'s images) that
    may hold anything but must not be a recast artifact folder; each file is checked on its own.
    """
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise BadInput(f"cannot write into {folder}: it is not a folder")
    enclosing = enclosing_artifact_folder(folder.parent)
    if enclosing is not None:
        where, tag = enclosing
        raise BadInput(f"cannot write {folder}: it is inside {where}, a {tag} folder that another recast command "
                       "wrote; write outside it")
    if folder.is_dir():
        own = artifact_folder_kind(folder)
        if own is not None and own != kind:
            raise BadInput(f"cannot write into {folder}: it is a {own} folder that another recast command wrote")
        if kind is not None and own is None and any(folder.iterdir()):
            raise BadInput(f"cannot write into {folder}: it holds files recast did not write and is not a {kind} "
                           "folder; choose a new or empty folder")
    return folder


def refuse_foreign_file(out: Path, schema: str) -> None:
    """BadInput unless ``out`` is absent or a regular file holding a ``schema`` artifact."""
    refuse_non_regular(out)
    if not out.exists():
        return
    found = declared_schema(out, schema)
    if found != schema:
        what = f"a {found} artifact" if found else "not a recast artifact"
        raise BadInput(f"cannot write {out}: it exists and is {what}; recast replaces only a {schema} artifact "
                       "there (remove the file or choose another path)")


def declared_schema(path: Path, expected: str) -> str | None:
    """The schema tag the file at ``path`` declares (None: none, or unreadable), read the way
    files of the ``expected`` kind carry it."""
    try:
        if expected in (FIGURE_SCHEMA, IMAGE_SCHEMA):
            return png_text(path).get(PNG_SCHEMA_KEY)
        if expected == REPORT_SCHEMA:
            with open(path, "rb") as fh:
                return REPORT_SCHEMA if fh.readline(len(REPORT_MARK) + 2).strip() == REPORT_MARK.encode() else None
        if expected == ENDPOINTS_SCHEMA:
            with open(path, "rb") as fh:
                head = fh.readline(1 << 16).decode("utf-8", "replace").strip()
            ours = head == REPORT_MARK or (head.startswith(ENDPOINTS_HEAD) and ENDPOINTS_MIDDLE in head)
            return ENDPOINTS_SCHEMA if ours else None
        if path.suffix == ".json":
            with open(path, "rb") as fh:
                raw = json_loads(fh.read(1 << 20), str(path))
            tag = raw.get("schema") if isinstance(raw, dict) else None
            return tag if isinstance(tag, str) else None
        tag, _ = artifact_schema(path)
        return tag
    except (BadInput, OSError, ValueError):
        return None


def png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a PNG before its image data (no pixel is decoded); {} if not a PNG."""
    texts: dict[str, str] = {}
    with open(path, "rb") as fh:
        if fh.read(8) != b"\x89PNG\r\n\x1a\n":
            return texts
        while True:
            head = fh.read(8)
            if len(head) < 8:
                return texts
            length, kind = int.from_bytes(head[:4], "big"), head[4:]
            if kind in (b"IDAT", b"IEND") or length > 1 << 20:
                return texts
            data = fh.read(length)
            fh.seek(4, os.SEEK_CUR)  # CRC
            if kind == b"tEXt" and b"\0" in data:
                key, _, value = data.partition(b"\0")
                texts[key.decode("latin-1")] = value.decode("latin-1")


def enclosing_artifact_folder(folder: Path) -> tuple[Path, str] | None:
    """The nearest folder at or above ``folder`` that is a recast artifact folder, with its kind."""
    for candidate in (folder.absolute(), *folder.absolute().parents):
        if not candidate.is_dir():
            continue
        kind = artifact_folder_kind(candidate)
        if kind is not None:
            return candidate, kind
    return None


def artifact_folder_kind(folder: Path) -> str | None:
    """What recast artifact folder ``folder`` is, judged by its marker file's content (None: none)."""
    if (folder / JOURNAL_NAME).is_file():
        return POSITIVES_SCHEMA
    for marker, tag in FOLDER_MARKERS:
        if (folder / marker).is_file() and declared_schema(folder / marker, tag) == tag:
            return tag
    if folder.name.endswith(".parts") and (folder / PARTS_MARKER).is_file():
        return "recast parts (OUT.parts/)"
    if folder.name.endswith(".images"):
        table = folder.with_name(folder.name.removesuffix(".images") + ".parquet")
        if table.is_file() and declared_schema(table, EVAL_SCHEMA) == EVAL_SCHEMA:
            return "recast evaluation images (OUT.images/)"
    if (folder / TOY_MODEL_MARK).is_file():
        try:
            command = json_loads((folder / TOY_MODEL_MARK).read_text(encoding="utf-8"), str(folder)).get("command", "")
        except (OSError, ValueError, AttributeError):
            return None
        if isinstance(command, str) and command.startswith("recast toy pretrain"):
            return "recast toy model"
    return None

