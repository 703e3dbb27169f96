"""The registry of π⁺ sources for ``recast sample-positive --source KIND[:ARG]`` (docs/method.md §4, E2).

Each entry names its argument (``folder:DIR``, ``diffusers:PATH``) or none, the command's flags
it uses (recorded in the manifest's provenance), and a builder that imports its source lazily
(the API sources pull in HTTP clients, ``self`` and ``diffusers`` pull in torch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from recast_cli.errors import BadInput


@dataclass(frozen=True)
class SourceKind:
    """One ``--source`` kind: its argument (if any), the flags it reads and how to build it."""

    name: str
    arg: str | None  # the placeholder of its ``:ARG`` in help text, or None for no argument
    flags: tuple[str, ...]
    build: Callable[[str, Mapping[str, Any], Any, int], Any]  # (arg, flags, setting or None, resolution) → source

    @property
    def usage(self) -> str:
        return f"{self.name}:{self.arg}" if self.arg else self.name


def _renderer(arg, flags, setting, resolution):
    from recast_cli.positives.renderer import RendererSource

    return RendererSource(resolution)


def _folder(arg, flags, setting, resolution):
    from recast_cli.positives.folder import FolderSource

    return FolderSource(arg)


def _diffusers(arg, flags, setting, resolution):
    from recast_cli.positives.pipeline import DiffusersSource

    return DiffusersSource(arg, steps=flags["steps"], guidance_scale=flags["cfg"], batch=flags["batch"],
                           device=flags["device"])


def _retry(flags):
    from recast_cli.positives.api import RetryPolicy

    return RetryPolicy(retries=flags["retries"], timeout=flags["timeout"], backoff=flags["backoff"])


def _openai(arg, flags, setting, resolution):
    from recast_cli.positives.openai_images import OpenAISource

    return OpenAISource(model=flags["model"], size=flags["size"], quality=flags["quality"],
                        concurrency=flags["concurrency"], retry=_retry(flags))


def _gemini(arg, flags, setting, resolution):
    from recast_cli.positives.gemini_images import GeminiSource

    return GeminiSource(model=flags["model"], aspect_ratio=flags["size"], concurrency=flags["concurrency"],
                        retry=_retry(flags))


def _self(arg, flags, setting, resolution):
    from recast_cli.positives.sir import SelfSource
    from recast_cli.setting.load import reward_options

    if setting is None:
        raise BadInput("--source self samples the setting's policy: give --setting")
    names = [r.strip() for r in (flags["rewards"] or _setting_rewards(setting)).split(",") if r.strip()]
    return SelfSource(setting.policy, names, draws=flags["draws"] or 8 * flags["n"], n=flags["n"], beta=flags["beta"],
                      standardise=flags["standardise"], noise_level=flags["noise_level"], steps=flags["steps"],
                      guidance_scale=flags["cfg"], batch=flags["batch"], device=flags["device"],
                      reward_options=reward_options(setting))


def _setting_rewards(setting) -> str:
    from recast_cli.positives.config import config_from_setting

    names = config_from_setting(setting).rewards
    if not names:
        raise BadInput("--source self needs --rewards (or [positives] rewards in the setting)")
    return ",".join(names)


_API = ("concurrency", "retries", "timeout", "backoff")
#: every source, in the order ``--help`` lists them; the flag tuples are recorded in the manifest
SOURCE_KINDS: dict[str, SourceKind] = {kind.name: kind for kind in (
    SourceKind("renderer", None, (), _renderer),
    SourceKind("folder", "DIR", (), _folder),
    SourceKind("diffusers", "PATH", ("steps", "cfg", "batch"), _diffusers),
    SourceKind("openai", None, ("model", "size", "quality", *_API), _openai),
    SourceKind("gemini", None, ("model", "size", *_API), _gemini),
    SourceKind("self", None, ("rewards", "draws", "beta", "standardise", "noise_level", "steps", "cfg", "batch"),
               _self),
)}
USAGE = " | ".join(kind.usage for kind in SOURCE_KINDS.values())


def parse_source(text: str) -> tuple[SourceKind, str]:
    """``KIND[:ARG]`` → (its registry entry, ARG); one line naming the known kinds otherwise."""
    name, _, arg = text.partition(":")
    kind = SOURCE_KINDS.get(name)
    if kind is None or bool(arg) != (kind.arg is not None):
        raise BadInput(f"unknown source {text!r}; known: {USAGE}")
    return kind, arg
