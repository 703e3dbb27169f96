"""Issue 42 §1 and the ladder study's machinery: every reward's endpoint per seed, lost rewards, a
shared learning-rate ladder, the shrunk W (E12s), the base policy's evaluation and each reward's
gradient signal-to-noise — through ``recast study`` and ``recast report``, read back with pandas."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from recast_cli.artifacts import read_cell, read_weights
from recast_cli.solve.sinkhorn import shrunk_weights, solve_weights, static_weights
from tests.test_batched import cli, ok, one_budget, write_setting

LADDER = ('arms = ["static", "recast:power", "recast:power:exact:shrink0.5"]\n'
          'learning_rate_ladder = [1e-12, 3e-2]\nlost_delta = 0.3')


def test_a_ladder_study_reports_every_reward_per_rate_and_shrinks_w(tmp_path):
    setting = one_budget(write_setting(tmp_path, study=LADDER))
    out = tmp_path / "st"
    ok("study", setting, "--out", out, "--quiet")
    names = sorted(p.name for p in (out / "cells").iterdir())
    assert names == sorted(f"1-2-{a}-g4-lr{r}.parquet" for a in ("static", "recast-power", "recast-power-exact-shrink0.5")
                           for r in ("1e-12", "0.03"))
    # E12s: the shrunk W is half static, half the solved W, and its marginals hold
    full, half = (read_weights(out / "W" / f"1-2-{a}.safetensors") for a in ("recast-power", "recast-power-exact-shrink0.5"))
    static = static_weights(np.array([1.0, 2.0]), full.T)
    np.testing.assert_allclose(half.W, 0.5 * static + 0.5 * full.W, rtol=0, atol=1e-15)
    np.testing.assert_allclose(half.W.sum(axis=0), 1 / full.T, rtol=0, atol=1e-10)  # Sinkhorn tol
    np.testing.assert_allclose(half.W.sum(axis=1), [1 / 3, 2 / 3], rtol=0, atol=1e-10)
    assert half.info["shrink"] == 0.5 and "shrink" not in full.info
    # the plain CSV: one row per cell and seed, λ as columns, every reward's finals and gains
    table = pd.read_csv(out / "report" / "endpoints.csv")
    assert len(table) == 6 * 2 and sorted(set(table["learning_rate"])) == [1e-12, 0.03]
    assert (table[["lambda_coarse", "lambda_fine"]].drop_duplicates().values.tolist() == [[1, 2]])
    cell = read_cell(out / "cells" / "1-2-static-g4-lr0.03.parquet")
    base, (lo, hi) = cell.meta["base"]["ode"], cell.meta["reward_range"]["fine"]
    assert (lo, hi) == (0.0, 1.0) and len(base) == 3
    mine = table[(table["arm"] == "static") & (table["learning_rate"] == 0.03)].set_index("seed")
    for s, seed in enumerate(cell.seeds):
        final = cell.evals[s, [k for k, (_, sampler) in enumerate(cell.points) if sampler == "ode"][-1], 1]
        assert mine.loc[seed, "ode_fine"] == final
        assert mine.loc[seed, "gain_fine"] == pytest.approx((final - base[1]) / (hi - base[1]), abs=1e-12)
        gains = mine.loc[seed, ["gain_coarse", "gain_fine"]]
        assert mine.loc[seed, "lost"] == int((gains < 0.3).sum())
    # at a rate of 1e-12 nothing moves: every final equals the base policy's, so every reward is lost
    frozen = table[table["learning_rate"] == 1e-12]
    assert np.allclose(frozen[["gain_coarse", "gain_fine"]], 0, atol=1e-9) and (frozen["lost"] == 2).all()
    assert set(frozen["lost_rewards"]) == {"coarse+fine"}
    report = (out / "report" / "report.md").read_text()
    for text in ("G = 4, learning rate 1e-12", "G = 4, learning rate 0.03", "lost a reward", "δ = 0.3", "stalled (at the end)",
                 "recast-power-exact-shrink0.5 − static", "SNR at iterations 1, 2, 3, 4"):
        assert text in report, text
    # recast report reads the cells again, with another δ
    ok("report", *sorted((out / "cells").iterdir()), "--out", tmp_path / "r2", "--lost-delta", "0.9")
    assert "δ = 0.9" in (tmp_path / "r2" / "report.md").read_text()
    assert cli("report", *sorted((out / "cells").iterdir()), "--out", tmp_path / "r3",
               "--lost-delta", "2").exit_code == 2


def test_a_ladder_is_refused_by_the_make_graph(tmp_path):
    setting = write_setting(tmp_path, study='modes = ["static"]\nlearning_rate_ladder = [0.01, 0.02]')
    result = cli("study-makefile", "--setting", setting, "--root", tmp_path / "r")
    assert result.exit_code == 2 and "learning_rate_ladder" in result.output


def test_the_split_half_gradients_add_up_to_the_first_update(tmp_path):
    """Σ_i (g_i^A + g_i^B)/2 is the gradient the engine's first update takes (no advantage clip, no KL)."""
    from dataclasses import replace

    from recast_cli.train.stacked import BatchedTrainer, Cell
    from recast_cli.train.stacked_gradients import reward_gradients, split_gradients
    from recast_cli.setting.load import load_setting
    from recast_cli.train.config import config_from_setting, trained_steps

    setting = load_setting(str(write_setting(tmp_path, beta_kl=0.0)))
    cfg = replace(config_from_setting(setting), adv_clip=1e9, updates_per_step=1)
    W = solve_weights(np.abs(np.sin(np.arange(12.0))).reshape(2, 6) + 0.1, np.array([1.0, 2.0]), kernel="power").W
    trainer = BatchedTrainer(Cell(cfg=cfg, W=W, trained_steps=tuple(trained_steps(6, 1.0)), noise_level=0.7, T=6,
                                  seeds=(0, 4, 9), eval_n=64))
    states, log_probs, exact = trainer.sample(0)
    adv, adv_t = trainer.advantages(trainer.rewards(states[:, :, -1]))
    split = split_gradients(trainer, states, exact, adv)
    assert split.shape[:3] == (2, 2, 3)
    trainer.update(states, log_probs, exact, adv_t, 0)
    np.testing.assert_allclose(split.mean(dim=1).sum(dim=0).numpy(), trainer.first_gradients, rtol=1e-5, atol=1e-9)
    signal, noise = reward_gradients(trainer, states, exact, adv)  # after the update: other parameters, other values
    assert signal.shape == noise.shape == (3, 2) and (noise > 0).all()


def test_the_gradient_halves_need_an_even_number_of_groups():
    from recast_cli.train.stacked_gradients import half_masks, measured_iterations

    assert half_masks(3, 4, 2) is None
    masks = half_masks(2, 2, 3)  # 4 images × 3 steps: the first 2 images' 6 pairs, then the others'
    assert masks.tolist() == [[1.0] * 6 + [0.0] * 6, [0.0] * 6 + [1.0] * 6]
    assert measured_iterations(30) == (0, 10, 20, 29) and measured_iterations(1) == (0,)


def test_lost_rewards_and_mcnemar():
    from recast_cli.report.rewards import mcnemar, wilson

    a, b, p = mcnemar({s: s < 10 for s in range(40)}, {s: s < 2 for s in range(40)})
    assert (a, b) == (8, 0) and p == pytest.approx(2 * 0.5**8)
    assert mcnemar({0: True}, {0: True})[2] == 1.0
    lo, hi = wilson(5, 20)
    assert lo < 0.25 < hi and math.isnan(wilson(0, 0)[0])


def test_shrunk_weights_keep_the_marginals():
    gain = np.abs(np.cos(np.arange(15.0))).reshape(3, 5) + 0.05
    lam = np.array([1.0, 2.0, 3.0])
    full = solve_weights(gain, lam).W
    for gamma in (0.25, 0.5, 1.0):
        W = solve_weights(gain, lam, shrink=gamma).W
        np.testing.assert_allclose(W, shrunk_weights(full, lam, gamma), rtol=0, atol=1e-15)
        np.testing.assert_allclose(W.sum(axis=1), lam / lam.sum(), atol=1e-10)
        np.testing.assert_allclose(W.sum(axis=0), 0.2, atol=1e-10)
    assert torch.is_tensor(torch.as_tensor(full))


def test_solve_w_shrink_through_the_cli(tmp_path):
    gains = "pipelines/examples/gmm1d-exact-alpha2.parquet"
    ok("solve-w", "--gains", gains, "--lambda", "1,1,1", "--out", tmp_path / "w.safetensors", "--shrink", "0.5")
    assert read_weights(tmp_path / "w.safetensors").info["shrink"] == 0.5
    for bad in ("0", "1.5", "nan"):
        result = cli("solve-w", "--gains", gains, "--lambda", "1,1,1", "--out", tmp_path / "x.safetensors",
                     "--shrink", bad)
        assert result.exit_code == 2 and "--shrink" in result.output and not (tmp_path / "x.safetensors").exists()


def test_the_study_report_counts_the_seeds_whose_training_stalled_a_reward():
    """One reward rises while the other stays at its start: the other is flagged in every seed; when both
    rise, neither is."""
    from types import SimpleNamespace

    from recast_cli.report.rewards import stall_counts, table_stalls

    steps = np.arange(30)

    def cell(b_rises: bool) -> SimpleNamespace:
        a = np.tile(0.5 + 0.45 * np.minimum(steps / 20, 1), (3, 1))
        b = np.tile(0.5 + (0.45 * np.minimum(steps / 20, 1) if b_rises else 0 * steps), (3, 1))
        train = {"reward/a": a, "reward/b": b, "reward_spread/a": np.sqrt(a * (1 - a)),
                 "reward_spread/b": np.sqrt(b * (1 - b))}
        return SimpleNamespace(rewards=("a", "b"), train=train, seeds=(0, 1, 2))

    assert stall_counts(cell(False)) == {"a": (0, 0), "b": (3, 3)}
    assert stall_counts(cell(True)) == {"a": (0, 0), "b": (0, 0)}
    old = cell(False)
    del old.train["reward_spread/a"]
    assert stall_counts(old) is None
    assert "3 (3)" in table_stalls({"static": cell(False)})


def test_every_committed_csv_loads_with_a_plain_read_csv():
    """Issue 42 §1: every CSV the project ships (study endpoints, pilots) reads with pandas' defaults: a
    header line first, the same number of fields in every row, no unnamed columns."""
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[1].glob("docs/**/*.csv"))
    assert files
    for path in files:
        table = pd.read_csv(path)
        assert len(table) > 0 and not any(str(c).startswith("Unnamed") for c in table.columns), path
        if path.name.endswith("endpoints.csv"):  # a study's per-seed endpoints (others: e.g. trust/budget.csv)
            assert {"arm", "seed", "primary", "secondary"} <= set(table.columns), path
        widths = {line.count(",") for line in path.read_text().splitlines()}
        assert len(widths) == 1, f"{path}: rows of different widths"
