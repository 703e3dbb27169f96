"""What every diffusers image policy shares: loading a local pipeline folder, precision and
device, the pixel and latent geometry, the σ grid and the prompt cache.

A family (``sd3``, ``flux``, ``qwenimage``) names its pipeline class and its components and
implements the model call (``velocity``), prompt encoding and the latent ↔ image maps; the
sampler (E1 steps, mixed-t rollouts, trajectories) is ``FlowPolicy``'s. Latents are held in
the VAE's own layout ``[C, h, w]`` in every family (FLUX and Qwen-Image pack 2 × 2 patches into
tokens inside ``velocity`` only: packing permutes elements, so E1's Gaussian and its
log-probability are the same in either layout).

The text encoders may live on the host between encodes (``offload_text_encoders``): they are
moved to the policy's device to encode the prompts the cache does not hold yet, and back. The
rule when a setting leaves it unset is :func:`offload_by_default`.

The grid is the one the family's diffusers pipeline samples on, taken from the scheduler
itself (``grid``), so it needs the scheduler config and the image size only: ``folder_grid``
gives it without loading any weights (``recast train`` checks W against it before loading).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from recast_cli.policy.base import FlowPolicy

PRECISIONS = {"no": torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: where offloaded text encoders wait between encodes
HOST = torch.device("cpu")


def text_encoders(pipe) -> dict[str, torch.nn.Module]:
    """The pipeline's text encoders (``text_encoder``, ``text_encoder_2``, ``text_encoder_3``: those present)."""
    return {name: module for name, module in pipe.components.items()
            if name.startswith("text_encoder") and isinstance(module, torch.nn.Module)}


def offload_by_default(pipe, trainable: int) -> bool:
    """``[policy] offload_text_encoders`` left unset: offload when the text encoders hold more parameters
    than the transformer trains (``trainable``: its LoRA parameters, all of its parameters when it is
    trained in full, 0 when nothing is trained). What offloading saves on the device is the encoders'
    weights; where they outweigh the trained state (SD3.5-Medium: 5.6 B encoder parameters against
    19 M of LoRA r = 32, or 2.2 B trained in full), that saving is the larger one."""
    return sum(p.numel() for m in text_encoders(pipe).values() for p in m.parameters()) > trainable


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise BadInput(f"{path} is missing or not valid JSON") from None
    if not isinstance(value, dict):
        raise BadInput(f"{path} is not a JSON object")
    return value


def dynamic_mu(tokens: int, config: dict[str, Any]) -> float:
    """μ of the dynamic time shift for ``tokens`` image tokens, as the FLUX / Qwen-Image pipelines set it
    (diffusers' ``calculate_shift`` with the scheduler config's sequence lengths and shifts)."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    return calculate_shift(tokens, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                           config.get("base_shift", 0.5), config.get("max_shift", 1.15))


class PipelinePolicy(FlowPolicy):
    """A diffusers text-to-image flow pipeline as a policy (subclasses: one per family)."""

    FAMILY: ClassVar[str]
    PIPELINE: ClassVar[str]  # the diffusers class; a folder's model_index.json must name one of this prefix
    REQUIRED_COMPONENTS: ClassVar[tuple[str, ...]]
    OPTIONAL_COMPONENTS: ClassVar[tuple[str, ...]] = ()
    #: how the transformer sees the latent: a packing of PACK × PACK patches into tokens (1: the transformer patches)
    PACK: ClassVar[int] = 2

    def __init__(self, pipe, steps: int, guidance_scale: float, resolution: int | None = None,
                 max_sequence_length: int = 256, precision: str = "auto", device: str | torch.device | None = None,
                 offload_text_encoders: bool = False):
        if steps < 1:
            raise BadInput(f"steps must be at least 1, got {steps}")
        if guidance_scale < 0:
            raise BadInput(f"guidance scale must be >= 0, got {guidance_scale}")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if precision == "auto":
            precision = "bf16" if device.type == "cuda" else "no"
        if precision not in PRECISIONS:
            raise BadInput(f"precision must be one of auto, {', '.join(PRECISIONS)}; got {precision!r}")
        if device.type == "cpu" and precision not in ("no", "fp32"):
            raise BadInput("mixed precision needs a CUDA device; use precision 'no' on the CPU")
        self.pipe = pipe
        self._device = device
        self.offload_text_encoders = offload_text_encoders
        self._on_device = 0  # depth of text_encoders_on_device
        encoders = text_encoders(pipe)
        for name, module in pipe.components.items():  # offloaded encoders never visit the device here
            if isinstance(module, torch.nn.Module):
                module.to(HOST if offload_text_encoders and name in encoders else device)
        self.autocast_dtype = PRECISIONS[precision]
        self.guidance_scale = float(guidance_scale)
        self.max_sequence_length = max_sequence_length
        vae, transformer = dict(pipe.vae.config), dict(pipe.transformer.config)
        self.resolution = self.check_resolution(resolution, vae, transformer)
        self.vae_scale = self.vae_scale_factor(vae)
        side = self.resolution // self.vae_scale
        self._latent_shape = (self.latent_channels(transformer, vae), side, side)
        sigmas, self.grid_spec = self.grid(pipe.scheduler, steps, self.tokens(self.resolution, vae))
        self.sigmas = torch.from_numpy(sigmas)
        self._cache: dict[str, Any] = {}
        #: the module ``velocity`` calls: the transformer, or the trainer's (DDP-)wrapped copy of it
        self.denoiser = self.pipe.transformer
        for module in self.pipe.components.values():
            if isinstance(module, torch.nn.Module):
                module.eval()
                module.requires_grad_(False)

    # ------------------------------------------------------------------ the family's geometry (configs only)

    @classmethod
    def vae_scale_factor(cls, vae: dict[str, Any]) -> int:
        """Pixels per latent cell (SD3 / FLUX: 2^(levels − 1) of the VAE)."""
        return 2 ** (len(vae.get("block_out_channels") or [0]) - 1)

    @classmethod
    def latent_channels(cls, transformer: dict[str, Any], vae: dict[str, Any]) -> int:
        """Channels of the latent the VAE makes (the transformer sees PACK² of them per token)."""
        return int(transformer["in_channels"]) // cls.PACK ** 2

    @classmethod
    def patch(cls, transformer: dict[str, Any]) -> int:
        """Latent cells per token side (the packing, or the transformer's own patch size)."""
        return cls.PACK if cls.PACK > 1 else int(transformer.get("patch_size") or 1)

    @classmethod
    def default_sample_size(cls, transformer: dict[str, Any]) -> int:
        """Latent cells per side when the setting names no resolution (the pipeline's default)."""
        return 128

    @classmethod
    def check_resolution(cls, resolution: int | None, vae: dict[str, Any], transformer: dict[str, Any]) -> int:
        step = cls.vae_scale_factor(vae) * cls.patch(transformer)
        size = resolution or cls.default_sample_size(transformer) * cls.vae_scale_factor(vae)
        if size < step or size % step:
            raise BadInput(f"resolution {size} is not a positive multiple of {step} (VAE scale x patch size)")
        return size

    @classmethod
    def tokens(cls, resolution: int, vae: dict[str, Any]) -> int:
        """Image tokens the transformer sees at ``resolution`` (μ of a dynamic grid grows with them)."""
        return (resolution // cls.vae_scale_factor(vae) // 2) ** 2

    @classmethod
    def grid(cls, scheduler, steps: int, tokens: int) -> tuple[np.ndarray, GridSpec]:
        """σ_0 … σ_T (float64) of the family's pipeline on ``steps`` steps, and its grid family.

        FLUX and Qwen-Image: ``set_timesteps(sigmas=linspace(1, 1/T, T), mu)`` with μ from the
        token count where the scheduler shifts dynamically (``GridSpec`` kind ``dynamic``).
        """
        config = dict(scheduler.config)
        mu = dynamic_mu(tokens, config) if config.get("use_dynamic_shifting") else None
        spec = GridSpec("dynamic", shift=float(config.get("shift", 1.0)), mu=mu,
                        time_shift=config.get("time_shift_type", "exponential"),
                        shift_terminal=config.get("shift_terminal") or None,
                        num_train_timesteps=int(config.get("num_train_timesteps", 1000)))
        spec.sigmas(steps)  # BadInput for a grid diffusers cannot build (T = 1 with a terminal stretch)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        return scheduler.sigmas.detach().to("cpu", torch.float64).flip(0).numpy(), spec

    @classmethod
    def folder_grid(cls, folder: str | Path, steps: int, resolution: int | None) -> tuple[np.ndarray, GridSpec]:
        """The grid of a model folder from its configs alone (no weights loaded)."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        path = cls.check_folder(folder)
        vae, transformer = read_json(path / "vae" / "config.json"), read_json(path / "transformer" / "config.json")
        size = cls.check_resolution(resolution, vae, transformer)
        scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler", local_files_only=True)
        return cls.grid(scheduler, steps, cls.tokens(size, vae))

    # ------------------------------------------------------------------ loading

    @classmethod
    def check_folder(cls, folder: str | Path) -> Path:
        """BadInput naming what is missing unless ``folder`` holds this family's pipeline in diffusers layout."""
        path = Path(folder)
        if not path.is_dir():
            raise BadInput(f"model folder {path} does not exist")
        index_file = path / "model_index.json"
        if not index_file.is_file():
            raise BadInput(f"{path} is not a diffusers model folder (no model_index.json)")
        index = read_json(index_file)
        name = str(index.get("_class_name", ""))
        prefix = cls.PIPELINE.removesuffix("Pipeline")
        if name and not name.startswith(prefix):
            raise BadInput(f"{path} holds a {name}; a {cls.FAMILY} policy needs a {cls.PIPELINE} folder "
                           "([policy] kind names the family)")
        for part in cls.REQUIRED_COMPONENTS:
            entry = index.get(part)
            if not entry or entry[0] is None:
                raise BadInput(f"{path}: model_index.json names no {part!r} component")
            if not (path / part).is_dir():
                raise BadInput(f"{path}: component folder {part}/ is missing")
        for part in cls.OPTIONAL_COMPONENTS:
            entry = index.get(part)
            if entry and entry[0] is not None and not (path / part).is_dir():
                raise BadInput(f"{path}: model_index.json names {part!r} but {part}/ is missing")
        return path

    @classmethod
    def from_pretrained(cls, folder: str | Path, steps: int, guidance_scale: float, resolution: int | None = None,
                        max_sequence_length: int = 256, precision: str = "auto",
                        device: str | torch.device | None = None, offload_text_encoders: bool | None = None,
                        trainable: Callable[[torch.nn.Module], int] | None = None) -> PipelinePolicy:
        """Load the family's pipeline from a local folder, with no network access.

        ``offload_text_encoders`` None: :func:`offload_by_default`, with ``trainable(transformer)``
        the parameters the caller will train (None: it trains none).
        """
        import diffusers
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging

        for lib in (diffusers_logging, transformers_logging):
            lib.set_verbosity_error()  # load reports and tokenizer truncation notes are noise here
            lib.disable_progress_bar()
        path = cls.check_folder(folder)
        index = read_json(path / "model_index.json")
        extra = {name: None for name in cls.OPTIONAL_COMPONENTS if not (index.get(name) or [None])[0]}
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        load_dtype = torch.float32 if dev.type == "cpu" else PRECISIONS.get(
            "bf16" if precision == "auto" else precision, torch.float32)
        try:
            pipe = getattr(diffusers, cls.PIPELINE).from_pretrained(path, dtype=load_dtype, local_files_only=True,
                                                                     **extra)
        except (OSError, ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInput(f"cannot load the {cls.FAMILY} pipeline from {path}: {first}") from None
        pipe.set_progress_bar_config(disable=True)
        if offload_text_encoders is None:
            offload_text_encoders = offload_by_default(pipe, trainable(pipe.transformer) if trainable else 0)
        return cls(pipe, steps, guidance_scale, resolution, max_sequence_length, precision, dev,
                   offload_text_encoders=offload_text_encoders)

    # ------------------------------------------------------------------ protocol

    @property
    def network(self) -> torch.nn.Module:
        """The network the trainer updates (LoRA or in full): the transformer, unwrapped."""
        return self.pipe.transformer

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return self._latent_shape

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.autocast_dtype,
                              enabled=self.autocast_dtype != torch.float32)

    @contextmanager
    def text_encoders_on_device(self) -> Iterator[None]:
        """The text encoders on the policy's device inside the block; offloaded ones go back to the host after it."""
        move = self.offload_text_encoders and self._on_device == 0
        if move:
            for module in text_encoders(self.pipe).values():
                module.to(self.device)
        self._on_device += 1
        try:
            yield
        finally:
            self._on_device -= 1
            if move:
                for module in text_encoders(self.pipe).values():
                    module.to(HOST)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]):
        """Conditioning per prompt, cached by prompt text (``encode_missing`` encodes the new ones, with the
        text encoders on the device)."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self._cache]
        if missing:
            with self.text_encoders_on_device():
                self._cache.update(zip(missing, self.encode_missing(missing)))
        return self.join([self._cache[p] for p in prompts])

    def encode_missing(self, prompts: list[str]) -> list[Any]:
        """One single-row conditioning per prompt."""
        raise NotImplementedError

    def join(self, parts: list[Any]):
        """Single-row conditionings → one batch conditioning."""
        raise NotImplementedError

    # ------------------------------------------------------------------ latents ↔ images (AutoencoderKL: SD3, FLUX)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents → images in [0, 1]: undo the VAE's scaling and shift, decode."""
        vae = self.pipe.vae
        z = latents / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        images = vae.decode(z.to(vae.dtype), return_dict=False)[0]
        return ((images.float() + 1) / 2).clamp(0, 1)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] → latents: the posterior mean, shifted and scaled."""
        vae = self.pipe.vae
        dist = vae.encode((images.to(self.device, vae.dtype) * 2 - 1)).latent_dist
        return (dist.mean.float() - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor

    # ------------------------------------------------------------------ 2 × 2 token packing (FLUX, Qwen-Image)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, h, w] → [B, (h/2)(w/2), 4C], the pipelines' ``_pack_latents``."""
        b, c, h, w = x.shape
        return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)

    def unpack(self, tokens: torch.Tensor) -> torch.Tensor:
        """The inverse of ``pack`` onto this policy's latent shape."""
        c, h, w = self._latent_shape
        b = tokens.shape[0]
        return tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
