"""``recast estimate``, ``merge`` and ``compare-gains``: the Typer commands over :mod:`recast_cli.estimate.stage`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from recast_cli.errors import BadInput

#: what the bootstrap resamples by default (estimate.gains.BOOTSTRAP_OVER; not imported: scipy stays out of --help)
BOOTSTRAP_DEFAULT = "auto"

out = Console()


def estimate_command(
    out_path: Path = typer.Option(..., "--out", help="Gain table to write (recast.gains/2); the scores go to "
                                                     "OUT.scores.parquet."),
    rewards: Optional[str] = typer.Option(None, help="Comma-separated rewards, e.g. clip,hps,pick,ocr."),
    policy: str = typer.Option("toy", help="gmm1d, a setting name (pipelines/NAME.toml), a .toml path, or a "
                                           "recast train run / checkpoint folder (its setting + LoRA)."),
    positives: Optional[Path] = typer.Option(None, help="recast.positives/1 folder (π⁺ surrogate images)."),
    prompts: Optional[Path] = typer.Option(None, help="Prompts file (π^old-sampling without positives)."),
    alpha: str = typer.Option("2", help="Rényi order(s), e.g. 2 or 0.25,0.5,2,4: one table per α, "
                                        "OUT-alpha{α}.parquet when several."),
    beta: Optional[float] = typer.Option(None, help="Tilt β of π⁺ ∝ π·exp(r̃/β) (default 1; gmm1d 0.5)."),
    standardise: Optional[bool] = typer.Option(None, "--standardise/--raw",
                                               help="Standardise rewards per prompt (default; gmm1d: raw)."),
    steps: int = typer.Option(25, help="Grid T of the estimate."),
    n: int = typer.Option(8, "--n", help="Positive samples per prompt (N)."),
    k: int = typer.Option(16, "--k", help="Rollouts per (sample, t) (K)."),
    p: Optional[int] = typer.Option(None, "--p", help="Use the first P prompts (gmm1d: P replicates, default 4)."),
    sampling: str = typer.Option("pplus", help="pplus (E6, default) | pold (E8)."),
    crn: bool = typer.Option(True, "--crn/--no-crn", help="Common random numbers across t."),
    rollout_noise: float = typer.Option(1.414, help="SDE noise level a of the rollouts (√2: exact reversal)."),
    guidance_scale: Optional[float] = typer.Option(None, "--cfg", help="CFG scale defining π^old."),
    monotone: str = typer.Option("isotonic", help="isotonic (default) | clip: how gains are made ≥ 0."),
    bootstrap: int = typer.Option(200, help="Bootstrap resamples for the intervals and the draws solve-w reads (0: none)."),
    bootstrap_over: str = typer.Option(BOOTSTRAP_DEFAULT, "--bootstrap-over",
                                       help="What the bootstrap resamples: auto (prompts from 10 prompts up, "
                                            "else samples) | prompts | samples (each prompt's N, the prompts fixed) "
                                            "| both (docs/trust.md)."),
    jackknife: bool = typer.Option(False, help="Delete-one-k jackknife against finite-K bias (α ≠ 2)."),
    seed: int = typer.Option(0),
    batch_size: int = typer.Option(64, help="Rollouts per model batch (does not change results)."),
    shard: Optional[str] = typer.Option(None, help="i/n: this process's share of prompts; merge with recast merge."),
    exact: bool = typer.Option(False, help="Analytic worlds only (--policy gmm1d, or a gmm1d/flow1d setting and its "
                                              "[world]): write the exact curves in the same schema."),
    from_scores: Optional[Path] = typer.Option(None, help="Recompute gains from a recast.scores/1 table "
                                                          "(no rollouts). With several --alpha values each table "
                                                          "goes to OUT-alpha{α}.parquet."),
) -> None:
    """Stage 1: Rényi gain curves per reward and step (E3-E8) to Parquet."""
    from recast_cli.estimate import config, stage

    opts = config.GainOptions(alphas=config.parse_alphas(alpha), beta=beta, standardise=standardise,
                             monotone=monotone, bootstrap=bootstrap, jackknife=jackknife,
                             bootstrap_over=bootstrap_over)
    config.check_gain_options(opts)
    outs = stage.output_paths(out_path, opts.alphas)
    if from_scores is not None:
        from recast_cli.artifacts import GAINS_SCHEMA, claim_output, read_scores

        for path in outs:
            claim_output(path, GAINS_SCHEMA, inputs=[from_scores])
        stage.gains_from_scores(read_scores(from_scores), opts, outs, from_scores)
        written = outs
    else:
        if rewards is None:
            raise BadInput("--rewards is required (e.g. --rewards toy_color,toy_shape,toy_sharpness)")
        cfg = config.EstimateConfig(
            policy=policy, rewards=tuple(r.strip() for r in rewards.split(",") if r.strip()), steps=steps, N=n, K=k,
            P=p, sampling=sampling, crn=crn, rollout_noise=rollout_noise, guidance_scale=guidance_scale, seed=seed,
            batch_size=batch_size, positives=str(positives) if positives else None,
            prompts_file=str(prompts) if prompts else None)
        if exact:
            config.check_config(cfg, opts)
            stage.exact_table(cfg, opts, out_path)
            written = outs
        else:
            written = stage.estimate(cfg, opts, out_path, shard=shard)
    for path in written:
        out.print(f"wrote {path}")
        for line in conflict_lines(path):
            out.print(line, highlight=False)


def conflict_lines(path: Path) -> list[str]:
    """What a written gain table says of conflicting rewards (E14, docs/trust.md); nothing for another file."""
    from recast_cli.artifacts import GAINS_SCHEMA, artifact_schema, read_gains
    from recast_cli.solve.conflict import compact_steps, conflicts_on_grid

    if not Path(path).is_file() or artifact_schema(path)[0] != GAINS_SCHEMA:
        return []
    table = read_gains(path)
    corr = table.meta.get("advantage_corr")
    if len(table.rewards) < 2 or table.meta.get("sampling") == "exact":
        return []
    if corr is None:
        return ["conflicts (E14): not measured — the rewards were not scored on the same rollouts (a positive set per "
                "reward) or K = 1; a --sampling pold estimate measures them (docs/trust.md)"]
    found = conflicts_on_grid(corr, table.sigmas, table.sigmas)
    if not found:
        return ["conflicts (E14): none — no pair's advantages anti-correlate at any step"]
    return [f"conflicts (E14): {c.pair[0]} and {c.pair[1]} at steps {compact_steps(c.steps)} (lowest ρ {c.rho:+.2f}); "
            "`solve-w` warns where W settles them by timing (docs/trust.md)" for c in found]


def merge_command(
    shards: list[Path] = typer.Argument(..., help="Scores tables of the shards of one run (OUT.scores.parquet)."),
    out_path: Path = typer.Option(..., "--out", help="Gain table to write; merged scores go to OUT.scores.parquet."),
    alpha: str = typer.Option("2", help="Rényi order(s) α, comma-separated (several: OUT-alpha{α}.parquet each)."),
    beta: Optional[float] = typer.Option(None, help="Tilt temperature β (default 1; 0.5 in the analytic world)."),
    standardise: Optional[bool] = typer.Option(None, "--standardise/--raw",
                                               help="Divide each reward by its std under π^old (default: on)."),
    monotone: str = typer.Option("isotonic", help="Make the gains non-negative: isotonic (PAVA) or clip."),
    bootstrap: int = typer.Option(200, help="Bootstrap resamples for the intervals and the draws solve-w reads (0: none)."),
    bootstrap_over: str = typer.Option(BOOTSTRAP_DEFAULT, "--bootstrap-over",
                                       help="What the bootstrap resamples: auto (prompts from 10 prompts up, "
                                            "else samples) | prompts | samples (each prompt's N, the prompts fixed) "
                                            "| both (docs/trust.md)."),
    jackknife: bool = typer.Option(False, help="Delete-one-k jackknife against finite-K bias (α ≠ 2)."),
    allow_partial: bool = typer.Option(False, "--allow-partial",
                                       help="Merge even when shards (prompts) of the run are missing: warn, and "
                                            "record them as 'partial' in the tables' metadata."),
) -> None:
    """Merge the scores of a sharded run and compute its gain tables (equal to an unsharded run)."""
    from recast_cli.artifacts import GAINS_SCHEMA, SCORES_SCHEMA, Source, claim_output, read_scores, write_scores
    from recast_cli.estimate import config, stage
    from recast_cli.estimate.merge import describe, merge_scores

    opts = config.GainOptions(alphas=config.parse_alphas(alpha), beta=beta, standardise=standardise,
                             monotone=monotone, bootstrap=bootstrap, jackknife=jackknife,
                             bootstrap_over=bootstrap_over)
    config.check_gain_options(opts)
    outs = stage.output_paths(out_path, opts.alphas)
    merged_path = stage.scores_path(out_path)
    claim_output(merged_path, SCORES_SCHEMA, inputs=shards)
    for path in outs:
        claim_output(path, GAINS_SCHEMA, inputs=shards)
    merged = merge_scores(shards, allow_partial=allow_partial)
    if "partial" in merged.meta:
        gap = merged.meta["partial"]
        sys.stderr.write(f"recast: warning: partial merge: {gap['prompts']} of the run's {gap['of']} prompts, "
                         f"{describe(gap)}; recorded as 'partial' in the tables' metadata\n")
    write_scores(merged_path, merged, config={"command": "merge"}, sources=[Source.of(s) for s in shards])
    stage.gains_from_scores(read_scores(merged_path), opts, outs, merged_path)
    for path in (merged_path, *outs):
        out.print(f"wrote {path}")


def compare_gains_command(
    a: Path = typer.Argument(..., help="Gain table A (recast.gains/1)."),
    b: Path = typer.Argument(..., help="Gain table B on the same grid."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Per reward: Pearson and Spearman correlation of two gain curves, peak t of each, ratio of totals (Table 5)."""
    from recast_cli.estimate.compare import compare_gains

    result = compare_gains(a, b)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, allow_nan=False) + "\n")
        return
    table = Table(title=f"gains of B = {b} against A = {a} (T = {result['T']})", title_justify="left")
    for column in ("reward", "Pearson", "Spearman", "peak t A", "peak t B", "total A", "total B", "B / A"):
        table.add_column(column, justify="left" if column == "reward" else "right")

    def num(x: float | None, fmt: str = ".3f") -> str:
        return "—" if x is None else format(x, fmt)

    for row in result["rewards"]:
        table.add_row(row["reward"], num(row["pearson"]), num(row["spearman"]), str(row["peak_t_a"]),
                      str(row["peak_t_b"]), num(row["total_a"], ".4g"), num(row["total_b"], ".4g"), num(row["ratio"]))
    out.print(table)
    for side in ("a", "b"):
        if result[f"only_in_{side}"]:
            out.print(f"only in {side.upper()}: {', '.join(result[f'only_in_{side}'])}")


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate_command)
    app.command("merge")(merge_command)
    app.command("compare-gains")(compare_gains_command)
