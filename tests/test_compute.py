"""The FLOP count of a training step (recast_cli/preflight/compute.py, docs/gpu.md "Compute"), checked against
PyTorch's own counter on a real forward pass of an SD3-architecture transformer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from recast_cli.preflight.budget import study_compute, table
from recast_cli.preflight.compute import forward_flops, step_compute
from recast_cli.setting.load import load_setting
from recast_cli.train.config import config_from_setting


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    from diffusers import SD3Transformer2DModel

    from recast_cli.policy.tiny import write_tiny_model

    folder = tmp_path_factory.mktemp("tiny") / "sd3"
    write_tiny_model("sd3", folder)
    return SD3Transformer2DModel.from_pretrained(Path(folder) / "transformer")


@pytest.mark.parametrize(("side", "text_tokens"), [(16, 20), (8, 7)])
def test_the_count_equals_torchs_flop_counter_on_a_forward_pass(transformer, side, text_tokens):
    c = transformer.config
    inputs = {"hidden_states": torch.randn(1, c.in_channels, side, side),
              "encoder_hidden_states": torch.randn(1, text_tokens, c.joint_attention_dim),
              "pooled_projections": torch.randn(1, c.pooled_projection_dim), "timestep": torch.tensor([500.0])}
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        transformer(**inputs)  # the math attention: its matmuls are counted too
    counted = forward_flops(transformer, (side // c.patch_size) ** 2, text_tokens)
    assert counted["total"] == counter.get_total_flops()
    assert counted["attention"] > 0


def test_a_step_of_the_paper_recipe_and_of_the_pilot(transformer):
    ocr, pilot = (load_setting(name) for name in ("ocr", "ocr-pilot"))
    steps = {name: step_compute(transformer, s.policy, config_from_setting(s), 9) for name, s in
             (("ocr", ocr), ("pilot", pilot))}
    assert steps["ocr"]["images_per_step"] == 1152 and steps["ocr"]["cfg_passes"] == 2
    assert (steps["ocr"]["image_tokens"], steps["ocr"]["text_tokens"]) == (1024, 77 + 128)
    per_image = steps["ocr"]["sample_flops_per_image"] + steps["ocr"]["train_flops_per_image"]
    assert steps["ocr"]["flops_per_step"] == 1152 * per_image
    # 10 sampling steps and 9 trained (forward + backward) steps, each with classifier-free guidance
    assert per_image == steps["ocr"]["forward_flops"] * 2 * (10 + 9 * 2)
    assert steps["pilot"]["flops_per_step"] * 6 == steps["ocr"]["flops_per_step"]  # 192 images a step


def test_the_paper_study_and_the_pilot_in_flop_and_time():
    paper, pilot = study_compute("ocr"), study_compute("ocr-pilot")
    assert (paper["runs"], paper["steps"]) == (45, 60 + 45 * 180) and (pilot["runs"], pilot["steps"]) == (2, 140)
    assert paper["train_flops"] == paper["steps"] * paper["step"]["flops_per_step"]
    assert 1.2e17 < paper["step"]["flops_per_step"] < 1.7e17  # SD3.5-M: 2.2e12 a forward pass at 512 px
    shown = table(["ocr", "ocr-pilot"])
    assert "| `ocr` | 1152 |" in shown and "| `ocr-pilot` | 192 |" in shown and "H100" in shown


def _record(**over):
    """The parts of a recast.preflight/1 record the budget reads, as `make gpu-preflight` writes them for the
    ocr setting on an H100 (the seconds are chosen for the arithmetic, not measured)."""
    record = {"schema": "recast.preflight/1", "setting": "/node/recast/pipelines/ocr.toml", "scale": "full",
              "device": "cuda:0 (NVIDIA H100 80GB HBM3)",
              "phases": {"train": {"eager": {"images": 24, "sample_seconds": 30.0, "update_seconds": 90.0,
                                             "fits": True},
                                   "compile": {"error": "compile failed", "fits": False}}}}
    record.update(over)
    return record


def test_the_measured_column_is_the_preflight_step_scaled_to_the_setting(tmp_path, capsys):
    from recast_cli.preflight.budget import PEAK_BF16, _duration, main, measured_step

    measured = measured_step(_record(), "ocr")
    assert measured["run"] == "eager" and measured["seconds_per_image"] == 120.0 / 24  # compile did not fit
    paper = study_compute("ocr")
    per_step = 5.0 * paper["step"]["images_per_step"]  # 1152 images at 5 s each
    rate = paper["step"]["flops_per_step"] / per_step
    shown = table(["ocr", "ocr-pilot"], measured)
    assert "measured on cuda:0 (NVIDIA H100 80GB HBM3) (eager)" in shown
    assert (per_step, _duration(per_step), _duration(per_step * paper["steps"])) == (5760.0, "96.0 min", "544.0 days")
    assert f"| 96.0 min / 544.0 days / {rate:.3g} ({rate / PEAK_BF16['H100']:.0%}) |" in shown
    path = tmp_path / "preflight.json"
    path.write_text(__import__("json").dumps(_record()))
    assert main(["ocr", "--preflight", str(path)]) == 0 and "measured on cuda:0" in capsys.readouterr().out


@pytest.mark.parametrize(("over", "needle"), [
    ({"scale": "tiny", "device": "cpu"}, "measured at full scale on a GPU"),
    ({"setting": "/x/pipelines/geneval.toml"}, "the record is of /x/pipelines/geneval.toml"),
    ({"phases": {"train": {"eager": {"error": "CUDA out of memory", "fits": False}}}}, "no step that ran and fit"),
    ({"schema": "recast.eval/1"}, "not a recast.preflight/1 record"),
])
def test_a_record_that_measured_something_else_is_one_line(tmp_path, capsys, over, needle):
    from recast_cli.preflight.budget import main

    path = tmp_path / "preflight.json"
    path.write_text(__import__("json").dumps(_record(**over)))
    assert main(["ocr", "--preflight", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
