"""The worlds ``recast estimate`` measures in: policy, rewards, prompts and positives (docs/method.md §4).

One builder per world — the exact analytic world (``--policy gmm1d``), its trainable version (a
``flow1d`` setting) and the image models (an ``sd3``, ``flux`` or ``qwenimage`` setting, optionally
with a run's LoRA) — and what they share: resolving ``--policy`` (a setting, a run or a checkpoint
folder), the positives' images and the fingerprint of a model's weights. Nothing here runs a rollout;
:mod:`recast_cli.estimate.stage` does, over the :class:`World` built here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recast_cli.artifacts import Source
from recast_cli.artifacts.run import find_checkpoint
from recast_cli.errors import BadInput
from recast_cli.estimate.config import EstimateConfig
from recast_cli.setting.prompts import read_prompt_file
from recast_cli.seeds import analytic_positive_seed, renderer_seeds, sir_draw_seeds, sir_rng


@dataclass
class World:
    """What an estimate measures in: the policy, its scorers, the prompts (their ids as the tables
    record them), the positives (or π^old-sampling), and what the tables record of policy, positives
    and sources. Built with keywords by one builder per world."""

    policy: Any
    scorers: list
    prompts: list[str]
    prompt_ids: list[int]
    positives: Any  # callable prompt_index -> list of latent sets, or None (π^old-sampling)
    policy_info: dict
    positives_info: dict
    sources: list[Source]
    is_analytic: bool  # an analytic world (gmm1d, or flow1d): raw rewards, its World1D.beta, its World1D.grid
    positive_sets: int = 1  # 1: one set serves every reward; m: one set per reward


def build_world(cfg: EstimateConfig) -> World:
    """Resolve policy, scorers, prompts and the positives of a run (BadInput names what is wrong).

    One builder per world: the exact analytic world (``--policy gmm1d``), its trainable version
    (a ``flow1d`` setting), and image models (an ``sd3``, ``flux`` or ``qwenimage`` setting, optionally a
    run's LoRA).
    """
    from recast_cli.rewards.registry import is_known, scorer_names
    from recast_cli.policy.world1d import DEFAULT_WORLD

    if cfg.policy == "gmm1d":
        return _gmm1d_world(cfg, DEFAULT_WORLD)
    from recast_cli.setting.load import analytic_world, load_setting

    setting_name, checkpoint = resolve_policy(cfg.policy)
    setting = load_setting(setting_name)
    if setting.policy.kind == "flow1d":
        return _flow1d_world(cfg, setting, checkpoint)
    if setting.policy.kind == "gmm1d":
        if checkpoint is not None:
            raise BadInput(f"--policy {cfg.policy}: a gmm1d setting is not trained; it has no checkpoints")
        return _gmm1d_world(cfg, analytic_world(setting.policy), setting)
    unknown = [r for r in cfg.rewards if not is_known(r)]
    if unknown:
        raise BadInput(f"unknown reward {unknown[0]!r}; known: {', '.join(scorer_names())}")
    return _image_world(cfg, setting, checkpoint)


def exact_world(policy: str) -> tuple[Any, dict, list[Source]]:
    """The world ``recast estimate --exact`` computes in: ``gmm1d`` (docs/method.md §4's), or a gmm1d or
    flow1d setting's (its ``[world]``, else the default) → (world, config entries, sources)."""
    from recast_cli.policy.world1d import DEFAULT_WORLD
    from recast_cli.setting.load import ANALYTIC_KINDS, analytic_world, load_setting

    if policy == "gmm1d":
        return DEFAULT_WORLD, {}, []
    setting_name, checkpoint = resolve_policy(policy)
    if checkpoint is not None:
        raise BadInput(f"--exact: {policy} is a trained checkpoint, whose curves have no closed form; "
                       "--exact takes gmm1d or a gmm1d/flow1d setting (its base policy)")
    setting = load_setting(setting_name)
    if setting.policy.kind not in ANALYTIC_KINDS:
        raise BadInput(f"--exact is only defined for the analytic worlds: --policy gmm1d or a gmm1d/flow1d "
                       f"setting, not a {setting.policy.kind} setting")
    return analytic_world(setting.policy), {"setting": str(setting.file)}, [Source.of(setting.file)]


def _gmm1d_world(cfg: EstimateConfig, world, setting=None) -> World:
    """The exact analytic world (``--policy gmm1d``, or a gmm1d setting with its ``[world]``): exact π⁺
    draws per reward, P replicates of one "prompt"."""
    from recast_cli.policy.gmm1d import GMM1DPolicy, GMM1DReward

    for r in cfg.rewards:
        world.check_reward(r)
    if cfg.positives is not None:
        raise BadInput("gmm1d draws exact π⁺ samples; it takes no --positives")
    policy = GMM1DPolicy(steps=cfg.steps, world=world)
    P = cfg.P or 4
    prompts = [f"gmm1d-{p}" for p in range(P)]

    def positives(p: int) -> list[torch.Tensor]:
        # one exact π⁺ set per reward, seeded by (run seed, prompt, reward)
        return [torch.from_numpy(world.sample_positive(r, cfg.N, seed=analytic_positive_seed(cfg.seed, p, i),
                                                       beta=world.beta)).view(-1, 1)
                for i, r in enumerate(cfg.rewards)]

    info: dict[str, Any] = {"name": "gmm1d", "steps": cfg.steps}
    sources = []
    if setting is not None:
        info["setting"] = str(setting.file)
        sources.append(Source.of(setting.file))
    pplus = cfg.sampling == "pplus"
    return World(policy=policy, scorers=[GMM1DReward(r, world) for r in cfg.rewards], prompts=prompts,
                 prompt_ids=list(range(P)), positives=positives if pplus else None, policy_info=info,
                 positives_info={"source": "exact"} if pplus else {}, sources=sources, is_analytic=True,
                 positive_sets=len(cfg.rewards) if pplus else 1)


def _image_world(cfg: EstimateConfig, setting, checkpoint: Path | None) -> World:
    """An image model (sd3, flux or qwenimage setting): positives from a folder or the toy renderer, or π^old-sampling
    from a prompts file; a run's LoRA when ``--policy`` names a run or checkpoint."""
    from recast_cli.rewards import build_scorer
    from recast_cli.setting.load import build_policy, check_prompts, reward_options

    spec = setting.policy
    found = _image_prompts(cfg, setting)
    if cfg.P is not None:
        found.prompts, found.prompt_ids = found.prompts[: cfg.P], found.prompt_ids[: cfg.P]
    check_prompts(spec, found.prompts)
    policy = build_policy(spec, steps=cfg.steps, guidance_scale=cfg.guidance_scale)
    lora_info = {}
    if checkpoint is not None:
        from recast_cli.policy.lora import load_lora_into_policy

        adapter = load_lora_into_policy(policy, checkpoint)
        source = Source.of(adapter)
        found.sources.append(source)
        lora_info = {"checkpoint": str(checkpoint), "adapter": str(adapter), "adapter_sha256": source.sha256}
    options = reward_options(setting)
    scorers = [build_scorer(r, **options.get(r, {})) for r in cfg.rewards]
    if found.pos is not None:  # every positive a rollout starts from decodes at the policy's size, checked up front
        _check_positive_images(found.pos, found.prompt_ids, found.reward_sets, cfg.N, policy)
    policy_info = {"setting": str(setting.file), "kind": spec.kind, "path": spec.model_name(),
                   "guidance_scale": policy.guidance_scale if hasattr(policy, "guidance_scale") else None,
                   "weights_sha256": _weights_hash(spec.folder()), **lora_info}
    pplus = cfg.sampling == "pplus"
    return World(policy=policy, scorers=scorers, prompts=found.prompts, prompt_ids=found.prompt_ids,
                 positives=_image_positives(cfg, spec, found, policy) if pplus else None, policy_info=policy_info,
                 positives_info=found.info, sources=found.sources, is_analytic=False,
                 positive_sets=len(found.reward_sets) if pplus else 1)


@dataclass
class _ImagePrompts:
    """The prompts of an image world and where its positives come from: ``pos`` a positives folder (None:
    the toy renderer, or none at all), ``reward_sets`` the reward of each positive set ([None]: one shared
    set), ``info`` what the tables record of the positives, ``sources`` the files they came from."""

    prompts: list[str]
    prompt_ids: list[int]
    pos: Any = None  # recast_cli.artifacts.Positives
    reward_sets: list[str | None] = field(default_factory=lambda: [None])
    info: dict = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)


def _image_prompts(cfg: EstimateConfig, setting) -> _ImagePrompts:
    """The prompts and positives of an image world: a ``--positives`` folder, the toy renderer (a toy
    setting), or π^old-sampling from ``--prompts`` (π⁺-sampling without positives is refused)."""
    if cfg.positives is not None:
        return _folder_prompts(cfg)
    if setting.policy.prompt_check == "toy":
        from recast_cli.toy.renderer import all_prompts

        prompts = all_prompts()
        return _ImagePrompts(prompts, list(range(len(prompts))), info={"source": "renderer"})
    if cfg.sampling == "pplus":
        raise BadInput(f"setting {setting.name!r}: π⁺-sampling needs --positives DIR (see recast sample-positive)")
    return _ImagePrompts(*_prompts_file(cfg.prompts_file))


def _folder_prompts(cfg: EstimateConfig) -> _ImagePrompts:
    """The prompts of a ``--positives`` folder, each with at least N positives per set (one shared set, or
    one per reward, e.g. ``sample-positive --source self``, whose recorded π^old scales are kept)."""
    from recast_cli.artifacts import read_positives

    pos = read_positives(cfg.positives)
    prompt_ids = sorted({s.prompt_id for s in pos.samples})
    # one shared set (every reward), or one set per reward (e.g. `sample-positive --source self`)
    reward_sets = [None] if not pos.rewards() else list(cfg.rewards)
    for pid in prompt_ids:
        for reward in reward_sets:
            have = len(pos.for_prompt(pid, reward))
            if have < cfg.N:
                which = "" if reward is None else f" for reward {reward!r}"
                raise BadInput(f"{cfg.positives}: prompt_id {pid} has {have} positives{which}, fewer than N = {cfg.N}")
    manifest = Source.of(Path(cfg.positives) / "manifest.parquet")
    info = {"source": str(cfg.positives), "sha256": manifest.sha256, "generator": pos.meta.get("generator")}
    recorded = {(s.prompt_id, s.reward): s.reward_std for s in pos.samples if s.reward_std is not None}
    if recorded and reward_sets != [None]:  # `self` positives: the π^old scale each tilt used (E2)
        info["reward_std"] = {str(pid): {r: recorded.get((pid, r)) for r in cfg.rewards} for pid in prompt_ids}
    return _ImagePrompts(pos.prompts(), prompt_ids, pos, reward_sets, info, [manifest])


def _image_positives(cfg: EstimateConfig, spec, found: _ImagePrompts, policy):
    """prompt index → the latent positive sets of that prompt: N renderer images (no positives folder),
    else the folder's first N images of each set, encoded by the policy."""
    pos, prompts, prompt_ids = found.pos, found.prompts, found.prompt_ids

    def positives(p: int) -> list[torch.Tensor]:
        if pos is None:
            from recast_cli.toy.renderer import render_batch

            seeds = renderer_seeds(cfg.seed, prompt_ids[p], cfg.N)
            images = render_batch([prompts[p]] * cfg.N, seeds, spec.resolution or 32)
        else:
            from recast_cli.rewards.base import as_float

            sets = []
            for reward in found.reward_sets:
                chosen = pos.for_prompt(prompt_ids[p], reward)[: cfg.N]
                images = torch.stack(as_float([_positive_image(pos.root / s.image_path, policy) for s in chosen]))
                sets.append(policy.encode(images.to(policy.device)))
            return sets
        return [policy.encode(images.to(policy.device))]

    return positives


#: flow1d at a trained checkpoint: π⁺ by resampling this many of the policy's own draws per positive
SIR_DRAWS_PER_POSITIVE = 64


def _flow1d_world(cfg: EstimateConfig, setting, checkpoint: Path | None) -> World:
    """The trainable analytic world: the setting's flow1d policy (a checkpoint's residual loaded).

    π⁺ = π^old·exp(r/β) with the raw reward and the world's β (``World1D.beta``), as in gmm1d. At
    the base policy (residual zero, π^old exact) the positives are exact π⁺ draws
    (``World1D.sample_positive``). At a
    trained checkpoint π^old is the trained sampler's law, which has no closed form: each
    reward's N positives are resampled (SIR, E2) from ``SIR_DRAWS_PER_POSITIVE``·N of the
    policy's own SDE draws, with probability ∝ exp(r/β) — exact as the draws grow.
    """
    from recast_cli.policy.gmm1d import GMM1DReward
    from recast_cli.setting.load import analytic_world, build_policy

    world = analytic_world(setting.policy)
    unknown = [r for r in cfg.rewards if r not in world.reward_names]
    if unknown:
        raise BadInput(f"flow1d has no reward {unknown[0]!r}; it has {', '.join(world.reward_names)}")
    if cfg.positives is not None:
        raise BadInput("flow1d draws its own π⁺ samples (exact at the base, resampled at a checkpoint); "
                       "it takes no --positives")
    spec = setting.policy
    policy = build_policy(spec, steps=cfg.steps)
    sources = [Source.of(setting.file)]
    info: dict[str, Any] = {"setting": str(setting.file), "kind": "flow1d", "steps": cfg.steps}
    if checkpoint is not None:
        from recast_cli.policy.flow1d import load_network

        weights = load_network(policy, checkpoint)
        source = Source.of(weights)
        sources.append(source)
        info.update(checkpoint=str(checkpoint), adapter=str(weights), adapter_sha256=source.sha256)
    P = cfg.P or 4
    prompts = [f"flow1d-{p}" for p in range(P)]
    beta = world.beta

    def positives(p: int) -> list[torch.Tensor]:
        if checkpoint is None:  # the exact π^old: exact π⁺ draws, one set per reward
            return [torch.from_numpy(world.sample_positive(r, cfg.N, seed=analytic_positive_seed(cfg.seed, p, i),
                                                           beta=beta)).view(-1, 1)
                    for i, r in enumerate(cfg.rewards)]
        draws = SIR_DRAWS_PER_POSITIVE * cfg.N
        seeds = torch.from_numpy(sir_draw_seeds(cfg.seed, p, draws))
        x0 = policy.sample(policy.encode_prompts(prompts[p:p + 1] * draws), spec.noise_level, seeds,
                           keep_log_probs=False).states[:, -1]
        sets = []
        for i, r in enumerate(cfg.rewards):
            logits = world.reward_value(r, x0.numpy().reshape(-1)) / beta
            weights = np.exp(logits - logits.max())
            picks = sir_rng(cfg.seed, p, i).choice(draws, size=cfg.N, p=weights / weights.sum())
            sets.append(x0[torch.from_numpy(picks)].clone())
        return sets

    positives_info = ({"source": "exact"} if checkpoint is None else
                      {"source": "sir", "draws_per_positive": SIR_DRAWS_PER_POSITIVE, "beta": beta})
    pplus = cfg.sampling == "pplus"
    return World(policy=policy, scorers=[GMM1DReward(r, world) for r in cfg.rewards], prompts=prompts,
                 prompt_ids=list(range(P)), positives=positives if pplus else None, policy_info=info,
                 positives_info=positives_info if pplus else {}, sources=sources, is_analytic=True,
                 positive_sets=len(cfg.rewards) if pplus else 1)


def _positive_image(path: Path, policy):
    """One positive, RGB, through the header-checked reader; BadInput naming the file unless it
    decodes at the policy's R x R."""
    from recast_cli.images import max_pixels_for, read_image

    size = getattr(policy, "resolution", None)
    image = read_image(path, f"positive {path}", max_pixels_for(size)).convert("RGB")
    if size is not None and image.size != (size, size):
        raise BadInput(f"positive {path} is {image.size[0]} x {image.size[1]}, the policy samples {size} x {size} "
                       "(recast sample-positive normalises to the setting's resolution)")
    return image


def _check_positive_images(pos, prompt_ids: Sequence[int], reward_sets: Sequence[str | None], N: int, policy) -> None:
    """Decode every positive the run will use, once, before any rollout (see ``_positive_image``)."""
    seen: set[Path] = set()
    for pid in prompt_ids:
        for reward in reward_sets:
            for s in pos.for_prompt(pid, reward)[:N]:
                path = pos.root / s.image_path
                if path not in seen:
                    seen.add(path)
                    _positive_image(path, policy)


def resolve_policy(text: str) -> tuple[str, Path | None]:
    """``--policy`` → (setting name or path, checkpoint folder or None).

    A folder is a ``recast train`` run (its latest complete checkpoint) or one of its checkpoints
    (``RUN/checkpoints/step-N``), verified, and the setting is the one the run trained
    (``artifacts.run.find_checkpoint``). Anything else is a setting name or a .toml path, for
    ``load_setting`` to judge.
    """
    if not Path(text).is_dir():
        return text, None
    found = find_checkpoint(text, f"--policy {text}")
    if found is None:
        raise BadInput(f"--policy {text}: a folder that is neither a recast train run (no run.json) nor one of its "
                       "checkpoints (RUN/checkpoints/step-N); a setting is a name or a .toml file")
    return str(found.record.setting), found.folder


def _prompts_file(path: str | None) -> tuple[list[str], list[int]]:
    if path is None:
        raise BadInput("π^old-sampling on this setting needs --prompts FILE (one prompt per line)")
    prompts, _ = read_prompt_file(path)
    return prompts, list(range(len(prompts)))


def _weights_hash(folder: Path | None) -> str | None:
    """sha256 over the sha256s of the model folder's weight files (identifies the policy)."""
    if folder is None:
        return None
    from recast_cli.artifacts import sha256_file

    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*.safetensors")):
        digest.update(f"{path.relative_to(folder)}:{sha256_file(path)}".encode())
    return digest.hexdigest()

