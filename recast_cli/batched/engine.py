"""S training runs of one flow1d cell as one batched computation (issue 33 §1).

A cell is one (world, arm, budget, group size): the same setting, W and training recipe, S
training seeds. ``recast train`` runs one seed at a time; here the S residual MLPs of
:mod:`recast_cli.policy.flow1d` are stacked along a leading seed axis and every step is one
batched computation over all of them:

* **sampling**: every seed draws exactly the noise its single run draws (``seeds.train_seeds``
  of its own seed, then the counter-based ``hashed_normal`` per step), through the shared SDE
  step (E1, ``policy.sde.sde_step``) on v = v* + MLP_θs;
* **advantages**: per-reward group statistics within each seed's own groups, then E13 with the
  cell's W (``train.objective``);
* **update**: each seed's (image, trained step) pairs in its own order (``seeds.update_rng``),
  the PPO-clipped loss and the KL term per seed, the global-norm gradient clip per seed, one
  AdamW step over the stacked parameters (AdamW is elementwise, so this is S AdamW steps);
* **evaluation**: at every checkpoint each seed's policy draws the same n trajectories (seeds
  ``eval_seed + k``: common random numbers across seeds, arms and checkpoints).

What is the same as a single run (and tested against ``recast train`` + ``recast evaluate``):
the noise streams, the group statistics, the clip, the optimizer, the checkpoints' rewards,
to float tolerance (the batched matmuls round differently in the last bits). What differs:
nothing is written per run; the caller keeps the per-seed numbers (``CellResult``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from recast_cli.policy.flow1d import DTYPE, X_SCALE, ResidualMLP
from recast_cli.policy.sde import sde_step
from recast_cli.seeds import hashed_normal, train_seeds, update_rng
from recast_cli.train.config import TrainConfig
from recast_cli.train.objective import gaussian_kl, group_advantages, ppo_terms, step_advantages

#: (seed, pair) elements per forward/backward of the update: bounds the activations' memory
#: (about 1 KiB each) whatever S and the pairs per step; the sum over micro-batches is the same loss.
UPDATE_ELEMENTS = 1 << 18
#: (seed, sample) elements per evaluation chunk.
EVAL_ELEMENTS = 1 << 19
PARAM_NAMES = ("inner.weight", "inner.bias", "middle.weight", "middle.bias", "out.weight", "out.bias")


# --------------------------------------------------------------------------- the world


@dataclass(frozen=True)
class Mixture:
    """π^old = Σ_j w_j N(μ_j, s_j²): what the exact velocity v* of the flow1d policy is the velocity of."""

    weights: np.ndarray
    means: np.ndarray
    stds: np.ndarray

    @classmethod
    def default(cls) -> Mixture:
        from recast_cli.policy.gmm1d import MEANS, STD

        return cls(np.full(len(MEANS), 1.0 / len(MEANS)), MEANS.astype(np.float64), np.full(len(MEANS), STD))

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """v*(x, σ) = (x − E[x_0 | x_σ = x])/σ (−x at σ = 0), float64, any shape of x; σ broadcasts to x.

        The closed-form posterior of :func:`recast_cli.policy.gmm1d.posterior` in torch: component j
        has weight ∝ w_j·N(x; (1 − σ)μ_j, v_j) with v_j = (1 − σ)²s_j² + σ² and mean
        μ_j + (1 − σ)s_j²/v_j·(x − (1 − σ)μ_j).
        """
        mu = torch.as_tensor(self.means, dtype=torch.float64)
        s2 = torch.as_tensor(self.stds, dtype=torch.float64) ** 2
        logw = torch.log(torch.as_tensor(self.weights, dtype=torch.float64))
        sigma = torch.broadcast_to(sigma.to(torch.float64), x.shape)
        keep = (1 - sigma)[..., None]
        var = keep**2 * s2 + sigma[..., None] ** 2
        centred = x[..., None] - keep * mu
        log_dens = logw - 0.5 * centred**2 / var - 0.5 * torch.log(2 * math.pi * var)
        post = torch.softmax(log_dens, dim=-1)
        x0_hat = (post * (mu + keep * s2 / var * centred)).sum(-1)
        s = sigma
        return torch.where(s > 0, (x - x0_hat) / torch.where(s > 0, s, 1.0), -x)


# --------------------------------------------------------------------------- S stacked networks


class StackedMLP:
    """S copies of :class:`~recast_cli.policy.flow1d.ResidualMLP`, their tensors stacked on a leading axis.

    The forward pass is the single network's, op for op, with batched matmuls: ``x`` and ``sigma``
    [S, N] → MLP_θs(x, σ) [S, N] in float32.
    """

    def __init__(self, net: ResidualMLP, copies: int):
        state = net.state_dict()
        self.freq = net.freq.detach().clone()
        self.params = [state[name].detach().unsqueeze(0).repeat(copies, *([1] * state[name].dim())).clone()
                       .requires_grad_(True) for name in PARAM_NAMES]
        self.copies = copies

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, params: Sequence[torch.Tensor] | None = None) \
            -> torch.Tensor:
        w1, b1, w2, b2, w3, b3 = self.params if params is None else params
        x = x.to(DTYPE).unsqueeze(-1)
        s = torch.broadcast_to(sigma.to(DTYPE).unsqueeze(-1), x.shape)
        fx = x * self.freq / X_SCALE
        fs = s * self.freq / 2
        h = torch.cat([x / X_SCALE, s, torch.sin(fx), torch.cos(fx), torch.sin(fs), torch.cos(fs)], dim=-1)
        h = torch.nn.functional.silu(torch.baddbmm(b1.unsqueeze(1), h, w1.transpose(1, 2)))
        h = torch.nn.functional.silu(torch.baddbmm(b2.unsqueeze(1), h, w2.transpose(1, 2)))
        return torch.baddbmm(b3.unsqueeze(1), h, w3.transpose(1, 2)).squeeze(-1)

    def snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    def state_dict(self, index: int, params: Sequence[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Seed ``index``'s network as a ResidualMLP state dict (what a single run's checkpoint holds)."""
        return {name: p[index].detach().clone().contiguous()
                for name, p in zip(PARAM_NAMES, self.params if params is None else params)}


# --------------------------------------------------------------------------- a cell


@dataclass(frozen=True)
class Cell:
    """One cell: the recipe (a ``[train]`` configuration; its ``seed`` is not used), W [m, T] (column
    t − 1 is step t), the steps trained, the SDE noise level, the network's shape, the seeds, and
    the evaluation (n trajectories from seeds ``eval_seed + k``, every checkpoint under the SDE,
    the last one also under the ODE)."""

    cfg: TrainConfig
    W: np.ndarray
    trained_steps: tuple[int, ...]
    noise_level: float
    T: int
    seeds: tuple[int, ...]
    features: int = 6
    hidden: int = 32
    policy_seed: int = 0
    eval_n: int = 2048
    eval_seed: int = 10000
    mixture: Mixture = field(default_factory=Mixture.default)
    score: Callable[[str, np.ndarray], np.ndarray] | None = None  # (reward, x_0 [B]) → r [B]; default gmm1d's


@dataclass
class CellResult:
    """Per seed: the training rows (one per iteration), the evaluation rows (one per checkpoint and
    sampler), the final networks, and the first iteration's gradients (all seeds start from the same
    network, so their spread is the spread of the gradient estimator itself)."""

    train: list[dict]
    evals: list[dict]
    final: list[torch.Tensor]
    first_gradients: np.ndarray  # [S, parameters], before clipping


class BatchedTrainer:
    """Train and evaluate every seed of a :class:`Cell` (see the module docstring)."""

    def __init__(self, cell: Cell):
        cfg = cell.cfg
        if cfg.ema_decay > 0:
            raise BadInput("the batched engine keeps no EMA; set [train] ema_decay = 0")
        if cfg.lora_rank != 0:
            raise BadInput("a flow1d policy trains its residual MLP in full; set [train] lora_rank = 0")
        if len(set(cell.seeds)) != len(cell.seeds) or not cell.seeds:
            raise BadInput("a cell needs distinct seeds")
        self.cell = cell
        self.cfg = cfg
        self.S = len(cell.seeds)
        self.T = cell.T
        self.sigmas = torch.from_numpy(GridSpec("linear").sigmas(cell.T))
        self.W = torch.as_tensor(np.asarray(cell.W, dtype=np.float64))
        self.lam = np.asarray(cfg.lam, dtype=np.float64)
        self.net = StackedMLP(ResidualMLP(cell.features, cell.hidden, cell.policy_seed), self.S)
        self.reference = self.net.snapshot() if cfg.beta_kl > 0 else None
        self.optimizer = torch.optim.AdamW(self.net.params, lr=cfg.learning_rate,
                                           betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                           weight_decay=cfg.weight_decay)
        if cell.score is None:
            from recast_cli.policy.gmm1d import reward_value

            self.score = reward_value
        else:
            self.score = cell.score
        self.iteration = 0
        self.first_gradients = np.zeros((self.S, 0))

    # ------------------------------------------------------------------ the policy

    def velocity(self, x: torch.Tensor, t: torch.Tensor | int, exact: torch.Tensor | None = None,
                 params: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """v = v* + MLP_θs at x [S, N] and steps t ([S, N] or one int), float64 (v* given: reused)."""
        sigma = self.sigmas[t]
        if exact is None:
            with torch.no_grad():
                exact = self.cell.mixture.velocity(x, torch.broadcast_to(sigma, x.shape))
        return exact + self.net.forward(x, torch.broadcast_to(sigma, x.shape), params).to(torch.float64)

    # ------------------------------------------------------------------ one iteration

    @torch.no_grad()
    def sample(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """States [S, B, T+1] (x_T … x_0), log-probabilities [S, B, T] and v* [S, B, T] of every seed's batch."""
        cfg, S, T = self.cfg, self.S, self.T
        B = cfg.prompts_per_step * cfg.group_size
        index = np.arange(B, dtype=np.int64)
        seeds = np.stack([train_seeds(seed, iteration, index) for seed in self.cell.seeds])  # [S, B]
        flat = seeds.reshape(-1)

        def noise(step: int) -> torch.Tensor:
            return torch.from_numpy(hashed_normal(flat, np.full(flat.shape, step), 1)).view(S, B)

        x = noise(T + 1)
        states, log_probs, exact = [x], [], []
        for t in range(T, 0, -1):
            sigma = self.sigmas[t]
            v_star = self.cell.mixture.velocity(x, torch.broadcast_to(sigma, x.shape))
            v = v_star + self.net.forward(x, torch.broadcast_to(sigma, x.shape)).to(torch.float64)
            x_next, _, _, lp = sde_step(x.reshape(-1, 1), v.reshape(-1, 1), sigma.expand(S * B),
                                        self.sigmas[t - 1].expand(S * B), self.cell.noise_level,
                                        noise(t).reshape(-1, 1))
            x = x_next.view(S, B)
            states.append(x)
            log_probs.append(lp.view(S, B))
            exact.append(v_star)
        return torch.stack(states, dim=2), torch.stack(log_probs, dim=2), torch.stack(exact, dim=2)

    def rewards(self, x0: torch.Tensor) -> torch.Tensor:
        """[S, B, m] float64 rewards of the samples x_0 [S, B]."""
        flat = x0.reshape(-1).numpy()
        cols = [np.asarray(self.score(name, flat), dtype=np.float64).reshape(x0.shape) for name in self.cfg.rewards]
        return torch.from_numpy(np.stack(cols, axis=-1))

    def advantages(self, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(A_i [S, B, m], A_t [S, B, T]): group statistics within each seed's groups, then E13."""
        cfg = self.cfg
        adv = torch.stack([group_advantages(r, cfg.group_size, global_std=cfg.adv_std == "global")
                           for r in rewards])
        adv_t = step_advantages(adv, self.W, clip=cfg.adv_clip, trained=len(self.cell.trained_steps))
        return adv, adv_t

    def update(self, states, log_probs, exact, adv_t, iteration: int) -> dict[str, np.ndarray]:
        """``updates_per_step`` AdamW steps over each seed's (image, trained step) pairs; per-seed stats."""
        cfg, S, T = self.cfg, self.S, self.T
        B = states.shape[1]
        pairs = np.array([(b, t) for b in range(B) for t in self.cell.trained_steps], dtype=np.int64)
        order = np.stack([update_rng(seed, iteration).permutation(len(pairs)) for seed in self.cell.seeds])
        seed_rows = torch.arange(S)[:, None]
        totals = {k: torch.zeros(S, dtype=torch.float64) for k in ("policy_loss", "kl", "clipped", "loss")}
        grad_norm = torch.zeros(S, dtype=torch.float64)
        first_grads = None
        for chunk in np.array_split(np.arange(len(pairs)), cfg.updates_per_step):
            size = max(1, min(cfg.micro_batch, UPDATE_ELEMENTS // S))
            for lo in range(0, len(chunk), size):
                chosen = pairs[order[:, chunk[lo: lo + size]]]  # [S, n, 2]
                b = torch.from_numpy(chosen[..., 0])
                t = torch.from_numpy(chosen[..., 1])
                j = T - t
                x = states[seed_rows, b, j]
                prev = states[seed_rows, b, j + 1]
                v_star = exact[seed_rows, b, j]
                sigma, sigma_next = self.sigmas[t], self.sigmas[t - 1]
                v = self.velocity(x, t, exact=v_star)
                _, mean, std, lp = sde_step(x.reshape(-1, 1), v.reshape(-1, 1), sigma.reshape(-1),
                                            sigma_next.reshape(-1), self.cell.noise_level,
                                            prev_sample=prev.reshape(-1, 1))
                lp = lp.view(x.shape)
                old = log_probs[seed_rows, b, j]
                A = adv_t[seed_rows, b, t - 1]
                pg, clipped = ppo_terms(lp, old, A, cfg.clip_range)
                loss, kl = pg, torch.zeros_like(pg)
                if cfg.beta_kl > 0:
                    with torch.no_grad():
                        ref = self.velocity(x, t, exact=v_star, params=self.reference)
                        _, ref_mean, _, _ = sde_step(x.reshape(-1, 1), ref.reshape(-1, 1), sigma.reshape(-1),
                                                     sigma_next.reshape(-1), self.cell.noise_level,
                                                     prev_sample=prev.reshape(-1, 1))
                    dt = (sigma_next - sigma).reshape(-1)
                    kl = gaussian_kl(mean, ref_mean, std, dt, cfg.kl_form).view(x.shape)
                    loss = pg + cfg.beta_kl * kl
                (loss.sum(dim=1) / len(chunk)).sum().backward()
                for key, value in (("policy_loss", pg), ("kl", kl), ("clipped", clipped.float()), ("loss", loss)):
                    totals[key] += value.detach().to(torch.float64).sum(dim=1)
            if iteration == 0 and first_grads is None:
                first_grads = torch.cat([p.grad.detach().reshape(S, -1) for p in self.net.params], dim=1)
            grad_norm = self.clip_gradients(cfg.grad_clip)
            bad = ~torch.isfinite(grad_norm) | ~torch.isfinite(totals["loss"])
            self.stop_if(bad, iteration, "the loss or the gradient norm")
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            finite = torch.stack([torch.isfinite(p.detach()).reshape(S, -1).all(dim=1) for p in self.net.params]).all(0)
            self.stop_if(~finite, iteration, "the updated weights")
        n = len(pairs)
        stats = {key: (value / n).numpy() for key, value in totals.items()}
        stats["clip_frac"] = stats.pop("clipped")
        stats["grad_norm"] = grad_norm.numpy()
        if first_grads is not None:
            self.first_gradients = first_grads.to(torch.float64).numpy()
        return stats

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Each seed's global-norm clip, as ``torch.nn.utils.clip_grad_norm_`` does for one network;
        returns the norms before clipping [S]."""
        S = self.S
        norms = torch.stack([p.grad.detach().reshape(S, -1).norm(dim=1) for p in self.net.params], dim=1)
        total = norms.norm(dim=1)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in self.net.params:
            p.grad.mul_(coef.view(S, *([1] * (p.dim() - 1))).to(p.grad.dtype))
        return total.to(torch.float64)

    def stop_if(self, bad: torch.Tensor, iteration: int, what: str) -> None:
        if bool(bad.any()):
            seeds = [self.cell.seeds[i] for i in torch.nonzero(bad).view(-1).tolist()]
            raise BadInput(f"training stopped at step {iteration + 1}: {what} became non-finite for seed(s) "
                           f"{', '.join(map(str, seeds[:8]))}{' …' if len(seeds) > 8 else ''}; lower learning_rate")

    def learning_rate(self, iteration: int) -> float:
        cfg = self.cfg
        if cfg.lr_schedule == "warmup" and cfg.warmup_steps > 0:
            return cfg.learning_rate * min(1.0, (iteration + 1) / cfg.warmup_steps)
        return cfg.learning_rate

    def train_step(self) -> dict[str, np.ndarray]:
        """One iteration of every seed: sample, score, E13, update; per-seed stats."""
        iteration = self.iteration
        lr = self.learning_rate(iteration)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        states, log_probs, exact = self.sample(iteration)
        rewards = self.rewards(states[:, :, -1])
        _, adv_t = self.advantages(rewards)
        stats = self.update(states, log_probs, exact, adv_t, iteration)
        self.iteration = iteration + 1
        means = rewards.mean(dim=1).numpy()  # [S, m]
        stats.update({f"reward/{name}": means[:, i] for i, name in enumerate(self.cfg.rewards)})
        stats["aggregate"] = means @ self.lam
        return stats

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, params: Sequence[torch.Tensor], noise_level: float) -> tuple[np.ndarray, np.ndarray]:
        """Each seed's mean and std of every reward and the aggregate Σλ·r over the n evaluation
        trajectories (seeds ``eval_seed + k``, the same for every seed): ([S, m+1], [S, m+1])."""
        cell, S, T = self.cell, self.S, self.T
        seeds = np.arange(cell.eval_n, dtype=np.int64) + cell.eval_seed
        width = max(1, EVAL_ELEMENTS // S)
        sums = np.zeros((S, len(self.lam) + 1))
        squares = np.zeros((S, len(self.lam) + 1))
        for lo in range(0, len(seeds), width):
            chunk = seeds[lo: lo + width]
            n = len(chunk)
            x = torch.from_numpy(hashed_normal(chunk, np.full(n, T + 1), 1)).view(1, n).expand(S, n).clone()
            for t in range(T, 0, -1):
                v = self.velocity(x, t, params=params)
                noise = None
                if noise_level > 0:
                    noise = torch.from_numpy(hashed_normal(chunk, np.full(n, t), 1)).view(1, n).expand(S, n)
                    noise = noise.reshape(-1, 1)
                x_next, _, _, _ = sde_step(x.reshape(-1, 1), v.reshape(-1, 1), self.sigmas[t].expand(S * n),
                                           self.sigmas[t - 1].expand(S * n), noise_level, noise)
                x = x_next.view(S, n)
            r = self.rewards(x).numpy()  # [S, n, m]
            values = np.concatenate([r, r @ self.lam[:, None]], axis=2)
            sums += values.sum(axis=1)
            squares += (values**2).sum(axis=1)
        mean = sums / len(seeds)
        std = np.sqrt(np.maximum(squares / len(seeds) - mean**2, 0.0))
        return mean, std

    def run(self, progress: Callable[[int], None] | None = None) -> CellResult:
        """Train every seed to ``max_steps``, evaluating at every ``save_every``-th iteration and the last
        (SDE), and the last also under the ODE. ``progress(iteration)`` is called after each iteration."""
        cfg = self.cfg
        train_rows, eval_rows = [], []
        names = [*cfg.rewards, "aggregate"]

        def add_eval(step: int, sampler: str, params) -> None:
            mean, std = self.evaluate(params, self.cell.noise_level if sampler == "sde" else 0.0)
            for s, seed in enumerate(self.cell.seeds):
                eval_rows.append({"seed": seed, "step": step, "sampler": sampler,
                                  **{name: float(mean[s, k]) for k, name in enumerate(names)},
                                  **{f"{name}_std": float(std[s, k]) for k, name in enumerate(names)}})

        while self.iteration < cfg.max_steps:
            stats = self.train_step()
            it = self.iteration
            for s, seed in enumerate(self.cell.seeds):
                train_rows.append({"seed": seed, "step": it, **{k: float(v[s]) for k, v in stats.items()}})
            if it % cfg.save_every == 0 or it == cfg.max_steps:
                add_eval(it, "sde", self.net.params)
            if progress is not None:
                progress(it)
        add_eval(self.iteration, "ode", self.net.params)
        return CellResult(train_rows, eval_rows, self.net.snapshot(), self.first_gradients)
