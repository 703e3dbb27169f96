"""The stall detector (``train/stall``, docs/train.md "Stalled rewards"): the array form on constructed
curves, the online form equal to it bit for bit, its ``[train]`` keys, and through the CLI a flow1d run
built to lose a reward (flagged: one warning line, the ``stall`` column, ``inspect``, ``report``) beside a
healthy run (not flagged), a run with the detector off, and a resumed run that goes on as the straight one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.errors import BadInput
from recast_cli.setting.load import load_setting
from recast_cli.train.config import STALL_KEYS, TrainConfig, apply_overrides, check_config, config_from_setting
from recast_cli.train.metrics import MetricsLog
from recast_cli.train.stall import (
    DEFAULT_SMOOTHING,
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    StallRule,
    StallWatch,
    group_spread,
    initial_scale,
    progress,
    recorded_stalls,
    smoothed,
    stall_flags,
    stall_onsets,
)

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()


def curves(*columns) -> np.ndarray:
    """Rewards' means per step as [steps, m] from one sequence per reward."""
    return np.stack([np.asarray(c, dtype=np.float64) for c in columns], axis=1)


RISING = np.linspace(0.0, 1.0, 20)
FLAT = np.full(20, 0.5)
ONES = np.ones(2)


# --------------------------------------------------------------------------- the array form


def test_a_flat_reward_beside_a_rising_one_stalls_from_the_first_full_window():
    flags = stall_flags(curves(RISING, FLAT), ONES, window=5, threshold=0.1, smoothing=1)
    assert not flags[:, 0].any()  # the rising reward never
    assert not flags[:5].any() and flags[5:, 1].all()  # undefined before a whole window, then stalled throughout
    onsets = stall_onsets(curves(RISING, FLAT), ONES, window=5, threshold=0.1, smoothing=1)
    assert np.argwhere(onsets).tolist() == [[5, 1]]  # one onset: the one warning


def test_nothing_stalls_when_both_rise_when_neither_does_or_for_a_single_reward():
    for pair in (curves(RISING, RISING * 0.5), curves(FLAT, FLAT), curves(RISING)):
        assert not stall_flags(pair, np.ones(pair.shape[1]), window=5, threshold=0.1, smoothing=1).any()


def test_the_threshold_is_in_units_of_each_rewards_own_scale():
    slow = np.linspace(0.0, 0.19, 20)  # 0.05 per window of 5
    pair = curves(RISING, slow)
    assert stall_flags(pair, np.array([1.0, 1.0]), window=5, threshold=0.1, smoothing=1)[10:, 1].all()  # 0.05 ≤ 0.1
    assert not stall_flags(pair, np.array([1.0, 0.1]), window=5, threshold=0.1, smoothing=1).any()  # 0.05 > 0.01


def test_a_stall_lasts_until_the_reward_rises_again_and_a_second_stall_warns_again():
    late = np.concatenate([np.full(10, 0.0), np.linspace(0.0, 1.0, 6)[1:], np.full(10, 1.0)])
    first = np.linspace(0.0, 1.0, 25)
    flags = stall_flags(curves(first, late), ONES, window=4, threshold=0.1, smoothing=1)
    assert flags[4:10, 1].all() and not flags[10:15, 1].any()  # stalled, then rising
    assert not flags[17, 1] and flags[18:, 1].all()  # flat again (a whole window) while the first still rises
    onsets = stall_onsets(curves(first, late), ONES, window=4, threshold=0.1, smoothing=1)
    assert np.nonzero(onsets[:, 1])[0].tolist() == [4, 18]
    # the other reward stops rising: the stall condition goes, the stall stays until the reward rises
    stops = np.concatenate([np.linspace(0.0, 1.0, 8), np.ones(12)])
    held = stall_flags(curves(stops, FLAT), ONES, window=4, threshold=0.1, smoothing=1)
    bare = stall_flags(curves(stops, FLAT), ONES, window=4, threshold=0.1, smoothing=1, hold=False)
    assert held[4:, 1].all() and bare[4:11, 1].all() and not bare[12:, 1].any()


def test_a_saturated_reward_has_no_headroom_and_is_not_stalled():
    done = np.concatenate([np.linspace(0.5, 1.0, 5), np.ones(15)])
    spreads = curves(np.full(20, 0.5), np.concatenate([np.full(5, 0.5), np.zeros(15)]))
    pair = curves(RISING, done)
    assert stall_flags(pair, ONES * 0.5, window=5, threshold=0.1, smoothing=1)[12:, 1].all()  # without spreads
    assert not stall_flags(pair, ONES * 0.5, window=5, threshold=0.1, smoothing=1, spreads=spreads).any()


def test_smoothing_is_an_exponential_average_that_skips_missing_steps():
    x = curves([1.0, np.nan, 4.0, 4.0])
    alpha = 2 / (3 + 1)
    s = smoothed(x, 3)[:, 0]
    assert s[0] == s[1] == 1.0 and s[2] == pytest.approx(1 + alpha * 3) and s[3] == pytest.approx(s[2] + alpha * (4 - s[2]))
    np.testing.assert_array_equal(smoothed(x, 1)[[0, 2, 3], 0], [1.0, 4.0, 4.0])
    p = progress(curves(RISING), 5, 1)[:, 0]
    assert np.isnan(p[:5]).all() and p[5:] == pytest.approx(RISING[5:] - RISING[:-5])


def test_the_leading_axes_are_seeds_each_with_its_own_scale():
    rng = np.random.default_rng(1)
    means = rng.normal(size=(3, 2, 30, 3)).cumsum(axis=2)
    scale = rng.uniform(0.5, 2.0, size=(3, 2, 3))
    flags = stall_flags(means, scale)
    for idx in np.ndindex(3, 2):
        np.testing.assert_array_equal(flags[idx], stall_flags(means[idx], scale[idx]))


def test_the_group_spread_pools_within_group_variances_and_the_scale_their_first_steps():
    rewards = np.array([[0.0, 1.0], [1.0, 1.0], [0.0, 3.0], [4.0, 5.0]])  # 2 groups of G = 2
    np.testing.assert_allclose(group_spread(rewards, 2), np.sqrt([(0.25 + 4.0) / 2, (0.0 + 1.0) / 2]))
    spreads = curves([3.0, np.nan, 4.0, 100.0], [np.nan, np.nan, np.nan, 1.0])
    scale = initial_scale(spreads, 3)
    assert scale[0] == pytest.approx(np.sqrt((9 + 16) / 2)) and np.isnan(scale[1])


# --------------------------------------------------------------------------- the online form


@pytest.mark.parametrize("seed", range(6))
def test_the_online_watch_gives_the_array_forms_flags_and_onsets_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    steps, m = 40, int(rng.integers(2, 5))
    rule = StallRule(window=int(rng.integers(1, 12)), threshold=float(rng.uniform(0, 0.5)),
                     smoothing=int(rng.integers(1, 8)))
    drift = rng.uniform(-0.02, 0.06, size=m)
    means = 0.03 * rng.normal(size=(steps, m)).cumsum(axis=0) + drift * np.arange(steps)[:, None]
    spreads = np.abs(rng.normal(0.5, 0.2, size=(steps, m)))
    spreads[rng.uniform(size=spreads.shape) < 0.05] = np.nan
    watch = StallWatch([f"r{i}" for i in range(m)], rule)
    online = [watch.update(means[t], spreads[t]) for t in range(steps)]
    scale = initial_scale(spreads, rule.window)
    args = (means, scale, rule.window, rule.threshold, rule.smoothing, spreads)
    assert stall_flags(*args).any()  # the curves do stall somewhere
    np.testing.assert_array_equal(np.stack([r.flags for r in online]), stall_flags(*args))
    np.testing.assert_array_equal(np.stack([r.onsets for r in online]), stall_onsets(*args))
    np.testing.assert_array_equal(np.stack([r.progress for r in online]), progress(means, rule.window, rule.smoothing))
    assert np.array_equal(watch.scale, scale, equal_nan=True)


def test_the_metrics_log_replays_its_rows_on_resume_and_goes_on_as_the_straight_log(tmp_path):
    rule = StallRule(window=3, threshold=0.1, smoothing=2)
    scalars = {"aggregate": 0.0, "loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 1.0,
               "lr": 1e-3, "images": 4, "sample_s": 1.0, "update_s": 1.0}

    def per_reward(step: int) -> dict:
        return {"a": {"reward_mean": 0.1 * step, "reward_std": 0.5, "reward_group_std": 0.5, "adv_abs": [0.0]},
                "b": {"reward_mean": 0.0, "reward_std": 0.5, "reward_group_std": 0.5, "adv_abs": [0.0]}}

    straight = MetricsLog(tmp_path, {}, stall=StallWatch(("a", "b"), rule))
    said = {step: straight.add(step, per_reward(step), scalars, [0.0]) for step in range(1, 9)}
    assert [step for step, lines in said.items() if lines] == [4]
    assert said[4] == [said[4][0]] and said[4][0].startswith("reward b stalled at step 4: ")
    straight.rows = [r for r in straight.rows if r["step"] <= 5]
    straight.write()
    resumed = MetricsLog(tmp_path, {}, stall=StallWatch(("a", "b"), rule))
    resumed.resume(5)
    assert all(resumed.add(step, per_reward(step), scalars, [0.0]) == [] for step in range(6, 9))  # no second warning
    assert [r["stall"] for r in resumed.rows if r["reward"] == "b"] == [False] * 3 + [True] * 5


# --------------------------------------------------------------------------- the [train] keys


def test_the_stall_keys_default_on_parse_and_stay_out_of_the_run_key():
    cfg = TrainConfig(rewards=("a", "b"), lam=(1.0, 1.0))
    assert cfg.stall_rule() == StallRule(DEFAULT_WINDOW, DEFAULT_THRESHOLD, DEFAULT_SMOOTHING)
    changed = apply_overrides(cfg, ["stall_window=4", "stall_threshold=0.5", "stall_smoothing=1",
                                    "stall_detector=false"], {})
    assert (changed.stall_window, changed.stall_threshold, changed.stall_smoothing) == (4, 0.5, 1)
    assert changed.stall_rule() is None and changed.run_key() == cfg.run_key()
    assert all(f"\n{key} = " in cfg.to_toml() for key in STALL_KEYS)


@pytest.mark.parametrize("pair, needle", [("stall_window=0", "stall_window"), ("stall_smoothing=1.5", "stall_smoothing"),
                                          ("stall_detector=1", "stall_detector"), ("stall_threshold=nan", "finite")])
def test_a_bad_stall_key_is_one_line(pair, needle):
    with pytest.raises(BadInput) as error:
        apply_overrides(TrainConfig(rewards=("a", "b"), lam=(1.0, 1.0)), [pair], {})
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_a_negative_threshold_is_refused_by_the_check():
    cfg = apply_overrides(TrainConfig(rewards=("a", "b"), lam=(1.0, 1.0), prompts="toy"), ["stall_threshold=-1"], {})
    with pytest.raises(BadInput, match="stall_threshold must be >= 0"):
        check_config(cfg)


# --------------------------------------------------------------------------- through the CLI: a flow1d world


#: The dose-response study's m = 3 ladder world (frozen by its pre-registration), trained on sign and comb with
#: comb given (almost) no weight in W: it cannot move while sign rises.
SETTING = Path(__file__).resolve().parents[2] / "pipelines" / "dose" / "m3.toml"
LOSES_COMB = ("--set", 'rewards=["sign","comb"]', "--lambda", "1,0.001", "--set", "learning_rate=0.04",
              "--set", "logger=[]", "--max-steps", "16")
STALL_STEP = 11  # the first step with a whole window (10) of progress


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def train(out: Path, *extra):
    result = invoke("train", "--setting", SETTING, "--weights", "static", "--out", out, "--device", "cpu", "--quiet",
                    *LOSES_COMB, *extra)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def warnings(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if "warning" in line]


def flags(run: Path) -> pd.DataFrame:
    return pd.read_parquet(run / "metrics.parquet").pivot(index="step", columns="reward", values="stall")


@pytest.fixture(scope="module")
def lost(tmp_path_factory):
    out = tmp_path_factory.mktemp("lost") / "run"
    return out, train(out)


def test_a_run_that_loses_a_reward_warns_once_and_records_the_stall(lost):
    run, result = lost
    (line,) = warnings(result)
    assert line.startswith(f"recast: warning: reward comb stalled at step {STALL_STEP}: ") and "while sign rose +" in line
    table = flags(run)
    assert not table["sign"].any()
    assert not table["comb"].loc[:STALL_STEP - 1].any() and table["comb"].loc[STALL_STEP:].all()
    metrics = pd.read_parquet(run / "metrics.parquet")
    assert metrics["reward_group_std"].between(0.3, 0.5).loc[metrics["step"] == 1].all()  # 0/1 rewards near p = ½


def test_inspect_shows_each_rewards_progress_and_the_stall(lost):
    run, _ = lost
    result = invoke("inspect", run, "--json")
    assert result.exit_code == 0, result.stderr
    rows = {r["reward"]: r for r in json.loads(result.stdout)["metrics"]["rewards"]}
    comb, sign = rows["comb"], rows["sign"]
    assert (comb["stalled"], comb["stalled_since"], comb["first_stalled_step"]) == (True, STALL_STEP, STALL_STEP)
    assert comb["stalled_steps"] == 16 - STALL_STEP + 1 and abs(comb["progress"]) < 0.1
    assert (sign["stalled"], sign["stalled_steps"], sign["first_stalled_step"]) == (False, 0, None)
    assert sign["first"] < 0.6 and sign["last"] > 0.9 and sign["max"] >= sign["last"]
    text = invoke("inspect", run).stdout
    assert f"comb stalled since step {STALL_STEP}" in text
    assert "progress" in text and "stalled" in text and "over the last 10 steps" in text


def test_a_healthy_run_is_not_flagged(tmp_path):
    run = tmp_path / "run"
    result = train(run, "--set", 'rewards=["sign","upper"]', "--lambda", "1,1")
    assert warnings(result) == []
    table = flags(run)
    assert table.notna().all().all() and not table.any().any()
    rows = json.loads(invoke("inspect", run, "--json").stdout)["metrics"]["rewards"]
    assert [(r["stalled"], r["stalled_steps"]) for r in rows] == [(False, 0), (False, 0)]


def test_with_the_detector_off_nothing_is_said_and_the_run_is_the_same_bit_for_bit(lost, tmp_path):
    run = tmp_path / "off"
    result = train(run, "--set", "stall_detector=false", "--max-steps", "12")
    assert warnings(result) == [] and flags(run).isna().all().all()
    rows = json.loads(invoke("inspect", run, "--json").stdout)["metrics"]["rewards"]
    assert [r["stalled"] for r in rows] == [None, None]
    watched = pd.read_parquet(lost[0] / "metrics.parquet")
    off = pd.read_parquet(run / "metrics.parquet")
    same = [c for c in off.columns if c not in ("stall", "sample_s", "update_s")]
    pd.testing.assert_frame_equal(off[same], watched.loc[watched["step"] <= 12, same])
    checkpoint = Path("checkpoints", "step-000012")
    for name in ("adapter/diffusion_pytorch_model.safetensors", "state.safetensors"):
        ours, theirs = load_file(run / checkpoint / name), load_file(lost[0] / checkpoint / name)
        kept = sorted(k for k in theirs if not k.startswith("rng/"))  # the tensors trained, the AdamW moments
        assert len(kept) > 4 and sorted(k for k in ours if not k.startswith("rng/")) == kept
        assert all(np.array_equal(ours[k], theirs[k]) for k in kept), name


def test_the_report_of_runs_lists_each_runs_stalls_and_counts_them_per_arm(lost, tmp_path):
    other = tmp_path / "seed1"
    train(other, "--set", "stall_detector=false", "--max-steps", "2", "--seed", "1")
    out = tmp_path / "report"
    result = invoke("report", lost[0], other, "--out", out)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    text = (out / "report.md").read_text()
    assert "## Stalled rewards in training" in text
    assert f"comb from step {STALL_STEP} ({16 - STALL_STEP + 1} steps, stalled since step {STALL_STEP} at the end)" in text
    assert "| not recorded |" in text  # the run that did not watch
    assert "| static | (1,0.001) | 1 | 1 of 1 | 1 of 1 | 0 of 1 | 1 of 1 |" in text


def test_a_resumed_run_records_the_same_stall_and_does_not_warn_again(lost, tmp_path):
    run = tmp_path / "run"
    first = train(run, "--max-steps", "12")
    assert len(warnings(first)) == 1
    again = train(run, "--resume")
    assert warnings(again) == []
    straight = pd.read_parquet(lost[0] / "metrics.parquet")
    resumed = pd.read_parquet(run / "metrics.parquet")
    for column in ("step", "reward", "reward_mean", "reward_group_std", "stall"):
        assert resumed[column].tolist() == straight[column].tolist(), column


def test_the_setting_keys_parse_from_a_train_table(tmp_path):
    def parsed(keys: str) -> TrainConfig:
        path = tmp_path / "s.toml"
        path.write_text(f'[policy]\nkind = "flow1d"\n\n[train]\nrewards = ["coarse", "fine"]\nlambda = [1, 1]\n{keys}')
        return config_from_setting(load_setting(str(path)))

    cfg = parsed("stall_window = 6\nstall_smoothing = 2\nstall_detector = false\nstall_threshold = 0\n")
    assert (cfg.stall_window, cfg.stall_smoothing, cfg.stall_detector, cfg.stall_threshold) == (6, 2, False, 0.0)
    with pytest.raises(BadInput, match=r"\[train\] stall_window"):
        parsed("stall_window = 0\n")


def test_recorded_stalls_read_the_columns_in_any_row_order():
    columns = {"step": [2, 1, 3, 1, 2, 3], "reward": ["a", "a", "a", "b", "b", "b"],
               "stall": [True, False, True, False, False, False]}
    spans = recorded_stalls(columns)
    assert (spans["a"].first, spans["a"].steps, spans["a"].since) == (2, 2, 2)
    assert (spans["b"].first, spans["b"].steps, spans["b"].since) == (None, 0, None)
    assert recorded_stalls({**columns, "stall": [None] * 6}) is None and recorded_stalls({"step": []}) is None
