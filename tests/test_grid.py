"""σ grids: the paper's order, and the flowmatch family equal to diffusers' scheduler."""

from __future__ import annotations

import numpy as np
import pytest

from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec

# FlowMatchEulerDiscreteScheduler(shift=3.0).set_timesteps(10).sigmas, printed by diffusers 0.42.1.
DIFFUSERS_SHIFT3_T10 = [1.0, 0.9601293206214905, 0.9133489727973938, 0.857692301273346, 0.7903682589530945,
                        0.7072784900665283, 0.602150559425354, 0.4648760259151459, 0.2780487835407257,
                        0.008928571827709675, 0.0]


def test_flowmatch_grid_matches_the_recorded_diffusers_schedule():
    np.testing.assert_array_equal(GridSpec("flowmatch", shift=3.0).sigmas(10), DIFFUSERS_SHIFT3_T10[::-1])


@pytest.mark.parametrize("steps,shift", [(25, 3.0), (40, 3.0), (10, 1.0)])
def test_flowmatch_grid_matches_a_live_diffusers_scheduler(steps, shift):
    diffusers = pytest.importorskip("diffusers")
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    expected = scheduler.sigmas.numpy().astype(np.float64)[::-1]
    np.testing.assert_array_equal(GridSpec("flowmatch", shift=shift).sigmas(steps), expected)


def test_linear_grid_runs_from_clean_to_noise():
    np.testing.assert_allclose(GridSpec("linear").sigmas(4), [0, 0.25, 0.5, 0.75, 1.0])


def test_grid_spec_json_round_trip_and_rejection():
    spec = GridSpec("flowmatch", shift=3.0)
    assert GridSpec.from_json(spec.to_json()) == spec
    with pytest.raises(BadInput, match="kind one of"):
        GridSpec.from_json({"kind": "karras"})
    with pytest.raises(BadInput, match="at least 1 step"):
        GridSpec("linear").sigmas(0)
