"""A kernel is one row of the kernel table (recast_cli/kernels.py): a dummy kernel added there alone is
solved with by ``solve-w --kernel``, recorded in W and read back, named in a degenerate solve's line, and
taken by a study's arms (issue 52: tables instead of branches on a name)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recast_cli.artifacts import read_weights, write_gains
from recast_cli.kernels import KERNELS, Kernel
from recast_cli.study.spec import ArmSpec
from tests.cli_helpers import invoke, one_line, run_ok
from tests.conftest import bump_gains, make_table


def _linear(nbar: np.ndarray, tau: float) -> np.ndarray:
    """A dummy kernel: log K = log(1 + ΔD̄)/τ."""
    return np.log1p(nbar) / tau


@pytest.fixture
def linear_kernel(monkeypatch):
    monkeypatch.setitem(KERNELS, "linear", Kernel("linear", "E11x", "(1 + ΔD̄)^(1/τ)", "a test's", _linear))


@pytest.fixture
def gains(tmp_path):
    path = tmp_path / "gains.parquet"
    write_gains(path, make_table(0.05 * bump_gains([20, 12, 5], [4, 3, 2], 25), ("a", "b", "c")), config={"t": 1})
    return path


def test_a_kernel_added_to_the_table_alone_solves_records_and_reads_back(linear_kernel, gains, tmp_path):
    out = tmp_path / "W.safetensors"
    run_ok("solve-w", "--gains", gains, "--lambda", "1,2,1", "--kernel", "linear", "--out", out)
    W = read_weights(out)
    assert W.kernel == W.info["kernel"] == "linear"
    np.testing.assert_allclose(W.W.sum(axis=1), [0.25, 0.5, 0.25], atol=1e-9)  # rows: λ̂
    np.testing.assert_allclose(W.W.sum(axis=0), np.full(25, 1 / 25), atol=1e-9)  # columns: equal
    exp = tmp_path / "W-exp.safetensors"
    run_ok("solve-w", "--gains", gains, "--lambda", "1,2,1", "--out", exp)
    assert not np.allclose(read_weights(exp).W, W.W)  # it is the kernel's own W, not the default's
    assert json.loads(run_ok("inspect", out, "--json").stdout)["kernel"] == "linear"


def test_a_degenerate_solve_names_the_kernels_own_formula(linear_kernel, gains, tmp_path, monkeypatch):
    monkeypatch.setitem(KERNELS, "linear", Kernel("linear", "E11x", "(1 + ΔD̄)^(1/τ)", "a test's",
                                                  lambda nbar, tau: np.full_like(nbar, np.inf)))
    one_line(invoke("solve-w", "--gains", gains, "--lambda", "1,2,1", "--kernel", "linear", "--out",
                    tmp_path / "W.safetensors"), "the kernel (1 + ΔD̄)^(1/τ) is degenerate")


def test_a_study_arm_takes_a_kernel_of_the_table(linear_kernel):
    assert ArmSpec.parse("recast:linear:estimate").kernel == "linear"
    del KERNELS["linear"]
    with pytest.raises(ValueError, match="the kernel must be one of exp, power"):
        ArmSpec.parse("recast:linear")
