"""λ entered once (issue 52): ``solve-w --setting S`` solves for the setting's ``[train] lambda``, by reward
name; ``--lambda`` given too overrides it; W records which; a setting of other rewards, or no budgets at all,
is one line."""

from __future__ import annotations

import json

import numpy as np
from safetensors import safe_open

from recast_cli.artifacts import read_weights, write_gains
from tests.cli_helpers import invoke, one_line, run_ok
from tests.conftest import bump_gains, make_table

SETTING = """[policy]
kind = "gmm1d"

[train]
rewards = ["c", "a", "b"]
lambda = [2, 1, 1]
prompts = "toy"
"""


def config_of(path) -> dict:
    with safe_open(str(path), "np") as f:
        return json.loads(f.metadata()["config"])


def test_solve_w_takes_lambda_from_the_setting_by_reward_name_and_records_it(tmp_path):
    gains = tmp_path / "g.parquet"
    write_gains(gains, make_table(0.05 * bump_gains([20, 12, 5], [4, 3, 2], 25), ("a", "b", "c")), config={"t": 1})
    setting = tmp_path / "mine.toml"
    setting.write_text(SETTING)
    by_setting, by_flag = tmp_path / "Ws.safetensors", tmp_path / "Wl.safetensors"
    shown = run_ok("solve-w", "--gains", gains, "--setting", setting, "--out", by_setting).stdout
    assert "λ = 1, 1, 2 from [train] lambda of mine.toml" in " ".join(shown.split())
    run_ok("solve-w", "--gains", gains, "--lambda", "a=1,b=1,c=2", "--out", by_flag)
    np.testing.assert_array_equal(read_weights(by_setting).W, read_weights(by_flag).W)  # a=1, b=1, c=2 by name
    assert config_of(by_setting)["lambda_from"] == "[train] lambda of mine.toml"
    assert "lambda_from" not in config_of(by_flag)  # --lambda alone: recorded as before

    over = tmp_path / "Wo.safetensors"
    run_ok("solve-w", "--gains", gains, "--setting", setting, "--lambda", "1,1,1", "--out", over)
    assert read_weights(over).lam == (1.0, 1.0, 1.0)
    assert config_of(over)["lambda_from"] == "--lambda, over [train] lambda of mine.toml"


def test_a_setting_of_other_rewards_or_no_budgets_is_one_line(tmp_path):
    gains = tmp_path / "g.parquet"
    write_gains(gains, make_table(0.05 * bump_gains([20, 12], [4, 3], 25), ("a", "b")), config={"t": 1})
    setting = tmp_path / "mine.toml"
    setting.write_text(SETTING)
    out = tmp_path / "W.safetensors"
    one_line(invoke("solve-w", "--gains", gains, "--setting", setting, "--out", out),
             "[train] lambda of mine.toml: it gives budgets for c, a, b, the gain table has the rewards a, b")
    one_line(invoke("solve-w", "--gains", gains, "--out", out), "solve-w needs the budgets λ: --lambda")
    assert not out.exists()
