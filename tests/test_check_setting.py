"""`recast check-setting`: the shipped settings, the paper settings over tiny stand-ins, and bad input."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.errors import BadInput
from recast_cli.rewards.options import resolve_reward_options, reward_options
from recast_cli.setting.load import load_setting
from recast_cli.study.spec import StudySpec, load_study
from tests import hubcache

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"
runner = CliRunner()

GENEVAL_ROWS = [
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
    {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}],
     "prompt": "a photo of a cat and a dog"},
]


def check(*args) -> object:
    return runner.invoke(app, ["check-setting", *(str(a) for a in args)])


def assert_one_line_exit_2(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


#: the shipped settings and the Hub repo of the model each names
PAPER_SETTINGS = {"ocr": "stabilityai/stable-diffusion-3.5-medium", "geneval": "stabilityai/stable-diffusion-3.5-medium",
                  "flux-ocr": "black-forest-labs/FLUX.1-dev", "qwenimage-ocr": "Qwen/Qwen-Image"}


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> Iterator[Path]:
    """A tree laid out as the paper settings expect: pipelines/ (verbatim copies), data/, and a Hugging
    Face cache (``hf/``, the process's cache while the module runs) holding every repo they name.

    The SD3 snapshot is a tiny randomly initialised SD3-architecture pipeline in diffusers layout, the
    FLUX and Qwen-Image ones the tiny models of their families' real classes; the reward repos hold
    files of the names and kinds the checks look for.
    """
    from recast_cli.policy.tiny import write_tiny_model
    from recast_cli.toy.model import build_pipeline, save_pipeline
    from recast_cli.toy.pretrain import toy_words

    root = tmp_path_factory.mktemp("paper")
    (root / "pipelines").mkdir()
    # the GenEval training reward's server: something that answers HTTP (check-setting asks only that)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name in PAPER_SETTINGS:
        text = (PIPELINES / f"{name}.toml").read_text()
        text = text.replace('url = "http://127.0.0.1:18085"', f'url = "http://127.0.0.1:{server.server_port}"')
        (root / "pipelines" / f"{name}.toml").write_text(text)
    cache = root / "hf"
    hubcache.put(cache, "stabilityai/stable-diffusion-3.5-medium",
                 write=lambda folder: save_pipeline(build_pipeline(toy_words(), with_t5=True), folder))
    hubcache.put(cache, "black-forest-labs/FLUX.1-dev", write=lambda folder: write_tiny_model("flux", folder))
    hubcache.put(cache, "Qwen/Qwen-Image", write=lambda folder: write_tiny_model("qwenimage", folder))
    for repo, files in hubcache.PAPER_REWARD_FILES.items():
        hubcache.put(cache, repo, files)
    ocr = root / "data" / "ocr"
    ocr.mkdir(parents=True)
    (ocr / "train.txt").write_text('A shop sign that reads "OPEN"\nA poster with the words "Hello World"\n')
    (ocr / "test.txt").write_text('A mug printed with "coffee"\n')
    (ocr / "estimate.txt").write_text('A shop sign that reads "OPEN"\n')
    geneval = root / "data" / "geneval"
    geneval.mkdir(parents=True)
    lines = "".join(json.dumps(row) + "\n" for row in GENEVAL_ROWS)
    (geneval / "train_metadata.jsonl").write_text(lines)
    (geneval / "test_metadata.jsonl").write_text(lines)
    (geneval / "metadata.jsonl").write_text(lines)
    (geneval / "estimate.txt").write_text("a photo of a cat\n")
    with hubcache.using_cache(cache):
        yield root
    server.shutdown()


def variant(standins: Path, base: str, name: str, old: str, new: str) -> Path:
    """A copy of a paper setting beside it (same relative paths) with ``old`` replaced by ``new``."""
    text = (standins / "pipelines" / f"{base}.toml").read_text()
    assert old in text, old
    path = standins / "pipelines" / f"{name}.toml"
    path.write_text(text.replace(old, new, 1))
    return path


class Answers(BaseHTTPRequestHandler):
    """A server that answers every GET (404) and logs nothing."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    """The paper settings' positives come from an image API whose key is read from the environment: set, as
    on a node that is ready; the bare-machine test takes it away."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")


def test_toy_setting_passes():
    result = check("toy")
    assert result.exit_code == 0, result.stderr
    assert "all" in result.stdout and "checks passed" in result.stdout
    assert "[policy]" in result.stdout and "24 prompts" in result.stdout


@pytest.mark.parametrize("name", PAPER_SETTINGS)
def test_paper_settings_name_the_missing_hub_model_and_how_to_fetch_it(name, tmp_path):
    setting = load_setting(name)
    assert setting.policy.path is None and setting.policy.hub.repo == PAPER_SETTINGS[name]
    with hubcache.using_cache(tmp_path / "empty-cache"):
        line = assert_one_line_exit_2(check(name, "--first"), f"{name}.toml", PAPER_SETTINGS[name],
                                      "not in the local Hugging Face cache", f"`recast fetch {name}`")
    assert "hf auth login" in line


def test_a_bare_machine_hears_everything_missing_at_once(tmp_path, monkeypatch):
    """Nothing fetched, no API key: every missing repo, prompt file and key in one run, each with what
    provides it; the judges apart, for `make judges`, not failing the check."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with hubcache.using_cache(tmp_path / "empty-cache"):
        result = check("ocr")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    for needle in ("stabilityai/stable-diffusion-3.5-medium", "openai/clip-vit-large-patch14", "xswu/HPSv2",
                   "yuvalkirstain/PickScore_v1", "train.txt", "OPENAI_API_KEY"):
        assert sum(needle in line for line in lines) == 1, (needle, result.stderr)
    assert all(line.startswith("recast: error: ocr.toml: ") for line in lines)
    assert "`recast fetch ocr`" in result.stderr and "SETTING" not in result.stderr
    assert "make judges SETTING=ocr" in " ".join(result.stdout.split())
    for judge in ("imagereward", "aesthetic", "hpsv3", "unifiedreward"):
        assert f"judge {judge}:" in result.stdout, judge


@pytest.mark.parametrize("name", PAPER_SETTINGS)
def test_paper_settings_pass_over_standins(standins, name, monkeypatch):
    result = check(standins / "pipelines" / f"{name}.toml")
    assert result.exit_code == 0, result.stderr
    assert "checks passed" in result.stdout
    for scorer in ("clip", "hps", "pick"):
        assert f"scorer {scorer}" in result.stdout
    for judge in ("imagereward", "aesthetic", "hpsv3", "unifiedreward"):
        assert f"judge {judge}" in result.stdout  # checked, and what each lacks listed for make judges
    assert "judge unifiedreward: its server http" in result.stdout and "vllm serve" in result.stdout


def test_train_lambda_of_the_wrong_length_is_bad_input(standins):
    path = variant(standins, "ocr", "short-lambda", "lambda = [1, 1, 1, 1]", "lambda = [1, 1, 1]")
    assert_one_line_exit_2(check(path), "lambda has 3 values for 4 rewards")


def test_study_budget_of_the_wrong_length_is_bad_input(standins):
    path = variant(standins, "ocr", "short-budget", "[1, 1, 1, 2]", "[1, 1, 2]")
    assert_one_line_exit_2(check(path), "[study] budgets[1] has 3 values for 4 rewards")


def test_missing_prompts_file_is_named(standins):
    path = variant(standins, "ocr", "no-prompts", 'prompts = "../data/ocr/train.txt"',
                   'prompts = "../data/ocr/missing.txt"')
    assert_one_line_exit_2(check(path), "[train] prompts", "missing.txt", "does not exist")


def test_missing_reward_weight_is_named(standins):
    path = variant(standins, "ocr", "no-hps", 'weights = "xswu/HPSv2"', 'weights = "../models/HPSv2/gone.pt"')
    assert_one_line_exit_2(check(path), "scorer hps", "gone.pt", "does not exist")


def test_a_reward_weight_missing_from_the_cache_is_named_with_recast_fetch(standins):
    path = variant(standins, "ocr", "hps-rev", 'weights = "xswu/HPSv2"', 'weights = "xswu/HPSv2@v9"')
    assert_one_line_exit_2(check(path), "scorer hps", "xswu/HPSv2@v9", "not in the local Hugging Face cache",
                           "recast fetch")


def test_a_local_path_in_place_of_a_hub_id_is_used(standins):
    local = standins / "models" / "HPSv2" / "HPS_v2.1_compressed.pt"
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(b"stand-in")
    path = variant(standins, "ocr", "local-hps", 'weights = "xswu/HPSv2"',
                   'weights = "../models/HPSv2/HPS_v2.1_compressed.pt"')
    result = check(path)
    assert result.exit_code == 0, result.stderr
    from recast_cli.rewards.hps import HPS_WEIGHTS
    from recast_cli.rewards.weights import resolve

    given = reward_options(load_setting(str(path)).raw, path)["hps"]["weights"]
    assert resolve(HPS_WEIGHTS, given) == local.resolve()


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("[study]\n", "[study]\nseed = 3\n", "[study]: unknown key seed"),
    ("[evaluate]\n", "[evaluate]\njudge = []\n", "[evaluate]: unknown key 'judge'"),
    ("[train]\n", "[train]\nlearning_rat = 1e-4\n", "unknown [train] key 'learning_rat'"),
    ("[rewards.clip]\n", "[rewards.clip]\nweight = \"x\"\n", "scorer clip: unknown option weight"),
    ("[positives]\n", "[positives]\nsource = \"openai\"\n", "[positives]: unknown key source"),
    ("[study]\n", "[sweep]\nx = 1\n\n[study]\n", "unknown table [sweep]"),
    ("[rewards.clip]\n", "[rewards.clipscore]\n", "no scorer 'clipscore'"),
])
def test_unknown_tables_keys_and_options_are_bad_input(standins, old, new, needle):
    path = variant(standins, "ocr", "unknown", old, new)
    assert_one_line_exit_2(check(path), needle)


@pytest.mark.parametrize(("old", "new", "needle"), [
    ('modes = ["static", "recast", "nosink"]', 'modes = ["static", "sinkhorn"]', "modes must be distinct values"),
    ("seeds = [0, 1, 2]", "seeds = [0, 0]", "seeds must be distinct"),
    ("[2, 1, 1, 1]]", "[2, 1, 1, -1]]", "budgets[4]"),
    ('positives = "openai"', 'positives = "folder:../positives"', "positives folder"),
    ("resolution = 512", "resolution = 500", "resolution 500 is not a positive multiple of 8"),
])
def test_malformed_study_and_policy_values_are_bad_input(standins, old, new, needle):
    path = variant(standins, "ocr", "malformed", old, new)
    assert_one_line_exit_2(check(path), needle)


def test_ocr_prompt_without_quoted_text_is_bad_input(standins):
    (standins / "data" / "ocr" / "unquoted.txt").write_text("A shop sign\n")
    path = variant(standins, "ocr", "unquoted", 'prompts = "../data/ocr/train.txt"',
                   'prompts = "../data/ocr/unquoted.txt"')
    assert_one_line_exit_2(check(path), "[train] prompts", "no quoted text")


def test_geneval_prompt_without_metadata_is_bad_input(standins):
    (standins / "data" / "geneval" / "other.txt").write_text("a photo of a zebra\n")
    path = variant(standins, "geneval", "no-meta", 'prompts = "../data/geneval/estimate.txt"',
                   'prompts = "../data/geneval/other.txt"')
    assert_one_line_exit_2(check(path), "[positives]", "no metadata for prompt 'a photo of a zebra'")


def test_all_lists_every_problem_and_still_exits_2(standins):
    text = (standins / "pipelines" / "ocr.toml").read_text()
    path = standins / "pipelines" / "many.toml"
    path.write_text(text.replace("lambda = [1, 1, 1, 1]", "lambda = [1, 1]")
                    .replace('prompts = "../data/ocr/test.txt"', 'prompts = "../data/ocr/held-out.txt"'))
    result = check(path, "--all")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert "lambda has 2 values" in lines[0] and "held-out.txt" in lines[1]
    assert "FAIL" in result.stdout


def test_load_study_gives_the_driver_its_sweep(standins):
    study = load_study(load_setting(str(standins / "pipelines" / "ocr.toml")))
    assert study.rewards == ("clip", "hps", "pick", "ocr")
    assert len(study.budgets) == 5 and study.seeds == (0, 1, 2) and study.modes == ("static", "recast", "nosink")
    assert (study.warmup_steps, study.estimate_steps, study.n, study.k, study.alpha) == (60, 25, 8, 16, 2.0)
    assert study.positives == "openai" and study.positives_path() is None
    assert StudySpec.label(study.budgets[1]) == "1-1-1-2" and StudySpec.lambda_arg(study.budgets[1]) == "1,1,1,2"


def test_folder_positives_resolve_against_the_setting_folder(standins):
    path = variant(standins, "ocr", "folder-positives", 'positives = "openai"', 'positives = "folder:../pos"')
    study = load_study(load_setting(str(path)))
    assert study.positives_path() == (standins / "pos").resolve()


def test_toy_study_uses_the_paper_budget_rule_for_three_rewards():
    """Uniform, each reward doubled in turn (the paper's rule), and a fifth budget (1, 2, 2)."""
    study = load_study(load_setting("toy"))
    m = len(study.rewards)
    assert study.budgets[0] == (1.0,) * m
    doubled = {b.index(2.0) for b in study.budgets[1:m + 1]}
    assert doubled == set(range(m)) and all(b.count(2.0) == 1 for b in study.budgets[1:m + 1])
    assert study.budgets[m + 1:] == ((1.0, 2.0, 2.0),) and len(study.budgets) == 5


def test_reward_path_options_resolve_against_the_setting_folder(tmp_path):
    options = resolve_reward_options("pick", {"weights": "../models/p", "processor": "/abs/q", "device": "cuda"},
                                     tmp_path / "pipelines")
    assert options == {"weights": str((tmp_path / "models" / "p").resolve()), "processor": "/abs/q", "device": "cuda"}
    assert resolve_reward_options("geneval", {"metadata": "m.jsonl", "url": "http://x"}, tmp_path)["url"] == "http://x"


def test_study_without_train_rewards_is_bad_input(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[policy]\nkind = "gmm1d"\n\n[study]\nbudgets = [[1]]\n')
    with pytest.raises(BadInput, match="need \\[train\\] rewards"):
        load_study(load_setting(str(path)))


def test_self_positives_need_the_tilting_rewards(standins):
    path = variant(standins, "ocr", "self-positives", 'positives = "openai"', 'positives = "self"')
    assert_one_line_exit_2(check(path), "[positives] rewards")


def test_processor_folder_written_by_transformers_5_passes(standins):
    folder = hubcache.snapshot(standins / "hf", "laion/CLIP-ViT-H-14-laion2B-s32B-b79K")
    (folder / "preprocessor_config.json").rename(folder / "processor_config.json")
    try:
        result = check(standins / "pipelines" / "ocr.toml")
        assert result.exit_code == 0, result.stderr
    finally:
        (folder / "processor_config.json").rename(folder / "preprocessor_config.json")


def test_hps_arch_config_file_resolves_and_must_exist(standins, tmp_path):
    options = resolve_reward_options("hps", {"arch": "../models/HPSv2/arch.json"}, tmp_path / "pipelines")
    assert options["arch"] == str((tmp_path / "models" / "HPSv2" / "arch.json").resolve())
    assert resolve_reward_options("hps", {"arch": "ViT-H-14"}, tmp_path)["arch"] == "ViT-H-14"
    path = variant(standins, "ocr", "hps-arch", "[rewards.hps]\n", '[rewards.hps]\narch = "../models/HPSv2/missing.json"\n')
    assert_one_line_exit_2(check(path), "missing.json does not exist")
