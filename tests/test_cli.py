"""The `recast` command: solve-w, inspect and plot through the real CLI, and its bad-input contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from recast_cli.artifacts import read_weights
from recast_cli.cli import app

runner = CliRunner()


def recast(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_exit_2(result, needle: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_solve_w_writes_balanced_weights_and_prints_the_solve(gains_path, tmp_path):
    out = tmp_path / "W.safetensors"
    result = recast("solve-w", "--gains", gains_path, "--lambda", "1,1,2,1", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "Sinkhorn:" in result.stdout and "iterations" in result.stdout
    w = read_weights(out)
    np.testing.assert_allclose(w.W.sum(axis=1), [0.2, 0.2, 0.4, 0.2], atol=1e-10)
    np.testing.assert_allclose(w.W.sum(axis=0), 1 / 25, atol=1e-10)
    assert w.info["marginal_error"] <= 1e-10
    assert w.provenance.sources[0].path == str(gains_path)


def test_lambda_by_name_matches_lambda_by_position(gains_path, tmp_path):
    by_name, by_pos = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert recast("solve-w", "--gains", gains_path, "--lambda", "pick=2", "--out", by_name).exit_code == 0
    assert recast("solve-w", "--gains", gains_path, "--lambda", "1,1,2,1", "--out", by_pos).exit_code == 0
    np.testing.assert_array_equal(read_weights(by_name).W, read_weights(by_pos).W)
    assert read_weights(by_name).lam == (1.0, 1.0, 2.0, 1.0)


@pytest.mark.parametrize("mode", ["static", "nosink"])
def test_baseline_modes_are_recorded(gains_path, tmp_path, mode):
    out = tmp_path / f"{mode}.safetensors"
    assert recast("solve-w", "--gains", gains_path, "--lambda", "1,1,1,1", "--mode", mode, "--out", out).exit_code == 0
    w = read_weights(out)
    assert w.mode == mode
    np.testing.assert_allclose(w.W.sum(axis=1), 0.25, atol=1e-12)


def test_steps_resamples_onto_the_recorded_grid_family(gains_path, tmp_path):
    out = tmp_path / "W10.safetensors"
    result = recast("solve-w", "--gains", gains_path, "--lambda", "1,1,1,1", "--steps", "10", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "resampled from T = 25 to T = 10" in result.stdout
    w = read_weights(out)
    assert w.W.shape == (4, 10) and len(w.sigmas) == 11
    np.testing.assert_allclose(w.sigmas, np.linspace(1, 0, 11))
    from recast_cli.artifacts import read_gains

    np.testing.assert_allclose(w.gain.sum(axis=1), read_gains(gains_path).total_gain(), rtol=1e-12)


def test_steps_on_the_flowmatch_grid(gains_path, tmp_path):
    out = tmp_path / "W.safetensors"
    result = recast("solve-w", "--gains", gains_path, "--lambda", "1,1,1,1", "--steps", "10",
                    "--grid", "flowmatch", "--shift", "3", "--out", out)
    assert result.exit_code == 0, result.stderr
    from recast_cli.grid import GridSpec

    np.testing.assert_array_equal(read_weights(out).sigmas, GridSpec("flowmatch", shift=3.0).sigmas(10)[::-1])


def test_steps_on_a_dynamic_grid_keep_its_shift_or_take_mu(tmp_path):
    """A FLUX / Qwen-Image table (grid ``dynamic``) resamples onto its own family; --mu moves the shift."""
    from recast_cli.artifacts import write_gains
    from recast_cli.grid import GridSpec
    from tests.conftest import bump_gains, make_table

    qwen = GridSpec("dynamic", mu=0.61, shift_terminal=0.02)
    path = tmp_path / "g.parquet"
    write_gains(path, make_table(0.05 * bump_gains([20, 3], [3, 1], 25), ("clip", "ocr"), grid=qwen))
    for extra, grid in (([], qwen), (["--mu", "0.9"], GridSpec("dynamic", mu=0.9, shift_terminal=0.02))):
        out = tmp_path / f"W{len(extra)}.safetensors"
        result = recast("solve-w", "--gains", path, "--lambda", "1,1", "--steps", "6", *extra, "--out", out)
        assert result.exit_code == 0, result.stderr
        np.testing.assert_array_equal(read_weights(out).sigmas, grid.sigmas(6)[::-1])
    flow = tmp_path / "flow.parquet"
    write_gains(flow, make_table(0.05 * bump_gains([20, 3], [3, 1], 25), ("clip", "ocr"),
                                 grid=GridSpec("flowmatch", shift=3.0)))
    assert_one_line_exit_2(recast("solve-w", "--gains", flow, "--lambda", "1,1", "--steps", "6", "--mu", "0.6",
                                  "--out", tmp_path / "x.safetensors"), "--mu applies to the dynamic grid")
    assert_one_line_exit_2(recast("solve-w", "--gains", flow, "--lambda", "1,1", "--steps", "6", "--grid", "dynamic",
                                  "--out", tmp_path / "x.safetensors"), "needs a gain table measured on a dynamic grid")
    assert not (tmp_path / "x.safetensors").exists()


def test_indiscriminable_reward_becomes_uniform_with_a_warning(tmp_path):
    from recast_cli.artifacts import write_gains
    from tests.conftest import bump_gains, make_table

    gain = 0.05 * bump_gains([20, 3], [3, 1], 25)
    gain[1] *= 1e-6
    path = tmp_path / "g.parquet"
    write_gains(path, make_table(gain, ("clip", "ocr")))
    out = tmp_path / "W.safetensors"
    result = recast("solve-w", "--gains", path, "--lambda", "1,1", "--out", out)
    assert result.exit_code == 0
    assert "'ocr' is indiscriminable" in result.stderr
    w = read_weights(out)
    assert w.info["indiscriminable"] == ["ocr"]


def test_spill_share_is_reported_per_reward(example_path, tmp_path):
    out = tmp_path / "W.safetensors"
    result = recast("solve-w", "--gains", example_path, "--lambda", "1,1,1", "--out", out)
    assert result.exit_code == 0
    assert "spill" in result.stdout
    assert 0.55 < read_weights(out).info["spill_share"]["fine"] < 0.65


def test_inspect_json_for_weights_and_gains(gains_path, tmp_path):
    out = tmp_path / "W.safetensors"
    recast("solve-w", "--gains", gains_path, "--lambda", "1,1,1,1", "--out", out)
    w = json.loads(recast("inspect", out, "--json").stdout)
    assert w["schema"] == "recast.weights/1" and w["kind"] == "weights" and w["mode"] == "recast"
    assert [r["reward"] for r in w["rewards"]] == ["clip", "hps", "pick", "ocr"]
    assert [r["peak_t"] for r in w["rewards"]] == [20, 12, 5, 2]
    assert len(w["rewards"][0]["W"]) == 25
    g = json.loads(recast("inspect", gains_path, "--json").stdout)
    assert g["schema"] == "recast.gains/2" and g["run"]["alpha"] == 2.0
    assert g["rewards"][3]["D0"] == pytest.approx(sum(g["rewards"][3]["gain"]))


def test_inspect_renders_a_table_and_writes_the_figure(example_path, tmp_path):
    png = tmp_path / "fig" / "fig1.png"
    result = recast("inspect", example_path, "--plot", png)
    assert result.exit_code == 0, result.stderr
    assert "recast.gains/1" in result.stdout and "coarse" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_from_gains_and_weights_is_deterministic(example_path, tmp_path):
    W = tmp_path / "W.safetensors"
    recast("solve-w", "--gains", example_path, "--lambda", "1,1,2", "--out", W)
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    assert recast("plot", "--gains", example_path, "--weights", W, "--out", a).exit_code == 0
    assert recast("plot", "--gains", example_path, "--weights", W, "--out", b).exit_code == 0
    assert a.read_bytes() == b.read_bytes()


# ------------------------------------------------------------------ bad input: one line, exit 2, nothing written

BAD_FLAGS = {
    "lambda too short": (["--lambda", "1,1,1"], "has 3 values but the gain table has 4 rewards"),
    "lambda zero": (["--lambda", "1,0,1,1"], "positive finite number"),
    "lambda negative": (["--lambda", "1,-1,1,1"], "positive finite number"),
    "lambda nan": (["--lambda", "1,nan,1,1"], "positive finite number"),
    "lambda text": (["--lambda", "1,a,1,1"], "is not a number"),
    "lambda unknown name": (["--lambda", "clip=1,aesthetic=2"], "unknown reward 'aesthetic'"),
    "lambda mixed": (["--lambda", "clip=1,2"], "not both"),
    "tau zero": (["--lambda", "1,1,1,1", "--tau", "0"], "--tau must be a positive number"),
    "tau negative": (["--lambda", "1,1,1,1", "--tau", "-2"], "--tau must be a positive number"),
    "steps zero": (["--lambda", "1,1,1,1", "--steps", "0"], "--steps must be an integer from 1 to 10000, got 0"),
    "steps text": (["--lambda", "1,1,1,1", "--steps", "ten"], "--steps"),
    "mode": (["--lambda", "1,1,1,1", "--mode", "greedy"], "--mode must be one of"),
    "flowmatch without shift": (["--lambda", "1,1,1,1", "--steps", "10", "--grid", "flowmatch"], "needs --shift"),
    "grid unknown": (["--lambda", "1,1,1,1", "--grid", "karras"], "--grid must be one of"),
    "steps unbounded": (["--lambda", "1,1,1,1", "--steps", "100000000"], "--steps must be an integer from 1 to 10000"),
    "lambda span": (["--lambda", "1e-300,1,1,1e300"], "the budgets span more than 1e+12x"),
    "tau tiny": (["--lambda", "1,1,1,1", "--tau", "1e-300"], "--tau 1e-300 is too small for these gains"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_flags_give_one_line_and_exit_2(gains_path, tmp_path, case):
    flags, needle = BAD_FLAGS[case]
    out = tmp_path / "W.safetensors"
    result = recast("solve-w", "--gains", gains_path, "--out", out, *flags)
    assert_one_line_exit_2(result, needle)
    assert not out.exists()


def test_huge_budgets_are_normalised_without_overflow(gains_path, tmp_path):
    out = tmp_path / "W.safetensors"
    result = recast("solve-w", "--gains", gains_path, "--lambda", "1e308,1e308,2e307,1e308", "--out", out)
    assert result.exit_code == 0 and "Warning" not in result.stderr and not result.stderr.strip(), result.stderr
    np.testing.assert_allclose(read_weights(out).W.sum(axis=1), np.array([10, 10, 2, 10]) / 32, atol=1e-10)


def test_bad_gain_tables_give_one_line_and_exit_2(example_path, tmp_path):
    from tests.test_artifacts import BAD_TABLES, _valid_arrow, _write_raw

    out = tmp_path / "W.safetensors"
    for case, (mutate, _) in BAD_TABLES.items():
        arrow, meta = mutate(*_valid_arrow(tmp_path))
        bad = _write_raw(tmp_path / "bad.parquet", arrow, meta)
        assert_one_line_exit_2(recast("solve-w", "--gains", bad, "--lambda", "1,1", "--out", out), str(bad))
    text = tmp_path / "notes.parquet"
    text.write_text("not parquet")
    assert_one_line_exit_2(recast("solve-w", "--gains", text, "--lambda", "1,1", "--out", out), "not a readable Parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(example_path.read_bytes()[: len(example_path.read_bytes()) // 2])
    assert_one_line_exit_2(recast("solve-w", "--gains", cut, "--lambda", "1,1,1", "--out", out), "not a readable Parquet")
    assert_one_line_exit_2(recast("inspect", text), "neither a Parquet nor a safetensors file")
    assert not out.exists()


def test_unwritable_output_gives_one_line_and_exit_2(gains_path, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert_one_line_exit_2(recast("solve-w", "--gains", gains_path, "--lambda", "1,1,1,1",
                                  "--out", blocker / "W.safetensors"), "cannot write")
    assert_one_line_exit_2(recast("solve-w", "--gains", gains_path, "--lambda", "1,1,1,1", "--out", tmp_path),
                           "is a directory")


def test_bad_input_creates_no_output_folders(gains_path, tmp_path):
    out = tmp_path / "new" / "deeper" / "W.safetensors"
    assert_one_line_exit_2(recast("solve-w", "--gains", gains_path, "--lambda", "1,1", "--out", out), "has 2 values")
    assert_one_line_exit_2(recast("inspect", tmp_path / "absent.parquet", "--plot", tmp_path / "new" / "f.png"),
                           "no such file")
    assert not (tmp_path / "new").exists()
    assert recast("solve-w", "--gains", gains_path, "--lambda", "1,1,1,1", "--out", out).exit_code == 0
    assert out.is_file()


def test_subprocess_bad_input_and_success(gains_path, tmp_path):
    """The installed console entry point, not just the in-process runner."""
    exe = [sys.executable, "-c", "from recast_cli.cli import main; main()"]
    out = tmp_path / "W.safetensors"
    bad = subprocess.run([*exe, "solve-w", "--gains", str(gains_path), "--lambda", "1,1", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "has 2 values" in bad.stderr
    assert not out.exists()
    good = subprocess.run([*exe, "solve-w", "--gains", str(gains_path), "--lambda", "1,1,1,1", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert read_weights(out).W.shape == (4, 25)
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["W.safetensors", "gains.parquet"]


def test_plot_d_curves_with_bootstrap_bands(gains_path, tmp_path):
    png = tmp_path / "d.png"
    result = recast("plot", "--gains", gains_path, "--d-curves", "--out", png)
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert_one_line_exit_2(recast("plot", "--weights", gains_path, "--d-curves", "--out", png), "--d-curves needs")


def test_an_output_that_is_also_an_input_is_refused_and_the_input_kept(gains_path, tmp_path):
    import hashlib
    import shutil

    gains = tmp_path / "g.parquet"
    shutil.copy(gains_path, gains)
    before = hashlib.sha256(gains.read_bytes()).hexdigest()
    W = tmp_path / "W.safetensors"
    assert recast("solve-w", "--gains", gains, "--lambda", "1,1,1,1", "--out", W).exit_code == 0
    cases = [
        ("solve-w", "--gains", gains, "--lambda", "1,1,1,1", "--out", gains),
        ("solve-w", "--gains", gains, "--lambda", "1,1,1,1", "--out", tmp_path / "." / "g.parquet"),
        ("plot", "--gains", gains, "--out", gains),
        ("plot", "--weights", W, "--out", W),
        ("inspect", W, "--plot", W),
    ]
    for args in cases:
        assert_one_line_exit_2(recast(*args), "it is also an input of this command")
    assert hashlib.sha256(gains.read_bytes()).hexdigest() == before
    assert read_weights(W).mode == "recast"


def test_help_lists_the_pipeline_in_order_shows_brackets_and_imports_no_torch():
    result = recast("--help")
    assert result.exit_code == 0
    listed = [line.split()[0] for line in result.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert listed[:8] == ["sample-positive", "estimate", "merge", "compare-gains", "solve-w", "train", "evaluate",
                          "report"]
    assert "[study]" in result.stdout  # help texts are not read as rich markup
    assert "setting's [evaluate] judges" in " ".join(recast("evaluate", "--help").stdout.split())
    merge = " ".join(recast("merge", "--help").stdout.split())
    assert "Rényi order" in merge and "isotonic (PAVA) or clip" in merge
    probe = subprocess.run([sys.executable, "-c", "import sys, recast_cli.cli; "
                            "print(sorted(m for m in ('torch', 'scipy', 'diffusers', 'PIL') if m in sys.modules))"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]"  # `recast --help` / `--version` pay for no heavy stack
