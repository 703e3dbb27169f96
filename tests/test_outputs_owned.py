"""Nothing recast did not write is deleted: outputs that would replace a folder check what is in it."""

from __future__ import annotations

import json

from typer.testing import CliRunner

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
