"""The ``recast evaluate`` stage, top to bottom (docs/method.md §7).

1. Resolve what is evaluated, once (``evaluate/target``): the base model of a setting, or a
   ``recast train`` run (its latest checkpoint, or ``--checkpoint STEP``) with the run's setting
   (:func:`run_evaluation`, the command's one entry, hands the 1-D world to ``evaluate/curve``);
   the ``[evaluate]`` table (held-out prompts, n, seed, steps, CFG, judges) and the flags.
2. Build the policy (LoRA applied for a run) and every scorer: the training rewards and the
   held-out judges. Everything the user can get wrong fails here, before a byte is written.
3. For every chunk of ``batch_size`` images not already done: deterministic ODE sampling
   (noise level 0, x_T drawn from the image's seed: base, static and ReCAST images of one seed
   start from the same noise), decode, save PNGs, score. Each finished chunk is a file in
   ``OUT.parts/``, so a killed run resumes where it stopped and yields the same table.
4. Move the images to ``OUT.images/`` (beside the table) and write the ``recast.eval/1`` table.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import math
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from recast_cli.artifacts import json_loads
from recast_cli.artifacts import (
    EVAL_SCHEMA,
    EvalImage,
    EvalTable,
    Source,
    atomic_write_bytes,
    bad_piece,
    claim_output,
    finish_parts,
    open_parts,
    parts_dir,
    write_eval,
)
from recast_cli.artifacts.evaluation import IMAGE_SHA256, SHA256
from recast_cli.artifacts.run import MADE_FROM, MADE_FROM_VALUES, SETTING_CHANGES
from recast_cli import bounds
from recast_cli.errors import BadInput
from recast_cli.evaluate.config import EvalConfig, config_from_setting
from recast_cli.evaluate.target import Target, resolve_target
from recast_cli.policy.families import FAMILIES
from recast_cli.seeds import IMAGE_STRIDE, image_seed


@dataclass(frozen=True)
class EvalPlan:
    """Everything resolved and checked before anything is written."""

    target: Target
    cfg: EvalConfig
    prompts: list[str]
    rewards: tuple[str, ...]
    lam: tuple[float, ...]
    options: dict[str, dict[str, Any]]  # scorer name → build options
    out: Path
    device: str | None

    @property
    def scorers(self) -> list[tuple[str, str]]:
        """(name, kind) of every scorer: the training rewards first, then the judges."""
        return [(r, "reward") for r in self.rewards] + [(j, "judge") for j in self.cfg.judges]


def images_dir(out: Path) -> Path:
    """``E.parquet`` → ``E.images/``, beside the table."""
    return out.with_name(f"{out.stem}.images")


# ------------------------------------------------------------------ 1. resolve


def parse_judges(text: str) -> tuple[str, ...]:
    """``--judges a,b`` → ("a", "b"); an empty string means no judges."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def run_evaluation(run: Path | None, setting: str | None, out: Path, *, checkpoint: int | None = None,
                   checkpoints: str | None = None, sampler: str | None = None, judges: str | None = None,
                   n: int | None = None, seed: int | None = None, batch_size: int | None = None,
                   device: str | None = None, quiet: bool = False,
                   allow_setting_change: bool = False) -> tuple[Any, Any]:
    """``recast evaluate``, the one entry its command calls: the target (``--run`` or ``--setting``)
    resolved once (a run's setting edited since it trained refused unless ``allow_setting_change``), then
    the images of an image policy (:func:`plan_evaluation`, :func:`evaluate`), or the 1-D world's reward
    curves (``evaluate/curve``). Returns the plan and the table written: an (``EvalPlan``, ``EvalTable``),
    or a (``CurvePlan``, ``CurveTable``)."""
    target = resolve_target(run, setting, checkpoint, allow_setting_change=allow_setting_change)
    if target.setting.policy.kind == "flow1d":
        from recast_cli.evaluate.curve import evaluate_curve, plan_curve

        if checkpoint is not None and checkpoints is not None:
            raise BadInput("give --checkpoint STEP or --checkpoints LIST, not both")
        if judges or device not in (None, "cpu"):
            raise BadInput("the 1-D world has no judges and runs on the CPU")
        curve = plan_curve(target, out, checkpoints if checkpoint is None else str(checkpoint), sampler, n=n,
                           seed=seed, batch_size=batch_size)
        return curve, evaluate_curve(curve, quiet=quiet)
    if checkpoints is not None or sampler is not None:
        raise BadInput("--checkpoints and --sampler apply to the 1-D world (flow1d settings)")
    plan = plan_evaluation(target, out, judges=None if judges is None else parse_judges(judges), n=n, seed=seed,
                           batch_size=batch_size, device=device)
    return plan, evaluate(plan, quiet=quiet)


def plan_evaluation(target: Target, out: Path, judges: Sequence[str] | None = None, n: int | None = None,
                    seed: int | None = None, batch_size: int | None = None, device: str | None = None) -> EvalPlan:
    """Check an evaluation of the resolved ``target``; BadInput for anything the user can fix (nothing is
    written)."""
    from recast_cli.setting.prompts import load_prompts
    from recast_cli.rewards.registry import is_known, scorer_names
    from recast_cli.setting.load import check_prompts

    spec = target.setting.policy
    if spec.kind not in FAMILIES:
        raise BadInput(f"setting {target.setting.name!r}: recast evaluate needs an image policy "
                       f"({', '.join(FAMILIES)}), "
                       f"not {spec.kind!r}")
    cfg, train = config_from_setting(target.setting)
    flags = {"judges": None if judges is None else tuple(judges), "n": n, "seed": seed, "batch_size": batch_size}
    cfg = replace(cfg, **{k: v for k, v in flags.items() if v is not None})
    bounds.check_all(("images_per_prompt", "--n", cfg.n), ("seed", "--seed", cfg.seed),
                     ("batch", "--batch-size", cfg.batch_size))
    if device not in (None, "cpu", "cuda") and not str(device).startswith("cuda:"):
        raise BadInput(f"--device must be cpu or cuda, got {device!r}")
    if target.run_record is not None:
        rewards = target.run_record.rewards
        lam = tuple(float(x) for x in target.run_record.lam)
    else:
        rewards, lam = tuple(train.rewards), tuple(float(x) for x in train.lam)
    if len(lam) != len(rewards):
        raise BadInput(f"{target.setting.file}: lambda has {len(lam)} values for {len(rewards)} rewards")
    for name in (*rewards, *cfg.judges):
        if not is_known(name):
            raise BadInput(f"unknown scorer {name!r}; known: {', '.join(scorer_names())}")
    labels = [_label(name) for name in (*rewards, *cfg.judges)]
    if len(set(labels)) != len(labels):
        twice = next(x for x in labels if labels.count(x) > 1)
        raise BadInput(f"scorer {twice!r} is named twice (a judge that is also a training reward, or a repeat)")
    if not labels:
        raise BadInput(f"{target.setting.file}: nothing to score (no [train] rewards and no judges)")
    prompts, _ = load_prompts(cfg.prompts)
    check_prompts(spec, prompts)
    options = {name: with_device(name, dict(train.reward_options.get(name, {})), device)
               for name in (*rewards, *cfg.judges)}
    claim_output(out, EVAL_SCHEMA)
    for folder in (images_dir(out), parts_dir(out)):
        if folder.exists() and not folder.is_dir():
            raise BadInput(f"cannot write {folder}: it is a file")
    check_images_folder(images_dir(out))
    return EvalPlan(target, cfg, prompts, rewards, lam, options, out, device)


#: The files ``recast evaluate`` writes under OUT.images/: PPPPP/KKK.png.
IMAGE_FILE = re.compile(r"\d{5}/\d{3}\.png")


def check_images_folder(folder: Path) -> None:
    """An existing OUT.images/ is replaced by a finished evaluation: BadInput unless every file in it
    is one recast evaluate writes (PPPPP/KKK.png), so nothing recast did not write is deleted."""
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_dir() and re.fullmatch(r"\d{5}", rel):
            continue
        if not (path.is_file() and IMAGE_FILE.fullmatch(rel)):
            raise BadInput(f"{folder} holds {rel}, which recast evaluate did not write; it would be replaced: "
                           "choose another --out or clear it yourself")


def _label(name: str) -> str:
    """A scorer's name in the table: ``NAME@URL`` (a remote scorer) is recorded as NAME."""
    return name.split("@", 1)[0]


def with_device(name: str, options: dict[str, Any], device: str | None) -> dict[str, Any]:
    from recast_cli.rewards import scorer_class

    if device is not None and "device" in inspect.signature(scorer_class(name)).parameters:
        options.setdefault("device", device)
    return options


# ------------------------------------------------------------------ 2. build


@dataclass
class EvalWorld:
    policy: Any
    scorers: list  # Scorer, in EvalPlan.scorers order
    adapter: Source | None
    steps: int
    guidance_scale: float


def build_world(plan: EvalPlan) -> EvalWorld:
    """The policy (LoRA applied for a run) and every scorer; releases what was built if a step fails."""
    from recast_cli.rewards import build_scorer
    from recast_cli.setting.load import build_policy

    spec = plan.target.setting.policy
    steps = plan.cfg.steps if plan.cfg.steps is not None else spec.steps
    guidance = plan.cfg.guidance_scale if plan.cfg.guidance_scale is not None else spec.guidance_scale
    policy = build_policy(spec, device=plan.device, steps=steps, guidance_scale=guidance)
    adapter = None
    if plan.target.checkpoint is not None:
        from recast_cli.policy.lora import load_lora_into_policy

        adapter = Source.of(load_lora_into_policy(policy, plan.target.checkpoint))
    scorers = []
    try:
        for name, _ in plan.scorers:
            scorers.append(build_scorer(name, **plan.options[name]))
        for scorer in scorers:
            scorer.check_prompts(plan.prompts)
    except BaseException:
        for scorer in scorers:
            scorer.close()
        raise
    return EvalWorld(policy, scorers, adapter, steps, float(guidance))


def run_id(plan: EvalPlan, world: EvalWorld) -> str:
    """A hash of everything that decides the table: partial results of another evaluation are never mixed in."""
    spec = plan.target.setting.policy
    fixed = {
        "model": str(spec.folder()), "model_files": _model_fingerprint(spec.folder()),
        "precision": spec.precision, "max_sequence_length": spec.max_sequence_length,
        "adapter": world.adapter.sha256 if world.adapter else None,
        "prompts": hashlib.sha256(json.dumps(plan.prompts).encode()).hexdigest(),
        "n": plan.cfg.n, "seed": plan.cfg.seed, "batch_size": plan.cfg.batch_size,
        "steps": world.steps, "guidance_scale": world.guidance_scale, "resolution": world.policy.resolution,
        "scorers": plan.scorers, "options": _public(plan.options), "device": str(world.policy.device.type),
    }
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def _model_fingerprint(folder: Path | None) -> list:
    """(file, size, mtime) of the model's weight files: cheap, and changes when the model is replaced."""
    if folder is None:
        return []
    return [(str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(Path(folder).rglob("*.safetensors"))]


def _public(options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    from recast_cli.rewards.scoring import public_options

    return public_options(options)


# ------------------------------------------------------------------ 3. sample and score


def evaluation_images(plan: EvalPlan) -> list[EvalImage]:
    """Every image of the evaluation in order: prompt-major, ``n`` per prompt."""
    folder = images_dir(plan.out).name
    return [EvalImage(image_id=p * plan.cfg.n + k, prompt_id=p, prompt=prompt,
                      seed=image_seed(plan.cfg.seed, p, k), image_path=f"{folder}/{p:05d}/{k:03d}.png")
            for p, prompt in enumerate(plan.prompts) for k in range(plan.cfg.n)]


def sample_chunk(world: EvalWorld, images: Sequence[EvalImage]) -> list[Image.Image]:
    """Deterministic ODE samples (E1 with noise level 0) from each image's seed, as 8-bit RGB."""
    policy = world.policy
    prompts = [im.prompt for im in images]
    for prompt in dict.fromkeys(prompts):  # one at a time: an embedding must not depend on its batch
        policy.encode_prompts([prompt])
    seeds = torch.tensor([im.seed for im in images], dtype=torch.int64)
    latents = policy.sample(policy.encode_prompts(prompts), 0.0, seeds, keep_log_probs=False).states[:, -1]
    pixels = (policy.decode(latents).float().clamp(0, 1) * 255).round().to(torch.uint8)
    return [Image.fromarray(p.permute(1, 2, 0).cpu().numpy()) for p in pixels]


def score_chunk(plan: EvalPlan, world: EvalWorld, pictures: list[Image.Image], prompts: list[str]) -> dict[str, list[float]]:
    """Every scorer on the saved (8-bit) images: the scores can be recomputed from the PNG files."""
    out = {}
    for (name, _), scorer in zip(plan.scorers, world.scorers):
        values = np.asarray(scorer.score(pictures, prompts), dtype=np.float64)
        if values.shape != (len(prompts),) or not np.all(np.isfinite(values)):
            raise RuntimeError(f"scorer {name} returned {values.shape} values or non-finite scores")
        out[_label(name)] = values.tolist()
    return out


def evaluate(plan: EvalPlan, quiet: bool = False) -> EvalTable:
    """Steps 2-4: the whole evaluation, resumable through ``OUT.parts/``; returns the table written."""
    world = build_world(plan)
    try:
        return _evaluate(plan, world, quiet)
    finally:
        for scorer in world.scorers:
            scorer.close()


def _evaluate(plan: EvalPlan, world: EvalWorld, quiet: bool) -> EvalTable:
    parts = parts_dir(plan.out)
    staged = parts / "images"
    rid = run_id(plan, world)
    lock = open_parts(plan.out, rid, {"out": str(plan.out)}, pieces="chunk-*.json",
                      writer="another recast evaluate", what="evaluation")  # released when this returns
    try:
        images = evaluation_images(plan)
        size = plan.cfg.batch_size
        chunks = [images[i: i + size] for i in range(0, len(images), size)]

        def chunk_file(c: int) -> Path:
            return parts / f"chunk-{c:06d}.json"

        labels = [_label(name) for name, _ in plan.scorers]
        for c, chunk in enumerate(chunks):  # every finished chunk, before any sampling: a damaged one is named now
            if chunk_file(c).is_file():
                _read_chunk(chunk_file(c), chunk, labels)
        from rich.console import Console

        columns = [TextColumn("evaluate"), BarColumn(), MofNCompleteColumn(), TextColumn("images"),
                   TimeRemainingColumn()]
        with Progress(*columns, console=Console(stderr=True), disable=quiet) as progress:
            task = progress.add_task("evaluate", total=len(images))
            for c, chunk in enumerate(chunks):
                if chunk_file(c).is_file():
                    progress.advance(task, len(chunk))
                    continue
                pictures = sample_chunk(world, chunk)
                hashes = [_save_png(picture, staged / Path(im.image_path).relative_to(images_dir(plan.out).name))
                          for im, picture in zip(chunk, pictures)]
                scores = score_chunk(plan, world, pictures, [im.prompt for im in chunk])
                # written last: a chunk counts as done only with its images and every score on disk
                atomic_write_bytes(chunk_file(c), json.dumps({"image_ids": [im.image_id for im in chunk],
                                                              "scores": scores, "sha256": hashes}).encode())
                progress.advance(task, len(chunk))
        rows, hashes = [], []
        for c, chunk in enumerate(chunks):
            done, digests = _read_chunk(chunk_file(c), chunk, labels)
            rows.extend(done.T)
            hashes.extend(digests)
        table = EvalTable(images=tuple(images), scorers=tuple(labels), kinds=tuple(k for _, k in plan.scorers),
                          scores=np.stack(rows), meta={**_metadata(plan, world, rid), IMAGE_SHA256: hashes})
        final = images_dir(plan.out)
        if staged.is_dir():  # a rerun after a crash past this point finds the images already moved
            if final.exists():
                check_images_folder(final)  # again: files may have been added while the evaluation ran
                shutil.rmtree(final)
            os.replace(staged, final)
        write_eval(plan.out, table, config=_config(plan, world), sources=_sources(plan, world))
        finish_parts(plan.out, [chunk_file(c).name for c in range(len(chunks))])
    finally:
        lock.release()
    return table


def _save_png(picture: Image.Image, path: Path) -> str:
    """Save an evaluated image as PNG at ``path``; its sha256 (recorded: ``--add-judges`` checks it)."""
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def _read_chunk(path: Path, chunk: Sequence[EvalImage], labels: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """A finished chunk's scores [scorer, image] and its images' sha256 from OUT.parts/, or BadInput naming
    the file: unreadable (truncated) JSON, other images than the chunk's, not one number per image for every
    scorer, or not one sha256 per image (a chunk of an older recast: delete it)."""
    try:
        done = json_loads(path.read_bytes().decode("utf-8"), str(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_piece(path, f"not readable JSON: {exc}") from None
    scores = done.get("scores") if isinstance(done, dict) else None
    if not isinstance(done, dict) or done.get("image_ids") != [im.image_id for im in chunk]:
        raise bad_piece(path, "it names other images than this chunk of the evaluation")
    if not isinstance(scores, dict) or any(
            not isinstance(scores.get(label), list) or len(scores[label]) != len(chunk)
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                       for x in scores[label])
            for label in labels):
        raise bad_piece(path, f"it does not hold {len(chunk)} scores for each of {', '.join(labels)}")
    hashes = done.get("sha256")
    if not isinstance(hashes, list) or len(hashes) != len(chunk) or not all(
            isinstance(h, str) and SHA256.fullmatch(h) for h in hashes):
        raise bad_piece(path, f"it does not hold the sha256 of each of its {len(chunk)} images")
    return np.array([scores[label] for label in labels], dtype=np.float64), hashes


# ------------------------------------------------------------------ 4. the record


def _metadata(plan: EvalPlan, world: EvalWorld, rid: str) -> dict[str, Any]:
    from recast_cli.setting.load import policy_inputs, policy_values

    target = plan.target
    config = target.run_record.config if target.run_record is not None else {}
    checkpoint = None
    if target.checkpoint is not None:
        checkpoint = {"path": str(target.checkpoint), "step": target.step, "adapter_sha256": world.adapter.sha256}
    return {
        "setting": {"path": str(target.setting.file), "name": target.setting.name},
        "mode": target.mode,
        "run": str(target.run) if target.run is not None else None,
        "train_seed": config.get("train", {}).get("seed") if target.run is not None else None,
        "lambda": list(plan.lam),
        "rewards": [_label(r) for r in plan.rewards],
        "judges": [_label(j) for j in plan.cfg.judges],
        "weights_key": config.get("weights_key") if target.run is not None else None,
        "sigmas": list(target.run_record.sigmas) if target.run is not None else None,
        "checkpoint": checkpoint,
        "sampling": {"steps": world.steps, "guidance_scale": world.guidance_scale,
                     "resolution": world.policy.resolution, "n": plan.cfg.n, "seed": plan.cfg.seed,
                     "noise_level": 0.0, "seed_rule": f"seed + {IMAGE_STRIDE}·prompt_id + k"},
        "prompts_source": plan.cfg.prompts,
        "run_id": rid,
        # what the images were made with: --add-judges refuses the setting edited since (artifacts.run)
        MADE_FROM: policy_inputs(target.setting), MADE_FROM_VALUES: policy_values(target.setting),
    }


def _config(plan: EvalPlan, world: EvalWorld) -> dict[str, Any]:
    cfg = asdict(plan.cfg)
    cfg.update(steps=world.steps, guidance_scale=world.guidance_scale)
    return {"evaluate": cfg, "scorers": [{"name": _label(n), "kind": k} for n, k in plan.scorers],
            "options": _public(plan.options), "device": str(world.policy.device),
            SETTING_CHANGES: list(plan.target.setting_changes)}


def _sources(plan: EvalPlan, world: EvalWorld) -> list[Source]:
    sources = [Source.of(plan.target.setting.file)]
    if plan.target.run is not None:
        sources.append(Source.of(plan.target.run / "run.json"))
    if world.adapter is not None:
        sources.append(world.adapter)
    if plan.cfg.prompts != "toy":
        sources.append(Source.of(plan.cfg.prompts))
    return sources
