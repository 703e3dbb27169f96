"""Helpers shared by the positives tests: the CLI runner and the one-line-exit-2 check."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from recast_cli.cli import app

runner = CliRunner()
TOY_PROMPTS = ("a red circle on a white background", "a blue square on a black background")


def recast(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def prompts_file(tmp_path: Path, prompts=TOY_PROMPTS) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n")
    return path


def assert_one_line_exit_2(result, needle: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
