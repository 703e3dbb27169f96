"""The in-process ``recast`` calls the CLI tests share: run a command, require success, or require the one
error line of bad input (exit 2, one line on stderr holding every needle)."""

from __future__ import annotations

from typer.testing import CliRunner

from recast_cli.cli import app

runner = CliRunner()


def invoke(*args):
    """``recast ARGS`` in this process (each argument as text)."""
    return runner.invoke(app, [str(a) for a in args])


def run_ok(*args):
    """``recast ARGS``, which must exit 0."""
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def one_line(result, *needles: str) -> str:
    """Exit 2 and one line on stderr holding every needle, no traceback; returns the line."""
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]
