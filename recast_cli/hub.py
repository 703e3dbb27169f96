"""Model paths that are Hugging Face repo ids: ``owner/name`` or ``owner/name@revision``, found in the local cache.

A setting may name the policy and every reward or judge weight by a local path or by a Hub repo
id (``stabilityai/stable-diffusion-3.5-medium@<commit>``). A local path wins where it exists.
A repo id is resolved from the local Hugging Face cache only (``HF_HOME`` / ``HF_HUB_CACHE``
place it; ``HF_HUB_OFFLINE=1`` changes nothing here, since nothing is downloaded): ``recast
fetch SETTING`` is the one command that downloads (recast_cli/fetch). A repo id that is not in
the cache is BadInput, one line naming the repo and the command that fetches it.

What a loader reads from a snapshot is named by ``what``: ``diffusers`` (a pipeline folder, found
by its ``model_index.json``), ``model`` (a transformers model folder: ``config.json``),
``processor`` (a transformers processor folder: ``preprocessor_config.json``), or a file name
inside the repo (a single checkpoint such as ``HPS_v2.1_compressed.pt``). The same names tell
``recast fetch`` which files to download (recast_cli/fetch/select.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from recast_cli.errors import BadInput

#: A Hub repo id as a setting writes it: ``owner/name`` (letters, digits, ``-_.``), then ``@revision``
#: (a branch, tag or commit; anything but white space) or nothing.
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<revision>\S+))?")
#: The file that marks each kind of snapshot folder (the one the folder is found by).
FOLDER_MARKER = {"diffusers": "model_index.json", "model": "config.json", "processor": "preprocessor_config.json"}
#: transformers 5 writes processor_config.json where older releases wrote preprocessor_config.json.
PROCESSOR_MARKERS = ("preprocessor_config.json", "processor_config.json")


@dataclass(frozen=True)
class HubRef:
    """A Hub model repo and the revision a setting pins (None: ``main``)."""

    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def parse_hub_id(text: str | os.PathLike[str]) -> HubRef | None:
    """``text`` as a repo id, or None when it cannot be one (``./x``, ``/abs``, ``~/x``, ``a/b/c``, ``a/../b``)."""
    if not isinstance(text, str):
        return None
    match = HUB_ID.fullmatch(text)
    if match is None or ".." in match["repo"] or match["repo"].endswith((".", "-")):
        return None
    return HubRef(match["repo"], match["revision"])


def hub_id_of(value: str | os.PathLike[str], base: Path | None = None) -> HubRef | None:
    """The repo id ``value`` names, or None when it names a local path: one that exists (relative to
    ``base``, else the working folder) always wins, and a value that cannot be a repo id is a path."""
    local = Path(value).expanduser()
    if (base / local if base is not None else local).exists():
        return None
    return parse_hub_id(value)


def fetch_hint(ref: HubRef) -> str:
    return (f"run `recast fetch SETTING` on a machine with network access (gated repos: accept the licence on "
            f"huggingface.co/{ref.repo}, then `huggingface-cli login` or set HF_TOKEN)")


def cached(ref: HubRef, what: str) -> Path | None:
    """The cached snapshot folder (``what`` a folder kind) or file (``what`` a file name) of ``ref``;
    None when the cache lacks it. No network access."""
    from huggingface_hub import try_to_load_from_cache

    markers = PROCESSOR_MARKERS if what == "processor" else (FOLDER_MARKER.get(what, what),)
    for marker in markers:
        try:
            found = try_to_load_from_cache(ref.repo, marker, revision=ref.revision)
        except ValueError:  # huggingface_hub refuses a malformed repo id or file name
            return None
        if isinstance(found, str):
            return Path(found).parent if what in FOLDER_MARKER else Path(found)
    return None


def resolve_hub(ref: HubRef, what: str, subject: str) -> Path:
    """``cached(ref, what)``, or BadInput naming ``subject`` (e.g. ``[policy] path``), the repo and how to fetch it."""
    found = cached(ref, what)
    if found is None:
        item = f"{ref}" if what in FOLDER_MARKER else f"{what} of {ref}"
        raise BadInput(f"{subject}: {item} is not in the local Hugging Face cache ({cache_folder()}); "
                       f"{fetch_hint(ref)}")
    return found


def cache_folder() -> str:
    """The hub cache huggingface_hub reads (``HF_HUB_CACHE``, else ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)

