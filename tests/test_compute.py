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
