"""``recast fetch SETTING``: download what a setting needs, after saying how much it is.

1. ``plan_fetch`` reads the setting (no network): every Hub model it names — the policy's
   ``[policy] path`` when it is a repo id, each weight of each scorer it uses given as a repo id
   or left to the scorer's default repo — and every prompt file it names that is in the pinned
   table (recast_cli/fetch/sources.py) or made from one. A local path is never fetched (it wins).
   A prompt file is pinned by its git blob id (a SHA-1 of its content, in the upstream commit's tree);
   one without a sha256 in the table gets its sha256 recorded beside it at the first verified
   download (``.NAME.recast-sha256``, the ``sha256sum`` format), and checked against it after that.
2. ``size_models`` asks the Hub for each repo's file list and sizes (``model_info`` with file
   metadata) and picks the files its loader reads (recast_cli/fetch/select.py).
3. ``run_fetch`` downloads: models into the Hugging Face cache (``hf_hub_download`` per file:
   ``HF_HOME``/``HF_HUB_CACHE``, ``HF_ENDPOINT``, ``HF_TOKEN`` or a saved login, all read by
   huggingface_hub itself; a file already cached is not fetched again), prompt files to the paths
   the setting names (recast_cli/fetch/http.py), derived files last.

Nothing outside the HF cache, the setting's prompt-file paths and the sha256 records beside them is
written; a prompt path that holds a file other than the pinned one is refused, not replaced.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recast_cli.artifacts.io import check_writable, refuse_non_regular

from recast_cli.artifacts.locks import hold_output_lock, release_output_lock
from recast_cli.artifacts.jsonio import json_loads
from recast_cli.artifacts.outputs import enclosing_artifact_folder
from recast_cli.errors import BadInput, cut, shown
from recast_cli.fetch.http import check_part, check_pins, download
from recast_cli.fetch.select import select_files
from recast_cli.fetch.sources import DERIVED, PROMPT_FILES, DerivedFile, PromptFile
from recast_cli.hub import HubRef, check_inside_cache, hub_id_of, repo_cache_folder
from recast_cli.setting.load import Setting, load_setting

#: A commit id as the Hub answers it: the snapshot folder's name in the HF cache.
COMMIT_ID = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
#: The settings' keys that name prompt or data files: (table path, key).
PROMPT_KEYS = (("train",), "prompts"), (("evaluate",), "prompts"), (("positives",), "prompts"), \
    (("rewards", "geneval"), "metadata")
DEFAULT_P = 16


@dataclass
class ModelNeed:
    """One Hub repo and what its loaders read from it (a folder kind or file names), and who needs it."""

    ref: HubRef
    reads: set[str] = field(default_factory=set)
    needed_by: list[str] = field(default_factory=list)
    commit: str | None = None
    files: dict[str, int] = field(default_factory=dict)  # repo path → size in bytes

    @property
    def size(self) -> int:
        return sum(self.files.values())


@dataclass
class FetchPlan:
    setting: Setting
    models: list[ModelNeed]
    prompts: list[tuple[Path, PromptFile]]
    derived: list[tuple[Path, DerivedFile]]
    p: int = DEFAULT_P


def _table(raw: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    for key in keys:
        raw = raw.get(key, {}) if isinstance(raw, dict) else {}
    return raw if isinstance(raw, dict) else {}


def _used_scorers(setting: Setting) -> list[str]:
    """Every scorer the setting uses or configures, in first-mention order."""
    raw, names = setting.raw, []
    for keys, key in ((("train",), "rewards"), (("evaluate",), "judges"), (("positives",), "rewards")):
        value = _table(raw, keys).get(key, [])
        names += [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
    names += list(_table(raw, ("rewards",)))
    return [n for n in dict.fromkeys(names) if "@" not in n]  # a remote scorer's weights live on its server


def plan_fetch(name_or_path: str) -> FetchPlan:
    """What ``recast fetch`` downloads for the setting (no network access; module docstring)."""
    from recast_cli.rewards.options import reward_options, weight_specs
    from recast_cli.rewards.registry import scorer_class

    setting = load_setting(name_or_path)
    needs: dict[str, ModelNeed] = {}

    def need(ref: HubRef, reads: str, who: str) -> None:
        entry = needs.setdefault(str(ref), ModelNeed(ref))
        entry.reads.add(reads)
        entry.needed_by.append(who)

    if setting.policy.hub is not None:
        need(setting.policy.hub, "diffusers", "[policy] path")
    options = reward_options(setting.raw, setting.file)
    for scorer in _used_scorers(setting):
        scorer_class(scorer)  # an unknown name is BadInput naming the known ones
        for spec in weight_specs(scorer):
            given = options.get(scorer, {}).get(spec.option)
            ref = hub_id_of(given) if isinstance(given, str) else None
            if ref is None and given is None and spec.hf_repo is not None:
                ref = HubRef(spec.hf_repo)  # left to the scorer's default: the cache lookup it does
            if ref is not None:
                need(ref, spec.in_repo(), f"[rewards.{scorer}] {spec.option}")
        for repo, reads in getattr(scorer_class(scorer), "fetch_also", ()):
            need(HubRef(repo), reads, f"{scorer} (its package or server)")
    prompts, derived = _prompt_targets(setting)
    study_p = _table(setting.raw, ("study",)).get("p", DEFAULT_P)
    p = study_p if isinstance(study_p, int) and not isinstance(study_p, bool) and study_p > 0 else DEFAULT_P
    return FetchPlan(setting, list(needs.values()), prompts, derived, p)


def _prompt_targets(setting: Setting) -> tuple[list[tuple[Path, PromptFile]], list[tuple[Path, DerivedFile]]]:
    """The setting's prompt paths the pinned table knows, and the derived ones (with their sources added)."""
    prompts: dict[Path, PromptFile] = {}
    derived: dict[Path, DerivedFile] = {}
    for keys, key in PROMPT_KEYS:
        value = _table(setting.raw, keys).get(key)
        if not isinstance(value, str):
            continue
        path = (setting.file.parent / Path(value).expanduser()).resolve()
        name = f"{path.parent.name}/{path.name}"
        if name in PROMPT_FILES:
            prompts[path] = PROMPT_FILES[name]
        elif name in DERIVED:
            derived[path] = DERIVED[name]
            for source in DERIVED[name].sources:
                prompts.setdefault(path.parent / source.split("/", 1)[1], PROMPT_FILES[source])
    return list(prompts.items()), list(derived.items())


# --------------------------------------------------------------------------- the Hub


def hub_error(exc: Exception, ref: HubRef) -> BadInput:
    """A huggingface_hub error as one line naming the repo and what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    login = "run `hf auth login` or set HF_TOKEN"
    if isinstance(exc, GatedRepoError):
        return BadInput(f"{ref.repo} is gated: accept its licence on huggingface.co/{ref.repo}, then {login}")
    if isinstance(exc, RevisionNotFoundError):
        return BadInput(f"{ref.repo} has no revision {ref.revision!r}")
    if isinstance(exc, RemoteEntryNotFoundError):
        return BadInput(f"{ref}: a file the listing named is missing on the Hub ({type(exc).__name__})")
    if isinstance(exc, RepositoryNotFoundError):
        return BadInput(f"no model {ref.repo} on the Hub, or it is private or gated and you are not logged in: "
                        f"check the id, or {login}")
    if isinstance(exc, OfflineModeIsEnabled):
        return BadInput("HF_HUB_OFFLINE=1 forbids downloads: unset it to run recast fetch")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 401:
            return BadInput(f"{ref.repo}: HTTP 401 from the Hub (not authorised): {login}")
        return BadInput(f"{ref}: the Hub answered HTTP {status}")
    return BadInput(f"{ref}: cannot reach the Hub ({type(exc).__name__}); check the network or HF_ENDPOINT")


def _hub_call(ref: HubRef, call: Callable[[], Any]) -> Any:
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        return call()
    except (HfHubHTTPError, OfflineModeIsEnabled, httpx2.HTTPError, OSError) as exc:
        raise hub_error(exc, ref) from None
    except ValueError as exc:  # huggingface_hub refuses what the Hub answered (a path outside the cache, …)
        raise BadInput(f"{ref}: huggingface_hub refused the Hub's answer: {cut(str(exc))}") from None


def _check_answer(ref: HubRef, commit: Any, files: dict[str, int]) -> None:
    """BadInput unless the Hub's answer names a commit id and repo files that stay inside their snapshot
    folder: both become paths in the HF cache."""
    if not isinstance(commit, str) or not COMMIT_ID.fullmatch(commit):
        raise BadInput(f"{ref}: the Hub answered the commit {shown(commit)}, not a 40-digit hex commit id; refused")
    for name in files:
        parts = name.split("/")
        if name.startswith("/") or "\\" in name or any(part in ("", ".", "..") for part in parts):
            raise BadInput(f"{ref}: the Hub lists the file {shown(name)}, a path that leaves its folder; refused")


def size_models(plan: FetchPlan) -> None:
    """Each model's commit and the files (with sizes) its loaders read, from the Hub's metadata."""
    from huggingface_hub import HfApi, constants, hf_hub_download

    if constants.HF_HUB_OFFLINE:
        raise BadInput("HF_HUB_OFFLINE=1 forbids downloads: unset it to run recast fetch")
    api = HfApi()
    for need in plan.models:
        check_inside_cache(need.ref)
    for need in plan.models:
        ref = need.ref
        info = _hub_call(ref, lambda: api.model_info(ref.repo, revision=ref.revision, files_metadata=True))
        sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
        _check_answer(ref, info.sha, sizes)
        need.commit = info.sha
        index = None
        if "diffusers" in need.reads:
            if "model_index.json" not in sizes:
                raise BadInput(f"{ref} is not a diffusers pipeline repo (no model_index.json); [policy] path needs one")
            index_path = _hub_call(ref, lambda: hf_hub_download(ref.repo, "model_index.json", revision=info.sha))
            try:
                index = json_loads(Path(index_path).read_text(encoding="utf-8"), f"{ref}: model_index.json")
            except (ValueError, UnicodeDecodeError):  # not JSON, or nested too deeply
                raise BadInput(f"{ref}: its model_index.json is not a JSON pipeline index") from None
            if not isinstance(index, dict):
                raise BadInput(f"{ref}: its model_index.json is not a JSON object")
        for reads in sorted(need.reads):
            chosen = select_files(reads, sizes, index)
            if not chosen:
                raise BadInput(f"{ref} has no {reads} (needed by {', '.join(need.needed_by)})")
            need.files.update({name: sizes[name] for name in chosen})


class _ByteBar:
    """The progress bar huggingface_hub opens per file (``tqdm_class``), forwarded to one rich task."""

    def __init__(self, advance: Callable[[int], None], **kwargs: Any) -> None:
        self.advance = advance
        self.total = kwargs.get("total")
        if kwargs.get("initial"):
            advance(kwargs["initial"])

    def __enter__(self) -> _ByteBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, n: float | None = 1) -> None:
        self.advance(int(n or 0))

    def update_transfer(self, n: float | None = 1) -> None:
        """Network bytes of a Xet download: the bar counts the bytes written instead."""

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        """The rate: rich shows its own."""

    set_transfer_postfix_str = set_postfix_str

    def refresh(self) -> None:
        """rich refreshes itself."""

    def close(self) -> None:
        """Nothing to close: the rich task outlives each file."""


def fetch_model(need: ModelNeed, advance: Callable[[int], None], done: Callable[[int], None]) -> Path:
    """Download ``need``'s files into the HF cache; ``advance(n)`` as bytes arrive, ``done(size)`` per file.
    Returns the snapshot folder; BadInput if the repo moved to another commit meanwhile."""
    import functools

    from huggingface_hub import hf_hub_download

    ref = need.ref
    snapshot = None
    for name, size in sorted(need.files.items()):
        bar = functools.partial(_ByteBar, advance)
        path = Path(_hub_call(ref, lambda: hf_hub_download(ref.repo, name, revision=ref.revision or "main",
                                                           tqdm_class=bar)))
        folder = path.parents[len(Path(name).parts) - 1]
        if not path.resolve().is_relative_to(repo_cache_folder(ref).resolve()):
            raise BadInput(f"{ref}: huggingface_hub put {name} at {path}, outside the repo's cache folder; refused")
        if folder.name != need.commit:
            raise BadInput(f"{ref} moved from commit {need.commit} to {folder.name} during the fetch; run recast "
                           "fetch again")
        snapshot = folder
        done(size)
    assert snapshot is not None  # every need has at least one file (size_models)
    return snapshot


# --------------------------------------------------------------------------- prompt files


def recorded_path(target: Path) -> Path:
    """Where fetch records the sha256 of a prompt file the table pins by its git blob id alone."""
    return target.with_name(f".{target.name}.recast-sha256")


#: The most bytes a sha256 record may have: 64 hex digits, two spaces, a file name (at most 255 bytes) and
#: a newline. A larger file there is not a record recast wrote and is refused unread.
RECORD_MAX_BYTES = 512


def recorded_sha256(target: Path) -> str | None:
    """The sha256 recorded for ``target`` at its first verified download; None when none was recorded. The
    record is opened as a regular file of recast's own (no link, FIFO or folder) and read only up to
    :data:`RECORD_MAX_BYTES`."""
    from recast_cli.artifacts.regular import open_regular

    record = recorded_path(target)
    if not os.path.lexists(record):
        return None
    fd = open_regular(record, "the sha256 record", write=False, create=False)
    with open(fd, "rb") as fh:
        raw = fh.read(RECORD_MAX_BYTES + 1)
    words = raw.decode("utf-8", errors="replace").split() if len(raw) <= RECORD_MAX_BYTES else []
    if len(words) != 2 or not SHA256.fullmatch(words[0]) or words[1] != target.name:
        raise BadInput(f"{record} is not the sha256 record recast writes for {target.name}; remove it and fetch "
                       "again to record it anew")
    return words[0]


def record_sha256(target: Path, pin: PromptFile) -> str | None:
    """Record the sha256 of ``target`` (checked against its git blob id already) when the table pins none."""
    if pin.sha256 is not None:
        return None
    from recast_cli.artifacts.io import atomic_write_bytes, sha256_file

    refuse_non_regular(recorded_path(target))
    sha = sha256_file(target)
    atomic_write_bytes(recorded_path(target), f"{sha}  {target.name}\n".encode())
    return sha


def pin_text(path: Path, pin: PromptFile) -> str:
    """How the file is pinned, for fetch's table."""
    if pin.sha256 is not None:
        return "git blob + sha256"
    try:
        recorded = recorded_sha256(path) if path.exists() else None
    except BadInput:
        recorded = None
    return "git blob + recorded sha256" if recorded else "git blob (sha256 recorded at download)"


def claim_prompt_file(path: Path, pin: PromptFile) -> bool:
    """True when ``path`` must be downloaded, False when it holds the pinned file already; BadInput when it
    holds another file (never replaced) or sits inside a recast artifact folder. Locks it for this process."""
    check_writable(path)
    refuse_non_regular(path)
    inside = enclosing_artifact_folder(path.parent)
    if inside is not None:
        raise BadInput(f"cannot write {path}: it is inside {inside[0]}, a {inside[1]} folder")
    if path.exists():
        recorded = recorded_sha256(path) if pin.sha256 is None else None
        wrong = check_pins(path, pin.git_blob, pin.sha256 or recorded)
        if wrong is not None:
            raise BadInput(f"{path} exists and is not {pin.name} pinned at {pin.url} ({wrong}); remove it or point "
                           "the setting elsewhere")
        if pin.sha256 is None and recorded is None:
            record_sha256(path, pin)  # verified by its git blob id: from now on its sha256 is checked too
        return False
    hold_output_lock(path)  # first: a second fetch of the same file is told so, not that its part is foreign
    try:
        check_part(path)  # before any download: a file recast did not make at its partial-file names is refused
        if pin.sha256 is None:  # and where its sha256 will be recorded: refused now, not once the file is in place
            refuse_non_regular(recorded_path(path))
    except BadInput:
        release_output_lock(path)
        raise
    return True


def fetch_prompt_file(path: Path, pin: PromptFile, advance: Callable[[int], None]) -> None:
    """Download ``pin`` to ``path`` (claimed by :func:`claim_prompt_file`), bounded by its pinned size."""
    try:
        download(pin.url, path, pin.git_blob, pin.sha256, advance, size=pin.size)
        record_sha256(path, pin)
    finally:
        release_output_lock(path)


def make_derived(path: Path, item: DerivedFile, p: int) -> bool:
    """Write a derived file from its sources beside it (atomic); False when it exists already (kept as is)."""
    from recast_cli.artifacts.io import atomic_write_bytes

    if path.exists():
        return False
    sources = [path.parent / name.split("/", 1)[1] for name in item.sources]
    if item.recipe == "concat":
        data = b"".join(src.read_bytes() if src.read_bytes().endswith(b"\n") else src.read_bytes() + b"\n"
                        for src in sources)
    else:
        lines = [line for line in sources[0].read_text(encoding="utf-8").splitlines() if line.strip()][:p]
        if item.recipe == "prompts":
            lines = [json.loads(line)["prompt"] for line in lines]
        data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    atomic_write_bytes(path, data)
    return True
