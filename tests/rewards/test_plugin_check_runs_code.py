"""Issue 51, item 17: checking a setting imports its plug-in rewards (their top-level code runs), which is
the plug-in design; docs/settings.md and docs/rewards.md say so, and this is what they describe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.train.conftest import tiny_train_setting

ROOT = Path(__file__).resolve().parents[2]


def test_check_setting_and_fetch_dry_run_run_a_plugins_top_level_code_as_the_docs_say(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    marker = tmp_path / "imported"
    (plugins / "loud_rewards.py").write_text(
        f"open({str(marker)!r}, 'a').write('imported\\n')\n"
        "from recast_cli.toy.rewards import ToyColor as Loud\n")
    setting = tiny_train_setting(tmp_path)
    assert "[evaluate]" not in setting.read_text()
    setting.write_text(setting.read_text() + '\n[evaluate]\njudges = ["loud_rewards:Loud"]\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(ROOT)]), "HF_HUB_OFFLINE": "1"}
    for command in (["check-setting", str(setting)], ["fetch", str(setting), "--dry-run"]):
        marker.unlink(missing_ok=True)
        subprocess.run([sys.executable, "-m", "recast_cli", *command], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
        assert marker.exists(), f"recast {command[0]} did not import the plug-in"
    said = " ".join((ROOT / "docs" / "settings.md").read_text(encoding="utf-8").split())
    assert "Checking a setting runs its plug-ins' code." in said
    assert "`recast check-setting` and `recast fetch` (`--dry-run` too) run that module's top-level code" in said
    assert "Checking a setting runs its plug-ins' code" in " ".join(
        (ROOT / "docs" / "rewards.md").read_text(encoding="utf-8").split())
