"""The image-model families a setting's ``[policy] kind`` may name: one table, :data:`FAMILIES`, read by every
place that needs a fact of a family — its policy class (the setting's loader, check-setting, train's σ grid),
its default guidance (the setting's loader), its tiny builder (``recast tiny-model``), the transformer blocks
FSDP shards one by one (``train/sharding``), and whether ``recast preflight`` builds it (its shipped
configs). A new family is one row here; a kind that is not a row is refused in one line.

Each class (``PipelinePolicy``) loads its diffusers pipeline from a local folder, checks the folder, and
gives its σ grid from the configs alone. Classes and builders are named by module, imported when asked
for: naming a family loads no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from recast_cli.errors import BadInput, shown


@dataclass(frozen=True)
class Family:
    """One image-model family: ``policy`` and ``tiny`` are ``module:name`` (its ``PipelinePolicy`` class; the
    function ``(words, seed) -> pipeline`` that builds its CPU-sized random architecture), ``guidance`` the
    guidance its pipeline uses when a setting names none, ``blocks`` the transformer's repeated blocks (each
    an FSDP unit), ``preflight`` the shipped configs folder ``recast preflight`` builds it from at full
    scale (relative to ``pipelines/``), or None when preflight does not build it yet."""

    kind: str
    policy: str
    guidance: float
    tiny: str
    blocks: tuple[str, ...]
    preflight: str | None = None


#: Every image family, by its ``[policy] kind``.
FAMILIES: dict[str, Family] = {
    "sd3": Family("sd3", "recast_cli.policy.sd3:SD3Policy", 4.5, "recast_cli.policy.tiny:sd3_pipeline",
                  ("transformer_blocks",), "configs/stable-diffusion-3.5-medium"),
    "flux": Family("flux", "recast_cli.policy.flux:FluxPolicy", 3.5, "recast_cli.policy.tiny:flux_pipeline",
                   ("transformer_blocks", "single_transformer_blocks")),
    "qwenimage": Family("qwenimage", "recast_cli.policy.qwenimage:QwenImagePolicy", 4.0,
                        "recast_cli.policy.tiny:qwenimage_pipeline", ("transformer_blocks",)),
}


def image_kinds() -> tuple[str, ...]:
    """The kinds of :data:`FAMILIES`, in the table's order."""
    return tuple(FAMILIES)


def family(kind: str, what: str = "[policy] kind") -> Family:
    """The family ``kind``; BadInput naming ``what`` and every family there is when it is none."""
    found = FAMILIES.get(kind) if isinstance(kind, str) else None
    if found is None:
        raise BadInput(f"{what} must be one of {', '.join(FAMILIES)} (the image-model families), got {shown(kind)}")
    return found


def load(reference: str) -> Any:
    """The object a ``module:name`` reference of the table names (imported now)."""
    module, name = reference.split(":")
    return getattr(import_module(module), name)


def policy_class(kind: str):
    """The ``PipelinePolicy`` subclass of an image family."""
    return load(family(kind).policy)
