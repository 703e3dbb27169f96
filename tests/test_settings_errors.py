"""Bad setting files through the real CLI: one line naming the file and the problem, exit 2, nothing written."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from recast_cli.cli import app

runner = CliRunner()

CASES = {
    "steps text": (b'[policy]\nkind = "flow1d"\nsteps = "ten"\n', '[policy] steps = "ten" is not an integer'),
    "steps bool": (b'[policy]\nkind = "flow1d"\nsteps = true\n', "[policy] steps = true is not an integer"),
    "noise text": (b'[policy]\nkind = "flow1d"\nnoise_level = "high"\n', '[policy] noise_level = "high" is not a number'),
    "hidden float": (b'[policy]\nkind = "flow1d"\nhidden = 3.5\n', "[policy] hidden = 3.5 is not an integer"),
    "typo table": (b'[policy]\nkind = "flow1d"\n\n[trian]\nmax_steps = 2\n',
                   "unknown table [trian]; known: policy, train, rewards, positives, study, evaluate"),
    "not utf-8": (b'[policy]\nkind = "flow1d"\n# caf\xe9\n', "not UTF-8 text (byte 30)"),
    "not toml": (b'[policy\nkind = 1\n', "not valid TOML"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", [
    ["check-setting"],
    ["train", "--weights", "static", "--out", "{tmp}/run"],
    ["evaluate", "--out", "{tmp}/e.parquet"],
    ["study-makefile"],
])
def test_a_bad_setting_is_one_line_naming_the_file(tmp_path, case, command):
    text, needle = CASES[case]
    setting = tmp_path / "bad.toml"
    setting.write_bytes(text)
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    args = [args[0], *(["--setting"] if args[0] != "check-setting" else []), str(setting), *args[1:]]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert str(setting) in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]
