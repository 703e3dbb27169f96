"""Nothing recast did not write is deleted: outputs that would replace a folder check what is in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from recast_cli.artifacts import RunRecord, read_weights, write_run
from recast_cli.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_toy_pretrain_replaces_only_a_model_folder_it_wrote(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = invoke("toy", "pretrain", "--out", out, "--work", tmp_path / "work", "--steps", "1", "--vae-steps", "1")
    assert result.exit_code == 2 and "is not a model folder recast toy pretrain wrote" in result.stderr
    assert (out / "notes.txt").read_text() == "mine" and not (tmp_path / "work").exists()
    # one of ours with an extra file in it is refused too, naming the file
    (out / "notes.txt").unlink()
    (out / "PROVENANCE.json").write_text(json.dumps({"command": "recast toy pretrain --out x"}))
    (out / "mine.bin").write_bytes(b"x")
    result = invoke("toy", "pretrain", "--out", out, "--work", tmp_path / "work", "--steps", "1", "--vae-steps", "1")
    assert result.exit_code == 2 and "it also holds mine.bin" in result.stderr
    assert (out / "mine.bin").is_file()


def test_evaluate_replaces_only_images_it_wrote(tmp_path):
    images = tmp_path / "e.images"
    (images / "00000").mkdir(parents=True)
    (images / "00000" / "000.png").write_bytes(b"")
    (images / "notes.txt").write_text("mine")
    result = invoke("evaluate", "--setting", "toy", "--out", tmp_path / "e.parquet", "--n", "1")
    assert result.exit_code == 2 and "holds notes.txt, which recast evaluate did not write" in result.stderr
    assert (images / "notes.txt").read_text() == "mine" and not (tmp_path / "e.parquet").exists()


# --------------------------------------------------------------------------- single-file outputs (issue 30)

def one_line_2(result, needle: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def solve(gains, out, *extra):
    return invoke("solve-w", "--gains", gains, "--lambda", "1,1,1,1", "--out", out, *extra)


def test_solve_w_refuses_a_pipe_and_a_symlink_and_leaves_them(gains_path, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_line_2(solve(gains_path, fifo), "is not a regular file")
    assert fifo.is_fifo()
    target = tmp_path / "mine.txt"
    target.write_text("mine")
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    one_line_2(solve(gains_path, link), "symbolic link")
    assert link.is_symlink() and target.read_text() == "mine"


def test_solve_w_replaces_only_its_own_kind_of_file(gains_path, tmp_path):
    user = tmp_path / "notes.safetensors"
    user.write_text("my notes")
    one_line_2(solve(gains_path, user), "not a recast artifact")
    assert user.read_text() == "my notes"
    # a recast artifact of another schema (a gain table) is not replaced by W
    other = tmp_path / "other.parquet"
    other.write_bytes(gains_path.read_bytes())
    one_line_2(solve(gains_path, other), "is a recast.gains/2 artifact")
    assert other.read_bytes() == gains_path.read_bytes()
    # an earlier W is replaced, and no lock file is left beside it
    w = tmp_path / "W.safetensors"
    assert solve(gains_path, w).exit_code == 0
    assert solve(gains_path, w, "--mode", "static").exit_code == 0
    assert read_weights(w).mode == "static"
    assert not list(tmp_path.glob(".*.lock"))


def test_no_output_inside_a_run_or_positives_folder(gains_path, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_run(run, RunRecord(rewards=("clip", "hps", "pick", "ocr"), lam=(1, 1, 1, 1), mode="recast",
                             sigmas=tuple(np.linspace(1, 0, 26))), config={"setting": "toy"})
    assert solve(gains_path, tmp_path / "W.safetensors").exit_code == 0
    (run / "weights.safetensors").write_bytes((tmp_path / "W.safetensors").read_bytes())
    before = (run / "weights.safetensors").read_bytes()
    one_line_2(solve(gains_path, run / "weights.safetensors", "--mode", "static"), "a recast.run/1 folder")
    assert (run / "weights.safetensors").read_bytes() == before
    one_line_2(solve(gains_path, run / "sub" / "new.safetensors"), "a recast.run/1 folder")
    assert not (run / "sub").exists()

    positives = tmp_path / "pos"
    result = invoke("sample-positive", "--setting", "toy", "--source", "renderer", "--n", "1", "--out", positives)
    assert result.exit_code == 0, result.stderr
    manifest = (positives / "manifest.parquet").read_bytes()
    one_line_2(invoke("merge", gains_path, "--out", positives / "manifest.parquet"), "a recast.positives/1 folder")
    assert (positives / "manifest.parquet").read_bytes() == manifest
    one_line_2(invoke("train", "--setting", "toy", "--weights", "static", "--out", positives / "run", "--max-steps", "1"),
               "a recast.positives/1 folder")
    assert not (positives / "run").exists()


def test_estimate_refuses_a_user_file_at_its_implicit_scores_output_before_any_rollout(tmp_path):
    scores = tmp_path / "G.scores.parquet"
    scores.write_text("my table")
    result = invoke("estimate", "--policy", "gmm1d", "--rewards", "coarse,fine", "--steps", "4", "--n", "2",
                    "--k", "2", "--out", tmp_path / "G.parquet")
    one_line_2(result, "G.scores.parquet: it exists and is not a recast artifact")
    assert scores.read_text() == "my table"
    assert not (tmp_path / "G.parquet").exists() and not (tmp_path / "G.parquet.parts").exists()


def test_plot_and_inspect_replace_only_their_own_figures(example_path, tmp_path):
    photo = tmp_path / "photo.png"
    from PIL import Image

    Image.new("RGB", (4, 4), "red").save(photo)
    before = photo.read_bytes()
    one_line_2(invoke("plot", "--gains", example_path, "--out", photo), "not a recast artifact")
    one_line_2(invoke("inspect", example_path, "--plot", photo), "not a recast artifact")
    assert photo.read_bytes() == before
    fig = tmp_path / "fig.png"
    assert invoke("plot", "--gains", example_path, "--out", fig).exit_code == 0
    assert invoke("inspect", example_path, "--plot", fig).exit_code == 0  # its own figure: replaced
    assert invoke("plot", "--gains", example_path, "--d-curves", "--out", fig).exit_code == 0


def test_report_refuses_a_user_report_md(example_path, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.md").write_text("# my report\n")
    one_line_2(invoke("report", example_path, "--out", out), "report.md: it exists and is not a recast artifact")
    assert (out / "report.md").read_text() == "# my report\n"


# --------------------------------------------------------------------------- temporary files

def test_stale_temp_cleanup_deletes_only_recasts_own_names(gains_path, tmp_path):
    w = tmp_path / "W.safetensors"
    keep = [tmp_path / ".W.safetensors.backup.tmp", tmp_path / ".W.safetensors.1.tmp",
            tmp_path / ".W.safetensors.123.ab.tmp", tmp_path / ".W.safetensors.notapid.abcdefgh.tmp"]
    for path in keep:
        path.write_text("mine")
    stale = tmp_path / ".W.safetensors.4194305.abc_1234.tmp"  # a PID above Linux's pid_max: its writer is gone
    stale.write_text("left by a killed write")
    assert solve(gains_path, w).exit_code == 0
    assert all(p.read_text() == "mine" for p in keep)
    assert not stale.exists()


# --------------------------------------------------------------------------- one writer per single-file output

HOLDER = textwrap.dedent("""
    import sys
    from recast_cli.artifacts.outputs import claim_output
    claim_output(sys.argv[1], "recast.weights/1")
    print("held", flush=True)
    sys.stdin.read()
""")


def test_a_second_writer_of_one_file_is_refused_until_the_first_is_done(gains_path, tmp_path):
    w = tmp_path / "W.safetensors"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(w)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "held"
        one_line_2(solve(gains_path, w), "is being written by another recast process")
        assert not w.exists()
    finally:
        holder.communicate("")
    assert solve(gains_path, w).exit_code == 0
    assert not list(tmp_path.glob(".*.lock"))


def test_sample_replaces_only_its_own_pngs_and_not_inside_an_artifact_folder(tmp_path):
    out = tmp_path / "imgs"
    out.mkdir()
    mine = out / "a-red-circle-on-a-white-background-0000.png"
    mine.write_bytes(b"my picture")
    args = ("sample", "--setting", "toy", "--prompt", "a red circle on a white background", "--n", "1",
            "--steps", "2", "--out")
    one_line_2(invoke(*args, out), "background-0000.png: it exists and is not a recast artifact")
    assert mine.read_bytes() == b"my picture"
    mine.unlink()
    assert invoke(*args, out).exit_code == 0
    assert invoke(*args, out).exit_code == 0  # its own image: replaced
    run = tmp_path / "run"
    run.mkdir()
    write_run(run, RunRecord(rewards=("toy_color",), lam=(1,), mode="recast", sigmas=(1.0, 0.0)),
              config={"setting": "toy"})
    one_line_2(invoke(*args, run / "imgs"), "a recast.run/1 folder")


def test_a_killed_checkpoint_save_is_cleaned_but_look_alike_names_are_kept(tmp_path):
    from recast_cli.train.checkpoint import clean_partial

    root = tmp_path / "checkpoints"
    (root / ".step-000004.k2j_x9ab.tmp").mkdir(parents=True)
    keep = [root / ".step-notes.tmp", root / ".step-000004.backup.tmp"]
    for path in keep:
        path.mkdir()
    clean_partial(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in keep)
