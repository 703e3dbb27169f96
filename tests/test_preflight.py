"""``recast preflight --phases build`` through the CLI: SD3.5-Medium's real architecture on the meta
device (shipped configs), and the tiny architecture; the recast.preflight/1 JSON."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import assert_one_line_exit_2, recast

KEYS = {"schema", "recast_version", "torch", "diffusers", "setting", "scale", "device", "dtype", "engine", "phases"}


def run(tmp_path, *args):
    out = tmp_path / "pf"
    result = recast("preflight", "--out", out, *args)
    assert result.exit_code == 0, result.stderr
    record = json.loads((out / "preflight.json").read_text())
    assert set(record) == KEYS and record["schema"] == "recast.preflight/1"
    return record, result.stdout


def test_the_full_sd35_medium_architecture_is_counted_without_allocating_it(tmp_path):
    record, shown = run(tmp_path, "--setting", "ocr", "--scale", "full", "--random-weights", "--phases", "build")
    build = record["phases"]["build"]
    parts = build["components"]
    assert "shipped configs" in build["configs"]  # no SD3.5-M folder on this machine
    assert 2.2e9 <= parts["transformer"]["parameters"] <= 2.6e9
    assert parts["text_encoder_3"]["class"] == "T5EncoderModel" and parts["text_encoder_3"]["parameters"] > 4.5e9
    assert {c["class"] for c in parts.values()} >= {"SD3Transformer2DModel", "AutoencoderKL",
                                                    "CLIPTextModelWithProjection"}
    assert all(c["on_meta"] for c in parts.values()) and record["device"] == "meta"
    assert build["parameters_total"] == sum(c["parameters"] for c in parts.values())
    assert build["lora_rank"] == 32 and 0 < build["trainable"] < 0.02 * parts["transformer"]["parameters"]
    assert build["weights_bytes"] == 2 * build["parameters_total"]  # the setting trains in bf16
    assert "SD3Transformer2DModel" in shown and "LoRA r = 32" in shown


def test_the_tiny_scale_runs_the_same_code_at_cpu_size(tmp_path):
    record, _ = run(tmp_path, "--setting", "ocr", "--scale", "tiny", "--phases", "build")
    parts = record["phases"]["build"]["components"]
    assert parts["transformer"]["class"] == "SD3Transformer2DModel" and parts["transformer"]["parameters"] < 5e6
    assert record["scale"] == "tiny"


@pytest.mark.parametrize("args, needle", [
    (["--setting", "ocr", "--phases", "build,train"], "--phases train: not available yet"),
    (["--setting", "ocr", "--phases", "bild"], "--phases takes build,estimate,train,evaluate"),
    (["--setting", "ocr", "--scale", "huge"], "--scale must be one of full, tiny"),
    (["--setting", "twoscale"], "recast preflight builds sd3 policies"),
    (["--setting", "ocr", "--real-weights"], "random weights only"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needle):
    assert_one_line_exit_2(recast("preflight", "--out", tmp_path / "pf", *args), needle)
    assert not (tmp_path / "pf").exists()
