"""`recast compare-gains`: per-reward agreement of two gain curves (the paper's Table 5)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recast_cli.artifacts import write_gains
from recast_cli.estimate.compare import compare_gains, correlation, rank_correlation
from recast_cli.grid import GridSpec
from tests.conftest import bump_gains, make_table
from tests.positives.common import assert_one_line_exit_2, recast


def write(path, gain, rewards, grid=GridSpec("linear")):
    write_gains(path, make_table(gain, rewards, grid=grid), config={"test": True})
    return path


@pytest.fixture
def pair(tmp_path):
    a = 0.05 * bump_gains([20, 12, 5], [4, 3, 2], 25)
    b = a.copy()
    b[0] *= 2.0  # same shape, twice the total
    b[1] = 0.05 * bump_gains([6], [3], 25)[0]  # the window moved
    b[2] = a[2, ::-1]  # reversed
    return (write(tmp_path / "a.parquet", a, ("clip", "hps", "ocr")),
            write(tmp_path / "b.parquet", np.vstack([b, a[:1]]), ("clip", "hps", "ocr", "pick")), a, b)


def test_compare_reports_correlations_peaks_and_ratio(pair):
    a_path, b_path, a, b = pair
    result = compare_gains(a_path, b_path)
    rows = {r["reward"]: r for r in result["rewards"]}
    assert list(rows) == ["clip", "hps", "ocr"] and result["only_in_b"] == ["pick"] and result["T"] == 25
    assert rows["clip"]["pearson"] == pytest.approx(1.0) and rows["clip"]["spearman"] == pytest.approx(1.0)
    assert rows["clip"]["ratio"] == pytest.approx(2.0) and rows["clip"]["peak_t_a"] == rows["clip"]["peak_t_b"] == 20
    assert (rows["hps"]["peak_t_a"], rows["hps"]["peak_t_b"]) == (12, 6) and rows["hps"]["pearson"] < 0.5
    assert rows["ocr"]["pearson"] == pytest.approx(np.corrcoef(a[2], b[2])[0, 1])


def test_spearman_is_pearson_of_ranks_and_constant_curves_have_none():
    x, y = np.array([1.0, 2.0, 3.0, 10.0]), np.array([1.0, 4.0, 9.0, 16.0])
    assert rank_correlation(x, y) == pytest.approx(1.0) and correlation(x, y) < 1.0
    assert correlation(np.ones(4), y) is None


def test_compare_gains_cli_table_and_json(pair):
    a_path, b_path, _, _ = pair
    result = recast("compare-gains", a_path, b_path)
    assert result.exit_code == 0, result.stderr
    assert "Spearman" in result.stdout and "only in B: pick" in result.stdout
    as_json = recast("compare-gains", a_path, b_path, "--json")
    assert json.loads(as_json.stdout)["rewards"][0]["ratio"] == pytest.approx(2.0)


def test_tables_on_different_grids_or_without_common_rewards_are_bad_input(tmp_path, pair):
    a_path = pair[0]
    other = write(tmp_path / "t10.parquet", 0.05 * bump_gains([5], [2], 10), ("clip",))
    assert_one_line_exit_2(recast("compare-gains", a_path, other), "different σ grids")
    disjoint = write(tmp_path / "d.parquet", 0.05 * bump_gains([5], [2], 25), ("aesthetic",))
    assert_one_line_exit_2(recast("compare-gains", a_path, disjoint), "share no reward")
    assert_one_line_exit_2(recast("compare-gains", a_path, tmp_path / "nope.parquet"), "no such file")
