"""``flow1d``: the analytic gmm1d world made trainable — exact velocity plus a learned residual.

    v_θ(x, σ) = v*(x, σ) + MLP_θ(x, σ)

v* is the exact rectified-flow velocity of the world's π^old (by default ¼ Σ_j N(μ_j, 0.25²) of
:mod:`gmm1d`; a setting's ``[world]`` defines another, :mod:`world1d`), and
MLP_θ a small network on Fourier features of x and σ whose last layer starts at zero. So at
step 0 the policy *is* the exact π^old, and the reference of the KL term (the residual
switched off, or its zero-initialised copy) is exact too: whatever training moves, it moves
away from a distribution whose gain curves are known in closed form (``recast estimate
--exact``). Samples are scalars x_0; the world's rewards (``coarse``, ``mid``, ``fine``, ...) score them.

It is a :class:`~recast_cli.policy.base.FlowPolicy` like SD3: the shared SDE step (E1), the
mixed-t rollouts and trajectory sampling run unchanged, the network the trainer updates is
``network`` and the module the sampler calls is ``denoiser`` (the same object until the
trainer wraps it for DDP or ``torch.compile``). Rollouts run the policy's own SDE sampler,
not the exact posterior: once θ moves, the exact posterior is no longer the policy's.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from recast_cli.errors import BadInput
from recast_cli.policy.gmm1d import GMM1DConditioning, GMM1DPolicy
from recast_cli.policy.world1d import DEFAULT_WORLD, World1D

#: The scale of x in the Fourier features: the world lives in about [−3.5, 3.5].
X_SCALE = 4.0
#: The network computes in float32 (3-4x faster than float64 on a CPU core); its output is
#: added to the float64 exact velocity, and every SDE step and log-probability stays float64.
DTYPE = torch.float32


class ResidualMLP(nn.Module):
    """MLP_θ(x, σ) [B, 1]: sin/cos features of x (frequencies 2^k·π/X_SCALE) and σ (2^k·π/2),
    k = 0 … ``features`` − 1, plus x and σ themselves, through two SiLU layers of ``hidden``
    units to one output, in float32 (``DTYPE``). The output layer is zero at initialisation
    (MLP_θ ≡ 0). Geometric frequencies: with 6 the finest x-period is X_SCALE/16 = 0.25,
    finer than the 0.4 period of the ``fine`` reward's odd/even cells, so the residual can
    resolve every reward of the world."""

    def __init__(self, features: int = 6, hidden: int = 32, seed: int = 0):
        super().__init__()
        if features < 1 or hidden < 1:
            raise BadInput(f"flow1d needs features >= 1 and hidden >= 1, got {features}, {hidden}")
        self.features = features
        generator = torch.Generator().manual_seed(seed)
        self.register_buffer("freq", 2.0 ** torch.arange(features, dtype=DTYPE) * math.pi, persistent=False)
        inputs = 4 * features + 2
        self.inner = nn.Linear(inputs, hidden, dtype=DTYPE)
        self.middle = nn.Linear(hidden, hidden, dtype=DTYPE)
        self.out = nn.Linear(hidden, 1, dtype=DTYPE)
        with torch.no_grad():
            for layer in (self.inner, self.middle):
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
            self.out.weight.zero_()
            self.out.bias.zero_()

    def forward(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1).to(DTYPE)
        s = sigma.reshape(-1, 1).to(DTYPE)
        fx = x * self.freq / X_SCALE
        fs = s * self.freq / 2
        h = torch.cat([x / X_SCALE, s, torch.sin(fx), torch.cos(fx), torch.sin(fs), torch.cos(fs)], dim=1)
        h = nn.functional.silu(self.inner(h))
        h = nn.functional.silu(self.middle(h))
        return self.out(h)


class Flow1DPolicy(GMM1DPolicy):
    """The gmm1d world with a trainable residual velocity (see the module docstring).

    ``latent_shape == (1,)``, float64 on the CPU, the linear grid σ_t = t/T; ``decode`` and
    ``encode`` are the identity on x_0 as in gmm1d. ``world`` is the mixture whose exact velocity
    v* is and the rewards (default: gmm1d's).
    """

    def __init__(self, steps: int = 25, features: int = 6, hidden: int = 32, seed: int = 0,
                 world: World1D = DEFAULT_WORLD):
        super().__init__(steps=steps, exact_rollouts=False, world=world)
        self.network = ResidualMLP(features, hidden, seed)
        self.denoiser: nn.Module = self.network

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: GMM1DConditioning) -> torch.Tensor:
        """v*(x, σ) + MLP_θ(x, σ): the exact part carries no gradient, the residual does."""
        with torch.no_grad():
            exact = super().velocity(x, sigma, cond)
        return exact + self.denoiser(x, sigma.to(x.device)).to(exact.dtype)

    def exact_velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: GMM1DConditioning) -> torch.Tensor:
        """v* alone: the reference policy π^old of step 0."""
        return super().velocity(x, sigma, cond)


def load_network(policy: Flow1DPolicy, checkpoint: str | Path) -> Path:
    """Load a flow1d run's checkpoint (a checkpoint folder, or the weights file) into ``policy.network``.

    Returns the weights file; BadInput when the folder holds no flow1d network or one of
    another shape.
    """
    from safetensors.torch import load_file

    from recast_cli.artifacts.run import FULL_FILE

    path = Path(checkpoint)
    if path.is_dir():
        path = path / "adapter" / FULL_FILE
    if not path.is_file():
        raise BadInput(f"checkpoint {checkpoint} has no {FULL_FILE} (not a flow1d run?)")
    try:
        policy.network.load_state_dict(load_file(str(path)))
    except (RuntimeError, OSError) as exc:
        raise BadInput(f"{path} does not fit the setting's flow1d network ({str(exc).splitlines()[0]})") from None
    return path
