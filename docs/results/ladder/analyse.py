"""The ladder study's pre-registered analysis (preregistration.md), on the committed data alone.

    python docs/results/ladder/analyse.py            # reads data/, writes results.md beside this file
    python docs/results/ladder/analyse.py DIR        # reads DIR/data/, writes DIR/results.md (a dry run)

Every number in results.md is computed here from ``data/<world>-points.parquet`` (every seed's value
of every reward at every checkpoint), ``data/<world>-cells.json`` (each cell's base-policy
evaluation, reward ranges, gradient measurements) and ``data/<world>/W/`` (every W).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from safetensors import safe_open

HERE = Path(sys.argv[1]).resolve() if __name__ == "__main__" and len(sys.argv) > 1 else Path(__file__).resolve().parent
DATA = HERE / "data"
WORLDS = ("independent", "conflict-mild", "conflict-strong", "control")
ARMS = ("static", "recast-power", "recast-power-estimate", "recast-power-estimate-shrink0.5")
DELTA = 0.25  # a reward is lost below this normalised gain
STABLE = 0.10  # the stable range: lost-reward rate below this
MARGIN = 0.01  # the control's TOST margin on the mean endpoint
NONINFERIOR = 0.05  # P4: the shrunk arm's lost-rate excess over static
BOOT = 2000
Z95, Z90 = stats.norm.ppf(0.975), stats.norm.ppf(0.95)


# --------------------------------------------------------------------------- per seed


def seed_table(world: str) -> tuple[pd.DataFrame, list[str], list[float]]:
    """One row per (arm, rate, seed): each reward's normalised final ODE gain, lost (bool per reward and
    any), worst gain, and the mean endpoint (mean over the SDE checkpoints of the mean reward)."""
    points = pd.read_parquet(DATA / f"{world}-points.parquet")
    cells = json.loads((DATA / f"{world}-cells.json").read_text())
    first = next(iter(cells.values()))
    rewards = list(first["rewards"])
    m = len(rewards)
    base = {(c["arm"], float(c["learning_rate"])): c["base"]["ode"][:m] for c in cells.values()}
    ceiling = np.array([first["reward_range"][r][1] for r in rewards])
    ode = points[points["sampler"] == "ode"]
    ode = ode[ode["step"] == ode["step"].max()].pivot_table(index=["arm", "rate", "seed"], columns="scorer",
                                                             values="value")
    sde = points[(points["sampler"] == "sde") & (points["scorer"] == "aggregate")]
    mean_end = sde.groupby(["arm", "rate", "seed"])["value"].mean() / m
    table = pd.DataFrame(index=ode.index)
    starts = np.array([base[(arm, rate)] for arm, rate, _ in ode.index])
    gains = (ode[rewards].to_numpy() - starts) / (ceiling - starts)
    for i, r in enumerate(rewards):
        table[f"gain_{r}"] = gains[:, i]
        table[f"lost_{r}"] = gains[:, i] < DELTA
        table[f"final_{r}"] = ode[r].to_numpy()
    table["worst"] = gains.min(axis=1)
    table["lost"] = (gains < DELTA).any(axis=1)
    table["mean"] = mean_end.reindex(table.index).to_numpy()
    return table.reset_index(), rewards, sorted(table.index.get_level_values("rate").unique())


def paired(table: pd.DataFrame, arm: str, rate: float, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(static, arm) values of ``column`` at ``rate``, aligned by seed."""
    a = table[(table["arm"] == "static") & (table["rate"] == rate)].set_index("seed")[column]
    b = table[(table["arm"] == arm) & (table["rate"] == rate)].set_index("seed")[column]
    seeds = a.index.intersection(b.index)
    return a.loc[seeds].to_numpy(), b.loc[seeds].to_numpy()


# --------------------------------------------------------------------------- statistics


def wilson(k: int, n: int) -> tuple[float, float]:
    p, z = k / n, Z95
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def mcnemar(static: np.ndarray, arm: np.ndarray) -> dict:
    """Paired binary outcomes: discordant counts, exact McNemar p, the difference arm − static with its
    Wald standard error."""
    b = int((static & ~arm).sum())  # only static lost
    c = int((~static & arm).sum())  # only the arm lost
    n = len(static)
    p = stats.binomtest(c, b + c, 0.5).pvalue if b + c else 1.0
    diff = (c - b) / n
    se = math.sqrt(max(b + c - (c - b) ** 2 / n, 0.0)) / n
    return {"only_static": b, "only_arm": c, "p": p, "diff": diff, "se": se, "n": n}


def holm(pvalues: list[float]) -> list[float]:
    order = np.argsort(pvalues)
    adjusted = np.empty(len(pvalues))
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted.tolist()


def t_interval(d: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    mean, se = float(np.mean(d)), float(np.std(d, ddof=1) / math.sqrt(len(d)))
    t = stats.t.ppf(0.5 + level / 2, len(d) - 1)
    return mean, mean - t * se, mean + t * se


def stable_rung(lost_rate: dict[float, float], rates: list[float]) -> float | None:
    """The highest rung whose lost-reward rate is below STABLE (None: no rung)."""
    ok = [r for r in rates if lost_rate[r] < STABLE]
    return max(ok) if ok else None


def stable_low(lost_rate: dict[float, float], rates: list[float]) -> float | None:
    """The lowest rung whose lost-reward rate is below STABLE (amendment 1: the range's other end)."""
    ok = [r for r in rates if lost_rate[r] < STABLE]
    return min(ok) if ok else None


# --------------------------------------------------------------------------- the endpoints of one world


def world_results(world: str, rng: np.random.Generator) -> dict:
    table, rewards, rates = seed_table(world)
    arms = [a for a in ARMS if a in set(table["arm"])]
    out: dict = {"rewards": rewards, "rates": rates, "arms": arms, "table": table, "lost": {}, "worst": {},
                 "tests": {}}
    for arm in arms:
        for rate in rates:
            mine = table[(table["arm"] == arm) & (table["rate"] == rate)]
            k, n = int(mine["lost"].sum()), len(mine)
            out["lost"][(arm, rate)] = (k, n, *wilson(k, n), {r: int(mine[f"lost_{r}"].sum()) for r in rewards})
            out["worst"][(arm, rate)] = (float(mine["worst"].mean()), float(mine["worst"].std(ddof=1)),
                                         float(mine["mean"].mean()), float(mine["mean"].std(ddof=1)))
            if arm != "static":
                s, a = paired(table, arm, rate, "lost")
                test = mcnemar(s.astype(bool), a.astype(bool))
                sw, aw = paired(table, arm, rate, "worst")
                test["worst"] = t_interval(aw - sw)
                sm, am = paired(table, arm, rate, "mean")
                test["mean"] = t_interval(am - sm)
                test["mean90"] = t_interval(am - sm, 0.90)
                out["tests"][(arm, rate)] = test
    keys = list(out["tests"])
    for key, adjusted in zip(keys, holm([out["tests"][k]["p"] for k in keys])):
        out["tests"][key]["p_holm"] = adjusted
    # endpoint 3: the stable range and the best mean over the ladder, with seed-bootstrap resamples
    seeds = np.array(sorted(table["seed"].unique()))
    lost = {(a, r): table[(table["arm"] == a) & (table["rate"] == r)].set_index("seed")["lost"].loc[seeds].to_numpy()
            for a in arms for r in rates}
    means = {(a, r): table[(table["arm"] == a) & (table["rate"] == r)].set_index("seed")["mean"].loc[seeds].to_numpy()
             for a in arms for r in rates}
    out["stable"] = {a: stable_rung({r: lost[(a, r)].mean() for r in rates}, rates) for a in arms}
    out["stable_low"] = {a: stable_low({r: lost[(a, r)].mean() for r in rates}, rates) for a in arms}
    out["best"] = {a: max(means[(a, r)].mean() for r in rates) for a in arms}
    draws = {a: [] for a in arms}
    best_diff = {a: [] for a in arms}
    for _ in range(BOOT):
        idx = rng.integers(0, len(seeds), len(seeds))
        best = {a: max(means[(a, r)][idx].mean() for r in rates) for a in arms}
        for a in arms:
            draws[a].append(stable_rung({r: lost[(a, r)][idx].mean() for r in rates}, rates))
            best_diff[a].append(best[a] - best["static"])
    out["stable_boot"] = {a: pd.Series([("none" if x is None else f"{x:g}") for x in draws[a]]).value_counts(normalize=True)
                          for a in arms}
    out["best_diff"] = {a: (out["best"][a] - out["best"]["static"], *np.percentile(best_diff[a], [2.5, 97.5]))
                        for a in arms}
    # rungs at which each seed lost a reward (P3)
    out["rungs_lost"] = {a: sum(lost[(a, r)].astype(int) for r in rates) for a in arms}
    out["mechanism"] = mechanism(world)
    out["tv"] = tv_rows(world, rewards)
    return out


def mechanism(world: str) -> list[list[str]]:
    cells = json.loads((DATA / f"{world}-cells.json").read_text())
    rows = []
    for c in sorted(cells.values(), key=lambda c: (ARMS.index(c["arm"]) if c["arm"] in ARMS else 9,
                                                   c["learning_rate"])):
        record = c.get("reward_gradients") or {}
        for r in c["rewards"]:
            snr = record.get("snr", {}).get(r, [])
            rows.append([c["arm"], f"{c['learning_rate']:g}", r, " · ".join("—" if x is None else f"{x:.3g}" for x in snr),
                         f"{c['clip_frac']['mean']:.4f}"])
    return rows


def read_w(path: Path) -> np.ndarray:
    with safe_open(str(path), "numpy") as f:
        return f.get_tensor("W")


def tv_rows(world: str, rewards: list[str]) -> dict[str, list[float]] | None:
    """Per reward: TV between the rows of W from the sampled estimate and from the exact gains (and shrunk)."""
    folder = DATA / world / "W"
    exact = next(folder.glob("*-recast-power.safetensors"), None)
    estimate = next(folder.glob("*-recast-power-estimate.safetensors"), None)
    shrunk = next(folder.glob("*-recast-power-estimate-shrink0.5.safetensors"), None)
    static = next(folder.glob("*-static.safetensors"), None)
    if exact is None or estimate is None:
        return None
    W = {k: read_w(p) for k, p in (("exact", exact), ("estimate", estimate), ("shrunk", shrunk), ("static", static)) if p}
    rows = W["exact"].sum(axis=1, keepdims=True)

    def tv(a: str, b: str) -> list[float]:
        return (0.5 * np.abs(W[a] - W[b]).sum(axis=1) / rows[:, 0]).tolist()

    return {"estimate vs exact": tv("estimate", "exact"), "shrunk vs exact": tv("shrunk", "exact"),
            "exact vs static": tv("exact", "static"), "estimate vs static": tv("estimate", "static")}


# --------------------------------------------------------------------------- the write-up


def fmt(x: float, d: int = 3) -> str:
    return f"{x:+.{d}f}" if x != 0 else f"{0:.{d}f}"


def md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]) + "\n"


def predictions(res: dict) -> list[list[str]]:
    rows = []
    ind = res["independent"]
    # P1
    at_risk = [r for r in ind["rates"] if ind["lost"][("static", r)][0] / ind["lost"][("static", r)][1] >= STABLE]
    parts, holds = [], bool(at_risk)
    for r in at_risk:
        t = ind["tests"][("recast-power", r)]
        ok = t["diff"] < 0 and t["p_holm"] < 0.05
        holds &= ok
        parts.append(f"{r:g}: {fmt(t['diff'])} [{fmt(t['diff'] - Z95 * t['se'])}, {fmt(t['diff'] + Z95 * t['se'])}], "
                     f"Holm p = {t['p_holm']:.3g}")
    rows.append(["P1: recast-power lowers the lost-reward rate where static's is ≥ 10 % (independent)",
                 "; ".join(parts) or "static never reached 10 %", "holds" if holds else "not supported"])
    # P2
    s, a = ind["stable"]["static"], ind["stable"]["recast-power"]
    d, lo, hi = ind["best_diff"]["recast-power"]
    holds = (a is not None and (s is None or a >= s)) and hi >= 0
    rows.append(["P2: recast-power's stable range ≥ static's, and its best mean not below static's (independent)",
                 f"stable range: static {'none' if s is None else f'{s:g}'}, recast-power {'none' if a is None else f'{a:g}'}; "
                 f"best mean {fmt(d, 4)} [{fmt(lo, 4)}, {fmt(hi, 4)}]", "holds" if holds else "not supported"])
    # P3
    di = ind["rungs_lost"]["static"] - ind["rungs_lost"]["recast-power"]
    st = res["conflict-strong"]
    ds = st["rungs_lost"]["static"] - st["rungs_lost"]["recast-power"]
    diff = di.mean() - ds.mean()
    se = math.sqrt(di.var(ddof=1) / len(di) + ds.var(ddof=1) / len(ds))
    dof = se**4 / ((di.var(ddof=1) / len(di)) ** 2 / (len(di) - 1) + (ds.var(ddof=1) / len(ds)) ** 2 / (len(ds) - 1))
    t = stats.t.ppf(0.975, dof)
    rows.append(["P3: the help shrinks with conflict (rungs lost, static − recast-power: independent − strong)",
                 f"{fmt(di.mean())} − {fmt(ds.mean())} = {fmt(diff)} [{fmt(diff - t * se)}, {fmt(diff + t * se)}]",
                 "holds" if diff - t * se > 0 else "not supported"])
    # P4
    worst_upper, where = -1.0, ""
    for world in WORLDS:
        for r in res[world]["rates"]:
            t4 = res[world]["tests"].get(("recast-power-estimate-shrink0.5", r))
            if t4 is None:
                continue
            upper = t4["diff"] + Z90 * t4["se"]
            if upper > worst_upper:
                worst_upper, where = upper, f"{world} at {r:g}"
    rows.append(["P4: the shrunk W is never worse than static by 5 points of lost-reward rate",
                 f"largest one-sided 95% upper bound {fmt(worst_upper)} ({where})",
                 "holds" if worst_upper < NONINFERIOR else "not supported"])
    # P5
    ctl, fails, widest = res["control"], [], 0.0
    for (arm, r), t5 in ctl["tests"].items():
        _, lo, hi = t5["mean90"]
        widest = max(widest, abs(lo), abs(hi))
        if not (-MARGIN < lo and hi < MARGIN):
            fails.append(f"{arm} at {r:g}")
    rows.append(["P5: in the control every arm equals static within ±0.01 on the mean endpoint (TOST)",
                 f"largest |90% bound| {widest:.4f}" + (f"; outside: {', '.join(fails)}" if fails else ""),
                 "equivalent" if not fails else "not supported"])
    return rows


def world_section(world: str, r: dict) -> list[str]:
    rewards, rates, arms = r["rewards"], r["rates"], r["arms"]
    out = [f"## {world}\n", "### Endpoint 1: lost-reward rate (Wilson 95%), and which reward\n"]
    rows = []
    for arm in arms:
        for rate in rates:
            k, n, lo, hi, per = r["lost"][(arm, rate)]
            t = r["tests"].get((arm, rate))
            test = "—" if t is None else (f"{fmt(t['diff'])} [{fmt(t['diff'] - Z95 * t['se'])}, "
                                          f"{fmt(t['diff'] + Z95 * t['se'])}]; {t['only_static']}/{t['only_arm']}; "
                                          f"p = {t['p']:.3g}, Holm {t['p_holm']:.3g}")
            rows.append([arm, f"{rate:g}", f"{k}/{n} = {k / n:.3f} [{lo:.3f}, {hi:.3f}]",
                         ", ".join(f"{x} {per[x]}" for x in rewards), test])
    out.append(md(["arm", "rate", "lost a reward", "lost, per reward",
                   "arm − static (95%); static only / arm only; McNemar"], rows))
    out.append("### Endpoint 2: worst-reward endpoint, and the mean endpoint\n")
    rows = []
    for arm in arms:
        for rate in rates:
            w, ws, mmean, msd = r["worst"][(arm, rate)]
            t = r["tests"].get((arm, rate))
            rows.append([arm, f"{rate:g}", f"{w:.4f} ± {ws:.4f}", "—" if t is None else
                         "{:+.4f} [{:+.4f}, {:+.4f}]".format(*t["worst"]), f"{mmean:.4f} ± {msd:.4f}",
                         "—" if t is None else "{:+.4f} [{:+.4f}, {:+.4f}]".format(*t["mean"])])
    out.append(md(["arm", "rate", "worst-reward gain", "arm − static (95% t)", "mean endpoint",
                   "arm − static (95% t)"], rows))
    out.append("### Endpoint 3: stable range (lost-reward rate < 10 %) and best mean over the ladder\n")
    rows = []
    for arm in arms:
        s, low = r["stable"][arm], r["stable_low"][arm]
        boot = ", ".join(f"{k}: {v:.2f}" for k, v in r["stable_boot"][arm].sort_index().items())
        d, lo, hi = r["best_diff"][arm]
        rows.append([arm, "none" if s is None else f"{low:g} … {s:g}", boot, f"{r['best'][arm]:.4f}",
                     "—" if arm == "static" else f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}]"])
    out.append(md(["arm", "stable range (lowest … highest rung)", f"bootstrap share of its highest rung ({BOOT} resamples)", "best mean",
                   "best − static's best (95% bootstrap)"], rows))
    out.append("### Mechanism: each reward's gradient SNR at iterations 1, 11, 21, 30; clip fraction\n")
    out.append(md(["arm", "rate", "reward", "SNR", "clip fraction"], r["mechanism"]))
    if r["tv"]:
        out.append("### W from the sampled estimate against the exact W (TV per row)\n")
        out.append(md(["pair", *rewards], [[k, *(f"{x:.3f}" for x in v)] for k, v in r["tv"].items()]))
    return out


def main() -> None:
    rng = np.random.default_rng(42)
    res = {w: world_results(w, rng) for w in WORLDS}
    lines = ["# Ladder study: results\n",
             "Written by `analyse.py` from the committed data in `data/` (preregistration.md). Endpoints per seed: "
             f"a reward is lost when its final ODE gain over the base policy is below {DELTA} of its headroom. Every "
             "contrast is arm − static at the same learning rate, paired by seed.\n",
             "## Predictions\n", md(["prediction", "estimate", "verdict"], predictions(res))]
    for world in WORLDS:
        lines += world_section(world, res[world])
    cost = []
    for world in WORLDS:
        r = res[world]
        if r["tv"]:
            diffs = [r["lost"][("recast-power-estimate", x)][0] / r["lost"][("recast-power-estimate", x)][1] -
                     r["lost"][("recast-power", x)][0] / r["lost"][("recast-power", x)][1] for x in r["rates"]]
            worst = [r["worst"][("recast-power-estimate", x)][0] - r["worst"][("recast-power", x)][0] for x in r["rates"]]
            cost.append([world, f"{np.mean(r['tv']['estimate vs exact']):.3f}", f"{np.mean(diffs):+.3f}",
                         f"{np.mean(worst):+.4f}"])
    lines += ["## The estimate's distance from the exact W, and its cost (exploratory)\n",
              md(["world", "mean TV of the rows", "lost-rate: estimate − exact (mean over rungs)",
                  "worst-reward: estimate − exact"], cost)]
    (HERE / "results.md").write_text("\n".join(lines))
    print("\n".join(lines[:5]))


if __name__ == "__main__":
    sys.exit(main())
