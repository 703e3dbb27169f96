"""Metadata blocks checked on read like the tensors (issue 51, items 9-11 and three lines of 16), through the CLI.

* W's ``info``: a hostile block (``settled_by_timing = [5]``, a pair twice, a reward of another W, a step past
  T, a verdict that is not one, no bootstrap draw…) is one line naming the key, exit 2, in ``inspect`` and in
  ``recast train`` — there before the run folder is made, and a run folder that an open failing later started
  goes again, so the same command run once more starts afresh.
* A gain table's ``advantage_corr`` (one pair 100 000 times, a pair twice in either order, an unknown reward,
  a self-pair, K < 2) and its other run metadata (α, N, the scales…) are refused the same way.
* ``solve-w --bootstrap 1`` is refused: one draw measures no spread (W's band, the verdicts, ``--shrink auto``);
  so is ``estimate --bootstrap 1`` (zero-width intervals, no draws).
* ``--conflicts-from /dev/zero`` is "not a regular file"; ``--conflicts-from`` a table that records no
  correlations is refused (it would drop the conflicts silently), and solve-w says what it read there.
* A ``[study]`` with both ``modes`` and ``arms`` is refused by check-setting.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from recast_cli.artifacts import write_gains
from tests.cli_helpers import invoke, one_line, run_ok
from tests.conftest import bump_gains, make_table

T = 12
REWARDS = ("a", "b", "c")


def corr_record(pairs=(("a", "b"), ("a", "c"), ("b", "c")), K: int = 4) -> dict:
    """E14's record with a and b in conflict at steps 3-5 (ρ = −0.8 over 1000 groups)."""
    rho = []
    for pair in pairs:
        row = [0.0] * T
        if set(pair) == {"a", "b"}:
            row[2:5] = [-0.8] * 3
        rho.append(row)
    return {"pairs": [list(p) for p in pairs], "rho": rho, "n": 1000, "K": K}


@pytest.fixture
def gains(tmp_path) -> Path:
    """Three rewards with 20 bootstrap draws and E14's correlations, through the real writer."""
    gain = 0.05 * bump_gains([10, 6, 2], [1.5, 1.5, 1.0], T)
    draws = np.stack([gain * s for s in np.linspace(0.8, 1.2, 20)])
    table = make_table(gain, REWARDS)
    table = replace(table, gain_draws=draws, meta={**table.meta, "N": 64, "advantage_corr": corr_record()})
    path = tmp_path / "g.parquet"
    write_gains(path, table, config={"test": True})
    return path


@pytest.fixture
def weights(tmp_path, gains) -> Path:
    """W solved from ``gains``: its info holds a bootstrap, conflicts and a variant (E12c)."""
    out = tmp_path / "W.safetensors"
    run_ok("solve-w", "--gains", gains, "--lambda", "1,1,2", "--out", out, "--conflicts", "static")
    return out


def edit_info(src: Path, dst: Path, change) -> Path:
    """A copy of the W file ``src`` at ``dst`` whose ``info`` is ``change(info)`` (tensors as they were)."""
    with safe_open(str(src), "np") as fh:
        meta = dict(fh.metadata())
    info = json.loads(meta["info"])
    meta["info"] = json.dumps(change(info))
    save_file(load_file(str(src)), str(dst), metadata=meta)
    return dst


def edit_meta(src: Path, dst: Path, key: str, value) -> Path:
    """A copy of the W file ``src`` at ``dst`` with metadata ``key`` set to ``value`` (JSON)."""
    with safe_open(str(src), "np") as fh:
        meta = dict(fh.metadata())
    meta[key] = json.dumps(value)
    save_file(load_file(str(src)), str(dst), metadata=meta)
    return dst


def edit_gains(src: Path, dst: Path, key: str, value) -> Path:
    """A copy of the gain table ``src`` at ``dst`` with metadata ``key`` set to ``value`` (JSON)."""
    table = pq.read_table(src)
    meta = dict(table.schema.metadata)
    meta[key.encode()] = json.dumps(value).encode()
    pq.write_table(table.replace_schema_metadata(meta), dst)
    return dst


def setting_in(info: dict, path: str, value) -> dict:
    """``info`` with the dotted ``path`` set to ``value`` (``bootstrap.rows.a.verdict``)."""
    node = info
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return info


# ------------------------------------------------------------------ item 9: W's info


@pytest.mark.parametrize("path, value, needle", [
    ("settled_by_timing", [5], "info.settled_by_timing[0]"),
    ("settled_by_timing", [{"pair": ["a", "b"], "steps": [3], "owner": ["c"]}], "info.settled_by_timing[0].owner"),
    ("conflicts", [{"pair": ["a"], "steps": [3], "rho_min": -0.5}], "info.conflicts[0].pair"),
    ("conflicts", [{"pair": ["a", "b"], "steps": [3], "rho_min": -0.5}] * 2, "a second time"),
    ("conflicts", [{"pair": ["a", "b"], "steps": [3], "rho_min": -0.5},
                   {"pair": ["b", "a"], "steps": [4], "rho_min": -0.5}], "a second time"),
    ("conflicts", [{"pair": ["a", "zz"], "steps": [3], "rho_min": -0.5}], "not two rewards"),
    ("conflicts", [{"pair": ["a", "a"], "steps": [3], "rho_min": -0.5}], "not two rewards"),
    ("conflicts", [{"pair": ["a", "b"], "steps": [99], "rho_min": -0.5}], "info.conflicts[0].steps"),
    ("conflicts", [{"pair": ["a", "b"], "steps": [3], "rho_min": "low"}], "info.conflicts[0].rho_min"),
    ("conflicts", [{"pair": ["a", "b"], "steps": [3], "rho_min": -0.5}] * 4, "at most 3"),
    ("conflicts", {"a": 1}, "info.conflicts"),
    ("bootstrap.draws", 0, "info.bootstrap.draws"),
    ("bootstrap.rows.a.verdict", "[red]resolved", "info.bootstrap.rows.a.verdict"),
    ("bootstrap.rows.a.tv_point", [0.1, 0.2], "info.bootstrap.rows.a.tv_point"),
    ("bootstrap.rows", {"a": {}}, "info.bootstrap.rows"),
    ("bootstrap.samples_for_tv", {"0.1": "many"}, "info.bootstrap.samples_for_tv.0.1"),
    ("variant.static_steps", [5, 3], "info.variant.static_steps"),
    ("variant.tag", "E99", "info.variant"),
    ("spill_share", {"a": 2.0, "b": 0.1, "c": 0.1}, "info.spill_share.a"),
    ("indiscriminable", ["nobody"], "info.indiscriminable"),
    ("iterations", "many", "info.iterations"),
    ("marginal_error", float("nan"), "info.marginal_error"),
    ("kernel", "cubic", "info.kernel"),
])
def test_a_hostile_info_is_one_line_naming_the_key(tmp_path, weights, path, value, needle):
    bad = edit_info(weights, tmp_path / "bad.safetensors", lambda info: setting_in(info, path, value))
    for args in (("inspect", bad), ("inspect", bad, "--json")):
        line = one_line(invoke(*args), "bad.safetensors: metadata", needle)
        assert "Traceback" not in line


def test_an_info_that_is_not_an_object_is_refused(tmp_path, weights):
    one_line(invoke("inspect", edit_info(weights, tmp_path / "bad.safetensors", lambda info: [info])),
             "metadata 'info' must be a JSON object")


@pytest.mark.parametrize("key, value, needle", [
    ("rewards", 5, "'rewards' must be a list of reward names"),
    ("rewards", [1, 2, 3], "'rewards' must be a list of reward names"),
    ("lambda", "112", "'lambda' and 'sigmas' must be lists of numbers"),
    ("tau", "1", "'tau' a number"),
])
def test_a_hostile_top_level_key_of_w_is_refused(tmp_path, weights, key, value, needle):
    one_line(invoke("inspect", edit_meta(weights, tmp_path / "bad.safetensors", key, value)), needle)


FLOW1D = """
[policy]
kind = "flow1d"
steps = 3
noise_level = 0.7
features = 1
hidden = 4

[world]
means = [-1.0, 1.0]
stds = [0.3, 0.3]

[world.rewards.side]
threshold = 0.0

[world.rewards.band]
intervals = [[-1.6, 1.6]]

[train]
rewards = ["side", "band"]
lambda = [1, 1]
prompts = "toy"
train_fraction = 1.0
lora_rank = 0
max_steps = 1
group_size = 2
prompts_per_step = 2
micro_batch = 8
sample_batch = 4
beta_kl = 0.0
save_every = 1
"""


@pytest.fixture(scope="module")
def run_weights(tmp_path_factory) -> tuple[Path, Path]:
    """A two-reward flow1d setting and the static W a run of it was trained with (its run folder's copy)."""
    root = tmp_path_factory.mktemp("flow1d")
    setting = root / "s.toml"
    setting.write_text(FLOW1D)
    run_ok("train", "--setting", setting, "--weights", "static", "--out", root / "run0", "--quiet")
    return setting, root / "run0" / "weights.safetensors"


def test_train_refuses_a_hostile_info_before_it_makes_the_run_folder(tmp_path, run_weights):
    setting, good = run_weights
    bad = edit_info(good, tmp_path / "W.safetensors", lambda info: {**info, "settled_by_timing": [5]})
    run = tmp_path / "run"
    one_line(invoke("train", "--setting", setting, "--weights", bad, "--out", run, "--quiet"),
             "metadata 'info.settled_by_timing[0]'")
    assert not run.exists()
    shutil.copyfile(good, bad)  # the user fixes W: the same command now trains
    run_ok("train", "--setting", setting, "--weights", bad, "--out", run, "--quiet")
    assert (run / "run.json").is_file()


@pytest.mark.parametrize("empty", [False, True])
def test_a_run_whose_open_fails_leaves_out_as_it_was(tmp_path, run_weights, monkeypatch, empty):
    """A failure once the run folder is started (here: the conflict watch) takes the folder with it."""
    from recast_cli.errors import BadInput
    from recast_cli.train import trainer

    def fails(*args, **kwargs):
        raise BadInput("the watch failed")

    setting, _ = run_weights
    run = tmp_path / "run"
    if empty:
        run.mkdir()
    monkeypatch.setattr(trainer, "ConflictWatch", fails)
    one_line(invoke("train", "--setting", setting, "--weights", "static", "--out", run, "--quiet"), "the watch failed")
    assert (run.is_dir() and not any(run.iterdir())) if empty else not run.exists()
    assert not list(tmp_path.glob(".run.starting-*"))
    monkeypatch.undo()
    run_ok("train", "--setting", setting, "--weights", "static", "--out", run, "--quiet")


# ------------------------------------------------------------------ item 10: a gain table's metadata


@pytest.mark.parametrize("key, value, needle", [
    ("advantage_corr", {**corr_record(), "pairs": [["a", "b"]] * 100_000, "rho": [[0.0] * T] * 100_000},
     "lists 100000 entries; it can hold at most 3"),
    ("advantage_corr", corr_record(pairs=(("a", "b"), ("b", "a"), ("b", "c"))), "advantage_corr.pairs[1]"),
    ("advantage_corr", corr_record(pairs=(("a", "b"), ("a", "b"))), "a second time"),
    ("advantage_corr", corr_record(pairs=(("a", "zz"),)), "not two rewards"),
    ("advantage_corr", corr_record(K=1), "advantage_corr.K"),
    ("advantage_corr", {**corr_record(), "n": "many"}, "advantage_corr.n"),
    ("advantage_corr", {**corr_record(), "rho": [[2.0] * T] * 3}, "advantage_corr.rho[0]"),
    ("alpha", "two", "'alpha'"),
    ("N", "lots", "'N'"),
    ("K", 0, "'K'"),
    ("crn", "yes", "'crn'"),
    ("reward_std", {"a": 1.0}, "'reward_std'"),
    ("reward_std", {"a": -1.0, "b": 1.0, "c": 1.0}, "'reward_std.a'"),
    ("bootstrap", "[bold]200", "'bootstrap'"),
    ("bootstrap_over", "everything", "'bootstrap_over'"),
    ("policy", "a string", "'policy'"),
])
def test_a_hostile_gain_table_metadata_is_refused(tmp_path, gains, key, value, needle):
    bad = edit_gains(gains, tmp_path / "bad.parquet", key, value)
    one_line(invoke("inspect", bad), "bad.parquet: metadata", needle)
    out = tmp_path / "W.safetensors"
    one_line(invoke("solve-w", "--gains", bad, "--lambda", "1,1,2", "--out", out), needle)
    assert not out.exists()


# ------------------------------------------------------------------ item 11: one bootstrap draw


@pytest.mark.parametrize("extra", [(), ("--shrink", "auto")])
def test_one_bootstrap_draw_is_refused(tmp_path, gains, extra):
    out = tmp_path / "W.safetensors"
    one_line(invoke("solve-w", "--gains", gains, "--lambda", "1,1,2", "--out", out, "--bootstrap", "1", *extra),
             "--bootstrap 1: one draw measures no spread")
    assert not out.exists()
    run_ok("solve-w", "--gains", gains, "--lambda", "1,1,2", "--out", out, "--bootstrap", "2", *extra)


def test_an_estimate_of_one_bootstrap_draw_is_refused_before_any_work(tmp_path):
    """Its D intervals would have zero width (read by solve-w's E10 floor as no noise), its table no draws."""
    out = tmp_path / "g.parquet"
    one_line(invoke("estimate", "--policy", "gmm1d", "--rewards", "coarse,mid", "--n", "8", "--k", "2", "--p", "4",
                    "--steps", "6", "--bootstrap", "1", "--out", out), "--bootstrap 1: one resample measures no spread")
    assert not out.exists() and not (tmp_path / "g.parquet.parts").exists()


# ------------------------------------------------------------------ item 16: --conflicts-from, [study]


@pytest.mark.parametrize("flag", ["--conflicts-from", "--gains"])
def test_a_path_that_is_not_a_regular_file_says_so(tmp_path, gains, flag):
    args = {"--gains": gains, "--conflicts-from": None}
    for odd in (Path("/dev/zero"), tmp_path):
        args[flag] = odd
        given = [a for k, v in args.items() if v is not None for a in (k, v)]
        one_line(invoke("solve-w", *given, "--lambda", "1,1,2", "--out", tmp_path / "W.safetensors",
                        "--conflicts", "static"), f"{odd}: not a regular file")
    one_line(invoke("inspect", "/dev/zero"), "/dev/zero: not a regular file")


def test_conflicts_from_a_table_without_correlations_is_refused(tmp_path, gains):
    bare = edit_gains(gains, tmp_path / "bare.parquet", "advantage_corr", None)
    out = tmp_path / "W.safetensors"
    one_line(invoke("solve-w", "--gains", gains, "--lambda", "1,1,2", "--out", out, "--conflicts-from", bare),
             "--conflicts-from", "records no advantage correlations")
    assert not out.exists()


def test_conflicts_from_says_what_it_read(tmp_path, gains):
    bare = edit_gains(gains, tmp_path / "bare.parquet", "advantage_corr", None)
    result = run_ok("solve-w", "--gains", bare, "--lambda", "1,1,2", "--out", tmp_path / "W.safetensors",
                    "--conflicts-from", gains)
    flat = "".join  # the terminal's width may break a long path anywhere: compared without whitespace
    assert flat(f"conflicts (E14) read from {gains}: 1 conflicting pair(s)".split()) in flat(result.stdout.split())
    quiet = edit_gains(gains, tmp_path / "quiet.parquet", "advantage_corr",
                       {**corr_record(), "rho": [[0.0] * T] * 3})
    result = run_ok("solve-w", "--gains", gains, "--lambda", "1,1,2", "--out", tmp_path / "W2.safetensors",
                    "--conflicts-from", quiet)
    assert flat(f"read from {quiet}: none".split()) in flat(result.stdout.split())


def test_a_study_with_modes_and_arms_is_refused(tmp_path):
    from tests.test_batched import write_setting

    setting = write_setting(tmp_path, study='modes = ["static", "recast"]\narms = ["static", "recast:power"]')
    line = one_line(invoke("check-setting", setting), "[study]: arms and modes")
    assert "not both" in line
    one_line(invoke("study", setting, "--out", tmp_path / "st", "--quiet"), "arms and modes")
