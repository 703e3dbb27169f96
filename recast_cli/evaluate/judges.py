"""``recast evaluate --add-judges EVAL``: the held-out judges, scored later, on the images an evaluation saved.

Judges are not needed to train, and some need what a training node may not have: a package that pins
another transformers (``hpsv3``, ``imagereward``: a side environment), a server (``unifiedreward``: a
vLLM endpoint), their own weights. So a study's evaluations score the training rewards only (``make
all``), and the judges are added afterwards (``make judges``): this module reads an evaluation table
(``recast.eval/1``), scores each judge on its saved PNGs (``EVAL.images/``, the 8-bit images every
score of ``recast evaluate`` is computed from, so a judge added later scores exactly the images a judge
scored in the same run would have), and rewrites the table atomically with the judges' columns added.
A judge the table has already is scored again and replaced. The policy is never built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from recast_cli import bounds
from recast_cli.artifacts import EvalTable, read_eval, write_eval
from recast_cli.artifacts.io import Source
from recast_cli.errors import BadInput
from recast_cli.evaluate.config import config_from_setting
from recast_cli.setting.load import load_setting


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
               device: str | None = None, quiet: bool = False) -> EvalTable:
    """Score the judges on the evaluation ``path``'s saved images and rewrite it with their columns."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from recast_cli.evaluate.stage import with_device
    from recast_cli.rewards import build_scorer

    table = read_eval(path, check_images=True)
    setting_path = (table.meta.get("setting") or {}).get("path") if isinstance(table.meta.get("setting"), dict) \
        else None
    if not setting_path or not Path(setting_path).is_file():
        raise BadInput(f"{path}: the setting it was evaluated with ({setting_path}) is not there; the judges' "
                       "options come from its [rewards.NAME] tables")
    setting = load_setting(setting_path)
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
        root = Path(path).parent
        scores = np.zeros((len(table.images), len(names)), dtype=np.float64)
        columns = [TextColumn("judges"), BarColumn(), MofNCompleteColumn(), TextColumn("images"),
                   TimeRemainingColumn()]
        with Progress(*columns, console=Console(stderr=True), disable=quiet) as progress:
            task = progress.add_task("judges", total=len(table.images))
            for lo in range(0, len(table.images), size):
                chunk = table.images[lo: lo + size]
                pictures = [_open(root / im.image_path) for im in chunk]
                for j, (name, scorer) in enumerate(zip(names, scorers)):
                    values = np.asarray(scorer.score(pictures, [im.prompt for im in chunk]), dtype=np.float64)
                    if values.shape != (len(chunk),) or not np.all(np.isfinite(values)):
                        raise RuntimeError(f"judge {name} returned {values.shape} values or non-finite scores")
                    scores[lo: lo + len(chunk), j] = values
                progress.advance(task, len(chunk))
    finally:
        for scorer in scorers:
            scorer.close()
    return _write(path, table, names, scores, options)


def _open(path: Path) -> Image.Image:
    with Image.open(path) as image:
        return image.convert("RGB")


def _write(path: Path, table: EvalTable, names: Sequence[str], scores: np.ndarray,
           options: dict[str, dict[str, Any]]) -> EvalTable:
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
              "judges_added": {"judges": added, "options": public_options({n: options[n] for n in names})}}
    sources = [*(old.sources if old is not None else ()), Source.of(path)]
    write_eval(path, new, config=config, sources=sources)
    return new
