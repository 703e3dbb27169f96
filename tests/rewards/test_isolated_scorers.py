"""imagereward and hpsv3 come from their published packages.

Where a package cannot import (recast's own environment: both pin transformers 4.x), the
error says how to isolate it; where it imports (a side environment, e.g. the package sets of
docs/rewards.md on PYTHONPATH), recast's adapter must score like the package itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recast_cli.errors import BadInput
from recast_cli.rewards import build_scorer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "needles"), [
    ("imagereward", ["--reward-weights imagereward=PATH", "RECAST_IMAGEREWARD_PATH", "THUDM/ImageReward/ImageReward.pt"]),
    ("hpsv3", ["--reward-weights hpsv3=PATH", "RECAST_HPSV3_PATH", "MizzenAI/HPSv3/HPSv3.safetensors"]),
])
def test_missing_weights_name_what_to_provide(empty_hf_cache, name, needles):
    with pytest.raises(BadInput) as caught:
        build_scorer(name)
    for needle in needles:
        assert needle in str(caught.value)


@pytest.mark.parametrize(("name", "module", "options"), [
    ("imagereward", "ImageReward", {"med_config": "CONFIG"}),
    ("hpsv3", "hpsv3", {}),
])
def test_a_package_that_cannot_import_points_to_the_reward_server(tmp_path, monkeypatch, name, module, options):
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\0")
    (tmp_path / "med_config.json").write_text("{}")
    options = {k: str(tmp_path / "med_config.json") for k in options}
    monkeypatch.setitem(sys.modules, module, None)  # as if the package were not installed
    with pytest.raises(BadInput, match=f"recast serve-reward {name}` there and score with {name}@http"):
        build_scorer(name, weights=weights, **options)


@pytest.mark.parametrize(("name", "module"), [("imagereward", "ImageReward"), ("hpsv3", "hpsv3")])
def test_the_adapter_scores_like_the_package_itself(tmp_path, name, module):
    pytest.importorskip(module, reason=f"{module} does not import in this environment (see docs/rewards.md)")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)}
    result = subprocess.run([sys.executable, "-m", "tests.rewards.package_checks", name, str(tmp_path)],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stdout[-2000:] + result.stderr[-2000:]
