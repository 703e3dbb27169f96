"""``recast evaluate --add-judges EVAL``: the held-out judges, scored later, on the images an evaluation saved.

Judges are not needed to train, and some need what a training node may not have: a package that pins
another transformers (``hpsv3``, ``imagereward``: a side environment), a server (``unifiedreward``: a
vLLM endpoint), their own weights. So a study's evaluations score the training rewards only (``make
all``), and the judges are added afterwards (``make judges``): this module reads an evaluation table
(``recast.eval/1``), scores each judge on its saved PNGs (``EVAL.images/``, the 8-bit images every
score of ``recast evaluate`` is computed from, so a judge added later scores exactly the images a judge
scored in the same run would have), and rewrites the table atomically with the judges' columns added.
A judge the table has already is scored again and replaced. The policy is never built.

The images scored are the images the evaluation made: each saved PNG must be a regular file (not a
symbolic link) whose sha256 is the one the table recorded for it, and the setting's [policy] and
[world] must be those it recorded (``--allow-setting-change`` accepts an edit, recorded in the table);
anything else is one line naming the file, before any judge is built.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from recast_cli import bounds
from recast_cli.artifacts import EvalTable, read_eval, write_eval
from recast_cli.artifacts.evaluation import IMAGE_SHA256, EvalImage
from recast_cli.artifacts.io import Source
from recast_cli.artifacts.run import SETTING_CHANGES, file_problem, refuse_setting_change
from recast_cli.errors import BadInput
from recast_cli.evaluate.config import config_from_setting
from recast_cli.images import read_image
from recast_cli.setting.load import load_setting, policy_inputs, policy_values

#: the largest saved image read (bytes): far above any PNG recast evaluate writes, so a planted huge
#: file is refused without being read whole
MAX_IMAGE_BYTES = 256 << 20


def judge_names(table: EvalTable, setting, judges: Sequence[str] | None) -> tuple[str, ...]:
    """The judges to add: ``judges`` given, else the setting's ``[evaluate] judges``; BadInput for none, an
    unknown scorer or one that is a training reward of the table."""
    from recast_cli.rewards.registry import is_known, scorer_names

    cfg, _ = config_from_setting(setting)
    names = tuple(judges) if judges is not None else tuple(cfg.judges)
    if not names:
        raise BadInput(f"{setting.file.name}: no judges to add ([evaluate] judges is empty; give --judges A,B)")
    for name in names:
        if not is_known(name):
            raise BadInput(f"unknown scorer {name!r}; known: {', '.join(scorer_names())}")
        if label(name) in table.meta["rewards"]:
            raise BadInput(f"{label(name)} is a training reward of this evaluation, not a held-out judge")
    return names


def label(name: str) -> str:
    """A scorer's name in the table: ``NAME@URL`` is recorded as NAME."""
    return name.split("@", 1)[0]


def add_judges(path: Path, judges: Sequence[str] | None = None, batch_size: int | None = None,
               device: str | None = None, quiet: bool = False, allow_setting_change: bool = False) -> EvalTable:
    """Score the judges on the evaluation ``path``'s saved images (each checked against its recorded
    sha256) and rewrite it with their columns; the setting edited since the evaluation is refused unless
    ``allow_setting_change``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from recast_cli.evaluate.stage import with_device
    from recast_cli.rewards import build_scorer

    table = read_eval(path)
    root, hashes = Path(path).parent, table.meta.get(IMAGE_SHA256)
    if hashes is None:
        raise BadInput(f"{path} was written by an older recast, which did not record its images' sha256; "
                       "evaluate again to add judges")
    setting, changes = _setting(path, table, allow_setting_change)
    for im, digest in zip(table.images, hashes):  # every image, before any judge is built
        saved_image(root, im, digest)
    cfg, train = config_from_setting(setting)
    names = judge_names(table, setting, judges)
    size = batch_size if batch_size is not None else cfg.batch_size
    bounds.check("batch", size, "--batch-size")
    if device not in (None, "cpu", "cuda") and not str(device).startswith("cuda:"):
        raise BadInput(f"--device must be cpu or cuda, got {device!r}")
    options = {name: with_device(name, dict(train.reward_options.get(name, {})), device) for name in names}
    scorers = []
    try:
        for name in names:
            scorers.append(build_scorer(name, **options[name]))
        prompts = [im.prompt for im in table.images]
        for scorer in scorers:
            scorer.check_prompts(list(dict.fromkeys(prompts)))
        scores = np.zeros((len(table.images), len(names)), dtype=np.float64)
        columns = [TextColumn("judges"), BarColumn(), MofNCompleteColumn(), TextColumn("images"),
                   TimeRemainingColumn()]
        with Progress(*columns, console=Console(stderr=True), disable=quiet) as progress:
            task = progress.add_task("judges", total=len(table.images))
            for lo in range(0, len(table.images), size):
                chunk = table.images[lo: lo + size]
                pictures = [read_image(saved_image(root, im, digest), str(root / im.image_path), formats=("PNG",))
                            .convert("RGB") for im, digest in zip(chunk, hashes[lo: lo + size])]
                for j, (name, scorer) in enumerate(zip(names, scorers)):
                    values = np.asarray(scorer.score(pictures, [im.prompt for im in chunk]), dtype=np.float64)
                    if values.shape != (len(chunk),) or not np.all(np.isfinite(values)):
                        raise RuntimeError(f"judge {name} returned {values.shape} values or non-finite scores")
                    scores[lo: lo + len(chunk), j] = values
                progress.advance(task, len(chunk))
    finally:
        for scorer in scorers:
            scorer.close()
    return _write(path, table, names, scores, options, changes)


def _setting(path: Path, table: EvalTable, allow: bool):
    """The setting the evaluation ``path`` was made with (its judges' options are read from it), and what
    of its [policy] and [world] changed since, accepted with ``allow`` (BadInput otherwise)."""
    setting_path = (table.meta.get("setting") or {}).get("path") if isinstance(table.meta.get("setting"), dict) \
        else None
    problem = file_problem(setting_path) if isinstance(setting_path, str) and setting_path else "is not named"
    if problem:
        raise BadInput(f"{path}: the setting it was evaluated with ({setting_path}) {problem}; the judges' "
                       "options come from its [rewards.NAME] tables")
    setting = load_setting(setting_path)
    changes = refuse_setting_change(table.meta, policy_inputs(setting), policy_values(setting), where=str(path),
                                    setting=setting.file, since="the evaluation made its images", allow=allow)
    return setting, changes


def saved_image(root: Path, image: EvalImage, digest: str) -> bytes:
    """The bytes of an evaluation's saved image (``root / image.image_path``), or BadInput naming it: not
    a regular file (a symbolic link, a FIFO, a folder), larger than :data:`MAX_IMAGE_BYTES`, or not the
    image the evaluation saved (its sha256 differs from ``digest``, the table's record)."""
    path = root / image.image_path
    try:  # never through a symbolic link, never blocking on a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        why = "a symbolic link" if os.path.islink(path) else "missing" if not os.path.lexists(path) else \
            f"unreadable ({exc.strerror or exc})"
        raise BadInput(f"{path}: a saved image of this evaluation is {why}; restore the image it saved") from None
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadInput(f"{path}: a saved image of this evaluation is not a regular file; restore the image "
                           "it saved")
        data = fh.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES or hashlib.sha256(data).hexdigest() != digest:
        raise BadInput(f"{path} is not the image this evaluation saved (its sha256 differs from the table's "
                       "record); restore it, or evaluate again")
    return data


def _write(path: Path, table: EvalTable, names: Sequence[str], scores: np.ndarray,
           options: dict[str, dict[str, Any]], changes: Sequence[str]) -> EvalTable:
    from recast_cli.rewards.scoring import public_options

    added = [label(n) for n in names]
    keep = [j for j, s in enumerate(table.scorers) if s not in added]
    meta = dict(table.meta)
    meta["judges"] = [*[j for j in meta.get("judges", []) if j not in added], *added]
    new = replace(table, scorers=(*(table.scorers[j] for j in keep), *added),
                  kinds=(*(table.kinds[j] for j in keep), *("judge",) * len(added)),
                  scores=np.concatenate([table.scores[:, keep], scores], axis=1), meta=meta, provenance=None)
    old = table.provenance
    config = {**(old.config if old is not None else {}),
              "judges_added": {"judges": added, "options": public_options({n: options[n] for n in names}),
                               SETTING_CHANGES: list(changes)}}
    sources = [*(old.sources if old is not None else ()), Source.of(path)]
    write_eval(path, new, config=config, sources=sources)
    return new
