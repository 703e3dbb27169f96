"""Model paths that are Hugging Face repo ids: ``owner/name`` or ``owner/name@revision``, found in the local cache.

A setting may name the policy and every reward or judge weight by a local path or by a Hub repo
id (``stabilityai/stable-diffusion-3.5-medium@<commit>``). A local path wins where it exists.
A repo id is resolved from the local Hugging Face cache only (``HF_HOME`` / ``HF_HUB_CACHE``
place it; ``HF_HUB_OFFLINE=1`` changes nothing here, since nothing is downloaded): ``recast
fetch SETTING`` is the one command that downloads (recast_cli/fetch). A repo id that is not in
the cache is BadInput, one line naming the repo and the command that fetches it.

A repo id keeps to the Hub's own grammar (``check_hub_ref``), checked when it is parsed, before
any cache lookup or request: ``OWNER/NAME`` as huggingface_hub's ``validate_repo_id`` has it (no
``--`` or ``..``, no ``.git`` ending, OWNER and NAME at most 96 characters each), and a revision
git would take as a ref name (``git check-ref-format``: no ``..``, no leading or trailing ``/``,
no control characters, spaces or ``~^:?*[\\``, …), so that ``refs/REVISION`` in the HF cache,
which huggingface_hub reads and writes, stays inside the repo's cache folder. A value that has
the shape of a repo id but breaks that grammar is BadInput, one line, never a huggingface_hub
traceback.

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

from recast_cli.errors import BadInput, cut, shown

#: What has the shape of a Hub repo id in a setting (anything else is a local path): ``owner/name``
#: (letters, digits, ``-_.``), then ``@revision`` (a branch, tag or commit; no white space) or nothing.
#: ``check_hub_ref`` then holds it to the Hub's grammar.
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<revision>\S+))?")
#: One part of a repo id as huggingface_hub's REPO_ID_REGEX takes it: ``_.-`` inside, a letter, digit or
#: ``_`` at both ends.
REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
#: The longest owner or repo name the Hub takes (huggingface_hub's REPO_ID_REGEX).
MAX_REPO_PART = 96
#: The longest revision recast takes: one file name in the cache's ``refs/`` (NAME_MAX).
MAX_REVISION = 255
#: What ``git check-ref-format`` refuses anywhere in a ref name: control characters, space, DEL, ``~^:?*[\``.
REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
#: The file that marks each kind of snapshot folder (the one the folder is found by).
FOLDER_MARKER = {"diffusers": "model_index.json", "model": "config.json", "processor": "preprocessor_config.json"}
#: transformers 5 writes processor_config.json where older releases wrote preprocessor_config.json.
PROCESSOR_MARKERS = ("preprocessor_config.json", "processor_config.json")


@dataclass(frozen=True)
class HubRef:
    """A Hub model repo and the revision a setting pins (None: ``main``)."""

    repo: str
    revision: str | None = None

    def __post_init__(self) -> None:
        check_hub_ref(self.repo, self.revision)

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


#: Repo ids from before the Hub had owners, still used by packages recast runs (ImageReward's BLIP loads
#: ``bert-base-uncased``); their cache folder is ``models--NAME``. Only these: a setting's ids are OWNER/NAME.
LEGACY_IDS = frozenset({"bert-base-uncased"})


def repo_problem(repo: str) -> str | None:
    """What the Hub's grammar (huggingface_hub's validate_repo_id) refuses in ``repo``; None when it is valid.
    ``--`` is refused because the cache folder ``models--OWNER--NAME`` must name one repo."""
    if repo in LEGACY_IDS:
        return None
    parts = repo.split("/")
    if len(parts) != 2:
        return "a repo id is OWNER/NAME"
    if not all(REPO_PART.fullmatch(part) for part in parts):
        return "OWNER and NAME are letters, digits, '_', '.' and '-', starting and ending with a letter, digit or '_'"
    if "--" in repo or ".." in repo:
        return "'--' and '..' are not allowed in it"
    if repo.endswith(".git"):
        return "it may not end in '.git'"
    if max(len(part) for part in parts) > MAX_REPO_PART:
        return f"OWNER and NAME have at most {MAX_REPO_PART} characters each"
    return None


def revision_problem(revision: str) -> str | None:
    """What ``git check-ref-format`` refuses in the branch, tag or commit ``revision``; None when git takes it.
    The same rules keep ``refs/REVISION``, the cache file huggingface_hub reads and writes, inside the cache
    (``check_inside_cache`` checks the resolved path too)."""
    parts = revision.split("/")
    if not revision or len(revision) > MAX_REVISION:
        return f"a revision has 1 to {MAX_REVISION} characters"
    if REF_FORBIDDEN.search(revision):
        return "control characters, spaces and ~ ^ : ? * [ \\ are not allowed in a revision"
    if ".." in revision or "@{" in revision or revision == "@":
        return "'..', '@{' and a lone '@' are not allowed in a revision"
    if "" in parts:
        return "a revision may not start or end with '/' nor hold '//'"
    if any(part.startswith(".") or part.endswith(".lock") for part in parts) or revision.endswith("."):
        return "no part of a revision may start with '.' or end with '.lock', nor the revision with '.'"
    return None


def check_hub_ref(repo: str, revision: str | None) -> None:
    """BadInput, one line, unless ``repo`` and ``revision`` keep to the Hub's grammar (module docstring):
    checked before any cache lookup or request, so nothing is asked of the Hub for a malformed id
    nor written outside the HF cache for a revision such as ``../../x``."""
    problem = repo_problem(repo) or (revision_problem(revision) if revision is not None else None)
    if problem is not None:
        text = repo if revision is None else f"{repo}@{revision}"
        raise BadInput(f"{shown(text)} is not a valid Hugging Face repo id: {problem}")


def parse_hub_id(text: str | os.PathLike[str]) -> HubRef | None:
    """``text`` as a repo id, or None when it cannot be one (``./x``, ``/abs``, ``~/x``, ``a/b/c``); BadInput
    when it has a repo id's shape but breaks the Hub's grammar (``org--x/name``, ``org/name@../x``)."""
    if not isinstance(text, str):
        return None
    match = HUB_ID.fullmatch(text)
    if match is None:
        return None
    return HubRef(match["repo"], match["revision"])


def hub_id_of(value: str | os.PathLike[str], base: Path | None = None) -> HubRef | None:
    """The repo id ``value`` names, or None when it names a local path: one that exists (relative to
    ``base``, else the working folder) always wins, and a value that cannot be a repo id is a path.
    A value shaped like a repo id that breaks the Hub's grammar, with no local path of that name, is BadInput."""
    local = Path(value).expanduser()
    if (base / local if base is not None else local).exists():
        return None
    try:
        return parse_hub_id(value)
    except BadInput as exc:
        raise BadInput(f"{exc} (and there is no local path of that name)") from None


#: The setting the command read last (``setting.load.load_setting`` records it), as the user named it: the
#: fetch hint names it, so the line says what to paste (one command reads one setting).
_setting_named: list[str] = []


def name_setting(name: str) -> None:
    """Record the setting a command reads, for :func:`fetch_hint`."""
    _setting_named[:] = [name]


def fetch_hint(ref: HubRef) -> str:
    setting = _setting_named[0] if _setting_named else "SETTING"
    return (f"run `recast fetch {setting}` on a machine with network access (gated repos: accept the licence on "
            f"huggingface.co/{ref.repo}, then `hf auth login` or set HF_TOKEN)")


def repo_cache_folder(ref: HubRef) -> Path:
    """The folder of ``ref``'s repo in the HF cache, as huggingface_hub names it: ``models--OWNER--NAME``."""
    return Path(cache_folder()) / "--".join(("models", *ref.repo.split("/")))


def check_inside_cache(ref: HubRef) -> None:
    """BadInput unless the cache paths ``ref``'s revision names, ``refs/REVISION`` and ``snapshots/REVISION``,
    resolve (symbolic links followed) inside the repo's cache folder: huggingface_hub writes the first."""
    folder = repo_cache_folder(ref).resolve()
    for sub in ("refs", "snapshots"):
        path = (folder / sub / (ref.revision or "main")).resolve()
        if not path.is_relative_to(folder / sub):
            raise BadInput(f"{ref}: its cache path {cut(str(path))} is outside the Hugging Face cache folder "
                           f"{folder / sub}; refused")


def cached(ref: HubRef, what: str) -> Path | None:
    """The cached snapshot folder (``what`` a folder kind) or file (``what`` a file name) of ``ref``;
    None when the cache lacks it. No network access."""
    from huggingface_hub import try_to_load_from_cache

    check_inside_cache(ref)
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

