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


# (scheduler config, μ): FLUX.1-dev's dynamic shift, Qwen-Image's (with its terminal stretch), a fixed shift
# (FLUX.1-schnell's scheduler), and the linear time shift.
DYNAMIC = [({"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15}, 0.63),
           ({"shift": 1.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 0.9, "shift_terminal": 0.02,
             "time_shift_type": "exponential"}, 0.61),
           ({"shift": 1.0, "use_dynamic_shifting": False}, None),
           ({"shift": 1.0, "use_dynamic_shifting": True, "time_shift_type": "linear"}, 1.3)]


@pytest.mark.parametrize("steps", [2, 6, 10, 28, 50])
@pytest.mark.parametrize("config,mu", DYNAMIC)
def test_dynamic_grid_matches_what_the_flux_and_qwen_pipelines_ask_the_scheduler_for(config, mu, steps):
    diffusers = pytest.importorskip("diffusers")
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(**config)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    expected = scheduler.sigmas.numpy().astype(np.float64)[::-1]
    spec = GridSpec("dynamic", shift=config["shift"], mu=mu, time_shift=config.get("time_shift_type", "exponential"),
                    shift_terminal=config.get("shift_terminal"))
    np.testing.assert_array_equal(spec.sigmas(steps), expected)
    assert GridSpec.from_json(spec.to_json()) == spec
    if config.get("shift_terminal"):
        assert spec.sigmas(steps)[1] == pytest.approx(0.02, abs=1e-7)


def test_dynamic_grid_refusals():
    with pytest.raises(BadInput, match="at least 2 steps"):
        GridSpec("dynamic", mu=0.6, shift_terminal=0.02).sigmas(1)
    with pytest.raises(BadInput, match="dynamic grid needs"):
        GridSpec.from_json({"kind": "dynamic", "mu": 0.6, "time_shift": "cubic"})
    with pytest.raises(BadInput, match="not a number"):
        GridSpec.from_json({"kind": "dynamic", "mu": "high"})
    assert GridSpec("dynamic", mu=0.63).flags() == " --grid dynamic --mu 0.63"
