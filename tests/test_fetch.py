"""``recast fetch`` and Hub ids in settings, against loopback servers (tests/fakehub.py): no network.

The fake Hub serves a ``recast tiny-model`` sd3 pipeline plus files no loader reads (a root
single-file checkpoint, a folder model_index.json does not name, an fp16 variant, a .bin twin of a
safetensors file); the file server serves prompt files with Range, dropped connections and 401s.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recast_cli.errors import BadInput
from recast_cli.fetch.http import download, part_path
from recast_cli.fetch.select import select_files
from tests.fakehub import FakeHub, FileServer

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = {"sd3_single.safetensors": b"x" * 1000, "text_encoders/clip_g.safetensors": b"y" * 500,
          "transformer/diffusion_pytorch_model.fp16.safetensors": b"z" * 300,
          "text_encoder/pytorch_model.bin": b"w" * 200, "README.md": b"# tiny\n"}


def git_blob(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def run(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT")}
    full.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, *args], env=full, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def assert_one_line_2(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def tiny_sd3(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "sd3"
    result = run(["-m", "recast_cli", "tiny-model", "--family", "sd3", "--out", str(out)], {})
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def hub(tiny_sd3):
    server = FakeHub()
    server.commit = server.add_repo("tiny/sd3", tiny_sd3, EXTRAS)
    yield server
    server.close()


def write_setting(folder: Path, path: str) -> Path:
    setting = folder / "s.toml"
    setting.write_text(f'[policy]\nkind = "sd3"\npath = "{path}"\nsteps = 2\nresolution = 32\n')
    return setting


# --------------------------------------------------------------------------- which files


def test_a_pipeline_takes_only_the_components_model_index_names_without_variants_or_bin_twins():
    files = ["model_index.json", "sd3.safetensors", "README.md", "text_encoders/t5.safetensors",
             "vae/config.json", "vae/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.fp16.safetensors",
             "vae/diffusion_pytorch_model.bin", "tokenizer/vocab.json", "tokenizer/merges.txt",
             "text_encoder_3/model-00001-of-00002.safetensors", "text_encoder_3/model-00002-of-00002.safetensors",
             "text_encoder_3/model.safetensors.index.json", "text_encoder_3/model.safetensors.index.fp16.json",
             "text_encoder_3/model.fp16-00001-of-00002.safetensors", "text_encoder_3/config.json"]
    index = {"_class_name": "StableDiffusion3Pipeline", "vae": ["diffusers", "AutoencoderKL"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "text_encoder_3": ["transformers", "T5EncoderModel"],
             "feature_extractor": [None, None]}
    assert select_files("diffusers", files, index) == [
        "model_index.json", "text_encoder_3/config.json", "text_encoder_3/model-00001-of-00002.safetensors",
        "text_encoder_3/model-00002-of-00002.safetensors", "text_encoder_3/model.safetensors.index.json",
        "tokenizer/merges.txt", "tokenizer/vocab.json", "vae/config.json", "vae/diffusion_pytorch_model.safetensors"]


def test_a_model_folder_falls_back_to_bin_and_a_processor_takes_no_weights():
    files = ["config.json", "pytorch_model.bin", "flax_model.msgpack", "tf_model.h5", "preprocessor_config.json",
             "tokenizer.json", "open_clip_pytorch_model.bin"]
    assert select_files("model", files) == ["config.json", "open_clip_pytorch_model.bin", "preprocessor_config.json",
                                            "pytorch_model.bin", "tokenizer.json"]
    assert select_files("processor", files) == ["config.json", "preprocessor_config.json", "tokenizer.json"]
    assert select_files("HPS_v2.1_compressed.pt", ["HPS_v2.1_compressed.pt", "x.pt"]) == ["HPS_v2.1_compressed.pt"]


# --------------------------------------------------------------------------- models through the fake Hub


def test_fetch_downloads_what_the_loader_reads_and_the_hub_id_resolves_offline_after(hub, tiny_sd3, tmp_path):
    cache = tmp_path / "hf"
    setting = write_setting(tmp_path, "tiny/sd3")
    result = run(["-m", "recast_cli", "fetch", str(setting)], {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr
    wanted = sorted(p.relative_to(tiny_sd3).as_posix() for p in tiny_sd3.rglob("*") if p.is_file()
                    and p.name != "recast-tiny-model.json")
    snapshot = cache / "models--tiny--sd3" / "snapshots" / hub.commit
    assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()) == wanted
    total = sum((tiny_sd3 / name).stat().st_size for name in wanted)
    assert f"{total / 1e6:.1f} MB in {len(wanted)} files" in " ".join(result.stdout.split())  # the size, shown first

    # offline, with the Hub gone: the setting's repo id is the cached snapshot, loaded by the real loader
    load = ("from recast_cli.setting.load import load_setting, build_policy; s = load_setting({!r}); "
            "p = build_policy(s.policy, device='cpu'); print(s.policy.folder())").format(str(setting))
    offline = run(["-c", load], {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(cache)})
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.strip() == str(snapshot)

    def downloads() -> int:
        return sum(1 for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path)

    before = downloads()
    again = run(["-m", "recast_cli", "fetch", str(setting)], {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache)})
    assert again.returncode == 0, again.stderr
    assert downloads() == before  # a second fetch finds every file in the cache


def test_a_gated_repo_is_one_line_telling_to_log_in(hub, tmp_path):
    hub.gated.add("tiny/sd3")
    setting = write_setting(tmp_path, "tiny/sd3")
    result = run(["-m", "recast_cli", "fetch", str(setting)], {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf")})
    assert_one_line_2(result, "tiny/sd3 is gated", "hf auth login", "HF_TOKEN")
    assert not (tmp_path / "hf" / "models--tiny--sd3" / "snapshots").exists()


def test_an_unknown_repo_and_an_unknown_revision_are_one_line(hub, tmp_path):
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf")}
    assert_one_line_2(run(["-m", "recast_cli", "fetch", str(write_setting(tmp_path, "nobody/nothing"))], env),
                      "no model nobody/nothing on the Hub", "HF_TOKEN")


def test_fetch_refuses_offline_mode(hub, tmp_path):
    result = run(["-m", "recast_cli", "fetch", str(write_setting(tmp_path, "tiny/sd3"))],
                 {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert_one_line_2(result, "HF_HUB_OFFLINE=1")


# --------------------------------------------------------------------------- resolution without fetch


def test_a_missing_hub_model_is_one_line_naming_it_and_recast_fetch(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    from recast_cli.setting.load import load_setting

    setting = str(write_setting(tmp_path, "stabilityai/stable-diffusion-3.5-medium@abc123"))
    spec = load_setting(setting).policy
    assert spec.path is None and str(spec.hub) == "stabilityai/stable-diffusion-3.5-medium@abc123"
    with pytest.raises(BadInput) as err:
        spec.folder()
    message = str(err.value)
    assert "\n" not in message and "stabilityai/stable-diffusion-3.5-medium@abc123" in message
    assert f"`recast fetch {setting}`" in message and "HF_TOKEN" in message  # the setting as it was named
    assert spec.folder(required=False) is None


def test_a_local_path_wins_over_a_hub_id_of_the_same_name(tmp_path):
    from recast_cli.setting.load import load_setting

    (tmp_path / "stabilityai" / "stable-diffusion-3.5-medium").mkdir(parents=True)
    spec = load_setting(str(write_setting(tmp_path, "stabilityai/stable-diffusion-3.5-medium"))).policy
    assert spec.hub is None and spec.folder() == tmp_path / "stabilityai" / "stable-diffusion-3.5-medium"


def test_a_reward_weight_given_as_a_hub_id_resolves_from_the_cache_and_a_local_one_wins(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from recast_cli.rewards.clip import CLIP_WEIGHTS
    from recast_cli.rewards.options import resolve_reward_options
    from recast_cli.rewards.weights import resolve

    cache = tmp_path / "hf"
    snapshot = cache / "models--org--clip" / "snapshots" / "c0ffee"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--clip" / "refs").mkdir()
    (cache / "models--org--clip" / "refs" / "main").write_text("c0ffee")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    options = resolve_reward_options("clip", {"weights": "org/clip", "device": "cpu"}, tmp_path)
    assert options["weights"] == "org/clip"  # kept for the cache, not made a path under the setting
    assert resolve(CLIP_WEIGHTS, options["weights"]) == snapshot
    with pytest.raises(BadInput, match=r"org/clip@v2 is not in the local Hugging Face cache.*recast fetch"):
        resolve(CLIP_WEIGHTS, "org/clip@v2")
    (tmp_path / "org" / "clip").mkdir(parents=True)
    local = resolve_reward_options("clip", {"weights": "org/clip"}, tmp_path)["weights"]
    assert local == str(tmp_path / "org" / "clip")


def test_a_dry_run_needs_no_flag_and_offline_shows_the_plan_without_sizes(tmp_path):
    setting = tmp_path / "s.toml"
    setting.write_text('[policy]\nkind = "gmm1d"\n[train]\nprompts = "data/ocr/train.txt"\n'
                       '[rewards.clip]\nweights = "org/clip"\n[evaluate]\njudges = ["clip"]\n')
    result = run(["-m", "recast_cli", "fetch", str(setting), "--dry-run"],
                 {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "COLUMNS": "200"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "org/clip" in result.stdout and "ocr/train.txt" in result.stdout
    assert "sha256 recorded at download" in result.stdout and "HF_HUB_OFFLINE=1" in result.stdout
    assert not (tmp_path / "data").exists()


# --------------------------------------------------------------------------- prompt files over HTTP


@pytest.fixture
def files():
    server = FileServer()
    yield server
    server.close()


PROMPTS = "".join(f"a sign that says 'prompt {i}'\n" for i in range(5000)).encode()


def test_a_prompt_file_is_checked_and_a_dropped_connection_resumes_with_range(files, tmp_path):
    files.files["/ocr/train.txt"] = PROMPTS
    files.cut["/ocr/train.txt"] = 40_000
    target = tmp_path / "data" / "ocr" / "train.txt"
    download(f"{files.url}/ocr/train.txt", target, git_blob(PROMPTS), hashlib.sha256(PROMPTS).hexdigest())
    assert target.read_bytes() == PROMPTS and not part_path(target).exists()
    assert [r for _, _, r in files.requests] == [None, "bytes=40000-"]


def test_a_checksum_mismatch_removes_the_partial_file(files, tmp_path):
    files.files["/ocr/train.txt"] = PROMPTS + b"tampered\n"
    target = tmp_path / "ocr" / "train.txt"
    with pytest.raises(BadInput, match="checksum mismatch.*removed the partial file"):
        download(f"{files.url}/ocr/train.txt", target, git_blob(PROMPTS), hashlib.sha256(PROMPTS).hexdigest())
    assert not target.exists() and not part_path(target).exists()
    files.files["/ocr/train.txt"] = PROMPTS  # right blob, wrong pinned sha256: also refused
    with pytest.raises(BadInput, match="sha256"):
        download(f"{files.url}/ocr/train.txt", target, git_blob(PROMPTS), "0" * 64)
    assert not target.exists()


def test_a_401_is_one_line(files, tmp_path):
    files.denied.add("/ocr/test.txt")
    with pytest.raises(BadInput, match="HTTP 401") as err:
        download(f"{files.url}/ocr/test.txt", tmp_path / "ocr" / "test.txt", git_blob(b""), None)
    assert "\n" not in str(err.value)


def test_a_download_killed_with_sigkill_resumes_from_its_part_file(files, tmp_path):
    files.files["/ocr/train.txt"] = PROMPTS
    files.cut["/ocr/train.txt"] = 50_000
    files.stall = True  # the first response hangs after 50 kB: the process is killed there
    target = tmp_path / "ocr" / "train.txt"
    code = ("import sys; from pathlib import Path; from recast_cli.fetch.http import download; "
            "download(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4])")
    args = [sys.executable, "-c", code, f"{files.url}/ocr/train.txt", str(target), git_blob(PROMPTS),
            hashlib.sha256(PROMPTS).hexdigest()]
    proc = subprocess.Popen(args, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not (part_path(target).exists() and part_path(target).stat().st_size >= 50_000):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not target.exists() and part_path(target).stat().st_size == 50_000
    files.stall = False
    done = subprocess.run(args, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == 0
    assert target.read_bytes() == PROMPTS
    assert files.requests[-1][2] == "bytes=50000-"


# --------------------------------------------------------------------------- the shipped paper setting, whole

#: stand-ins for the reward repos pipelines/ocr.toml names: what each loader reads, and a file it must not take
OCR_REWARD_REPOS = {
    "openai/clip-vit-large-patch14": {"config.json": b"{}", "tokenizer.json": b"{}", "model.safetensors": b"c" * 300,
                                      "pytorch_model.bin": b"c" * 300, "flax_model.msgpack": b"c" * 300},
    "yuvalkirstain/PickScore_v1": {"config.json": b"{}", "model.safetensors": b"p" * 300, "pytorch_model.bin": b"p" * 300},
    "laion/CLIP-ViT-H-14-laion2B-s32B-b79K": {"preprocessor_config.json": b"{}", "tokenizer.json": b"{}",
                                              "open_clip_pytorch_model.bin": b"o" * 300},
    "xswu/HPSv2": {"HPS_v2.1_compressed.pt": b"h" * 300, "HPS_v2_compressed.pt": b"h" * 300},
    "trl-lib/ddpo-aesthetic-predictor": {"aesthetic-model.pth": b"a" * 100, "README.md": b"# head\n"},
    "THUDM/ImageReward": {"ImageReward.pt": b"i" * 300, "med_config.json": b"{}", "README.md": b"# ir\n"},
    "MizzenAI/HPSv3": {"HPSv3.safetensors": b"v" * 300, "README.md": b"# v3\n"},
    # what the judges' own packages and servers load: HPSv3's base model, BLIP's tokenizer, UnifiedReward's model
    "Qwen/Qwen2-VL-7B-Instruct": {"config.json": b"{}", "tokenizer.json": b"{}", "chat_template.json": b"{}",
                                  "model-00001-of-00002.safetensors": b"q" * 200,
                                  "model-00002-of-00002.safetensors": b"q" * 100,
                                  "model.safetensors.index.json": b"{}", "README.md": b"# qwen\n"},
    "bert-base-uncased": {"config.json": b"{}", "tokenizer_config.json": b"{}", "vocab.txt": b"[PAD]\n",
                          "model.safetensors": b"b" * 300, "flax_model.msgpack": b"b" * 300},
    "CodeGoat24/UnifiedReward-2.0-qwen-7b": {"config.json": b"{}", "tokenizer.json": b"{}",
                                             "model.safetensors": b"u" * 300, "README.md": b"# ur\n"},
}
#: what fetch should take of each (the loader's files only: no .bin twin, other framework, README or other checkpoint)
OCR_REWARD_TAKEN = {
    "openai/clip-vit-large-patch14": ["config.json", "model.safetensors", "tokenizer.json"],
    "yuvalkirstain/PickScore_v1": ["config.json", "model.safetensors"],
    "laion/CLIP-ViT-H-14-laion2B-s32B-b79K": ["preprocessor_config.json", "tokenizer.json"],
    "xswu/HPSv2": ["HPS_v2.1_compressed.pt"],
    "trl-lib/ddpo-aesthetic-predictor": ["aesthetic-model.pth"],
    "THUDM/ImageReward": ["ImageReward.pt", "med_config.json"],
    "MizzenAI/HPSv3": ["HPSv3.safetensors"],
    "Qwen/Qwen2-VL-7B-Instruct": ["chat_template.json", "config.json", "model-00001-of-00002.safetensors",
                                  "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                  "tokenizer.json"],
    "bert-base-uncased": ["config.json", "tokenizer_config.json", "vocab.txt"],
    "CodeGoat24/UnifiedReward-2.0-qwen-7b": ["config.json", "model.safetensors", "tokenizer.json"],
}
#: `recast fetch` with the prompt files' pins (url, git blob, sha256) replaced by the test's, then the CLI
PINNED_CLI = ("import json, sys; from recast_cli.fetch import sources as s; "
              "s.PROMPT_FILES.update({k: s.PromptFile(k, *v) for k, v in json.loads(sys.argv.pop(1)).items()}); "
              "from recast_cli.cli import main; main()")


def test_a_file_pinned_by_its_git_blob_alone_is_fetched_without_a_flag_and_its_sha256_recorded(files, tmp_path):
    """No sha256 in the table: the git blob id pins the download, its sha256 is recorded beside it, and a
    later fetch checks the file against that record (a record that disagrees is refused in one line)."""
    train = "".join(f'A shop sign that reads "OPEN {i}"\n' for i in range(40)).encode()
    files.files["/ocr/train.txt"] = train
    pins = {"ocr/train.txt": [f"{files.url}/ocr/train.txt", git_blob(train), None]}
    setting = tmp_path / "s.toml"
    setting.write_text('[policy]\nkind = "gmm1d"\n[train]\nprompts = "data/ocr/train.txt"\n')
    target = tmp_path / "data" / "ocr" / "train.txt"
    record = target.with_name(".train.txt.recast-sha256")

    result = run(["-c", PINNED_CLI, json.dumps(pins), "fetch", str(setting)], {"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert target.read_bytes() == train
    assert record.read_text() == f"{hashlib.sha256(train).hexdigest()}  train.txt\n"
    again = run(["-c", PINNED_CLI, json.dumps(pins), "fetch", str(setting)], {"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert again.returncode == 0 and "matches its pins" in again.stdout, again.stdout + again.stderr

    record.write_text(f"{'0' * 64}  train.txt\n")
    refused = run(["-c", PINNED_CLI, json.dumps(pins), "fetch", str(setting)], {"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert_one_line_2(refused, "exists and is not ocr/train.txt", "sha256")
    assert target.read_bytes() == train  # never replaced
    record.write_text("not a record\n")
    assert_one_line_2(run(["-c", PINNED_CLI, json.dumps(pins), "fetch", str(setting)],
                          {"HF_ENDPOINT": "http://127.0.0.1:9"}), "is not the sha256 record recast writes")


def test_the_shipped_ocr_setting_fetches_every_model_and_prompt_file_it_names_then_checks_offline(
        hub, files, tiny_sd3, tmp_path):
    """pipelines/ocr.toml verbatim, beside a fresh data/ and an empty HF cache: `recast fetch` takes the
    eight Hub repos it names and the three its judges' packages and server load (only the loaders' files) and Flow-GRPO's OCR prompt files (checked against
    their pins), makes estimate.txt, and afterwards `recast check-setting` passes with the network gone."""
    hub.add_repo("stabilityai/stable-diffusion-3.5-medium", tiny_sd3, EXTRAS)
    for repo, stand_in in OCR_REWARD_REPOS.items():
        folder = tmp_path / "repos" / repo
        folder.mkdir(parents=True)
        for name, data in stand_in.items():
            (folder / name).write_bytes(data)
        hub.add_repo(repo, folder)
    train = "".join(f'A shop sign that reads "OPEN {i}"\n' for i in range(40)).encode()
    test = b'A mug printed with "coffee"\nA poster with the words "Hello World"\n'
    files.files.update({"/ocr/train.txt": train, "/ocr/test.txt": test})
    files.cut["/ocr/train.txt"] = 500  # the first connection drops: resumed with Range in the same run
    pins = {name: [f"{files.url}/{name}", git_blob(data), hashlib.sha256(data).hexdigest()]
            for name, data in (("ocr/train.txt", train), ("ocr/test.txt", test))}
    (tmp_path / "pipelines").mkdir()
    setting = tmp_path / "pipelines" / "ocr.toml"
    setting.write_text((ROOT / "pipelines" / "ocr.toml").read_text())
    cache = tmp_path / "hf"

    result = run(["-c", PINNED_CLI, json.dumps(pins), "fetch", str(setting)],
                 {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache)})
    assert result.returncode == 0, result.stdout + result.stderr
    for repo, taken in OCR_REWARD_TAKEN.items():
        snapshot = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / hub.repos[repo][0]
        assert sorted(p.name for p in snapshot.iterdir()) == taken, repo
    sd3 = cache / "models--stabilityai--stable-diffusion-3.5-medium" / "snapshots" / hub.repos[
        "stabilityai/stable-diffusion-3.5-medium"][0]
    assert (sd3 / "model_index.json").is_file() and not (sd3 / "sd3_single.safetensors").exists()
    assert not (sd3 / "text_encoder" / "pytorch_model.bin").exists()
    data = tmp_path / "data" / "ocr"
    assert (data / "train.txt").read_bytes() == train and (data / "test.txt").read_bytes() == test
    assert (data / "estimate.txt").read_bytes() == b"".join(train.splitlines(keepends=True)[:16])  # [study] p = 16
    assert ("GET", "/ocr/train.txt", "bytes=500-") in files.requests
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "hf", "pipelines", "repos"]  # nothing else written

    checked = run(["-m", "recast_cli", "check-setting", str(setting)],
                  {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(cache),
                   "OPENAI_API_KEY": "sk-test"})  # the positives' API key comes from the environment
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "checks passed" in checked.stdout
