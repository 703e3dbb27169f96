"""`recast.run/1`: a run folder's run.json, written and read by one torch-free module (artifacts/run.py)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recast_cli.artifacts import (
    CHECKPOINT_SCHEMA,
    RUN_SCHEMA,
    RunRecord,
    RunRecordError,
    list_checkpoints,
    read_run,
    step_dir,
    write_run,
)
from recast_cli.artifacts.run import RunCheckpoint, find_checkpoint, run_checkpoint
from recast_cli.errors import BadInput
from tests.test_cli import recast

RECORD = RunRecord(rewards=("toy_color", "toy_shape"), lam=(1, 2.5), mode="recast", sigmas=(1.0, 0.5, 0.0))
CONFIG = {"setting": "/settings/toy.toml", "weights": "/w/W.safetensors", "weights_key": "abc", "run_key": "rk",
          "train": {"seed": 3, "max_steps": 4}, "T": 2, "processes": 1}


def written_run(folder: Path, tmp_path: Path) -> Path:
    setting = tmp_path / "toy.toml"
    setting.write_text("[policy]\n")
    folder.mkdir()
    write_run(folder, RECORD, config=CONFIG, sources=[setting])
    return folder


def test_a_written_record_reads_back_whole(tmp_path):
    run = written_run(tmp_path / "run", tmp_path)
    record = read_run(run)
    assert (record.rewards, record.lam, record.mode, record.sigmas) == (RECORD.rewards, RECORD.lam, RECORD.mode,
                                                                       RECORD.sigmas)
    assert record.config == CONFIG and record.setting == "/settings/toy.toml"
    assert record.provenance.schema == RUN_SCHEMA
    assert [s.path for s in record.provenance.sources] == [str(tmp_path / "toy.toml")]
    text = (run / "run.json").read_text()
    assert text.endswith("}\n") and json.loads(text)["lambda"] == [1, 2.5]  # λ as the setting gave it


def test_a_folder_without_run_json_is_not_a_run(tmp_path):
    with pytest.raises(RunRecordError, match="not a recast train run folder \\(no run.json\\)") as caught:
        read_run(tmp_path)
    assert caught.value.problem == "missing"


@pytest.mark.parametrize("content, problem, tag", [
    ({"schema": "something/else", "config": {}}, "schema", "something/else"),
    ([1, 2], "object", None),
])
def test_a_run_json_of_another_schema_is_refused_with_its_tag(tmp_path, content, problem, tag):
    (tmp_path / "run.json").write_text(json.dumps(content))
    with pytest.raises(RunRecordError, match=f"schema tag is {tag!r}, expected 'recast.run/1'") as caught:
        read_run(tmp_path)
    assert (caught.value.problem, caught.value.tag) == (problem, tag)


def test_a_fake_run_json_is_not_json(tmp_path):
    (tmp_path / "run.json").write_text("not { json")
    with pytest.raises(RunRecordError, match="run.json: not a JSON file") as caught:
        read_run(tmp_path)
    assert caught.value.problem == "json"


@pytest.mark.parametrize("change, problem, message", [
    (lambda r: r.pop("config"), "config", "'config' must be a JSON object"),
    (lambda r: r["config"].pop("setting"), "setting", "names no setting (config.setting)"),
    (lambda r: r.pop("mode"), "mode", "has no 'mode'"),
    (lambda r: r.update(mode="sideways"), "fields", "mode 'sideways' is not one of recast, nosink"),
    (lambda r: r.pop("sigmas"), "fields", "the record is missing 'sigmas'"),
    (lambda r: r.update(rewards=[1, 2]), "fields", "'rewards' must be a list of reward names"),
    (lambda r: r.update(sources="x"), "fields", "'sources' must be a list"),
])
def test_a_record_missing_what_readers_need_names_it(tmp_path, change, problem, message):
    run = written_run(tmp_path / "run", tmp_path)
    raw = json.loads((run / "run.json").read_text())
    change(raw)
    (run / "run.json").write_text(json.dumps(raw))
    with pytest.raises(RunRecordError, match=re.escape(message)) as caught:
        read_run(run)
    assert caught.value.problem == problem


def test_write_run_refuses_a_record_it_could_not_read_back(tmp_path):
    bad = RunRecord(rewards=("toy_color",), lam=(1.0,), mode="sideways", sigmas=(1.0, 0.0))
    with pytest.raises(RunRecordError, match="mode 'sideways'"):
        write_run(tmp_path, bad, config=CONFIG)
    assert not (tmp_path / "run.json").exists()


def test_checkpoints_are_listed_complete_and_oldest_first_without_torch(tmp_path):
    for step, complete in ((10, True), (2, True), (12, False)):
        step_dir(tmp_path, step).mkdir(parents=True)
        if complete:
            (step_dir(tmp_path, step) / "manifest.json").write_text("{}")
    (tmp_path / "checkpoints" / ".step-000014.x.tmp").mkdir()
    assert list_checkpoints(tmp_path) == [(2, step_dir(tmp_path, 2)), (10, step_dir(tmp_path, 10))]
    probe = subprocess.run([sys.executable, "-c", "import sys, recast_cli.artifacts.run; print('torch' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "False"


def fake_checkpoint(run: Path, step: int) -> Path:
    """A complete checkpoint folder laid out as ``save_checkpoint`` lays it out (bytes stand in for tensors)."""
    folder = step_dir(run, step)
    (folder / "adapter").mkdir(parents=True)
    files = {"adapter/pytorch_lora_weights.safetensors": b"lora", "state.safetensors": b"state", "state.json": b"{}"}
    for rel, data in files.items():
        (folder / rel).write_bytes(data)
    digests = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    (folder / "manifest.json").write_text(json.dumps({"schema": CHECKPOINT_SCHEMA, "step": step, "files": digests}))
    return folder


def test_one_resolver_names_a_runs_checkpoint_verified_under_its_setting_without_torch(tmp_path):
    setting = tmp_path / "toy.toml"
    setting.write_text("[policy]\n")
    run = tmp_path / "run"
    run.mkdir()
    write_run(run, RECORD, config={**CONFIG, "setting": str(setting)})
    with pytest.raises(BadInput, match=r"^--run R: the run has no complete checkpoint yet$"):
        run_checkpoint(run, "--run R")
    first, last = fake_checkpoint(run, 1), fake_checkpoint(run, 2)
    found = run_checkpoint(run, "--run R")
    assert (found.folder, found.step, found.run, found.record.setting) == (last, 2, run, str(setting))
    assert run_checkpoint(run, "--run R", step=1).folder == first
    with pytest.raises(BadInput, match=r"^--run R: no checkpoint of step 7 \(it has 1, 2\)$"):
        run_checkpoint(run, "--run R", step=7)
    # a run folder, or one of its checkpoint folders; anything else is the caller's to word
    assert find_checkpoint(run, "--policy R") == found
    assert find_checkpoint(first, "--policy R") == RunCheckpoint(first, 1, run, found.record)
    assert find_checkpoint(first / "adapter", "--policy R") is None and find_checkpoint(tmp_path / "x", "-") is None
    setting.unlink()
    with pytest.raises(BadInput, match=r"^--policy R: the run's setting .*toy.toml \(from .*run.json\) is not there$"):
        find_checkpoint(first, "--policy R")
    # without its record (a LoRA to apply, --init): a run is its checkpoints/, a checkpoint any folder with a manifest
    (run / "run.json").unlink()
    with pytest.raises(BadInput, match=r"^--policy R: not a recast train run folder \(no run.json\)$"):
        find_checkpoint(run, "--policy R")
    assert find_checkpoint(run, "--init R", record=False) == RunCheckpoint(last, 2, run)
    (first / "state.json").write_bytes(b"{ }")
    with pytest.raises(BadInput, match="is corrupt: state.json does not match its sha256 in manifest.json"):
        find_checkpoint(first, "--init R", record=False)
    assert find_checkpoint(first, "--init R", record=False, verify=False) == RunCheckpoint(first, 1)


def test_inspect_shows_a_written_run_folder(tmp_path):
    run = written_run(tmp_path / "run", tmp_path)
    result = recast("inspect", run, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["schema"], summary["kind"], summary["mode"], summary["rewards"], summary["lambda"]) == (
        RUN_SCHEMA, "run", "recast", ["toy_color", "toy_shape"], [1, 2.5])
    assert (summary["T"], summary["seed"], summary["checkpoints"], summary["metrics"]) == (2, 3, [], None)
