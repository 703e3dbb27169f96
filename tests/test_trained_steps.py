"""Method fidelity (issue 15): W lives on the trained steps, W agrees with its own metadata,
and the tilt is standardised by the reward's std under π^old — all through the real CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from recast_cli.artifacts import read_gains, read_weights, write_gains
from recast_cli.estimate.gains import estimate_gains, reward_scale
from tests.conftest import bump_gains, make_table
from tests.test_cli import assert_one_line_exit_2, recast

LAMBDA = "1,2,1"
LAM_HAT = np.array([0.25, 0.5, 0.25])


@pytest.fixture
def gains10(tmp_path):
    """Three rewards on T = 10 whose largest gain (the third's) sits in the cleanest step t = 1."""
    path = tmp_path / "g.parquet"
    write_gains(path, make_table(0.05 * bump_gains([8, 5, 1], [1.5, 1.5, 1.0], 10)), config={"test": True})
    return path


def solve(gains, out, *extra):
    result = recast("solve-w", "--gains", gains, "--lambda", LAMBDA, "--out", out, *extra)
    assert result.exit_code == 0, result.stderr
    return read_weights(out), result


@pytest.mark.parametrize("mode", ["recast", "nosink", "static"])
@pytest.mark.parametrize("skip", [0, 1, 3])
def test_skip_clean_spends_each_budget_on_the_trained_steps_only(gains10, tmp_path, mode, skip):
    w, result = solve(gains10, tmp_path / "W.safetensors", "--mode", mode, "--skip-clean", str(skip))
    assert w.trained_steps == tuple(range(skip + 1, 11)) and w.skip_clean == skip
    assert np.all(w.W[:, :skip] == 0.0)
    # the weight each reward receives over the trained steps is exactly its budget λ̂
    np.testing.assert_allclose(w.W[:, skip:].sum(axis=1), LAM_HAT, atol=1e-10)
    if mode in ("recast", "static"):
        np.testing.assert_allclose(w.W[:, skip:].sum(axis=0), 1 / (10 - skip), atol=1e-10)
    assert np.all(w.W[:, skip:] > 0)
    if skip:
        assert f"trained steps {skip + 1}…10" in result.stdout


def test_without_skip_clean_a_skipping_trainer_would_lose_the_weight_of_step_one(gains10, tmp_path):
    """The bias issue 15 fixes: W solved over all T but trained on t = 2…T under-spends a reward
    whose gain peaks at t = 1, while static loses the same share of every reward."""
    full, _ = solve(gains10, tmp_path / "full.safetensors")
    skipped, _ = solve(gains10, tmp_path / "skip.safetensors", "--skip-clean", "1")
    received_full = full.W[:, 1:].sum(axis=1) / LAM_HAT  # share of λ̂ left on the trained steps
    assert received_full[2] < received_full[0] - 0.05  # the clean-peaked reward is short-changed
    np.testing.assert_allclose(skipped.W[:, 1:].sum(axis=1) / LAM_HAT, 1.0, atol=1e-10)
    # the solve over trained columns uses only their gains: the same as solving the sub-table
    sub = tmp_path / "sub.parquet"
    write_gains(sub, make_table(0.05 * bump_gains([8, 5, 1], [1.5, 1.5, 1.0], 10)[:, 1:]), config={})
    from recast_cli.solve.sinkhorn import solve_weights

    direct = solve_weights(read_gains(gains10).gain[:, 1:], np.array([1.0, 2.0, 1.0]))
    np.testing.assert_allclose(skipped.W[:, 1:], direct.W, atol=1e-12)


@pytest.mark.parametrize("flags, needle", [
    (["--skip-clean", "-1"], "--skip-clean must be an integer from 0 to 9999"),
    (["--skip-clean", "10"], "--skip-clean 10 leaves no trained step on a T = 10 grid (use 0 … 9)"),
    (["--skip-clean", "4", "--steps", "4"], "--skip-clean 4 leaves no trained step on a T = 4 grid"),
])
def test_bad_skip_clean_is_one_line_and_exit_2(gains10, tmp_path, flags, needle):
    out = tmp_path / "W.safetensors"
    assert_one_line_exit_2(recast("solve-w", "--gains", gains10, "--lambda", LAMBDA, "--out", out, *flags), needle)
    assert not out.exists()


def test_inspect_shows_the_trained_steps(gains10, tmp_path, monkeypatch):
    out = tmp_path / "W.safetensors"
    solve(gains10, out, "--skip-clean", "2")
    summary = json.loads(recast("inspect", out, "--json").stdout)
    assert summary["trained_steps"] == list(range(3, 11))
    from tests.test_cli import runner
    from recast_cli.cli import app

    from recast_cli.inspect import commands

    monkeypatch.setattr(commands.out, "width", 200)  # the console is made at import: COLUMNS set now is too late
    shown = runner.invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0 and "t = 3…10: 8 of T = 10 steps" in shown.stdout and "--skip-clean 2" in shown.stdout


# ------------------------------------------------------------------ W must agree with its metadata


def _rewrite(path, out, scale: float = 1.0, **meta_changes):
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as fh:
        meta = dict(fh.metadata())
    tensors = load_file(str(path))
    tensors["W"] = tensors["W"] * scale
    meta.update({k: json.dumps(v) for k, v in meta_changes.items()})
    save_file(tensors, str(out), metadata=meta)
    return out


@pytest.mark.parametrize("case, changes, needle", [
    ("scaled x1000", {"scale": 1000.0}, "the rows of W sum to"),
    ("relabelled lambda", {"lambda": [1.0, 1.0, 1.0]}, "not to the recorded λ̂ = [0.333333"),
    ("another mode's columns", {"scale": 1.0, "lambda": [1.0, 2.0, 1.0], "trained_steps": [1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                                                           10]},
     "which its metadata says are not trained"),
    ("trained steps out of range", {"trained_steps": [0, 1]}, "'trained_steps' must list distinct steps"),
])
def test_a_W_that_disagrees_with_its_metadata_is_refused(gains10, tmp_path, case, changes, needle):
    src = tmp_path / "W.safetensors"
    solve(gains10, src, "--skip-clean", "1")
    scale = changes.pop("scale", 1.0)
    if case == "another mode's columns":  # weight on t = 1 while the file says it is untrained
        changes = {"trained_steps": list(range(2, 11))}
        from safetensors import safe_open

        tensors = load_file(str(src))
        with safe_open(str(src), framework="numpy") as fh:
            meta = dict(fh.metadata())
        W = tensors["W"]
        W[:, 0], W[:, 1] = W[:, 1] / 2, W[:, 1] / 2
        meta["trained_steps"] = json.dumps(changes["trained_steps"])
        bad = tmp_path / "bad.safetensors"
        save_file({"W": W, "gain": tensors["gain"]}, str(bad), metadata=meta)
    else:
        bad = _rewrite(src, tmp_path / "bad.safetensors", scale, **changes)
    assert_one_line_exit_2(recast("inspect", bad), needle)


def test_a_recast_W_whose_columns_are_unbalanced_is_refused(gains10, tmp_path):
    src = tmp_path / "W.safetensors"
    w, _ = solve(gains10, src)
    tensors = load_file(str(src))
    W = tensors["W"]
    eps = 0.5 * W.min()  # small enough to keep every entry positive
    W[0, 3] += eps  # keep reward 0's row sum: take the same amount from its step 5
    W[0, 4] -= eps
    W[1, 3] -= eps  # ... and keep column 4's sum and reward 1's row by moving that to its step 6
    W[1, 5] += eps
    from safetensors import safe_open

    with safe_open(str(src), framework="numpy") as fh:
        meta = dict(fh.metadata())
    save_file({"W": W, "gain": tensors["gain"]}, str(tmp_path / "bad.safetensors"), metadata=meta)
    assert_one_line_exit_2(recast("inspect", tmp_path / "bad.safetensors"), "needs every trained column of W")
    # the same tensor in nosink mode (rows only) is a valid file
    meta["mode"] = "nosink"
    save_file({"W": W, "gain": tensors["gain"]}, str(tmp_path / "nosink.safetensors"), metadata=meta)
    assert read_weights(tmp_path / "nosink.safetensors").mode == "nosink"


# ------------------------------------------------------------------ the tilt standardised under π^old


def test_reward_scale_is_the_std_of_the_draws_from_pure_noise():
    """Rollouts from π⁺-started states (t < T) spread differently from π^old: only t = T counts."""
    rng = np.random.default_rng(0)
    P, N, T, K, m = 3, 8, 5, 4, 2
    scores = rng.normal(0.0, 5.0, (P, N, T + 1, K, m))  # a wide mixture at t < T
    scores[:, :, -1] = rng.normal(0.0, 0.5, (P, N, K, m))  # π^old draws
    scale = reward_scale(scores, True)
    np.testing.assert_allclose(scale, scores[:, :, -1].reshape(P, -1, m).std(axis=1))
    assert np.all(scale < 1.0)
    assert np.all(reward_scale(scores, False) == 1.0)
    given = np.full((P, m), 2.0)
    assert np.all(estimate_gains(scores, ("a", "b"), scale=given, bootstrap=0).reward_scale == 2.0)
    assert np.all(estimate_gains(scores, ("a", "b"), scale=given, standardise=False, bootstrap=0).reward_scale == 1.0)


def test_gmm1d_standardised_gain_table_records_its_scale_and_source(tmp_path):
    out = tmp_path / "g.parquet"
    result = recast("estimate", "--policy", "gmm1d", "--rewards", "coarse,fine", "--n", "64", "--k", "2",
                    "--steps", "6", "--p", "2", "--standardise", "--out", out)
    assert result.exit_code == 0, result.stderr
    table = read_gains(out)
    assert table.meta["standardise"] is True
    assert table.meta["reward_std_source"] == "pold rollouts from pure noise (t = T)"
    from recast_cli.artifacts import read_scores

    scores = read_scores(tmp_path / "g.scores.parquet").scores
    expected = scores[:, :, -1].reshape(scores.shape[0], -1, scores.shape[-1]).std(axis=1)
    per_prompt = table.meta["reward_std_per_prompt"]
    np.testing.assert_allclose([[per_prompt[k][r] for r in ("coarse", "fine")] for k in sorted(per_prompt, key=int)],
                               expected)
    raw = tmp_path / "raw.parquet"
    assert recast("estimate", "--from-scores", tmp_path / "g.scores.parquet", "--raw", "--out", raw).exit_code == 0
    assert read_gains(raw).meta["reward_std_source"] == "none (raw rewards)"


# ------------------------------------------------------------------ the timing control


@pytest.mark.parametrize("skip", [0, 2])
def test_reversed_is_recast_with_its_trained_columns_mirrored(gains10, tmp_path, skip):
    ours, _ = solve(gains10, tmp_path / "recast.safetensors", "--skip-clean", str(skip))
    rev, result = solve(gains10, tmp_path / "reversed.safetensors", "--mode", "reversed", "--skip-clean", str(skip))
    assert rev.mode == "reversed" and "Sinkhorn:" in result.stdout
    assert rev.trained_steps == ours.trained_steps
    np.testing.assert_array_equal(rev.W[:, skip:], ours.W[:, skip:][:, ::-1])
    assert np.all(rev.W[:, :skip] == 0)
    # same marginals and the same multiset of entries, but each reward's peak weight moves
    np.testing.assert_allclose(rev.W.sum(axis=1), ours.W.sum(axis=1), atol=1e-12)
    np.testing.assert_allclose(np.sort(rev.W, axis=None), np.sort(ours.W, axis=None))
    assert not np.array_equal(rev.W.argmax(axis=1), ours.W.argmax(axis=1))
    summary = json.loads(recast("inspect", tmp_path / "reversed.safetensors", "--json").stdout)
    assert summary["mode"] == "reversed"
