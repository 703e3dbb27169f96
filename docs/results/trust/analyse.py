"""The trust study's pre-registered analysis (preregistration.md), on the committed data alone.

    python docs/results/trust/analyse.py            # reads data/ and budget.csv, writes results.md beside this file
    python docs/results/trust/analyse.py DIR        # reads DIR/data/ and DIR/budget.csv, writes DIR/results.md

Every number in results.md is computed here from ``data/<world>-points.parquet`` (every seed's value of every
reward at every checkpoint), ``data/<world>-cells.json`` (each cell's base-policy evaluation, reward ranges, λ),
``data/<world>/W/`` (every W, with its bootstrap and conflict records) and ``budget.csv`` (T5). The paired
statistics are the ladder study's (``docs/results/ladder/analyse.py``: McNemar, Holm, t intervals).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from safetensors import safe_open
from scipy import stats

from recast_cli.solve.conflict import compact_steps

HERE = Path(sys.argv[1]).resolve() if __name__ == "__main__" and len(sys.argv) > 1 else Path(__file__).resolve().parent
DATA = HERE / "data"
LADDER_WORLDS = ("independent", "conflict-mild", "conflict-strong", "control")
WORLDS = (*LADDER_WORLDS, "tug")
STATIC, SAMPLED, SHRINK, CONFLICT, EXACT = ("static", "recast-power-estimate", "recast-power-estimate-shrinkauto",
                                            "recast-power-estimate-conflict", "recast-power")
ARMS = (STATIC, SAMPLED, SHRINK, CONFLICT, EXACT)
VARIANTS = (SHRINK, CONFLICT)
SHORT = {STATIC: "static", SAMPLED: "sampled W", SHRINK: "E12u (shrink auto)", CONFLICT: "E12c (conflict-aware)",
         EXACT: "exact W"}
DELTA = 0.25
MARGIN_LOST = 0.10   # T1: the lost-rate excess over static a variant may not reach (one-sided 95 % bound)
MARGIN_AGG = -0.02   # T1 in tug: the λ̂-weighted final reward deficit a variant may not reach
Z95_ONE = stats.norm.ppf(0.95)


def _ladder():
    spec = importlib.util.spec_from_file_location("ladder_analyse", Path(__file__).resolve().parent.parent
                                                  / "ladder" / "analyse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


L = _ladder()
mcnemar, holm, t_interval, wilson = L.mcnemar, L.holm, L.t_interval, L.wilson


# --------------------------------------------------------------------------- per seed


def seed_table(world: str) -> tuple[pd.DataFrame, list[str], list[float], np.ndarray]:
    """One row per (arm, rate, seed): per reward its normalised final ODE gain, lost flag and final value; any
    lost; the worst gain; the mean endpoint; the λ̂-weighted final reward."""
    points = pd.read_parquet(DATA / f"{world}-points.parquet")
    cells = json.loads((DATA / f"{world}-cells.json").read_text())
    first = next(iter(cells.values()))
    rewards = list(first["rewards"])
    m = len(rewards)
    lam = np.asarray(first["lambda"], dtype=float)
    lam_hat = lam / lam.sum()
    base = {(c["arm"], float(c["learning_rate"])): c["base"]["ode"][:m] for c in cells.values()}
    ceiling = np.array([first["reward_range"][r][1] for r in rewards])
    ode = points[points["sampler"] == "ode"]
    ode = ode[ode["step"] == ode["step"].max()].pivot_table(index=["arm", "rate", "seed"], columns="scorer",
                                                             values="value")
    sde = points[(points["sampler"] == "sde") & (points["scorer"] == "aggregate")]
    mean_end = sde.groupby(["arm", "rate", "seed"])["value"].mean() / m
    table = pd.DataFrame(index=ode.index)
    starts = np.array([base[(arm, rate)] for arm, rate, _ in ode.index])
    finals = ode[rewards].to_numpy()
    gains = (finals - starts) / (ceiling - starts)
    for i, r in enumerate(rewards):
        table[f"gain_{r}"] = gains[:, i]
        table[f"lost_{r}"] = gains[:, i] < DELTA
        table[f"final_{r}"] = finals[:, i]
    table["worst"] = gains.min(axis=1)
    table["lost"] = (gains < DELTA).any(axis=1)
    table["mean"] = mean_end.reindex(table.index).to_numpy()
    table["agg"] = finals @ lam_hat
    return table.reset_index(), rewards, sorted(table.index.get_level_values("rate").unique()), lam_hat


def paired(table: pd.DataFrame, arm: str, rate: float, column: str, against: str = STATIC):
    a = table[(table["arm"] == against) & (table["rate"] == rate)].set_index("seed")[column]
    b = table[(table["arm"] == arm) & (table["rate"] == rate)].set_index("seed")[column]
    seeds = a.index.intersection(b.index)
    return a.loc[seeds].to_numpy(), b.loc[seeds].to_numpy()


def lost_contrast(table, arm, rate, against=STATIC) -> dict:
    s, a = paired(table, arm, rate, "lost", against)
    test = mcnemar(s.astype(bool), a.astype(bool))
    test["upper"] = test["diff"] + Z95_ONE * test["se"]
    test["lo95"], test["hi95"] = test["diff"] - L.Z95 * test["se"], test["diff"] + L.Z95 * test["se"]
    return test


def agg_contrast(table, arm, rate, against=STATIC) -> dict:
    s, a = paired(table, arm, rate, "agg", against)
    d = a - s
    mean, lo, hi = t_interval(d)
    one = t_interval(d, 0.90)  # its lower end is the one-sided 95 % bound
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if np.std(d) > 0 else 1.0
    return {"diff": mean, "lo95": lo, "hi95": hi, "lower": one[1], "p": p}


# --------------------------------------------------------------------------- W diagnostics


def read_w(path: Path) -> tuple[np.ndarray, dict]:
    with safe_open(str(path), "numpy") as f:
        return f.get_tensor("W"), json.loads(f.metadata()["info"])


def w_rows(world: str, rewards: list[str]) -> list[list[str]]:
    """Per arm's W: each row's TV to the exact W, and what the variant did (γ, static steps), the sampled W's
    bootstrap verdicts."""
    cells = json.loads((DATA / f"{world}-cells.json").read_text())
    label = "-".join(f"{x:g}" for x in next(iter(cells.values()))["lambda"])
    by_arm = {arm: read_w(DATA / world / "W" / f"{label}-{arm}.safetensors") for arm in ARMS}
    exact = by_arm[EXACT][0]
    out = []
    for arm in ARMS:
        W, info = by_arm[arm]
        tv = 0.5 * np.abs(W / W.sum(1, keepdims=True) - exact / exact.sum(1, keepdims=True)).sum(1)
        what = ""
        variant = info.get("variant") or {}
        if "gamma" in variant:
            what = "γ " + ", ".join(f"{r} {variant['gamma'][r]:.2f}" for r in rewards)
        elif "static_steps" in variant:
            steps = variant["static_steps"]
            what = f"static on {len(steps)} of {W.shape[1]} steps" + (f" ({compact_steps(steps)})" if steps else "")
        boot = info.get("bootstrap")
        verdicts = ("; " + ", ".join(f"{r}: {'resolved' if boot['rows'][r]['verdict'] == 'timing resolved' else 'not'}"
                                     for r in rewards)) if boot and arm == SAMPLED else ""
        out.append([SHORT[arm], " · ".join(f"{x:.2f}" for x in tv), what + verdicts])
    conflicts = by_arm[CONFLICT][1].get("conflicts", [])
    out.append(["E14 conflicts found", "", "; ".join(f"{c['pair'][0]}–{c['pair'][1]} at {compact_steps(c['steps'])} "
                                                     f"(ρ {c['rho_min']:+.2f})" for c in conflicts) or "none"])
    return out


# --------------------------------------------------------------------------- the report


def fmt_p(p: float) -> str:
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def main() -> None:
    worlds = {w: seed_table(w) for w in WORLDS if (DATA / f"{w}-points.parquet").is_file()}
    lines = ["# Trust study: results (written by analyse.py from data/ and budget.csv)", ""]
    missing = [w for w in WORLDS if w not in worlds]
    if missing:
        lines += [f"**Incomplete:** no data yet for {', '.join(missing)}; every prediction that needs them is "
                  "marked as not evaluated.", ""]
    # T1
    lines += ["## T1 — never worse than static (primary)", "",
              f"Lost-rate difference to static, one-sided 95 % upper bound (must be < +{MARGIN_LOST:.2f}); in tug, the "
              f"λ̂-weighted final reward's difference, one-sided 95 % lower bound (must be > {MARGIN_AGG:+.2f}).", ""]
    complete = all(w in worlds for w in WORLDS)
    for v in VARIANTS:
        rows, ok = [], True
        for w in LADDER_WORLDS:
            if w not in worlds:
                continue
            table, _, rates, _ = worlds[w]
            for rate in rates:
                t = lost_contrast(table, v, rate)
                hold = t["upper"] < MARGIN_LOST
                ok = ok and hold
                rows.append([w, f"{rate:g}", f"{t['diff']:+.3f}", f"{t['upper']:+.3f}", "yes" if hold else "**no**"])
        if "tug" in worlds:
            table, _, rates, _ = worlds["tug"]
            for rate in rates:
                t = agg_contrast(table, v, rate)
                hold = t["lower"] > MARGIN_AGG
                ok = ok and hold
                rows.append(["tug (λ̂-reward)", f"{rate:g}", f"{t['diff']:+.4f}", f"{t['lower']:+.4f}",
                             "yes" if hold else "**no**"])
        said = "holds" if ok and complete else ("does not hold" if not ok else "not evaluated (worlds missing)")
        lines += [f"**{SHORT[v]}: T1 {said}.**", ""]
        lines += md_table(["world", "rate", "difference", "one-sided bound", "within"], rows) + [""]
    # T2
    lines += ["## T2 — better where timing is resolved (independent, 0.0283 and 0.04)", ""]
    if "independent" in worlds:
        table, _, rates, _ = worlds["independent"]
        keys = [(v, r) for v in VARIANTS for r in rates if abs(r - 0.0282843) < 1e-6 or abs(r - 0.04) < 1e-6]
        tests = {k: lost_contrast(table, *k) for k in keys}
        adjusted = holm([tests[k]["p"] for k in keys])
        rows = []
        for k, p in zip(keys, adjusted):
            t = tests[k]
            rows.append([SHORT[k[0]], f"{k[1]:g}", f"{t['diff']:+.3f} [{t['lo95']:+.3f}, {t['hi95']:+.3f}]",
                         f"{t['only_static']} / {t['only_arm']}", fmt_p(p)])
        lines += md_table(["variant", "rate", "lost-rate difference (95 %)", "only static / only variant lost",
                           "Holm p"], rows) + [""]
        for v in VARIANTS:
            holds = all(tests[k]["diff"] < 0 and p < 0.05 for k, p in zip(keys, adjusted) if k[0] == v)
            lines += [f"**{SHORT[v]}: T2 {'holds' if holds else 'does not hold'}.**", ""]
    # T3
    lines += ["## T3 — the ladder replicates (sampled W, conflict-mild, 0.04)", ""]
    if "conflict-mild" in worlds:
        table, _, _, _ = worlds["conflict-mild"]
        t = lost_contrast(table, SAMPLED, 0.04)
        holds = t["diff"] > 0 and t["p"] < 0.05
        lines += [f"Sampled W − static: {t['diff']:+.3f} [{t['lo95']:+.3f}, {t['hi95']:+.3f}], McNemar p = "
                  f"{fmt_p(t['p'])} (ladder: +0.210). **T3 {'holds' if holds else 'does not hold'}.**", ""]
    # T4
    lines += ["## T4 — timing against λ (tug)", ""]
    if "tug" in worlds:
        table, rewards, rates, lam_hat = worlds["tug"]
        a = [agg_contrast(table, EXACT, r) for r in rates]
        b = [agg_contrast(table, CONFLICT, r, against=SAMPLED) for r in rates]
        pa_, pb_ = holm([t["p"] for t in a]), holm([t["p"] for t in b])
        rows = [[f"{r:g}", f"{x['diff']:+.4f} [{x['lo95']:+.4f}, {x['hi95']:+.4f}]", fmt_p(p1),
                 f"{y['diff']:+.4f} [{y['lo95']:+.4f}, {y['hi95']:+.4f}]", fmt_p(p2)]
                for r, x, p1, y, p2 in zip(rates, a, pa_, b, pb_)]
        lines += md_table(["rate", "(a) exact W − static", "Holm p", "(b) E12c − sampled W", "Holm p"], rows) + [""]
        ha = all(x["diff"] < 0 and p < 0.05 for x, p in zip(a, pa_))
        hb = all(y["diff"] > 0 and p < 0.05 for y, p in zip(b, pb_))
        lines += [f"**T4 (a) {'holds' if ha else 'does not hold'}; T4 (b) {'holds' if hb else 'does not hold'}.**", ""]
    # T5
    lines += ["## T5 — the budget guide", ""]
    budget = HERE / "budget.csv"
    if budget.is_file():
        b = pd.read_csv(budget)
        b = b[b["kernel"] == "power"] if "kernel" in b else b  # T5 is the study's kernel; exp: exploratory
        rows, holds = [], True
        for w, sub in b.groupby("world", sort=False):
            slope = np.polyfit(np.log(sub["N"]), np.log(sub["spread_median"].clip(lower=1e-6)), 1)[0]
            at = sub[sub["N"] == 256]
            ratio = at["spread_median"].mean() / at["tv_to_exact"].mean()
            ok = -0.65 <= slope <= -0.35 and 1 / 1.5 <= ratio <= 1.5
            holds = holds and ok
            rows.append([w, f"{slope:+.2f}", f"{at['spread_median'].mean():.3f}", f"{at['tv_to_exact'].mean():.3f}",
                         f"{ratio:.2f}", "yes" if ok else "no"])
        lines += md_table(["world", "exponent b of the median spread in N", "median spread at 256",
                           "TV to exact at 256", "ratio", "within"], rows) + ["", f"**T5 {'holds' if holds else 'does not hold'}.** "
                                                                                 "Per N: [`budget.md`](budget.md).", ""]
    # every arm, rung and reward
    lines += ["## Every arm, rate and reward", "",
              "Lost: share of seeds losing any reward (Wilson 95 %), then per reward the seeds that lost it; worst and "
              "mean endpoints: mean (sd); λ̂-reward: Σ λ̂_i r_i at the final ODE checkpoint.", ""]
    for w, (table, rewards, rates, lam_hat) in worlds.items():
        rows = []
        for arm in ARMS:
            for rate in rates:
                mine = table[(table["arm"] == arm) & (table["rate"] == rate)]
                k, n = int(mine["lost"].sum()), len(mine)
                lo, hi = wilson(k, n)
                per = ", ".join(f"{r} {int(mine[f'lost_{r}'].sum())}" for r in rewards)
                diff = "" if arm == STATIC else (lambda t: f"{t['diff']:+.3f} [{t['lo95']:+.3f}, {t['hi95']:+.3f}]")(
                    lost_contrast(table, arm, rate))
                rows.append([SHORT[arm], f"{rate:g}", f"{k / n:.3f} [{lo:.3f}, {hi:.3f}]", per, diff,
                             f"{mine['worst'].mean():.3f} ({mine['worst'].std(ddof=1):.3f})",
                             f"{mine['mean'].mean():.4f} ({mine['mean'].std(ddof=1):.4f})",
                             f"{mine['agg'].mean():.4f}"])
        lines += [f"### {w} (rewards {', '.join(rewards)}; λ̂ {', '.join(f'{x:.2f}' for x in lam_hat)}; "
                  f"{table['seed'].nunique()} seeds)", ""]
        lines += md_table(["arm", "rate", "lost", "lost per reward", "− static (95 %)", "worst", "mean endpoint",
                           "λ̂-reward"], rows) + [""]
        # each arm at its best rate, and at static's
        key = "agg" if w == "tug" else "mean"
        best = {arm: max(rates, key=lambda r: table[(table["arm"] == arm) & (table["rate"] == r)][key].mean())
                for arm in ARMS}
        rows = []
        for arm in ARMS:
            own = table[(table["arm"] == arm) & (table["rate"] == best[arm])]
            at_static = table[(table["arm"] == arm) & (table["rate"] == best[STATIC])]
            rows.append([SHORT[arm], f"{best[arm]:g}", f"{own[key].mean():.4f}", f"{own['lost'].mean():.3f}",
                         f"{at_static[key].mean():.4f}", f"{at_static['lost'].mean():.3f}"])
        lines += [f"Each arm at its own best rate by the {'λ̂-reward' if key == 'agg' else 'mean endpoint'}, and at "
                  f"static's best ({best[STATIC]:g}):", ""]
        lines += md_table(["arm", "best rate", key, "lost", f"{key} at {best[STATIC]:g}", "lost there"], rows) + [""]
        lines += ["W per arm (TV of each row to the exact W's, in reward order; what the variant did):", ""]
        lines += md_table(["W", "TV to exact", "variant / sampled W's bootstrap verdicts"], w_rows(w, rewards)) + [""]
        if w == "tug":
            rows = []
            for arm in ARMS:
                for rate in rates:
                    mine = table[(table["arm"] == arm) & (table["rate"] == rate)]
                    rows.append([SHORT[arm], f"{rate:g}", *(f"{mine[f'final_{r}'].mean():.3f}" for r in rewards)])
            lines += ["Mechanism in tug — each reward's final ODE value (mean over seeds): which side the arm settled on:",
                      ""] + md_table(["arm", "rate", *rewards], rows) + [""]
    (HERE / "results.md").write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {HERE / 'results.md'}")


if __name__ == "__main__":
    main()
