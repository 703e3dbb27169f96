"""``recast report`` on synthetic artifacts written with the project's own writers.

Four training rewards and two held-out judges (one on a ten-times larger scale), 2 budgets ×
2 training seeds × {static, no-Sink, ReCAST} plus the base model; every evaluation has 3
prompts × 2 images whose scores average exactly to a chosen value per (mode, λ, seed,
scorer), so the tables can be checked against numbers worked out by hand. Run folders carry
W and metrics, gain tables the base policy and a trained checkpoint, judgement files
pairwise verdicts.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from recast_cli.artifacts import (
    EvalImage,
    EvalTable,
    WeightMatrix,
    write_eval,
    write_gains,
    write_judgements,
    write_weights,
)
from recast_cli.cli import app
from recast_cli.rewards import judge
from recast_cli.solve.sinkhorn import solve_weights
from recast_cli.train.metrics import MetricsLog
from tests.conftest import make_table

runner = CliRunner()

REWARDS = ("clip", "hps", "pick", "ocr")
JUDGES = ("imagereward", "hpsv3")
SCORERS = REWARDS + JUDGES
B1, B2 = (1.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 2.0)
SEEDS = (0, 1)
PROMPTS = ("a sign that says hello", "a red cup", "a street at night")
N = 2
SIGMAS = [1.0, 0.75, 0.5, 0.25, 0.0]
SAMPLING = {"steps": 4, "guidance_scale": 4.5, "resolution": 8, "n": N, "seed": 10000, "noise_level": 0.0,
            "seed_rule": "seed + 100000·prompt_id + k"}

BASE = {"clip": 0.25, "hps": 0.20, "pick": 0.80, "ocr": 0.10, "imagereward": 1.0, "hpsv3": 12.0}
# What training adds per (mode, λ); with these, over the seed means:
#   λ1: ReCAST ≥ static on every training reward (Pareto ≻), static > ReCAST on both judges;
#   λ2: ReCAST loses on hps only (trade-off), ReCAST > static on both judges.
LIFT = {
    ("static", B1): {"clip": .05, "hps": .08, "pick": .10, "ocr": .70, "imagereward": .30, "hpsv3": .50},
    ("recast", B1): {"clip": .06, "hps": .09, "pick": .11, "ocr": .72, "imagereward": .20, "hpsv3": .40},
    ("static", B2): {"clip": .04, "hps": .07, "pick": .09, "ocr": .75, "imagereward": .25, "hpsv3": .30},
    ("recast", B2): {"clip": .05, "hps": .06, "pick": .10, "ocr": .78, "imagereward": .35, "hpsv3": .60},
}


def cell(mode: str, budget: tuple, seed: int | None, scorer: str) -> float:
    """The mean over one evaluation's images of one scorer."""
    if mode == "base":
        return BASE[scorer]
    lift = LIFT[("static", budget)][scorer] + 0.005 if mode == "nosink" else LIFT[(mode, budget)][scorer]
    value = BASE[scorer] + lift + 0.02 * seed
    if (mode, budget, seed, scorer) == ("recast", B1, 1, "clip"):
        value -= 0.015  # static wins this one pair: clip's win count is 3 of 4
    return value


def aggregate(mode: str, budget: tuple, seed: int | None) -> float:
    return sum(lam * cell(mode, budget, seed, r) for lam, r in zip(budget, REWARDS))


# --------------------------------------------------------------------------- writers


def write_png(path: Path, shade: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (shade % 256, (3 * shade) % 256, 90)).save(path)


def write_evaluation(folder: Path, setting: Path, mode: str, budget: tuple, seed: int | None, *,
                     sampling: dict | None = None, sigmas: list | None = None, setting_name: str = "ocr") -> Path:
    name = "base" if mode == "base" else f"{mode}-l{int(budget[-1])}-s{seed}"
    path = folder / f"{name}.parquet"
    images, rows = [], []
    for p, prompt in enumerate(PROMPTS):
        for k in range(N):
            image_id = p * N + k
            rel = f"{path.name}.images/{p:05d}/{k:03d}.png"
            write_png(folder / rel, 40 * image_id + 7 * len(name))
            images.append(EvalImage(image_id, p, prompt, 10000 + 100000 * p + k, rel))
            spread = (0.01 * (p + 1)) * (1 if k == 0 else -1)  # averages to 0 over each prompt's two images
            rows.append([cell(mode, budget, seed, s) + spread for s in SCORERS])
    trained = mode != "base"
    meta = {
        "setting": {"path": str(setting), "name": setting_name}, "mode": mode,
        "run": str(folder / name) if trained else None, "train_seed": seed if trained else None,
        "lambda": list(budget), "rewards": list(REWARDS), "judges": list(JUDGES),
        "weights_key": "k" + name if trained else None, "sigmas": (sigmas or SIGMAS) if trained else None,
        "checkpoint": {"path": "ckpt", "step": 180, "adapter_sha256": "0" * 64} if trained else None,
        "sampling": sampling or SAMPLING, "prompts_source": "/data/heldout.txt", "run_id": name,
    }
    table = EvalTable(images=tuple(images), scorers=SCORERS, kinds=("reward",) * 4 + ("judge",) * 2,
                      scores=np.array(rows), meta=meta)
    write_eval(path, table, config={"evaluate": {"n": N}})
    return path


GAIN = np.array([[0.05, 0.10, 0.06, 0.04], [0.20, 0.15, 0.10, 0.05],
                 [0.02, 0.03, 0.10, 0.05], [0.30, 0.40, 0.20, 0.10]])


def write_run(folder: Path, setting: Path, mode: str, budget: tuple, seed: int) -> Path:
    run = folder / f"run-{mode}-l{int(budget[-1])}-s{seed}"
    run.mkdir(parents=True)
    solution = solve_weights(GAIN, np.array(budget), mode=mode)
    write_weights(run / "weights.safetensors",
                  WeightMatrix(W=solution.W, gain=GAIN, rewards=REWARDS, lam=budget, mode=mode, tau=1.0,
                               sigmas=np.array(SIGMAS), info={"indiscriminable": []}))
    record = {"schema": "recast.run/1", "recast_version": "0", "created_at": "now", "sources": [],
              "config": {"setting": str(setting), "train": {"seed": seed}}, "rewards": list(REWARDS),
              "lambda": list(budget), "mode": mode, "sigmas": SIGMAS}
    (run / "run.json").write_text(json.dumps(record))
    log = MetricsLog(run, config={})
    for step in range(1, 4):
        per_reward = {r: {"reward_mean": 0.1 * step, "reward_std": 0.01, "adv_abs": [0.1] * 4} for r in REWARDS}
        scalars = {"aggregate": aggregate(mode, budget, seed) * step / 3, "loss": 0.0, "policy_loss": 0.0, "kl": 0.0,
                   "clip_frac": 0.0, "grad_norm": 1.0, "lr": 1e-4, "images": 16, "sample_s": 1.0, "update_s": 1.0}
        log.add(step, per_reward, scalars, [0.5] * 4)
    log.write()
    return run


def write_gain_table(path: Path, setting: Path, scale: float, checkpoint: str | None) -> Path:
    table = make_table(GAIN * scale, rewards=REWARDS)
    policy = {"setting": str(setting), "kind": "sd3", **({"checkpoint": checkpoint} if checkpoint else {})}
    write_gains(path, dataclasses.replace(table, meta={**table.meta, "policy": policy}))
    return path


def write_judgement_file(path: Path, pairs: list | None, labels: list, overall: list, criteria: dict) -> Path:
    """Verdicts as judged (already mapped back to a/b): ``overall`` and each criterion list the 2n winners."""
    names = tuple(criteria)
    verdicts = [judge.Verdict(i // 2, judge.ORDERS[i % 2],
                              {"overall": overall[i], **{c: v[i] for c, v in criteria.items()}}, "{}")
                for i in range(len(overall))]
    write_judgements(path, verdicts, judge.win_rates(verdicts, names), {"labels": labels}, [], pairs)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("report")
    setting = root / "ocr.toml"
    evals = root / "evals"
    paths = {"base": write_evaluation(evals, setting, "base", B1, None)}
    for mode in ("static", "nosink", "recast"):
        for budget in (B1, B2):
            for seed in SEEDS:
                paths[(mode, budget, seed)] = write_evaluation(evals, setting, mode, budget, seed)
    runs = [write_run(root / "runs", setting, mode, budget, seed)
            for mode in ("static", "nosink", "recast") for budget in (B1, B2) for seed in SEEDS]
    ckpt = str(root / "runs" / "run-recast-l1-s0" / "checkpoints" / "step-000180")
    gains = [write_gain_table(root / "gains-base.parquet", setting, 1.0, None),
             write_gain_table(root / "gains-trained.parquet", setting, 0.1, ckpt)]
    ours, theirs = paths[("recast", B1, 0)], paths[("static", B1, 0)]
    pairs = [judge.Pair(PROMPTS[p], theirs.parent / f"{theirs.name}.images/{p:05d}/000.png",
                        ours.parent / f"{ours.name}.images/{p:05d}/000.png") for p in range(3)]
    # ReCAST is image_b here and the labels say nothing: the images tell which side it is.
    j1 = write_judgement_file(root / "judge-l1.parquet", pairs, ["A", "B"],
                              overall=["b", "b", "b", "a", "tie", "b"],
                              criteria={"faithfulness": ["b"] * 6, "aesthetics": ["a"] * 6})
    # No image columns: the labels name the sides.
    j2 = write_judgement_file(root / "judge-extra.parquet", None, ["recast", "static"],
                              overall=["a", "a", "a", "a", "b", "b"], criteria={"faithfulness": ["a", "b"] * 3})
    inputs = [*paths.values(), *runs, *gains, j1, j2]
    return {"root": root, "setting": setting, "evals": paths, "runs": runs, "gains": gains, "inputs": inputs}


def invoke(*args):
    return runner.invoke(app, ["report", *(str(a) for a in args)])


@pytest.fixture(scope="module")
def report(world) -> dict:
    out = world["root"] / "out"
    result = invoke(*world["inputs"], "--out", out)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return {"out": out, "md": (out / "report.md").read_text()}


def table_rows(md: str, heading: str) -> list[list[str]]:
    """The rows of the first Markdown table under the heading that starts with ``heading`` (bold marks removed)."""
    section = md.split("\n## " + heading, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip().replace("**", "") for c in line.strip("|").split("|")] for line in lines[2:]]


def by_first(rows: list[list[str]]) -> dict[str, list[str]]:
    return {row[0]: row[1:] for row in rows}


def pooled(mode: str, scorer: str) -> tuple[float, float]:
    """Table 1 by hand: each seed's mean over the two budgets, then mean and sample std over the seeds."""
    def value(b, s):
        return aggregate(mode, b, s) if scorer == "aggregate" else cell(mode, b, s, scorer)
    per_seed = [statistics.mean(value(b, s) for b in (B1, B2)) for s in SEEDS]
    return statistics.mean(per_seed), statistics.stdev(per_seed)


def shown(mean: float, std: float, decimals: int = 3) -> str:
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


# --------------------------------------------------------------------------- the tables


def test_table1_rows_are_means_and_stds_over_seeds_with_win_counts(report):
    rows = by_first(table_rows(report["md"], "Table 1"))
    assert list(rows) == ["Aggregate r", *REWARDS]
    # clip by hand: ReCAST seeds (0.31 + 0.30)/2 = 0.305 and (0.315 + 0.32)/2 = 0.3175 → 0.31125 ± 0.0125/√2
    assert rows["clip"] == ["0.250", "0.305 ± 0.014", "0.310 ± 0.014", "0.311 ± 0.009", "3 of 4"]
    assert rows["Aggregate r"][0] == "1.400"  # base: (1.35 + 1.45)/2 over the two budgets' λ
    for scorer in REWARDS:
        row = rows[scorer]
        assert row[0] == f"{BASE[scorer]:.3f}"
        for column, mode in zip(row[1:4], ("static", "nosink", "recast")):
            assert column == shown(*pooled(mode, scorer))
    assert rows["Aggregate r"][1:4] == [shown(*pooled(m, "aggregate")) for m in ("static", "nosink", "recast")]
    for scorer in ("hps", "pick", "ocr"):
        won = sum(cell("recast", b, s, scorer) > cell("static", b, s, scorer) for b in (B1, B2) for s in SEEDS)
        assert rows[scorer][4] == f"{won} of 4"
    assert rows["hps"][4] == "2 of 4" and rows["ocr"][4] == "4 of 4"


def test_table1_bolds_the_better_of_static_and_recast(report):
    section = report["md"].split("## Table 1", 1)[1].split("\n## ", 1)[0]
    clip = next(line for line in section.splitlines() if line.startswith("| clip "))
    assert "**0.311 ± 0.009**" in clip and "**0.305" not in clip


def test_table2_judges_use_two_decimals_on_a_large_scale(report):
    rows = by_first(table_rows(report["md"], "Table 2"))
    assert list(rows) == list(JUDGES)
    assert rows["hpsv3"][0] == "12.00"
    assert rows["hpsv3"][3] == shown(*pooled("recast", "hpsv3"), decimals=2)
    assert rows["imagereward"][1] == shown(*pooled("static", "imagereward"))
    assert rows["imagereward"][4] == "2 of 4"  # static wins λ1 at both seeds, ReCAST λ2 at both


def test_table4_aggregate_per_budget_for_each_method(report):
    rows = by_first(table_rows(report["md"], "Table 4"))
    assert list(rows) == ["static", "no-Sink", "ReCAST"]
    for label, mode in (("static", "static"), ("no-Sink", "nosink"), ("ReCAST", "recast")):
        per_budget = [[aggregate(mode, b, s) for s in SEEDS] for b in (B1, B2)]
        expected = [shown(statistics.mean(v), statistics.stdev(v)) for v in per_budget]
        mean = statistics.mean(statistics.mean(v) for v in per_budget)
        assert rows[label] == [*expected, f"{mean:.3f}"]


def test_tables_7_to_10_per_budget_with_pareto_verdicts(report):
    rewards = table_rows(report["md"], "Tables 7/8")
    assert [(r[0], r[1]) for r in rewards] == [("(1,1,1,1)", "static"), ("(1,1,1,1)", "ReCAST"),
                                               ("(1,1,1,2)", "static"), ("(1,1,1,2)", "ReCAST")]
    assert [r[-1] for r in rewards] == ["ReCAST ≻ static"] * 2 + ["trade-off"] * 2
    ours_l2 = rewards[3]
    values = [[aggregate("recast", B2, s) for s in SEEDS]] + [[cell("recast", B2, s, r) for s in SEEDS] for r in REWARDS]
    assert ours_l2[2:-1] == [shown(statistics.mean(v), statistics.stdev(v)) for v in values]
    judges = table_rows(report["md"], "Tables 9/10")
    assert [r[-1] for r in judges] == ["static ≻ ReCAST"] * 2 + ["ReCAST ≻ static"] * 2
    assert judges[0][3] == shown(statistics.mean([cell("static", B1, s, "hpsv3") for s in SEEDS]),
                                 statistics.stdev([cell("static", B1, s, "hpsv3") for s in SEEDS]), 2)


def test_table3_counts_both_orders_and_finds_the_recast_side(report):
    rows = by_first(table_rows(report["md"], "Table 3"))
    assert "| criterion | (1,1,1,1) | judge-extra | mean |" in report["md"]
    # judge-l1: ReCAST is image b; overall b,b,b,a,tie,b → (4 + ½)/6; judge-extra: ReCAST is a, 4 of 6
    assert rows["Overall"] == ["0.7500", "0.6667", f"{(0.75 + 4 / 6) / 2:.4f}"]
    assert rows["Faithfulness"] == ["1.0000", "0.5000", "0.7500"]
    assert rows["Aesthetics"] == ["0.0000", "—", "0.0000"]
    assert rows["pairs"] == ["3", "3", "6"]


def test_table6_total_gain_before_and_after_training(report):
    rows = by_first(table_rows(report["md"], "Table 6"))
    totals = GAIN.sum(axis=1)
    for reward, total in zip(REWARDS, totals):
        assert rows[reward] == [f"{total:.3f}", f"{0.1 * total:.3f}", "0.10×"]
    assert rows["all rewards"] == [f"{totals.sum():.3f}", f"{0.1 * totals.sum():.3f}", "0.10×"]
    assert "| reward | base policy | run-recast-l1-s0 step 180 | remaining (run-recast-l1-s0 step 180) |" in report["md"]


def test_figures_are_written_and_linked(report):
    out, md = report["out"], report["md"]
    expected = {"fig1-nosink-lambda-1-1-1-1.png", "fig1-nosink-lambda-1-1-1-2.png", "fig1-recast-lambda-1-1-1-1.png",
                "fig1-recast-lambda-1-1-1-2.png", "training-curves.png", "samples-lambda-1-1-1-1.png",
                "samples-lambda-1-1-1-2.png", "fig5-d-curves.png"}
    assert {p.name for p in out.glob("*.png")} == expected
    for name in expected:
        assert f"![{name}]({name})" in md
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_regenerating_gives_identical_bytes_and_no_paths_or_dates(world, report, tmp_path):
    again = tmp_path / "again"
    result = invoke(*reversed(world["inputs"]), "--out", again)  # input order does not matter either
    assert result.exit_code == 0, (result.stdout, result.stderr)
    first = {p.name: p.read_bytes() for p in report["out"].iterdir()}
    second = {p.name: p.read_bytes() for p in again.iterdir()}
    assert first == second
    md = report["md"]
    assert str(world["root"]) not in md and "/data/" not in md and "created_at" not in md


def test_report_without_evaluations_draws_what_runs_and_gains_give(world, tmp_path):
    result = invoke(*world["runs"][:2], *world["gains"], "--out", tmp_path / "o")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    md = (tmp_path / "o" / "report.md").read_text()
    assert "## Table 1" not in md and "## Table 6" in md and "training-curves.png" in md


# --------------------------------------------------------------------------- bad input


def assert_bad(result, needle: str, out: Path):
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not out.exists()


def test_evaluation_of_another_setting_is_bad_input(world, tmp_path):
    other = write_evaluation(tmp_path / "e", tmp_path / "geneval.toml", "recast", B1, 5, setting_name="geneval")
    out = tmp_path / "out"
    assert_bad(invoke(world["evals"][("static", B1, 0)], other, "--out", out), "one report covers one setting", out)


def test_runs_on_different_w_grids_are_bad_input(world, tmp_path):
    other = write_evaluation(tmp_path / "e", world["setting"], "recast", B1, 7, sigmas=[1.0, 0.5, 0.0])
    out = tmp_path / "out"
    assert_bad(invoke(world["evals"][("static", B1, 0)], other, "--out", out), "another σ grid", out)


def test_unknown_input_kind_is_bad_input(world, tmp_path):
    out = tmp_path / "out"
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert_bad(invoke(world["evals"][("static", B1, 0)], text, "--out", out), "recast report reads", out)
    weights = world["runs"][0] / "weights.safetensors"
    assert_bad(invoke(world["evals"][("static", B1, 0)], weights, "--out", out), "recast report reads", out)
    metrics = world["runs"][0] / "metrics.parquet"
    assert_bad(invoke(metrics, "--out", out), "recast.metrics/1", out)
    assert_bad(invoke(tmp_path, "--out", out), "recast.run/1", out)


def test_nothing_to_report_is_bad_input(world, tmp_path):
    out = tmp_path / "out"
    assert_bad(invoke(world["evals"]["base"], "--out", out), "nothing to report", out)


def test_base_sampled_differently_is_bad_input(world, tmp_path):
    base = write_evaluation(tmp_path / "e", world["setting"], "base", B1, None, sampling={**SAMPLING, "steps": 40})
    out = tmp_path / "out"
    assert_bad(invoke(base, world["evals"][("static", B1, 0)], "--out", out), "base evaluation sampled with", out)


def test_two_evaluations_of_one_run_are_bad_input(world, tmp_path):
    again = write_evaluation(tmp_path / "e", world["setting"], "static", B1, 0)
    out = tmp_path / "out"
    assert_bad(invoke(world["evals"][("static", B1, 0)], again, "--out", out), "two evaluations of", out)


def test_judgements_in_one_order_only_are_bad_input(world, tmp_path):
    path = tmp_path / "one-order.parquet"
    verdicts = [judge.Verdict(p, "ab", {"overall": "a"}, "{}") for p in range(2)]
    write_judgements(path, verdicts, judge.win_rates(verdicts, ()), {"labels": ["recast", "static"]}, [])
    out = tmp_path / "out"
    assert_bad(invoke(world["evals"][("static", B1, 0)], path, "--out", out), "both presentation orders", out)


def test_missing_sample_image_leaves_out_the_grid_with_a_note(world, tmp_path):
    static = write_evaluation(tmp_path / "e", world["setting"], "static", B1, 0)
    ours = write_evaluation(tmp_path / "e", world["setting"], "recast", B1, 0)
    (ours.parent / f"{ours.name}.images/00000/000.png").unlink()
    result = invoke(static, ours, "--out", tmp_path / "o")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    md = (tmp_path / "o" / "report.md").read_text()
    assert "no sample grid for λ = (1,1,1,1)" in md and not list((tmp_path / "o").glob("samples-*.png"))
    assert by_first(table_rows(md, "Tables 7/8"))["(1,1,1,1)"][-1] == "ReCAST ≻ static"
