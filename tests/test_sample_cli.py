"""`recast sample` and settings: any setting's policy, PNGs out, bad input as one line."""

from __future__ import annotations

import pytest
from PIL import Image
from typer.testing import CliRunner

from recast_cli.cli import app
from tests.conftest import tiny_toy_setting

runner = CliRunner()
PROMPT = "a red circle on a white background"


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    return tiny_toy_setting(tmp_path_factory.mktemp("setting"), seed=1, steps=3)


def test_sample_writes_n_pngs_per_prompt_reproducibly(setting, tmp_path):
    args = ["sample", "--setting", str(setting), "--prompt", PROMPT, "--prompt", "a blue square on a black background",
            "--n", "2", "--device", "cpu"]
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.stderr
    assert first.stdout.split() == ["wrote", "4", "images", "to", str(tmp_path / "a")]  # the bar is on stderr
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["a-blue-square-on-a-black-background-0000.png", "a-blue-square-on-a-black-background-0001.png",
                     "a-red-circle-on-a-white-background-0000.png", "a-red-circle-on-a-white-background-0001.png"]
    assert Image.open(tmp_path / "a" / files[0]).size == (32, 32)
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "b")]).exit_code == 0
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("args,needle", [
    (["--prompt", "a purple circle on a white background"], "outside the toy vocabulary"),
    (["--prompt", PROMPT, "--n", "0"], "--n must be an integer from 1 to 100000, got 0"),
    (["--prompt", PROMPT, "--noise-level", "-1"], "--noise-level must be >= 0"),
])
def test_sample_bad_input_is_one_line(setting, tmp_path, args, needle):
    result = runner.invoke(app, ["sample", "--setting", str(setting), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr
    assert not (tmp_path / "o").exists()


def test_unknown_setting_and_missing_model_are_named(tmp_path):
    result = runner.invoke(app, ["sample", "--setting", "nope", "--prompt", PROMPT, "--out", str(tmp_path)])
    assert result.exit_code == 2 and "no setting 'nope'" in result.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[policy]\nkind = "sd3"\npath = "absent"\n')
    result = runner.invoke(app, ["sample", "--setting", str(bad), "--prompt", "x", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_sample_run_draws_from_the_trained_lora_not_the_base_model(tmp_path):
    from tests.train.conftest import tiny_train_setting

    trained = tiny_train_setting(tmp_path)
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", "--setting", str(trained), "--weights", "static", "--out", str(run),
                                 "--max-steps", "1", "--lr", "0.5", "--device", "cpu", "--quiet"])
    assert result.exit_code == 0, result.stderr
    args = ["sample", "--prompt", PROMPT, "--n", "1", "--device", "cpu"]
    base = runner.invoke(app, [*args, "--setting", str(trained), "--out", str(tmp_path / "base")])
    tuned = runner.invoke(app, [*args, "--run", str(run), "--out", str(tmp_path / "tuned"), "--grid"])
    assert base.exit_code == 0 and tuned.exit_code == 0, (base.stderr, tuned.stderr)
    name = "a-red-circle-on-a-white-background-0000.png"
    assert (tmp_path / "base" / name).read_bytes() != (tmp_path / "tuned" / name).read_bytes()
    assert Image.open(tmp_path / "tuned" / "grid.png").size == (32, 32)  # one prompt × n = 1
    both = runner.invoke(app, [*args, "--run", str(run), "--setting", str(trained), "--out", str(tmp_path / "x")])
    assert both.exit_code == 2 and "not both" in both.stderr and not (tmp_path / "x").exists()
