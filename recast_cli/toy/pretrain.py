"""``recast toy pretrain``: train the toy world's tiny SD3-architecture model on renderer images.

Top to bottom, resumable at every checkpoint:
1. build the tiny pipeline (random init from the seed; the two CLIP text encoders stay at
   their random init — distinct prompts still get distinct embeddings, which is all the
   conditioning needs);
2. train the VAE as an autoencoder on renderer images (L2 + a small KL), then set its
   ``shift_factor`` / ``scaling_factor`` from the latent statistics, as SD3 did;
3. train the transformer by rectified-flow matching on the VAE latents: σ ~ logit-normal
   (SD3), target v = ε − x_0, prompts dropped to "" 10% of the time so CFG works; an EMA of
   the weights is what gets saved;
4. write the diffusers folder atomically and ``PROVENANCE.json`` (command, seed, data, losses).

Data are the renderer's images, deterministic from (seed, step): batch b of stage s uses
prompts drawn by ``numpy.random.default_rng([seed, s, b])`` and renderer seeds from the same
generator, so a resumed run sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import copy
import json
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from safetensors.torch import load_file, save_file

from recast_cli import __version__
from recast_cli.artifacts import sha256_file
from recast_cli.toy import renderer
from recast_cli.toy.model import IMAGE_SIZE, build_pipeline, save_pipeline

CFG_DROPOUT = 0.1
#: the T5 slot holds zeros in the toy model; its length is part of the conditioning the model saw
MAX_SEQUENCE_LENGTH = 1
EMA_DECAY = 0.999


@dataclass(frozen=True)
class PretrainConfig:
    seed: int = 0
    vae_steps: int = 1000
    steps: int = 8000
    batch: int = 48
    vae_lr: float = 1e-3
    lr: float = 5e-4
    kl_weight: float = 1e-6
    checkpoint_every: int = 250
    image_size: int = IMAGE_SIZE


def toy_words() -> list[str]:
    """The tokenizer's vocabulary: every word of the toy prompts."""
    return sorted({w for p in renderer.all_prompts() for w in p.split()})


def _batch(cfg: PretrainConfig, stage: int, index: int) -> tuple[list[str], torch.Tensor]:
    rng = np.random.default_rng([cfg.seed, stage, index])
    prompts = renderer.all_prompts()
    chosen = [prompts[i] for i in rng.integers(0, len(prompts), cfg.batch)]
    seeds = rng.integers(0, 2**31 - 1, cfg.batch).tolist()
    return chosen, renderer.render_batch(chosen, seeds, cfg.image_size)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}"), TimeElapsedColumn(), TimeRemainingColumn())


def _log(work: Path, stage: str, step: int, total: int, losses: list[float]) -> None:
    """One line per checkpoint in WORK/progress.log, for runs without a terminal."""
    from recast_cli.artifacts.regular import open_append

    with open_append(work / "progress.log", "the progress log", text=True) as fh:
        fh.write(f"{time.strftime('%H:%M:%S')} {stage} {step}/{total} loss {np.mean(losses[-100:]):.4f}\n")


class _Checkpoint:
    """Model + optimizer (+ EMA) state in safetensors, progress in JSON; written atomically."""

    def __init__(self, work: Path, stage: str):
        self.dir = work / stage

    def load(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, ema: torch.nn.Module | None) -> dict:
        meta_file = self.dir / "state.json"
        if not meta_file.is_file():
            return {"step": 0, "losses": []}
        meta = json.loads(meta_file.read_text())
        module.load_state_dict(load_file(self.dir / "model.safetensors"))
        if ema is not None:
            ema.load_state_dict(load_file(self.dir / "ema.safetensors"))
        opt = load_file(self.dir / "optimizer.safetensors")
        state = optimizer.state_dict()
        for idx, group_state in enumerate(meta["optimizer_steps"]):
            state["state"][idx] = {"step": torch.tensor(float(group_state)),
                                   "exp_avg": opt[f"{idx}.exp_avg"], "exp_avg_sq": opt[f"{idx}.exp_avg_sq"]}
        optimizer.load_state_dict(state)
        torch.set_rng_state(torch.frombuffer(bytearray.fromhex(meta["torch_rng"]), dtype=torch.uint8).clone())
        return meta

    def save(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, ema: torch.nn.Module | None,
             meta: dict) -> None:
        tmp = Path(tempfile.mkdtemp(dir=self.dir.parent, prefix=f".{self.dir.name}."))
        save_file({k: v.contiguous() for k, v in module.state_dict().items()}, tmp / "model.safetensors")
        if ema is not None:
            save_file({k: v.contiguous() for k, v in ema.state_dict().items()}, tmp / "ema.safetensors")
        opt_state = optimizer.state_dict()["state"]
        tensors, steps = {}, []
        for idx in range(len(opt_state)):
            tensors[f"{idx}.exp_avg"] = opt_state[idx]["exp_avg"].contiguous()
            tensors[f"{idx}.exp_avg_sq"] = opt_state[idx]["exp_avg_sq"].contiguous()
            steps.append(float(opt_state[idx]["step"]))
        save_file(tensors, tmp / "optimizer.safetensors")
        meta = {**meta, "optimizer_steps": steps, "torch_rng": torch.get_rng_state().numpy().tobytes().hex()}
        (tmp / "state.json").write_text(json.dumps(meta))
        old = self.dir.with_name(self.dir.name + ".old")
        if self.dir.exists():
            self.dir.rename(old)
        tmp.rename(self.dir)
        shutil.rmtree(old, ignore_errors=True)


def _train_vae(pipe, cfg: PretrainConfig, work: Path) -> list[float]:
    vae = pipe.vae.train().requires_grad_(True)
    optimizer = torch.optim.Adam(vae.parameters(), lr=cfg.vae_lr)
    ckpt = _Checkpoint(work, "vae")
    meta = ckpt.load(vae, optimizer, None)
    losses = meta["losses"]
    with _progress() as progress:
        task = progress.add_task("VAE", total=cfg.vae_steps, completed=meta["step"], loss=losses[-1] if losses else 0)
        for step in range(meta["step"], cfg.vae_steps):
            _, images = _batch(cfg, 0, step)
            x = images * 2 - 1
            dist = vae.encode(x).latent_dist
            recon = vae.decode(dist.sample()).sample
            loss = torch.mean((recon - x) ** 2) + cfg.kl_weight * dist.kl().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            progress.update(task, advance=1, loss=float(np.mean(losses[-50:])))
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.vae_steps:
                ckpt.save(vae, optimizer, None, {"step": step + 1, "losses": losses})
                _log(work, "vae", step + 1, cfg.vae_steps, losses)
    vae.eval().requires_grad_(False)
    return losses


@torch.no_grad()
def _set_latent_scale(pipe, cfg: PretrainConfig) -> dict[str, float]:
    _, images = _batch(cfg, 1, 0)
    latents = pipe.vae.encode(images * 2 - 1).latent_dist.mean
    shift, scale = float(latents.mean()), float(1.0 / latents.std())
    pipe.vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    return {"shift_factor": shift, "scaling_factor": scale}


@torch.no_grad()
def _text_table(pipe) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    prompts = renderer.all_prompts() + [""]
    embeds, _, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, prompt_3=None, device="cpu",
                                              do_classifier_free_guidance=False,
                                              max_sequence_length=MAX_SEQUENCE_LENGTH)
    return {p: (embeds[i], pooled[i]) for i, p in enumerate(prompts)}


def _train_transformer(pipe, cfg: PretrainConfig, work: Path) -> list[float]:
    transformer = pipe.transformer.train().requires_grad_(True)
    ema = copy.deepcopy(transformer).requires_grad_(False)
    optimizer = torch.optim.Adam(transformer.parameters(), lr=cfg.lr)
    ckpt = _Checkpoint(work, "transformer")
    meta = ckpt.load(transformer, optimizer, ema)
    losses = meta["losses"]
    text = _text_table(pipe)
    vae = pipe.vae
    with _progress() as progress:
        task = progress.add_task("flow", total=cfg.steps, completed=meta["step"], loss=losses[-1] if losses else 0)
        for step in range(meta["step"], cfg.steps):
            prompts, images = _batch(cfg, 2, step)
            gen = torch.Generator().manual_seed(int(np.random.default_rng([cfg.seed, 3, step]).integers(2**62)))
            with torch.no_grad():
                x0 = (vae.encode(images * 2 - 1).latent_dist.mean - vae.config.shift_factor) * vae.config.scaling_factor
            drop = torch.rand(len(prompts), generator=gen) < CFG_DROPOUT
            keys = ["" if d else p for p, d in zip(prompts, drop.tolist())]
            embeds = torch.stack([text[k][0] for k in keys])
            pooled = torch.stack([text[k][1] for k in keys])
            sigma = torch.sigmoid(torch.randn(len(prompts), generator=gen))
            eps = torch.randn(x0.shape, generator=gen)
            s = sigma.view(-1, 1, 1, 1)
            x_sigma = (1 - s) * x0 + s * eps
            pred = transformer(hidden_states=x_sigma, timestep=sigma * 1000, encoder_hidden_states=embeds,
                               pooled_projections=pooled, return_dict=False)[0]
            loss = torch.mean((pred - (eps - x0)) ** 2)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
            optimizer.step()
            with torch.no_grad():
                for p_ema, p in zip(ema.parameters(), transformer.parameters()):
                    p_ema.lerp_(p, 1 - EMA_DECAY)
            losses.append(loss.item())
            progress.update(task, advance=1, loss=float(np.mean(losses[-100:])))
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
                ckpt.save(transformer, optimizer, ema, {"step": step + 1, "losses": losses})
                _log(work, "flow", step + 1, cfg.steps, losses)
    transformer.load_state_dict(ema.state_dict())
    transformer.eval().requires_grad_(False)
    return losses


#: What a model folder written by ``recast toy pretrain`` holds (diffusers' layout + the provenance).
MODEL_ENTRIES = {"PROVENANCE.json", "model_index.json", "scheduler", "text_encoder", "text_encoder_2", "tokenizer",
                 "tokenizer_2", "transformer", "vae"}


def check_replaceable(out: Path) -> None:
    """BadInput unless ``out`` is missing, empty, or a model folder this command wrote (its
    PROVENANCE.json names ``recast toy pretrain`` and it holds nothing else): only that is replaced."""
    from recast_cli.errors import BadInput

    if not out.exists():
        return
    if not out.is_dir():
        raise BadInput(f"--out {out} is a file; the model is written as a folder")
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return
    try:
        provenance = json.loads((out / "PROVENANCE.json").read_text())
        ours = str(provenance.get("command", "")).startswith("recast toy pretrain")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        ours = False
    if not ours or not entries <= MODEL_ENTRIES:
        extra = sorted(entries - MODEL_ENTRIES) if ours else []
        why = f"it also holds {', '.join(extra[:3])}" if extra else "it is not a model folder recast toy pretrain wrote"
        raise BadInput(f"--out {out} would be replaced, but {why}; choose another --out or clear it yourself")


def pretrain(out: str | Path, work: str | Path, cfg: PretrainConfig, command: str) -> dict:
    """Run (or resume) the whole pretraining and write the model folder; returns the provenance."""
    out, work = Path(out), Path(work)
    check_replaceable(out)
    work.mkdir(parents=True, exist_ok=True)
    config_file = work / "config.json"
    # Batches are fixed by (seed, stage, index), so only the step counts may change on a resume:
    # a run stopped at step s equals the first s steps of any longer run.
    same = {k: v for k, v in asdict(cfg).items() if k not in ("steps", "vae_steps")}
    if config_file.is_file():
        previous = {k: v for k, v in json.loads(config_file.read_text()).items() if k not in ("steps", "vae_steps")}
        if previous != same:
            from recast_cli.errors import BadInput

            raise BadInput(f"{work} holds a pretraining run with another config; pass another --work or the same flags")
    config_file.write_text(json.dumps(asdict(cfg)))
    torch.manual_seed(cfg.seed)
    start = time.time()
    pipe = build_pipeline(toy_words(), seed=cfg.seed, image_size=cfg.image_size)
    vae_losses = _train_vae(pipe, cfg, work)
    latent_scale = _set_latent_scale(pipe, cfg)
    flow_losses = _train_transformer(pipe, cfg, work)
    tmp = Path(tempfile.mkdtemp(dir=out.parent if out.parent.exists() else None, prefix=f".{out.name}."))
    save_pipeline(pipe, tmp / "model")
    provenance = {
        "command": command,
        "config": asdict(cfg),
        "data": {"renderer": "recast_cli/toy/renderer.py", "renderer_sha256": sha256_file(renderer.__file__),
                 "prompts": renderer.all_prompts(),
                 "batches": "numpy.random.default_rng([seed, stage, index]) picks prompts and renderer seeds"},
        "latent_scale": latent_scale,
        "steps_done": {"vae": len(vae_losses), "flow": len(flow_losses)},
        "final_loss": {"vae": float(np.mean(vae_losses[-100:])), "flow": float(np.mean(flow_losses[-500:]))},
        "wall_time_s_this_run": round(time.time() - start, 1),
        "versions": {"recast": __version__, "torch": torch.__version__, "python": platform.python_version()},
    }
    (tmp / "model" / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    check_replaceable(out)  # again: the folder may have changed during the hours of training
    if out.exists():
        shutil.rmtree(out)
    (tmp / "model").rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return provenance
