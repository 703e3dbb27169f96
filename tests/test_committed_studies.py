"""A committed study is reproducible from the repository alone: its analysis, run on the committed data,
writes the committed results byte for byte (issue 42 §1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LADDER = ROOT / "docs" / "results" / "ladder"


def test_the_ladder_analysis_rewrites_its_committed_results(tmp_path):
    (tmp_path / "data").symlink_to(LADDER / "data", target_is_directory=True)
    subprocess.run([sys.executable, str(LADDER / "analyse.py"), str(tmp_path)], check=True, capture_output=True)
    assert (tmp_path / "results.md").read_text() == (LADDER / "results.md").read_text()


TRUST = ROOT / "docs" / "results" / "trust"


def test_the_trust_analysis_rewrites_its_committed_results(tmp_path):
    (tmp_path / "data").symlink_to(TRUST / "data", target_is_directory=True)
    (tmp_path / "budget.csv").symlink_to(TRUST / "budget.csv")
    subprocess.run([sys.executable, str(TRUST / "analyse.py"), str(tmp_path)], check=True, capture_output=True)
    assert (tmp_path / "results.md").read_text() == (TRUST / "results.md").read_text()
