"""recast.gains/1 and recast.weights/1: round trips, provenance, atomic writes, validation on read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recast_cli.artifacts import (
    GAINS_SCHEMA,
    WEIGHTS_SCHEMA,
    Source,
    WeightMatrix,
    atomic_output,
    read_gains,
    read_weights,
    sha256_file,
    write_gains,
    write_weights,
)
from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from tests.conftest import bump_gains, make_table


def test_gain_table_round_trip_keeps_values_metadata_and_provenance(tmp_path):
    gain = 0.02 * bump_gains([15, 3], [3, 1], 20)
    table = make_table(gain, ("clip", "ocr"), grid=GridSpec("flowmatch", shift=3.0), with_intervals=True)
    upstream = tmp_path / "scores.bin"
    upstream.write_bytes(b"upstream artifact")
    path = tmp_path / "g.parquet"
    written = write_gains(path, table, config={"alpha": 2, "note": "x"}, sources=[upstream])
    back = read_gains(path)
    assert back.rewards == ("clip", "ocr")
    np.testing.assert_array_equal(back.sigmas, table.sigmas)
    for name in ("D", "gain", "gain_raw", "D_lo", "D_hi", "gain_lo", "gain_hi"):
        np.testing.assert_array_equal(getattr(back, name), getattr(table, name))
    assert back.meta == table.meta
    assert back.provenance == written
    assert back.provenance.schema == GAINS_SCHEMA
    assert back.provenance.sources == (Source(str(upstream), sha256_file(upstream)),)
    assert back.provenance.config == {"alpha": 2, "note": "x"}


def test_gain_table_is_plain_parquet_with_the_documented_columns(tmp_path):
    path = tmp_path / "g.parquet"
    write_gains(path, make_table(0.01 * bump_gains([4], [1], 6)))
    arrow = pq.read_table(path)
    assert arrow.schema.field("t").type == pa.int32()
    assert arrow.schema.field("reward").type == pa.string()
    assert arrow.num_rows == 7
    rows = arrow.to_pylist()
    assert rows[0]["t"] == 0 and rows[0]["gain"] is None and rows[0]["gain_raw"] is None
    assert rows[0]["D_lo"] is None  # no bootstrap in this table
    meta = {k.decode(): json.loads(v) for k, v in arrow.schema.metadata.items()}
    assert meta["schema"] == GAINS_SCHEMA and meta["T"] == 6 and meta["sampling"] == "pplus"
    assert {"recast_version", "created_at", "config", "sources", "reward_std", "policy", "positives"} <= meta.keys()


def test_gain_table_reads_with_pandas_and_duckdb(tmp_path):
    pd = pytest.importorskip("pandas")
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "g.parquet"
    gain = 0.01 * bump_gains([4, 2], [1, 1], 6)
    write_gains(path, make_table(gain, ("a", "b")))
    df = pd.read_parquet(path)
    assert df.groupby("reward", sort=False)["gain"].sum().round(12).tolist() == gain.sum(axis=1).round(12).tolist()
    peak = duckdb.sql(f"SELECT reward, arg_max(t, gain) AS peak FROM '{path}' GROUP BY reward ORDER BY reward").fetchall()
    assert peak == [("a", 4), ("b", 2)]


def _weights(m: int = 2, steps: int = 5) -> WeightMatrix:
    W = np.full((m, steps), 1.0 / (m * steps))
    return WeightMatrix(W=W, gain=np.ones((m, steps)), rewards=tuple(f"r{i}" for i in range(m)),
                        lam=(1.0,) * m, mode="static", tau=1.0,
                        sigmas=GridSpec("linear").sigmas(steps)[::-1].copy(), info={"iterations": 0})


def test_weight_matrix_round_trip_keeps_tensor_metadata_and_provenance(tmp_path):
    src = tmp_path / "g.parquet"
    write_gains(src, make_table(0.01 * bump_gains([4, 2], [1, 1], 5)))
    path = tmp_path / "W.safetensors"
    written = write_weights(path, _weights(), config={"mode": "static"}, sources=[src])
    back = read_weights(path)
    np.testing.assert_array_equal(back.W, _weights().W)
    assert back.W.dtype == np.float64 and back.W.shape == (2, 5)
    assert back.rewards == ("r0", "r1") and back.lam == (1.0, 1.0) and back.mode == "static"
    np.testing.assert_array_equal(back.sigmas, _weights().sigmas)
    assert back.provenance == written and back.provenance.schema == WEIGHTS_SCHEMA
    assert back.provenance.sources[0].sha256 == sha256_file(src)
    assert back.info == {"iterations": 0}


def test_weight_file_loads_with_plain_safetensors(tmp_path):
    from safetensors import safe_open

    path = tmp_path / "W.safetensors"
    write_weights(path, _weights(3, 4))
    with safe_open(str(path), framework="numpy") as fh:
        meta = fh.metadata()
        assert fh.get_tensor("W").shape == (3, 4)
    assert meta["schema"] == WEIGHTS_SCHEMA and json.loads(meta["rewards"]) == ["r0", "r1", "r2"]
    assert json.loads(meta["sigmas"])[0] == 1.0 and json.loads(meta["sigmas"])[-1] == 0.0


def test_weights_record_their_kernel_and_a_file_without_one_reads_as_exp(tmp_path):
    from dataclasses import replace

    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "W.safetensors"
    write_weights(path, replace(_weights(), kernel="power"))
    assert read_weights(path).kernel == "power"
    tensors = load_file(str(path))
    with safe_open(str(path), framework="numpy") as fh:
        meta = fh.metadata()
    assert json.loads(meta["kernel"]) == "power"  # JSON like tau: a recast that predates the key still reads the file
    older = {k: v for k, v in meta.items() if k != "kernel"}  # written before W recorded its kernel
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata=older)
    assert read_weights(tmp_path / "old.safetensors").kernel == "exp"
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata={**meta, "kernel": json.dumps("cosine")})
    with pytest.raises(BadInput) as err:
        read_weights(tmp_path / "bad.safetensors")
    assert str(err.value) == f"{tmp_path / 'bad.safetensors'}: 'kernel' must be one of exp, power, got 'cosine'"


def test_atomic_output_leaves_nothing_when_the_writer_fails(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"previous good artifact")
    with pytest.raises(RuntimeError):
        with atomic_output(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("crash mid-write")
    assert path.read_bytes() == b"previous good artifact"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_write_rejects_an_invalid_table_before_touching_disk(tmp_path):
    table = make_table(0.01 * bump_gains([3], [1], 5))
    table.gain[0, 2] = np.nan
    with pytest.raises(BadInput, match="NaN"):
        write_gains(tmp_path / "g.parquet", table)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ malformed gain tables


def _write_raw(path: Path, table: pa.Table, meta: dict | None) -> Path:
    if meta is not None:
        table = table.replace_schema_metadata({k: json.dumps(v) for k, v in meta.items()})
    pq.write_table(table, path)
    return path


def _valid_arrow(tmp_path: Path) -> tuple[pa.Table, dict]:
    path = tmp_path / "valid.parquet"
    write_gains(path, make_table(0.01 * bump_gains([4, 2], [1, 1], 5), ("a", "b")))
    arrow = pq.read_table(path)
    meta = {k.decode(): json.loads(v) for k, v in arrow.schema.metadata.items()}
    return arrow.replace_schema_metadata(None), meta


def _set(arrow: pa.Table, column: str, index: int, value) -> pa.Table:
    values = arrow.column(column).to_pylist()
    values[index] = value
    return arrow.set_column(arrow.column_names.index(column), column, pa.array(values, arrow.schema.field(column).type))


BAD_TABLES = {
    "nan in D": (lambda a, m: (_set(a, "D", 3, float("nan")), m), "NaN or inf"),
    "inf in gain": (lambda a, m: (_set(a, "gain", 2, float("inf")), m), "NaN or inf"),
    "missing column": (lambda a, m: (a.drop_columns(["gain_raw"]), m), "missing column.*gain_raw"),
    "missing schema": (lambda a, m: (a, {k: v for k, v in m.items() if k != "schema"}), "no 'schema' tag"),
    "wrong schema": (lambda a, m: (a, {**m, "schema": "recast.gains/0"}), "schema tag is 'recast.gains/0'"),
    "t gap": (lambda a, m: (_set(a, "t", 2, 9), m), "not contiguous"),
    "duplicate row": (lambda a, m: (_set(a, "t", 2, 1), m), "duplicate row"),
    "sigma order": (lambda a, m: (_set(_set(a, "sigma", 2, 0.1), "sigma", 8, 0.1), m), "sigma must increase strictly"),
    "sigma differs": (lambda a, m: (_set(a, "sigma", 8, 0.15), m), "sigma differs between rewards"),
    "negative gain": (lambda a, m: (_set(a, "gain", 2, -0.5), m), "non-negative"),
    "gain at t=0": (lambda a, m: (_set(a, "gain", 0, 0.1), m), "null at t = 0"),
    "wrong T": (lambda a, m: (a, {**m, "T": 9}), "metadata T = 9"),
    "missing run key": (lambda a, m: (a, {k: v for k, v in m.items() if k != "alpha"}), "missing 'alpha'"),
    "bad sampling": (lambda a, m: (a, {**m, "sampling": "magic"}), "'sampling' must be one of"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_reading_a_malformed_gain_table_names_the_problem(tmp_path, case):
    mutate, message = BAD_TABLES[case]
    arrow, meta = _valid_arrow(tmp_path)
    arrow, meta = mutate(arrow, meta)
    path = _write_raw(tmp_path / "bad.parquet", arrow, meta)
    with pytest.raises(BadInput, match=message):
        read_gains(path)


def test_reading_a_file_that_is_not_parquet_or_truncated(tmp_path, example_path):
    text = tmp_path / "text.parquet"
    text.write_text("reward,t\nclip,0\n")
    with pytest.raises(BadInput, match="not a readable Parquet file"):
        read_gains(text)
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(example_path.read_bytes()[:-100])
    with pytest.raises(BadInput, match="not a readable Parquet file"):
        read_gains(truncated)
    with pytest.raises(BadInput, match="no such file"):
        read_gains(tmp_path / "absent.parquet")


def test_reading_a_truncated_or_foreign_safetensors_file(tmp_path):
    path = tmp_path / "W.safetensors"
    write_weights(path, _weights())
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(BadInput, match="not a readable safetensors file"):
        read_weights(truncated)
    from safetensors.numpy import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"W": np.zeros((2, 3))}, str(foreign), metadata={"schema": "other/1"})
    with pytest.raises(BadInput, match="schema tag is 'other/1'"):
        read_weights(foreign)


def test_atomic_output_gives_the_usual_file_permissions(tmp_path):
    import os

    umask = os.umask(0)
    os.umask(umask)
    path = tmp_path / "out.bin"
    with atomic_output(path) as tmp:
        tmp.write_bytes(b"x")
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
