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
  the single run's loss (``train.objective.pair_loss``: the PPO-clipped term and the KL) per seed,
  the global-norm gradient clip per seed, one AdamW step over the stacked parameters (AdamW is
  elementwise, so this is S AdamW steps) at the single run's learning rate (``learning_rate_at``);
* **evaluation**: at every checkpoint each seed's policy draws the same n trajectories (seeds
  ``eval_seed + k``: common random numbers across seeds, arms and checkpoints).

What is the same as a single run (and tested against ``recast train`` + ``recast evaluate``):
the noise streams, the group statistics, the clip, the optimizer, the checkpoints' rewards,
to float tolerance (the batched matmuls round differently in the last bits). What differs:
nothing is written per run; the caller keeps the per-seed numbers (``CellResult``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from recast_cli.train.stacked_gradients import measured_iterations, reward_gradients, summarise
from recast_cli.errors import BadInput
from recast_cli.policy.flow1d import DTYPE, X_SCALE, ResidualMLP
from recast_cli.policy.sde import sde_step
from recast_cli.policy.world1d import DEFAULT_WORLD, World1D
from recast_cli.seeds import hashed_normal, train_seeds, update_rng
from recast_cli.train.config import TrainConfig
from recast_cli.train.objective import PairLoss, group_advantages, pair_loss, step_advantages
from recast_cli.train.stall import group_spread

#: (seed, pair) elements per forward/backward of the update: bounds the activations' memory
#: (about 1 KiB each) whatever S, by splitting the seeds (each seed's micro-batches stay the single run's).
#: 2^15 and EVAL_ELEMENTS 2^15 were 5-10% faster than 2^14, 2^16 or 2^17 (64 seeds, one core:
#: the arrays of a chunk, 4 MiB of activations, stay nearer the cache).
UPDATE_ELEMENTS = 1 << 15
#: (seed, sample) elements per evaluation chunk.
EVAL_ELEMENTS = 1 << 15
PARAM_NAMES = ("inner.weight", "inner.bias", "middle.weight", "middle.bias", "out.weight", "out.bias")
#: glibc's mallopt parameters, and the size above which a block is mmap'ed (the ceiling of glibc's own
#: dynamic threshold on 64-bit; a cell's largest arrays are a few MiB).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, MMAP_THRESHOLD = -1, -3, 32 << 20


def hold_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for the next allocation (mallopt: the heap is never
    trimmed; blocks up to 32 MiB come from the heap, not from fresh mmaps).

    Every step of a cell allocates and frees the same arrays of a few MiB. With glibc's defaults
    they went back to the kernel and were faulted in again: 3.3 s of system time and 2.2 M page
    faults in a 26 s cell of ``benchmarks/bench_study.py`` (64 seeds), 0.06 s and 39 k with this.
    The cost is a resident size that stays at the process's peak (the cell's working set, tens
    of MiB). Returns False, changing nothing, where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def seed_groups(S: int, size: int) -> list[slice]:
    """The seeds 0..S−1 in consecutive groups of ``size`` (at least 2), a last group of one seed joined to the
    one before: a batched matmul over one matrix takes another kernel than over several (its float32 sums
    differ in the last bits), so in a cell of several seeds every seed is computed among others, whatever S."""
    starts = list(range(0, S, max(2, size)))
    if len(starts) > 1 and S - starts[-1] == 1:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, [*starts[1:], S])]


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
        grad = torch.is_grad_enabled()
        x = x.to(DTYPE).unsqueeze(-1)
        fx = x * self.freq / X_SCALE
        if sigma.dim() == 0 and not grad:
            # one σ for the whole batch (sampling, evaluation): its features' share of the first layer
            # is one vector per seed, added like the bias (the same sum, in another order)
            F = len(self.freq)
            s = sigma.to(DTYPE).reshape(1, 1)
            fs = s * self.freq / 2
            sigma_part = torch.cat([s, torch.sin(fs), torch.cos(fs)], dim=-1)  # [1, 1 + 2F]
            x_cols = [0, *range(2, 2 + 2 * F)]
            s_cols = [1, *range(2 + 2 * F, 2 + 4 * F)]
            bias = torch.baddbmm(b1.unsqueeze(1), sigma_part.expand(len(w1), 1, 1 + 2 * F), w1[:, :, s_cols].transpose(1, 2))
            h = torch.cat([x / X_SCALE, torch.sin(fx), torch.cos(fx)], dim=-1)
            h = torch.nn.functional.silu(torch.baddbmm(bias, h, w1[:, :, x_cols].transpose(1, 2)), inplace=True)
        else:
            s = torch.broadcast_to(sigma.to(DTYPE).unsqueeze(-1), x.shape)
            fs = s * self.freq / 2
            h = torch.cat([x / X_SCALE, s, torch.sin(fx), torch.cos(fx), torch.sin(fs), torch.cos(fs)], dim=-1)
            h = torch.nn.functional.silu(torch.baddbmm(b1.unsqueeze(1), h, w1.transpose(1, 2)))
        h = torch.nn.functional.silu(torch.baddbmm(b2.unsqueeze(1), h, w2.transpose(1, 2)), inplace=not grad)
        if not grad:  # one output: a dot product per sample beats a matmul of width 1
            return (h * w3).sum(-1) + b3
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
    world: World1D = DEFAULT_WORLD  # π^old (v* is its exact velocity) and the rewards


@dataclass
class CellResult:
    """Per seed: the training rows (one per iteration), the evaluation rows (one per checkpoint and
    sampler), the final networks, and the first iteration's gradients (all seeds start from the same
    network, so their spread is the spread of the gradient estimator itself). For the cell: the base
    policy's evaluation (every seed starts from it) and each reward's gradient signal and noise at four
    iterations (``train.stacked_gradients``)."""

    train: list[dict]
    evals: list[dict]
    final: list[torch.Tensor]
    first_gradients: np.ndarray  # [S, parameters], before clipping
    base: dict[str, list[float]] = field(default_factory=dict)  # sampler → the base policy's [m + 1] means
    reward_gradients: dict = field(default_factory=dict)  # gradients.summarise of the measured iterations


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
        self.sigmas = torch.from_numpy(cell.world.grid.sigmas(cell.T))
        self.W = torch.as_tensor(np.asarray(cell.W, dtype=np.float64))
        self.lam = np.asarray(cfg.lam, dtype=np.float64)
        self.net = StackedMLP(ResidualMLP(cell.features, cell.hidden, cell.policy_seed), self.S)
        self.reference = self.net.snapshot() if cfg.beta_kl > 0 else None
        self.optimizer = torch.optim.AdamW(self.net.params, lr=cfg.learning_rate,
                                           betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                           weight_decay=cfg.weight_decay)
        self.score = cell.world.reward_value
        self.iteration = 0
        self.first_gradients = np.zeros((self.S, 0))
        self.measured: tuple[list[int], list[np.ndarray], list[np.ndarray]] = ([], [], [])

    # ------------------------------------------------------------------ the policy

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, exact: torch.Tensor | None = None,
                 params: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """v = v* + MLP_θs at x [S, N] and levels σ ([S, N], or one level for all: a 0-dim tensor),
        float64 (v* given: reused)."""
        if exact is None:
            exact = self.cell.world.velocity_torch(x, sigma)
        return exact + self.net.forward(x, sigma, params).to(torch.float64)

    def levels(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(σ_t, σ_{t−1}) as one-element tensors: one level for the whole batch broadcasts through E1."""
        return self.sigmas[t].reshape(1), self.sigmas[t - 1].reshape(1)

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
            v_star = self.cell.world.velocity_torch(x, self.sigmas[t])
            v = self.velocity(x, self.sigmas[t], exact=v_star)
            x_next, _, _, lp = sde_step(x.reshape(-1, 1), v.reshape(-1, 1), *self.levels(t), self.cell.noise_level,
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

    def pair_terms(self, by_pair: dict[str, torch.Tensor], chosen: torch.Tensor, rows: slice | None,
                   params: Sequence[torch.Tensor] | None = None) -> PairLoss:
        """The per-pair loss terms of the pairs ``chosen`` [S', n] of the seeds ``rows`` (None: every seed),
        computed with ``params`` (those seeds' tensors; None: the network's own)."""
        cfg = self.cfg
        x, prev, v_star, old, A, sigma, sigma_next = (
            (by_pair[k] if rows is None else by_pair[k][rows]).gather(1, chosen)
            for k in ("x", "prev", "v_star", "old", "A", "sigma", "sigma_next"))
        v = self.velocity(x, sigma, exact=v_star, params=params)
        _, mean, std, lp = sde_step(x.reshape(-1, 1), v.reshape(-1, 1), sigma.reshape(-1), sigma_next.reshape(-1),
                                    self.cell.noise_level, prev_sample=prev.reshape(-1, 1))
        ref_mean = dt = None
        if cfg.beta_kl > 0:  # the reference policy's transition, for the KL term
            with torch.no_grad():
                reference = self.reference if rows is None else [p[rows] for p in self.reference]
                ref = self.velocity(x, sigma, exact=v_star, params=reference)
                _, ref_mean, _, _ = sde_step(x.reshape(-1, 1), ref.reshape(-1, 1), sigma.reshape(-1),
                                             sigma_next.reshape(-1), self.cell.noise_level,
                                             prev_sample=prev.reshape(-1, 1))
            dt = (sigma_next - sigma).reshape(-1)
        return pair_loss(lp.view(x.shape), old, A, clip_range=cfg.clip_range, beta_kl=cfg.beta_kl, mean=mean,
                         ref_mean=ref_mean, std=std, dt=dt, kl_form=cfg.kl_form)

    def update(self, states, log_probs, exact, adv_t, iteration: int) -> dict[str, np.ndarray]:
        """``updates_per_step`` AdamW steps over each seed's (image, trained step) pairs; per-seed stats."""
        cfg, S, T = self.cfg, self.S, self.T
        B = states.shape[1]
        steps = torch.tensor(self.cell.trained_steps, dtype=torch.int64)
        P = B * len(steps)  # pair p = b·K + k is (image b, trained step t_k), as a single run lists them
        order = torch.from_numpy(np.stack([update_rng(seed, iteration).permutation(P) for seed in self.cell.seeds]))
        j = T - steps  # the column of x_t in states (x_{t−1} is the next), of v* and the old log-probability
        by_pair = {"x": states[:, :, j], "prev": states[:, :, j + 1], "v_star": exact[:, :, j],
                   "old": log_probs[:, :, j], "A": adv_t[:, :, steps - 1],
                   "sigma": self.sigmas[steps].expand(S, B, -1), "sigma_next": self.sigmas[steps - 1].expand(S, B, -1)}
        by_pair = {k: v.reshape(S, P) for k, v in by_pair.items()}  # [S, P] each, in pair order
        totals = {k: torch.zeros(S, dtype=torch.float64) for k in PairLoss._fields}
        grad_norm = torch.zeros(S, dtype=torch.float64)
        first_grads = None
        # each seed's pairs go in the single run's micro-batches (micro_batch pairs, in its order), so no seed's
        # sums depend on S or on the seeds beside it; the seeds are split instead (S·micro_batch elements could
        # be too many for memory), each seed getting one gradient term per micro-batch in the single run's
        # order (the other seeds' rows get + 0)
        groups = seed_groups(S, max(1, UPDATE_ELEMENTS // cfg.micro_batch))
        whole = len(groups) == 1
        for chunk in np.array_split(np.arange(P), cfg.updates_per_step):
            for lo in range(chunk[0], chunk[-1] + 1, cfg.micro_batch):
                for rows in groups:
                    # a group's own leaf copies of its seeds' tensors: their gradients are added to those rows
                    # only (autograd through a slice would add a zero gradient to every other seed)
                    params = None if whole else [p[rows].detach().requires_grad_(True) for p in self.net.params]
                    terms = self.pair_terms(by_pair, order[rows, lo: min(lo + cfg.micro_batch, chunk[-1] + 1)],
                                            None if whole else rows, params)
                    (terms.loss.sum(dim=1) / len(chunk)).sum().backward()
                    if not whole:
                        for p, part in zip(self.net.params, params):
                            if p.grad is None:
                                p.grad = torch.zeros_like(p)
                            p.grad[rows] += part.grad
                    for key, value in terms._asdict().items():
                        totals[key][rows] += value.detach().to(torch.float64).sum(dim=1)
            if iteration == 0 and first_grads is None:
                first_grads = torch.cat([p.grad.detach().reshape(S, -1) for p in self.net.params], dim=1)
            grad_norm = self.clip_gradients(cfg.grad_clip)
            bad = ~torch.isfinite(grad_norm) | ~torch.isfinite(totals["loss"])
            self.stop_if(bad, iteration, "the loss or the gradient norm")
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            finite = torch.stack([torch.isfinite(p.detach()).reshape(S, -1).all(dim=1) for p in self.net.params]).all(0)
            self.stop_if(~finite, iteration, "the updated weights")
        stats = {key: (value / P).numpy() for key, value in totals.items()}
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

    def train_step(self) -> dict[str, np.ndarray]:
        """One iteration of every seed: sample, score, E13, update; per-seed stats."""
        iteration = self.iteration
        lr = self.cfg.learning_rate_at(iteration)  # the schedule of a single run
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        states, log_probs, exact = self.sample(iteration)
        rewards = self.rewards(states[:, :, -1])
        adv, adv_t = self.advantages(rewards)
        if iteration in measured_iterations(self.cfg.max_steps):
            measured = reward_gradients(self, states, exact, adv)
            if measured is not None:
                for kept, value in zip(self.measured, (iteration + 1, *measured)):
                    kept.append(value)
        stats = self.update(states, log_probs, exact, adv_t, iteration)
        self.iteration = iteration + 1
        means = rewards.mean(dim=1).numpy()  # [S, m]
        spreads = group_spread(rewards.numpy(), self.cfg.group_size)  # [S, m]: the stall detector's scale
        stats.update({f"reward/{name}": means[:, i] for i, name in enumerate(self.cfg.rewards)})
        stats.update({f"reward_spread/{name}": spreads[:, i] for i, name in enumerate(self.cfg.rewards)})
        stats["aggregate"] = means @ self.lam
        return stats

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, params: Sequence[torch.Tensor], noise_level: float) -> tuple[np.ndarray, np.ndarray]:
        """Each seed's mean and std of every reward and the aggregate Σλ·r over the n evaluation
        trajectories (seeds ``eval_seed + k``, the same for every seed): ([S, m+1], [S, m+1])."""
        cell, S, T = self.cell, len(params[0]), self.T  # S: the networks in ``params`` (one: the base policy)
        seeds = np.arange(cell.eval_n, dtype=np.int64) + cell.eval_seed
        width = max(1, EVAL_ELEMENTS // S)
        sums = np.zeros((S, len(self.lam) + 1))
        squares = np.zeros((S, len(self.lam) + 1))
        for lo in range(0, len(seeds), width):
            chunk = seeds[lo: lo + width]
            n = len(chunk)
            x = torch.from_numpy(hashed_normal(chunk, np.full(n, T + 1), 1)).view(1, n).expand(S, n).clone()
            for t in range(T, 0, -1):  # x [S, n]: E1 broadcasts one level, and one noise row, over the seeds
                v = self.velocity(x, self.sigmas[t], params=params)
                noise = None
                if noise_level > 0:
                    noise = torch.from_numpy(hashed_normal(chunk, np.full(n, t), 1)).view(1, n)
                x, _, _, _ = sde_step(x, v, *self.levels(t), noise_level, noise, with_log_prob=False)
            r = self.rewards(x).numpy()  # [S, n, m]
            values = np.concatenate([r, r @ self.lam[:, None]], axis=2)
            sums += values.sum(axis=1)
            squares += (values**2).sum(axis=1)
        mean = sums / len(seeds)
        std = np.sqrt(np.maximum(squares / len(seeds) - mean**2, 0.0))
        return mean, std

    def run(self, progress: Callable[[int], None] | None = None) -> CellResult:
        """Train every seed to ``max_steps``, evaluating at every ``save_every``-th iteration and the last
        (SDE), and the last also under the ODE. ``progress(iteration)`` is called after each iteration.
        Sets the process's malloc to keep freed memory (:func:`hold_freed_memory`)."""
        hold_freed_memory()
        cfg = self.cfg
        train_rows, eval_rows = [], []
        names = [*cfg.rewards, "aggregate"]

        def add_eval(step: int, sampler: str, params) -> None:
            mean, std = self.evaluate(params, self.cell.noise_level if sampler == "sde" else 0.0)
            for s, seed in enumerate(self.cell.seeds):
                eval_rows.append({"seed": seed, "step": step, "sampler": sampler,
                                  **{name: float(mean[s, k]) for k, name in enumerate(names)},
                                  **{f"{name}_std": float(std[s, k]) for k, name in enumerate(names)}})

        base = {sampler: self.evaluate([p[:1] for p in self.net.params], level)[0][0].tolist()
                for sampler, level in (("sde", self.cell.noise_level), ("ode", 0.0))}
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
        return CellResult(train_rows, eval_rows, self.net.snapshot(), self.first_gradients, base,
                          summarise(*self.measured, tuple(cfg.rewards)) if self.measured[0] else {})
