"""The batched many-seed engine (``recast study``) against the single-run CLI path, and its command.

The engine must train each seed exactly as ``recast train --seed s`` does (the same noise, group
statistics, clip, optimizer) and evaluate it as ``recast evaluate`` does: the rewards at every
checkpoint are compared with the CLI's, for a recipe that exercises micro-batches, several updates
per step, the KL term and the warmup schedule.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from recast_cli.artifacts import read_cell, read_curve
from recast_cli.cli import app

SETTING = """
[policy]
kind = "flow1d"
steps = 6
noise_level = 0.7

[train]
rewards = ["coarse", "fine"]
lambda = [1, 1]
prompts = "prompts.txt"
train_fraction = {fraction}
lora_rank = 0
max_steps = 4
group_size = 4
prompts_per_step = 4
micro_batch = 7
sample_batch = 16
updates_per_step = 2
learning_rate = 3e-2
lr_schedule = "warmup"
warmup_steps = 2
clip_range = 0.2
beta_kl = {beta_kl}
save_every = 2
keep_checkpoints = 2

[evaluate]
n = 256
seed = 10000
batch_size = 256
judges = []

[study]
budgets = [[1, 1], [1, 2]]
seeds = [0, 1]
{study}
"""


def write_setting(root: Path, study: str = 'modes = ["static", "recast"]', beta_kl: float = 0.1,
                  fraction: float = 1.0, name: str = "s.toml") -> Path:
    (root / "prompts.txt").write_text("x\n")
    path = root / name
    path.write_text(SETTING.format(study=study, beta_kl=beta_kl, fraction=fraction))
    return path


def one_budget(setting: Path) -> Path:
    """The setting with one budget (λ = 1, 2): two arms make two cells, enough for shards and kills."""
    setting.write_text(setting.read_text().replace("budgets = [[1, 1], [1, 2]]", "budgets = [[1, 2]]"))
    return setting


def cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def ok(*args: str):
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result


# --------------------------------------------------------------------------- the engine = the single-run path


@pytest.mark.parametrize("fraction, beta_kl", [(1.0, 0.1), (0.8, 0.0)])
def test_each_seed_trains_and_evaluates_as_its_single_run(tmp_path, fraction, beta_kl):
    setting = write_setting(tmp_path, beta_kl=beta_kl, fraction=fraction)
    ok("study", setting, "--out", tmp_path / "st", "--seeds", "0,1,5", "--no-report", "--quiet")
    for mode in ("static", "recast"):
        cell = read_cell(tmp_path / "st" / "cells" / f"1-2-{mode}-g4.parquet")
        w = tmp_path / "st" / "W" / f"1-2-{mode}.safetensors"
        for seed in (0, 5):
            run = tmp_path / f"{mode}-{seed}"
            ok("train", "--setting", setting, "--weights", w, "--seed", seed, "--lambda", "1,2", "--out", run, "--quiet")
            ok("evaluate", "--run", run, "--checkpoints", "all", "--sampler", "sde", "--out", tmp_path / "c.parquet",
               "--quiet")
            ok("evaluate", "--run", run, "--sampler", "ode", "--out", tmp_path / "o.parquet", "--quiet")
            mine = cell.curve(seed)
            for path in (tmp_path / "c.parquet", tmp_path / "o.parquet"):
                theirs = read_curve(path)
                for k, point in enumerate(theirs.points):
                    np.testing.assert_allclose(mine.mean[mine.points.index(point)], theirs.mean[k], rtol=0, atol=1e-12)
                    np.testing.assert_allclose(mine.std[mine.points.index(point)], theirs.std[k], rtol=0, atol=1e-9)
            # the training rows are the run's metrics
            import pyarrow.parquet as pq

            metrics = pq.read_table(run / "metrics.parquet").to_pylist()
            for row in metrics:
                i = cell.steps.index(row["step"])
                assert cell.train[f"reward/{row['reward']}"][cell.seeds.index(seed), i] == pytest.approx(
                    row["reward_mean"], abs=1e-12)
                assert cell.train["clip_frac"][cell.seeds.index(seed), i] == pytest.approx(row["clip_frac"], abs=1e-9)
                assert cell.train["grad_norm"][cell.seeds.index(seed), i] == pytest.approx(row["grad_norm"], rel=1e-4)


def test_a_seed_does_not_depend_on_the_seeds_beside_it(tmp_path):
    from recast_cli.train.stacked import BatchedTrainer, Cell
    from recast_cli.setting.load import load_setting
    from recast_cli.train.config import config_from_setting, trained_steps

    setting = load_setting(str(write_setting(tmp_path, beta_kl=0.0)))
    cfg = config_from_setting(setting)
    W = np.full((2, 6), 1 / 12)
    results = [BatchedTrainer(Cell(cfg=cfg, W=W, trained_steps=tuple(trained_steps(6, 1.0)), noise_level=0.7, T=6, seeds=seeds,
                                   eval_n=128)).run() for seeds in ((3,), (1, 2, 3))]
    alone, together = ([r for r in res.evals if r["seed"] == 3] for res in results)
    assert alone == together
    assert [r for r in results[1].evals if r["seed"] == 1] != together


@pytest.mark.parametrize("beta_kl", [0.0, 0.1])
def test_a_seed_is_the_same_in_any_batch_when_the_seeds_are_split(tmp_path, monkeypatch, beta_kl):
    """With more seeds than one forward holds (UPDATE_ELEMENTS and EVAL_ELEMENTS made small), a seed still
    trains on its single run's micro-batches: its training rows, evaluations and final network are the same
    bits among 2, 3 and 5 seeds. (Before, the micro-batch shrank with S: a seed's gradient was summed in
    another order in every batch size, and over a long run at a fast rate the difference grew to another
    outcome. A cell of one seed alone still differs in the last float32 bits: one matrix takes another
    matmul kernel.)"""
    from dataclasses import replace

    import torch

    from recast_cli.train import stacked as engine
    from recast_cli.train.stacked import BatchedTrainer, Cell
    from recast_cli.setting.load import load_setting
    from recast_cli.train.config import config_from_setting, trained_steps

    setting = load_setting(str(write_setting(tmp_path, beta_kl=beta_kl)))
    cfg = replace(config_from_setting(setting), micro_batch=24, max_steps=3)
    monkeypatch.setattr(engine, "UPDATE_ELEMENTS", 2 * 24)  # two seeds per forward/backward
    monkeypatch.setattr(engine, "EVAL_ELEMENTS", 48)
    W = np.full((2, 6), 1 / 12)

    def run(seeds):
        result = BatchedTrainer(Cell(cfg=cfg, W=W, trained_steps=tuple(trained_steps(6, 1.0)), noise_level=0.7, T=6,
                                     seeds=seeds, eval_n=32)).run()
        i = seeds.index(3)
        return ([r for r in result.train if r["seed"] == 3], [r for r in result.evals if r["seed"] == 3],
                [p[i] for p in result.final])

    alone, three, five = run((3, 1)), run((1, 2, 3)), run((0, 4, 3, 1, 2))
    for other in (three, five):
        assert other[0] == alone[0] and other[1] == alone[1]
        assert all(torch.equal(a, b) for a, b in zip(alone[2], other[2]))
    assert len(alone[0]) > 0 and len(alone[1]) > 0


# --------------------------------------------------------------------------- the command


def test_study_writes_cells_and_a_report_and_resumes(tmp_path):
    setting = write_setting(tmp_path, study='arms = ["static", "recast:power", "reversed:power"]\n'
                                           'group_sizes = [2, 4]\nlearning_rates = {"recast-power" = 1e-2, "static@4" = 2e-2}')
    out = tmp_path / "st"
    ok("study", setting, "--out", out, "--quiet")
    cells = sorted(p.name for p in (out / "cells").iterdir())
    assert cells == sorted(f"{b}-{a}-g{g}.parquet" for b in ("1-1", "1-2") for a in ("static", "recast-power",
                                                                                    "reversed-power") for g in (2, 4))
    cell = read_cell(out / "cells" / "1-1-recast-power-g2.parquet")
    assert cell.meta["kernel"] == "power" and cell.meta["group_size"] == 2 and cell.meta["prompts_per_step"] == 8
    assert cell.meta["train"]["learning_rate"] == 1e-2
    assert read_cell(out / "cells" / "1-1-static-g2.parquet").meta["train"]["learning_rate"] == 3e-2
    assert read_cell(out / "cells" / "1-1-static-g4.parquet").meta["train"]["learning_rate"] == 2e-2
    import pandas as pd

    table = pd.read_csv(out / "report" / "endpoints.csv")  # a plain CSV: one row per cell and seed
    assert len(table) == 12 * 2 and set(table["arm"]) == {"static", "recast-power", "reversed-power"}
    assert {"lambda_coarse", "lambda_fine", "ode_fine", "sde_coarse", "gain_fine", "worst_gain", "lost"} <= set(table)
    assert (table["worst_gain"] == table[["gain_coarse", "gain_fine"]].min(axis=1)).all()
    report = (out / "report" / "report.md").read_text()
    assert "recast-power − static" in report and "reversed-power − static" in report and "G = 2" in report
    # done cells are kept; a removed one is run again
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}
    (out / "cells" / "1-2-static-g4.parquet").unlink()
    ok("study", setting, "--out", out, "--quiet")
    again = {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}
    assert {k for k in again if again[k] != stamps.get(k)} == {"1-2-static-g4.parquet"}
    # the report reproduces itself byte for byte from the same cells
    first = (out / "report" / "report.md").read_bytes()
    ok("report", *sorted((out / "cells").iterdir()), "--out", tmp_path / "r2")
    assert (tmp_path / "r2" / "report.md").read_bytes() == first
    # inspect reads a cell
    summary = json.loads(ok("inspect", out / "cells" / "1-1-static-g4.parquet", "--json").output)
    assert summary["kind"] == "cell" and summary["seeds"] == 2 and summary["arm"]["arm"] == "static"


def test_a_cell_of_another_study_is_refused(tmp_path):
    setting = write_setting(tmp_path, study='modes = ["static"]')
    out = tmp_path / "st"
    ok("study", setting, "--out", out, "--quiet", "--no-report")
    result = cli("study", setting, "--out", out, "--quiet", "--seeds", "0:3")
    assert result.exit_code == 2 and "another study" in result.output


@pytest.mark.parametrize("study, args, message", [
    ('modes = ["static"]\ngroup_sizes = [3]', (), "does not divide"),
    ('arms = ["static", "recast:cubic"]', (), "kernel must be one of"),
    ('arms = ["sideways"]', (), "MODE[:KERNEL[:GAINS[:shrinkγ|shrinkauto|conflict]]]"),
    ('arms = ["static", "recast:power:exact:shrink1.5"]', (), "shrinkγ with γ in (0, 1)"),
    ('modes = ["static"]\nlearning_rate_ladder = [0.02, 0.01]', (), "ascending"),
    ('modes = ["static"]\nlearning_rate_ladder = [0.01]\nlearning_rates = {"static" = 0.1}', (), "excludes"),
    ('modes = ["static"]\nlost_delta = 1.5', (), "lost_delta must lie in (0, 1)"),
    ('modes = ["static"]\nlearning_rates = {"recast" = 0.1}', (), "names no arm"),
    ('modes = ["static"]', ("--seeds", "4:4"), "distinct seeds"),
    ('modes = ["static"]', ("--seeds", "x"), "LO:HI"),
    ('modes = ["static"]\neval_n = 0', (), "eval_n"),
])
def test_bad_studies_are_one_line(tmp_path, study, args, message):
    setting = write_setting(tmp_path, study=study)
    result = cli("study", setting, "--out", tmp_path / "st", "--quiet", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "st" / "cells").exists() or not any((tmp_path / "st" / "cells").iterdir())


def test_the_plan_is_every_budget_by_arm_by_group_size_with_its_learning_rate(tmp_path):
    from recast_cli.setting.load import load_setting
    from recast_cli.study.spec import load_study
    from recast_cli.train.config import config_from_setting

    study = ('arms = ["static", "recast:power"]\ngroup_sizes = [2, 8]\n'
             'learning_rates = {"recast-power" = 0.1, "static@8" = 0.2}')
    setting = load_setting(str(write_setting(tmp_path, study=study)))
    cells = load_study(setting).cells(config_from_setting(setting), setting.file.name)
    assert [c.name for c in cells] == [f"{b}-{a}-g{g}" for b in ("1-1", "1-2") for a in ("static", "recast-power")
                                       for g in (2, 8)]
    assert {c.weights_name for c in cells} == {"1-1-static", "1-1-recast-power", "1-2-static", "1-2-recast-power"}
    assert [(c.group_size, c.prompts_per_step) for c in cells[:2]] == [(2, 8), (8, 2)]  # [train]'s 16 rollouts
    assert [c.learning_rate for c in cells[:4]] == [3e-2, 0.2, 0.1, 0.1]  # ARM@G, then ARM, then [train]'s
    assert cells[2].arm.kernel == "power" and cells[0].arm.kernel == "exp"


def test_the_make_graph_runs_the_plan_of_recast_study(tmp_path):
    """One [study] table, one plan: the Make graph solves the W files `recast study` plans, each with its arm's
    kernel and gains, and trains one run per cell and seed."""
    import re

    from recast_cli.study.runner import plan_study

    setting = write_setting(tmp_path, study='arms = ["static", "recast:power", "nosink:exp:estimate"]\ngains = "exact"')
    plan = plan_study(str(setting), tmp_path / "st")
    text = ok("study-makefile", "--setting", setting, "--root", "R").stdout
    solved = re.findall(r"^\$\(R\)/W/(\S+)\.safetensors: \$\(R\)/(\S+) .*\n\t.* --mode (\w+) --kernel (\w+) ", text,
                        re.MULTILINE)
    gains = {"exact": "gains/exact.parquet", "estimate": "gains.parquet"}
    planned = [(c.weights.stem, gains[c.arm.gains], c.arm.mode, c.arm.kernel) for c in plan.cells]
    # and ReCAST's W from the sampled gains beside each exact one, for the report
    assert solved == [x for b in ("1-1", "1-2") for x in [(f"{b}-recast-sampled", "gains.parquet", "recast", "power"),
                                                           *(p for p in planned if p[0].startswith(b + "-"))]]
    runs = re.findall(r"^\$\(R\)/runs/(\S+)/\.done:", text, re.MULTILINE)
    assert runs == [f"{c.weights.stem[:3]}/{c.arm.label}-s{s}" for c in plan.cells for s in plan.seeds]


@pytest.mark.parametrize("study, message", [
    ('modes = ["static"]\ngroup_sizes = [2, 4]', "s.toml: [study] group_sizes = [2, 4]: a study's Make graph trains "
                                                 "at [train] group_size = 4 only"),
    ('modes = ["static"]\ngroup_sizes = [8]', "group_sizes = [8]"),
    ('modes = ["static"]\nlearning_rates = {"static" = 0.1}', "learning_rates: a study's Make graph trains every arm"),
    ('arms = ["recast:exp", "recast:power"]', "two arms of mode recast"),
    ('modes = ["static"]\neval_n = 16', "eval_n = 16: a study's Make graph evaluates [evaluate] n = 256"),
])
def test_what_the_make_graph_cannot_run_is_one_line(tmp_path, study, message):
    result = cli("study-makefile", "--setting", write_setting(tmp_path, study=study))
    assert result.exit_code == 2 and result.stdout == ""
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_what_the_make_graph_can_run_of_a_plan_is_not_refused(tmp_path):
    study = 'modes = ["static"]\ngroup_sizes = [4]\neval_n = 256\nlearning_rates = {"static" = 3e-2}'
    text = ok("study-makefile", "--setting", write_setting(tmp_path, study=study)).stdout
    assert "--mode static --kernel exp" in text


def test_only_the_one_d_world_runs_batched(tmp_path):
    result = cli("study", "pipelines/toy.toml", "--out", tmp_path / "st")
    assert result.exit_code == 2 and "make all SETTING" in result.output


def test_the_final_networks_are_the_single_runs(tmp_path):
    """Weights after training agree with a single run's checkpoint to float32 roundoff."""
    from recast_cli.train.stacked import BatchedTrainer, Cell
    from recast_cli.artifacts.run import FULL_FILE
    from recast_cli.setting.load import load_setting
    from recast_cli.train.config import config_from_setting, trained_steps

    path = write_setting(tmp_path, beta_kl=0.0)
    ok("train", "--setting", path, "--weights", "static", "--seed", 2, "--out", tmp_path / "run", "--quiet")
    cfg = config_from_setting(load_setting(str(path)))
    trainer = BatchedTrainer(Cell(cfg=cfg, W=np.full((2, 6), 1 / 12), trained_steps=tuple(trained_steps(6, 1.0)),
                                  noise_level=0.7, T=6, seeds=(2, 7), eval_n=16))
    result = trainer.run()
    ref = load_file(str(tmp_path / "run" / "checkpoints" / "step-000004" / "adapter" / FULL_FILE))
    mine = trainer.net.state_dict(0, result.final)
    for name, tensor in ref.items():
        np.testing.assert_allclose(mine[name].numpy(), tensor.numpy(), rtol=0, atol=1e-4)


def test_shards_split_the_cells_and_the_report_waits_for_all(tmp_path):
    setting = one_budget(write_setting(tmp_path, study='modes = ["static", "recast"]'))
    out = tmp_path / "st"
    first = ok("study", setting, "--out", out, "--shard", "0/2", "--quiet")
    assert "waits for the other shards" in first.output and not (out / "report").exists()
    assert sorted(p.name for p in (out / "cells").iterdir()) == ["1-2-static-g4.parquet"]
    ok("study", setting, "--out", out, "--shard", "1/2", "--quiet")
    assert len(list((out / "cells").iterdir())) == 2 and (out / "report" / "report.md").is_file()
    assert cli("study", setting, "--out", out, "--shard", "2/2").exit_code == 2


def test_seeds_as_a_range_string(tmp_path):
    from recast_cli.setting.load import load_setting
    from recast_cli.study.spec import load_study

    setting = write_setting(tmp_path, study='modes = ["static"]')
    text = setting.read_text().replace("seeds = [0, 1]", 'seeds = "3:7"')
    setting.write_text(text)
    assert load_study(load_setting(str(setting))).seeds == (3, 4, 5, 6)
    setting.write_text(text.replace('"3:7"', '"7:3"'))
    result = cli("check-setting", setting)
    assert result.exit_code == 2 and "LO < HI" in result.output


def test_an_arm_trains_on_w_from_the_sampled_estimator(tmp_path):
    """recast:power:estimate: W solved from `recast estimate` at the base policy (what a user has)."""
    from recast_cli.artifacts import read_gains, read_weights

    setting = write_setting(tmp_path, study='arms = ["static", "recast:power:estimate"]\nn = 16\nk = 2\nestimate_steps = 6')
    out = tmp_path / "st"
    ok("study", setting, "--out", out, "--quiet", "--no-report")
    gains = read_gains(out / "gains" / "estimate.parquet")
    assert gains.meta["sampling"] == "pplus" and gains.meta["N"] == 16
    assert not (out / "gains" / "exact.parquet").exists()  # no arm needs the exact table
    w = read_weights(out / "W" / "1-2-recast-power-estimate.safetensors")
    assert w.info["kernel"] == "power" and np.allclose(w.gain, gains.gain)
    cell = read_cell(out / "cells" / "1-2-recast-power-estimate-g4.parquet")
    assert cell.meta["gains"] == "estimate" and np.allclose(cell.meta["W"], w.W)


def test_one_seed_is_a_cell_too(tmp_path):
    setting = write_setting(tmp_path, study='modes = ["static"]')
    ok("study", setting, "--out", tmp_path / "st", "--seeds", "4", "--quiet")
    cell = read_cell(tmp_path / "st" / "cells" / "1-1-static-g4.parquet")
    assert cell.seeds == (4,) and cell.meta["gradient"]["spread"] is None


def test_shards_run_at_the_same_time(tmp_path):
    """Two shard processes at once: the first writes the shared gains and W, the other waits for them."""
    import subprocess
    import sys

    setting = one_budget(write_setting(tmp_path, study='modes = ["static", "recast"]'))
    recast = Path(sys.executable).parent / "recast"
    procs = [subprocess.Popen([str(recast), "study", str(setting), "--out", str(tmp_path / "st"), "--shard", f"{i}/2",
                               "--quiet", "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sorted(p.name for p in (tmp_path / "st" / "cells").iterdir()) == ["1-2-recast-g4.parquet",
                                                                              "1-2-static-g4.parquet"]


def test_malloc_keeps_freed_memory_on_glibc():
    """The engine's mallopt calls are accepted by this C library (a refused one leaves the engine
    to glibc's defaults: fresh pages for its arrays at every step, 13% of a cell's wall)."""
    import platform

    from recast_cli.train.stacked import hold_freed_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert hold_freed_memory() is True


def test_a_study_killed_mid_cell_resumes_and_loses_only_that_cell(tmp_path):
    """kill -9 while a cell trains: the finished cells stay as they are, nothing half-written is
    left behind as a cell, and the rerun runs only what was not finished."""
    import os
    import signal
    import subprocess
    import sys
    import time

    setting = one_budget(write_setting(tmp_path, study='modes = ["static", "recast"]'))
    recast = Path(sys.executable).parent / "recast"
    cells = tmp_path / "st" / "cells"
    args = [str(recast), "study", str(setting), "--out", str(tmp_path / "st"), "--seeds", "0:6",
            "--set", "max_steps=40", "--set", "save_every=40", "--quiet"]  # a cell: seconds, far longer than 0.5 s
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not (cells.is_dir() and any(p.suffix == ".parquet" for p in cells.iterdir())):
            assert proc.poll() is None and time.monotonic() < deadline, "no cell finished"
            time.sleep(0.05)
        time.sleep(0.5)  # into the next cell
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = {p.name: p.stat().st_mtime_ns for p in cells.iterdir() if p.suffix == ".parquet"}
    assert len(done) == 1  # killed in the second of the two cells
    for name in done:
        read_cell(cells / name)  # whole cells only
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr
    after = {p.name: p.stat().st_mtime_ns for p in cells.iterdir()}
    assert len(after) == 2 and all(name.endswith(".parquet") for name in after)  # no temp file left
    assert all(after[name] == stamp for name, stamp in done.items())
    assert (tmp_path / "st" / "report" / "report.md").is_file()


def test_seed_groups_never_leave_a_seed_alone_in_a_cell_of_several():
    from recast_cli.train.stacked import seed_groups

    spans = lambda S, size: [(g.start, g.stop) for g in seed_groups(S, size)]
    assert spans(5, 2) == [(0, 2), (2, 5)] and spans(4, 2) == [(0, 2), (2, 4)] and spans(3, 8) == [(0, 3)]
    assert spans(1, 2) == [(0, 1)] and spans(7, 1) == [(0, 2), (2, 4), (4, 7)]  # never one seed of several alone
