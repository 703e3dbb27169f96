"""``recast solve-w``: the Typer command over :mod:`recast_cli.solve.stage`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from recast_cli.kernels import kernels_help
from recast_cli.solve.conflict import compact_steps, conflict_message
from recast_cli.solve.sinkhorn import DEFAULT_FLOOR, DEFAULT_KERNEL, DEFAULT_TAU, lambda_hat

out = Console()
err = Console(stderr=True)


def budgets_of(lam: str | None, setting: str | None):
    """What ``solve-w`` solves for: ``--lambda``'s text alone, else the ``[train] lambda`` of ``--setting``
    (by its ``[train] rewards``), or ``--lambda`` over it; each with its source for W (``Budgets``)."""
    from recast_cli.errors import BadInput
    from recast_cli.solve.stage import Budgets

    if setting is None:
        if lam is None:
            raise BadInput("solve-w needs the budgets λ: --lambda 1,1,2 (or clip=1,ocr=2), or --setting S for its "
                           "[train] lambda")
        return lam
    from recast_cli.setting.load import load_setting
    from recast_cli.train.config import config_from_setting

    loaded = load_setting(setting)
    cfg = config_from_setting(loaded)
    if lam is not None:
        return Budgets(f"--lambda, over [train] lambda of {loaded.file.name}", text=lam)
    if len(cfg.lam) != len(cfg.rewards):
        raise BadInput(f"{loaded.file.name}: [train] lambda has {len(cfg.lam)} values for {len(cfg.rewards)} rewards")
    return Budgets(f"[train] lambda of {loaded.file.name}", values=dict(zip(cfg.rewards, map(float, cfg.lam))))


def weights_table(w, *, mode: str, kernel: str, gamma: float | str, tau: float) -> Table:
    """solve-w's table of W: per reward λ, λ̂, the peak step and the spill, titled with how W was solved."""
    info = w.info
    trained = f", trained steps {w.skip_clean + 1}…{w.T}" if w.skip_clean else ""
    variant = info.get("variant") or {}
    kind = (("" if kernel == DEFAULT_KERNEL else f", {kernel} kernel") + ("" if gamma in (1.0, "auto") else
            f", shrunk γ = {gamma:g}") + (f", {variant['name']} ({variant['tag']})" if variant else ""))
    table = Table(title=f"W ({mode}{kind}, τ = {tau:g}, T = {w.T}{trained})", title_justify="left")
    for name in ("reward", "λ", "λ̂", "peak t", "spill <1% peak"):
        table.add_column(name, justify="left" if name == "reward" else "right")
    lam_hat = lambda_hat(w.lam)
    for i, name in enumerate(w.rewards):
        spill = info["spill_share"][name]
        table.add_row(name, f"{w.lam[i]:g}", f"{lam_hat[i]:.4f}", str(int(w.gain[i].argmax()) + 1),
                      "—" if spill is None else f"{100 * spill:.1f}%")
    return table


def solve_w_command(
    gains: Path = typer.Option(..., "--gains", help="Gain table (recast.gains/1 Parquet)."),
    lam: Optional[str] = typer.Option(None, "--lambda", help="Budgets by position (1,1,2) or by name (clip=1,ocr=2); "
                                                             "over --setting's [train] lambda when both are given."),
    setting: Optional[str] = typer.Option(None, "--setting", help="A setting (name or path) whose [train] lambda "
                                                                  "gives the budgets (λ entered once); W records it."),
    out_path: Path = typer.Option(..., "--out", help="Output weight matrix (.safetensors)."),
    mode: str = typer.Option("recast", help="recast (Sinkhorn, E12) | nosink (rows only) | static (λ̂/T) | "
                                            "reversed (recast's columns in reverse step order: a timing control)."),
    tau: float = typer.Option(DEFAULT_TAU, help="Temperature τ of the affinity kernel (--kernel)."),
    kernel: str = typer.Option(DEFAULT_KERNEL, "--kernel", help=f"Affinity kernel: {kernels_help()}."),
    steps: Optional[int] = typer.Option(None, help="Solve on a grid of this many steps (E9 resampling)."),
    grid: Optional[str] = typer.Option(None, help="Grid family for --steps: linear | flowmatch | dynamic "
                                                  "(default: the one the gain table records)."),
    shift: Optional[float] = typer.Option(None, help="Shift of the flowmatch grid (SD3.5: 3.0)."),
    mu: Optional[float] = typer.Option(None, help="Time shift μ of the dynamic grid (FLUX, Qwen-Image: set by the "
                                                  "resolution; `recast check-setting` prints it)."),
    floor: float = typer.Option(DEFAULT_FLOOR, help="Rows whose total gain is below floor x the largest "
                                                    "are indiscriminable and become uniform (E10)."),
    shrink: str = typer.Option("1", "--shrink", help="γ in (0, 1]: write (1 − γ)·static + γ·W (E12s: W pulled "
                                                    "toward static; rows and columns still hold). 1: W as solved. "
                                                    "auto: each row pulled toward static by its bootstrap spread "
                                                    "(E12u, docs/trust.md)."),
    bootstrap: Optional[int] = typer.Option(None, "--bootstrap", help="Solve W again on the first B bootstrap draws of "
                                                                      "the gains and record each row's spread and "
                                                                      "verdict (default: every draw the table holds; "
                                                                      "0: none; else at least 2)."),
    conflicts: str = typer.Option("keep", "--conflicts", help="keep | static: give the steps where two rewards' "
                                                              "advantages anti-correlate (E14) static weights (E12c, "
                                                              "docs/trust.md)."),
    conflicts_from: Optional[Path] = typer.Option(None, "--conflicts-from",
                                                  help="Read the conflicts (E14) from this gain table of the same "
                                                       "rewards (e.g. a --sampling pold estimate, whose rollouts pair "
                                                       "them) instead of --gains."),
    skip_clean: int = typer.Option(0, "--skip-clean", help="The K cleanest steps t = 1…K are not trained: W = 0 "
                                                           "there, the solve runs over the other T − K steps."),
) -> None:
    """Turn a gain table into the reward x step weight matrix W (E9-E12)."""
    from recast_cli.solve.stage import parse_shrink, solve_w

    gamma = parse_shrink(shrink)
    budgets = budgets_of(lam, setting)
    with err.status("solving W (Sinkhorn)", spinner="dots"):  # on stderr; a long solve (small τ) shows it works
        report = solve_w(gains, budgets, out_path, mode=mode, tau=tau, steps=steps, grid=grid, shift=shift, mu=mu,
                         floor=floor, skip_clean=skip_clean, kernel=kernel, shrink=gamma, bootstrap=bootstrap,
                         conflicts=conflicts, conflicts_from=conflicts_from)
    for warning in report.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    if not isinstance(budgets, str):
        out.print(f"λ = {', '.join(f'{v:g}' for v in report.weights.lam)} from {budgets.source}", highlight=False,
                  markup=False)
    w = report.weights
    info = w.info
    if mode in ("recast", "reversed"):
        out.print(f"Sinkhorn: {info['iterations']} iterations, max marginal error {info['marginal_error']:.2e}")
    if info["resampled"]:
        out.print(f"gains resampled from T = {info['source_T']} to T = {w.T} through D(σ) (E9)")
    out.print(weights_table(w, mode=mode, kernel=kernel, gamma=gamma, tau=tau))
    out.print("spill: the share of a reward's weight on steps where its gain is below 1% of its peak; the "
              "terms and tags: docs/method.md", highlight=False)
    if conflicts_from is not None:  # said even when it finds none: the flag is never silently without effect
        found = len(info.get("conflicts", []))
        out.print(f"conflicts (E14) read from {conflicts_from}: " + (f"{found} conflicting pair(s)" if found else
                  "none (no pair's advantages anti-correlate at any step)"), highlight=False)
    for line in trust_lines(info, w.rewards):
        out.print(line, highlight=False)
    for item in info.get("settled_by_timing", []):
        err.print(f"[yellow]warning:[/yellow] {conflict_message(item['pair'], item['steps'], 'E14, the estimate')}",
                  highlight=False)
    out.print(f"wrote {out_path}")


def trust_lines(info: dict, rewards: tuple[str, ...]) -> list[str]:
    """The lines that say how far W can be trusted: each row's bootstrap spread and verdict, the budget that
    would resolve it, the conflicts found and the variant written (docs/trust.md)."""
    lines = []
    boot = info.get("bootstrap")
    if boot:
        lines.append(f"bootstrap: W solved again on {boot['draws']} draws of the gains; per reward, TV of its row to "
                     f"W's (median [90%]) and to static ([90%]):")
        for name in rewards:
            row = boot["rows"][name]
            lo, mid, hi = row["tv_point"]
            s_lo, s_hi = row["tv_static_range"]
            need = row.get("samples_to_resolve")
            extra = (f"; resolving it needs at least N = {need:,.0f} samples per prompt"
                     if need is not None and row["verdict"] != "timing resolved" else "")
            lines.append(f"  {name}: spread {mid:.3f} [{lo:.3f}, {hi:.3f}], to static {row['tv_static']:.3f} "
                         f"[{s_lo:.3f}, {s_hi:.3f}]: {row['verdict']}{extra}")
        budget = boot.get("samples_for_tv")
        if budget:
            parts = ", ".join(f"≤ {t} needs N ≥ {n:,.0f}" for t, n in budget.items() if n is not None)
            if parts:
                lines.append(f"budget: now N = {boot['samples']} samples per prompt (P = {boot['P']}, K = {boot['K']}); "
                             f"a median row spread {parts} — lower bounds, were the spread to shrink as 1/√N; "
                             f"measured: N^-0.4 with the exp kernel, N^-0.1 with power (docs/trust.md)")
    variant = info.get("variant")
    if variant and variant.get("gamma"):
        lines.append("E12u: share of each row's timing kept: " +
                     ", ".join(f"{r} γ = {g:.2f}" for r, g in variant["gamma"].items()))
    if variant and "static_steps" in variant:
        steps = variant["static_steps"]
        lines.append(f"E12c: static weights on the steps in conflict: {compact_steps(steps) if steps else 'none'}")
    for c in info.get("conflicts", []):
        lines.append(f"conflict (E14): {c['pair'][0]} and {c['pair'][1]} at steps {compact_steps(c['steps'])} "
                     f"(lowest advantage correlation {c['rho_min']:+.2f})")
    return lines


def register(app: typer.Typer) -> None:
    app.command("solve-w")(solve_w_command)
