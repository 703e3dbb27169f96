"""The ``recast`` command: a thin Typer shell over the stage functions.

Conventions every command follows (ARCHITECTURE.md, "CLI contract"): exit 0 on success;
bad input prints one line on stderr and exits 2 with nothing written; anything else is an
internal error (exit 1).
"""

import functools
import importlib
import math
import signal
import sys
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from recast_cli import __version__, threads
from recast_cli.processes import Stopped, raising_on_stop, signal_name
from recast_cli.errors import ERROR_LINE_LIMIT, BadInput, cut
from recast_cli.solve.sinkhorn import SinkhornError

# Click's exceptions, wherever this Typer takes Click from (newer releases vendor it).
click_errors = importlib.import_module(typer.BadParameter.__module__)

out = Console()


#: ``recast --help`` lists the commands in the order of the pipeline, then the tools.
COMMAND_ORDER = ("sample-positive", "estimate", "merge", "compare-gains", "solve-w", "train", "evaluate", "report",
                 "study-makefile", "study", "check-setting", "fetch", "preflight", "inspect", "plot", "sample", "tiny-model",
                 "score", "serve-reward", "serve-judges",
                 "judge", "toy")


class RecastGroup(TyperGroup):
    """Turns every user error, Click's and ours, into one line on stderr and exit code 2."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            finite_floats(command)
        return command

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            with raising_on_stop():
                code = super().main(args=args, prog_name=prog_name or "recast", complete_var=complete_var,
                                    standalone_mode=False, **extra)
        except Stopped as exc:  # SIGINT, SIGTERM or SIGHUP: every clean-up has run on the way here
            code = _fail(f"recast: stopped by {signal_name(exc.signum)}", exc.code)
        except click_errors.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else "recast"
            code = _fail(f"{where}: error: {exc.format_message()}", 2)
        except click_errors.ClickException as exc:
            code = _fail(f"recast: error: {exc.format_message()}", exc.exit_code)
        except BadInput as exc:
            code = _fail(f"recast: error: {exc}", 2)
        except SinkhornError as exc:
            code = _fail(f"recast: solver error: {exc}", 1)
        except typer.Abort:
            code = _fail("recast: aborted", 1)
        finally:
            if "recast_cli.artifacts.locks" in sys.modules:  # a command claimed outputs: their locks end with it
                sys.modules["recast_cli.artifacts.locks"].release_output_locks()
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def finite_floats(command: Any) -> None:
    """Make ``command`` (and, for a group such as ``toy``, each of its commands) refuse a float option
    or argument that is ``inf`` or ``nan`` before it runs: Click reads ``--beta inf`` as a float, and
    no quantity of recast means anything at infinity (BadInput naming the option). Ctrl-C in a command
    becomes :class:`Stopped` (SIGINT), ended as SIGTERM and SIGHUP are: one line, exit 130. Applied once."""
    for sub in getattr(command, "commands", {}).values():
        finite_floats(sub)
    callback = getattr(command, "callback", None)
    if callback is None or getattr(callback, "_finite_floats", False):
        return

    @functools.wraps(callback)
    def checked(*args: Any, **params: Any) -> Any:
        for param in command.params:
            value = params.get(param.name)
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(item, float) and not math.isfinite(item):
                    name = max(param.opts, key=len) if param.opts else param.name
                    raise BadInput(f"{name} {item}: must be a finite number")
        try:
            return callback(*args, **params)
        except KeyboardInterrupt:  # Ctrl-C: ends recast as SIGTERM does (Click would swallow it silently)
            raise Stopped(signal.SIGINT) from None

    checked._finite_floats = True  # type: ignore[attr-defined]
    command.callback = checked


def _fail(message: str, code: int) -> int:
    line = cut(" ".join(message.split()), ERROR_LINE_LIMIT)  # the last guard against a quoted huge value
    if not line.endswith("error:"):  # Click's "no arguments: show help" carries no message
        sys.stderr.write(line + "\n")
    return code


app = typer.Typer(
    cls=RecastGroup,
    name="recast",
    help="ReCAST: per-reward credit assignment across denoising timesteps for online diffusion RL.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts name tables as [study]: shown as written, not read as markup
)


def _version(value: bool) -> None:
    if value:
        out.print(f"recast {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Stage 1 measures (positives → gains → W), stage 2 uses (train → evaluate → report)."""


# Every stage's commands, registered in pipeline order (``recast --help`` sorts by COMMAND_ORDER).
from recast_cli.positives.commands import register as register_positives  # noqa: E402
from recast_cli.estimate.commands import register as register_estimate  # noqa: E402
from recast_cli.solve.commands import register as register_solve  # noqa: E402
from recast_cli.train.commands import register as register_train  # noqa: E402
from recast_cli.evaluate.commands import register as register_evaluate  # noqa: E402
from recast_cli.report.commands import register as register_report  # noqa: E402
from recast_cli.inspect.commands import register as register_inspect  # noqa: E402
from recast_cli.study.commands import register as register_study  # noqa: E402
from recast_cli.preflight.commands import register as register_preflight  # noqa: E402
from recast_cli.fetch.commands import register as register_fetch  # noqa: E402
from recast_cli.policy.commands import register as register_policy  # noqa: E402
from recast_cli.rewards.commands import register as register_rewards  # noqa: E402
from recast_cli.toy.commands import register as register_toy  # noqa: E402

for register in (register_positives, register_estimate, register_solve, register_train, register_evaluate,
                 register_report, register_inspect, register_study, register_preflight, register_fetch, register_policy,
                 register_rewards,
                 register_toy):
    register(app)


def main() -> None:
    try:
        threads.apply()  # before any command imports torch (recast_cli/threads.py has the rule)
    except BadInput as exc:
        sys.exit(_fail(f"recast: error: {exc}", 2))
    app()
