"""Every command the user-facing docs tell a user to paste exists, with the flags they give it (issue 43 §2).

The shell lines of README.md, docs/gpu.md and docs/fetch.md — every line of a ```bash block (or of a
bare block whose first word is a command), and every inline `code` span that starts with a command —
are split into commands, and each is checked against what it names, without a GPU or the network:

* ``recast SUB … --flag``: the subcommand exists and has every ``--flag`` (the Typer app itself);
* ``make TARGET VAR=…``: the Makefile has the target and reads the variable;
* ``hf SUB … --flag``: the ``hf`` command of the huggingface_hub recast installs answers ``--help`` for
  the subcommand and lists the flags (``huggingface-cli`` is not installed: it is an unknown command);
* ``pip install -e '.[extra]'``: the extras exist in pyproject.toml (``pip install 'recast[…]'``
  would install an unrelated package from the index, and is refused);
* ``python -m MODULE`` / ``python FILE`` / ``bash FILE`` / ``cp FILE …``: the module or file exists;
* ``source .venv/bin/activate``, ``accelerate launch … -m recast_cli …`` (the recast part checked),
  ``tensorboard --logdir`` (installed).

Any other command word fails the test, so a new kind of pasted line is checked by adding it here.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from functools import cache
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/gpu.md", "docs/fetch.md")
COMMANDS = ("recast", "make", "hf", "huggingface-cli", "pip", "python", "python3", "bash", "cp", "source", ".",
            "accelerate", "tensorboard", "export")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|", "&"}
BIN = Path(sys.executable).parent


def _first_word(line: str) -> str:
    words = line.split()
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    return words[0] if words else ""


def shell_lines(text: str) -> list[str]:
    """The doc's shell lines: fenced shell blocks (continuations joined) and inline spans starting with a command."""
    lines: list[str] = []
    for lang, body in re.findall(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", text, re.S | re.M):  # in a list item too
        joined = body.replace("\\\n", " ").splitlines()
        first = next((line for line in joined if line.strip() and not line.lstrip().startswith("#")), "")
        if lang in ("bash", "sh") or (lang == "" and _first_word(first) in COMMANDS):
            lines += [line for line in joined if line.strip()]
    prose = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if _first_word(span) in COMMANDS and " " in span:
            lines.append(span)
    return lines


def commands(line: str) -> list[list[str]]:
    """A line's commands: tokens split at && || ; | &, leading VAR=value assignments dropped."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:
        raise AssertionError(f"not a shell line ({exc}): {line}") from None
    out, current = [], []
    for token in [*tokens, ";"]:
        if token in SEPARATORS:
            while current and ASSIGNMENT.match(current[0]):
                current = current[1:]
            if current:
                out.append(current)
            current = []
        else:
            current.append(token)
    return out


# --------------------------------------------------------------------------- what each command names


@cache
def recast_group():
    from recast_cli.cli import app

    return typer.main.get_command(app)


def check_recast(words: list[str]) -> str | None:
    if words[:1] in (["…"], ["..."]):  # prose: "every `recast …` command"
        return None
    command, i = recast_group(), 0
    while hasattr(command, "commands") and i < len(words) and words[i] in command.commands:
        command, i = command.commands[words[i]], i + 1
    if hasattr(command, "commands"):  # a group (typer's own click): no subcommand named
        return f"no such recast command: {' '.join(words[:i + 1])}"
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    for word in words[i:]:
        if word == "--":  # the end of its options: what follows is the command it runs (serve-judges)
            break
        for part in word.strip("[]").split("|"):
            flag = part.strip("[]").split("=")[0]
            if flag.startswith("--") and flag not in known:
                return f"recast {' '.join(words[:i])} has no option {flag}"
    return None


@cache
def makefile() -> str:
    return (ROOT / "Makefile").read_text()


def check_make(words: list[str]) -> str | None:
    text = makefile()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))
    for word in words:
        if word.startswith("-"):
            continue
        if "=" in word:
            var = word.split("=")[0]
            if not re.search(rf"\$\({var}\)|^{var}\s*[?:]?=", text, re.M):
                return f"the Makefile does not read {var}"
        elif word not in targets:
            return f"the Makefile has no target {word}"
    return None


@cache
def hf_help(path: tuple[str, ...]) -> tuple[int, str]:
    exe = BIN / "hf"
    if not exe.exists():
        return 127, ""
    with tempfile.TemporaryDirectory() as home:  # hf may write its own files under HOME
        done = subprocess.run([str(exe), *path, "--help"], capture_output=True, text=True, timeout=120,
                              env={"HF_HUB_OFFLINE": "1", "PATH": str(BIN), "HOME": home}, cwd=home)
    return done.returncode, done.stdout + done.stderr


def check_hf(words: list[str]) -> str | None:
    plain = [w for w in words if not w.startswith("-")]
    for depth in (2, 1):
        rc, text = hf_help(tuple(plain[:depth]))
        if rc == 0 and (depth == 1 or "Usage: hf " + " ".join(plain[:depth]) in text):
            missing = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in text]
            return f"hf {' '.join(plain[:depth])} has no option {missing[0]}" if missing else None
    return f"hf has no command {' '.join(plain[:2])}"


@cache
def extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def check_pip(words: list[str]) -> str | None:
    if words[:1] != ["install"]:
        return f"pip {' '.join(words)}: only pip install is documented"
    for word in words[1:]:
        match = re.fullmatch(r"([^\[]*)\[([^\]]+)\]", word)
        if match is None:
            continue
        if match.group(1) != ".":
            return f"pip install {word} installs {match.group(1)!r} from the index, not this checkout: use -e '.[…]'"
        unknown = set(match.group(2).split(",")) - extras()
        if unknown:
            return f"pyproject.toml has no extra {sorted(unknown)[0]}"
    return None


def check_file(word: str) -> str | None:
    return None if (ROOT / word).exists() else f"no file {word}"


def check(words: list[str]) -> str | None:
    head, rest = words[0], words[1:]
    if head == "recast":
        return check_recast(rest)
    if head == "make":
        return check_make(rest)
    if head == "hf":
        return check_hf(rest)
    if head == "pip":
        return check_pip(rest)
    if head in ("python", "python3"):
        if rest[:1] == ["-m"]:
            return None if importlib.util.find_spec(rest[1]) else f"no module {rest[1]}"
        return check_file(rest[0])
    if head in ("bash", "cp"):
        return check_file(next(w for w in rest if not w.startswith("-")))
    if head in ("source", "."):
        return None if rest[0].endswith("bin/activate") else f"source {rest[0]}: not the venv's activate"
    if head == "accelerate":
        if "-m" in rest and rest[rest.index("-m") + 1] == "recast_cli":
            return check_recast(rest[rest.index("-m") + 2:])
        if rest == ["launch"]:  # named in prose
            return None if (BIN / "accelerate").exists() else "accelerate not installed"
        return "accelerate: only `accelerate launch … -m recast_cli …` is documented"
    if head == "tensorboard":
        return None if (BIN / "tensorboard").exists() or shutil.which("tensorboard") else "tensorboard not installed"
    if head == "export":
        return None
    return f"unknown command {head!r}"


# --------------------------------------------------------------------------- the tests


def pasted() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for line in shell_lines((ROOT / doc).read_text(encoding="utf-8")):
            found.append((doc, line))
    return found


def test_the_docs_have_shell_lines_to_check():
    docs = {doc for doc, _ in pasted()}
    assert docs == set(DOCS)
    assert len(pasted()) > 60


@pytest.mark.parametrize("doc", DOCS)
def test_every_pasted_command_exists_with_its_flags(doc):
    wrong = []
    for where, line in pasted():
        if where != doc:
            continue
        for words in commands(line):
            problem = check(words)
            if problem:
                wrong.append(f"{problem}\n      in: {line}")
    assert not wrong, f"{doc}: commands that would fail when pasted:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize(("line", "problem"), [
    ("recast fetch ocr --no-such-flag", "has no option --no-such-flag"),
    ("recast no-such-command X", "no such recast command"),
    ("make no-such-target", "no target no-such-target"),
    ("make all NO_SUCH_VAR=1", "does not read NO_SUCH_VAR"),
    ("huggingface-cli login", "unknown command 'huggingface-cli'"),
    ("pip install 'recast[wandb]'", "from the index"),
    ("pip install -e '.[no-such-extra]'", "no extra no-such-extra"),
    ("hf no-such-command", "hf has no command"),
    ("python -m benchmarks.no_such_bench", "no module"),
])
def test_the_checks_catch_what_would_fail(line, problem):
    found = [check(words) for words in commands(line)]
    assert any(p and problem in p for p in found), found


@pytest.mark.parametrize("line", [
    "hf auth login", "pip install -e '.[wandb]'", "source .venv/bin/activate",
    "HF_HUB_OFFLINE=1 recast check-setting ocr", "make fetch SETTING=ocr",
    "recast preflight --setting ocr --out preflight/ocr [--scale full|tiny]",
])
def test_the_checks_pass_what_works(line):
    assert [check(words) for words in commands(line)] == [None] * len(commands(line))
