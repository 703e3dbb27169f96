"""Where a scorer's weights live: the option given, else an environment variable, else the local HF cache.

The option and the variable each hold a local path or a Hub repo id (``owner/name[@revision]``,
recast_cli/hub.py: a local path that exists wins; a repo id is found in the local cache).
Nothing is downloaded: a weight found in none of the three places is BadInput naming all of
them, so the user knows exactly what to provide (``recast fetch SETTING`` downloads).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from recast_cli.errors import BadInput
from recast_cli.hub import HubRef, cached, hub_id_of, resolve_hub


@dataclass(frozen=True)
class WeightSpec:
    """One weight a scorer needs.

    ``option`` is the scorer keyword (``weights`` is set by ``recast score --reward-weights NAME=PATH``,
    any other by ``--opt NAME.option=PATH``); ``hf_repo`` and ``hf_file`` locate it in the local
    Hugging Face cache (a whole snapshot folder when ``hf_file`` is None, read by ``folder``'s loader:
    ``model``, a transformers model; ``processor``, a transformers processor without weights).
    """

    scorer: str
    what: str
    option: str
    env: str
    hf_repo: str | None = None
    hf_file: str | None = None
    folder: str = "model"

    def flag(self) -> str:
        if self.option == "weights":
            return f"--reward-weights {self.scorer}=PATH"
        return f"--opt {self.scorer}.{self.option}=PATH"

    def cache_name(self) -> str:
        return f"{self.hf_repo}/{self.hf_file}" if self.hf_file else str(self.hf_repo)

    def in_repo(self) -> str:
        """What the loader reads from a snapshot: the file ``hf_file``, or the folder kind (recast_cli/hub.py)."""
        return self.hf_file or self.folder


def resolve(spec: WeightSpec, given: str | os.PathLike[str] | None) -> Path:
    """The path of ``spec``'s weight: ``given``, else ``$env``, else the HF cache; BadInput if none."""
    for origin, value in (("option", given), (f"${spec.env}", os.environ.get(spec.env) or None)):
        if value is not None:
            ref = hub_id_of(value)
            if ref is not None:
                return resolve_hub(ref, spec.in_repo(), f"{spec.scorer}: {spec.what} (from {origin})")
            path = Path(value).expanduser()
            if not path.exists():
                raise BadInput(f"{spec.scorer}: {spec.what} {path} (from {origin}) does not exist")
            return path
    if spec.hf_repo is not None:
        found = cached(HubRef(spec.hf_repo), spec.in_repo())
        if found is not None:
            return found
    where = f", or put {spec.cache_name()} in the local Hugging Face cache" if spec.hf_repo else ""
    raise BadInput(f"{spec.scorer}: no {spec.what} found; give {spec.flag()} or set {spec.env}{where}")
