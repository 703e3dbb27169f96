"""The reward commands of ``recast``: ``score``, ``serve-reward`` and ``judge`` (a thin shell; ``register`` adds them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from recast_cli import bounds

out = Console()
err = Console(stderr=True)

MAX_IMAGE_ROWS = 20


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=err, transient=True)


def _deprecated_weights(given, command: str):
    """The value of the old ``--weights`` of ``score`` / ``serve-reward`` (it means W in ``train`` and
    ``report``), with one warning line on stderr when it is used."""
    if given:
        err.print(f"warning: --weights is deprecated for {command}; use --reward-weights", highlight=False)
    return given


def score_command(
    rewards: str = typer.Option(..., "--rewards", help="Scorers, comma-separated (clip,hps,pick,ocr,...); "
                                                       "NAME@URL scores through a `recast serve-reward NAME` server."),
    images: list[Path] = typer.Option(..., "--images", help="A folder of images, or image files (repeatable)."),
    more_images: Optional[list[Path]] = typer.Argument(None, help="More image files (so --images *.png works)."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="One prompt for every image."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="Text file: one prompt per line, in image order."),
    out_path: Path = typer.Option(..., "--out", help="Output Parquet (recast.image-scores/1)."),
    weights: list[str] = typer.Option([], "--reward-weights", help="NAME=PATH: a scorer's weights (repeatable)."),
    old_weights: list[str] = typer.Option([], "--weights", hidden=True, help="Deprecated: --reward-weights."),
    opt: list[str] = typer.Option([], "--opt", help="NAME.OPTION=VALUE: any other scorer option (repeatable)."),
    device: str = typer.Option("cpu", help="Torch device for model scorers (cpu, cuda, cuda:1)."),
    batch_size: int = typer.Option(16, "--batch-size", help="Images per scoring batch."),
) -> None:
    """Score images with any scorers: one row per image x scorer (image, prompt, scorer, score, extras)."""
    from recast_cli.artifacts import IMAGE_SCORES_SCHEMA, claim_output, write_image_scores
    from recast_cli.errors import BadInput, refuse_duplicates
    from recast_cli.rewards import scoring

    bounds.check("batch", batch_size, "--batch-size")
    weights = [*weights, *_deprecated_weights(old_weights, "score")]
    names = [n.strip() for n in rewards.split(",") if n.strip()]
    if not names:
        raise BadInput("--rewards names no scorer")
    refuse_duplicates(names, "--rewards")
    options = scoring.scorer_options(names, weights, opt, device, batch_size)
    claim_output(out_path, IMAGE_SCORES_SCHEMA)
    paths = scoring.collect_images([*images, *(more_images or [])])
    texts = scoring.read_prompts(prompt, prompts, len(paths))
    pixels = scoring.image_pixels(paths)  # from the headers: every limit checked before anything is decoded
    scorers = scoring.build_scorers(options)
    try:
        with _progress() as progress:
            task = progress.add_task("scoring", total=len(paths) * len(scorers))
            table = scoring.score_images(scorers, paths, pixels, texts, batch_size,
                                         advance=lambda n: progress.advance(task, n))
    finally:
        for scorer in scorers.values():
            scorer.close()
    config = {"rewards": names, "options": scoring.public_options(options), "device": device,
              "batch_size": batch_size}
    sources = [*paths, *([prompts] if prompts is not None else [])]
    write_image_scores(out_path, table, config, sources)
    _print_scores(table)
    out.print(f"wrote {out_path}")


def _print_scores(table) -> None:
    summary = Table(title=f"scores of {len(table.images)} images", title_justify="left")
    for column in ("scorer", "mean", "std", "min", "max"):
        summary.add_column(column, justify="left" if column == "scorer" else "right")
    for name, values in table.scores.items():
        summary.add_row(name, *(f"{f(values):.4f}" for f in (np.mean, np.std, np.min, np.max)))
    out.print(summary)
    if len(table.images) <= MAX_IMAGE_ROWS:
        detail = Table(title_justify="left")
        detail.add_column("image")
        for name in table.scores:
            detail.add_column(name, justify="right")
        for i, image in enumerate(table.images):
            detail.add_row(image, *(f"{table.scores[n][i]:.4f}" for n in table.scores))
        out.print(detail)


def serve_reward_command(
    name: str = typer.Argument(..., help="The registered scorer to serve (clip, hps, imagereward, ...)."),
    port: int = typer.Option(8765, min=0, max=65535, help="TCP port (0: any free port, printed)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs a token."),
    token: Optional[str] = typer.Option(None, help="Bearer token clients must send (default: $RECAST_REWARD_TOKEN)."),
    weights: Optional[str] = typer.Option(None, "--reward-weights", help="The scorer's weights (its `weights` "
                                                                         "option)."),
    old_weights: Optional[str] = typer.Option(None, "--weights", hidden=True, help="Deprecated: --reward-weights."),
    opt: list[str] = typer.Option([], "--opt", help="OPTION=VALUE: any other scorer option (repeatable)."),
    device: str = typer.Option("cpu", help="Torch device for model scorers."),
    batch_size: int = typer.Option(16, "--batch-size", help="Images per scoring batch inside the server."),
    max_batch: Optional[int] = typer.Option(None, "--max-batch", help="Most images one request may hold "
                                                                      "(default: --batch-size, one batch of the "
                                                                      "scorer; the body limit is derived from it, "
                                                                      "and clients are told it)."),
    max_pixels: int = typer.Option(1024 * 1024, "--max-pixels", help="Most pixels per image (checked from "
                                                                     "the PNG header: HTTP 413)."),
    max_connections: int = typer.Option(64, "--max-connections", help="Most connections open at once "
                                                                      "(one thread each); idle ones without an "
                                                                      "authenticated request make room, and when "
                                                                      "all are busy: HTTP 503."),
    min_upload_rate: int = typer.Option(1024, "--min-upload-rate", min=1, max=1024 * 1024,
                                        help="KiB/s a request body must keep up on average after a 5 s "
                                             "grace, checked every 5 s (behind: HTTP 408, closed); a body gets "
                                             "5 s plus its length at this rate (at most 300 s, unless the "
                                             "largest allowed body needs more)."),
) -> None:
    """Serve one scorer over HTTP (recast.reward/1: JSON + base64 PNG, token-checked, never pickle)."""
    from recast_cli.errors import BadInput
    from recast_cli.rewards import remote, scoring, server

    if weights is not None and old_weights is not None:
        raise BadInput("give --reward-weights (not the deprecated --weights) once")
    weights = weights if weights is not None else _deprecated_weights(old_weights, "serve-reward")
    max_batch = batch_size if max_batch is None else max_batch
    bounds.check_all(("batch", "--batch-size", batch_size), ("batch", "--max-batch", max_batch),
                     ("max_pixels", "--max-pixels", max_pixels),
                     ("connections", "--max-connections", max_connections))
    options = scoring.scorer_options([name], [f"{name}={weights}"] if weights else [],
                                     [f"{name}.{item}" for item in opt], device, batch_size)
    scorer = scoring.build_scorers(options)[name]
    server.serve(scorer, host, port, token or os.environ.get(remote.TOKEN_ENV) or None,
                 announce=lambda line: out.print(line, highlight=False, soft_wrap=True), max_batch=max_batch,
                 max_pixels=max_pixels, max_connections=max_connections, min_rate=min_upload_rate * 1024)


def judge_command(
    pairs: Path = typer.Option(..., "--pairs", help="CSV or Parquet with columns prompt, image_a, image_b."),
    url: str = typer.Option(..., "--url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 "
                                               "(API key, if any: $RECAST_VLM_API_KEY)."),
    model: str = typer.Option(..., "--model", help="Model name the endpoint serves."),
    out_path: Path = typer.Option(..., "--out", help="Output Parquet (recast.judgements/1)."),
    criteria: str = typer.Option("faithfulness,aesthetics", help="Rubric criteria, comma-separated."),
    label_a: str = typer.Option("A", help="Name of the image_a system in the summary."),
    label_b: str = typer.Option("B", help="Name of the image_b system in the summary."),
    timeout: float = typer.Option(120.0, help="Seconds per request."),
    retries: int = typer.Option(3, help="Tries per request."),
) -> None:
    """Judge image pairs in both presentation orders with a VLM; position-debiased win rates (Table 3)."""
    from recast_cli.artifacts import JUDGEMENTS_SCHEMA, claim_output, write_judgements
    from recast_cli.errors import refuse_duplicates
    from recast_cli.rewards import judge

    bounds.check("tries", retries, "--retries")
    names = tuple(c.strip() for c in criteria.split(",") if c.strip())
    refuse_duplicates([n.lower() for n in names], "--criteria")  # before the pairs are read
    claim_output(out_path, JUDGEMENTS_SCHEMA)
    items = judge.read_pairs(pairs)
    client = judge.PairwiseJudge(url, model, criteria=names, timeout=timeout, retries=retries)
    with _progress() as progress:
        task = progress.add_task("judging", total=2 * len(items))
        verdicts = client.judge_pairs(items, advance=lambda: progress.advance(task))
    summary = judge.win_rates(verdicts, names)
    write_judgements(out_path, verdicts, summary, {"url": url, "model": model, "criteria": list(names),
                                                         "labels": [label_a, label_b]}, [pairs], items)
    table = Table(title=f"{label_a} vs {label_b}: position-debiased win rates ({len(items)} pairs, both orders)",
                  title_justify="left")
    for column in ("criterion", f"{label_a} wins", "ties", f"{label_b} wins", f"{label_a} win rate"):
        table.add_column(column, justify="left" if column == "criterion" else "right")
    for criterion, row in summary.items():
        table.add_row(criterion, str(row["a_wins"]), str(row["ties"]), str(row["b_wins"]), f"{row['win_rate_a']:.3f}")
    out.print(table)
    out.print(f"wrote {out_path}")


def register(app: typer.Typer) -> None:
    """Add ``score``, ``serve-reward`` and ``judge`` to the ``recast`` app."""
    app.command("score")(score_command)
    app.command("serve-reward")(serve_reward_command)
    app.command("judge")(judge_command)
