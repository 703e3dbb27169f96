"""The published packages' checks (``test_isolated_scorers.py``) in their side environment, from the main suite.

``make test`` builds the side package sets of imagereward and hpsv3 (``.side/ir``, ``.side/hps``: they pin
transformers 4.x, so they cannot be on this process's path). Here a pytest of its own runs the isolated
checks with them on PYTHONPATH, so the adapters are compared with the real packages in every ``make test``
(and, under pytest-xdist, beside the rest of the suite rather than after it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDE = ROOT / ".side"


def test_the_adapters_score_like_the_published_packages_in_their_side_environment():
    if not all((SIDE / name / ".installed").is_file() for name in ("ir", "hps")):
        pytest.skip("the side package sets are not built (make side; make test builds them)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = f"{SIDE / 'hps'}:{SIDE / 'ir'}"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests/rewards/test_isolated_scorers.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "passed" in summary and "skipped" not in summary, summary  # every package check ran, none skipped
