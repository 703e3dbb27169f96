"""The image-model families a setting's ``[policy] kind`` may name, and their policy classes.

Each class (``PipelinePolicy``) loads its diffusers pipeline from a local folder, checks the
folder, and gives its σ grid from the configs alone. Imported lazily: naming a family loads no torch.
"""

from __future__ import annotations

from importlib import import_module

from recast_cli.errors import BadInput

#: kind → (module, class)
FAMILIES = {
    "sd3": ("recast_cli.policy.sd3", "SD3Policy"),
    "flux": ("recast_cli.policy.flux", "FluxPolicy"),
    "qwenimage": ("recast_cli.policy.qwenimage", "QwenImagePolicy"),
}
IMAGE_KINDS = tuple(FAMILIES)
#: the guidance value each family's pipeline uses when a setting names none (SD3 CFG, FLUX's embedded g, Qwen's true CFG)
DEFAULT_GUIDANCE = {"sd3": 4.5, "flux": 3.5, "qwenimage": 4.0}


def policy_class(kind: str):
    """The ``PipelinePolicy`` subclass of an image family."""
    if kind not in FAMILIES:
        raise BadInput(f"{kind!r} is not an image-model family ({', '.join(IMAGE_KINDS)})")
    module, name = FAMILIES[kind]
    return getattr(import_module(module), name)
