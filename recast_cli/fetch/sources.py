"""The prompt files ``recast fetch`` downloads: upstream URLs pinned at one commit, with their checksums.

Each file is named by how a setting's path to it ends (``ocr/train.txt``): a setting that names
``../data/ocr/train.txt`` gets Flow-GRPO's ``dataset/ocr/train.txt`` there. Flow-GRPO's files are
taken at commit ``FLOW_GRPO_COMMIT`` of github.com/yifan123/flow_grpo.

Two checks, both from the upstream repository itself:

* ``git_blob``: the git object id of the file in that commit's tree (``git ls-tree``): SHA-1 over
  ``b"blob <size>\\0" + content``. Every file has one; fetch always checks it.
* ``sha256``: the file's SHA-256, computed from the blob in a clone of that commit. ``None`` =
  not yet pinned (the clone this table was made from held the tree but not these large blobs):
  the git blob id pins such a file, and fetch records its sha256 beside it at the first verified
  download (``.NAME.recast-sha256``) and checks it against that record after that. Fill
  each ``None`` from a verified download (``sha256sum`` of a file whose ``git hash-object``
  equals ``git_blob``).
* ``size``: the file's size in bytes, the size of that blob (``git cat-file -s``), where the clone
  held it; fetch stops a download that goes past it. ``None``: at most
  ``recast_cli.fetch.http.MAX_UNPINNED_BYTES``.

``DERIVED`` are files the paper settings read that are made from the downloaded ones, by the
recipes the settings' comments state.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOW_GRPO_REPO = "yifan123/flow_grpo"
FLOW_GRPO_COMMIT = "ac4c86e8cae021841f1fde853d340e0db67690dd"  # 2025-07-18, "fix imagereward"
FLOW_GRPO_RAW = f"https://raw.githubusercontent.com/{FLOW_GRPO_REPO}/{FLOW_GRPO_COMMIT}"


@dataclass(frozen=True)
class PromptFile:
    """One pinned upstream file."""

    name: str  # how a setting's path to it ends: "ocr/train.txt"
    url: str
    git_blob: str  # the git object id at the pinned commit
    sha256: str | None  # None = not yet pinned
    size: int | None = None  # bytes; None = not yet pinned


def _flow_grpo(name: str, git_blob: str, sha256: str | None, size: int | None) -> PromptFile:
    return PromptFile(name, f"{FLOW_GRPO_RAW}/dataset/{name}", git_blob, sha256, size)


PROMPT_FILES = {f.name: f for f in (
    _flow_grpo("ocr/train.txt", "3ce0521b77b0a9031191d66ecc36ebaaf27a3922", None, None),
    _flow_grpo("ocr/test.txt", "8deb4f8d8f2e863f45353354243669b3c991a6a2",
               "4dd8caf3ab6ade73bd376c7d14c6ca49b6eacfb1bd321e22c40714ae4a98d4dc", 217_565),
    _flow_grpo("geneval/train_metadata.jsonl", "0b97e8a6802c08fc7537cd00c76ae79c851bddcb", None, None),
    _flow_grpo("geneval/test_metadata.jsonl", "27cdaf5cc1356fe15aeadbb8df55682ca74228f0",
               "cec4b24b9fee7bac21c8f787054ecc8dc9ff831674037713a4cd35e0f0a74a28", 340_835),
    _flow_grpo("pickscore/train.txt", "a437bd921c03fbc00c4e7ce148ae2d28fcd6e49b",
               "2f425adcbb9a6d0feee7c6c448e1cb83a1f71deca9434b803907e2578eca837f", 2_906_730),
    _flow_grpo("pickscore/test.txt", "45f05231b969fb5f74c8debd606b22cd3be27f8e",
               "d75c025fa451866e70f7e36243f7cdd93095523cb51f5f9651f2ce3236d20262", 239_891),
)}


@dataclass(frozen=True)
class DerivedFile:
    """A file made from pinned files in the same folder: ``head`` (the first P lines of ``sources[0]``),
    ``concat`` (the ``sources`` one after another) or ``prompts`` (the ``prompt`` field of the first P
    JSON lines of ``sources[0]``, one per line). P is the setting's ``[study] p`` (else 16)."""

    name: str
    recipe: str
    sources: tuple[str, ...]


DERIVED = {d.name: d for d in (
    DerivedFile("ocr/estimate.txt", "head", ("ocr/train.txt",)),
    DerivedFile("geneval/metadata.jsonl", "concat", ("geneval/train_metadata.jsonl", "geneval/test_metadata.jsonl")),
    DerivedFile("geneval/estimate.txt", "prompts", ("geneval/train_metadata.jsonl",)),
)}
