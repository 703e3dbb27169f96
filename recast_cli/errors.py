"""The error the CLI turns into one line on stderr and exit code 2."""


class BadInput(ValueError):
    """Input the user can fix: a bad flag value, a malformed artifact, an unwritable path.

    The message is one line that names the problem; the CLI prints it and exits with 2.
    """
