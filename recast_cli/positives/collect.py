"""Run a positives source into a ``recast.positives/1`` folder: normalise, write, resume.

Folder layout: ``DIR/manifest.parquet`` and ``DIR/images/PPPPP/SSSS.png`` (one sub-folder per
prompt_id; the ``self`` source names its files ``draw-SEED-HASH.png`` because rows of several
rewards share one draw). The manifest appears only when the run is complete. Until then
``DIR/.recast-partial.jsonl`` journals every image as soon as it is on disk, so an
interrupted or failed run continues where it stopped: a journalled or manifest image whose
bytes still match its sha256 is kept, anything else is made again. A folder made with other
generator settings (source, model, resolution, seed) is refused rather than mixed.

Every image is normalised to the policy's resolution R: alpha composited on white, the
largest centred square cropped, then resized to R x R with Pillow's Lanczos filter
(:func:`normalise`), and stored as PNG.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from recast_cli.artifacts import (
    JOURNAL_NAME,
    MANIFEST_NAME,
    POSITIVES_SCHEMA,
    PositiveSample,
    Source,
    atomic_write_bytes,
    check_writable,
    claim_folder,
    read_positives,
    sha256_file,
    write_positives_manifest,
)
from recast_cli.artifacts.regular import open_append
from recast_cli.errors import BadInput
from recast_cli.seeds import IMAGE_STRIDE, image_seed

RESIZE_FILTER = Image.Resampling.LANCZOS
RESIZE_RULE = "alpha on white; centre crop to the largest square; Lanczos resize to R x R; PNG"
MIN_RESOLUTION = 8


@dataclass(frozen=True)
class Job:
    """One wanted positive: ``reward`` is None unless the source makes one set per reward."""

    prompt_id: int
    prompt: str
    sample_id: int
    seed: int
    reward: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What a source made of a job: an image, a refusal of its prompt, or a failure.

    ``seed`` is the seed the image was made with (-1 when the generator takes none);
    ``shared_stem`` names a file that rows of several rewards share: it is stored as
    ``STEM-HASH.png`` (content-addressed, so a redrawn image never overwrites one that kept
    rows point to); without it the file is ``SSSS.png``.
    """

    job: Job
    image: Image.Image | None = None
    seed: int = -1
    shared_stem: str | None = None
    refused: str | None = None
    failed: str | None = None
    reward_std: float | None = None


class PositiveSource(ABC):
    """A generator of π⁺ surrogate images (docs/method.md §4, "Positive samples")."""

    #: the manifest's ``source`` column
    name: str = ""

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """What determines the images (kind, model, sizes): a resumed run must match it. No secrets."""

    def rewards(self) -> tuple[str | None, ...]:
        """One positive set per reward name, or (None,): one set that serves every reward."""
        return (None,)

    def prepare(self, prompts: Sequence[str], n: int) -> None:
        """Validate everything (BadInput) before the first byte is written."""

    @abstractmethod
    def produce(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        """One outcome per job, in any order."""

    def meta(self) -> dict[str, Any]:
        """Run facts for the manifest metadata (JSON, no secrets)."""
        return {}

    def inputs(self) -> list[Path]:
        """Input files recorded as provenance sources (path + sha256)."""
        return []


@dataclass
class RunReport:
    out: Path
    prompts: int
    rows: int
    new: int
    kept: int
    redone: int
    refused: dict[int, dict[str, str]]
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


class IncompleteRun(Exception):
    """Some images failed after their retries; the finished ones are journalled for a rerun."""

    def __init__(self, report: RunReport):
        self.report = report
        last = report.failures[-1]
        super().__init__(f"{len(report.failures)} image(s) failed (last: {last}); {report.new + report.kept} "
                         f"done are kept in {report.out}; rerun the same command to resume")


# --------------------------------------------------------------------------- images and prompts


def open_image(data: bytes | Path, max_pixels: int | None = None) -> Image.Image:
    """A fully decoded image from bytes or a file, its header size checked first (``recast_cli.images``);
    ValueError with the reason when it cannot be decoded or is too large."""
    from recast_cli.images import read_image

    try:
        return read_image(data, "", max_pixels)
    except BadInput as exc:
        raise ValueError(str(exc).split(": ", 1)[-1]) from None


def normalise(image: Image.Image, size: int) -> Image.Image:
    """RGB ``size`` x ``size``: alpha composited on white, centre crop to a square, Lanczos resize."""
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    image = image.convert("RGB")
    w, h = image.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    square = image.crop((left, top, left + side, top + side))
    return square if side == size else square.resize((size, size), RESIZE_FILTER)


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------- resume


def _fingerprint(source: PositiveSource, resolution: int, seed: int) -> dict[str, Any]:
    return json.loads(json.dumps({"source": source.identity(), "resolution": resolution, "seed": seed}))


def _load_prior(out: Path, fingerprint: dict[str, Any]) -> tuple[list[PositiveSample], dict[int, dict[str, str]]]:
    """Rows and refusals of an earlier run into ``out`` (manifest and journal), after a settings check."""
    rows: list[PositiveSample] = []
    refused: dict[int, dict[str, str]] = {}

    def check(found: Mapping[str, Any], where: Path) -> None:
        differs = sorted(k for k in fingerprint if found.get(k) != fingerprint[k])
        if differs:
            raise BadInput(f"{where} was made with other {', '.join(differs)} ({found.get(differs[0])!r}, now "
                           f"{fingerprint[differs[0]]!r}); use another --out or remove it")

    if (out / MANIFEST_NAME).is_file():
        done = read_positives(out, verify=False)
        check(done.meta, out / MANIFEST_NAME)
        rows.extend(done.samples)
        refused.update({int(r["prompt_id"]): r for r in done.meta.get("refused", [])})
    journal = out / JOURNAL_NAME
    if journal.is_file():
        lines = journal.read_text(encoding="utf-8", errors="replace").splitlines()
        for number, line in enumerate(lines):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line being written when the run stopped: that image is made again
            if number == 0:
                check(entry.get("header", {}), journal)
            elif "row" in entry:
                rows.append(PositiveSample(**entry["row"]))
            elif "refused" in entry:
                refused[int(entry["refused"]["prompt_id"])] = entry["refused"]
    return rows, refused


class _Journal:
    """Append-only record of finished images; each line is flushed and synced before the next job counts."""

    def __init__(self, out: Path, header: dict[str, Any], rows: Sequence[PositiveSample],
                 refused: Mapping[int, dict[str, str]]):
        self.path = out / JOURNAL_NAME
        lines = [{"header": header}, *({"row": dataclasses.asdict(r)} for r in rows),
                 *({"refused": r} for r in refused.values())]
        atomic_write_bytes(self.path, "".join(json.dumps(x) + "\n" for x in lines).encode())
        self.fh = open_append(self.path, "the journal", text=True)

    def add(self, entry: dict[str, Any]) -> None:
        self.fh.write(json.dumps(entry) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


# --------------------------------------------------------------------------- the run


def collect(source: PositiveSource, prompts: Sequence[str], n: int, out: str | os.PathLike[str], resolution: int, *,
            seed: int = 0, config: Mapping[str, Any] | None = None, sources: Sequence[Path] = (),
            console: Console | None = None) -> RunReport:
    """Make ``n`` positives per prompt (per reward for ``self``) in ``out``, resuming what is there.

    Raises BadInput before anything is written when an input is wrong, and
    :class:`IncompleteRun` (journal kept, no manifest) when images failed after their retries.
    A refused prompt is recorded in the manifest metadata (``refused``) and left out.
    """
    out = Path(out)
    _check_request(prompts, n, out, resolution)
    claim_folder(out, POSITIVES_SCHEMA)
    check_writable(out / MANIFEST_NAME)
    source.prepare(prompts, n)
    header = _fingerprint(source, resolution, seed)
    prior, refused = _load_prior(out, header) if out.is_dir() else ([], {})

    wanted = {(r, p, s) for r in source.rewards() for p in range(len(prompts)) for s in range(n)}
    refused = {p: r for p, r in refused.items() if p < len(prompts) and r.get("prompt") == prompts[p]}
    rows, redone = _kept_rows(out, prior, wanted, prompts, refused)
    jobs = [Job(p, prompts[p], s, image_seed(seed, p, s), r) for (r, p, s) in sorted(wanted, key=_order)
            if (r, p, s) not in rows and p not in refused]

    created = [d for d in (out, *out.parents) if not d.exists()]
    out.mkdir(parents=True, exist_ok=True)
    journal = _Journal(out, header, list(rows.values()), refused)
    report = RunReport(out, len(prompts), 0, 0, len(rows), redone, refused)
    start = time.monotonic()
    try:
        _produce(source, jobs, out, resolution, journal=journal, rows=rows, report=report, console=console)
    except BadInput:
        if not rows and not refused:  # stopped before anything was made (e.g. a rejected key): leave no trace
            journal.close()
            journal.path.unlink(missing_ok=True)
            for folder in created:
                folder.rmdir()
        raise
    finally:
        journal.close()
    report.seconds = time.monotonic() - start
    if report.failures:
        raise IncompleteRun(report)
    report.rows = _write_manifest(out, source, rows, refused, header=header, n=n, config=config, sources=sources)
    return report


def _check_request(prompts: Sequence[str], n: int, out: Path, resolution: int) -> None:
    """BadInput for a request that cannot make a positives folder, before the folder is touched."""
    if n < 1:
        raise BadInput(f"--n must be at least 1, got {n}")
    if n > IMAGE_STRIDE:
        raise BadInput(f"--n must be at most {IMAGE_STRIDE}, got {n}")
    if not isinstance(resolution, int) or resolution < MIN_RESOLUTION:
        raise BadInput(f"resolution must be an integer >= {MIN_RESOLUTION}, got {resolution!r}")
    if not prompts:
        raise BadInput("no prompts")
    if out.exists() and not out.is_dir():
        raise BadInput(f"cannot write into {out}: it is not a directory")


def _kept_rows(out: Path, prior: Sequence[PositiveSample], wanted: set[tuple[str | None, int, int]],
               prompts: Sequence[str], refused: Mapping[int, dict[str, str]],
               ) -> tuple[dict[tuple[str | None, int, int], PositiveSample], int]:
    """The earlier run's rows this run keeps, by (reward, prompt_id, sample_id), and how many are made again.

    A row is kept when it is still wanted, its prompt is unchanged and not refused, and its image's bytes
    still match its sha256 (each file hashed once: rows of several rewards share one); a row failing only
    the last test counts as redone.
    """
    rows: dict[tuple[str | None, int, int], PositiveSample] = {}
    digests: dict[Path, str] = {}
    redone = 0
    for row in prior:
        key = (row.reward, row.prompt_id, row.sample_id)
        if key not in wanted or row.prompt != prompts[row.prompt_id] or row.prompt_id in refused:
            continue
        path = out / row.image_path
        if path not in digests:
            digests[path] = sha256_file(path) if path.is_file() else ""
        if digests[path] == row.sha256:
            rows[key] = row
        else:
            redone += 1
    return rows, redone


def _produce(source: PositiveSource, jobs: Sequence[Job], out: Path, resolution: int, *, journal: _Journal,
             rows: dict[tuple[str | None, int, int], PositiveSample], report: RunReport,
             console: Console | None) -> None:
    """Run ``jobs`` through the source under a progress bar: each image stored and journalled as it comes
    (into ``rows``, counted in ``report``), a refused prompt journalled once (``report.refused``), a failure
    listed in ``report.failures``."""
    refused = report.refused
    columns = (TextColumn(f"positives ({source.name})"), BarColumn(), MofNCompleteColumn(),
               TextColumn("failures {task.fields[failures]}"), TimeRemainingColumn())
    with Progress(*columns, console=console or Console(stderr=True), transient=True) as progress:
        task = progress.add_task("positives", total=len(jobs), failures=0)
        for outcome in source.produce(jobs):
            job = outcome.job
            if outcome.refused is not None:
                if job.prompt_id not in refused:
                    refused[job.prompt_id] = {"prompt_id": job.prompt_id, "prompt": job.prompt,
                                              "reason": outcome.refused}
                    journal.add({"refused": refused[job.prompt_id]})
            elif outcome.failed is not None:
                report.failures.append(f"prompt {job.prompt_id} sample {job.sample_id}: {outcome.failed}")
            elif job.prompt_id not in refused:
                row = _store(out, outcome, resolution, source.name)
                rows[(job.reward, job.prompt_id, job.sample_id)] = row
                journal.add({"row": dataclasses.asdict(row)})
                report.new += 1
            progress.update(task, advance=1, failures=len(report.failures))


def _write_manifest(out: Path, source: PositiveSource, rows: Mapping[tuple[str | None, int, int], PositiveSample],
                    refused: Mapping[int, dict[str, str]], *, header: dict[str, Any], n: int,
                    config: Mapping[str, Any] | None, sources: Sequence[Path]) -> int:
    """Write the manifest of a complete run (the rows of prompts not refused, in job order) and remove the
    journal; returns how many rows it holds."""
    final = sorted((r for r in rows.values() if r.prompt_id not in refused), key=lambda r: _order(
        (r.reward, r.prompt_id, r.sample_id)))
    meta = {**header, "n": n, "resize": RESIZE_RULE, "refused": sorted(refused.values(), key=lambda r: r["prompt_id"]),
            **source.meta()}
    write_positives_manifest(out, final, meta=meta, config=config,
                             sources=[Source.of(p) for p in [*sources, *source.inputs()]])
    (out / JOURNAL_NAME).unlink(missing_ok=True)
    return len(final)


def _order(key: tuple[str | None, int, int]) -> tuple[str, int, int]:
    return (key[0] or "", key[1], key[2])


def _store(out: Path, outcome: Outcome, resolution: int, source_name: str) -> PositiveSample:
    """Normalise and write one image (atomically; an identical file already there is reused)."""
    job = outcome.job
    data = png_bytes(normalise(outcome.image, resolution))
    digest = hashlib.sha256(data).hexdigest()
    name = f"{job.sample_id:04d}.png" if outcome.shared_stem is None else f"{outcome.shared_stem}-{digest[:12]}.png"
    rel = f"images/{job.prompt_id:05d}/{name}"
    path = out / rel
    if not (path.is_file() and sha256_file(path) == digest):
        atomic_write_bytes(path, data)
    return PositiveSample(job.prompt_id, job.prompt, job.sample_id, rel, source_name, outcome.seed, digest,
                          job.reward, outcome.reward_std)

