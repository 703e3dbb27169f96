"""Which files of a Hub repo a loader reads: ``recast fetch`` downloads those and nothing else.

The rules follow the loaders recast calls (``local_files_only``, no variant, safetensors first):

* ``diffusers`` (``PipelinePolicy.from_pretrained``): ``model_index.json`` and, in each component
  folder it names, the configs, tokenizer files and the weights; nothing at the repo's root (the
  single-file checkpoints SD3.5 ships beside the diffusers layout) and no folder it does not name
  (SD3.5's ``text_encoders/``);
* ``model`` (transformers ``CLIPModel`` + ``CLIPProcessor``): the root's configs, tokenizer files
  and weights;
* ``processor`` (transformers ``CLIPProcessor`` alone, PickScore's): the root's configs and
  tokenizer files, no weights;
* a file name: that file.

Weights: ``*.safetensors`` (and their ``.index.json``) when a folder has any, else ``*.bin``;
never a variant (``model.fp16.safetensors``, ``*.fp16-00001-of-00002.safetensors``) nor another
framework's copy (``.msgpack``, ``.h5``, ``.onnx``, ``.ckpt``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

#: Non-weight files a loader reads: configs, tokenizer vocabularies and merges, sentencepiece models.
CONFIG_SUFFIXES = (".json", ".txt", ".model", ".jinja")
#: A weight file without a variant: ``NAME.EXT`` or a shard ``NAME-00001-of-00003.EXT``.
PLAIN_WEIGHT = re.compile(r"[^.]+(-\d{5}-of-\d{5})?\.(safetensors|bin)")
#: The shard index of a plain weight: ``NAME.EXT.index.json``.
PLAIN_INDEX = re.compile(r"[^.]+\.(safetensors|bin)\.index\.json")


def folder_files(names: Iterable[str]) -> list[str]:
    """Of the file names of one folder: its configs and its plain weights, safetensors preferred."""
    names = list(names)
    weights = {ext: [n for n in names if PLAIN_WEIGHT.fullmatch(n) and n.endswith(f".{ext}")]
               for ext in ("safetensors", "bin")}
    ext = "safetensors" if weights["safetensors"] else "bin"
    chosen = list(weights[ext])
    for name in names:
        if ".index." in name or name.endswith(".index.json"):
            if PLAIN_INDEX.fullmatch(name) and f".{ext}.index.json" in name:
                chosen.append(name)
        elif name.endswith(CONFIG_SUFFIXES):
            chosen.append(name)
    return sorted(chosen)


def by_folder(files: Iterable[str]) -> dict[str, list[str]]:
    """Repo file paths grouped by their folder (``""``: the root) → the names inside it."""
    groups: dict[str, list[str]] = {}
    for path in files:
        pure = PurePosixPath(path)
        groups.setdefault(str(pure.parent) if str(pure.parent) != "." else "", []).append(pure.name)
    return groups


def select_files(what: str, files: Iterable[str], model_index: Mapping | None = None) -> list[str]:
    """The repo paths of ``files`` the loader ``what`` reads (see the module docstring); for ``diffusers``,
    ``model_index`` is the repo's model_index.json (its components)."""
    files = list(files)
    groups = by_folder(files)
    if what == "diffusers":
        components = sorted(name for name, entry in (model_index or {}).items()
                            if not name.startswith("_") and isinstance(entry, list) and entry and entry[0] is not None)
        chosen = ["model_index.json"]
        for part in components:
            chosen += [f"{part}/{name}" for name in folder_files(groups.get(part, []))]
        return chosen
    if what == "model":
        return folder_files(groups.get("", []))
    if what == "processor":
        return [name for name in folder_files(groups.get("", [])) if not name.endswith((".safetensors", ".bin"))
                and ".index." not in name]
    return [what] if what in files else []
