"""The shipped example is the exact gain table of the analytic gmm1d world (METHOD.md §4)."""

from __future__ import annotations

import numpy as np

from recast_cli.artifacts import read_gains
from recast_cli.policy.gmm1d import exact_gain_table
from recast_cli.policy.world1d import DEFAULT_WORLD


def test_shipped_example_has_the_documented_exact_answers(example_path):
    table = read_gains(example_path)
    assert table.rewards == ("coarse", "mid", "fine")
    assert table.T == 25 and table.meta["sampling"] == "exact" and table.meta["grid"] == {"kind": "linear"}
    np.testing.assert_allclose(table.D[:, 0], 0.45744109, atol=5e-9)  # all share D_0, differ in timing
    assert table.peak_step().tolist() == [18, 7, 2]
    np.testing.assert_allclose(table.total_gain(), table.D[:, 0] - table.D[:, -1], rtol=1e-12)


def test_shipped_example_is_reproduced_by_the_exact_computation(example_path):
    table = read_gains(example_path)
    fresh = exact_gain_table(steps=25, alpha=2.0)
    np.testing.assert_allclose(fresh.D, table.D, rtol=0, atol=1e-14)


def test_data_level_divergence_in_closed_form():
    # At σ = 0, h = exp(r/β) and P(r = 1) = 1/2: D_2 = log(E[h²]/Z²) exactly.
    z = 1 + 0.5 * np.expm1(2.0)
    closed = np.log(0.5 * (np.exp(4.0) + 1) / z**2)
    for reward in ("coarse", "mid", "fine"):
        assert abs(DEFAULT_WORLD.exact_discriminability(reward, 0.0, alpha=2.0) - closed) < 1e-6
    # At pure noise x_1 = ε carries no information about x_0.
    assert abs(DEFAULT_WORLD.exact_discriminability("coarse", 1.0, alpha=2.0)) < 1e-9
