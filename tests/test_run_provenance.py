"""A run folder's outputs come from the run (issue 51, items 3, 12 and two lines of 16).

``recast evaluate --run``, ``recast sample --run`` and ``evaluate --add-judges`` compare the setting's
[policy] and [world] with what the run (or the evaluation) recorded and refuse an edit in one line
naming the table and key; ``--allow-setting-change`` accepts it and the output records it. ``--add-judges``
scores only the images the evaluation saved (their recorded sha256, regular files). A run.json whose
setting is a FIFO is named as such, and a flow1d run is not sampled as images.

One tiny toy run (T = 4, one training step) and its evaluation, shared by the module; a test that edits
the setting restores it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from recast_cli.artifacts import read_eval, read_run
from recast_cli.rewards.base import Scorer, as_float, check_batch
from recast_cli.rewards.registry import SCORERS
from recast_cli.setting.load import digest
from tests.cli_helpers import invoke, one_line, run_ok
from tests.train.conftest import tiny_train_setting

PROMPTS = ("a red circle on a white background", "a blue square on a black background")
EVALUATE = '\n[evaluate]\nprompts = "held-out.txt"\nn = 2\nseed = 7\njudges = []\nbatch_size = 4\n'
FLOW1D = """
[policy]
kind = "flow1d"
steps = 3
noise_level = 0.7
features = 1
hidden = 4

[world]
means = [-1.0, 1.0]
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

[evaluate]
n = 8
"""

pytestmark = pytest.mark.usefixtures("one_thread")


class MeanJudge(Scorer):
    """A held-out judge without weights: the mean pixel value in [0, 1]."""

    name = "mean_judge"

    def score(self, images, prompts):
        check_batch(self.name, images, prompts)
        return np.array([float(x.mean()) for x in as_float(images)], dtype=np.float64)


@pytest.fixture(scope="module", autouse=True)
def mean_judge():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(SCORERS, "mean_judge", f"{__name__}:MeanJudge")
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny setting (resolution 32, guidance 2.0), a one-step static run and its evaluation."""
    root = tmp_path_factory.mktemp("provenance")
    setting = tiny_train_setting(root)
    setting.write_text(setting.read_text() + EVALUATE)
    (root / "held-out.txt").write_text("\n".join(PROMPTS) + "\n")
    run = root / "run"
    run_ok("train", "--setting", setting, "--weights", "static", "--out", run, "--max-steps", "1", "--device", "cpu",
       "--quiet")
    evaluation = root / "eval" / "E.parquet"
    run_ok("evaluate", "--run", run, "--out", evaluation, "--device", "cpu", "--quiet")
    return {"root": root, "setting": setting, "run": run, "eval": evaluation}


@pytest.fixture
def edited(world):
    """Edit the shared setting (old text → new text) for one test; restored after it."""
    original = world["setting"].read_text()

    def edit(old: str, new: str) -> None:
        assert old in original
        world["setting"].write_text(original.replace(old, new))

    yield edit
    world["setting"].write_text(original)


def copy_eval(world, tmp_path) -> Path:
    """A copy of the shared evaluation (table and images) to tamper with."""
    shutil.copytree(world["eval"].parent, tmp_path / "eval")
    return tmp_path / "eval" / "E.parquet"


# ------------------------------------------------------------------ item 3: the run's setting, as it trained


def test_run_json_records_what_its_digests_are_of(world):
    config = read_run(world["run"]).config
    values = config["made_from_values"]
    assert values["[policy]"]["resolution"] == 32 and values["[world]"] is None
    assert {label: digest(v) for label, v in values.items()} == \
        {label: config["made_from"][label] for label in ("[policy]", "[world]")}


@pytest.mark.parametrize("old, new, change", [
    ("resolution = 32", "resolution = 48", "[policy] resolution 32 -> 48"),
    ("guidance_scale = 2.0", "guidance_scale = 3.5", "[policy] guidance_scale 2.0 -> 3.5"),
])
def test_evaluate_run_refuses_a_setting_edited_since_training(world, edited, tmp_path, old, new, change):
    edited(old, new)
    out = tmp_path / "E.parquet"
    line = one_line(invoke("evaluate", "--run", world["run"], "--out", out, "--device", "cpu", "--quiet"),
               str(world["setting"]), "changed since the run trained", change, "--allow-setting-change")
    assert line.startswith(f"recast: error: --run {world['run']}: ")
    assert not out.exists() and not (tmp_path / "E.images").exists()


def test_sample_run_refuses_a_setting_edited_since_training(world, edited, tmp_path):
    edited("resolution = 32", "resolution = 48")
    out = tmp_path / "s"
    one_line(invoke("sample", "--run", world["run"], "--prompt", PROMPTS[0], "--n", "1", "--device", "cpu", "--out", out),
        "[policy] resolution 32 -> 48", "--allow-setting-change")
    assert not out.exists()


def test_allow_setting_change_is_recorded_in_the_evaluation_and_the_pngs(world, edited, tmp_path):
    edited("guidance_scale = 2.0", "guidance_scale = 3.5")
    out = tmp_path / "E.parquet"
    run_ok("evaluate", "--run", world["run"], "--out", out, "--device", "cpu", "--quiet", "--allow-setting-change")
    table = read_eval(out)
    assert table.provenance.config["setting_changes"] == ["[policy] guidance_scale 2.0 -> 3.5"]
    assert table.meta["made_from_values"]["[policy]"]["guidance_scale"] == 3.5  # what made these images
    run_ok("sample", "--run", world["run"], "--prompt", PROMPTS[0], "--n", "1", "--device", "cpu", "--out",
       tmp_path / "s", "--allow-setting-change", "--grid")
    for png in (tmp_path / "s").iterdir():
        assert json.loads(Image.open(png).text["setting_changes"]) == ["[policy] guidance_scale 2.0 -> 3.5"]
    unchanged = read_eval(world["eval"]).provenance.config
    assert unchanged["setting_changes"] == []


def test_run_json_setting_pointing_at_another_file_is_refused(world, tmp_path):
    other = world["root"] / "other.toml"
    other.write_text(world["setting"].read_text().replace("resolution = 32", "resolution = 48"))
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    record = json.loads((run / "run.json").read_text())
    record["config"]["setting"] = str(other)
    (run / "run.json").write_text(json.dumps(record))
    one_line(invoke("evaluate", "--run", run, "--out", tmp_path / "E.parquet", "--device", "cpu", "--quiet"),
        str(other), "[policy] resolution 32 -> 48")
    one_line(invoke("sample", "--run", run, "--prompt", PROMPTS[0], "--n", "1", "--device", "cpu", "--out", tmp_path / "s"),
        "[policy] resolution 32 -> 48")


def test_a_flow1d_run_with_an_edited_world_is_refused_naming_the_key(tmp_path):
    setting = tmp_path / "w.toml"
    setting.write_text(FLOW1D)
    run = tmp_path / "run"
    run_ok("train", "--setting", setting, "--weights", "static", "--out", run, "--quiet")
    setting.write_text(FLOW1D.replace("means = [-1.0, 1.0]", "means = [-1.0, 1.5]"))
    one_line(invoke("evaluate", "--run", run, "--out", tmp_path / "c.parquet", "--quiet"),
        "[world] means [-1.0, 1.0] -> [-1.0, 1.5]")
    assert not (tmp_path / "c.parquet").exists()
    # item 16: a flow1d run is not sampled as images, and the line says so (not "no LoRA adapter")
    one_line(invoke("sample", "--run", run, "--prompt", "x", "--n", "1", "--out", tmp_path / "s", "--allow-setting-change"),
        "flow1d policy", "not images")
    one_line(invoke("sample", "--setting", setting, "--prompt", "x", "--n", "1", "--out", tmp_path / "s"), "not images")
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------ item 16: run.json's setting is a FIFO


def test_run_json_setting_that_is_a_fifo_is_named_not_a_regular_file(world, tmp_path):
    fifo = tmp_path / "setting.toml"
    os.mkfifo(fifo)
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    record = json.loads((run / "run.json").read_text())
    record["config"]["setting"] = str(fifo)
    (run / "run.json").write_text(json.dumps(record))
    for args in (("evaluate", "--run", run, "--out", tmp_path / "E.parquet"),
                 ("sample", "--run", run, "--prompt", PROMPTS[0], "--out", tmp_path / "s")):
        line = one_line(invoke(*args), str(fifo), "is not a regular file")
        assert "is not there" not in line


# ------------------------------------------------------------------ item 12: --add-judges scores the saved images


def test_add_judges_scores_the_saved_images_and_records_no_change(world, tmp_path):
    table = copy_eval(world, tmp_path)
    run_ok("evaluate", "--add-judges", table, "--judges", "mean_judge", "--device", "cpu", "--quiet")
    added = read_eval(table)
    assert added.scorers[-1] == "mean_judge" and added.provenance.config["judges_added"]["setting_changes"] == []


@pytest.mark.parametrize("tamper, needle", [
    ("garbage", "is not the image this evaluation saved"),
    ("swap", "is not the image this evaluation saved"),
    ("symlink", "is a symbolic link"),
    ("fifo", "is not a regular file"),
])
def test_add_judges_refuses_an_image_the_evaluation_did_not_save(world, tmp_path, tamper, needle):
    table = copy_eval(world, tmp_path)
    images = tmp_path / "eval" / "E.images"
    first, second = images / "00000" / "000.png", images / "00001" / "001.png"
    before = table.read_bytes()
    if tamper == "garbage":
        first.write_bytes(b"not a png at all")
    elif tamper == "swap":
        first.write_bytes(second.read_bytes())
    elif tamper == "symlink":
        first.unlink()
        first.symlink_to(second)
    else:
        first.unlink()
        os.mkfifo(first)
    one_line(invoke("evaluate", "--add-judges", table, "--judges", "mean_judge", "--device", "cpu", "--quiet"),
        str(first), needle)
    assert table.read_bytes() == before


def test_add_judges_refuses_a_setting_edited_since_the_evaluation(world, edited, tmp_path):
    table = copy_eval(world, tmp_path)
    edited("resolution = 32", "resolution = 48")
    args = ("evaluate", "--add-judges", table, "--judges", "mean_judge", "--device", "cpu", "--quiet")
    one_line(invoke(*args), str(table), "changed since the evaluation made its images", "[policy] resolution 32 -> 48",
        "--allow-setting-change")
    run_ok(*args, "--allow-setting-change")
    assert read_eval(table).provenance.config["judges_added"]["setting_changes"] == ["[policy] resolution 32 -> 48"]


def test_add_judges_refuses_a_table_without_image_hashes(world, tmp_path):
    table = copy_eval(world, tmp_path)
    arrow = pq.read_table(table)
    meta = {k: v for k, v in arrow.schema.metadata.items() if k != b"image_sha256"}
    pq.write_table(arrow.replace_schema_metadata(meta), table)
    one_line(invoke("evaluate", "--add-judges", table, "--judges", "mean_judge", "--device", "cpu", "--quiet"),
        "did not record its images' sha256")
