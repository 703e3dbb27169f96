"""``recast evaluate`` end to end through the CLI on the tiny toy setting (T = 4) and a 2-step run.

Three held-out prompts × n = 2 images, chunks of 3 images; scorers: the three toy training
rewards and one held-out judge (a fake registered for the test: ``scale`` × mean pixel, its
option from the setting's ``[rewards.fake_judge]`` table).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from recast_cli.artifacts import EVAL_COLUMNS, EVAL_RUN_KEYS, read_eval, sha256_file
from recast_cli.artifacts.parts import MARKER_NAME
from recast_cli.cli import app
from recast_cli.errors import BadInput
from recast_cli.evaluate import stage
from recast_cli.rewards.base import Scorer, as_float, check_batch
from recast_cli.rewards.registry import SCORERS
from tests.train.conftest import tiny_train_setting

runner = CliRunner()
REWARDS = ("toy_color", "toy_shape", "toy_sharpness")
PROMPTS = ("a red circle on a white background", "a blue square on a black background",
           "a yellow triangle on a white background")
N, SCORERS_PER_IMAGE = 2, len(REWARDS) + 1


class FakeJudge(Scorer):
    """A held-out judge without weights: ``scale`` × the mean pixel value in [0, 1]."""

    name = "fake_judge"

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def score(self, images, prompts):
        check_batch(self.name, images, prompts)
        return np.array([self.scale * float(x.mean()) for x in as_float(images)], dtype=np.float64)


def evaluate_setting(root: Path, table: str = "") -> Path:
    """The tiny train setting plus held-out prompts, an [evaluate] table and the judge's options."""
    setting = tiny_train_setting(root)
    (root / "held-out.txt").write_text("\n".join(PROMPTS) + "\n")
    table = table or ('prompts = "held-out.txt"\nn = 2\nseed = 500\nsteps = 3\nguidance_scale = 3.0\n'
                      'judges = ["fake_judge"]\nbatch_size = 3\n')
    setting.write_text(setting.read_text() + "\n[evaluate]\n" + table + "\n[rewards.fake_judge]\nscale = 2.0\n")
    return setting


def invoke(*args):
    return runner.invoke(app, ["evaluate", *(str(a) for a in args), "--device", "cpu", "--quiet"])


def run_ok(*args):
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def assert_bad(result, needle: str):
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


def png_bytes(out: Path) -> dict[str, str]:
    folder = stage.images_dir(out)
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*.png"))}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", autouse=True)
def fake_judge():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(SCORERS, "fake_judge", f"{__name__}:FakeJudge")
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The setting, a 2-step static run (checkpoints at steps 1 and 2), and its base and run evaluations."""
    root = tmp_path_factory.mktemp("evaluate")
    setting = evaluate_setting(root)
    run = root / "run"
    result = runner.invoke(app, ["train", "--setting", str(setting), "--weights", "static", "--out", str(run),
                                 "--max-steps", "2", "--set", "save_every=1", "--lr", "0.05", "--device", "cpu",
                                 "--quiet"])
    assert result.exit_code == 0, result.stderr
    base, trained = root / "base" / "E.parquet", root / "run-eval" / "E.parquet"
    run_ok("--setting", setting, "--out", base)
    run_ok("--run", run, "--out", trained)
    return {"root": root, "setting": setting, "run": run, "base": base, "trained": trained}


# ------------------------------------------------------------------ the tables


def test_base_and_run_evaluations_write_complete_valid_tables(world):
    for path, mode in ((world["base"], "base"), (world["trained"], "static")):
        table = read_eval(path, check_images=True)
        arrow = pq.read_table(path)
        assert arrow.num_rows == len(PROMPTS) * N * SCORERS_PER_IMAGE
        assert dict(zip(arrow.column_names, arrow.schema.types)) == EVAL_COLUMNS
        assert table.scorers == (*REWARDS, "fake_judge") and table.kinds == ("reward",) * 3 + ("judge",)
        assert [im.prompt for im in table.images] == [p for p in PROMPTS for _ in range(N)]
        assert all((path.parent / im.image_path).is_file() for im in table.images)
        assert all(im.image_path.startswith("E.images/") for im in table.images)
        meta = table.meta
        assert set(EVAL_RUN_KEYS) <= set(meta) and meta["mode"] == mode
        assert meta["rewards"] == list(REWARDS) and meta["lambda"] == [1.0, 2.0, 1.0]
        assert meta["sampling"] == {**meta["sampling"], "steps": 3, "guidance_scale": 3.0, "resolution": 32, "n": 2,
                                    "seed": 500}
        assert meta["prompts_source"] == str(world["root"] / "held-out.txt")
        assert meta["setting"] == {"path": str(world["setting"]), "name": "tiny"}
        assert not stage.parts_dir(path).exists()


def test_the_run_table_names_its_checkpoint_w_and_seed_and_the_base_table_none(world):
    base, trained = read_eval(world["base"]).meta, read_eval(world["trained"]).meta
    record = json.loads((world["run"] / "run.json").read_text())
    adapter = world["run"] / "checkpoints" / "step-000002" / "adapter" / "pytorch_lora_weights.safetensors"
    assert trained["run"] == str(world["run"]) and trained["train_seed"] == 0
    assert trained["checkpoint"] == {"path": str(adapter.parent.parent), "step": 2,
                                     "adapter_sha256": sha256_file(adapter)}
    assert trained["weights_key"] == record["config"]["weights_key"] and trained["sigmas"] == record["sigmas"]
    assert all(base[k] is None for k in ("run", "train_seed", "weights_key", "sigmas", "checkpoint"))


def test_base_and_run_images_share_seeds_but_differ(world):
    base, trained = read_eval(world["base"]), read_eval(world["trained"])
    assert [im.seed for im in base.images] == [im.seed for im in trained.images]
    assert [im.seed for im in base.images] == [500 + 100000 * p + k for p in range(len(PROMPTS)) for k in range(N)]
    assert png_bytes(world["base"]).keys() == png_bytes(world["trained"]).keys()
    differing = [k for k, v in png_bytes(world["base"]).items() if png_bytes(world["trained"])[k] != v]
    assert len(differing) == len(base.images)
    assert not np.array_equal(base.scores, trained.scores)


def test_scores_are_those_of_the_saved_images_with_the_settings_options(world):
    table = read_eval(world["base"])
    for im, judged in zip(table.images, table.column("fake_judge")):
        pixels = np.asarray(Image.open(world["base"].parent / im.image_path).convert("RGB"), dtype=np.float64)
        assert judged == pytest.approx(2.0 * pixels.mean() / 255.0, rel=1e-6)
    lam = np.array([1.0, 2.0, 1.0])
    np.testing.assert_allclose(table.aggregate(), np.stack([table.column(r) for r in REWARDS], axis=1) @ lam)


def test_a_rerun_gives_identical_scores_and_images(world, tmp_path):
    again = tmp_path / "E.parquet"
    run_ok("--setting", world["setting"], "--out", again)
    first, second = read_eval(world["base"]), read_eval(again)
    np.testing.assert_array_equal(first.scores, second.scores)
    assert first.images == second.images
    assert png_bytes(again) == png_bytes(world["base"])


def test_a_killed_evaluation_resumes_to_the_identical_table(world, tmp_path, monkeypatch):
    out = tmp_path / "E.parquet"
    calls = {"score": 0, "sample": 0}
    real_score, real_sample = FakeJudge.score, stage.sample_chunk

    def dies_after_first_chunk(self, images, prompts):
        calls["score"] += 1
        if calls["score"] > 1:
            raise RuntimeError("killed")
        return real_score(self, images, prompts)

    monkeypatch.setattr(FakeJudge, "score", dies_after_first_chunk)
    killed = invoke("--run", world["run"], "--out", out)
    assert killed.exit_code == 1 and "killed" in str(killed.exception)
    assert not out.exists() and not stage.images_dir(out).exists()
    assert sorted(p.name for p in stage.parts_dir(out).glob("chunk-*")) == ["chunk-000000.json"]

    monkeypatch.setattr(FakeJudge, "score", real_score)

    def counted(*args):
        calls["sample"] += 1
        return real_sample(*args)

    monkeypatch.setattr(stage, "sample_chunk", counted)
    run_ok("--run", world["run"], "--out", out)
    assert calls["sample"] == 1  # only the second of the two chunks was sampled again
    reference = world["trained"]
    a, b = pq.read_table(reference), pq.read_table(out)
    assert a.equals(b)
    meta_a = {k: v for k, v in a.schema.metadata.items() if k != b"created_at"}
    meta_b = {k: v for k, v in b.schema.metadata.items() if k != b"created_at"}
    assert meta_a == meta_b
    assert png_bytes(out) == png_bytes(reference)
    assert not stage.parts_dir(out).exists()


def test_checkpoint_selects_an_earlier_step(world, tmp_path):
    out = tmp_path / "E.parquet"
    run_ok("--run", world["run"], "--checkpoint", 1, "--out", out, "--judges", "", "--n", 1)
    table = read_eval(out)
    assert table.meta["checkpoint"]["step"] == 1 and table.scorers == REWARDS
    assert len(table.images) == len(PROMPTS)


def test_without_an_evaluate_table_the_defaults_apply(tmp_path):
    setting = tiny_train_setting(tmp_path)
    plan = stage.plan_evaluation(stage.resolve_target(None, str(setting), None), tmp_path / "E.parquet")
    assert plan.cfg == stage.EvalConfig(prompts="toy", n=4, seed=10000, steps=None, guidance_scale=None, judges=())
    assert plan.rewards == REWARDS and plan.lam == (1.0, 2.0, 1.0) and len(plan.prompts) == 24
    assert plan.scorers == [(r, "reward") for r in REWARDS]
    assert not (tmp_path / "E.parquet").exists()


def test_the_command_resolves_its_target_once(tmp_path, monkeypatch):
    setting = tiny_train_setting(tmp_path)
    calls = []
    real = stage.resolve_target
    monkeypatch.setattr(stage, "resolve_target", lambda *args, **kw: calls.append(args) or real(*args, **kw))
    monkeypatch.setattr(stage, "evaluate", lambda plan, quiet=False: "table")
    plan, table = stage.run_evaluation(None, str(setting), tmp_path / "E.parquet", judges="", n=1)
    assert calls == [(None, str(setting), None)] and table == "table"
    assert plan.target.mode == "base" and plan.cfg.n == 1 and plan.cfg.judges == ()


def test_flags_override_the_evaluate_table(world, tmp_path):
    target = stage.resolve_target(world["run"], None, None)
    plan = stage.plan_evaluation(target, tmp_path / "E.parquet", judges=(), n=3, seed=7, batch_size=5)
    assert (plan.cfg.n, plan.cfg.seed, plan.cfg.batch_size, plan.cfg.judges) == (3, 7, 5, ())
    assert plan.cfg.steps == 3 and plan.target.mode == "static" and plan.target.step == 2


# ------------------------------------------------------------------ bad input: one line, exit 2, nothing written


@pytest.fixture(scope="module")
def broken_runs(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("broken")
    plain = root / "plain"
    plain.mkdir()
    empty = root / "no-checkpoint"
    empty.mkdir()
    shutil.copy(world["run"] / "run.json", empty / "run.json")
    corrupt = root / "corrupt"
    shutil.copytree(world["run"], corrupt)
    adapter = corrupt / "checkpoints" / "step-000002" / "adapter" / "pytorch_lora_weights.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-1] ^= 0xFF
    adapter.write_bytes(bytes(data))
    unknown_key = evaluate_setting(root / "unknown-key", table='prompts = "held-out.txt"\nsamples = 3\n')
    return {"plain": plain, "empty": empty, "corrupt": corrupt, "unknown_key": unknown_key}


BAD = {
    "not a run folder": (lambda w, b: ["--run", b["plain"]], "not a recast train run folder"),
    "no checkpoint": (lambda w, b: ["--run", b["empty"]], "no complete checkpoint"),
    "corrupt checkpoint": (lambda w, b: ["--run", b["corrupt"]], "is corrupt"),
    "unknown step": (lambda w, b: ["--run", w["run"], "--checkpoint", 7], "no checkpoint of step 7"),
    "unknown judge": (lambda w, b: ["--run", w["run"], "--judges", "fake_judge,nosuch"], "unknown scorer 'nosuch'"),
    "judge is a reward": (lambda w, b: ["--setting", w["setting"], "--judges", "toy_color"], "named twice"),
    "both": (lambda w, b: ["--run", w["run"], "--setting", w["setting"]], "exactly one of --run"),
    "neither": (lambda w, b: [], "exactly one of --run"),
    "checkpoint of the base": (lambda w, b: ["--setting", w["setting"], "--checkpoint", 1], "base model has none"),
    "unknown [evaluate] key": (lambda w, b: ["--setting", b["unknown_key"]], "unknown key 'samples'"),
    "n of zero": (lambda w, b: ["--setting", w["setting"], "--n", 0], "--n must be an integer from 1 to 100000, got 0"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(world, broken_runs, tmp_path, case):
    args, needle = BAD[case]
    out = tmp_path / "new" / "E.parquet"
    assert_bad(invoke(*args(world, broken_runs), "--out", out), needle)
    assert not (tmp_path / "new").exists()


def test_partial_results_of_another_evaluation_are_refused_untouched(world, tmp_path):
    out = tmp_path / "E.parquet"
    parts = stage.parts_dir(out)
    parts.mkdir()
    (parts / MARKER_NAME).write_text(json.dumps({"run_id": "0123456789abcdef"}))
    (parts / "chunk-000000.json").write_text(json.dumps({"image_ids": [0], "scores": {}}))
    assert_bad(invoke("--setting", world["setting"], "--out", out), "partial results of another evaluation")
    assert sorted(p.name for p in parts.iterdir()) == ["chunk-000000.json", MARKER_NAME] and not out.exists()


def test_the_marker_of_an_evaluation_that_finished_no_chunk_blocks_nothing(world, tmp_path):
    out = tmp_path / "E.parquet"
    parts = stage.parts_dir(out)
    parts.mkdir()
    (parts / MARKER_NAME).write_text(json.dumps({"run_id": "0123456789abcdef"}))  # it stopped before any chunk
    run_ok("--setting", world["setting"], "--out", out)
    assert out.is_file() and not parts.exists()


def test_read_eval_rejects_a_foreign_file(world):
    with pytest.raises(BadInput, match="schema tag"):
        read_eval(world["run"] / "metrics.parquet")


def test_one_writer_per_evaluation_output(world, tmp_path):
    from recast_cli.artifacts import FolderLock

    out = tmp_path / "E.parquet"
    parts = stage.parts_dir(out)
    parts.mkdir()
    held = FolderLock(parts, "the test")
    try:
        assert_bad(invoke("--setting", world["setting"], "--out", out), "is being written by another recast evaluate")
        assert not out.exists()
    finally:
        held.release()
    run_ok("--setting", world["setting"], "--out", out)
    assert out.is_file() and not parts.exists()


# ------------------------------------------------------------------ judges later: --add-judges


def test_judges_added_later_equal_the_judges_scored_in_the_run(world, tmp_path):
    """`--judges ''` scores the training rewards alone; `--add-judges` then scores the setting's judges on the
    saved PNGs: the table equals, score for score, the evaluation that scored the judge in the same run."""
    later = tmp_path / "later" / "E.parquet"
    run_ok("--run", world["run"], "--judges", "", "--out", later)
    assert read_eval(later).scorers == REWARDS
    result = runner.invoke(app, ["evaluate", "--add-judges", str(later), "--device", "cpu", "--quiet"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    added, together = read_eval(later, check_images=True), read_eval(world["trained"])
    assert added.scorers == together.scorers and added.kinds == together.kinds
    np.testing.assert_array_equal(added.scores, together.scores)
    assert added.meta["judges"] == ["fake_judge"]
    assert added.provenance.config["judges_added"]["judges"] == ["fake_judge"]
    again = runner.invoke(app, ["evaluate", "--add-judges", str(later), "--judges", "fake_judge", "--quiet"])
    assert again.exit_code == 0 and read_eval(later).scorers == together.scorers  # replaced, not repeated


@pytest.mark.parametrize(("args", "needle"), [
    (("--out", "x.parquet"), "--out do not apply"),
    (("--judges", "toy_color"), "toy_color is a training reward of this evaluation"),
    (("--judges", "no_such_judge"), "unknown scorer 'no_such_judge'"),
])
def test_add_judges_refuses_in_one_line(world, tmp_path, args, needle):
    copy = tmp_path / "E.parquet"
    shutil.copy(world["base"], copy)
    shutil.copytree(stage.images_dir(world["base"]), stage.images_dir(copy))
    before = copy.read_bytes()
    result = runner.invoke(app, ["evaluate", "--add-judges", str(copy), *args, "--quiet"])
    assert_bad(result, needle)
    assert copy.read_bytes() == before
