"""Source ``renderer``: the toy world's procedural renderer as the π⁺ "strong generator" (docs/method.md §4, E2)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from recast_cli.positives.collect import Job, Outcome, PositiveSource
from recast_cli.toy.renderer import parse_prompt, render


class RendererSource(PositiveSource):
    """Renders each toy prompt at the target resolution; image (p, s) uses the job's seed."""

    name = "renderer"

    def __init__(self, resolution: int):
        self.resolution = resolution

    def identity(self) -> dict[str, Any]:
        return {"kind": "renderer"}

    def prepare(self, prompts: Sequence[str], n: int) -> None:
        for prompt in prompts:
            parse_prompt(prompt)

    def produce(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        for job in jobs:
            yield Outcome(job, image=render(job.prompt, job.seed, self.resolution), seed=job.seed)
