"""Where a scorer's weights live: the option given, else an environment variable, else the local HF cache.

Nothing is downloaded: a weight found in none of the three places is BadInput naming all of
them, so the user knows exactly what to provide.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from recast_cli.errors import BadInput


@dataclass(frozen=True)
class WeightSpec:
    """One weight a scorer needs.

    ``option`` is the scorer keyword (``weights`` is set by ``recast score --reward-weights NAME=PATH``,
    any other by ``--opt NAME.option=PATH``); ``hf_repo`` and ``hf_file`` locate it in the local
    Hugging Face cache (a whole snapshot folder when ``hf_file`` is None).
    """

    scorer: str
    what: str
    option: str
    env: str
    hf_repo: str | None = None
    hf_file: str | None = None

    def flag(self) -> str:
        if self.option == "weights":
            return f"--reward-weights {self.scorer}=PATH"
        return f"--opt {self.scorer}.{self.option}=PATH"

    def cache_name(self) -> str:
        return f"{self.hf_repo}/{self.hf_file}" if self.hf_file else str(self.hf_repo)


def resolve(spec: WeightSpec, given: str | os.PathLike[str] | None) -> Path:
    """The path of ``spec``'s weight: ``given``, else ``$env``, else the HF cache; BadInput if none."""
    for origin, value in (("option", given), (f"${spec.env}", os.environ.get(spec.env) or None)):
        if value is not None:
            path = Path(value).expanduser()
            if not path.exists():
                raise BadInput(f"{spec.scorer}: {spec.what} {path} (from {origin}) does not exist")
            return path
    if spec.hf_repo is not None:
        cached = _hf_cached(spec.hf_repo, spec.hf_file)
        if cached is not None:
            return cached
    where = f", or put {spec.cache_name()} in the local Hugging Face cache" if spec.hf_repo else ""
    raise BadInput(f"{spec.scorer}: no {spec.what} found; give {spec.flag()} or set {spec.env}{where}")


def _hf_cached(repo: str, filename: str | None) -> Path | None:
    """The cached file or snapshot folder of ``repo``, looked up without touching the network."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache
    from huggingface_hub.errors import LocalEntryNotFoundError

    if filename is not None:
        found = try_to_load_from_cache(repo, filename)
        return Path(found) if isinstance(found, str) else None
    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except LocalEntryNotFoundError:
        return None
