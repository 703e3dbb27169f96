"""Source ``self``: π⁺ by sampling-importance-resampling from π^old, one positive set per reward.

docs/method.md §4, "Positive samples", and E2: ``π⁺_i(x_0 | c) ∝ π^old(x_0 | c)·exp(r̃_i(x_0, c)/β)``.
For each prompt, draw S samples of π^old (the setting's policy and its SDE sampler), score
them with every reward, and for each reward resample N of the S draws, with replacement, with
probability ∝ exp(r̃_i/β). As S → ∞ the resampled draws are exact π⁺_i samples; at finite S
the effective sample size (Σw)²/Σw² says how far they are from it. No external generator.

Standardisation (docs/method.md §4, "Reward standardisation"): ``r̃ = (r − mean)/std`` over the S
draws of the prompt (a constant reward gives r̃ = 0, i.e. uniform resampling); ``--raw`` tilts
the raw reward instead, as the analytic world's π⁺ does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from scipy.special import logsumexp

from recast_cli.errors import BadInput
from recast_cli.positives.collect import Job, Outcome, PositiveSource
from recast_cli.policy.sample import to_pil
from recast_cli.seeds import IMAGE_STRIDE, self_sir_rng


def standardised(scores: np.ndarray) -> np.ndarray:
    """r̃ = (r − mean)/std over the draws of one prompt; zeros when the reward is constant."""
    scores = np.asarray(scores, dtype=np.float64)
    std = scores.std()
    return np.zeros_like(scores) if std == 0 else (scores - scores.mean()) / std


def tilt_weights(scores: np.ndarray, beta: float, standardise: bool = True) -> np.ndarray:
    """Normalised importance weights w_j ∝ exp(r̃_j/β) of π⁺ against π^old (E2), via log-sum-exp."""
    if not beta > 0:
        raise BadInput(f"beta must be > 0, got {beta}")
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0 or not np.all(np.isfinite(scores)):
        raise BadInput("SIR needs a non-empty 1-D array of finite scores")
    logits = (standardised(scores) if standardise else scores) / beta
    return np.exp(logits - logsumexp(logits))


def effective_sample_size(weights: np.ndarray) -> float:
    """(Σw)²/Σw²: how many independent π⁺ draws the weighted pool is worth."""
    return float(weights.sum() ** 2 / (weights**2).sum())


def sir_resample(scores: np.ndarray, n: int, beta: float, rng: np.random.Generator,
                 standardise: bool = True) -> np.ndarray:
    """Indices of ``n`` draws resampled with replacement with probability ∝ exp(r̃/β) (E2).

    ``scores`` holds one reward's score of each of the S draws of π^old for one prompt; the
    draws at the returned indices are approximately π⁺ samples (exact as S → ∞).
    """
    if n < 1:
        raise BadInput(f"n must be at least 1, got {n}")
    weights = tilt_weights(scores, beta, standardise)
    return rng.choice(len(weights), size=n, replace=True, p=weights)


class SelfSource(PositiveSource):
    """SIR from the setting's own policy: S draws per prompt, N positives per reward."""

    name = "self"

    def __init__(self, spec, rewards: Sequence[str], draws: int, n: int, beta: float = 1.0,
                 standardise: bool = True, noise_level: float | None = None, steps: int | None = None,
                 guidance_scale: float | None = None, batch: int = 8, device: str | None = None,
                 reward_options: dict | None = None):
        self.spec = spec
        self.reward_options = reward_options or {}
        self.names = tuple(rewards)
        self.draws = draws
        self.n = n
        self.beta = beta
        self.standardise = standardise
        self.noise_level = spec.noise_level if noise_level is None else noise_level
        self.steps = spec.steps if steps is None else steps
        self.guidance_scale = spec.guidance_scale if guidance_scale is None else guidance_scale
        self.batch = batch
        self.device = device
        self.scorers: dict[str, Any] = {}
        self.ess: dict[str, list[float]] = defaultdict(list)

    def identity(self) -> dict[str, Any]:
        return {"kind": "self", "policy": {"kind": self.spec.kind, "path": self.spec.model_name(),
                                           "steps": self.steps, "cfg": self.guidance_scale},
                "rewards": list(self.names), "draws": self.draws, "n": self.n, "beta": self.beta,
                "standardise": self.standardise, "noise_level": self.noise_level}

    def rewards(self) -> tuple[str, ...]:
        return self.names

    def prepare(self, prompts: Sequence[str], n: int) -> None:
        from recast_cli.rewards.registry import build_scorer

        if self.spec.kind == "gmm1d":
            raise BadInput("--source self needs an image policy; gmm1d has no images (use sir_resample directly)")
        if not self.names or len(set(self.names)) != len(self.names):
            raise BadInput(f"--rewards must name distinct rewards, got {list(self.names)}")
        if not n <= self.draws <= IMAGE_STRIDE:
            raise BadInput(f"--draws ({self.draws}) must be at least --n ({n}) and at most {IMAGE_STRIDE}")
        if not self.beta > 0:
            raise BadInput(f"--beta must be > 0, got {self.beta}")
        if self.noise_level < 0 or self.steps < 1:
            raise BadInput("--noise-level must be >= 0 and --steps >= 1")
        for name in self.names:
            self.scorers[name] = build_scorer(name, **self.reward_options.get(name, {}))
            self.scorers[name].check_prompts(list(prompts))

    def produce(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        from recast_cli.setting.load import build_policy

        by_prompt: dict[int, list[Job]] = defaultdict(list)
        for job in jobs:
            by_prompt[job.prompt_id].append(job)
        if not by_prompt:
            return
        policy = build_policy(self.spec, device=self.device, steps=self.steps, guidance_scale=self.guidance_scale)
        for prompt_id, wanted in sorted(by_prompt.items()):
            base = wanted[0].seed - wanted[0].sample_id  # the seed of draw 0 of this prompt
            seeds = [base + j for j in range(self.draws)]
            images = self._draw(policy, wanted[0].prompt, seeds)
            for index, name in enumerate(self.names):
                scores = self.scorers[name].score(images, [wanted[0].prompt] * len(images))
                self.ess[name].append(effective_sample_size(tilt_weights(scores, self.beta, self.standardise)))
                picks = sir_resample(scores, self.n, self.beta, self_sir_rng(base, prompt_id, index),
                                     self.standardise)
                # the π^old scale the tilt was standardised with: recorded so the estimator uses the same r̃
                scale = float(np.std(np.asarray(scores, dtype=np.float64))) if self.standardise else None
                for job in (j for j in wanted if j.reward == name):
                    seed = seeds[int(picks[job.sample_id])]
                    yield Outcome(job, image=images[int(picks[job.sample_id])], seed=seed, shared_stem=f"draw-{seed}",
                                  reward_std=scale)

    def _draw(self, policy, prompt: str, seeds: list[int]) -> list:
        """S images of π^old for one prompt (8-bit, so the scored pixels are the stored ones)."""
        images = []
        for start in range(0, len(seeds), self.batch):
            chunk = torch.tensor(seeds[start : start + self.batch])
            cond = policy.encode_prompts([prompt] * len(chunk))
            latents = policy.sample(cond, self.noise_level, chunk, keep_log_probs=False).states[:, -1]
            images.extend(to_pil(policy.decode(latents)))
        return images

    def meta(self) -> dict[str, Any]:
        return {"sir": {"rewards": list(self.names), "draws": self.draws, "beta": self.beta,
                        "standardise": self.standardise,
                        "mean_ess_this_run": {k: float(np.mean(v)) for k, v in self.ess.items()}}}
