"""A study reuses a file only when everything that determined it is equal (issue 40, finding 5).

``recast study``: each cell holds the digest of each of its inputs, OUT/study.json those of the gain
tables and W; a rerun after a change of the world, the policy, the recipe or the evaluation is one
line naming what changed (exit 2, nothing rewritten), ``--force`` recomputes exactly the stale
files, and an unchanged rerun still reuses everything. ``make all``'s graph: a stamp per part of the
setting, so a setting change makes exactly the targets that read it stale, and a run folder started
under another setting is refused, never resumed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import read_cell, write_cell
from recast_cli.artifacts.cells import MADE_FROM
from recast_cli.cli import app
from recast_cli.study.makefile import RUN_PARTS

SETTING = """
[policy]
kind = "flow1d"
steps = 4
noise_level = 0.7
hidden = 8
features = 2

[world]
means = [-1.0, 1.0]
stds = 0.5

[world.rewards.right]
threshold = 0.0

[train]
rewards = ["right"]
lambda = [1]
prompts = "prompts.txt"
lora_rank = 0
max_steps = 2
group_size = 2
prompts_per_step = 2
save_every = 2
keep_checkpoints = 1
learning_rate = 1e-2

[evaluate]
n = 16
seed = 10000
judges = []

[study]
budgets = [[1]]
seeds = [0, 1]
modes = ["static", "recast"]
gains = "exact"
estimate_steps = 4
"""

#: one change at a time → the file refused and what the line names
CHANGES = {
    "[world] means": (("means = [-1.0, 1.0]", "means = [-1.0, 1.5]"),
                      "gains/exact.parquet was made with another [world];"),
    "[policy] noise_level": (("noise_level = 0.7", "noise_level = 0.6"),
                             "cells/1-static-g2.parquet holds a cell of another study: it was made with another "
                             "[policy];"),
    "[policy] hidden": (("hidden = 8", "hidden = 6"), "cells/1-static-g2.parquet holds a cell of another study: it "
                                                      "was made with another [policy];"),
    "[evaluate] seed": (("seed = 10000", "seed = 10001"), "it was made with another [evaluate] seed;"),
    "[evaluate] n": (("n = 16", "n = 8"), "it was made with another [evaluate] n;"),
    "[train] learning_rate": (("learning_rate = 1e-2", "learning_rate = 2e-2"), "it was made with another [train];"),
    "[study] alpha": (("estimate_steps = 4", "estimate_steps = 4\nalpha = 3.0"),
                      "gains/exact.parquet was made with another [study] gains options;"),
}


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(result, needle: str) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[:2000]
    assert needle in lines[0], lines[0]
    assert "rerun with a fresh --out or --force" in lines[0]
    return lines[0]


def hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` → its sha256."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write(root: Path, text: str = SETTING) -> Path:
    (root / "prompts.txt").write_text("x\n")
    (root / "s.toml").write_text(text)
    return root / "s.toml"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A finished tiny study (one budget, static and ReCAST from the exact gains, two seeds)."""
    root = tmp_path_factory.mktemp("study")
    result = cli("study", write(root), "--out", root / "st", "--quiet", "--no-report")
    assert result.exit_code == 0, result.output
    return root / "st"


def copy_of(study: Path, tmp_path: Path) -> Path:
    shutil.copytree(study, tmp_path / "st")
    return tmp_path / "st"


def test_an_unchanged_rerun_reuses_every_file(study, tmp_path):
    out = copy_of(study, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.*") if p.name != "study.json"}
    start = time.perf_counter()
    result = cli("study", write(tmp_path), "--out", out, "--quiet", "--no-report")
    assert result.exit_code == 0, result.output
    assert "2 of 2 cells" in result.stdout and time.perf_counter() - start < 10
    assert {p: p.stat().st_mtime_ns for p in before} == before


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_setting_is_one_line_naming_what_changed(study, tmp_path, change):
    (old, new), needle = CHANGES[change]
    assert old in SETTING
    out = copy_of(study, tmp_path)
    before = hashes(out)
    one_line(cli("study", write(tmp_path, SETTING.replace(old, new)), "--out", out, "--quiet"), needle)
    assert hashes(out) == before  # nothing rewritten, nothing added


def test_force_recomputes_exactly_the_stale_files_and_only_recasts_own(study, tmp_path):
    out = copy_of(study, tmp_path)
    (out / "gains" / "notes.txt").write_text("mine")
    before = hashes(out)
    setting = write(tmp_path, SETTING.replace("means = [-1.0, 1.0]", "means = [-1.0, 1.5]"))
    result = cli("study", setting, "--out", out, "--quiet", "--no-report", "--force")
    assert result.exit_code == 0, result.output
    after = hashes(out)
    changed = {name for name in before if after.get(name) != before[name]}
    assert changed == {"gains/exact.parquet", "W/1-recast.safetensors", "cells/1-recast-g2.parquet",
                       "cells/1-static-g2.parquet", "study.json"}  # the static W depends on no world
    assert after["gains/notes.txt"] == before["gains/notes.txt"]
    assert read_cell(out / "cells" / "1-static-g2.parquet").meta[MADE_FROM]["[world]"] != \
        read_cell(study / "cells" / "1-static-g2.parquet").meta[MADE_FROM]["[world]"]
    again = cli("study", setting, "--out", out, "--quiet", "--no-report")  # now current: reused
    assert again.exit_code == 0 and hashes(out) == after


def test_a_cell_of_an_older_recast_is_refused(study, tmp_path):
    out = copy_of(study, tmp_path)
    path = out / "cells" / "1-recast-g2.parquet"
    cell = read_cell(path)
    del cell.meta[MADE_FROM]  # what the code before the digests wrote
    write_cell(path, cell)
    before = hashes(out)
    one_line(cli("study", write(tmp_path), "--out", out, "--quiet"),
             "1-recast-g2.parquet holds a cell of another study: it was made by an older recast")
    assert hashes(out) == before


def test_gains_and_w_without_a_record_are_refused(study, tmp_path):
    out = copy_of(study, tmp_path)
    (out / "study.json").unlink()  # files an older recast kept in OUT
    one_line(cli("study", write(tmp_path), "--out", out, "--quiet"),
             "gains/exact.parquet was made by an older recast")


def test_a_users_study_json_is_never_read_as_a_record_or_replaced(study, tmp_path):
    out = copy_of(study, tmp_path)
    (out / "study.json").write_text('{"files": {}}')
    before = hashes(out)
    result = cli("study", write(tmp_path), "--out", out, "--quiet")
    assert result.exit_code == 2 and "study.json: it exists and is not a recast artifact" in result.stderr
    assert hashes(out) == before


def test_stale_estimate_parts_are_refused_and_force_removes_only_recasts_pieces(tmp_path):
    """A killed sampled estimate left OUT.parts/; the world changed: its pieces would be resumed as they
    are (their run id names the setting's path, not its content), so they are refused, and --force
    removes recast's pieces and marker only. (The plan and the record only: nothing is computed.)"""
    from recast_cli.study.runner import RECORD_NAME, check_record, plan_study

    text = SETTING.replace('modes = ["static", "recast"]', 'arms = ["recast:exp:estimate"]')
    plan = plan_study(str(write(tmp_path, text)), tmp_path / "st")
    check_record(plan, force=False)  # a fresh OUT: the record of this plan, nothing else
    parts = tmp_path / "st" / "gains" / "estimate.parquet.parts"
    parts.mkdir(parents=True)
    for name in ("parts.json", "prompt-000000.safetensors", "mine.txt"):
        (parts / name).write_text(name)
    changed = plan_study(str(write(tmp_path, text.replace("noise_level = 0.7", "noise_level = 0.5"))),
                         tmp_path / "st")
    record = (tmp_path / "st" / RECORD_NAME).read_bytes()
    with pytest.raises(Exception, match=r"estimate\.parquet was made with another \[policy\]; rerun"):
        check_record(changed, force=False)
    assert (tmp_path / "st" / RECORD_NAME).read_bytes() == record
    check_record(plan, force=False)  # the same inputs: the pieces are this run's, resumed
    assert (parts / "prompt-000000.safetensors").is_file()
    check_record(changed, force=True)
    assert sorted(p.name for p in parts.iterdir()) == ["mine.txt"]


# --------------------------------------------------------------------------- make all's graph

FLOW = SETTING.replace("[study]", "[study]\nn = 2\nk = 1")


def make(mk: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run(["make", "-f", str(mk), *args], capture_output=True, text=True, env=env, timeout=60)


def generate(tmp_path: Path, text: str) -> Path:
    from recast_cli.study.makefile import study_makefile

    mk = tmp_path / "study.mk"
    mk.write_text(study_makefile(str(write(tmp_path, text)), tmp_path / "root"))
    return mk


def redone(mk: Path) -> set[str]:
    """What ``make -n all`` would do: the ``--out`` of each recipe, under the root (the stamps, which run
    under -n too, are brought up to date)."""
    result = make(mk, "-n", "all")
    assert result.returncode == 0, result.stderr
    root = f"{mk.parent / 'root'}/"
    return {line.split(" --out ")[1].split()[0].removeprefix(root) for line in result.stdout.splitlines()
            if " --out " in line}


def plant(mk: Path) -> None:
    """Every target of the graph as if made after the stamps (and before the next stamp written), each run
    with its record."""
    root, now = mk.parent / "root", time.time()
    for stamp in (root / ".setting").glob("*.sha256"):
        os.utime(stamp, (now - 100, now - 100))
    for target in re.findall(r"^\$\(R\)/(\S+):", mk.read_text(), re.M):
        if target.startswith(".setting/"):
            continue
        path = root / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        if path.name == ".done":
            stamps = [root / ".setting" / f"{p}.sha256" for p in RUN_PARTS if p != "train"]  # what TRAINED_UNDER keeps
            path.parent.with_name(path.parent.name + ".setting").write_text("".join(s.read_text() for s in stamps))
        os.utime(path, (now - 50, now - 50))


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_setting_change_makes_exactly_what_reads_it_stale(tmp_path):
    mk = generate(tmp_path, FLOW)
    everything = redone(mk)
    assert "gains/exact.parquet" in everything and "runs/1/static-s1" in everything
    plant(mk)
    assert make(mk, "-q", "all").returncode == 0  # nothing to do
    generate(tmp_path, FLOW)
    assert make(mk, "-q", "all").returncode == 0  # regenerated unchanged: still nothing

    def after(old: str, new: str) -> set[str]:
        generate(tmp_path, FLOW.replace(old, new))
        stale = redone(mk)
        plant(mk)
        generate(tmp_path, FLOW)
        redone(mk)  # back to the first setting: the stamps move again
        plant(mk)
        return stale

    runs = {f"runs/1/{m}-s{s}" for m in ("static", "recast") for s in (0, 1)}
    evals = {f"evals/1/{m}-s{s}{e}.parquet" for m in ("static", "recast") for s in (0, 1) for e in ("", "-ode")}
    base = {"evals/base.parquet"}
    assert after("means = [-1.0, 1.0]", "means = [-1.0, 1.5]") == everything
    assert after("seed = 10000", "seed = 10001") == evals | base | {"report"}
    assert after("learning_rate = 1e-2", "learning_rate = 2e-2") == runs | evals | {"report"}
    assert after("noise_level = 0.7", "noise_level = 0.6") == everything - {"gains/exact.parquet",
                                                                          "W/1-static.safetensors",
                                                                          "W/1-recast.safetensors"}
    every_w = {"W/1-static.safetensors", "W/1-recast.safetensors", "W/1-recast-sampled.safetensors"}
    assert after("estimate_steps = 4", "estimate_steps = 4\ntau = 0.5") == every_w | runs | evals | {"report"}
    assert after("seeds = [0, 1]", "seeds = [0, 1, 2]") == {"runs/1/static-s2", "runs/1/recast-s2", "report",
                                                            *(f"evals/1/{m}-s2{e}.parquet" for m in ("static", "recast")
                                                              for e in ("", "-ode"))}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_run_started_under_another_setting_is_refused_not_resumed(tmp_path):
    root = tmp_path / "root"
    fake, calls = tmp_path / "fake-recast", tmp_path / "calls"  # stands for recast: logs, makes the --out folder
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nwhile [ $# -gt 0 ]; do [ "$1" = --out ] && mkdir -p "$2"; '
                    'shift; done\n')
    fake.chmod(0o755)
    mk = generate(tmp_path, FLOW)
    redone(mk)
    plant(mk)  # everything made: only the run's own recipe runs
    run = "runs/1/static-s0"
    shutil.rmtree(root / run)
    (root / f"{run}.setting").unlink()
    target = f"{root}/{run}/.done"
    first = make(mk, f"RECAST={fake}", target)
    assert first.returncode == 0, first.stderr
    record = (root / f"{run}.setting").read_text()
    (root / run / ".done").unlink()  # killed mid-run, same setting: resumed
    assert make(mk, f"RECAST={fake}", target).returncode == 0
    generate(tmp_path, FLOW.replace("noise_level = 0.7", "noise_level = 0.6"))
    refused = make(mk, f"RECAST={fake}", target)
    assert refused.returncode == 2 and len(calls.read_text().splitlines()) == 2  # train ran twice, not a third time
    assert f"{root}/{run} was trained under another [policy], [world], [rewards.*], [train]" in refused.stderr.splitlines()[0]
    assert (root / f"{run}.setting").read_text() == record


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_longer_step_budget_continues_a_run_under_make(tmp_path):
    """What ``recast train --resume`` keeps is what a run folder records (``trainkey``): a longer max_steps
    remakes the run's target, which continues the run, while another learning rate is refused."""
    root = tmp_path / "root"
    fake, calls = tmp_path / "fake-recast", tmp_path / "calls"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nwhile [ $# -gt 0 ]; do [ "$1" = --out ] && mkdir -p "$2"; '
                    'shift; done\n')
    fake.chmod(0o755)
    mk = generate(tmp_path, FLOW)
    redone(mk)
    plant(mk)
    run = "runs/1/static-s0"
    target = f"{root}/{run}/.done"
    generate(tmp_path, FLOW.replace("max_steps = 2", "max_steps = 3"))
    longer = make(mk, f"RECAST={fake}", target)
    assert longer.returncode == 0, longer.stderr
    assert len(calls.read_text().splitlines()) == 1  # the planted run, continued
    generate(tmp_path, FLOW.replace("max_steps = 2", "max_steps = 3").replace("learning_rate = 1e-2",
                                                                          "learning_rate = 2e-2"))
    refused = make(mk, f"RECAST={fake}", target)
    assert refused.returncode == 2 and len(calls.read_text().splitlines()) == 1


def test_the_report_waits_for_cells_of_other_inputs_as_for_missing_ones(study, tmp_path):
    """A shard whose own cells are current does not report over another shard's stale cell."""
    from recast_cli.study.runner import pending_cells, plan_study

    out = copy_of(study, tmp_path)
    assert pending_cells(plan_study(str(write(tmp_path)), out)) == []
    changed = write(tmp_path, SETTING.replace("learning_rate = 1e-2", "learning_rate = 2e-2"))
    assert {p.name for p in pending_cells(plan_study(str(changed), out))} == {"1-static-g2.parquet",
                                                                               "1-recast-g2.parquet"}


def test_what_changes_no_result_is_no_part_of_the_policy_digest(tmp_path):
    """The text encoders' offload (the same images either way) and where the checkout lies (a local model
    path counts relative to the setting) leave a run's [policy] digest as it was."""
    from recast_cli.setting.load import load_setting, policy_inputs

    digests = []
    for folder, extra in (("a", ""), ("b", ""), ("b", "offload_text_encoders = true\n")):
        (tmp_path / folder / "model").mkdir(parents=True, exist_ok=True)
        setting = tmp_path / folder / f"s{len(digests)}.toml"
        setting.write_text(f'[policy]\nkind = "sd3"\npath = "model"\n{extra}')
        digests.append(policy_inputs(load_setting(str(setting))))
    assert digests[0] == digests[1] == digests[2]
    (tmp_path / "c" / "other").mkdir(parents=True)
    (tmp_path / "c" / "s.toml").write_text('[policy]\nkind = "sd3"\npath = "other"\n')
    assert policy_inputs(load_setting(str(tmp_path / "c" / "s.toml"))) != digests[0]
