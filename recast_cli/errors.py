"""The error the CLI turns into one line on stderr and exit code 2, and how it quotes user values."""

from __future__ import annotations

from typing import Any

#: The most characters of one user value an error message quotes (a prompt, a TOML value, a flag).
ECHO_LIMIT = 200
#: The most characters of one printed error line: the CLI's last guard against a message that
#: quotes a huge value whole (the longest honest message lists the ~40 [train] keys).
ERROR_LINE_LIMIT = 1000


class BadInput(ValueError):
    """Input the user can fix: a bad flag value, a malformed artifact, an unwritable path.

    The message is one line that names the problem; the CLI prints it and exits with 2.
    """


def cut(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` whole when it has at most ``limit`` characters, else its start and how much was cut:
    a 10 MB prompt line is named in an error, not printed."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def shown(value: Any, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters; an integer too long for
    ``repr`` (Python refuses beyond 4300 digits) is described by its size instead."""
    try:
        text = repr(value)
    except ValueError:
        return f"an integer of {value.bit_length()} bits"
    return cut(text, limit)


def refuse_duplicates(names, what: str) -> None:
    """BadInput naming the first name that ``names`` lists twice (``what``: where they came from, e.g.
    ``--rewards``). A list of rewards or judges names each once: a repeat would be computed twice and
    then collide in the table's columns, after all the work."""
    seen = set()
    for name in names:
        if name in seen:
            raise BadInput(f"{what} names {name!r} twice; name each once")
        seen.add(name)
