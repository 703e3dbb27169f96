"""The error the CLI turns into one line on stderr and exit code 2."""


class BadInput(ValueError):
    """Input the user can fix: a bad flag value, a malformed artifact, an unwritable path.

    The message is one line that names the problem; the CLI prints it and exits with 2.
    """


def refuse_duplicates(names, what: str) -> None:
    """BadInput naming the first name that ``names`` lists twice (``what``: where they came from, e.g.
    ``--rewards``). A list of rewards or judges names each once: a repeat would be computed twice and
    then collide in the table's columns, after all the work."""
    seen = set()
    for name in names:
        if name in seen:
            raise BadInput(f"{what} names {name!r} twice; name each once")
        seen.add(name)
