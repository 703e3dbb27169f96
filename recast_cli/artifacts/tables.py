"""Parquet artifacts and their metadata: reading, writing, and the checks every schema's reader shares.

Metadata values are JSON (Parquet key-value metadata, safetensors string metadata). Every check
raises :class:`~recast_cli.errors.BadInput` with one line that names the file and the problem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recast_cli.artifacts.io import atomic_write_bytes
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.errors import BadInput


def check_finite(name: str, values: np.ndarray, where: str, rewards: Sequence[str] | None = None) -> None:
    """BadInput naming the first NaN or inf of ``values`` (with its reward, when rows are ``rewards``)."""
    bad = ~np.isfinite(values)
    if bad.any():
        idx = np.argwhere(bad)[0]
        at = f" (reward {rewards[idx[0]]!r}, index {tuple(int(i) for i in idx[1:])})" if rewards else ""
        raise BadInput(f"{where}: column {name!r} has NaN or inf{at}")


def require_file(path: Path) -> None:
    """BadInput unless ``path`` is a regular file (or a link to one): a missing path is "no such file", a
    folder, device or FIFO (``/dev/zero``: endless; a FIFO: blocks) "not a regular file", never read."""
    if not path.is_file():
        raise BadInput(f"{path}: {'not a regular file' if path.exists() else 'no such file'}")


def read_parquet(path: Path) -> pa.Table:
    """The table of a Parquet file; BadInput when it is missing, not a regular file or unreadable."""
    require_file(path)
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"{path}: not a readable Parquet file ({first})") from None


def decode_metadata(raw: Mapping[bytes, bytes] | None, where: str) -> dict[str, Any]:
    """Parquet key-value metadata with its JSON values decoded (pandas' and Arrow's own keys left out)."""
    meta: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        name = key.decode("utf-8", "replace")
        if name in ("pandas", "ARROW:schema"):
            continue
        try:
            meta[name] = json_loads(value, f"{where}: metadata {name!r}")
        except json.JSONDecodeError:
            raise BadInput(f"{where}: metadata {name!r} is not JSON") from None
    return meta


#: Earlier schema tags the current readers still read, mapped to the tag that replaced them: a file of an
#: earlier version is that kind of artifact (read, inspected, replaced) without the columns added since.
EARLIER_TAGS: dict[str, str] = {"recast.gains/1": "recast.gains/2"}


def current_tag(tag: Any) -> Any:
    """The tag a file declaring ``tag`` is read as: the newer version's for an earlier version's, else ``tag``."""
    return EARLIER_TAGS.get(tag, tag) if isinstance(tag, str) else tag


def require_schema(meta: Mapping[str, Any], expected: str, where: str) -> None:
    """BadInput unless the metadata declares the schema tag ``expected`` (or an earlier version of it)."""
    if "schema" not in meta:
        raise BadInput(f"{where}: no 'schema' tag in the metadata (expected {expected!r})")
    if current_tag(meta["schema"]) != expected:
        raise BadInput(f"{where}: schema tag is {meta['schema']!r}, expected {expected!r}")


def require_keys(meta: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    """BadInput naming the ``keys`` the metadata lacks."""
    missing = [k for k in keys if k not in meta]
    if missing:
        raise BadInput(f"{where}: metadata is missing {', '.join(map(repr, missing))}")


def write_parquet(path: str | os.PathLike[str], table: pa.Table) -> None:
    """Serialise in memory, then write atomically."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def open_parquet(path: str | os.PathLike[str], schema: str) -> tuple[pa.Table, dict[str, Any], str]:
    """Read a Parquet artifact and check its schema tag: (table, decoded metadata, where)."""
    p = Path(path)
    where = str(p)
    arrow = read_parquet(p)
    meta = decode_metadata(arrow.schema.metadata, where)
    require_schema(meta, schema, where)
    return arrow, meta, where


def require_columns(arrow: pa.Table, columns: Mapping[str, pa.DataType], where: str,
                    not_null: Sequence[str] = ()) -> None:
    """BadInput unless the table has every one of ``columns`` and no nulls in those of ``not_null``."""
    missing = [c for c in columns if c not in arrow.column_names]
    if missing:
        raise BadInput(f"{where}: missing column(s) {', '.join(map(repr, missing))}")
    for name in not_null:
        if arrow.column(name).null_count:
            raise BadInput(f"{where}: column {name!r} has nulls")
