"""``recast inspect`` on every artifact the project writes besides gains, W, scores and positives.

Each artifact is written small and for real with the project's own writer (``write_eval``,
``MetricsLog``, ``write_image_scores``, ``write_judgements``, ``save_checkpoint``), then read
back through the CLI, as JSON and as the rich rendering; the JSON numbers are checked against
the same numbers computed from the written tables.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

from recast_cli.artifacts import (
    FOLDER_MARKERS,
    EvalImage,
    EvalTable,
    Provenance,
    read_eval,
    write_eval,
)
from recast_cli.artifacts import (
    CHECKPOINT_SCHEMA,
    IMAGE_SCORES_SCHEMA,
    JUDGEMENTS_SCHEMA,
    READERS,
    RUN_SCHEMA,
    ImageScores,
    read_image_scores,
    write_image_scores,
    write_judgements,
)
from recast_cli.rewards import judge
from recast_cli.train import checkpoint as ckpt
from recast_cli.train.metrics import MetricsLog, read_metrics
from tests.test_cli import assert_one_line_exit_2, recast

REWARDS = ("toy_color", "toy_shape")
LAMBDA = (1.0, 2.0)
SIGMAS = [1.0, 0.5, 0.0]


def inspect_json(path: Path) -> dict:
    result = recast("inspect", path, "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def inspect_text(path: Path) -> str:
    result = recast("inspect", path)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


# --------------------------------------------------------------------------- writers


def write_evaluation(path: Path) -> Path:
    """2 prompts × 2 images, two training rewards and one judge, a trained run's checkpoint."""
    rng = np.random.default_rng(0)
    images = tuple(EvalImage(image_id=2 * p + k, prompt_id=p, prompt=f"prompt {p}", seed=10000 + 100000 * p + k,
                             image_path=f"{path.name}.images/{p:05d}/{k:03d}.png") for p in range(2) for k in range(2))
    meta = {
        "setting": {"path": "/settings/toy.toml", "name": "toy"}, "mode": "recast", "run": "/runs/recast-s3",
        "train_seed": 3, "lambda": list(LAMBDA), "rewards": list(REWARDS), "judges": ["toy_sharpness"],
        "weights_key": "abc", "sigmas": SIGMAS,
        "checkpoint": {"path": "/runs/recast-s3/checkpoints/step-000004", "step": 4, "adapter_sha256": "0" * 64},
        "sampling": {"steps": 2, "guidance_scale": 4.5, "resolution": 8, "n": 2, "seed": 10000, "noise_level": 0.0},
        "prompts_source": "toy", "run_id": "r1",
    }
    table = EvalTable(images=images, scorers=(*REWARDS, "toy_sharpness"), kinds=("reward", "reward", "judge"),
                      scores=rng.normal(size=(4, 3)), meta=meta)
    write_eval(path, table, config={"evaluate": {"n": 2}})
    return path


def write_metrics(run: Path, steps: range) -> Path:
    """Two rewards per step; reward_mean of toy_shape at the first step is NaN (a step whose images all failed)."""
    log = MetricsLog(run, config={"train": {"seed": 3}})
    for step in steps:
        per_reward = {r: {"reward_mean": 0.1 * step + i if (r, step) != ("toy_shape", steps[0]) else math.nan,
                          "reward_std": 0.01, "adv_abs": [0.1, 0.2]} for i, r in enumerate(REWARDS)}
        scalars = {"aggregate": 0.5 * step, "loss": -0.01 * step, "policy_loss": 0.0, "kl": 0.001 * step,
                   "clip_frac": 0.05 * step, "grad_norm": 1.0, "lr": 1e-4, "images": 4, "sample_s": 1.0,
                   "update_s": 1.0}
        log.add(step, per_reward, scalars, [0.5, 0.4])
    log.write()
    log.close()
    return run / "metrics.parquet"


def write_run(run: Path, steps: tuple[int, ...] = (2, 4)) -> Path:
    """A run folder as the trainer leaves it, without training: run.json, metrics, checkpoints of tiny tensors."""
    run.mkdir(parents=True)
    config = {"setting": "/settings/toy.toml", "weights": "/w/W-recast.safetensors", "mode": "recast",
              "weights_key": "abc", "train": {"seed": 3, "max_steps": 4}, "T": 2, "processes": 1}
    record = Provenance.new(RUN_SCHEMA, config, []).to_metadata()
    record.update({"rewards": list(REWARDS), "lambda": list(LAMBDA), "mode": "recast", "sigmas": SIGMAS})
    (run / "run.json").write_text(json.dumps(record, indent=1, sort_keys=True))
    write_metrics(run, range(1, max(steps) + 1))

    def write_files(folder: Path) -> None:
        (folder / "adapter").mkdir()
        save_file({"lora.weight": torch.ones(2, 2)}, str(folder / "adapter" / "pytorch_lora_weights.safetensors"))

    for step in steps:
        state = {"schema": CHECKPOINT_SCHEMA, "step": step, "run_key": "rk", "weights_key": "abc",
                 "weights": config["weights"], "mode": "recast", "data_position": 2 * step, "seed": 3,
                 "processes": 1}
        ckpt.save_checkpoint(run, step, write_files, {"optim/x/exp_avg": torch.zeros(3)}, state, keep=3)
    return run


def write_image_score_file(path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    scores = {"toy_color": np.array([0.1, 0.4, 0.7]), "toy_shape": np.array([2.0, -1.0, 5.5])}
    table = ImageScores(images=("a.png", "b.png", "c.png"), prompts=("p", "p", "q"), scores=scores,
                        extras={"toy_shape": {"detail": ["x", "y", "z"]}})
    write_image_scores(path, table, config={"rewards": list(scores)}, sources=[])
    return path, scores


def write_judgement_file(path: Path) -> tuple[Path, dict]:
    winners = [("a", "a"), ("b", "tie"), ("a", "b"), ("tie", "a")]  # (faithfulness, overall) per verdict
    verdicts = [judge.Verdict(i // 2, judge.ORDERS[i % 2], {"faithfulness": f, "overall": o}, "{}")
                for i, (f, o) in enumerate(winners)]
    summary = judge.win_rates(verdicts, ("faithfulness",))
    write_judgements(path, verdicts, summary, {"labels": ["recast", "static"]}, [])
    return path, summary


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("inspect")
    return {"eval": write_evaluation(root / "eval.parquet"), "run": write_run(root / "run"),
            "image_scores": write_image_score_file(root / "scores.parquet"),
            "judgements": write_judgement_file(root / "judge.parquet")}


# --------------------------------------------------------------------------- the tags inspect knows


def test_every_tag_is_owned_by_artifacts_and_read_through_readers():
    from recast_cli.inspect import KINDS
    from recast_cli.train.plan import RUN_SCHEMA as PLAN_RUN_SCHEMA

    assert (CHECKPOINT_SCHEMA, RUN_SCHEMA) == (ckpt.CHECKPOINT_SCHEMA, PLAN_RUN_SCHEMA)
    assert {IMAGE_SCORES_SCHEMA, JUDGEMENTS_SCHEMA, RUN_SCHEMA} <= set(READERS)
    assert [k.tag for k in KINDS] == list(dict.fromkeys(k.tag for k in KINDS))  # one row per tag
    assert len({k.name for k in KINDS}) == len(KINDS)
    assert {k.tag for k in KINDS} == set(READERS) | {CHECKPOINT_SCHEMA}
    assert dict(FOLDER_MARKERS)["run.json"] == RUN_SCHEMA
    assert dict(FOLDER_MARKERS)["manifest.json"] == CHECKPOINT_SCHEMA


# --------------------------------------------------------------------------- recast.eval/1


def test_eval_table_summary_matches_the_table(world):
    path = world["eval"]
    table = read_eval(path)
    s = inspect_json(path)
    assert s["schema"] == "recast.eval/1" and s["kind"] == "eval"
    assert s["evaluated"]["mode"] == "recast" and s["evaluated"]["train_seed"] == 3
    assert s["evaluated"]["checkpoint"]["step"] == 4 and s["evaluated"]["setting"]["name"] == "toy"
    assert (s["prompts"], s["seeds"], s["images"], s["per_prompt"]) == (2, 4, 4, [2, 2])
    assert [(r["scorer"], r["kind"]) for r in s["scorers"]] == [("toy_color", "reward"), ("toy_shape", "reward"),
                                                                ("toy_sharpness", "judge")]
    for row in s["scorers"]:
        column = table.column(row["scorer"])
        assert row["mean"] == pytest.approx(column.mean()) and row["std"] == pytest.approx(column.std())
        assert row["n"] == 4
    assert s["aggregate"]["mean"] == pytest.approx(table.aggregate().mean())
    text = inspect_text(path)
    assert "recast.eval/1" in text and "toy_sharpness" in text and "step 4" in text
    assert f"{s['scorers'][0]['mean']:.4g}" in text


# --------------------------------------------------------------------------- recast.metrics/1


def test_metrics_summary_covers_steps_rewards_and_nan(world):
    path = world["run"] / "metrics.parquet"
    s = inspect_json(path)
    assert s["schema"] == "recast.metrics/1" and s["kind"] == "metrics"
    assert s["steps"] == {"first": 1, "last": 4, "count": 4}
    color, shape = s["rewards"]
    assert color["reward"] == "toy_color" and color["first"] == pytest.approx(0.1) and color["last"] == pytest.approx(0.4)
    assert shape["first"] is None and shape["last"] == pytest.approx(1.4)  # NaN → null in the JSON
    assert shape["min"] == pytest.approx(1.2) and len(shape["sparkline"]) == 3
    assert len(color["sparkline"]) == 4 and color["sparkline"][0] == "▁" and color["sparkline"][-1] == "█"
    assert s["aggregate"] == {"first": pytest.approx(0.5), "last": pytest.approx(2.0)}
    steps = read_metrics(path).to_pylist()
    assert s["kl_mean"] == pytest.approx(np.mean([r["kl"] for r in steps]))
    assert s["last_step"] == {"step": 4, "loss": pytest.approx(-0.04), "kl": pytest.approx(0.004),
                              "clip_frac": pytest.approx(0.2)}
    text = inspect_text(path)
    assert "1..4 (4 steps)" in text and "toy_shape" in text and "—" in text


# --------------------------------------------------------------------------- recast.image-scores/1, recast.judgements/1


def test_image_scores_summary_per_scorer(world):
    path, scores = world["image_scores"]
    s = inspect_json(path)
    assert s["schema"] == IMAGE_SCORES_SCHEMA and s["kind"] == "image-scores"
    assert (s["images"], s["prompts"], s["extras"]) == (3, 2, ["detail"])
    rows = {r["scorer"]: r for r in s["scorers"]}
    assert list(rows) == ["toy_color", "toy_shape"]
    arrow = read_image_scores(path)
    for name, values in scores.items():
        mask = np.array(arrow.column("scorer").to_pylist()) == name
        column = arrow.column("score").to_numpy()[mask]
        assert rows[name]["mean"] == pytest.approx(column.mean()) == pytest.approx(values.mean())
        assert rows[name]["std"] == pytest.approx(values.std()) and rows[name]["n"] == 3
    text = inspect_text(path)
    assert "recast.image-scores/1" in text and f"{rows['toy_shape']['mean']:.4g}" in text


def test_judgements_summary_is_the_stored_one(world):
    path, summary = world["judgements"]
    s = inspect_json(path)
    assert s["schema"] == JUDGEMENTS_SCHEMA and s["kind"] == "judgements"
    assert (s["pairs"], s["verdicts"], s["labels"]) == (2, 4, ["recast", "static"])
    assert [c["criterion"] for c in s["criteria"]] == ["faithfulness", "overall"]
    for c in s["criteria"]:
        assert {k: v for k, v in c.items() if k != "criterion"} == summary[c["criterion"]]
    assert s["criteria"][0]["win_rate_a"] == pytest.approx((2 + 0.5) / 4)
    text = inspect_text(path)
    assert "faithfulness" in text and "a = recast" in text and "0.625" in text


# --------------------------------------------------------------------------- run and checkpoint folders


def test_run_folder_summary(world):
    run = world["run"]
    s = inspect_json(run)
    assert s["schema"] == RUN_SCHEMA and s["kind"] == "run"
    assert (s["mode"], s["weights"], s["lambda"], s["rewards"], s["seed"]) == (
        "recast", "/w/W-recast.safetensors", list(LAMBDA), list(REWARDS), 3)
    assert s["checkpoints"] == [2, 4] and s["latest_step"] == 4
    assert s["latest"]["verified"] is True and s["latest"]["problem"] is None
    assert s["latest"]["state"]["data_position"] == 8
    assert s["metrics"]["steps"] == {"first": 1, "last": 4, "count": 4}
    assert s["T"] == 2
    assert inspect_json(run / "run.json") == s  # the marker file stands for its folder
    text = inspect_text(run)
    assert "recast.run/1" in text and "steps 2, 4" in text and "step 4: manifest verifies" in text


def test_checkpoint_folder_verifies_and_a_tampered_file_does_not(tmp_path):
    run = write_run(tmp_path / "run")
    folder = ckpt.step_dir(run, 4)
    s = inspect_json(folder)
    assert s["schema"] == CHECKPOINT_SCHEMA and s["kind"] == "checkpoint"
    assert (s["step"], s["verified"], s["problem"], s["run"]) == (4, True, None, str(run))
    assert "adapter/pytorch_lora_weights.safetensors" in s["files"] and s["state"]["seed"] == 3
    assert "manifest verifies" in inspect_text(folder)

    adapter = folder / "adapter" / "pytorch_lora_weights.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-1] ^= 0xFF
    adapter.write_bytes(bytes(data))
    s = inspect_json(folder)
    assert s["verified"] is False and "does not match its sha256" in s["problem"]
    assert s["step"] == 4 and s["state"]["seed"] == 3  # still shown from the files as found
    assert inspect_json(run)["latest"]["verified"] is False
    assert inspect_json(ckpt.step_dir(run, 2))["verified"] is True
    assert "DOES NOT VERIFY" in inspect_text(folder)


# --------------------------------------------------------------------------- what inspect does not know


def test_unknown_artifacts_give_one_line_and_exit_2(tmp_path):
    table = pa.table({"x": [1]}).replace_schema_metadata({"schema": json.dumps("recast.nonsense/7")})
    pq.write_table(table, tmp_path / "odd.parquet")
    assert_one_line_exit_2(recast("inspect", tmp_path / "odd.parquet"), "'recast.nonsense/7' is not one")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "plain.parquet")
    assert_one_line_exit_2(recast("inspect", tmp_path / "plain.parquet"), "no 'schema' tag")
    (tmp_path / "empty").mkdir()
    assert_one_line_exit_2(recast("inspect", tmp_path / "empty"), "holds no recast artifact")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text("[1, 2]")
    assert_one_line_exit_2(recast("inspect", tmp_path / "bad"), "expected 'recast.run/1'")
