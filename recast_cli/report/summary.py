"""What ``recast inspect`` shows: a JSON-ready summary of any artifact and its rich rendering."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from recast_cli.artifacts import (
    CHECKPOINT_SCHEMA,
    PROVENANCE_KEYS,
    READERS,
    RUN_SCHEMA,
    CurveTable,
    EvalTable,
    IMAGE_SCORES_SCHEMA,
    JUDGEMENTS_SCHEMA,
    GainTable,
    Positives,
    Provenance,
    RunRecord,
    ScoreTable,
    WeightMatrix,
    artifact_schema,
    decode_metadata,
    list_checkpoints,
    read_image_scores,
    read_judgements,
    read_run,
)
from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from recast_cli.solve.sinkhorn import spill_share
from recast_cli.artifacts.metrics import METRICS_SCHEMA, read_metrics

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: np.ndarray, width: int = 30) -> str:
    """A one-line profile of ``values`` (binned to at most ``width`` characters), scaled to its max."""
    values = np.asarray(values, dtype=np.float64)
    if values.size > width:
        values = np.array([chunk.mean() for chunk in np.array_split(values, width)])
    top = values.max()
    if top <= 0:
        return SPARK[0] * values.size
    return "".join(SPARK[int(round(v / top * (len(SPARK) - 1)))] for v in np.clip(values, 0, None))




@dataclass(frozen=True)
class ParquetArtifact:
    """A Parquet artifact read as a table: training metrics, image scores or judgements."""

    kind: str
    table: pa.Table
    meta: dict[str, Any]
    path: Path


@dataclass(frozen=True)
class CheckpointFolder:
    """``RUN/checkpoints/step-NNNNNN``: its manifest and state as found, and whether it verifies."""

    root: Path
    step: int | None
    manifest: dict[str, Any]
    state: dict[str, Any]
    verified: bool
    problem: str | None


@dataclass(frozen=True)
class RunFolder:
    """A ``recast.run/1`` folder: run.json, its checkpoints (the latest verified), its metrics."""

    root: Path
    record: RunRecord
    steps: tuple[int, ...]
    latest: CheckpointFolder | None
    metrics: ParquetArtifact | None


Artifact = GainTable | WeightMatrix | ScoreTable | Positives | EvalTable | CurveTable | ParquetArtifact | \
    RunFolder | CheckpointFolder


def _parquet_artifact(kind: str, table: pa.Table, path: Path) -> ParquetArtifact:
    return ParquetArtifact(kind, table, decode_metadata(table.schema.metadata, str(path)), path)


def load_checkpoint(folder: Path) -> CheckpointFolder:
    """A checkpoint folder, verified against its manifest (``train.checkpoint.read_checkpoint``)."""
    from recast_cli.train.checkpoint import read_checkpoint

    try:
        _, state = read_checkpoint(folder)
        verified, problem = True, None
    except BadInput as exc:
        verified, problem = False, str(exc)
        state = _json_object(folder / "state.json")
    manifest = _json_object(folder / "manifest.json")
    step = manifest.get("step", state.get("step"))
    if not isinstance(step, int):
        match = re.fullmatch(r"step-(\d+)", folder.name)
        step = int(match[1]) if match else None
    return CheckpointFolder(folder, step, manifest, state, verified, problem)


def load_run(folder: Path) -> RunFolder:
    """A run folder: its record, the complete checkpoints (the latest one verified) and the metrics if any."""
    record = read_run(folder)
    found = list_checkpoints(folder)
    latest = load_checkpoint(found[-1][1]) if found else None
    metrics_path = folder / "metrics.parquet"
    metrics = _load_metrics(metrics_path) if metrics_path.is_file() else None
    return RunFolder(folder, record, tuple(step for step, _ in found), latest, metrics)


def _load_metrics(path: Path) -> ParquetArtifact:
    return _parquet_artifact("metrics", read_metrics(path), path)


def _load_image_scores(path: Path) -> ParquetArtifact:
    return _parquet_artifact("image-scores", read_image_scores(path), path)


def _load_judgements(path: Path) -> ParquetArtifact:
    return _parquet_artifact("judgements", read_judgements(path), path)


#: What ``recast inspect`` reads, by schema tag: the readers of ``recast_cli.artifacts`` (a run
#: folder is shown whole: its record, checkpoints and metrics), then the tags written elsewhere.
INSPECT_READERS: dict[str, Callable[[Path], Any]] = {
    **{tag: reader for tag, reader in READERS.items() if tag != RUN_SCHEMA},
    METRICS_SCHEMA: _load_metrics,
    IMAGE_SCORES_SCHEMA: _load_image_scores,
    JUDGEMENTS_SCHEMA: _load_judgements,
    RUN_SCHEMA: load_run,
    CHECKPOINT_SCHEMA: load_checkpoint,
}


def load_artifact(path: str | os.PathLike[str]) -> Artifact:
    """Any artifact by its schema tag (Parquet metadata, safetensors header) or its folder's marker file."""
    tag, p = artifact_schema(path)
    if tag is None:
        raise BadInput(f"{p}: no 'schema' tag in its metadata; not a recast artifact")
    if tag not in INSPECT_READERS:
        raise BadInput(f"{p}: schema tag {tag!r} is not one recast inspect reads ({', '.join(INSPECT_READERS)})")
    return INSPECT_READERS[tag](p)


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object file as found; {} when it is missing or not one (a checkpoint that fails to verify)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None, so ``json.dumps(allow_nan=False)`` takes it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


def _provenance_json(p: Provenance | None) -> dict[str, Any]:
    return p.to_metadata() if p is not None else {}


def summarise(artifact: Artifact) -> dict[str, Any]:
    """A JSON-serialisable description: schema, provenance, run facts and per-reward (per-scorer) rows.

    NaN and infinite numbers come out as None, so ``json.dumps(..., allow_nan=False)`` takes every summary.
    """
    if isinstance(artifact, EvalTable):
        summary = _summarise_eval(artifact)
    elif isinstance(artifact, CurveTable):
        summary = _summarise_curve(artifact)
    elif isinstance(artifact, ParquetArtifact):
        summary = {"metrics": _summarise_metrics, "image-scores": _summarise_image_scores,
                   "judgements": _summarise_judgements}[artifact.kind](artifact)
    elif isinstance(artifact, RunFolder):
        summary = _summarise_run(artifact)
    elif isinstance(artifact, CheckpointFolder):
        summary = _summarise_checkpoint(artifact)
    else:
        summary = _summarise_estimation(artifact)
    return json_safe(summary)


def _meta_provenance(meta: dict[str, Any]) -> dict[str, Any]:
    """The provenance keys an artifact's metadata carries, as they are."""
    return {k: meta[k] for k in PROVENANCE_KEYS if k in meta}


def _stats(values: Any) -> dict[str, Any]:
    """Mean, standard deviation (over the values, ddof 0, as ``recast evaluate`` prints it) and n of the finite values."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(arr.mean()), "std": float(arr.std()), "n": int(arr.size)}


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _require_table_columns(a: ParquetArtifact, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in a.table.column_names]
    if missing:
        raise BadInput(f"{a.path}: missing column(s) {', '.join(map(repr, missing))}")


def _summarise_eval(t: EvalTable) -> dict[str, Any]:
    meta = t.meta
    per_prompt = [sum(1 for im in t.images if im.prompt_id == pid) for pid in sorted({im.prompt_id for im in t.images})]
    summary = {
        **_provenance_json(t.provenance),
        "kind": "eval",
        "evaluated": {k: meta.get(k) for k in ("setting", "mode", "run", "train_seed", "checkpoint", "weights_key",
                                               "run_id")},
        "sampling": meta.get("sampling"),
        "prompts_source": meta.get("prompts_source"),
        "lambda": meta["lambda"],
        "rewards": meta["rewards"],
        "judges": [s for s, k in zip(t.scorers, t.kinds) if k == "judge"],
        "prompts": len(per_prompt),
        "seeds": len({im.seed for im in t.images}),
        "images": len(t.images),
        "per_prompt": [min(per_prompt), max(per_prompt)],
        "scorers": [{"scorer": name, "kind": kind, **_stats(t.scores[:, j])}
                    for j, (name, kind) in enumerate(zip(t.scorers, t.kinds))],
    }
    if meta["rewards"]:
        summary["aggregate"] = _stats(t.aggregate())
    return summary


def _summarise_curve(t: CurveTable) -> dict[str, Any]:
    meta = t.meta
    return {
        **_provenance_json(t.provenance),
        "kind": "curve",
        "evaluated": {k: meta.get(k) for k in ("setting", "mode", "run", "train_seed", "init", "weights_key")},
        "sampling": meta.get("sampling"),
        "lambda": meta["lambda"],
        "rewards": meta["rewards"],
        "n": t.n,
        "points": [{"step": step, "sampler": sampler,
                    **{name: float(t.mean[k, j]) for j, name in enumerate(t.scorers)},
                    "aggregate_std": float(t.std[k, -1])}
                   for k, (step, sampler) in enumerate(t.points)],
    }


def _summarise_metrics(a: ParquetArtifact) -> dict[str, Any]:
    _require_table_columns(a, ("step", "reward", "reward_mean"))
    wanted = ("step", "reward", "reward_mean", "aggregate", "loss", "kl", "clip_frac")
    rows = a.table.select([c for c in wanted if c in a.table.column_names]).to_pylist()
    by_step: dict[int, dict[str, Any]] = {}
    series: dict[str, dict[int, float | None]] = {}
    for row in rows:
        by_step.setdefault(row["step"], row)
        series.setdefault(row["reward"], {})[row["step"]] = _float(row["reward_mean"])
    steps = sorted(by_step)
    rewards = []
    for name, values in series.items():
        curve = np.array([np.nan if values[s] is None else values[s] for s in sorted(values)], dtype=np.float64)
        finite = curve[np.isfinite(curve)]
        rewards.append({
            "reward": name, "steps": len(curve), "first": float(curve[0]), "last": float(curve[-1]),
            "min": float(finite.min()) if finite.size else None, "max": float(finite.max()) if finite.size else None,
            "sparkline": sparkline(finite - finite.min()) if finite.size else "",
        })
    first, last = (by_step[steps[0]], by_step[steps[-1]]) if steps else ({}, {})
    kl = [by_step[s].get("kl") for s in steps]
    return {
        **_meta_provenance(a.meta),
        "kind": "metrics",
        "steps": {"first": steps[0] if steps else None, "last": steps[-1] if steps else None, "count": len(steps)},
        "rewards": rewards,
        "aggregate": {"first": _float(first.get("aggregate")), "last": _float(last.get("aggregate"))},
        "kl_mean": _stats([np.nan if v is None else v for v in kl])["mean"],
        "last_step": {"step": last.get("step"), **{k: _float(last.get(k)) for k in ("loss", "kl", "clip_frac")}},
    }


def _summarise_image_scores(a: ParquetArtifact) -> dict[str, Any]:
    _require_table_columns(a, ("image", "prompt", "scorer", "score"))
    scorer = a.table.column("scorer").to_pylist()
    score = a.table.column("score").to_numpy(zero_copy_only=False).astype(np.float64)
    names = list(dict.fromkeys(scorer))
    labels = np.array(scorer, dtype=object)
    return {
        **_meta_provenance(a.meta),
        "kind": "image-scores",
        "images": len(set(a.table.column("image").to_pylist())),
        "prompts": len(set(a.table.column("prompt").to_pylist())),
        "extras": [c for c in a.table.column_names if c not in ("image", "prompt", "scorer", "score")],
        "scorers": [{"scorer": name, **_stats(score[labels == name])} for name in names],
    }


def _summarise_judgements(a: ParquetArtifact) -> dict[str, Any]:
    _require_table_columns(a, ("pair", "order"))
    stored = a.meta.get("summary")
    if not isinstance(stored, dict):
        raise BadInput(f"{a.path}: no 'summary' object in the metadata ({JUDGEMENTS_SCHEMA} stores it there)")
    labels = (a.meta.get("config") or {}).get("labels")
    return {
        **_meta_provenance(a.meta),
        "kind": "judgements",
        "pairs": len(set(a.table.column("pair").to_pylist())),
        "verdicts": a.table.num_rows,
        "labels": labels if isinstance(labels, list) else None,
        "criteria": [{"criterion": name, **(values if isinstance(values, dict) else {})}
                     for name, values in stored.items()],
    }


def _checkpoint_facts(c: CheckpointFolder) -> dict[str, Any]:
    state = c.state
    return {
        "path": str(c.root),
        "step": c.step,
        "verified": c.verified,
        "problem": c.problem,
        "files": sorted((c.manifest.get("files") or {}) if isinstance(c.manifest.get("files"), dict) else {}),
        "state": {k: state.get(k) for k in ("mode", "weights", "weights_key", "run_key", "seed", "data_position",
                                            "processes")},
    }


def _summarise_checkpoint(c: CheckpointFolder) -> dict[str, Any]:
    run = c.root.parent.parent
    in_run = c.root.parent.name == "checkpoints" and (run / "run.json").is_file()
    return {"schema": c.manifest.get("schema"), "kind": "checkpoint", **_checkpoint_facts(c),
            "run": str(run) if in_run else None}


def _summarise_run(r: RunFolder) -> dict[str, Any]:
    record = r.record
    config = record.config
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    summary = {
        **_provenance_json(record.provenance),
        "kind": "run",
        "setting": config.get("setting"),
        "mode": record.mode,
        "weights": config.get("weights"),
        "weights_key": config.get("weights_key"),
        "weights_file": "weights.safetensors" if (r.root / "weights.safetensors").is_file() else None,
        "rewards": list(record.rewards),
        "lambda": list(record.lam),
        "seed": train.get("seed"),
        "max_steps": train.get("max_steps"),
        "processes": config.get("processes"),
        "checkpoints": list(r.steps),
        "latest_step": r.steps[-1] if r.steps else None,
        "latest": _checkpoint_facts(r.latest) if r.latest is not None else None,
        "metrics": None,
    }
    if len(record.sigmas) > 1:
        summary.update(T=len(record.sigmas) - 1, sigmas=list(record.sigmas))
    if r.metrics is not None:
        metrics = _summarise_metrics(r.metrics)
        summary["metrics"] = {k: v for k, v in metrics.items() if k not in (*PROVENANCE_KEYS, "kind")}
    return summary


def _summarise_estimation(artifact: GainTable | WeightMatrix | ScoreTable | Positives) -> dict[str, Any]:
    """Gain tables, weight matrices, scores tables and positives folders."""
    if isinstance(artifact, ScoreTable):
        scores = artifact.scores
        rows = [{"reward": name, "mean_t0": float(np.nanmean(scores[:, :, 0, 0, i])),
                 "mean_tT": float(np.mean(scores[:, :, -1, :, i])),
                 "mean_rollouts": float(np.mean(scores[:, :, 1:, :, i]))}
                for i, name in enumerate(artifact.rewards)]
        return {**_provenance_json(artifact.provenance), "kind": "scores", "T": artifact.meta["T"],
                "sigmas": artifact.meta["sigmas"], "run": {k: v for k, v in artifact.meta.items() if k != "sigmas"},
                "prompts_in_file": len(artifact.prompt_ids), "rewards": rows}
    if isinstance(artifact, Positives):
        per_prompt = [len([s for s in artifact.samples if s.prompt_id == pid])
                      for pid in sorted({s.prompt_id for s in artifact.samples})]
        return {**_provenance_json(artifact.provenance), "kind": "positives", "prompts": len(per_prompt),
                "images": len(artifact.samples), "per_prompt": [min(per_prompt), max(per_prompt)],
                "sources": sorted({s.source for s in artifact.samples}), "reward_sets": list(artifact.rewards()),
                "run": artifact.meta}
    if isinstance(artifact, GainTable):
        t = artifact
        rows = []
        for i, name in enumerate(t.rewards):
            row = {
                "reward": name,
                "D0": float(t.D[i, 0]),
                "total_gain": float(t.gain[i].sum()),
                "peak_t": int(t.peak_step()[i]),
                "gain": t.gain[i].tolist(),
            }
            if t.D_lo is not None and t.D_hi is not None:
                row["D0_interval"] = [float(t.D_lo[i, 0]), float(t.D_hi[i, 0])]
            rows.append(row)
        return {
            **_provenance_json(t.provenance),
            "kind": "gains",
            "T": t.T,
            "sigmas": t.sigmas.tolist(),
            "run": t.meta,
            "rewards": rows,
        }
    w = artifact
    trained = np.array(w.steps) - 1
    spill = spill_share(w.W[:, trained], w.gain[:, trained])
    lam_hat = np.asarray(w.lam) / max(w.lam)
    lam_hat = lam_hat / lam_hat.sum()
    rows = [
        {
            "reward": name,
            "lambda": w.lam[i],
            "lambda_hat": float(lam_hat[i]),
            "row_sum": float(w.W[i].sum()),
            "D0": float(w.gain[i].sum()),
            "peak_t": int(w.gain[i].argmax() + 1),
            "spill_share": None if np.isnan(spill[i]) else float(spill[i]),
            "W": w.W[i].tolist(),
        }
        for i, name in enumerate(w.rewards)
    ]
    return {
        **_provenance_json(w.provenance),
        "kind": "weights",
        "mode": w.mode,
        "tau": w.tau,
        "T": w.T,
        "trained_steps": list(w.steps),
        "trained_steps_recorded": w.trained_steps is not None,
        "sigmas": w.sigmas.tolist(),
        "column_sums": w.W.sum(axis=0).tolist(),
        "solver": w.info,
        "rewards": rows,
    }


def render(summary: dict[str, Any], path: str, console: Console) -> None:
    """Print a summary as a provenance panel and a per-reward table."""
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("schema", summary.get("schema") or "?")
    if "created_at" in summary:
        facts.add_row("created", f"{summary['created_at']} by recast {summary.get('recast_version', '?')}")
    # provenance sources are {path, sha256}; a positives summary's "sources" names its image generators instead
    sources = [s for s in summary.get("sources", []) if isinstance(s, dict)]
    for source in sources if len(sources) <= 5 else sources[:3]:
        facts.add_row("source", f"{source['path']}  sha256:{source['sha256'][:12]}")
    if len(sources) > 5:
        facts.add_row("source", f"… and {len(sources) - 3} more (--json lists them all)")
    if "sigmas" in summary:
        sig = summary["sigmas"]
        family = (summary.get("run") or {}).get("grid") if isinstance(summary.get("run"), dict) else None
        shown = f" ({GridSpec.from_json(family).describe()})" if isinstance(family, dict) else ""
        facts.add_row("grid", f"T = {summary['T']}, σ from {min(sig):.4g} to {max(sig):.4g}{shown}")
    if summary["kind"] == "positives":
        facts.add_row("images", f"{summary['images']} for {summary['prompts']} prompts "
                                f"({summary['per_prompt'][0]}–{summary['per_prompt'][1]} per prompt)")
        facts.add_row("sources", ", ".join(summary["sources"]))
        facts.add_row("reward sets", ", ".join(summary["reward_sets"]) or "one set for every reward")
        table = None
    elif summary["kind"] == "scores":
        run = summary["run"]
        facts.add_row("run", ", ".join(f"{k}={run[k]}" for k in ("run_id", "N", "K", "P", "sampling", "crn",
                                                                   "rollout_noise", "shard") if k in run))
        table = Table(title="mean raw score per reward", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("reward", "samples (t = 0)", "rollouts from noise (t = T)", "all rollouts"):
            table.add_column(col, justify="left" if col == "reward" else "right", no_wrap=True)
        for r in summary["rewards"]:
            table.add_row(r["reward"], f"{r['mean_t0']:.4g}", f"{r['mean_tT']:.4g}", f"{r['mean_rollouts']:.4g}")
    elif summary["kind"] == "gains":
        run = summary["run"]
        facts.add_row("run", ", ".join(f"{k}={run[k]}" for k in ("alpha", "beta", "N", "K", "P", "sampling",
                                                                   "crn", "monotone") if k in run))
        table = Table(title="per reward", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("reward", style="bold", no_wrap=True)
        table.add_column("D_0", justify="right")
        table.add_column("peak t", justify="right")
        table.add_column("gain: clean → noisy", no_wrap=True)
        for r in summary["rewards"]:
            d0 = f"{r['D0']:.4g}"
            if "D0_interval" in r:
                d0 += f" [{r['D0_interval'][0]:.3g}, {r['D0_interval'][1]:.3g}]"
            table.add_row(r["reward"], d0, str(r["peak_t"]), sparkline(np.array(r["gain"])))
    elif summary["kind"] in _RENDER:
        table = _RENDER[summary["kind"]](summary, facts)
    else:
        solver = summary["solver"]
        facts.add_row("mode", f"{summary['mode']}, τ = {summary['tau']:g}")
        if solver:
            facts.add_row("solver", f"{solver.get('iterations', 0)} iterations, "
                                    f"max marginal error {solver.get('marginal_error', float('nan')):.2e}")
        steps = summary.get("trained_steps") or list(range(1, summary["T"] + 1))
        Tp = len(steps)
        skipped = summary["T"] - Tp
        note = "" if summary.get("trained_steps_recorded", True) else " (not recorded: a file from before trained_steps)"
        facts.add_row("trained", (f"t = {steps[0]}…{steps[-1]}: {Tp} of T = {summary['T']} steps, the {skipped} "
                                  f"cleanest get W = 0 (--skip-clean {skipped})" if skipped else
                                  f"every step, T' = T = {summary['T']}") + note)
        col = np.array(summary["column_sums"])[np.array(steps) - 1]
        facts.add_row("columns", f"T'·Σ_i W_it over the trained steps from {col.min() * Tp:.6f} to {col.max() * Tp:.6f}")
        row_err = max(abs(r["row_sum"] - r["lambda_hat"]) for r in summary["rewards"])
        facts.add_row("rows", f"max |Σ_t W_it − λ̂_i| = {row_err:.1e}")
        table = Table(title="per reward (spill: share of W where the gain is < 1% of its peak)",
                      title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("reward", style="bold", no_wrap=True)
        for name in ("λ", "D_0", "peak t", "spill"):
            table.add_column(name, justify="right", no_wrap=True)
        table.add_column("W: clean → noisy", no_wrap=True)
        table.add_column("max T'·W", justify="right")
        for r in summary["rewards"]:
            spill = "—" if r["spill_share"] is None else f"{100 * r['spill_share']:.1f}%"
            table.add_row(r["reward"], f"{r['lambda']:g}", f"{r['D0']:.4g}",
                          str(r["peak_t"]), spill, sparkline(np.array(r["W"])),
                          f"{max(r['W']) * len(summary.get('trained_steps') or r['W']):.3f}")
    console.print(Panel(facts, title=f"{path}", title_align="left", expand=False))
    if table is not None:
        console.print(table)



def _num(value: Any, spec: str = ".4g") -> str:
    """A number for a table cell; "—" for a missing one (NaN in the data)."""
    return "—" if value is None else format(value, spec)


def _stats_table(title: str, rows: list[dict[str, Any]], first: str, extra: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(first, style="bold", no_wrap=True)
    if extra:
        table.add_column(extra, no_wrap=True)
    for name in ("mean", "std", "n"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        cells = [r[first]] + ([r[extra]] if extra else [])
        table.add_row(*cells, _num(r["mean"]), _num(r["std"]), str(r["n"]))
    return table


def _render_eval(summary: dict[str, Any], facts: Table) -> Table:
    what = summary["evaluated"]
    setting = what.get("setting") or {}
    if isinstance(setting, dict):
        facts.add_row("setting", f"{setting.get('name', '?')} ({setting.get('path', '?')})")
    if what.get("mode") == "base":
        facts.add_row("evaluated", "the base model")
    else:
        facts.add_row("evaluated", f"{what.get('mode')} run {what.get('run')}, train seed {what.get('train_seed')}")
    checkpoint = what.get("checkpoint")
    if isinstance(checkpoint, dict):
        facts.add_row("checkpoint", f"step {checkpoint.get('step')}: {checkpoint.get('path')}")
    sampling = summary.get("sampling")
    if isinstance(sampling, dict):
        facts.add_row("sampling", ", ".join(f"{k}={sampling[k]}" for k in ("steps", "guidance_scale", "resolution",
                                                                          "n", "seed") if k in sampling))
    facts.add_row("images", f"{summary['images']} for {summary['prompts']} prompts "
                            f"({summary['per_prompt'][0]}–{summary['per_prompt'][1]} per prompt), "
                            f"{summary['seeds']} seeds")
    if summary["rewards"]:
        facts.add_row("λ", ", ".join(f"{r}={lam:g}" for r, lam in zip(summary["rewards"], summary["lambda"])))
    table = _stats_table("per scorer (over images)", summary["scorers"], "scorer", "kind")
    if "aggregate" in summary:
        a = summary["aggregate"]
        table.add_row("Σλ·r", "aggregate", _num(a["mean"]), _num(a["std"]), str(a["n"]))
    return table


def _render_curve(summary: dict[str, Any], facts: Table) -> Table:
    what = summary["evaluated"]
    setting = what.get("setting") or {}
    if isinstance(setting, dict):
        facts.add_row("setting", f"{setting.get('name', '?')} ({setting.get('path', '?')})")
    facts.add_row("evaluated", "the base policy" if what.get("mode") == "base" else
                  f"{what.get('mode')} run {what.get('run')}, train seed {what.get('train_seed')}")
    facts.add_row("samples", f"n = {summary['n']} per point, seeds seed + k")
    facts.add_row("λ", ", ".join(f"{r}={lam:g}" for r, lam in zip(summary["rewards"], summary["lambda"])))
    table = Table(title="mean per (step, sampler)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("step", "sampler", *summary["rewards"], "Σλ·r"):
        table.add_column(name, justify="right")
    for p in summary["points"]:
        table.add_row(str(p["step"]), p["sampler"], *(_num(p[r]) for r in summary["rewards"]), _num(p["aggregate"]))
    return table


def _metrics_facts(m: dict[str, Any], facts: Table) -> Table | None:
    steps = m["steps"]
    if not steps["count"]:
        facts.add_row("steps", "none yet")
        return None
    facts.add_row("steps", f"{steps['first']} (1 step)" if steps["count"] == 1 else
                  f"{steps['first']}..{steps['last']} ({steps['count']} steps)")
    facts.add_row("aggregate", f"Σλ·r {_num(m['aggregate']['first'])} → {_num(m['aggregate']['last'])}")
    last = m["last_step"]
    facts.add_row("last step", f"loss {_num(last['loss'])}, kl {_num(last['kl'])}, "
                               f"clip_frac {_num(last['clip_frac'])}; mean kl over steps {_num(m['kl_mean'])}")
    table = Table(title="reward_mean per reward", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("reward", style="bold", no_wrap=True)
    for name in ("first", "last", "min", "max"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("over steps (min → max)", no_wrap=True)
    for r in m["rewards"]:
        table.add_row(r["reward"], _num(r["first"]), _num(r["last"]), _num(r["min"]), _num(r["max"]), r["sparkline"])
    return table


def _render_image_scores(summary: dict[str, Any], facts: Table) -> Table:
    facts.add_row("images", f"{summary['images']} images, {summary['prompts']} distinct prompts")
    if summary["extras"]:
        facts.add_row("extras", ", ".join(summary["extras"]))
    return _stats_table("per scorer (over images)", summary["scorers"], "scorer")


def _render_judgements(summary: dict[str, Any], facts: Table) -> Table:
    facts.add_row("pairs", f"{summary['pairs']} pairs, {summary['verdicts']} verdicts")
    if summary["labels"]:
        facts.add_row("labels", f"a = {summary['labels'][0]}, b = {summary['labels'][1]}")
    table = Table(title="stored summary per criterion (agree: both orders agree; 1st: non-tie verdicts for the "
                        "image shown first)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("criterion", style="bold", no_wrap=True)
    for name in ("a wins", "b wins", "ties", "win rate a", "agree", "1st"):
        table.add_column(name, justify="right", no_wrap=True)
    for c in summary["criteria"]:
        table.add_row(c["criterion"], *(str(c.get(k, "—")) for k in ("a_wins", "b_wins", "ties")),
                      *(_num(c.get(k), ".3f") for k in ("win_rate_a", "order_agreement", "first_position_share")))
    return table


def _checkpoint_rows(c: dict[str, Any], facts: Table, label: str) -> None:
    verdict = "manifest verifies" if c["verified"] else f"DOES NOT VERIFY: {c['problem']}"
    facts.add_row(label, f"step {c['step']}: {verdict}")
    state = {k: v for k, v in c["state"].items() if v is not None}
    if state:
        facts.add_row("state", ", ".join(f"{k}={v}" for k, v in state.items()))


def _render_checkpoint(summary: dict[str, Any], facts: Table) -> None:
    _checkpoint_rows(summary, facts, "checkpoint")
    facts.add_row("files", f"{len(summary['files'])} in the manifest")
    if summary["run"]:
        facts.add_row("run", summary["run"])


def _render_run(summary: dict[str, Any], facts: Table) -> Table | None:
    facts.add_row("setting", str(summary["setting"]))
    copy = f" (copied to {summary['weights_file']})" if summary["weights_file"] else ""
    facts.add_row("W", f"{summary['mode']}: {summary['weights']}{copy}")
    rewards, lam = summary["rewards"] or [], summary["lambda"] or []
    facts.add_row("λ", ", ".join(f"{r}={x:g}" for r, x in zip(rewards, lam)))
    facts.add_row("seed", str(summary["seed"]))
    steps = summary["checkpoints"]
    shown = ", ".join(map(str, steps[-8:]))
    facts.add_row("checkpoints", f"steps {'…, ' if len(steps) > 8 else ''}{shown}" if steps else "none")
    if summary["latest"] is not None:
        _checkpoint_rows(summary["latest"], facts, "latest")
    if summary["metrics"] is None:
        facts.add_row("metrics", "no metrics.parquet")
        return None
    return _metrics_facts(summary["metrics"], facts)


_RENDER = {
    "eval": _render_eval,
    "curve": _render_curve,
    "metrics": _metrics_facts,
    "image-scores": _render_image_scores,
    "judgements": _render_judgements,
    "run": _render_run,
    "checkpoint": _render_checkpoint,
}
