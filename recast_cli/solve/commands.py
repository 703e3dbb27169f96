"""``recast solve-w``: the Typer command over :mod:`recast_cli.solve.stage`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from recast_cli.solve.sinkhorn import DEFAULT_FLOOR, DEFAULT_KERNEL, DEFAULT_TAU, lambda_hat

out = Console()
err = Console(stderr=True)


def solve_w_command(
    gains: Path = typer.Option(..., "--gains", help="Gain table (recast.gains/1 Parquet)."),
    lam: str = typer.Option(..., "--lambda", help="Budgets by position (1,1,2) or by name (clip=1,ocr=2)."),
    out_path: Path = typer.Option(..., "--out", help="Output weight matrix (.safetensors)."),
    mode: str = typer.Option("recast", help="recast (Sinkhorn, E12) | nosink (rows only) | static (λ̂/T) | "
                                            "reversed (recast's columns in reverse step order: a timing control)."),
    tau: float = typer.Option(DEFAULT_TAU, help="Temperature τ of the affinity kernel (E11: K = exp(ΔD̄/τ); "
                                                "E11p: K = ΔD̄^(1/τ))."),
    kernel: str = typer.Option(DEFAULT_KERNEL, "--kernel", help="Affinity kernel: exp (E11, the paper's) | power "
                                                                "(E11p: blind to each gain row's scale)."),
    steps: Optional[int] = typer.Option(None, help="Solve on a grid of this many steps (E9 resampling)."),
    grid: Optional[str] = typer.Option(None, help="Grid family for --steps: linear | flowmatch | dynamic "
                                                  "(default: the one the gain table records)."),
    shift: Optional[float] = typer.Option(None, help="Shift of the flowmatch grid (SD3.5: 3.0)."),
    mu: Optional[float] = typer.Option(None, help="Time shift μ of the dynamic grid (FLUX, Qwen-Image: set by the "
                                                  "resolution; `recast check-setting` prints it)."),
    floor: float = typer.Option(DEFAULT_FLOOR, help="Rows whose total gain is below floor x the largest "
                                                    "are indiscriminable and become uniform (E10)."),
    shrink: float = typer.Option(1.0, "--shrink", help="γ in (0, 1]: write (1 − γ)·static + γ·W (E12s: W pulled "
                                                      "toward static; rows and columns still hold). 1: W as solved."),
    skip_clean: int = typer.Option(0, "--skip-clean", help="The K cleanest steps t = 1…K are not trained: W = 0 "
                                                           "there, the solve runs over the other T − K steps."),
) -> None:
    """Turn a gain table into the reward x step weight matrix W (E9-E12)."""
    from recast_cli.solve.stage import solve_w

    with err.status("solving W (Sinkhorn)", spinner="dots"):  # on stderr; a long solve (small τ) shows it works
        report = solve_w(gains, lam, out_path, mode=mode, tau=tau, steps=steps, grid=grid, shift=shift, mu=mu,
                         floor=floor, skip_clean=skip_clean, kernel=kernel, shrink=shrink)
    for warning in report.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    w = report.weights
    info = w.info
    if mode in ("recast", "reversed"):
        out.print(f"Sinkhorn: {info['iterations']} iterations, max marginal error {info['marginal_error']:.2e}")
    if info["resampled"]:
        out.print(f"gains resampled from T = {info['source_T']} to T = {w.T} through D(σ) (E9)")
    trained = f", trained steps {w.skip_clean + 1}…{w.T}" if w.skip_clean else ""
    kind = ("" if kernel == DEFAULT_KERNEL else f", {kernel} kernel") + ("" if shrink == 1.0 else f", shrunk γ = {shrink:g}")
    table = Table(title=f"W ({mode}{kind}, τ = {tau:g}, T = {w.T}{trained})", title_justify="left")
    for name in ("reward", "λ", "λ̂", "peak t", "spill <1% peak"):
        table.add_column(name, justify="left" if name == "reward" else "right")
    lam_hat = lambda_hat(w.lam)
    for i, name in enumerate(w.rewards):
        spill = info["spill_share"][name]
        table.add_row(name, f"{w.lam[i]:g}", f"{lam_hat[i]:.4f}", str(int(w.gain[i].argmax()) + 1),
                      "—" if spill is None else f"{100 * spill:.1f}%")
    out.print(table)
    out.print("spill: the share of a reward's weight on steps where its gain is below 1% of its peak; the "
              "terms and tags: docs/method.md", highlight=False)
    out.print(f"wrote {out_path}")


def register(app: typer.Typer) -> None:
    app.command("solve-w")(solve_w_command)
