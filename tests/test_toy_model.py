"""The shipped toy model (pipelines/toy/model): loads through the SD3 loader and is close to its data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recast_cli.setting.load import load_setting
from recast_cli.evaluate.toy_quality import quality

MODEL = Path(__file__).resolve().parents[1] / "pipelines" / "toy" / "model"


def test_shipped_model_is_in_diffusers_layout_with_its_provenance():
    assert (MODEL / "model_index.json").is_file()
    size = sum(p.stat().st_size for p in MODEL.rglob("*") if p.is_file())
    assert size <= 20 * 2**20
    provenance = json.loads((MODEL / "PROVENANCE.json").read_text())
    assert provenance["command"].startswith("recast toy pretrain")
    assert provenance["config"]["seed"] == 0 and provenance["steps_done"]["flow"] > 0
    assert load_setting("toy").policy.path == MODEL.resolve()


@pytest.fixture(scope="module")
def means(tmp_path_factory):
    return quality(MODEL, n=1, work=tmp_path_factory.mktemp("quality"))


def test_shipped_model_gets_the_colour_right(means):
    assert means["model"]["toy_color"] >= 0.8 * means["renderer"]["toy_color"]


def test_shipped_model_is_closer_to_the_renderer_than_a_random_model(means):
    for reward in ("toy_color", "toy_shape"):
        assert means["model"][reward] > means["random init"][reward] + 0.1
