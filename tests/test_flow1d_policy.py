"""``flow1d``: the trainable analytic world — exact at step 0, E1 log-probs, trainable through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import kstest
from typer.testing import CliRunner

from recast_cli.artifacts import read_weights
from recast_cli.cli import app
from recast_cli.policy.flow1d import Flow1DPolicy
from recast_cli.policy.gmm1d import GMM1DPolicy
from recast_cli.policy.sde import sde_step
from recast_cli.policy.world1d import DEFAULT_WORLD
from recast_cli.rewards import build_scorer
from recast_cli.train.params import Parameters

runner = CliRunner()
N = 4096


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def pair():
    return Flow1DPolicy(25), GMM1DPolicy(25, exact_rollouts=False)


def test_at_step_zero_the_policy_is_the_exact_gmm1d_sampler(pair):
    flow, exact = pair
    seeds = torch.arange(N)
    cond = flow.encode_prompts(["x"] * N)
    a, b = flow.sample(cond, 0.7, seeds), exact.sample(cond, 0.7, seeds)
    assert torch.equal(a.states, b.states) and torch.equal(a.log_probs, b.log_probs)
    x = torch.linspace(-3, 3, 61, dtype=torch.float64).view(-1, 1)
    for sigma in (0.04, 0.5, 1.0):
        s = torch.full((61,), sigma, dtype=torch.float64)
        assert torch.equal(flow.velocity(x, s, cond.take(torch.arange(61))), exact.velocity(x, s, None))
    # and the sampler draws π^old up to the T = 25 discretisation (a wrong velocity is far off)
    x0 = flow.sample(flow.encode_prompts(["x"] * 20_000), 0.7, torch.arange(20_000)).states[:, -1, 0].numpy()
    assert kstest(x0, DEFAULT_WORLD.old_cdf).statistic < 0.03
    assert abs(build_scorer("coarse").score(torch.from_numpy(x0), ["x"] * len(x0)).mean() - 0.5) < 0.02


def test_log_probs_are_the_sde_steps_and_the_residual_carries_the_gradient(pair):
    flow, _ = pair
    seeds = torch.arange(64)
    cond = flow.encode_prompts(["x"] * 64)
    traj = flow.sample(cond, 0.7, seeds)
    for j, t in enumerate(range(flow.T, 0, -1)):
        x, prev = traj.states[:, j], traj.states[:, j + 1]
        steps = torch.full((64,), t)
        v = flow.velocity(x, flow.sigmas[steps], cond)
        _, _, _, lp = sde_step(x, v, flow.sigmas[steps], flow.sigmas[steps - 1], 0.7, prev_sample=prev)
        torch.testing.assert_close(lp, traj.log_probs[:, j], rtol=0, atol=1e-12)
    # the exact part is constant in θ: the log-prob's gradient reaches the network only
    t = torch.full((64,), 13)
    out = flow.step(traj.states[:, 12], t, cond, 0.7, prev_sample=traj.states[:, 13])
    out.log_prob.sum().backward()
    grads = {n: p.grad for n, p in flow.network.named_parameters()}
    assert grads["out.weight"].abs().max() > 0 and grads["out.bias"].abs().max() > 0
    flow.network.zero_grad(set_to_none=True)


def test_the_reference_of_the_kl_is_the_exact_policy_after_training_moves_theta():
    flow = Flow1DPolicy(10)
    params = Parameters(flow.network, 0, 0.0, (), seed=0, keep_reference=True)
    with torch.no_grad():
        flow.network.out.bias.fill_(0.3)
    x = torch.zeros(3, 1, dtype=torch.float64)
    s = torch.full((3,), 0.5, dtype=torch.float64)
    moved = flow.velocity(x, s, None)
    assert torch.allclose(moved - flow.exact_velocity(x, s, None), torch.full((3, 1), 0.3, dtype=torch.float64))
    with params.reference_policy(flow):
        assert torch.equal(flow.velocity(x, s, None), flow.exact_velocity(x, s, None))
    assert torch.equal(flow.velocity(x, s, None), moved)


def test_two_steps_of_recast_train_on_the_twoscale_setting(tmp_path):
    exact = tmp_path / "exact.parquet"
    result = invoke("estimate", "--policy", "gmm1d", "--rewards", "coarse,fine", "--exact", "--steps", "25",
                    "--out", exact)
    assert result.exit_code == 0, result.stderr
    W = tmp_path / "W.safetensors"
    assert invoke("solve-w", "--gains", exact, "--lambda", "1,2", "--out", W).exit_code == 0
    run = tmp_path / "run"
    result = invoke("train", "--setting", "twoscale", "--weights", W, "--lambda", "1,2", "--out", run,
                    "--max-steps", "2", "--save-every", "1", "--quiet")
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    record = json.loads((run / "run.json").read_text())
    assert record["mode"] == "recast" and record["config"]["trained_steps"] == list(range(25, 0, -1))
    assert read_weights(run / "weights.safetensors").trained_steps == tuple(range(1, 26))
    import pandas as pd

    metrics = pd.read_parquet(run / "metrics.parquet")
    assert sorted(set(metrics["step"])) == [1, 2] and set(metrics["reward"]) == {"coarse", "fine"}
    assert np.all(np.isfinite(metrics["loss"])) and (metrics["images"] == 256).all()
    adapter = run / "checkpoints" / "step-000002" / "adapter" / "diffusion_pytorch_model.safetensors"
    from safetensors.torch import load_file

    trained = load_file(str(adapter))
    assert trained["out.weight"].abs().max() > 0  # two updates moved the zero-initialised output layer
    # resume to 3 steps continues the run
    again = invoke("train", "--setting", "twoscale", "--weights", W, "--lambda", "1,2", "--out", run,
                   "--max-steps", "3", "--resume", "--quiet")
    assert again.exit_code == 0, again.stderr
    assert sorted(set(pd.read_parquet(run / "metrics.parquet")["step"])) == [1, 2, 3]


def test_flow1d_refuses_lora_and_the_rewards_refuse_images(tmp_path):
    result = invoke("train", "--setting", "twoscale", "--weights", "static", "--out", tmp_path / "run",
                    "--set", "lora_rank=4")
    assert result.exit_code == 2 and "set [train] lora_rank = 0" in result.stderr
    assert not (tmp_path / "run").exists()
    from recast_cli.errors import BadInput

    with pytest.raises(BadInput, match="scores 1-D samples"):
        build_scorer("fine").score(torch.zeros(2, 3, 8, 8), ["x", "x"])


def test_estimate_on_the_base_flow1d_policy_finds_the_exact_timescales(tmp_path):
    """At step 0 the sampled estimator (exact π⁺ positives, the policy's own SDE rollouts) puts
    coarse's gain at the noisy end and fine's at the clean end, as the exact table does."""
    from recast_cli.artifacts import read_gains

    exact, sampled = tmp_path / "exact.parquet", tmp_path / "sampled.parquet"
    assert invoke("estimate", "--policy", "gmm1d", "--rewards", "coarse,fine", "--exact", "--steps", "10",
                  "--out", exact).exit_code == 0
    result = invoke("estimate", "--policy", "twoscale", "--rewards", "coarse,fine", "--n", "128", "--k", "1",
                    "--p", "2", "--steps", "10", "--out", sampled)
    assert result.exit_code == 0, result.stderr
    a, b = read_gains(sampled), read_gains(exact)
    assert a.meta["positives"] == {"source": "exact"} and a.meta["standardise"] is False and a.meta["beta"] == 0.5
    assert a.gain.argmax(axis=1).tolist() == b.gain.argmax(axis=1).tolist() == [7, 0]
    for i in range(2):
        assert np.corrcoef(a.gain[i], b.gain[i])[0, 1] > 0.85
        assert abs(a.gain[i].sum() / b.gain[i].sum() - 1) < 0.35


def test_estimate_at_a_flow1d_checkpoint_resamples_the_policys_own_draws(tmp_path):
    run = tmp_path / "run"
    result = invoke("train", "--setting", "twoscale", "--weights", "static", "--out", run, "--max-steps", "1",
                    "--quiet")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "g.parquet"
    result = invoke("estimate", "--policy", run, "--rewards", "coarse,fine", "--n", "8", "--k", "1", "--p", "1",
                    "--steps", "5", "--out", out)
    assert result.exit_code == 0, result.stderr
    from recast_cli.artifacts import read_gains

    meta = read_gains(out).meta
    assert meta["positives"]["source"] == "sir" and meta["policy"]["checkpoint"].endswith("step-000001")
    assert invoke("estimate", "--policy", "twoscale", "--rewards", "toy_color", "--out", tmp_path / "x.parquet"
                  ).exit_code == 2


def test_evaluate_writes_a_curve_of_mean_rewards_per_checkpoint_and_sampler(tmp_path):
    from recast_cli.artifacts import read_curve

    run = tmp_path / "run"
    assert invoke("train", "--setting", "twoscale", "--weights", "static", "--out", run, "--max-steps", "2",
                  "--save-every", "1", "--quiet").exit_code == 0
    base = tmp_path / "base.parquet"
    result = invoke("evaluate", "--setting", "twoscale", "--sampler", "sde", "--n", "4096", "--out", base, "--quiet")
    assert result.exit_code == 0, result.stderr
    b = read_curve(base)
    assert b.points == ((0, "sde"),) and b.scorers == ("coarse", "fine", "aggregate") and b.n == 4096
    assert b.meta["mode"] == "base" and abs(b.value(0, "sde", "coarse") - 0.5) < 0.03
    # the same seeds and the exact policy: the mean is the one a direct computation gives
    flow = Flow1DPolicy(25)
    x0 = flow.sample(flow.encode_prompts(["x"] * 4096), 0.7, torch.arange(4096) + 10000).states[:, -1]
    direct = build_scorer("coarse").score(x0, ["x"] * 4096).mean() + build_scorer("fine").score(x0, ["x"] * 4096).mean()
    assert b.value(0, "sde") == pytest.approx(direct, abs=1e-12)

    curve = tmp_path / "curve.parquet"
    result = invoke("evaluate", "--run", run, "--checkpoints", "all", "--sampler", "sde,ode", "--n", "2048",
                    "--out", curve, "--quiet")
    assert result.exit_code == 0, result.stderr
    c = read_curve(curve)
    assert c.points == ((1, "sde"), (1, "ode"), (2, "sde"), (2, "ode")) and c.meta["mode"] == "static"
    assert [p["step"] for p in c.meta["checkpoints"]] == [1, 2] and c.meta["train_seed"] == 0
    np.testing.assert_allclose(c.mean[:, 2], c.mean[:, 0] + c.mean[:, 1], atol=1e-12)  # λ = (1, 1)
    again = tmp_path / "again.parquet"
    assert invoke("evaluate", "--run", run, "--checkpoint", "2", "--sampler", "ode", "--n", "2048", "--out", again,
                  "--quiet").exit_code == 0
    assert read_curve(again).value(2, "ode") == c.value(2, "ode")  # same seeds, same checkpoint: same numbers
    missing = invoke("evaluate", "--run", run, "--checkpoints", "1,7", "--out", tmp_path / "m.parquet")
    assert missing.exit_code == 2 and "no checkpoint of step 7 (it has 1, 2)" in missing.stderr
    summary = json.loads(invoke("inspect", curve, "--json").stdout)
    assert summary["kind"] == "curve" and len(summary["points"]) == 4


@pytest.mark.parametrize("args, needle", [
    (["--setting", "twoscale", "--checkpoints", "all"], "the base policy is step 0"),
    (["--setting", "twoscale", "--sampler", "euler"], "--sampler must be sde or ode"),
    (["--setting", "twoscale", "--judges", "clip"], "the 1-D world has no judges"),
    (["--setting", "toy", "--sampler", "sde"], "--checkpoints and --sampler apply to the 1-D world"),
])
def test_bad_flow1d_evaluations_are_one_line_and_exit_2(tmp_path, args, needle):
    out = tmp_path / "e.parquet"
    result = invoke("evaluate", *args, "--out", out)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
