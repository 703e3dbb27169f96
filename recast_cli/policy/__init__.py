"""Flow-matching policies behind one protocol (ARCHITECTURE.md, "The policy protocol")."""

from recast_cli.policy.base import Conditioning, FlowPolicy, StepOutput, Trajectory, step_noise
from recast_cli.policy.sde import sde_step

__all__ = ["Conditioning", "FlowPolicy", "StepOutput", "Trajectory", "sde_step", "step_noise"]
