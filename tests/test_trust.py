"""A W a user can trust (docs/trust.md), through the CLI: W's bootstrap spread and verdict from a gain table of
known spread, the estimation-budget line, E14's conflicts (a constructed conflicting pair flagged, an independent
pair not), the two variants E12u (``--shrink auto``) and E12c (``--conflicts static``) keeping E12's marginals,
and the warning and ``conflict/A,B`` series of ``recast train``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import read_gains, read_weights, write_gains
from recast_cli.artifacts.scores import ScoreTable, write_scores
from recast_cli.cli import app
from recast_cli.solve.conflict import rho_upper
from recast_cli.solve.sinkhorn import row_tv, static_weights
from recast_cli.train.conflict import ConflictWatch, advantage_correlation
from tests.conftest import bump_gains, make_table

runner = CliRunner()
T = 12
REWARDS = ("a", "b", "c")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def run_ok(*args):
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def point_gain() -> np.ndarray:
    return 0.05 * bump_gains([10, 6, 2], [1.5, 1.5, 1.0], T)


def table_with_draws(path: Path, draws: np.ndarray, N: int = 64) -> Path:
    table = make_table(point_gain(), REWARDS)
    table = replace(table, gain_draws=draws, meta={**table.meta, "N": N})
    write_gains(path, table, config={"test": True})
    return path


def solved(tmp_path: Path, gains: Path, *extra, name: str = "W.safetensors"):
    out = tmp_path / name
    result = run_ok("solve-w", "--gains", gains, "--lambda", "1,1,2", "--out", out, *extra)
    return read_weights(out), result


# ------------------------------------------------------------------ W's spread from the bootstrap


def test_the_draws_round_trip_through_the_gain_table(tmp_path):
    draws = np.random.default_rng(0).uniform(0, 0.1, (7, 3, T))
    path = table_with_draws(tmp_path / "g.parquet", draws)
    back = read_gains(path)
    np.testing.assert_array_equal(back.gain_draws, draws)
    assert json.loads(run_ok("inspect", path, "--json").stdout)["draws"] == 7


def test_a_gain_table_of_known_spread_gives_the_documented_tv_interval(tmp_path):
    """Half the draws are the point gains (W itself), half are flat (W = static): each row's TV to W is 0 or
    d = TV(W, static), so its 5 % / median / 95 % points are 0, d/2, d and the 95 % point does not clear d."""
    flat = np.full((3, T), 0.05)
    draws = np.stack([point_gain()] * 50 + [flat] * 50)
    W, result = solved(tmp_path, table_with_draws(tmp_path / "g.parquet", draws))
    d = row_tv(W.W, static_weights(np.array([1.0, 1.0, 2.0]), T))
    rows = W.info["bootstrap"]["rows"]
    for i, name in enumerate(REWARDS):
        assert rows[name]["tv_point"] == pytest.approx([0.0, d[i] / 2, d[i]], abs=1e-9)
        assert rows[name]["tv_static"] == pytest.approx(d[i], abs=1e-12)
        assert rows[name]["tv_static_range"] == pytest.approx([0.0, d[i]], abs=1e-9)
        assert rows[name]["verdict"] == "not distinguishable from static at this budget"
        assert rows[name]["samples_to_resolve"] == pytest.approx(64.0)  # N·(q95/d)² with q95 = d
    assert W.info["bootstrap"]["samples_for_tv"]["0.1"] == pytest.approx(64 * (d.max() / 2 / 0.1) ** 2)
    assert "not distinguishable from static at this budget" in " ".join(result.stdout.split())
    assert "budget: now N = 64" in " ".join(result.stdout.split())
    lo, hi = W.band
    np.testing.assert_allclose(lo, np.minimum(W.W, static_weights(np.array([1.0, 1.0, 2.0]), T)), atol=1e-12)
    np.testing.assert_allclose(hi, np.maximum(W.W, static_weights(np.array([1.0, 1.0, 2.0]), T)), atol=1e-12)
    shown = " ".join(run_ok("inspect", tmp_path / "W.safetensors").stdout.split())
    assert "not distinguishable from static" in shown and "budget" in shown


def test_draws_that_agree_resolve_the_timing(tmp_path):
    draws = np.stack([point_gain() * s for s in np.linspace(0.9, 1.1, 20)])  # E11 reads ΔD̄: scale-free
    W, result = solved(tmp_path, table_with_draws(tmp_path / "g.parquet", draws))
    for name in REWARDS:
        row = W.info["bootstrap"]["rows"][name]
        assert row["tv_point"] == pytest.approx([0, 0, 0], abs=1e-9) and row["verdict"] == "timing resolved"
    assert "timing resolved" in " ".join(result.stdout.split())


def test_bootstrap_flags_and_a_table_without_draws(tmp_path):
    plain = tmp_path / "plain.parquet"
    write_gains(plain, make_table(point_gain(), REWARDS), config={"test": True})
    W, _ = solved(tmp_path, plain)
    assert "bootstrap" not in W.info and W.band is None  # nothing to resample: W as before
    for args, needle in [(("--bootstrap", "10"), "records no bootstrap draws"),
                         (("--shrink", "auto"), "records no bootstrap draws"),
                         (("--shrink", "often"), "--shrink must be a number"),
                         (("--conflicts", "maybe"), "--conflicts must be one of"),
                         (("--shrink", "auto", "--mode", "static"), "needs --mode recast")]:
        result = invoke("solve-w", "--gains", plain, "--lambda", "1,1,2", "--out", tmp_path / "x.safetensors", *args)
        assert result.exit_code == 2 and needle in result.stderr, (args, result.stderr)
        assert not (tmp_path / "x.safetensors").exists()
    with_draws = table_with_draws(tmp_path / "g.parquet", np.stack([point_gain()] * 4))
    result = invoke("solve-w", "--gains", with_draws, "--lambda", "1,1,2", "--out", tmp_path / "x.safetensors",
                    "--bootstrap", "5")
    assert result.exit_code == 2 and "holds 4 draws" in result.stderr
    W, _ = solved(tmp_path, with_draws, "--bootstrap", "0", name="off.safetensors")
    assert "bootstrap" not in W.info


# ------------------------------------------------------------------ E12u: rows shrunk by their spread


def test_uncertainty_shrunk_w_keeps_the_marginals_and_shrinks_the_noisier_row_more(tmp_path):
    rng = np.random.default_rng(3)
    noise = np.array([0.0, 0.0, 2.0])[None, :, None]  # only reward c's draws are noisy
    draws = point_gain()[None] * np.exp(noise * rng.standard_normal((60, 3, T)))
    gains = table_with_draws(tmp_path / "g.parquet", draws)
    W, result = solved(tmp_path, gains, "--shrink", "auto")
    plain, _ = solved(tmp_path, gains, name="plain.safetensors")
    gamma = W.info["variant"]["gamma"]
    # rows are coupled through the columns, so a quiet row moves with the noisy ones: c is shrunk most
    assert W.info["variant"]["tag"] == "E12u" and gamma["c"] < min(gamma["a"], gamma["b"]) < 1
    lam_hat = np.array([1, 1, 2]) / 4
    np.testing.assert_allclose(W.W.sum(axis=1), lam_hat, atol=1e-9)
    np.testing.assert_allclose(W.W.sum(axis=0), 1 / T, atol=1e-9)
    static = static_weights(np.array([1.0, 1.0, 2.0]), T)
    assert np.all(row_tv(W.W, static) <= row_tv(plain.W, static) + 1e-9)  # pulled toward static, every row
    assert "E12u" in result.stdout


# ------------------------------------------------------------------ E14: conflicts, E12c


def conflict_scores(path: Path, P: int = 4, N: int = 64, K: int = 4, seed: int = 0) -> Path:
    """A π^old-sampling scores table where rewards a and b anti-correlate within each group at steps 3–5 and c is
    independent of both (and of everything) at every step."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((P, N, T + 1, K, 3))
    shared = rng.standard_normal((P, N, 3, K))
    scores[:, :, 3:6, :, 0] += 2 * shared
    scores[:, :, 3:6, :, 1] -= 2 * shared
    scores[:, :, 0, 1:] = np.nan  # t = 0: the sample itself, k = 0 only
    meta = {"run_id": "synthetic", "rewards": list(REWARDS), "T": T, "N": N, "K": K, "P": P,
            "sigmas": np.linspace(0, 1, T + 1).tolist(), "sampling": "pold", "crn": True, "rollout_noise": 1.414,
            "guidance_scale": None, "policy": {"name": "synthetic"}, "positives": {}, "seed": 0,
            "grid": {"kind": "linear"}, "positive_sets": 1}
    write_scores(path, ScoreTable(prompt_ids=tuple(range(P)), prompts=tuple(f"p{i}" for i in range(P)),
                                  rewards=REWARDS, scores=scores, meta=meta), config={"test": True})
    return path


def test_a_constructed_conflicting_pair_is_flagged_and_an_independent_one_is_not(tmp_path):
    scores = conflict_scores(tmp_path / "s.scores.parquet")
    gains = tmp_path / "g.parquet"
    run_ok("estimate", "--from-scores", scores, "--out", gains, "--bootstrap", "20")
    corr = read_gains(gains).meta["advantage_corr"]
    assert corr["pairs"] == [["a", "b"], ["a", "c"], ["b", "c"]] and corr["n"] == 4 * 64
    rho = np.array(corr["rho"], dtype=float)
    assert np.all(rho[0, 2:5] < -0.5) and np.all(np.abs(np.delete(rho[0], [2, 3, 4])) < 0.15)
    assert np.all(np.abs(rho[1:]) < 0.15)
    summary = json.loads(run_ok("inspect", gains, "--json").stdout)
    assert summary["conflicts"] == [{"pair": ["a", "b"], "steps": [3, 4, 5], "rho_min": pytest.approx(rho[0, 2:5].min())}]
    assert "a–b at steps 3–5" in " ".join(run_ok("inspect", gains).stdout.split())
    W, result = solved(tmp_path, gains, "--conflicts", "static")
    assert W.info["conflicts"][0]["pair"] == ["a", "b"] and W.info["conflicts"][0]["steps"] == [3, 4, 5]
    assert W.info["variant"] == {"name": "conflict-aware", "tag": "E12c", "static_steps": [3, 4, 5]}
    static = static_weights(np.array([1.0, 1.0, 2.0]), T)
    np.testing.assert_allclose(W.W[:, 2:5], static[:, 2:5], atol=1e-15)
    np.testing.assert_allclose(W.W.sum(axis=1), np.array([1, 1, 2]) / 4, atol=1e-9)
    np.testing.assert_allclose(W.W.sum(axis=0), 1 / T, atol=1e-9)
    assert "a and b at steps 3–5" in " ".join(result.stdout.split())


def test_conflicts_from_another_table_and_unpaired_rollouts(tmp_path):
    """A π⁺ estimate with a positive set per reward cannot pair its rewards: no E14; --conflicts-from reads them
    from a π^old-sampling table of the same rewards."""
    scores = conflict_scores(tmp_path / "s.scores.parquet")
    paired = tmp_path / "paired.parquet"
    run_ok("estimate", "--from-scores", scores, "--out", paired, "--bootstrap", "0")
    unpaired = tmp_path / "unpaired.parquet"
    table = read_gains(paired)
    write_gains(unpaired, replace(table, meta={**table.meta, "advantage_corr": None}), config={"test": True})
    result = invoke("solve-w", "--gains", unpaired, "--lambda", "1,1,2", "--out", tmp_path / "x.safetensors",
                    "--conflicts", "static")
    assert result.exit_code == 2 and "--conflicts-from" in result.stderr
    W, _ = solved(tmp_path, unpaired, "--conflicts", "static", "--conflicts-from", paired)
    assert W.info["variant"]["static_steps"] == [3, 4, 5]
    assert [Path(str(s.path)).name for s in W.provenance.sources] == ["unpaired.parquet", "paired.parquet"]


def test_no_conflict_leaves_e12_as_it_is(tmp_path):
    scores = conflict_scores(tmp_path / "s.scores.parquet")
    from recast_cli.artifacts import read_scores
    table = read_scores(scores)
    clean = table.scores.copy()
    rng = np.random.default_rng(9)
    clean[:, :, 1:] = rng.standard_normal(clean[:, :, 1:].shape)
    write_scores(tmp_path / "c.scores.parquet", replace(table, scores=clean), config={"test": True})
    gains = tmp_path / "c.parquet"
    run_ok("estimate", "--from-scores", tmp_path / "c.scores.parquet", "--out", gains, "--bootstrap", "0")
    W, _ = solved(tmp_path, gains, "--conflicts", "static")
    plain, _ = solved(tmp_path, gains, name="plain.safetensors")
    assert W.info["conflicts"] == [] and W.info["variant"]["static_steps"] == []
    np.testing.assert_allclose(W.W, plain.W, atol=1e-12)


def test_the_fisher_bound_needs_enough_groups():
    assert rho_upper(-0.2, 1000, 2) < 0 < rho_upper(-0.2, 20, 2)


# ------------------------------------------------------------------ training: the series and the warning


def test_the_watch_warns_once_per_pair_where_w_owns_the_column():
    W = np.array([[0.5, 0.1, 0.1], [0.1, 0.5, 0.1], [0.1, 0.1, 0.5]]) / 3  # each reward owns one column
    watch = ConflictWatch(REWARDS, W, [1, 2, 3])
    corr = np.eye(3)
    corr[0, 1] = corr[1, 0] = -0.6
    lines = [line for _ in range(8) for line in watch.update(corr)]
    assert len(lines) == 1 and "rewards a and b conflict at steps 1–2" in lines[0] and "not by λ" in lines[0]
    assert watch.scalars(corr)["conflict/a,b"] == pytest.approx(-0.6)
    flat = ConflictWatch(REWARDS, np.full((3, 3), 1 / 9), [1, 2, 3])  # static: no reward owns a column
    assert not [line for _ in range(8) for line in flat.update(corr)]


def test_advantage_correlation_of_a_batch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4000)
    adv = np.stack([x, -x + 0.01 * rng.standard_normal(4000), rng.standard_normal(4000)], axis=1)
    corr = advantage_correlation(adv)
    assert corr[0, 1] < -0.99 and abs(corr[0, 2]) < 0.05 and np.isnan(advantage_correlation(np.zeros((5, 2)))).all()


# ------------------------------------------------------------------ a study's arms of the variants


def test_study_arms_name_the_variants_and_their_solve_w_flags():
    from recast_cli.errors import BadInput
    from recast_cli.study.makefile import variant_flags
    from recast_cli.study.spec import ArmSpec

    shrink = ArmSpec.parse("recast:power:estimate:shrinkauto")
    conflict = ArmSpec.parse("recast:power:estimate:conflict")
    assert (shrink.variant, shrink.label, variant_flags(shrink)) == ("shrinkauto", "recast-power-estimate-shrinkauto",
                                                                     " --shrink auto")
    assert (conflict.variant, variant_flags(conflict)) == ("conflict", " --conflicts static")
    assert variant_flags(ArmSpec.parse("recast:power:estimate:shrink0.5")) == " --shrink 0.5"
    for text in ("recast:power:exact:shrinkauto", "static:exp:estimate:conflict"):
        with pytest.raises(BadInput, match="variant"):
            ArmSpec.parse(text)
