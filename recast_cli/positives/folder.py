"""Source ``folder:DIR``: existing images as π⁺ surrogates (docs/method.md §4, "Positive samples").

DIR holds the images and an index that pairs each with its prompt, either

* ``manifest.parquet``: a ``recast.positives/1`` folder (every image checked against its sha256;
  per-reward sets are refused, they belong to one policy), or
* ``metadata.jsonl``: one JSON object per line, ``{"file_name": "a/b.png", "prompt": "..."}``
  (Hugging Face imagefolder's layout; ``text`` is accepted for ``prompt``).

Positive s of a prompt is the prompt's s-th image in index order; every asked prompt needs
at least N images, every image must lie inside DIR and decode. All of it is checked before
anything is written.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from recast_cli.artifacts import MANIFEST_NAME, read_positives
from recast_cli.errors import BadInput
from recast_cli.positives.collect import Job, Outcome, PositiveSource, open_image

METADATA_NAME = "metadata.jsonl"


class FolderSource(PositiveSource):
    name = "folder"

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.index: Path | None = None
        self.images: dict[str, list[tuple[Path, int]]] = {}

    def identity(self) -> dict[str, Any]:
        return {"kind": "folder", "path": str(self.folder.resolve())}

    def inputs(self) -> list[Path]:
        return [self.index] if self.index is not None else []

    def prepare(self, prompts: Sequence[str], n: int) -> None:
        if not self.folder.is_dir():
            raise BadInput(f"folder source {self.folder} is not a directory")
        if (self.folder / MANIFEST_NAME).is_file():
            self.index = self.folder / MANIFEST_NAME
            self.images = self._from_manifest()
        elif (self.folder / METADATA_NAME).is_file():
            self.index = self.folder / METADATA_NAME
            self.images = self._from_metadata()
        else:
            raise BadInput(f"folder source {self.folder} has neither {MANIFEST_NAME} nor {METADATA_NAME}")
        for prompt in prompts:
            found = self.images.get(prompt, [])
            if len(found) < n:
                raise BadInput(f"folder source {self.folder} has {len(found)} image(s) for prompt {prompt!r}, "
                               f"--n asks for {n}")
            for path, _ in found[:n]:
                try:
                    open_image(path)
                except ValueError as exc:
                    raise BadInput(f"folder source: image {path} cannot be decoded ({exc})") from None

    def _from_manifest(self) -> dict[str, list[tuple[Path, int]]]:
        positives = read_positives(self.folder, verify=True)
        if positives.rewards():
            raise BadInput(f"folder source {self.folder} holds one positive set per reward "
                           f"({', '.join(positives.rewards())}); use it directly as --positives")
        images: dict[str, list[tuple[Path, int]]] = defaultdict(list)
        for s in sorted(positives.samples, key=lambda s: (s.prompt_id, s.sample_id)):
            images[s.prompt].append((self.folder / s.image_path, s.seed))
        return images

    def _from_metadata(self) -> dict[str, list[tuple[Path, int]]]:
        where = self.folder / METADATA_NAME
        root = self.folder.resolve()
        images: dict[str, list[tuple[Path, int]]] = defaultdict(list)
        try:
            lines = where.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read {where}: {getattr(exc, 'strerror', None) or type(exc).__name__}") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                raise BadInput(f"{where}: line {number} is not JSON") from None
            prompt = entry.get("prompt", entry.get("text")) if isinstance(entry, dict) else None
            name = entry.get("file_name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not isinstance(prompt, str) or not prompt.strip():
                raise BadInput(f"{where}: line {number} needs string 'file_name' and 'prompt'")
            path = (self.folder / name).resolve()
            if root not in path.parents:
                raise BadInput(f"{where}: line {number}: {name!r} leaves the folder")
            if not path.is_file():
                raise BadInput(f"{where}: line {number}: image {self.folder / name} is missing")
            images[prompt.strip()].append((path, -1))
        return images

    def produce(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        for job in jobs:
            path, seed = self.images[job.prompt][job.sample_id]
            try:
                image = open_image(path)
            except ValueError as exc:  # changed since prepare checked it
                yield Outcome(job, failed=f"{path} cannot be decoded ({exc})")
                continue
            yield Outcome(job, image=image, seed=seed)
