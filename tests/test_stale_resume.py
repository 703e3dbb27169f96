"""The lower-level commands that resume never continue under a changed setting (issue 40, finding 5's
siblings): ``recast estimate`` refuses the leftover ``OUT.parts/`` of a run whose ``[world]`` or
``[policy]`` changed since it stopped, and ``recast train --resume`` a run (its checkpoint, or the
start of one) made under another ``[policy]`` or ``[world]``: one line, exit 2, nothing touched;
the same inputs resume."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.errors import BadInput

runner = CliRunner()

SETTING = """
[policy]
kind = "flow1d"
steps = 3
noise_level = {noise}
features = 1
hidden = 4

[world]
means = {means}
stds = [0.3, 0.3]

[world.rewards.side]
threshold = 0.0

[train]
rewards = ["side"]
lambda = [1]
prompts = "toy"
train_fraction = 1.0
lora_rank = 0
max_steps = 1
group_size = 2
prompts_per_step = 2
micro_batch = 8
sample_batch = 4
beta_kl = 0.0
save_every = 1
"""
MEANS = "[-1.0, 1.0]"


def write_setting(path: Path, noise: float = 0.7, means: str = MEANS) -> Path:
    path.write_text(SETTING.format(noise=noise, means=means))
    return path


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_exit_2(result, needle: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


def hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------- recast estimate's parts


def estimate(setting: Path, out: Path):
    return invoke("estimate", "--policy", setting, "--rewards", "side", "--n", "4", "--k", "1", "--p", "2",
                  "--steps", "3", "--bootstrap", "0", "--out", out)


@pytest.fixture
def killed_estimate(tmp_path, monkeypatch):
    """An estimate on a flow1d ``[world]`` killed after its first prompt: OUT.parts/ holds one part (and a
    file of the user's); then the real rollouts again."""
    from recast_cli.estimate import stage

    real, calls = stage.prompt_scores, []

    def dies_on_second_prompt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    setting, out = write_setting(tmp_path / "s.toml"), tmp_path / "g.parquet"
    monkeypatch.setattr(stage, "prompt_scores", dies_on_second_prompt)
    assert estimate(setting, out).exit_code != 0
    monkeypatch.setattr(stage, "prompt_scores", real)
    parts = tmp_path / "g.parquet.parts"
    assert [p.name for p in parts.glob("prompt-*")] == ["prompt-000000.safetensors"]
    (parts / "notes.txt").write_text("mine")
    return setting, out, parts


@pytest.mark.parametrize("change, label", [(dict(means="[-1.0, 1.5]"), "[world]"),
                                           (dict(noise=0.5), "[policy]")])
def test_estimate_parts_of_a_changed_setting_are_refused_by_name_then_resumed_when_restored(killed_estimate, change,
                                                                                         label):
    setting, out, parts = killed_estimate
    before = hashes(parts)
    write_setting(setting, **change)
    one_line_exit_2(estimate(setting, out), f"holds partial results of a run with another {label} ")
    assert hashes(parts) == before and not out.exists()
    write_setting(setting)  # the setting it was made under: the part is this run's again
    result = estimate(setting, out)
    assert result.exit_code == 0, result.stderr
    assert "resuming: 1 of 2 prompts already done" in result.stderr
    assert sorted(p.name for p in parts.iterdir()) == ["notes.txt"]  # recast's own files gone, the user's kept


def test_estimate_parts_of_an_older_recast_are_refused_by_name(killed_estimate):
    setting, out, parts = killed_estimate
    marker = parts / "parts.json"
    record = json.loads(marker.read_text())
    del record["made_from"]
    record["run_id"] = "0123456789abcdef"  # an older recast's id: of the flags alone
    marker.write_text(json.dumps(record))
    before = hashes(parts)
    one_line_exit_2(estimate(setting, out), "a run of an older recast, which recorded no [policy], [world]")
    assert hashes(parts) == before and not out.exists()


def test_the_run_id_holds_what_fixes_the_rollouts_and_gmm1d_keeps_its_id():
    from recast_cli.estimate.config import EstimateConfig

    cfg = EstimateConfig(policy="s.toml", rewards=("side",))
    assert cfg.run_id() == cfg.run_id({}) != cfg.run_id({"[world]": "a"}) != cfg.run_id({"[world]": "b"})
    assert EstimateConfig(policy="gmm1d", rewards=("fine",)).run_id() == "09d6f4860e89f9e3"  # as before


# ---------------------------------------------------------------------- recast train --resume


def train(setting: Path, run: Path, *extra):
    return invoke("train", "--setting", setting, "--weights", "static", "--out", run, "--quiet", *extra)


@pytest.fixture
def trained(tmp_path):
    setting, run = write_setting(tmp_path / "s.toml"), tmp_path / "run"
    result = train(setting, run)
    assert result.exit_code == 0, result.stderr
    return setting, run


@pytest.mark.parametrize("change, label", [(dict(noise=0.5), "[policy]"), (dict(means="[-1.0, 1.5]"), "[world]")])
def test_resume_under_another_policy_or_world_is_refused_by_name(trained, change, label):
    setting, run = trained
    before = hashes(run)
    write_setting(setting, **change)
    one_line_exit_2(train(setting, run, "--resume", "--max-steps", "2"),
                    f"checkpoint {run / 'checkpoints' / 'step-000001'} was made under another {label} than")
    assert hashes(run) == before
    write_setting(setting)
    result = train(setting, run, "--resume", "--max-steps", "2")
    assert result.exit_code == 0 and "trained step 2" in result.stdout, result.stderr


def test_a_run_start_without_a_checkpoint_is_checked_too(trained):
    import shutil

    setting, run = trained
    shutil.rmtree(run / "checkpoints")  # killed before its first checkpoint: it would restart in place
    write_setting(setting, means="[-1.0, 1.5]")
    before = hashes(run)
    one_line_exit_2(train(setting, run, "--resume"), f"the start of the run in {run} was made under another [world]")
    assert hashes(run) == before


def test_a_run_of_an_older_recast_cannot_be_checked_and_is_refused():
    from recast_cli.setting.load import load_setting
    from recast_cli.train.plan import check_same_inputs, run_inputs

    setting = load_setting("twoscale")
    now = run_inputs(setting, ["a prompt"])
    check_same_inputs(dict(now), now, "checkpoint X", setting)  # the same inputs: resumed
    with pytest.raises(BadInput, match=r"^--resume: checkpoint X was made by an older recast, which did not record "
                                       r"the \[policy\] and \[world\] it trains; start a fresh --out$"):
        check_same_inputs(None, now, "checkpoint X", setting)


def test_resume_with_other_prompts_in_the_same_file_is_refused(tmp_path):
    """The run key names the prompts file by path; the run records the prompts it read, so an edited file is
    not continued as if it were the same."""
    setting = write_setting(tmp_path / "s.toml")
    setting.write_text(setting.read_text().replace('prompts = "toy"', 'prompts = "p.txt"'))
    (tmp_path / "p.txt").write_text("x\n")
    run = tmp_path / "run"
    assert train(setting, run).exit_code == 0
    (tmp_path / "p.txt").write_text("y\n")
    before = hashes(run)
    one_line_exit_2(train(setting, run, "--resume", "--max-steps", "2"), "was made under another [train] prompts than")
    assert hashes(run) == before
