"""A family is one row of the family table (recast_cli/policy/families.py): a dummy family added there alone
gets a tiny model, a setting of that kind is read with the row's default guidance, checked, sampled and
trained, and preflight says it does not build it yet (issue 52: tables instead of branches on a name)."""

from __future__ import annotations

import pytest

from recast_cli.policy.families import FAMILIES, Family, family
from recast_cli.setting.load import load_setting
from recast_cli.train.trainer import fsdp_blocks
from tests.cli_helpers import invoke, one_line, run_ok

#: The dummy: SD3's class and tiny builder under another kind, with a guidance and FSDP blocks of its own.
DUMMY = Family("sd3x", "recast_cli.policy.sd3:SD3Policy", 5.5, "recast_cli.policy.tiny:sd3_pipeline",
               ("transformer_blocks", "extra_blocks"))

SETTING = """[policy]
kind = "sd3x"
path = "model"
steps = 2
resolution = 32
max_sequence_length = 8
precision = "no"
prompt_check = "toy"

[train]
rewards = ["toy_color"]
lambda = [1]
prompts = "toy"
max_steps = 1
group_size = 2
prompts_per_step = 1
"""


@pytest.fixture
def dummy(monkeypatch, tmp_path):
    monkeypatch.setitem(FAMILIES, "sd3x", DUMMY)
    run_ok("tiny-model", "--family", "sd3x", "--out", tmp_path / "model")
    setting = tmp_path / "dummy.toml"
    setting.write_text(SETTING)
    return setting


def test_a_family_added_to_the_table_alone_runs_through_the_tools(dummy, tmp_path):
    assert load_setting(str(dummy)).policy.guidance_scale == 5.5  # the row's default guidance
    assert "sd3x" in run_ok("check-setting", dummy).stdout
    run_ok("sample", "--setting", dummy, "--prompt", "a red circle on a white background", "--n", "1",
           "--out", tmp_path / "samples", "--device", "cpu")
    assert len(list((tmp_path / "samples").rglob("*.png"))) == 1
    run_ok("train", "--setting", dummy, "--weights", "static", "--out", tmp_path / "run", "--device", "cpu",
           "--quiet")
    assert (tmp_path / "run" / "run.json").is_file()
    one_line(invoke("preflight", "--setting", dummy, "--out", tmp_path / "pf"),
             "recast preflight builds sd3 policies so far", "sd3x")


def test_the_fsdp_blocks_are_the_rows_and_a_kind_not_in_the_table_is_one_line(dummy):
    assert fsdp_blocks("sd3x") == ("transformer_blocks", "extra_blocks")  # the row's, not its class's (sd3)
    assert fsdp_blocks("flux") == ("transformer_blocks", "single_transformer_blocks")
    assert fsdp_blocks("flow1d") == ()
    del FAMILIES["sd3x"]
    one_line(invoke("check-setting", dummy), "[policy] kind must be one of sd3, flux, qwenimage")
    with pytest.raises(ValueError, match="--family must be one of sd3, flux, qwenimage"):
        family("sd3x", "--family")
