"""E11p, the power kernel K = ΔD̄^(1/τ) (METHOD.md §5): a `solve-w --kernel` option beside E11."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import read_weights, write_gains
from recast_cli.artifacts.weights import KERNELS
from recast_cli.cli import app
from recast_cli.solve.sinkhorn import POWER_FLOOR, lambda_hat, log_affinity, sinkhorn_log, solve_weights
from tests.conftest import bump_gains, make_table

runner = CliRunner()


def test_power_kernel_is_the_log_of_the_normalised_gain_over_tau():
    nbar = np.array([[0.5, 1.0, 1.5, 1.0], [2.0, 1.0, 0.5, 0.5]])
    np.testing.assert_allclose(log_affinity(nbar, 2.0, "power"), np.log(nbar) / 2.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(log_affinity(nbar, 2.0, "exp"), nbar / 2.0, rtol=0, atol=0)
    with pytest.raises(ValueError, match="--kernel must be one of exp, power"):
        log_affinity(nbar, 1.0, "cosine")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("lam", [[1.0, 1.0], [1.0, 3.0]])
def test_proportional_gain_rows_give_exactly_the_static_w(kernel, lam):
    row = 0.05 * bump_gains([14], [3], 20)[0]
    gain = np.stack([row, 7.0 * row])  # the same profile: ΔD̄ identical, K rank one
    W = solve_weights(gain, np.array(lam), mode="recast", kernel=kernel).W
    static = lambda_hat(np.array(lam))[:, None] / 20 * np.ones((2, 20))
    np.testing.assert_allclose(W, static, rtol=0, atol=1e-12)


def test_power_w_ignores_a_constant_factor_on_a_row_and_exp_w_does_not():
    gain = 0.05 * bump_gains([16, 5], [3, 2], 20)
    nbar = gain / gain.mean(axis=1, keepdims=True)
    row, col = np.array([0.5, 0.5]), np.full(20, 1 / 20)
    scaled = nbar * np.array([[1.0], [3.0]])
    power = [sinkhorn_log(log_affinity(x, 1.0, "power"), row, col).W for x in (nbar, scaled)]
    exp = [sinkhorn_log(log_affinity(x, 1.0, "exp"), row, col).W for x in (nbar, scaled)]
    np.testing.assert_allclose(power[0], power[1], rtol=0, atol=1e-12)
    assert np.abs(exp[0] - exp[1]).max() > 1e-3


def test_the_floor_keeps_the_power_kernel_positive_where_a_gain_is_zero():
    nbar = np.array([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
    log_k = log_affinity(nbar, 1.0, "power")
    assert np.isfinite(log_k).all()
    np.testing.assert_allclose(log_k[0, :2], np.log(POWER_FLOOR * 2.0))
    W = sinkhorn_log(log_k, np.array([0.5, 0.5]), np.full(4, 0.25)).W
    assert (W > 0).all()


@pytest.fixture
def gains_file(tmp_path):
    path = tmp_path / "gains.parquet"
    write_gains(path, make_table(0.05 * bump_gains([20, 12, 5], [4, 3, 2], 25), ("a", "b", "c")), config={"test": True})
    return path


def solve(gains_file, out, *extra):
    return runner.invoke(app, ["solve-w", "--gains", str(gains_file), "--lambda", "1,2,1", "--out", str(out), *extra])


def test_solve_w_kernel_power_writes_a_balanced_w_and_records_the_kernel(gains_file, tmp_path):
    result = solve(gains_file, tmp_path / "Wp.safetensors", "--kernel", "power")
    assert result.exit_code == 0, result.stderr
    assert "power kernel" in result.stdout
    w = read_weights(tmp_path / "Wp.safetensors")
    assert w.kernel == w.info["kernel"] == w.provenance.config["kernel"] == "power"
    np.testing.assert_allclose(w.W.sum(axis=1), [0.25, 0.5, 0.25], atol=1e-10)
    np.testing.assert_allclose(w.W.sum(axis=0), 1 / 25, atol=1e-10)
    assert solve(gains_file, tmp_path / "We.safetensors").exit_code == 0
    default = read_weights(tmp_path / "We.safetensors")
    assert default.kernel == default.info["kernel"] == "exp"
    assert np.abs(default.W - w.W).max() > 1e-4  # the two kernels do give different W here


@pytest.mark.parametrize("mode", ["nosink", "reversed"])
def test_every_kernel_mode_takes_the_power_kernel(gains_file, tmp_path, mode):
    out = tmp_path / f"{mode}.safetensors"
    assert solve(gains_file, out, "--kernel", "power", "--mode", mode).exit_code == 0
    assert read_weights(out).kernel == read_weights(out).info["kernel"] == "power"


def test_an_unknown_kernel_is_one_line_and_exit_2(gains_file, tmp_path):
    result = solve(gains_file, tmp_path / "W.safetensors", "--kernel", "cosine")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == ["recast: error: --kernel must be one of exp, power, got 'cosine'"]
    assert not (tmp_path / "W.safetensors").exists()
