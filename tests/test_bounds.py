"""Every count bounded, through the real CLI (issue 30, items 4 and 7).

Each count a command or a setting accepts has a range (``recast_cli/bounds.py``); out of range
is one line naming the option, the value and the range, exit 2, nothing written — checked
before any work. ``recast score`` decodes a folder in bounded chunks after summing the pixels
its headers declare. A huge ``--seed``, a deeply nested TOML value, a 10 MB prompt line and a
prompts file with a byte-order mark each get one line (or are simply read).
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from recast_cli.artifacts import read_positives
from recast_cli.bounds import BOUNDS, PRODUCTS
from recast_cli.cli import app
from recast_cli.rewards.base import Scorer, check_batch
from recast_cli.train.config import BOUND_OF, TrainConfig
from tests.test_hardening import bomb_png

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle on a white background"
HUGE = "99999999999999999999999"
SEED_RANGE = "must be an integer from 0 to 4294967295"


def invoke(*args, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


def one_line(result, *needles: str) -> str:
    """The one stderr line of a refused command (exit 2, no traceback), holding every needle."""
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[:2000]
    for needle in needles:
        assert needle in lines[0], lines[0][:2000]
    return lines[0]


def nothing_new(folder: Path, before: set[Path]) -> None:
    assert set(folder.iterdir()) == before, sorted(p.name for p in set(folder.iterdir()) - before)


# ------------------------------------------------------------------ every command's count flags

#: (command line with {out} for the output path, the refusal) — every count flag of every command
FLAGS = {
    "estimate --steps": (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", "{out}", "--steps",
                          "1000000"], "--steps must be an integer from 1 to 10000, got 1000000"),
    "estimate --n": (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", "{out}", "--n", "10001"],
                     "--n must be an integer from 1 to 10000, got 10001"),
    "estimate --k": (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", "{out}", "--k", "0"],
                     "--k must be an integer from 1 to 10000, got 0"),
    "estimate --p": (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", "{out}", "--p", "100001"],
                     "--p must be an integer from 1 to 100000, got 100001"),
    "estimate --seed": (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", "{out}", "--seed", "-1"],
                        f"--seed {SEED_RANGE}, got -1"),
    "estimate --batch-size": (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", "{out}",
                               "--batch-size", "100000"], "--batch-size must be an integer from 1 to 65536"),
    "estimate --bootstrap": (["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", "{out}",
                              "--bootstrap", "1000000000"], "--bootstrap must be an integer from 0 to 10000"),
    "merge --bootstrap": (["merge", "nowhere.scores.parquet", "--out", "{out}", "--bootstrap", "1000000000"],
                          "--bootstrap must be an integer from 0 to 10000, got 1000000000"),
    "sample --n": (["sample", "--out", "{out}", "--prompt", PROMPT, "--n", "100000000"],
                   "--n must be an integer from 1 to 100000, got 100000000"),
    "sample --steps": (["sample", "--out", "{out}", "--prompt", PROMPT, "--steps", "100000"],
                       "--steps must be an integer from 1 to 10000"),
    "sample --batch": (["sample", "--out", "{out}", "--prompt", PROMPT, "--batch", "0"],
                       "--batch must be an integer from 1 to 65536, got 0"),
    "sample-positive --n": (["sample-positive", "--source", "renderer", "--setting", "toy", "--out", "{out}",
                             "--n", "100001"], "--n must be an integer from 1 to 100000"),
    "sample-positive --resolution": (["sample-positive", "--source", "renderer", "--setting", "toy", "--out", "{out}",
                                      "--n", "1", "--resolution", "100000"],
                                     "--resolution must be an integer from 8 to 8192, got 100000"),
    "sample-positive --draws": (["sample-positive", "--source", "self", "--setting", "toy", "--out", "{out}",
                                 "--n", "1", "--draws", "1000000"], "--draws must be an integer from 1 to 100000"),
    "sample-positive --concurrency": (["sample-positive", "--source", "renderer", "--setting", "toy", "--out",
                                       "{out}", "--n", "1", "--concurrency", "100000"],
                                      "--concurrency must be an integer from 1 to 256"),
    "sample-positive --retries": (["sample-positive", "--source", "renderer", "--setting", "toy", "--out", "{out}",
                                   "--n", "1", "--retries", "1000"], "--retries must be an integer from 0 to 100"),
    "evaluate --n": (["evaluate", "--setting", "toy", "--out", "{out}", "--n", "100001"],
                     "--n must be an integer from 1 to 100000, got 100001"),
    "evaluate --batch-size": (["evaluate", "--setting", "toy", "--out", "{out}", "--batch-size", "0"],
                              "--batch-size must be an integer from 1 to 65536, got 0"),
    "evaluate --checkpoint": (["evaluate", "--setting", "toy", "--out", "{out}", "--checkpoint", "10000000"],
                              "--checkpoint must be an integer from 0 to 1000000"),
    "train --max-steps": (["train", "--setting", "toy", "--weights", "static", "--out", "{out}", "--max-steps",
                           "10000000"], "--max-steps must be an integer from 1 to 1000000, got 10000000"),
    "train --group-size": (["train", "--setting", "toy", "--weights", "static", "--out", "{out}", "--group-size",
                            "5000"], "--group-size must be an integer from 2 to 1024"),
    "train --prompts-per-step": (["train", "--setting", "toy", "--weights", "static", "--out", "{out}",
                                  "--prompts-per-step", "0"], "--prompts-per-step must be an integer from 1 to 4096"),
    "train --save-every": (["train", "--setting", "toy", "--weights", "static", "--out", "{out}", "--save-every",
                            "0"], "--save-every must be an integer from 1 to 1000000, got 0"),
    "train --set micro_batch": (["train", "--setting", "toy", "--weights", "static", "--out", "{out}", "--set",
                                 "micro_batch=1000000"], "--set micro_batch must be an integer from 1 to 65536"),
    "train --set lora_rank": (["train", "--setting", "toy", "--weights", "static", "--out", "{out}", "--set",
                               "lora_rank=100000"], "--set lora_rank must be an integer from 0 to 4096"),
    "train --set seed": (["train", "--setting", "toy", "--weights", "static", "--out", "{out}", "--set",
                          "seed=4294967296"], f"--set seed {SEED_RANGE}, got 4294967296"),
    "score --batch-size": (["score", "--rewards", "toy_color", "--images", "nowhere", "--prompt", PROMPT, "--out",
                            "{out}", "--batch-size", "0"], "--batch-size must be an integer from 1 to 65536, got 0"),
    "serve-reward --max-batch": (["serve-reward", "toy_color", "--max-batch", "1000000"],
                                 "--max-batch must be an integer from 1 to 65536"),
    "serve-reward --max-pixels": (["serve-reward", "toy_color", "--max-pixels", str(2**40)],
                                  "--max-pixels must be an integer from 1 to 268435456"),
    "judge --retries": (["judge", "--pairs", "nowhere.csv", "--url", "http://127.0.0.1:9/v1", "--model", "m",
                         "--out", "{out}", "--retries", "0"], "--retries must be an integer from 1 to 100, got 0"),
    "solve-w --steps": (["solve-w", "--gains", "nowhere.parquet", "--lambda", "1", "--out", "{out}", "--steps",
                         "100000"], "--steps must be an integer from 1 to 10000, got 100000"),
    "solve-w --skip-clean": (["solve-w", "--gains", "nowhere.parquet", "--lambda", "1", "--out", "{out}",
                              "--skip-clean", "100000"], "--skip-clean must be an integer from 0 to 9999"),
    "report --prompts": (["report", "nowhere.parquet", "--out", "{out}", "--prompts", "1000"],
                         "--prompts must be an integer from 0 to 100, got 1000"),
    "toy pretrain --steps": (["toy", "pretrain", "--out", "{out}", "--work", "{out}-work", "--steps", "100000000"],
                             "--steps must be an integer from 1 to 1000000"),
    "toy pretrain --vae-steps": (["toy", "pretrain", "--out", "{out}", "--work", "{out}-work", "--vae-steps", "0"],
                                 "--vae-steps must be an integer from 1 to 1000000, got 0"),
    "toy pretrain --batch": (["toy", "pretrain", "--out", "{out}", "--work", "{out}-work", "--batch", "100000"],
                             "--batch must be an integer from 1 to 65536"),
    "toy quality --n": (["toy", "quality", "--model", "{out}", "--n", "100000"],
                        "--n must be an integer from 1 to 1000, got 100000"),
}


@pytest.mark.parametrize("case", sorted(FLAGS))
def test_every_count_flag_out_of_range_is_one_line_before_any_work(tmp_path, case):
    args, needle = FLAGS[case]
    before = set(tmp_path.iterdir())
    result = invoke(*(a.replace("{out}", str(tmp_path / "out")) for a in args))
    one_line(result, needle)
    nothing_new(tmp_path, before)


@pytest.mark.parametrize("command", [
    ["estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", "{out}"],
    ["sample", "--out", "{out}", "--prompt", PROMPT],
    ["sample-positive", "--source", "renderer", "--setting", "toy", "--n", "1", "--out", "{out}"],
    ["evaluate", "--setting", "toy", "--out", "{out}"],
    ["train", "--setting", "toy", "--weights", "static", "--out", "{out}"],
    ["tiny-model", "--family", "sd3", "--out", "{out}"],
    ["toy", "pretrain", "--out", "{out}", "--work", "{out}-work"],
    ["toy", "quality", "--model", "{out}"],
], ids=lambda c: " ".join(c[:2]))
def test_a_huge_seed_is_one_line_on_every_command(tmp_path, command):
    before = set(tmp_path.iterdir())
    result = invoke(*(a.replace("{out}", str(tmp_path / "out")) for a in command), "--seed", HUGE)
    one_line(result, f"--seed {SEED_RANGE}, got {HUGE}")
    nothing_new(tmp_path, before)


def test_products_of_counts_have_a_ceiling(tmp_path):
    out = tmp_path / "g.parquet"
    cells = invoke("estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", out, "--n", "10000", "--k",
                   "10000", "--steps", "100")
    one_line(cells, "P 1 × N 10000 × T+1 101 × K 10000 × m 1 = 10100000000 is more than 268435456")
    boot = invoke("estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", out, "--bootstrap", "10000",
                  "--steps", "10000")
    one_line(boot, "--bootstrap 10000 × T+1 10001 × m 1 = 100010000 is more than 67108864")
    images = invoke("train", "--setting", "toy", "--weights", "static", "--out", tmp_path / "run",
                    "--group-size", "1024", "--prompts-per-step", "4096")
    one_line(images, "group_size 1024 × prompts_per_step 4096 = 4194304 is more than 65536")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ the same bounds in a setting file

BASE = """[policy]
kind = "flow1d"
{policy}
[train]
rewards = ["coarse"]
lambda = [1]
prompts = "twoscale-prompts.txt"
{train}
[evaluate]
{evaluate}
[study]
budgets = [[1]]
{study}
"""

SETTINGS = {
    "[policy] steps": ({"policy": "steps = 100000"}, "[policy] steps must be an integer from 1 to 10000"),
    "[policy] resolution": ({"policy": "resolution = 4"}, "[policy] resolution must be an integer from 8 to 8192"),
    "[policy] max_sequence_length": ({"policy": "max_sequence_length = 100000"},
                                     "[policy] max_sequence_length must be an integer from 1 to 8192"),
    "[policy] features": ({"policy": "features = 64"}, "[policy] features must be an integer from 1 to 32, got 64"),
    "[policy] hidden": ({"policy": "hidden = 100000"}, "[policy] hidden must be an integer from 1 to 4096"),
    "[train] max_steps": ({"train": "max_steps = 10000000"}, "[train] max_steps must be an integer from 1 to 1000000"),
    "[train] seed": ({"train": f"seed = {HUGE}"}, f"[train] seed {SEED_RANGE}, got {HUGE}"),
    "[train] sample_batch": ({"train": "sample_batch = 0"}, "[train] sample_batch must be an integer from 1 to 65536"),
    "[train] keep_checkpoints": ({"train": "keep_checkpoints = 5000"},
                                 "[train] keep_checkpoints must be an integer from 1 to 1000"),
    "[train] updates_per_step": ({"train": "updates_per_step = 5000"},
                                 "[train] updates_per_step must be an integer from 1 to 1000"),
    "[train] warmup_steps": ({"train": "warmup_steps = -1"}, "[train] warmup_steps must be an integer from 0 to"),
    "[evaluate] n": ({"evaluate": "n = 1000000"}, "[evaluate]: n must be an integer from 1 to 100000"),
    "[evaluate] seed": ({"evaluate": "seed = 4294967296"}, f"[evaluate]: seed {SEED_RANGE}"),
    "[evaluate] steps": ({"evaluate": "steps = 100000"}, "[evaluate]: steps must be an integer from 1 to 10000"),
    "[evaluate] batch_size": ({"evaluate": "batch_size = 1000000"},
                              "[evaluate]: batch_size must be an integer from 1 to 65536"),
    "[study] seeds": ({"study": f"seeds = [0, {HUGE}]"}, f"[study] seeds[1] {SEED_RANGE}, got {HUGE}"),
    "[study] seeds range": ({"study": f'seeds = "0:{HUGE}"'},
                            f"[study] seeds (how many) must be an integer from 1 to 65536, got {HUGE}"),
    "[study] seeds range end": ({"study": 'seeds = "4294967290:4294967300"'},
                                f"[study] seeds {SEED_RANGE}, got 4294967299"),
    "[study] seeds digits": ({"study": 'seeds = "0:²"'}, "a string must be \"LO:HI\" with LO < HI"),
    "[study] n": ({"study": "n = 100000"}, "[study] n must be an integer from 1 to 10000"),
    "[study] k": ({"study": "k = 0"}, "[study] k must be an integer from 1 to 10000, got 0"),
    "[study] p": ({"study": "p = 1000000"}, "[study] p must be an integer from 1 to 100000"),
    "[study] estimate_steps": ({"study": "estimate_steps = 100000"},
                               "[study] estimate_steps must be an integer from 1 to 10000"),
    "[study] warmup_steps": ({"study": "warmup_steps = 10000000"},
                             "[study] warmup_steps must be an integer from 0 to 1000000"),
}


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_every_count_key_of_a_setting_is_bounded(tmp_path, case):
    parts, needle = SETTINGS[case]
    (tmp_path / "twoscale-prompts.txt").write_text("x\n")
    setting = tmp_path / "s.toml"
    setting.write_text(BASE.format(**{"policy": "", "train": "", "evaluate": "", "study": "", **parts}))
    before = set(tmp_path.iterdir())
    one_line(invoke("check-setting", setting), needle)
    nothing_new(tmp_path, before)


def test_the_train_table_bounds_every_integer_key():
    ints = {f.name for f in fields(TrainConfig) if f.type.startswith("int")}
    assert set(BOUND_OF) == ints and set(BOUND_OF.values()) <= set(BOUNDS)


def test_docs_list_every_bound_as_the_code_has_it():
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    for kind, bound in BOUNDS.items():
        assert re.search(rf"\| `{kind}` \| {bound.low} \| {bound.high} \|", text), kind
    for kind, product in PRODUCTS.items():
        assert re.search(rf"\| `{kind}` \| {product.limit} \|", text), kind


STUDY_ARGS = {  # issue 40, findings 9 and 10: one line, exit 2, before any range or array is built
    "a range too long": (["--seeds", "0:4294967296"], "--seeds (how many) must be an integer from 1 to 65536, "
                                                      "got 4294967296"),
    "a range past int64": (["--seeds", "0:99999999999999999999"], "--seeds (how many) must be an integer from 1 to "
                                                                   "65536, got 99999999999999999999"),
    "a range past the last seed": (["--seeds", "4294967290:4294967300"], f"--seeds {SEED_RANGE}, got 4294967299"),
    "seeds × rollouts × T": (["--seeds", "0:65536", "--set", "prompts_per_step=4096", "--set", "group_size=16"],
                            "seeds 65536 × rollouts per step 65536 × T 10 = 42949672960 is more than 134217728"),
    "a cell's memory": (["--seeds", "0:64"], "seeds 64, rollouts per step 64, T 10, hidden 4096: study: one cell's "
                                             "working set, estimated from the arrays the batched engine "
                                             "allocates, is 3"),
}


@pytest.mark.parametrize("case", sorted(STUDY_ARGS))
def test_a_study_cell_is_bounded_before_any_allocation(tmp_path, case):
    args, needle = STUDY_ARGS[case]
    (tmp_path / "twoscale-prompts.txt").write_text("x\n")
    setting = tmp_path / "s.toml"
    setting.write_text(BASE.format(policy="hidden = 4096" if "memory" in case else "", study="",
                                   train="group_size = 8\nprompts_per_step = 8", evaluate=""))
    before = set(tmp_path.iterdir())
    one_line(invoke("study", setting, "--out", tmp_path / "st", *args), needle)
    nothing_new(tmp_path, before)


# ------------------------------------------------------------------ item 7: huge, deep and long input

def test_a_seed_too_long_to_print_is_still_one_short_line(tmp_path):
    digits = "9" * 50_000  # beyond Python's 4300-digit int-string limit: Click refuses it, quoting it
    line = one_line(invoke("estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", tmp_path / "g.parquet",
                           "--seed", digits), "--seed")
    assert len(line) < 1100
    setting = tmp_path / "s.toml"
    setting.write_text(f'[policy]\nkind = "flow1d"\n[train]\nseed = {digits}\n')
    assert len(one_line(invoke("check-setting", setting), str(setting), "not valid TOML")) < 1100


def test_deeply_nested_arrays_are_one_line(tmp_path):
    setting = tmp_path / "deep.toml"
    setting.write_text('[policy]\nkind = "flow1d"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n")
    one_line(invoke("check-setting", setting), str(setting), "not valid TOML (arrays or tables nested too deeply)")
    one_line(invoke("train", "--setting", "toy", "--weights", "static", "--out", tmp_path / "run", "--set",
                    "lora_targets=" + "[" * 100_000 + "]" * 100_000), "--set lora_targets: the value nests")
    prompts = tmp_path / "deep.jsonl"
    prompts.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    one_line(invoke("sample-positive", "--source", "renderer", "--setting", "toy", "--n", "1", "--out",
                    tmp_path / "pos", "--prompts", prompts), "line 1 is not JSON")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.jsonl", "deep.toml"]


def test_a_10_mb_prompt_line_is_quoted_cut(tmp_path):
    huge = "a red circle " + "x" * 10_000_000
    prompts = tmp_path / "p.txt"
    prompts.write_text(f"{huge}\n")
    line = one_line(invoke("sample-positive", "--source", "renderer", "--setting", "toy", "--n", "1", "--out",
                           tmp_path / "pos", "--prompts", prompts), "is outside the toy vocabulary",
                    f"… ({len(repr(huge)) - 200} more characters)")
    assert len(line) < 1000
    prompts.write_text(f"{huge}\n{huge}\n")  # the duplicate rule quotes the prompt too
    line = one_line(invoke("sample-positive", "--source", "renderer", "--setting", "toy", "--n", "1", "--out",
                           tmp_path / "pos", "--prompts", prompts), "appears twice (prompts 0 and 1)")
    assert len(line) < 1000
    # a message that quotes a huge value whole (Click's, here) is cut by the CLI's last guard
    line = one_line(invoke("estimate", "--policy", "gmm1d", "--rewards", "coarse", "--out", tmp_path / "g.parquet",
                           "--steps", "x" * 10_000_000), "--steps")
    assert len(line) <= 1000 + len("… (99999999 more characters)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.txt"]


def test_a_prompts_file_with_a_byte_order_mark_is_read(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_bytes("\ufeffa red circle on a white background\na blue square on a black background\n"
                        .encode("utf-8"))
    result = invoke("sample-positive", "--source", "renderer", "--setting", "toy", "--n", "1", "--out",
                    tmp_path / "pos", "--prompts", prompts)
    assert result.exit_code == 0, result.stderr
    assert sorted({s.prompt for s in read_positives(tmp_path / "pos").samples}) == [
        "a blue square on a black background", "a red circle on a white background"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes('\ufeff{"prompt": "a red circle on a white background"}\n'.encode("utf-8"))
    result = invoke("sample-positive", "--source", "renderer", "--setting", "toy", "--n", "1", "--out",
                    tmp_path / "pos2", "--prompts", jsonl)
    assert result.exit_code == 0, result.stderr


# ------------------------------------------------------------------ recast score: chunks and the pixel budget

class RecordingScorer(Scorer):
    """Mean brightness; records how many images and pixels each call holds (class-level log)."""

    name = "recording"
    output_range = (0.0, 1.0)
    calls: list[tuple[int, int]] = []

    def score(self, images, prompts):
        import numpy as np

        check_batch(self.name, images, prompts)
        RecordingScorer.calls.append((len(images), sum(im.size[0] * im.size[1] for im in images)))
        return np.array([np.asarray(im, dtype=np.float64).mean() / 255 for im in images])


def write_images(folder: Path, count: int, side: int) -> None:
    folder.mkdir()
    for i in range(count):
        Image.new("RGB", (side, side), (10 * i, 0, 0)).save(folder / f"{i:02d}.png")


def test_score_decodes_a_folder_in_bounded_chunks(tmp_path, monkeypatch):
    from recast_cli.artifacts import read_image_scores
    from recast_cli.rewards import scoring

    write_images(tmp_path / "img", 5, 64)
    monkeypatch.setattr(scoring, "CHUNK_PIXELS", 2 * 64 * 64)
    RecordingScorer.calls.clear()
    result = invoke("score", "--rewards", "tests.test_bounds:RecordingScorer", "--images", tmp_path / "img",
                    "--prompt", PROMPT, "--out", tmp_path / "s.parquet")
    assert result.exit_code == 0, result.stderr
    assert RecordingScorer.calls == [(2, 2 * 64 * 64), (2, 2 * 64 * 64), (1, 64 * 64)]
    scores = read_image_scores(tmp_path / "s.parquet").column("score").to_pylist()
    assert scores == pytest.approx([10 * i / 255 / 3 for i in range(5)])
    RecordingScorer.calls.clear()
    assert invoke("score", "--rewards", "tests.test_bounds:RecordingScorer", "--images", tmp_path / "img",
                  "--prompt", PROMPT, "--out", tmp_path / "t.parquet", "--batch-size", "1").exit_code == 0
    assert RecordingScorer.calls == [(1, 64 * 64)] * 5


def test_score_checks_the_folder_pixel_budget_from_the_headers(tmp_path, monkeypatch):
    folder = tmp_path / "img"
    folder.mkdir()
    for i in range(20):  # 20 headers of 4000 x 4000: 964 KB of pixels, were they real
        (folder / f"{i:02d}.png").write_bytes(bomb_png(4000, 4000))
    monkeypatch.setenv("RECAST_MAX_TOTAL_PIXELS", str(10**8))
    result = invoke("score", "--rewards", "toy_color", "--images", folder, "--prompt", PROMPT, "--out",
                    tmp_path / "s.parquet")
    one_line(result, "the 20 images hold 320000000 pixels in all, more than the limit of 100000000",
             "$RECAST_MAX_TOTAL_PIXELS")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img"]


def test_an_image_past_pillows_bomb_limit_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "bomb.png").write_bytes(bomb_png(20000, 20000))
    monkeypatch.setenv("RECAST_MAX_IMAGE_PIXELS", str(10**12))  # recast's own limit out of the way
    result = invoke("score", "--rewards", "toy_color", "--images", tmp_path / "bomb.png", "--prompt", PROMPT,
                    "--out", tmp_path / "s.parquet")
    one_line(result, "bomb.png", "decompression bomb")
    assert not (tmp_path / "s.parquet").exists()
