"""Source ``diffusers:PATH``: any local diffusers text-to-image pipeline as the strong generator.

docs/method.md §4, "Positive samples": a stronger model's images stand in for π⁺ (E2). The folder is
loaded with ``DiffusionPipeline.from_pretrained(PATH, local_files_only=True)`` (nothing is
downloaded), called in batches with one ``torch.Generator`` per image seeded by the job's seed,
so every image is reproducible alone from the seed in the manifest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.positives.collect import Job, Outcome, PositiveSource


class DiffusersSource(PositiveSource):
    name = "diffusers"

    def __init__(self, path: str | Path, steps: int | None = None, guidance_scale: float | None = None,
                 batch: int = 8, device: str | None = None):
        self.path = Path(path)
        self.steps = steps
        self.guidance_scale = guidance_scale
        self.batch = batch
        self.device = device

    def identity(self) -> dict[str, Any]:
        return {"kind": "diffusers", "path": str(self.path.resolve()), "steps": self.steps, "cfg": self.guidance_scale}

    def prepare(self, prompts: Sequence[str], n: int) -> None:
        index = self.path / "model_index.json"
        if not index.is_file():
            raise BadInput(f"diffusers source {self.path} is not a diffusers pipeline folder (no model_index.json)")
        try:
            json.loads(index.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise BadInput(f"diffusers source: {index} is not valid JSON") from None
        if self.steps is not None and self.steps < 1:
            raise BadInput(f"--steps must be at least 1, got {self.steps}")

    def _load(self):
        import torch
        from diffusers import DiffusionPipeline
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging

        for lib in (diffusers_logging, transformers_logging):
            lib.set_verbosity_error()  # load reports are noise next to our progress bar
            lib.disable_progress_bar()
        index = json.loads((self.path / "model_index.json").read_text())
        # Components saved as None (e.g. SD3 without T5) must be passed as None explicitly.
        absent = {k: None for k, v in index.items() if isinstance(v, list) and v and v[0] is None}
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        try:
            pipe = DiffusionPipeline.from_pretrained(self.path, dtype=dtype, local_files_only=True, **absent)
        except (OSError, ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInput(f"cannot load the diffusers pipeline {self.path}: {first}") from None
        pipe.set_progress_bar_config(disable=True)
        return pipe.to(device)

    def produce(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        import torch

        if not jobs:
            return
        pipe = self._load()
        options: dict[str, Any] = {"output_type": "pil"}
        if self.steps is not None:
            options["num_inference_steps"] = self.steps
        if self.guidance_scale is not None:
            options["guidance_scale"] = self.guidance_scale
        for start in range(0, len(jobs), self.batch):
            chunk = jobs[start : start + self.batch]
            generators = [torch.Generator().manual_seed(job.seed) for job in chunk]
            with torch.no_grad():
                images = pipe(prompt=[job.prompt for job in chunk], generator=generators, **options).images
            for job, image in zip(chunk, images):
                yield Outcome(job, image=image, seed=job.seed)
