"""A tiny SD3-architecture pipeline (random weights, toy vocabulary) saved once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    from recast_cli.toy.model import build_pipeline, save_pipeline
    from recast_cli.toy.renderer import all_prompts

    words = sorted({w for p in all_prompts() for w in p.split()})
    return save_pipeline(build_pipeline(words, seed=0), tmp_path_factory.mktemp("tiny") / "model")
