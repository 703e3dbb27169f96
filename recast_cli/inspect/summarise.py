"""``recast inspect --json``: a JSON-ready summary of any artifact (schema, provenance, per-reward rows).

One ``summarise_<kind>`` per artifact kind; :data:`recast_cli.inspect.kinds.KINDS` says which reads which.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from recast_cli.artifacts import (
    PROVENANCE_KEYS,
    lambda_hat,
    CellTable,
    CurveTable,
    EvalTable,
    JUDGEMENTS_SCHEMA,
    GainTable,
    Positives,
    Provenance,
    ScoreTable,
    WeightMatrix,
)
from recast_cli.errors import BadInput
from recast_cli.solve.conflict import conflicts_on_grid
from recast_cli.solve.sinkhorn import spill_share
from recast_cli.inspect.load import CheckpointFolder, ParquetArtifact, RunFolder
from recast_cli.train.stall import DEFAULT_SMOOTHING, DEFAULT_WINDOW, StallRule, StallSpan, progress, recorded_stalls


SPARK = "▁▂▃▄▅▆▇█"
#: The width of a metrics reward's sparkline: its table fits 80 columns beside the progress columns.
SPARK_WIDTH = 24


def sparkline(values: np.ndarray, width: int = 30) -> str:
    """A one-line profile of ``values`` (binned to at most ``width`` characters), scaled to its max."""
    values = np.asarray(values, dtype=np.float64)
    if values.size > width:
        values = np.array([chunk.mean() for chunk in np.array_split(values, width)])
    top = values.max()
    if top <= 0:
        return SPARK[0] * values.size
    return "".join(SPARK[int(round(v / top * (len(SPARK) - 1)))] for v in np.clip(values, 0, None))


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


def summarise_eval(t: EvalTable) -> dict[str, Any]:
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


def summarise_curve(t: CurveTable) -> dict[str, Any]:
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


def summarise_cell(t: CellTable) -> dict[str, Any]:
    """A ``recast study`` cell: what it trained, and per scorer the mean ± sd over seeds at its last SDE point."""
    meta = t.meta
    sde = [k for k, (_, sampler) in enumerate(t.points) if sampler == "sde"]
    last = max(sde, key=lambda k: t.points[k][0]) if sde else len(t.points) - 1
    return {
        **_provenance_json(t.provenance),
        "kind": "cell",
        "setting": meta["setting"],
        "arm": {k: meta[k] for k in ("arm", "mode", "kernel", "gains")},
        "lambda": meta["lambda"],
        "rewards": list(t.rewards),
        "group_size": meta["group_size"],
        "prompts_per_step": meta["prompts_per_step"],
        "seeds": len(t.seeds),
        "training_steps": len(t.steps),
        "n": meta["n"],
        "points": [list(p) for p in t.points],
        "last_sde_step": t.points[last][0],
        "scorers": [{"scorer": name, **_stats(t.evals[:, last, j])} for j, name in enumerate(t.scorers)],
        "clip_frac_mean": float(np.mean(t.train["clip_frac"])),
        "gradient": meta["gradient"],
        "engine": meta.get("engine"),
    }


def _stall_rule(meta: dict[str, Any]) -> StallRule:
    """The stall detector's window and smoothing the run recorded (``[train] stall_*`` in the metrics'
    config), each as found when it is a positive integer, else the default."""
    config = meta.get("config")
    train = config.get("train") if isinstance(config, dict) else None
    train = train if isinstance(train, dict) else {}

    def steps(key: str, default: int) -> int:
        value = train.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else default

    return StallRule(window=steps("stall_window", DEFAULT_WINDOW), smoothing=steps("stall_smoothing", DEFAULT_SMOOTHING))


def _reward_progress(name: str, values: dict[int, float | None], rule: StallRule,
                     stalls: dict[str, StallSpan] | None) -> dict[str, Any]:
    """One reward's row: its mean per step at the start, the end and its best, its smoothed progress over the
    last window (``train/stall``), and the stall detector's flags as recorded (None: not recorded)."""
    curve = np.array([np.nan if values[s] is None else values[s] for s in sorted(values)], dtype=np.float64)
    finite = curve[np.isfinite(curve)]
    span = stalls.get(name) if stalls is not None else None
    return {
        "reward": name, "steps": len(curve), "first": float(curve[0]), "last": float(curve[-1]),
        "min": float(finite.min()) if finite.size else None, "max": float(finite.max()) if finite.size else None,
        "progress": float(progress(curve[:, None], rule.window, rule.smoothing)[-1, 0]),
        "stalled": None if span is None else span.since is not None,
        "stalled_steps": None if span is None else span.steps,
        "first_stalled_step": None if span is None else span.first,
        "stalled_since": None if span is None else span.since,
        "sparkline": sparkline(finite - finite.min(), width=SPARK_WIDTH) if finite.size else "",
    }


def summarise_metrics(a: ParquetArtifact) -> dict[str, Any]:
    _require_table_columns(a, ("step", "reward", "reward_mean"))
    wanted = ("step", "reward", "reward_mean", "stall", "aggregate", "loss", "kl", "clip_frac")
    columns = a.table.select([c for c in wanted if c in a.table.column_names]).to_pydict()
    rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
    by_step: dict[int, dict[str, Any]] = {}
    series: dict[str, dict[int, float | None]] = {}
    for row in rows:
        by_step.setdefault(row["step"], row)
        series.setdefault(row["reward"], {})[row["step"]] = _float(row["reward_mean"])
    steps = sorted(by_step)
    rule, stalls = _stall_rule(a.meta), recorded_stalls(columns)
    rewards = [_reward_progress(name, values, rule, stalls) for name, values in series.items()]
    first, last = (by_step[steps[0]], by_step[steps[-1]]) if steps else ({}, {})
    kl = [by_step[s].get("kl") for s in steps]
    return {
        **_meta_provenance(a.meta),
        "kind": "metrics",
        "steps": {"first": steps[0] if steps else None, "last": steps[-1] if steps else None, "count": len(steps)},
        "rewards": rewards,
        "stall_window": rule.window,
        "aggregate": {"first": _float(first.get("aggregate")), "last": _float(last.get("aggregate"))},
        "kl_mean": _stats([np.nan if v is None else v for v in kl])["mean"],
        "last_step": {"step": last.get("step"), **{k: _float(last.get(k)) for k in ("loss", "kl", "clip_frac")}},
    }


def summarise_image_scores(a: ParquetArtifact) -> dict[str, Any]:
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


def summarise_judgements(a: ParquetArtifact) -> dict[str, Any]:
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


def summarise_checkpoint(c: CheckpointFolder) -> dict[str, Any]:
    run = c.root.parent.parent
    in_run = c.root.parent.name == "checkpoints" and (run / "run.json").is_file()
    return {"schema": c.manifest.get("schema"), "kind": "checkpoint", **_checkpoint_facts(c),
            "run": str(run) if in_run else None}


def summarise_run(r: RunFolder) -> dict[str, Any]:
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
        metrics = summarise_metrics(r.metrics)
        summary["metrics"] = {k: v for k, v in metrics.items() if k not in (*PROVENANCE_KEYS, "kind")}
    return summary


def summarise_scores(artifact: ScoreTable) -> dict[str, Any]:
    scores = artifact.scores
    rows = [{"reward": name, "mean_t0": float(np.nanmean(scores[:, :, 0, 0, i])),
             "mean_tT": float(np.mean(scores[:, :, -1, :, i])),
             "mean_rollouts": float(np.mean(scores[:, :, 1:, :, i]))}
            for i, name in enumerate(artifact.rewards)]
    return {**_provenance_json(artifact.provenance), "kind": "scores", "T": artifact.meta["T"],
            "sigmas": artifact.meta["sigmas"], "run": {k: v for k, v in artifact.meta.items() if k != "sigmas"},
            "prompts_in_file": len(artifact.prompt_ids), "rewards": rows}


def summarise_positives(artifact: Positives) -> dict[str, Any]:
    per_prompt = [len([s for s in artifact.samples if s.prompt_id == pid])
                  for pid in sorted({s.prompt_id for s in artifact.samples})]
    return {**_provenance_json(artifact.provenance), "kind": "positives", "prompts": len(per_prompt),
            "images": len(artifact.samples), "per_prompt": [min(per_prompt), max(per_prompt)],
            "sources": sorted({s.source for s in artifact.samples}), "reward_sets": list(artifact.rewards()),
            "run": artifact.meta}


def summarise_gains(t: GainTable) -> dict[str, Any]:
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
    corr = t.meta.get("advantage_corr")
    return {
        **_provenance_json(t.provenance),
        "kind": "gains",
        "T": t.T,
        "sigmas": t.sigmas.tolist(),
        "run": t.meta,
        "rewards": rows,
        "draws": None if t.gain_draws is None else int(t.gain_draws.shape[0]),
        "conflicts": None if corr is None else [c.to_json() for c in conflicts_on_grid(corr, t.sigmas, t.sigmas)],
    }


def summarise_weights(w: WeightMatrix) -> dict[str, Any]:
    trained = np.array(w.steps) - 1
    spill = spill_share(w.W[:, trained], w.gain[:, trained])
    lam_hat = lambda_hat(w.lam)
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
            **({"W_band": [w.band[0][i].tolist(), w.band[1][i].tolist()]} if w.band is not None else {}),
        }
        for i, name in enumerate(w.rewards)
    ]
    return {
        **_provenance_json(w.provenance),
        "kind": "weights",
        "mode": w.mode,
        "tau": w.tau,
        "kernel": w.kernel,
        "T": w.T,
        "trained_steps": list(w.steps),
        "trained_steps_recorded": w.trained_steps is not None,
        "sigmas": w.sigmas.tolist(),
        "column_sums": w.W.sum(axis=0).tolist(),
        "solver": w.info,
        "rewards": rows,
    }
