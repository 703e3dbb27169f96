"""``[train] logger``: what TensorBoard and W&B receive from a real training run, and that a logger which
fails (to start, to log, to draw) is one warning line and never a lost run.

W&B runs offline into a temporary ``WANDB_DIR``; its run file (``run-ID.wandb``) is read record by record
with W&B's own protobuf schema (``wandb.proto.wandb_internal_pb2.Record``; the records are framed as in
LevelDB's log format, which W&B uses for the file).
"""

from __future__ import annotations

import struct
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.errors import BadInput
from recast_cli.setting.load import load_setting
from recast_cli.train.config import apply_overrides, check_config, config_from_setting
from recast_cli.train.loggers import RunLoggers, start_loggers, wandb_labels, wandb_run_id
from recast_cli.train.metrics import MetricsLog, read_metrics
from recast_cli.train.panels import TILE_MIN, grid_picks, sample_grid, weights_heatmap
from recast_cli.train.plan import plan_run
from recast_cli.train.trainer import Trainer
from tests.train.conftest import tiny_train_setting

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()

REWARDS = ("toy_color", "toy_shape", "toy_sharpness")
STEP_SCALARS = ("train/aggregate", "train/kl", "train/clip_frac", "train/loss", "train/policy_loss",
                "train/grad_norm", "train/lr", "train/images", "train/sample_s", "train/update_s")
PER_REWARD = tuple(f"{key}/{r}" for key in ("reward", "reward_std", "stall") for r in REWARDS)
SECRET = "recastfakekey" + "0" * 27  # 40 characters, the shape of a W&B API key


def train_run(setting: Path, run: Path, steps: int = 2, **overrides) -> Path:
    s = load_setting(str(setting))
    cfg = replace(config_from_setting(s), max_steps=steps, **overrides)
    with Trainer(plan_run(s, cfg, "static", run, False, None, "cpu"), quiet=True) as trainer:
        trainer.train()
    return run


def tensorboard_events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"images": 0, "scalars": 0, "histograms": 0, "tensors": 0})
    events.Reload()
    return events


def wandb_records(wandb_dir: Path) -> list:
    """Every record of the one offline W&B run under ``wandb_dir``, in order."""
    from wandb.proto import wandb_internal_pb2

    (path,) = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    data, block, pos, out, partial = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's zero padding
            pos += left
            continue
        chunk, pos = data[pos + 7: pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            out.append(partial + chunk)
            partial = b""
        else:
            partial += chunk
    records = []
    for raw in out:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def wandb_history(records) -> dict[int, dict[str, str]]:
    """Step → {key: JSON value} of the history rows (image fields flattened as ``key/field``)."""
    rows: dict[int, dict[str, str]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            rows.setdefault(int(row["_step"]), {}).update(row)
    return rows


@pytest.fixture(scope="module")
def setting(tmp_path_factory) -> Path:
    return tiny_train_setting(tmp_path_factory.mktemp("logged"))


@pytest.fixture(scope="module")
def both_run(setting, tmp_path_factory):
    """2 steps with both loggers (W&B offline, a fake API key in the environment), a sample grid every step."""
    pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("both")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(root / "wb"))
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_API_KEY", SECRET)
        (root / "wb").mkdir()
        run = train_run(setting, root / "run-both", logger=("tensorboard", "wandb"), log_images_every=1,
                        wandb_project="recast-test")
    return run, root / "wb"


def test_tensorboard_gets_every_scalar_each_step_W_once_and_a_sample_grid(both_run):
    run, _ = both_run
    events = tensorboard_events(run / "tensorboard")
    tags = events.Tags()
    for tag in STEP_SCALARS + PER_REWARD:
        assert [e.step for e in events.Scalars(tag)] == [1, 2], tag
    rows = read_metrics(run / "metrics.parquet").to_pylist()
    for step in (1, 2):
        row = next(r for r in rows if r["step"] == step and r["reward"] == "toy_shape")
        logged = {e.step: e.value for e in events.Scalars("reward/toy_shape")}
        assert logged[step] == pytest.approx(row["reward_mean"], rel=1e-6)
        kl = {e.step: e.value for e in events.Scalars("train/kl")}
        assert kl[step] == pytest.approx(row["kl"], rel=1e-6, abs=1e-12)
        stall = {e.step: e.value for e in events.Scalars("stall/toy_shape")}
        assert stall[step] == float(row["stall"]) == 0.0  # the stall series: 0/1 as flagged (2 steps: never)
    assert set(tags["images"]) == {"weights/W", "samples"}
    assert [e.step for e in events.Images("weights/W")] == [0]
    grids = events.Images("samples")
    assert [e.step for e in grids] == [1, 2]
    # 2 prompts per step, G = 2: one tile per group, each at least TILE_MIN wide, side by side
    assert grids[0].width >= 2 * TILE_MIN and grids[0].height > TILE_MIN
    assert "samples/text_summary" in tags["tensors"]


def test_wandb_offline_run_holds_the_scalars_W_and_sample_grids_under_the_run_folder_name(both_run):
    run, wandb_dir = both_run
    records = wandb_records(wandb_dir)
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"][:1]
    assert start.display_name == run.name and start.project == "recast-test"
    assert start.run_id == wandb_run_id(run)
    assert list(start.tags) == ["static", "seed0", "tiny"]  # mode, seed, setting (not a study's runs/: no group)
    config = {item.key: item.value_json for item in start.config.update}
    assert '"static"' in config["mode"] and "toy_color" in config["train"]
    history = wandb_history(records)
    assert sorted(history) == [0, 1, 2]
    assert history[0]["weights/W/_type"] == '"image-file"'
    for step in (1, 2):
        assert set(STEP_SCALARS + PER_REWARD) <= set(history[step]), step
        assert history[step]["samples/_type"] == '"image-file"'
        assert "toy_sharpness" in history[step]["samples/caption"]
    rows = read_metrics(run / "metrics.parquet").to_pylist()
    last = next(r for r in rows if r["step"] == 2 and r["reward"] == "toy_color")
    assert float(history[2]["reward/toy_color"]) == pytest.approx(last["reward_mean"], rel=1e-9)
    assert float(history[2]["train/clip_frac"]) == pytest.approx(last["clip_frac"], rel=1e-9, abs=1e-12)
    media = sorted(p.name for p in wandb_dir.glob("wandb/offline-run-*/files/media/images/**/*.png"))
    assert len(media) == 3


def test_the_api_key_is_written_nowhere(both_run):
    run, wandb_dir = both_run
    files = [p for folder in (run, wandb_dir) for p in folder.rglob("*") if p.is_file()]
    assert len(files) > 10
    assert not [p for p in files if SECRET.encode() in p.read_bytes()]


def cli_train(setting: Path, out: Path, *extra: str):
    return runner.invoke(app, ["train", "--setting", str(setting), "--weights", "static", "--out", str(out),
                               "--max-steps", "1", "--device", "cpu", "--quiet", *extra])


@pytest.mark.parametrize("how", ["not installed", "init raises"])
def test_a_logger_that_fails_to_start_is_one_warning_line_and_the_run_trains(setting, tmp_path, monkeypatch, how):
    if how == "not installed":
        monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb → ImportError
        reason = "ModuleNotFoundError"
    else:
        wandb = pytest.importorskip("wandb")

        def refuse(**kwargs):
            raise RuntimeError("api_key not configured (no-tty)\ncall wandb.login(key=...)")

        monkeypatch.setattr(wandb, "init", refuse)
        reason = "RuntimeError: api_key not configured (no-tty)"
    result = cli_train(setting, tmp_path / "run", "--set", 'logger=["wandb", "tensorboard"]')
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recast: warning: logger wandb did not start ("), lines
    assert reason in lines[0] and "training goes on without it" in lines[0]
    assert "trained step 1" in result.stdout
    assert sorted({r["step"] for r in read_metrics(tmp_path / "run" / "metrics.parquet").to_pylist()}) == [1]
    assert [e.step for e in tensorboard_events(tmp_path / "run" / "tensorboard").Scalars("train/kl")] == [1]


@pytest.mark.parametrize("given, needle", [
    ('logger=["tensorbord"]', "unknown logger 'tensorbord'; known: tensorboard, wandb"),
    ('logger=["wandb", "wandb"]', "a logger named twice"),
    ("log_images_every=-1", "log_images_every must be an integer from 0 to 1000000, got -1"),
])
def test_a_bad_logger_key_on_the_command_line_is_one_line_exit_2_nothing_written(setting, tmp_path, given, needle):
    result = cli_train(setting, tmp_path / "run", "--set", given)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_an_unknown_logger_in_a_setting_is_one_line_from_check_setting(tmp_path):
    path = tiny_train_setting(tmp_path, 'logger = ["tensorboard", "mlflow"]\n')
    result = runner.invoke(app, ["check-setting", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown logger 'mlflow'" in lines[0] and "tiny.toml" in lines[0], lines


def test_logger_keys_parse_and_stay_out_of_the_run_key(setting):
    cfg = config_from_setting(load_setting(str(setting)))
    assert cfg.logger == ("tensorboard",) and cfg.log_images_every == 10 and cfg.wandb_project == "recast"
    other = apply_overrides(cfg, ["logger=wandb", "log_images_every=5", 'wandb_project="p"'], {})
    assert other.logger == ("wandb",) and other.log_images_every == 5 and other.wandb_project == "p"
    assert other.run_key() == cfg.run_key()
    assert apply_overrides(cfg, ["logger=[]"], {}).logger == ()
    assert 'logger = ["wandb"]' in other.to_toml() and "log_images_every = 5" in other.to_toml()
    with pytest.raises(BadInput, match="wandb_project"):
        check_config(replace(cfg, wandb_project=" "))


def test_an_empty_logger_list_writes_metrics_alone(setting, tmp_path):
    run = train_run(setting, tmp_path / "run", steps=1, logger=(), log_images_every=1)
    assert (run / "metrics.parquet").is_file()
    assert not (run / "tensorboard").exists() and not (run / "wandb").exists()


def test_flow1d_samples_go_to_the_loggers_as_a_histogram(tmp_path):
    (tmp_path / "prompts.txt").write_text("x\n")
    path = tmp_path / "flow.toml"
    path.write_text('[policy]\nkind = "flow1d"\nsteps = 4\nnoise_level = 0.7\n\n[train]\n'
                    'rewards = ["coarse", "fine"]\nlambda = [1, 1]\nprompts = "prompts.txt"\ntrain_fraction = 1.0\n'
                    'lora_rank = 0\ngroup_size = 4\nprompts_per_step = 2\nmicro_batch = 32\nsample_batch = 8\n'
                    'beta_kl = 0.0\nsave_every = 2\nlog_images_every = 2\n')
    run = train_run(path, tmp_path / "run", steps=2)
    events = tensorboard_events(run / "tensorboard")
    assert events.Tags()["images"] == ["weights/W"]
    (hist,) = events.Histograms("samples/x0")
    assert hist.step == 2 and hist.histogram_value.num == 8  # rank 0's 2 groups × G = 4 samples
    assert [e.step for e in events.Scalars("reward_std/fine")] == [1, 2]


class Recorder:
    """A logger that keeps what it is given; ``broken`` names the one method that raises."""

    def __init__(self, broken: str = ""):
        self.broken, self.calls = broken, []

    def _record(self, method: str, *args) -> None:
        if method == self.broken:
            raise OSError("No space left on device")
        self.calls.append((method, *args))

    def scalars(self, step, values):
        self._record("scalars", step, dict(values))

    def image(self, step, key, image, caption):
        self._record("image", step, key, image.shape)

    def histogram(self, step, key, values):
        self._record("histogram", step, key, len(values))

    def close(self):
        self._record("close")


def test_a_logger_that_fails_mid_run_is_one_warning_then_dropped(capsys):
    good, bad = Recorder(), Recorder(broken="scalars")
    loggers = RunLoggers({"tensorboard": good, "wandb": bad})
    loggers.scalars(1, {"train/kl": 0.5})
    loggers.scalars(2, {"train/kl": 0.25})
    loggers.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["recast: warning: logger wandb failed to log (OSError: No space left on device); "
                     "training goes on without it"]
    assert good.calls == [("scalars", 1, {"train/kl": 0.5}), ("scalars", 2, {"train/kl": 0.25}), ("close",)]
    assert bad.calls == []


def test_a_picture_that_cannot_be_drawn_is_one_warning_and_the_loggers_stay(tmp_path, capsys):
    good = Recorder()
    log = MetricsLog(tmp_path, {}, RunLoggers({"tensorboard": good}))

    def decode(latents):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    log.log_samples(3, decode, torch.zeros(4, 16, 4, 4), ["a"] * 4, torch.zeros(4, 1), ["r"], 2)
    log.add(3, {"r": {"reward_mean": 0.5, "reward_std": 0.1, "adv_abs": [0.0]}}, {"kl": 0.0}, [0.0])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("recast: warning: the samples of step 3 could not be drawn")
    assert "OutOfMemoryError: CUDA out of memory" in err[0]
    assert good.calls == [("scalars", 3, {"train/kl": 0.0, "reward/r": 0.5, "reward_std/r": 0.1})]


def test_start_loggers_warns_once_for_a_logger_that_does_not_start(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    loggers = start_loggers(["wandb", "tensorboard"], tmp_path, "recast", {})
    assert list(loggers.loggers) == ["tensorboard"]
    loggers.close()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_sample_grid_puts_each_image_pixel_for_pixel_over_its_caption():
    gen = np.random.default_rng(0)
    images = gen.random((3, 3, 32, 32))
    grid = sample_grid(images, ["a red circle on a white background", "b", "c"],
                       np.array([[0.5, 0.25], [0.1, 0.2], [0.3, 0.4]]), ["toy_color", "toy_shape"])
    scale = TILE_MIN // 32
    assert grid.dtype == np.uint8 and grid.shape[2] == 3 and grid.shape[1] >= 3 * TILE_MIN
    tile = grid[4: 4 + TILE_MIN, 4: 4 + TILE_MIN]
    expected = (images[0].transpose(1, 2, 0) * 255).round().astype(np.uint8).repeat(scale, 0).repeat(scale, 1)
    assert np.array_equal(tile, expected)
    below = grid[4 + TILE_MIN: 4 + TILE_MIN + 40, 4: 4 + TILE_MIN]
    assert (below < 128).any()  # the caption's text is drawn under the tile
    assert grid_picks(10, 4) == [0, 4, 8] and len(grid_picks(1000, 2)) == 16


def test_the_W_heatmap_is_an_rgb_image_that_shows_the_rows():
    flat = weights_heatmap(np.full((2, 5), 0.1), ["a", "b"], 5)
    peaked = weights_heatmap(np.array([[0.0, 0.0, 0.0, 0.0, 0.5], [0.2, 0.2, 0.2, 0.2, 0.0]]), ["a", "b"], 5)
    assert flat.dtype == np.uint8 and flat.ndim == 3 and flat.shape[2] == 3 and flat.shape == peaked.shape
    assert not np.array_equal(flat, peaked)


def test_the_wandb_run_id_is_the_run_folders_own(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run.json").write_text('{"created_at": "1"}')
    first = wandb_run_id(tmp_path / "a")
    assert wandb_run_id(tmp_path / "a") == first  # a resumed run logs into the same W&B run
    (tmp_path / "a" / "run.json").write_text('{"created_at": "2"}')  # restarted in place: a new one
    assert wandb_run_id(tmp_path / "a") != first


def test_a_study_run_is_grouped_by_study_and_budget_and_tagged_with_its_mode_and_seed(tmp_path):
    config = {"mode": "recast", "train": {"seed": 3}, "setting": "pipelines/ocr.toml"}
    labels = wandb_labels(tmp_path / "artifacts" / "ocr" / "runs" / "1-1-1-2" / "recast-s3", config)
    assert labels == {"name": "1-1-1-2/recast-s3", "group": "ocr/1-1-1-2", "tags": ["recast", "seed3", "ocr"]}
    assert wandb_labels(tmp_path / "my-run", config) == {"name": "my-run", "group": None,
                                                          "tags": ["recast", "seed3", "ocr"]}
