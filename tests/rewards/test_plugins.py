"""User rewards as plug-ins: the example scorer of docs/rewards.md, named as ``module:Class`` or
through the ``recast.rewards`` entry-point group, through ``score``, ``estimate`` and ``train``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from recast_cli.artifacts import read_gains, read_image_scores
from recast_cli.artifacts.metrics import read_metrics
from recast_cli.rewards.registry import scorer_class, scorer_names
from tests.test_cli import assert_one_line_exit_2, recast
from tests.train.conftest import tiny_train_setting

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rewards.md"
REF = "my_rewards:Brightness"


def example_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if b.startswith('"""my_rewards.py')]
    assert len(found) == 1, "docs/rewards.md must hold the example scorer my_rewards.py once"
    return found[0]


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> Path:
    """The docs' example as an importable module ``my_rewards`` (and a broken sibling module)."""
    root = tmp_path / "plugins"
    root.mkdir()
    (root / "my_rewards.py").write_text(example_code())
    (root / "not_rewards.py").write_text("class Plain:\n    pass\n\n\n"
                                         "from recast_cli.rewards.base import Scorer\n\n\n"
                                         "class Half(Scorer):\n    pass\n")
    (root / "broken_rewards.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(root))
    for name in ("my_rewards", "not_rewards", "broken_rewards"):
        sys.modules.pop(name, None)
    yield root
    for name in ("my_rewards", "not_rewards", "broken_rewards"):
        sys.modules.pop(name, None)


def test_the_example_scores_through_recast_score_with_an_option(plugin, tmp_path):
    image = tmp_path / "grey.png"
    Image.new("RGB", (8, 8), (51, 102, 153)).save(image)
    out = tmp_path / "S.parquet"
    result = recast("score", "--rewards", f"toy_color,{REF}", "--images", image, "--prompt",
                    "a red circle on a white background", "--opt", f"{REF}.scale=2", "--out", out)
    assert result.exit_code == 0, result.stderr
    rows = {r["scorer"]: r["score"] for r in read_image_scores(out).to_pylist()}
    assert rows[REF] == pytest.approx(2 * (51 + 102 + 153) / 3 / 255)


def test_estimate_measures_the_plugins_gain_curve(plugin, tmp_path):
    out = tmp_path / "g.parquet"
    result = recast("estimate", "--policy", "toy", "--rewards", f"toy_color,{REF}", "--n", "2", "--k", "1",
                    "--p", "1", "--steps", "2", "--bootstrap", "0", "--out", out)
    assert result.exit_code == 0, result.stderr
    table = read_gains(out)
    assert table.rewards == ("toy_color", REF) and np.all(np.isfinite(table.gain))


def test_train_trains_with_the_plugin_and_logs_it(plugin, tmp_path):
    setting = tiny_train_setting(tmp_path / "s")
    text = setting.read_text().replace('rewards = ["toy_color", "toy_shape", "toy_sharpness"]',
                                       f'rewards = ["toy_color", "{REF}"]').replace("lambda = [1, 2, 1]",
                                                                                    "lambda = [1, 1]")
    setting.write_text(text + f'\n[rewards."{REF}"]\nscale = 3.0\n')
    run = tmp_path / "run"
    result = recast("train", "--setting", setting, "--weights", "static", "--out", run, "--device", "cpu",
                    "--quiet", "--max-steps", "2")
    assert result.exit_code == 0, result.stderr
    metrics = read_metrics(run / "metrics.parquet").to_pylist()
    means = [r["reward_mean"] for r in metrics if r["reward"] == REF]
    assert len(means) == 2 and all(0 <= m <= 3.0 for m in means)


def test_an_installed_package_registers_a_name_through_entry_points(plugin, tmp_path, monkeypatch):
    dist = tmp_path / "site" / "my_rewards_pkg-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-rewards-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[recast.rewards]\nbrightness = {REF}\nclip = {REF}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert "brightness" in scorer_names() and scorer_names().count("clip") == 1  # a built-in name wins
    assert scorer_class("brightness").__name__ == "Brightness"
    image = tmp_path / "white.png"
    Image.new("RGB", (4, 4), (255, 255, 255)).save(image)
    result = recast("score", "--rewards", "brightness", "--images", image, "--prompt", "p", "--out",
                    tmp_path / "S.parquet")
    assert result.exit_code == 0, result.stderr
    assert read_image_scores(tmp_path / "S.parquet").to_pylist()[0]["score"] == pytest.approx(1.0)


@pytest.mark.parametrize("reward, needle", [
    ("no_such_module:Scorer", "reward 'no_such_module:Scorer': no module named 'no_such_module'"),
    ("my_rewards:Nope", "reward 'my_rewards:Nope': module my_rewards has no 'Nope'"),
    ("not_rewards:Plain", "not_rewards:Plain is not a Scorer (subclass recast_cli.rewards.base.Scorer)"),
    ("not_rewards:Half", "not_rewards:Half does not implement score"),
    ("broken_rewards:X", "importing broken_rewards failed: RuntimeError: boom"),
    ("my-rewards:Brightness", "a scorer reference is MODULE:CLASS"),
])
def test_a_bad_reference_is_one_line_through_score_estimate_and_train(plugin, tmp_path, reward, needle):
    image = tmp_path / "x.png"
    Image.new("RGB", (4, 4)).save(image)
    assert_one_line_exit_2(recast("score", "--rewards", reward, "--images", image, "--prompt", "p", "--out",
                                  tmp_path / "S.parquet"), needle)
    assert_one_line_exit_2(recast("estimate", "--policy", "toy", "--rewards", f"toy_color,{reward}", "--out",
                                  tmp_path / "g.parquet"), needle)
    setting = tiny_train_setting(tmp_path / "s")
    setting.write_text(setting.read_text().replace('"toy_sharpness"]', f'"{reward}"]'))
    assert_one_line_exit_2(recast("train", "--setting", setting, "--weights", "static", "--out", tmp_path / "run",
                                  "--device", "cpu"), needle)
    assert not (tmp_path / "run").exists() and not (tmp_path / "g.parquet").exists()


def test_constructor_options_it_does_not_take_are_refused(plugin, tmp_path):
    image = tmp_path / "x.png"
    Image.new("RGB", (4, 4)).save(image)
    assert_one_line_exit_2(recast("score", "--rewards", REF, "--images", image, "--prompt", "p", "--opt",
                                  f"{REF}.gain=2", "--out", tmp_path / "S.parquet"),
                           f"{REF}: unknown option gain; it takes scale")
