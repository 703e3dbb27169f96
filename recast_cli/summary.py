"""What ``recast inspect`` shows: a JSON-ready summary of any artifact and its rich rendering."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from recast_cli.artifacts import (
    MANIFEST_NAME,
    SCORES_SCHEMA,
    GainTable,
    Positives,
    Provenance,
    ScoreTable,
    WeightMatrix,
    artifact_kind,
    read_gains,
    read_positives,
    read_scores,
    read_weights,
)
from recast_cli.sinkhorn import spill_share

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


def load_artifact(path: str | os.PathLike[str]) -> GainTable | WeightMatrix | ScoreTable | Positives:
    """Any artifact by its schema tag: a positives folder (or its manifest), a gain or scores table, W."""
    p = Path(path)
    if p.is_dir() or p.name == MANIFEST_NAME:
        return read_positives(p if p.is_dir() else p.parent)
    if artifact_kind(p) == "safetensors":
        return read_weights(p)
    try:
        tag = json.loads((pq.read_schema(p).metadata or {}).get(b"schema", b"null"))
    except (pa.ArrowException, OSError, json.JSONDecodeError):
        tag = None  # read_gains below names the problem
    return read_scores(p) if tag == SCORES_SCHEMA else read_gains(p)


def _provenance_json(p: Provenance | None) -> dict[str, Any]:
    return p.to_metadata() if p is not None else {}


def summarise(artifact: GainTable | WeightMatrix) -> dict[str, Any]:
    """A JSON-serialisable description: schema, provenance, run facts and per-reward rows."""
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
    spill = spill_share(w.W, w.gain)
    lam_hat = np.asarray(w.lam) / np.sum(w.lam)
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
    facts.add_row("schema", summary.get("schema", "?"))
    facts.add_row("created", f"{summary.get('created_at', '?')} by recast {summary.get('recast_version', '?')}")
    for source in summary.get("sources", []):
        facts.add_row("source", f"{source['path']}  sha256:{source['sha256'][:12]}")
    if "sigmas" in summary:
        sig = summary["sigmas"]
        facts.add_row("grid", f"T = {summary['T']}, σ from {min(sig):.4g} to {max(sig):.4g}")
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
    else:
        solver = summary["solver"]
        facts.add_row("mode", f"{summary['mode']}, τ = {summary['tau']:g}")
        if solver:
            facts.add_row("solver", f"{solver.get('iterations', 0)} iterations, "
                                    f"max marginal error {solver.get('marginal_error', float('nan')):.2e}")
        col = np.array(summary["column_sums"])
        facts.add_row("columns", f"T·Σ_i W_it from {col.min() * summary['T']:.6f} to {col.max() * summary['T']:.6f}")
        row_err = max(abs(r["row_sum"] - r["lambda_hat"]) for r in summary["rewards"])
        facts.add_row("rows", f"max |Σ_t W_it − λ̂_i| = {row_err:.1e}")
        table = Table(title="per reward (spill: share of W where the gain is < 1% of its peak)",
                      title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("reward", style="bold", no_wrap=True)
        for name in ("λ", "D_0", "peak t", "spill"):
            table.add_column(name, justify="right", no_wrap=True)
        table.add_column("W: clean → noisy", no_wrap=True)
        table.add_column("max T·W", justify="right")
        for r in summary["rewards"]:
            spill = "—" if r["spill_share"] is None else f"{100 * r['spill_share']:.1f}%"
            table.add_row(r["reward"], f"{r['lambda']:g}", f"{r['D0']:.4g}",
                          str(r["peak_t"]), spill, sparkline(np.array(r["W"])), f"{max(r['W']) * summary['T']:.3f}")
    console.print(Panel(facts, title=f"{path}", title_align="left", expand=False))
    if table is not None:
        console.print(table)

