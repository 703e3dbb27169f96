"""``recast fetch`` writes only its own files (issue 40, findings 1, 2, 3, 6 and 15), against loopback
servers (tests/fakehub.py): files planted at the partial-file names, an endless body, a full disk,
and repo ids and revisions that break the Hub's grammar. Every planted file keeps its sha256."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.errors import BadInput
from recast_cli.fetch import http, sources
from recast_cli.fetch.http import claim_path, download, part_path
from recast_cli.hub import parse_hub_id
from tests.fakehub import FakeHub, FileServer
from tests.test_fetch import git_blob

PROMPTS = "".join(f"a sign that says 'prompt {i}'\n" for i in range(3000)).encode()
PINS = (git_blob(PROMPTS), hashlib.sha256(PROMPTS).hexdigest())
MINE = b"a user's own notes, not a download\n"


@pytest.fixture
def files():
    server = FileServer()
    server.files["/ocr/train.txt"] = PROMPTS
    yield server
    server.close()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(target: Path) -> list[str]:
    """recast's partial-file names beside ``target`` that are still there."""
    return sorted(p.name for p in target.parent.iterdir() if ".recast-part" in p.name)


def everything_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def fetch_in_thread(url: str, target: Path, **kwargs) -> BaseException | None:
    """``download`` in a thread that must end within 10 s (a FIFO opened for writing would block forever)."""
    outcome: list[BaseException | None] = []

    def body() -> None:
        try:
            download(url, target, *PINS, **kwargs)
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(10)
    assert outcome, "the download hung"
    return outcome[0]


def one_line(exc: BaseException | None, *needles: str) -> None:
    """``exc`` is BadInput: one line holding every needle."""
    assert isinstance(exc, BadInput), exc
    assert "\n" not in str(exc) and all(needle in str(exc) for needle in needles), str(exc)


def cli_one_line(args: list[str], *needles: str) -> None:
    """``recast ARGS`` exits 2 with one line on stderr holding every needle, and no traceback."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(needle in lines[0] for needle in needles), result.stderr
    assert "Traceback" not in result.stdout + result.stderr


# --------------------------------------------------------------------------- findings 1, 2, 15: partial files


def plant(path: Path, kind: str, victim: Path) -> None:
    """A user's ``kind`` of thing at ``path``: a file, a symlink or hard link to ``victim``, a folder, a FIFO."""
    if kind == "file":
        path.write_bytes(MINE)
    elif kind == "symlink":
        path.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, path)
    elif kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)


def fingerprint(path: Path) -> tuple[int, int, int, int]:
    st = os.lstat(path)
    return st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(MINE)
    return path


MINE_SHA = hashlib.sha256(MINE).hexdigest()


@pytest.mark.parametrize("ignore_range", [False, True])
@pytest.mark.parametrize("kind", ["file", "symlink", "folder", "fifo"])
def test_whatever_a_user_has_named_target_part_is_never_read_written_or_removed(files, tmp_path, victim, kind,
                                                                                ignore_range):
    """Findings 1, 2 and 15: ``TARGET.part`` is not recast's name. A user's file there (was: resumed into, then
    deleted), a symlink (was: followed, the download appended to or truncated into the file it points to, and
    TARGET left a symlink to it), a folder (was: IsADirectoryError) or a FIFO (was: a hang) is left as it was,
    and TARGET is a regular file holding the download."""
    files.ignore_range = ignore_range
    target = tmp_path / "ocr" / "train.txt"
    target.parent.mkdir()
    planted = target.with_name("train.txt.part")
    plant(planted, kind, victim)
    before = fingerprint(planted)

    assert fetch_in_thread(f"{files.url}/ocr/train.txt", target) is None
    assert not target.is_symlink() and target.read_bytes() == PROMPTS
    assert fingerprint(planted) == before and sha(victim) == MINE_SHA
    assert kind != "file" or sha(planted) == MINE_SHA
    assert leftovers(target) == [] and [r for _, _, r in files.requests] == [None]  # nothing resumed


@pytest.mark.parametrize("kind", ["file", "symlink", "hardlink", "folder", "fifo"])
@pytest.mark.parametrize("where", [part_path, claim_path])
def test_anything_recast_did_not_make_at_its_partial_names_is_one_line_and_untouched(files, tmp_path, victim, kind,
                                                                                      where):
    """A file, symlink, hard link, folder or FIFO at ``.TARGET.recast-part`` or its claim is refused in one line
    before any request, never opened for writing (a FIFO: no hang), never truncated nor removed."""
    target = tmp_path / "ocr" / "train.txt"
    target.parent.mkdir()
    path = where(target)
    plant(path, kind, victim)
    before = fingerprint(path)

    exc = fetch_in_thread(f"{files.url}/ocr/train.txt", target)
    one_line(exc, str(path), "not a partial download recast made")
    assert fingerprint(path) == before and sha(victim) == MINE_SHA and not target.exists()
    assert files.requests == []


def test_recast_resumes_its_own_claimed_part_but_not_one_swapped_for_a_user_file(files, tmp_path):
    """A claim names one inode: recast's part is resumed with Range; the same name holding another file
    (replaced, with the old claim left beside it) is neither resumed into nor removed."""
    target = tmp_path / "ocr" / "train.txt"
    target.parent.mkdir()
    url = f"{files.url}/ocr/train.txt"
    part = http.PartFile(target, url)  # what a killed run leaves: a claimed part holding the first bytes
    part.write(PROMPTS[:1000])
    part.close()
    download(url, target, *PINS)
    assert target.read_bytes() == PROMPTS and files.requests[-1][2] == "bytes=1000-" and leftovers(target) == []

    target.unlink()
    part = http.PartFile(target, url)
    part.write(PROMPTS[:1000])
    part.close()
    part_path(target).unlink()
    part_path(target).write_bytes(MINE)  # another file at the part's name; the claim names the old inode
    with pytest.raises(BadInput, match="not a partial download recast made"):
        download(url, target, *PINS)
    assert part_path(target).read_bytes() == MINE and claim_path(target).exists() and not target.exists()


# --------------------------------------------------------------------------- finding 6: size cap, full disk


def test_an_endless_body_stops_at_the_cap_with_the_part_removed(files, tmp_path, monkeypatch):
    """Finding 6: a chunked body that never ends (was: 12 GB written) stops at ``MAX_UNPINNED_BYTES`` when no
    size is pinned, or at the pinned size, with the part removed."""
    monkeypatch.setattr(http, "MAX_UNPINNED_BYTES", 256 << 10)
    files.endless.add("/ocr/train.txt")
    target = tmp_path / "ocr" / "train.txt"
    for size, cap in ((None, 256 << 10), (100_000, 100_000)):
        exc = fetch_in_thread(f"{files.url}/ocr/train.txt", target, size=size)
        one_line(exc, f"more than the {cap} bytes", "removed the partial file")
        assert leftovers(target) == [] and not target.exists()


def test_a_file_larger_than_its_pin_is_refused_by_its_content_length_before_any_byte_is_written(files, tmp_path):
    target = tmp_path / "ocr" / "train.txt"
    exc = fetch_in_thread(f"{files.url}/ocr/train.txt", target, size=len(PROMPTS) - 1)
    one_line(exc, f"more than the {len(PROMPTS) - 1} bytes")
    assert leftovers(target) == [] and not target.exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_full_disk_or_quota_while_downloading_is_one_line_and_removes_the_part(files, tmp_path, monkeypatch, code):
    """Finding 6: ENOSPC (was: a traceback, and the part left filling the disk), EDQUOT, or EFBIG (``ulimit
    -f``) once 64 KiB are on disk: one line, the part and its claim removed."""
    real = os.write

    def full(fd: int, data) -> int:
        if os.fstat(fd).st_size >= 1 << 16:
            raise OSError(code, os.strerror(code))
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    target = tmp_path / "ocr" / "train.txt"
    exc = fetch_in_thread(f"{files.url}/ocr/train.txt", target)
    one_line(exc, "no space left writing", "removed the partial download")
    assert leftovers(target) == [] and not target.exists()


PROMPT_SETTING = '[policy]\nkind = "gmm1d"\n[train]\nprompts = "data/ocr/test.txt"\n'


def test_recast_fetch_says_one_line_for_an_endless_prompt_file_and_leaves_nothing(files, tmp_path, monkeypatch):
    """The same through ``recast fetch``: exit 2, one line on stderr, no partial file, no lock left."""
    files.endless.add("/ocr/test.txt")
    pin = sources.PromptFile("ocr/test.txt", f"{files.url}/ocr/test.txt", *PINS, size=50_000)
    monkeypatch.setitem(sources.PROMPT_FILES, "ocr/test.txt", pin)
    setting = tmp_path / "s.toml"
    setting.write_text(PROMPT_SETTING)
    cli_one_line(["fetch", str(setting)], "more than the 50000 bytes", "removed the partial file")
    assert [p for p in everything_under(tmp_path) if not (tmp_path / p).is_dir()] == ["s.toml"]


# --------------------------------------------------------------------------- finding 3, 15: repo ids and revisions


@pytest.mark.parametrize("text", [
    "org/name", "org/name@main", "org/name@refs/pr/1", "org/name@v1.0-rc_2", "Org_1/na.me-2@feature/x",
    "stabilityai/stable-diffusion-3.5-medium@0123456789abcdef0123456789abcdef01234567", "o/" + "n" * 96])
def test_repo_ids_and_revisions_the_hub_takes_parse(text):
    ref = parse_hub_id(text)
    assert ref is not None and str(ref) == text


@pytest.mark.parametrize("text", [
    "org--x/name", "org/na--me", "org/name.git", "org../name", "org-/name", "org/name.", "org/n-", "o/" + "n" * 97,
    "org/name@../../../../../victim", "org/name@a/../../b", "org/name@/abs", "org/name@a/", "org/name@a//b",
    "org/name@a\\b", "org/name@a\x01b", "org/name@a\x7fb", "org/name@.hidden", "org/name@x/.y", "org/name@x.lock",
    "org/name@x.", "org/name@@", "org/name@a@{1}", "org/name@a~1", "org/name@a^2", "org/name@a:b", "org/name@a?",
    "org/name@a*", "org/name@a[b", "org/name@" + "x" * 256])
def test_repo_ids_and_revisions_the_hub_or_git_refuses_are_one_line(text):
    """Finding 15: was an HFValidationError traceback (``org--x/name``, ``org/name.git``), or, for a revision,
    a path in the HF cache (finding 3). The Hub's grammar and git's check-ref-format, before any lookup."""
    with pytest.raises(BadInput, match="is not a valid Hugging Face repo id") as err:
        parse_hub_id(text)
    assert "\n" not in str(err.value)


@pytest.fixture
def hostile_hub(tmp_path):
    """A loopback Hub that answers any revision with its commit (tests/fakehub.py), as this process's endpoint,
    and an empty HF cache two folders down in ``tmp_path``."""
    import huggingface_hub.constants as constants

    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "model_index.json").write_text('{"_class_name": "StableDiffusion3Pipeline"}')
    server = FakeHub()
    server.add_repo("tiny/sd3", folder)
    server.any_revision = True
    cache = tmp_path / "a" / "b" / "hf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "ENDPOINT", server.url)
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
        mp.setattr(constants, "HF_HUB_CACHE", str(cache))
        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        mp.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)  # no token of this machine goes to it
        yield server, cache
    server.close()


@pytest.mark.parametrize("path", ["tiny/sd3@../../../victim", "tiny/sd3@../../../../../victim", "tiny/sd3@/tmp/x",
                                  "org--x/name", "org/name.git", "tiny/sd3@a\\b"])
@pytest.mark.parametrize("command", ["fetch", "check-setting"])
def test_a_hostile_repo_id_in_a_setting_is_one_line_before_any_request_and_nothing_is_written(
        hostile_hub, tmp_path, path, command):
    """Finding 3: ``[policy] path = "org/name@../../victim"`` made huggingface_hub write the commit id to
    ``refs/../../victim``, outside the cache (against a Hub that answers any revision). Now: one line, exit 2,
    from fetch and check-setting alike, the Hub asked nothing, nothing written anywhere."""
    hub, cache = hostile_hub
    setting = tmp_path / "s.toml"
    setting.write_text(f'[policy]\nkind = "sd3"\npath = "{path}"\nsteps = 2\nresolution = 32\n')
    before = everything_under(tmp_path)
    cli_one_line([command, str(setting)], "is not a valid Hugging Face repo id")
    assert hub.requests == [] and everything_under(tmp_path) == before


def test_a_hub_answer_naming_a_commit_or_file_outside_the_cache_is_one_line(hostile_hub, tmp_path):
    """A hostile Hub's commit id (a snapshot folder's name) or file name that leaves its folder is refused
    before anything is downloaded."""
    hub, cache = hostile_hub
    setting = tmp_path / "s.toml"
    setting.write_text('[policy]\nkind = "sd3"\npath = "tiny/sd3"\nsteps = 2\nresolution = 32\n')
    commit, listed = hub.repos["tiny/sd3"]
    for answer, needle in (((f"../../../{commit}", listed), "not a 40-digit hex commit id"),
                           ((commit, {**listed, "../../escape.json": b"{}"}), "a path that leaves its folder")):
        hub.repos["tiny/sd3"] = answer
        cli_one_line(["fetch", str(setting)], needle)
        assert all("/resolve/" not in path for _, path, _ in hub.requests)
        assert not (tmp_path / "a" / "b" / "victim").exists() and not cache.exists()
