"""Every artifact schema of recast, with atomic writes, provenance and validation on read.

One module owns the file formats (ARCHITECTURE.md, "Artifacts"; the project's own
description is ``docs/artifacts.md``). Readers validate everything a later stage relies on
and raise :class:`~recast_cli.errors.BadInput` with one line that names the problem.

* ``recast.gains/1``: Parquet, one row per (reward, t), t = 0..T, key-value metadata with
  JSON values.
* ``recast.weights/1``: safetensors, tensor ``W`` float64 [m, T] (row i = reward i,
  column t-1 = step t) and tensor ``gain`` float64 [m, T] (the per-step gains on the same
  grid that W was solved from), string metadata (JSON where structured).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from recast_cli import __version__
from recast_cli.errors import BadInput

# The process umask, read once (os.umask can only be read by setting it).
_UMASK = os.umask(0)
os.umask(_UMASK)

GAINS_SCHEMA = "recast.gains/1"
WEIGHTS_SCHEMA = "recast.weights/1"

SAMPLINGS = ("pplus", "pold", "exact")
MONOTONE_METHODS = ("clip", "isotonic", "none")
MODES = ("recast", "nosink", "static", "reversed")


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
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
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
    crashed stage never leaves a half-written artifact.
    """
    out = check_writable(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(out)
        fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp")
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; artifacts get the usual permissions
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def clean_stale_temps(out: Path) -> list[Path]:
    """Remove the temporary files of earlier writes of ``out`` whose writer is gone (killed).

    Temporary names are ``.NAME.PID.XXXXXX.tmp``: a file whose PID is a live process is another
    writer's and is kept; the rest (and the older ``.NAME.XXXXXX.tmp`` form) are removed.
    """
    removed = []
    for tmp in out.parent.glob(f".{glob_escape(out.name)}.*.tmp"):
        middle = tmp.name[len(out.name) + 2: -len(".tmp")]
        pid_text = middle.split(".", 1)[0] if "." in middle else ""
        if pid_text.isdigit() and _alive(int(pid_text)):
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
    except PermissionError:
        return True
    return True


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


# --------------------------------------------------------------------------- helpers


def _json_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=False)


def _check_finite(name: str, values: np.ndarray, where: str, rewards: Sequence[str] | None = None) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        idx = np.argwhere(bad)[0]
        at = f" (reward {rewards[idx[0]]!r}, index {tuple(int(i) for i in idx[1:])})" if rewards else ""
        raise BadInput(f"{where}: column {name!r} has NaN or inf{at}")


def artifact_kind(path: str | os.PathLike[str]) -> str:
    """'parquet' or 'safetensors' from the file's first bytes; BadInput for anything else."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: no such file")
    with open(p, "rb") as fh:
        head = fh.read(9)
    if head[:4] == b"PAR1":
        return "parquet"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    raise BadInput(f"{p}: neither a Parquet nor a safetensors file")


#: Folder artifacts, by the file that marks them (first match wins). The tags of runs and
#: checkpoints are spelled out here: their modules (train/trainer.py, train/checkpoint.py) pull in torch.
FOLDER_MARKERS = (
    ("manifest.parquet", "recast.positives/1"),
    ("run.json", "recast.run/1"),
    ("manifest.json", "recast.checkpoint/1"),
)


def artifact_schema(path: str | os.PathLike[str]) -> tuple[str | None, Path]:
    """The schema tag an artifact declares, and the path to read it from.

    A folder is known by the file that marks it (:data:`FOLDER_MARKERS`); that marker file
    given on its own stands for its folder. A Parquet file declares its tag in the key-value
    metadata, a safetensors file in its header's ``__metadata__``; a file that declares none
    gives None. BadInput when the path is missing, unreadable, or neither a folder, Parquet
    nor safetensors.
    """
    p = Path(path)
    if not p.exists():
        raise BadInput(f"{p}: no such file or folder")
    if p.is_dir():
        for marker, tag in FOLDER_MARKERS:
            if (p / marker).is_file():
                return tag, p
        markers = ", ".join(m for m, _ in FOLDER_MARKERS)
        raise BadInput(f"{p}: a folder that holds no recast artifact (none of {markers})")
    for marker, tag in FOLDER_MARKERS:
        if p.name == marker and marker.endswith(".json"):
            return tag, p.parent
    if artifact_kind(p) == "safetensors":
        try:
            with open(p, "rb") as fh:
                header_len = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(min(header_len, 100_000_000)))
        except (ValueError, UnicodeDecodeError):
            raise BadInput(f"{p}: not a readable safetensors file (bad header)") from None
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        tag = meta.get("schema") if isinstance(meta, dict) else None
        return (tag if isinstance(tag, str) else None), p
    try:
        raw = pq.read_schema(p).metadata
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"{p}: not a readable Parquet file ({first})") from None
    try:
        tag = json.loads((raw or {}).get(b"schema", b"null"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadInput(f"{p}: metadata 'schema' is not JSON") from None
    return (tag if isinstance(tag, str) else None), p


def _read_parquet(path: Path) -> pa.Table:
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"{path}: not a readable Parquet file ({first})") from None


def _decode_metadata(raw: Mapping[bytes, bytes] | None, where: str) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        name = key.decode("utf-8", "replace")
        if name in ("pandas", "ARROW:schema"):
            continue
        try:
            meta[name] = json.loads(value)
        except json.JSONDecodeError:
            raise BadInput(f"{where}: metadata {name!r} is not JSON") from None
    return meta


def _require_schema(meta: Mapping[str, Any], expected: str, where: str) -> None:
    if "schema" not in meta:
        raise BadInput(f"{where}: no 'schema' tag in the metadata (expected {expected!r})")
    if meta["schema"] != expected:
        raise BadInput(f"{where}: schema tag is {meta['schema']!r}, expected {expected!r}")


def _require_keys(meta: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    missing = [k for k in keys if k not in meta]
    if missing:
        raise BadInput(f"{where}: metadata is missing {', '.join(map(repr, missing))}")


def _write_parquet(path: str | os.PathLike[str], table: pa.Table) -> None:
    """Serialise in memory, then write atomically."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def _open_parquet(path: str | os.PathLike[str], schema: str) -> tuple[pa.Table, dict[str, Any], str]:
    """Read a Parquet artifact and check its schema tag: (table, decoded metadata, where)."""
    p = Path(path)
    where = str(p)
    arrow = _read_parquet(p)
    meta = _decode_metadata(arrow.schema.metadata, where)
    _require_schema(meta, schema, where)
    return arrow, meta, where


def _require_columns(arrow: pa.Table, columns: Mapping[str, pa.DataType], where: str,
                     not_null: Sequence[str] = ()) -> None:
    missing = [c for c in columns if c not in arrow.column_names]
    if missing:
        raise BadInput(f"{where}: missing column(s) {', '.join(map(repr, missing))}")
    for name in not_null:
        if arrow.column(name).null_count:
            raise BadInput(f"{where}: column {name!r} has nulls")


# --------------------------------------------------------------------------- gain table

GAIN_COLUMNS: dict[str, pa.DataType] = {
    "reward": pa.string(),
    "t": pa.int32(),
    "sigma": pa.float64(),
    "D": pa.float64(),
    "D_lo": pa.float64(),
    "D_hi": pa.float64(),
    "gain_raw": pa.float64(),
    "gain": pa.float64(),
    "gain_lo": pa.float64(),
    "gain_hi": pa.float64(),
}

#: Run metadata a gain table must carry besides its provenance (ARCHITECTURE.md).
GAIN_RUN_KEYS = (
    "alpha", "beta", "N", "K", "P", "sampling", "crn", "monotone", "reward_std", "policy", "positives",
)
_PROVENANCE_KEYS = ("schema", "recast_version", "created_at", "config", "sources")


@dataclass(frozen=True)
class GainTable:
    """Cumulative discriminability and per-step gains of m rewards on a grid of T steps (E4, E5).

    Arrays are indexed by reward first. ``D[:, t]`` is D_{i,t} for t = 0..T; gains are
    per step: ``gain[:, t-1]`` is ΔD_{i,t} for t = 1..T. Interval arrays are None when the
    run made no bootstrap. ``meta`` holds the run metadata (alpha, beta, N, K, P, sampling,
    crn, monotone, reward_std, policy, positives, and optionally grid / surrogate checks).
    """

    rewards: tuple[str, ...]
    sigmas: np.ndarray
    D: np.ndarray
    gain_raw: np.ndarray
    gain: np.ndarray
    D_lo: np.ndarray | None = None
    D_hi: np.ndarray | None = None
    gain_lo: np.ndarray | None = None
    gain_hi: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    @property
    def T(self) -> int:
        return len(self.sigmas) - 1

    @property
    def m(self) -> int:
        return len(self.rewards)

    def total_gain(self) -> np.ndarray:
        """Σ_t ΔD_{i,t} per reward: D_{i,0} when the gains telescope (E5)."""
        return self.gain.sum(axis=1)

    def peak_step(self) -> np.ndarray:
        """The step t (1..T) with the largest gain, per reward."""
        return self.gain.argmax(axis=1) + 1

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        m, T = self.m, self.T
        t = np.tile(np.arange(T + 1, dtype=np.int32), m)

        def with_null_t0(per_step: np.ndarray | None) -> pa.Array:
            if per_step is None:
                return pa.nulls(m * (T + 1), type=pa.float64())
            full = np.concatenate([np.full((m, 1), np.nan), per_step], axis=1).ravel()
            return pa.array(full, type=pa.float64(), mask=np.isnan(full))

        def per_level(values: np.ndarray | None) -> pa.Array:
            if values is None:
                return pa.nulls(m * (T + 1), type=pa.float64())
            return pa.array(np.asarray(values, dtype=np.float64).ravel(), type=pa.float64())

        columns = {
            "reward": pa.array(np.repeat(np.array(self.rewards, dtype=object), T + 1), type=pa.string()),
            "t": pa.array(t, type=pa.int32()),
            "sigma": pa.array(np.tile(self.sigmas, m), type=pa.float64()),
            "D": per_level(self.D),
            "D_lo": per_level(self.D_lo),
            "D_hi": per_level(self.D_hi),
            "gain_raw": with_null_t0(self.gain_raw),
            "gain": with_null_t0(self.gain),
            "gain_lo": with_null_t0(self.gain_lo),
            "gain_hi": with_null_t0(self.gain_hi),
        }
        metadata = {**self.meta, "T": T, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(GAIN_COLUMNS.items())))
        return table.replace_schema_metadata({k: _json_dumps(v) for k, v in metadata.items()})


def validate_gain_table(table: GainTable, where: str = "gain table") -> None:
    """Raise BadInput unless the arrays and metadata form a valid ``recast.gains/1`` table."""
    m, T = table.m, table.T
    if m == 0:
        raise BadInput(f"{where}: no rewards")
    if len(set(table.rewards)) != m:
        raise BadInput(f"{where}: duplicate reward names {list(table.rewards)}")
    if T < 1:
        raise BadInput(f"{where}: needs at least t = 0 and t = 1 (T >= 1)")
    sig = np.asarray(table.sigmas, dtype=np.float64)
    _check_finite("sigma", sig, where)
    if sig[0] != 0.0:
        raise BadInput(f"{where}: sigma at t = 0 must be 0 (clean data), got {sig[0]!r}")
    if not np.all(np.diff(sig) > 0):
        t_bad = int(np.argmax(np.diff(sig) <= 0)) + 1
        raise BadInput(f"{where}: sigma must increase strictly with t (t = T the noisiest); not at t = {t_bad}")
    if sig[-1] > 1.0:
        raise BadInput(f"{where}: sigma must lie in [0, 1], got {sig[-1]!r} at t = {T}")
    shapes = {"D": (m, T + 1), "D_lo": (m, T + 1), "D_hi": (m, T + 1),
              "gain_raw": (m, T), "gain": (m, T), "gain_lo": (m, T), "gain_hi": (m, T)}
    for name, shape in shapes.items():
        values = getattr(table, name)
        if values is None:
            if name in ("D", "gain", "gain_raw"):
                raise BadInput(f"{where}: column {name!r} is missing")
            continue
        if np.shape(values) != shape:
            raise BadInput(f"{where}: column {name!r} has shape {np.shape(values)}, expected {shape}")
        _check_finite(name, np.asarray(values, dtype=np.float64), where, table.rewards)
    if np.any(table.gain < 0):
        i, j = np.argwhere(table.gain < 0)[0]
        raise BadInput(f"{where}: 'gain' must be non-negative; reward {table.rewards[i]!r} has "
                       f"{table.gain[i, j]:.3g} at t = {j + 1}")
    _require_keys(table.meta, GAIN_RUN_KEYS, where)
    if table.meta["sampling"] not in SAMPLINGS:
        raise BadInput(f"{where}: metadata 'sampling' must be one of {SAMPLINGS}, got {table.meta['sampling']!r}")
    if table.meta["monotone"] not in MONOTONE_METHODS:
        raise BadInput(f"{where}: metadata 'monotone' must be one of {MONOTONE_METHODS}, "
                       f"got {table.meta['monotone']!r}")
    if "grid" in table.meta:
        from recast_cli.grid import GridSpec

        GridSpec.from_json(table.meta["grid"], where)


def write_gains(path: str | os.PathLike[str], table: GainTable, *, config: Mapping[str, Any] | None = None,
                sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``table`` and write it atomically as a ``recast.gains/1`` Parquet file."""
    validate_gain_table(table)
    provenance = Provenance.new(GAINS_SCHEMA, config, sources)
    _write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_gains(path: str | os.PathLike[str]) -> GainTable:
    """Read and validate a ``recast.gains/1`` Parquet file (BadInput names what is wrong)."""
    arrow, meta, where = _open_parquet(path, GAINS_SCHEMA)
    _require_columns(arrow, GAIN_COLUMNS, where)
    kinds = {"reward": pa.types.is_string, "t": pa.types.is_integer}
    for name in GAIN_COLUMNS:
        check = kinds.get(name, pa.types.is_floating)
        dtype = arrow.schema.field(name).type
        if not (check(dtype) or pa.types.is_null(dtype) or (name == "reward" and pa.types.is_large_string(dtype))):
            raise BadInput(f"{where}: column {name!r} has type {dtype}, expected {GAIN_COLUMNS[name]}")
    _require_columns(arrow, GAIN_COLUMNS, where, not_null=("reward", "t", "sigma", "D"))

    reward_col = arrow.column("reward").to_pylist()
    t_col = arrow.column("t").to_numpy().astype(np.int64)
    rewards = tuple(dict.fromkeys(reward_col))
    index = {r: i for i, r in enumerate(rewards)}
    seen: set[tuple[str, int]] = set()
    for r, t in zip(reward_col, t_col.tolist()):
        if (r, t) in seen:
            raise BadInput(f"{where}: duplicate row for (reward {r!r}, t = {t})")
        seen.add((r, t))
    T = int(t_col.max())
    for r in rewards:
        ts = sorted(t for (rr, t) in seen if rr == r)
        if ts != list(range(T + 1)):
            raise BadInput(f"{where}: t of reward {r!r} is not contiguous 0..{T} (has {_ranges(ts)})")
    if "T" in meta and meta["T"] != T:
        raise BadInput(f"{where}: metadata T = {meta['T']} but rows run t = 0..{T}")
    _require_keys(meta, ("T", *_PROVENANCE_KEYS[1:]), where)

    m = len(rewards)
    rows = np.array([index[r] for r in reward_col])

    def grid(name: str) -> np.ndarray:
        out = np.full((m, T + 1), np.nan)
        out[rows, t_col] = arrow.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        return out

    sigma = grid("sigma")
    if not np.all(sigma == sigma[:1]):
        i, t = np.argwhere(sigma != sigma[:1])[0]
        raise BadInput(f"{where}: sigma differs between rewards at t = {t} (reward {rewards[i]!r})")

    def per_step(name: str, optional: bool) -> np.ndarray | None:
        values = grid(name)
        if not np.isnan(values[:, 0]).all():
            raise BadInput(f"{where}: column {name!r} must be null at t = 0")
        body = values[:, 1:]
        null = _null_mask(arrow, name, rows, t_col, m, T)[:, 1:]
        if optional and null.all():
            return None
        if null.any():
            i, j = np.argwhere(null)[0]
            raise BadInput(f"{where}: column {name!r} is null at (reward {rewards[i]!r}, t = {j + 1})")
        return body

    def per_level(name: str) -> np.ndarray | None:
        null = _null_mask(arrow, name, rows, t_col, m, T)
        if null.all():
            return None
        if null.any():
            i, j = np.argwhere(null)[0]
            raise BadInput(f"{where}: column {name!r} is null at (reward {rewards[i]!r}, t = {j})")
        return grid(name)

    table = GainTable(
        rewards=rewards,
        sigmas=sigma[0],
        D=grid("D"),
        gain_raw=per_step("gain_raw", optional=False),
        gain=per_step("gain", optional=False),
        D_lo=per_level("D_lo"),
        D_hi=per_level("D_hi"),
        gain_lo=per_step("gain_lo", optional=True),
        gain_hi=per_step("gain_hi", optional=True),
        meta={k: v for k, v in meta.items() if k not in (*_PROVENANCE_KEYS, "T")},
        provenance=Provenance.from_metadata(meta, where),
    )
    validate_gain_table(table, where)
    return table


def _null_mask(arrow: pa.Table, name: str, rows: np.ndarray, t_col: np.ndarray, m: int, T: int) -> np.ndarray:
    mask = np.zeros((m, T + 1), dtype=bool)
    mask[rows, t_col] = arrow.column(name).is_null().to_numpy(zero_copy_only=False)
    return mask


def _ranges(ts: Sequence[int]) -> str:
    if not ts:
        return "none"
    parts, start, prev = [], ts[0], ts[0]
    for t in list(ts[1:]) + [None]:
        if t is not None and t == prev + 1:
            prev = t
            continue
        parts.append(f"{start}" if start == prev else f"{start}..{prev}")
        if t is not None:
            start = prev = t
    return ", ".join(parts)


# --------------------------------------------------------------------------- weight matrix


@dataclass(frozen=True)
class WeightMatrix:
    """The reward x step weight matrix W (E12) with the gains it was solved from.

    ``W[i, t-1]`` is the weight of reward i at step t. ``trained_steps`` lists the steps the
    trainer trains (t ascending; None: all T): every other column is zero, rows sum to λ̂_i,
    and in modes ``recast`` and ``static`` every trained column sums to 1/T' (T' trained
    steps). ``sigmas`` runs σ_T … σ_0 (scheduler order). ``gain`` holds ΔD_{i,t} on this grid
    (after E9 resampling, before E10). ``info`` holds solver facts (iterations, marginal
    error, floor, indiscriminable rewards, spill shares).
    """

    W: np.ndarray
    gain: np.ndarray
    rewards: tuple[str, ...]
    lam: tuple[float, ...]
    mode: str
    tau: float
    sigmas: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None
    trained_steps: tuple[int, ...] | None = None

    @property
    def T(self) -> int:
        return int(self.W.shape[1])

    @property
    def steps(self) -> tuple[int, ...]:
        """The trained steps t (ascending): ``trained_steps``, or every step 1 … T."""
        return tuple(range(1, self.T + 1)) if self.trained_steps is None else tuple(self.trained_steps)

    @property
    def skip_clean(self) -> int:
        """How many of the cleanest steps carry no weight (``solve-w --skip-clean``)."""
        return self.T - len(self.steps)

    @property
    def m(self) -> int:
        return int(self.W.shape[0])


def validate_weights(w: WeightMatrix, where: str = "weight matrix") -> None:
    if w.W.ndim != 2 or w.W.shape[0] < 1 or w.W.shape[1] < 1:
        raise BadInput(f"{where}: tensor 'W' must have shape [m, T], got {list(w.W.shape)}")
    if w.W.dtype != np.float64:
        raise BadInput(f"{where}: tensor 'W' must be float64, got {w.W.dtype}")
    if w.gain.shape != w.W.shape:
        raise BadInput(f"{where}: tensor 'gain' has shape {list(w.gain.shape)}, expected {list(w.W.shape)}")
    _check_finite("W", w.W, where, w.rewards)
    _check_finite("gain", w.gain, where, w.rewards)
    if np.any(w.W < 0):
        raise BadInput(f"{where}: tensor 'W' has negative entries")
    if len(w.rewards) != w.m or len(set(w.rewards)) != w.m:
        raise BadInput(f"{where}: 'rewards' must name the {w.m} rows of W once each, got {list(w.rewards)}")
    if len(w.lam) != w.m or not all(math.isfinite(x) and x > 0 for x in w.lam):
        raise BadInput(f"{where}: 'lambda' must hold {w.m} positive numbers, got {list(w.lam)}")
    if w.mode not in MODES:
        raise BadInput(f"{where}: 'mode' must be one of {MODES}, got {w.mode!r}")
    if not (math.isfinite(w.tau) and w.tau > 0):
        raise BadInput(f"{where}: 'tau' must be a positive number, got {w.tau!r}")
    sig = np.asarray(w.sigmas, dtype=np.float64)
    if sig.shape != (w.T + 1,):
        raise BadInput(f"{where}: 'sigmas' must hold T + 1 = {w.T + 1} values, got {sig.size}")
    if not (np.all(np.isfinite(sig)) and np.all(np.diff(sig) < 0) and sig[-1] == 0.0):
        raise BadInput(f"{where}: 'sigmas' must run strictly down from σ_T to σ_0 = 0")
    check_marginals(w, where)


#: Tolerance of the marginals a W file must meet against its own metadata.
MARGINAL_TOL = 1e-8


def check_marginals(w: WeightMatrix, where: str = "weight matrix") -> None:
    """BadInput unless W agrees with its metadata (E12): rows sum to the recorded λ̂, the
    untrained columns are zero and, in modes ``recast``, ``static`` and ``reversed``, each trained column
    sums to 1/T' (all to ``MARGINAL_TOL``). A rescaled or relabelled tensor is refused."""
    steps = w.trained_steps
    if steps is not None:
        if (not steps or list(steps) != sorted(set(steps))
                or not all(isinstance(t, int) and 1 <= t <= w.T for t in steps)):
            raise BadInput(f"{where}: 'trained_steps' must list distinct steps of 1 … {w.T} in ascending order, "
                           f"got {list(steps)}")
    trained = np.array(w.steps) - 1
    untrained = np.setdiff1d(np.arange(w.T), trained)
    if untrained.size and np.any(w.W[:, untrained] != 0):
        raise BadInput(f"{where}: W puts weight on steps {[int(j) + 1 for j in untrained if w.W[:, j].any()]}, "
                       f"which its metadata says are not trained")
    lam = np.asarray(w.lam, dtype=np.float64) / max(w.lam)  # scaled first: huge budgets do not overflow
    lam_hat = lam / lam.sum()
    rows = w.W.sum(axis=1)
    if np.max(np.abs(rows - lam_hat)) > MARGINAL_TOL:
        raise BadInput(f"{where}: the rows of W sum to {np.round(rows, 6).tolist()}, not to the recorded "
                       f"λ̂ = {np.round(lam_hat, 6).tolist()} (λ = {list(w.lam)})")
    if w.mode in ("recast", "static", "reversed"):
        cols = w.W[:, trained].sum(axis=0)
        target = 1.0 / len(trained)
        if np.max(np.abs(cols - target)) > MARGINAL_TOL:
            worst = int(trained[np.argmax(np.abs(cols - target))]) + 1
            raise BadInput(f"{where}: mode {w.mode!r} needs every trained column of W to sum to 1/T' = "
                           f"{target:.6g}; step {worst} sums to {float(w.W[:, worst - 1].sum()):.6g}")


def write_weights(path: str | os.PathLike[str], w: WeightMatrix, *, config: Mapping[str, Any] | None = None,
                  sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``w`` and write it atomically as a ``recast.weights/1`` safetensors file."""
    validate_weights(w)
    provenance = Provenance.new(WEIGHTS_SCHEMA, config, sources)
    meta = provenance.to_metadata()
    metadata = {
        "schema": WEIGHTS_SCHEMA,
        "recast_version": provenance.recast_version,
        "created_at": provenance.created_at,
        "config": _json_dumps(meta["config"]),
        "sources": _json_dumps(meta["sources"]),
        "rewards": _json_dumps(list(w.rewards)),
        "lambda": _json_dumps([float(x) for x in w.lam]),
        "mode": w.mode,
        "tau": _json_dumps(float(w.tau)),
        "T": _json_dumps(w.T),
        "sigmas": _json_dumps([float(s) for s in w.sigmas]),
        "info": _json_dumps(w.info),
    }
    if w.trained_steps is not None:
        metadata["trained_steps"] = _json_dumps([int(t) for t in w.trained_steps])
    tensors = {"W": np.ascontiguousarray(w.W, dtype=np.float64), "gain": np.ascontiguousarray(w.gain, dtype=np.float64)}
    atomic_write_bytes(path, st_save(tensors, metadata=metadata))
    return provenance


def read_weights(path: str | os.PathLike[str]) -> WeightMatrix:
    """Read and validate a ``recast.weights/1`` safetensors file."""
    p = Path(path)
    where = str(p)
    if not p.is_file():
        raise BadInput(f"{where}: no such file")
    data = p.read_bytes()
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len])
    except (SafetensorError, ValueError, json.JSONDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"{where}: not a readable safetensors file ({first})") from None
    raw = header.get("__metadata__") or {}
    _require_schema(raw, WEIGHTS_SCHEMA, where)
    required = ("rewards", "lambda", "mode", "tau", "T", "sigmas", "sources", "config",
                "recast_version", "created_at")
    _require_keys(raw, required, where)
    meta: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("schema", "mode", "recast_version", "created_at"):
            meta[key] = value
            continue
        try:
            meta[key] = json.loads(value)
        except json.JSONDecodeError:
            raise BadInput(f"{where}: metadata {key!r} is not JSON") from None
    for name in ("W", "gain"):
        if name not in tensors:
            raise BadInput(f"{where}: no tensor {name!r}")
    if meta["T"] != tensors["W"].shape[-1]:
        raise BadInput(f"{where}: metadata T = {meta['T']} but W has {tensors['W'].shape[-1]} columns")
    try:
        lam = tuple(float(x) for x in meta["lambda"])
        sigmas = np.asarray(meta["sigmas"], dtype=np.float64)
        tau = float(meta["tau"])
    except (TypeError, ValueError):
        raise BadInput(f"{where}: metadata 'lambda', 'sigmas' and 'tau' must be numbers") from None
    trained_steps = meta.get("trained_steps")
    if trained_steps is not None:
        if not isinstance(trained_steps, list) or not all(type(t) is int for t in trained_steps):
            raise BadInput(f"{where}: metadata 'trained_steps' must be a list of step numbers")
        trained_steps = tuple(trained_steps)
    w = WeightMatrix(
        W=tensors["W"],
        gain=tensors["gain"],
        rewards=tuple(str(r) for r in meta["rewards"]),
        lam=lam,
        mode=meta["mode"],
        tau=tau,
        sigmas=sigmas,
        info=meta.get("info", {}),
        provenance=Provenance.from_metadata(meta, where),
        trained_steps=trained_steps,
    )
    validate_weights(w, where)
    return w


# --------------------------------------------------------------------------- rollout scores

SCORES_SCHEMA = "recast.scores/1"

SCORE_COLUMNS: dict[str, pa.DataType] = {
    "prompt_id": pa.int32(),
    "prompt": pa.string(),
    "sample": pa.int32(),
    "t": pa.int32(),
    "k": pa.int32(),
    "reward": pa.string(),
    "score": pa.float64(),
}

#: Run metadata a scores table must carry besides its provenance.
SCORE_RUN_KEYS = ("run_id", "rewards", "T", "N", "K", "P", "sigmas", "sampling", "crn", "rollout_noise",
                  "guidance_scale", "policy", "positives", "seed")


@dataclass(frozen=True)
class ScoreTable:
    """Raw reward scores of every rollout endpoint of one estimation run (or shard).

    ``scores[p, n, t, k, i]`` is reward i of rollout k from x_t of sample n of prompt p;
    t = 0 holds the sample itself (k = 0 only; the other k are NaN): the positive under
    π⁺-sampling, the trajectory's own endpoint under π^old-sampling. ``prompt_ids`` and
    ``prompts`` name the P prompts in table order.
    """

    prompt_ids: tuple[int, ...]
    prompts: tuple[str, ...]
    rewards: tuple[str, ...]
    scores: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return self.scores.shape  # type: ignore[return-value]

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        P, N, T1, K, m = self.scores.shape
        p, n, t, k, i = (a.ravel() for a in np.meshgrid(np.arange(P), np.arange(N), np.arange(T1), np.arange(K),
                                                          np.arange(m), indexing="ij"))
        keep = (t > 0) | (k == 0)
        p, n, t, k, i = p[keep], n[keep], t[keep], k[keep], i[keep]
        columns = {
            "prompt_id": pa.array(np.asarray(self.prompt_ids, dtype=np.int32)[p], type=pa.int32()),
            "prompt": pa.array(np.asarray(self.prompts, dtype=object)[p], type=pa.string()),
            "sample": pa.array(n.astype(np.int32), type=pa.int32()),
            "t": pa.array(t.astype(np.int32), type=pa.int32()),
            "k": pa.array(k.astype(np.int32), type=pa.int32()),
            "reward": pa.array(np.asarray(self.rewards, dtype=object)[i], type=pa.string()),
            "score": pa.array(self.scores[p, n, t, k, i], type=pa.float64()),
        }
        metadata = {**self.meta, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(SCORE_COLUMNS.items())))
        return table.replace_schema_metadata({key: _json_dumps(v) for key, v in metadata.items()})


def write_scores(path: str | os.PathLike[str], table: ScoreTable, *, config: Mapping[str, Any] | None = None,
                 sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Write a ``recast.scores/1`` Parquet file atomically."""
    _require_keys(table.meta, SCORE_RUN_KEYS, "scores table")
    body = table.scores[:, :, 1:]
    if not np.isfinite(body).all() or not np.isfinite(table.scores[:, :, 0, 0]).all():
        raise BadInput("scores table: every rollout score must be finite")
    provenance = Provenance.new(SCORES_SCHEMA, config, sources)
    _write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_scores(path: str | os.PathLike[str]) -> ScoreTable:
    """Read and validate a ``recast.scores/1`` file back into its dense [P, N, T+1, K, m] array."""
    arrow, meta, where = _open_parquet(path, SCORES_SCHEMA)
    _require_keys(meta, (*SCORE_RUN_KEYS, *_PROVENANCE_KEYS[1:]), where)
    _require_columns(arrow, SCORE_COLUMNS, where, not_null=tuple(SCORE_COLUMNS))
    rewards = tuple(meta["rewards"])
    T, N, K = int(meta["T"]), int(meta["N"]), int(meta["K"])
    pid = arrow.column("prompt_id").to_numpy().astype(np.int64)
    prompt_col = arrow.column("prompt").to_pylist()
    order: dict[int, str] = {}
    for i, text in zip(pid.tolist(), prompt_col):
        if order.setdefault(i, text) != text:
            raise BadInput(f"{where}: prompt_id {i} names two different prompts")
    prompt_ids = tuple(sorted(order))
    index = {i: j for j, i in enumerate(prompt_ids)}
    reward_index = {r: j for j, r in enumerate(rewards)}
    unknown = set(arrow.column("reward").to_pylist()) - set(rewards)
    if unknown:
        raise BadInput(f"{where}: rows name rewards {sorted(unknown)} that the metadata does not list")
    n = arrow.column("sample").to_numpy().astype(np.int64)
    t = arrow.column("t").to_numpy().astype(np.int64)
    k = arrow.column("k").to_numpy().astype(np.int64)
    if n.min(initial=0) < 0 or n.max(initial=0) >= N or t.min(initial=0) < 0 or t.max(initial=0) > T \
            or k.min(initial=0) < 0 or k.max(initial=0) >= K or np.any((t == 0) & (k != 0)):
        raise BadInput(f"{where}: sample, t or k outside the run's N = {N}, T = {T}, K = {K}")
    r = np.array([reward_index[x] for x in arrow.column("reward").to_pylist()], dtype=np.int64)
    dense = np.full((len(prompt_ids), N, T + 1, K, len(rewards)), np.nan)
    filled = np.zeros(dense.shape, dtype=np.int32)
    rows = np.array([index[i] for i in pid.tolist()], dtype=np.int64)
    dense[rows, n, t, k, r] = arrow.column("score").to_numpy()
    np.add.at(filled, (rows, n, t, k, r), 1)
    expected = np.zeros(dense.shape, dtype=np.int32)
    expected[:, :, 1:] = 1
    expected[:, :, 0, 0] = 1
    if np.any(filled > 1):
        raise BadInput(f"{where}: duplicate (prompt, sample, t, k, reward) rows")
    if np.any(filled != expected):
        raise BadInput(f"{where}: incomplete: some (prompt, sample, t, k, reward) rows are missing")
    if not np.isfinite(dense[expected == 1]).all():
        raise BadInput(f"{where}: column 'score' has NaN or inf")
    return ScoreTable(prompt_ids=prompt_ids, prompts=tuple(order[i] for i in prompt_ids), rewards=rewards,
                      scores=dense, meta={key: v for key, v in meta.items() if key not in _PROVENANCE_KEYS},
                      provenance=Provenance.from_metadata(meta, where))


# --------------------------------------------------------------------------- positives

POSITIVES_SCHEMA = "recast.positives/1"
MANIFEST_NAME = "manifest.parquet"

POSITIVE_COLUMNS: dict[str, pa.DataType] = {
    "prompt_id": pa.int32(),
    "prompt": pa.string(),
    "sample_id": pa.int32(),
    "image_path": pa.string(),
    "source": pa.string(),
    "seed": pa.int64(),
    "sha256": pa.string(),
}
#: Optional, nullable: null = the image is a positive for every reward (a surrogate generator);
#: a name = a positive of that reward's π⁺ only (``self`` sampling-importance-resampling).
POSITIVE_REWARD_COLUMN = ("reward", pa.string())
#: Optional, nullable: the std of the row's reward over the π^old draws its prompt's positives
#: were resampled from (``self`` with standardisation): the scale r̃ = r / s of its tilt (E2).
POSITIVE_SCALE_COLUMN = ("reward_std", pa.float64())


@dataclass(frozen=True)
class PositiveSample:
    """One π⁺ image: ``image_path`` is relative to the positives folder; ``seed`` may be -1 (none).

    ``reward`` is None when the image serves every reward, else the one reward whose π⁺_i (E2)
    it was resampled for; rows of different rewards may share one image file. ``reward_std``
    is the π^old scale of that reward's tilt when the source recorded one (``self``).
    """

    prompt_id: int
    prompt: str
    sample_id: int
    image_path: str
    source: str
    seed: int
    sha256: str
    reward: str | None = None
    reward_std: float | None = None


@dataclass(frozen=True)
class Positives:
    """A ``recast.positives/1`` folder: the manifest rows, run metadata and provenance."""

    root: Path
    samples: tuple[PositiveSample, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    def prompts(self) -> list[str]:
        """The prompts in prompt_id order."""
        return [p for _, p in sorted({(s.prompt_id, s.prompt) for s in self.samples})]

    def rewards(self) -> tuple[str, ...]:
        """The rewards with their own positives, in manifest order; () when every image serves every reward."""
        return tuple(dict.fromkeys(s.reward for s in self.samples if s.reward is not None))

    def for_prompt(self, prompt_id: int, reward: str | None = None) -> list[PositiveSample]:
        """The positives of one prompt, for ``reward`` when the folder holds one set per reward."""
        per_reward = self.rewards()
        if per_reward and reward is None:
            raise BadInput(f"{self.root}: positives are per reward ({', '.join(per_reward)}); name the reward")
        if per_reward and reward not in per_reward:
            raise BadInput(f"{self.root}: positives are per reward ({', '.join(per_reward)}); "
                           f"none for reward {reward!r}")
        return sorted((s for s in self.samples if s.prompt_id == prompt_id and s.reward in (None, reward)),
                      key=lambda s: s.sample_id)


def _positive_key(s: PositiveSample) -> tuple[str, int, int]:
    return (s.reward or "", s.prompt_id, s.sample_id)


def write_positives_manifest(root: str | os.PathLike[str], samples: Sequence[PositiveSample], *,
                             meta: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None,
                             sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Write ``root/manifest.parquet`` atomically; the images must already be in place.

    ``meta`` holds run facts (e.g. refusals per prompt, the generator and its settings), JSON.
    """
    root = Path(root)
    keys = [_positive_key(s) for s in samples]
    if len(set(keys)) != len(keys):
        raise BadInput(f"{root}: duplicate (reward, prompt_id, sample_id) in the manifest")
    if len({s.reward is None for s in samples}) > 1:
        raise BadInput(f"{root}: either every row names its reward or none does")
    provenance = Provenance.new(POSITIVES_SCHEMA, config, sources)
    fields = [*POSITIVE_COLUMNS.items(), POSITIVE_REWARD_COLUMN]
    if any(s.reward_std is not None for s in samples):
        fields.append(POSITIVE_SCALE_COLUMN)
    columns = {name: pa.array([getattr(s, name) for s in samples], type=dtype) for name, dtype in fields}
    table = pa.table(columns, schema=pa.schema(fields))
    metadata = {**dict(meta or {}), **provenance.to_metadata()}
    table = table.replace_schema_metadata({k: _json_dumps(v) for k, v in metadata.items()})
    _write_parquet(root / MANIFEST_NAME, table)
    return provenance


def read_positives(root: str | os.PathLike[str], verify: bool = True) -> Positives:
    """Read a ``recast.positives/1`` folder; with ``verify`` every image must exist and match its sha256."""
    root = Path(root)
    manifest = root / MANIFEST_NAME
    if not manifest.is_file():
        raise BadInput(f"{root}: not a positives folder (no {MANIFEST_NAME})")
    arrow, meta, where = _open_parquet(manifest, POSITIVES_SCHEMA)
    _require_keys(meta, _PROVENANCE_KEYS[1:], where)
    _require_columns(arrow, POSITIVE_COLUMNS, where, not_null=tuple(POSITIVE_COLUMNS))
    reward_name = POSITIVE_REWARD_COLUMN[0]
    rows = arrow.select(list(POSITIVE_COLUMNS)).to_pylist()
    if reward_name in arrow.column_names:
        column = arrow.column(reward_name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_null(column.type)):
            raise BadInput(f"{where}: column {reward_name!r} has type {column.type}, expected string")
        if 0 < column.null_count < len(column):
            raise BadInput(f"{where}: column {reward_name!r} must name a reward on every row or on none")
        for row, reward in zip(rows, column.to_pylist()):
            row[reward_name] = reward
    scale_name = POSITIVE_SCALE_COLUMN[0]
    if scale_name in arrow.column_names:
        column = arrow.column(scale_name)
        if not (pa.types.is_floating(column.type) or pa.types.is_null(column.type)):
            raise BadInput(f"{where}: column {scale_name!r} has type {column.type}, expected float64")
        for row, scale in zip(rows, column.to_pylist()):
            if scale is not None and not (math.isfinite(scale) and scale >= 0):
                raise BadInput(f"{where}: column {scale_name!r} holds {scale!r}; a std is finite and >= 0")
            row[scale_name] = scale
    samples = tuple(PositiveSample(**row) for row in rows)
    keys = [_positive_key(s) for s in samples]
    if len(set(keys)) != len(keys):
        raise BadInput(f"{where}: duplicate (reward, prompt_id, sample_id) rows")
    prompts: dict[int, str] = {}
    digests: dict[Path, str] = {}
    for s in samples:
        if prompts.setdefault(s.prompt_id, s.prompt) != s.prompt:
            raise BadInput(f"{where}: prompt_id {s.prompt_id} names two different prompts")
        path = (root / s.image_path).resolve()
        if root.resolve() not in path.parents:
            raise BadInput(f"{where}: image path {s.image_path!r} leaves the positives folder")
        if verify:
            if path not in digests:  # rows of several rewards may share one image: hash it once
                if not path.is_file():
                    raise BadInput(f"{where}: image {s.image_path} is missing")
                digests[path] = sha256_file(path)
            if digests[path] != s.sha256:
                raise BadInput(f"{where}: image {s.image_path} does not match its sha256")
    return Positives(root=root, samples=samples,
                     meta={k: v for k, v in meta.items() if k not in _PROVENANCE_KEYS},
                     provenance=Provenance.from_metadata(meta, where))


# --------------------------------------------------------------------------- evaluation

EVAL_SCHEMA = "recast.eval/1"
EVAL_KINDS = ("reward", "judge")
EVAL_MODES = ("base", *MODES)

EVAL_COLUMNS: dict[str, pa.DataType] = {
    "image_id": pa.int64(),
    "prompt_id": pa.int64(),
    "prompt": pa.string(),
    "seed": pa.int64(),
    "image_path": pa.string(),
    "scorer": pa.string(),
    "kind": pa.string(),
    "score": pa.float64(),
}

#: What an evaluation table must say about what was evaluated, besides its provenance.
EVAL_RUN_KEYS = ("setting", "mode", "run", "train_seed", "lambda", "rewards", "weights_key", "sigmas", "checkpoint",
                 "sampling", "prompts_source")


@dataclass(frozen=True)
class EvalImage:
    """One evaluated image: ``image_path`` is relative to the folder of the evaluation table."""

    image_id: int
    prompt_id: int
    prompt: str
    seed: int
    image_path: str


@dataclass(frozen=True)
class EvalTable:
    """Scores of every evaluated image under every scorer (METHOD.md §7).

    ``scores[j, s]`` is scorer ``scorers[s]`` (of kind ``kinds[s]``: a training ``reward`` or a
    held-out ``judge``) on image ``images[j]``. ``meta`` holds the keys of ``EVAL_RUN_KEYS``:
    what was evaluated (the base model or a run's checkpoint) and how it was sampled.
    """

    images: tuple[EvalImage, ...]
    scorers: tuple[str, ...]
    kinds: tuple[str, ...]
    scores: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    def column(self, scorer: str) -> np.ndarray:
        """The scores of one scorer, float64 [images]."""
        if scorer not in self.scorers:
            raise BadInput(f"evaluation has no scorer {scorer!r}; it has {', '.join(self.scorers)}")
        return self.scores[:, self.scorers.index(scorer)]

    def aggregate(self) -> np.ndarray:
        """``r = Σ_i λ_i·r_i`` per image over the training rewards, with the table's λ (METHOD.md §7)."""
        lam = np.asarray(self.meta["lambda"], dtype=np.float64)
        rewards = np.stack([self.column(r) for r in self.meta["rewards"]], axis=1) if len(lam) else \
            np.zeros((len(self.images), 0))
        return rewards @ lam

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        n, m = len(self.images), len(self.scorers)

        def per_image(name: str, dtype: pa.DataType) -> pa.Array:
            values = np.array([getattr(im, name) for im in self.images], dtype=object)
            return pa.array(np.repeat(values, m).tolist(), type=dtype)

        columns = {
            **{name: per_image(name, EVAL_COLUMNS[name]) for name in ("image_id", "prompt_id", "prompt", "seed",
                                                                       "image_path")},
            "scorer": pa.array(list(self.scorers) * n, type=pa.string()),
            "kind": pa.array(list(self.kinds) * n, type=pa.string()),
            "score": pa.array(np.asarray(self.scores, dtype=np.float64).reshape(n * m), type=pa.float64()),
        }
        metadata = {**self.meta, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(EVAL_COLUMNS.items())))
        return table.replace_schema_metadata({k: _json_dumps(v) for k, v in metadata.items()})


def validate_eval(table: EvalTable, where: str = "evaluation table") -> None:
    """Raise BadInput unless ``table`` is a complete, consistent ``recast.eval/1`` table."""
    n, m = len(table.images), len(table.scorers)
    if n == 0 or m == 0:
        raise BadInput(f"{where}: no images or no scorers")
    if len(set(table.scorers)) != m or len(table.kinds) != m:
        raise BadInput(f"{where}: scorers must be distinct, one kind each (got {list(table.scorers)})")
    bad_kind = [k for k in table.kinds if k not in EVAL_KINDS]
    if bad_kind:
        raise BadInput(f"{where}: kind {bad_kind[0]!r} is not one of {', '.join(EVAL_KINDS)}")
    if np.shape(table.scores) != (n, m):
        raise BadInput(f"{where}: scores have shape {np.shape(table.scores)}, expected {(n, m)}")
    _check_finite("score", np.asarray(table.scores, dtype=np.float64), where)
    ids = [im.image_id for im in table.images]
    if len(set(ids)) != n:
        raise BadInput(f"{where}: duplicate image_id")
    prompts: dict[int, str] = {}
    for im in table.images:
        if prompts.setdefault(im.prompt_id, im.prompt) != im.prompt:
            raise BadInput(f"{where}: prompt_id {im.prompt_id} names two different prompts")
        path = Path(im.image_path)
        if path.is_absolute() or ".." in path.parts:
            raise BadInput(f"{where}: image path {im.image_path!r} must be relative to the table's folder")
    _require_keys(table.meta, EVAL_RUN_KEYS, where)
    meta = table.meta
    if meta["mode"] not in EVAL_MODES:
        raise BadInput(f"{where}: metadata 'mode' must be one of {', '.join(EVAL_MODES)}, got {meta['mode']!r}")
    rewards = [s for s, k in zip(table.scorers, table.kinds) if k == "reward"]
    if list(meta["rewards"]) != rewards:
        raise BadInput(f"{where}: metadata 'rewards' {meta['rewards']} differ from the reward rows {rewards}")
    if len(meta["lambda"]) != len(rewards):
        raise BadInput(f"{where}: metadata 'lambda' has {len(meta['lambda'])} values for {len(rewards)} rewards")
    if (meta["mode"] == "base") != (meta["checkpoint"] is None):
        raise BadInput(f"{where}: a base evaluation has no checkpoint and a run's evaluation has one")


def write_eval(path: str | os.PathLike[str], table: EvalTable, *, config: Mapping[str, Any] | None = None,
               sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``table`` and write it atomically as a ``recast.eval/1`` Parquet file (image-major rows)."""
    validate_eval(table)
    provenance = Provenance.new(EVAL_SCHEMA, config, sources)
    _write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_eval(path: str | os.PathLike[str], check_images: bool = False) -> EvalTable:
    """Read and validate a ``recast.eval/1`` file; with ``check_images`` every image file must exist."""
    arrow, meta, where = _open_parquet(path, EVAL_SCHEMA)
    _require_keys(meta, (*EVAL_RUN_KEYS, *_PROVENANCE_KEYS[1:]), where)
    _require_columns(arrow, EVAL_COLUMNS, where, not_null=tuple(EVAL_COLUMNS))
    for name, dtype in EVAL_COLUMNS.items():
        have = arrow.schema.field(name).type
        check = {pa.int64(): pa.types.is_integer, pa.string(): lambda t: pa.types.is_string(t) or
                 pa.types.is_large_string(t)}.get(dtype, pa.types.is_floating)
        if not check(have):
            raise BadInput(f"{where}: column {name!r} has type {have}, expected {dtype}")
    rows = arrow.select(list(EVAL_COLUMNS)).to_pylist()
    images: dict[int, EvalImage] = {}
    scorers: dict[str, str] = {}
    cells: dict[tuple[int, str], float] = {}
    for row in rows:
        image = EvalImage(**{k: row[k] for k in ("image_id", "prompt_id", "prompt", "seed", "image_path")})
        if images.setdefault(image.image_id, image) != image:
            raise BadInput(f"{where}: image_id {image.image_id} has rows that disagree on its prompt, seed or path")
        if scorers.setdefault(row["scorer"], row["kind"]) != row["kind"]:
            raise BadInput(f"{where}: scorer {row['scorer']!r} has rows of two kinds")
        key = (image.image_id, row["scorer"])
        if key in cells:
            raise BadInput(f"{where}: duplicate row for (image_id {key[0]}, scorer {key[1]!r})")
        cells[key] = row["score"]
    ordered = sorted(images.values(), key=lambda im: im.image_id)
    names = tuple(scorers)
    if len(cells) != len(ordered) * len(names):
        raise BadInput(f"{where}: incomplete: not every image has a row for every scorer")
    scores = np.array([[cells[(im.image_id, s)] for s in names] for im in ordered], dtype=np.float64)
    table = EvalTable(images=tuple(ordered), scorers=names, kinds=tuple(scorers[s] for s in names), scores=scores,
                      meta={k: v for k, v in meta.items() if k not in _PROVENANCE_KEYS},
                      provenance=Provenance.from_metadata(meta, where))
    validate_eval(table, where)
    if check_images:
        root = Path(path).parent
        missing = [im.image_path for im in ordered if not (root / im.image_path).is_file()]
        if missing:
            raise BadInput(f"{where}: image {missing[0]} is missing ({len(missing)} of {len(ordered)})")
    return table


# --------------------------------------------------------------------------- evaluation curves

CURVE_SCHEMA = "recast.curve/1"
CURVE_SAMPLERS = ("sde", "ode")

CURVE_COLUMNS: dict[str, pa.DataType] = {
    "step": pa.int64(),
    "sampler": pa.string(),
    "scorer": pa.string(),
    "n": pa.int64(),
    "mean": pa.float64(),
    "std": pa.float64(),
}

#: What a curve table must say about what was evaluated, besides its provenance.
CURVE_RUN_KEYS = ("setting", "mode", "run", "train_seed", "lambda", "rewards", "weights_key", "checkpoints",
                  "sampling")


@dataclass(frozen=True)
class CurveTable:
    """Mean rewards of a policy at several training steps: ``recast evaluate`` in the 1-D world.

    Where samples are scalars (flow1d) an evaluation keeps the per-scorer mean and std over its
    n samples rather than one row per sample. ``points`` lists the (step, sampler) pairs
    evaluated, in order; ``mean``/``std`` are [points, scorers]; the scorers are the rewards in
    ``meta['rewards']`` order followed by ``aggregate`` (Σ_i λ_i·r_i per sample). Step 0 is the
    base policy (mode ``base``).
    """

    points: tuple[tuple[int, str], ...]
    scorers: tuple[str, ...]
    n: int
    mean: np.ndarray
    std: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None

    def value(self, step: int, sampler: str, scorer: str = "aggregate") -> float:
        return float(self.mean[self.points.index((step, sampler)), self.scorers.index(scorer)])

    def to_arrow(self, provenance: Provenance) -> pa.Table:
        m = len(self.scorers)
        columns = {
            "step": pa.array([s for s, _ in self.points for _ in range(m)], type=pa.int64()),
            "sampler": pa.array([k for _, k in self.points for _ in range(m)], type=pa.string()),
            "scorer": pa.array(list(self.scorers) * len(self.points), type=pa.string()),
            "n": pa.array([self.n] * (m * len(self.points)), type=pa.int64()),
            "mean": pa.array(np.asarray(self.mean, dtype=np.float64).reshape(-1), type=pa.float64()),
            "std": pa.array(np.asarray(self.std, dtype=np.float64).reshape(-1), type=pa.float64()),
        }
        metadata = {**self.meta, **provenance.to_metadata()}
        table = pa.table(columns, schema=pa.schema(list(CURVE_COLUMNS.items())))
        return table.replace_schema_metadata({k: _json_dumps(v) for k, v in metadata.items()})


def validate_curve(table: CurveTable, where: str = "curve table") -> None:
    """Raise BadInput unless ``table`` is a complete, consistent ``recast.curve/1`` table."""
    k, m = len(table.points), len(table.scorers)
    if k == 0 or m == 0:
        raise BadInput(f"{where}: no evaluated points or no scorers")
    if len(set(table.points)) != k:
        raise BadInput(f"{where}: a (step, sampler) pair is evaluated twice")
    for step, sampler in table.points:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0 or sampler not in CURVE_SAMPLERS:
            raise BadInput(f"{where}: point ({step!r}, {sampler!r}) needs a step >= 0 and a sampler of "
                           f"{', '.join(CURVE_SAMPLERS)}")
    if len(set(table.scorers)) != m or table.scorers[-1] != "aggregate":
        raise BadInput(f"{where}: scorers must be distinct and end with 'aggregate', got {list(table.scorers)}")
    if isinstance(table.n, bool) or not isinstance(table.n, int) or table.n < 1:
        raise BadInput(f"{where}: n must be a positive integer, got {table.n!r}")
    for name in ("mean", "std"):
        values = np.asarray(getattr(table, name), dtype=np.float64)
        if values.shape != (k, m):
            raise BadInput(f"{where}: {name} has shape {values.shape}, expected {(k, m)}")
        _check_finite(name, values, where)
    _require_keys(table.meta, CURVE_RUN_KEYS, where)
    meta = table.meta
    if meta["mode"] not in EVAL_MODES:
        raise BadInput(f"{where}: metadata 'mode' must be one of {', '.join(EVAL_MODES)}, got {meta['mode']!r}")
    if list(meta["rewards"]) != list(table.scorers[:-1]):
        raise BadInput(f"{where}: metadata 'rewards' {meta['rewards']} differ from the scorers {list(table.scorers[:-1])}")
    if len(meta["lambda"]) != m - 1:
        raise BadInput(f"{where}: metadata 'lambda' has {len(meta['lambda'])} values for {m - 1} rewards")
    if (meta["mode"] == "base") != all(step == 0 for step, _ in table.points):
        raise BadInput(f"{where}: a base evaluation holds step 0 only, a run's evaluation its checkpoints")


def write_curve(path: str | os.PathLike[str], table: CurveTable, *, config: Mapping[str, Any] | None = None,
                sources: Sequence[Source | str | os.PathLike[str]] = ()) -> Provenance:
    """Validate ``table`` and write it atomically as a ``recast.curve/1`` Parquet file."""
    validate_curve(table)
    provenance = Provenance.new(CURVE_SCHEMA, config, sources)
    _write_parquet(path, table.to_arrow(provenance))
    return provenance


def read_curve(path: str | os.PathLike[str]) -> CurveTable:
    """Read and validate a ``recast.curve/1`` file."""
    arrow, meta, where = _open_parquet(path, CURVE_SCHEMA)
    _require_keys(meta, (*CURVE_RUN_KEYS, *_PROVENANCE_KEYS[1:]), where)
    _require_columns(arrow, CURVE_COLUMNS, where, not_null=tuple(CURVE_COLUMNS))
    rows = arrow.select(list(CURVE_COLUMNS)).to_pylist()
    points = tuple(dict.fromkeys((int(r["step"]), r["sampler"]) for r in rows))
    scorers = tuple(dict.fromkeys(r["scorer"] for r in rows))
    ns = {int(r["n"]) for r in rows}
    if len(ns) != 1:
        raise BadInput(f"{where}: rows disagree on n ({sorted(ns)})")
    cells = {}
    for r in rows:
        key = ((int(r["step"]), r["sampler"]), r["scorer"])
        if key in cells:
            raise BadInput(f"{where}: duplicate row for step {key[0][0]}, sampler {key[0][1]!r}, scorer {key[1]!r}")
        cells[key] = (r["mean"], r["std"])
    if len(cells) != len(points) * len(scorers):
        raise BadInput(f"{where}: incomplete: not every (step, sampler) has a row for every scorer")
    mean = np.array([[cells[(p, s)][0] for s in scorers] for p in points], dtype=np.float64)
    std = np.array([[cells[(p, s)][1] for s in scorers] for p in points], dtype=np.float64)
    table = CurveTable(points=points, scorers=scorers, n=ns.pop(), mean=mean, std=std,
                       meta={k: v for k, v in meta.items() if k not in _PROVENANCE_KEYS},
                       provenance=Provenance.from_metadata(meta, where))
    validate_curve(table, where)
    return table
