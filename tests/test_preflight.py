"""``recast preflight`` through the CLI: SD3.5-Medium's real architecture on the meta device (shipped
configs); every phase on the tiny architecture on the CPU (random weights materialised from meta,
one estimate batch, one train step eager and compiled, one evaluate chunk); the batch halving on
out-of-memory; the recast.preflight/1 JSON."""

from __future__ import annotations

import json

import pytest
import torch

from recast_cli.preflight.phases import fit
from tests.test_cli import assert_one_line_exit_2, recast

KEYS = {"schema", "recast_version", "torch", "diffusers", "setting", "scale", "device", "dtype", "engine", "phases",
        "fits", "host_rss_peak_bytes"}
RUN_KEYS = KEYS | {"parameters", "stand_ins"}
MEASURED = {"seconds", "images", "images_per_s", "peak_device_bytes", "host_rss_peak_bytes", "asked", "tried",
            "largest_fit", "fits", "finite"}

#: ocr.toml's shape at a CPU-sized budget: every phase runs in seconds on the tiny architecture
SMALL = """
[policy]
kind = "sd3"
path = "../models/stable-diffusion-3.5-medium"
steps = 2
guidance_scale = 4.5
resolution = 512
max_sequence_length = 8
precision = "bf16"
noise_level = 0.7

[train]
rewards = ["clip", "ocr"]
lambda = [1, 1]
prompts = "../data/ocr/train.txt"
group_size = 2
prompts_per_step = 48
micro_batch = 2
sample_batch = 2
lora_rank = 4
lora_alpha = 8
ema_decay = 0.9
compile_backend = "aot_eager"

[study]
budgets = [[1, 1]]
estimate_steps = 2
n = 1
k = 2
p = 3

[evaluate]
prompts = "../data/ocr/test.txt"
n = 1
steps = 2
judges = ["aesthetic"]
batch_size = 2
"""


def run(tmp_path, *args, keys=KEYS):
    out = tmp_path / "pf"
    result = recast("preflight", "--out", out, *args)
    assert result.exit_code == 0, result.stderr
    record = json.loads((out / "preflight.json").read_text())
    assert set(record) == keys and record["schema"] == "recast.preflight/1"
    return record, result.stdout


@pytest.fixture()
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def test_the_full_sd35_medium_architecture_is_counted_without_allocating_it(tmp_path):
    record, shown = run(tmp_path, "--setting", "ocr", "--scale", "full", "--random-weights", "--phases", "build")
    build = record["phases"]["build"]
    parts = build["components"]
    assert "shipped configs" in build["configs"]  # no SD3.5-M folder on this machine
    assert 2.2e9 <= parts["transformer"]["parameters"] <= 2.6e9
    assert parts["text_encoder_3"]["class"] == "T5EncoderModel" and parts["text_encoder_3"]["parameters"] > 4.5e9
    assert {c["class"] for c in parts.values()} >= {"SD3Transformer2DModel", "AutoencoderKL",
                                                    "CLIPTextModelWithProjection"}
    assert all(c["on_meta"] for c in parts.values()) and record["device"] == "meta"
    assert build["parameters_total"] == sum(c["parameters"] for c in parts.values())
    assert build["lora_rank"] == 32 and 0 < build["trainable"] < 0.02 * parts["transformer"]["parameters"]
    # SD3.5-M's positional-embedding table (384² × 1536) is a buffer: 0.42 GiB at bf16, counted with the weights
    assert parts["transformer"]["buffers"] >= 384 * 384 * 1536
    assert build["buffers_total"] == sum(c["buffers"] for c in parts.values())
    assert build["weights_bytes"] == 2 * (build["parameters_total"] + build["buffers_total"])  # trains in bf16
    assert record["fits"] is None and set(record["phases"]) == {"build"}
    assert "SD3Transformer2DModel" in shown and "LoRA r = 32" in shown
    # T5-XXL, CLIP-G and CLIP-L: 5.58 B in bf16, and LoRA trains far less, so the default offloads them
    assert build["text_encoder_bytes"] == 2 * sum(parts[n]["parameters"] + parts[n]["buffers"] for n in parts
                                                  if n.startswith("text_enc"))
    assert build["offload_text_encoders"] == {"setting": None, "train": True}
    rewards = build["rewards"]["scorers"]
    assert {n for n, r in rewards.items() if r["placement"] == "model"} == {"clip", "hps", "pick", "imagereward",
                                                                            "aesthetic"}
    assert rewards["unifiedreward"]["placement"] == "served" and rewards["hpsv3"]["placement"] == "not built"
    assert build["rewards"]["not_counted"] == ["hpsv3", "unifiedreward"]
    assert build["rewards"]["train_device_bytes"] == 4 * sum(rewards[n]["parameters"] for n in ("clip", "hps", "pick"))
    assert build["rewards"]["evaluate_device_bytes"] == 4 * sum(r.get("parameters", 0) for r in rewards.values())
    assert "not counted: hpsv3, unifiedreward" in " ".join(shown.split())


def test_every_phase_runs_at_the_tiny_scale_on_the_cpu_through_the_cli(tmp_path, small):
    record, shown = run(tmp_path, "--setting", small, "--scale", "tiny", keys=RUN_KEYS)
    phases = record["phases"]
    assert set(phases) == {"build", "materialise", "rewards", "estimate", "train", "evaluate"}
    assert set(phases["train"]) == {"eager", "compile", "eager, offload off"}  # unset: offloaded, and shown without
    assert record["device"] == "cpu" and record["dtype"] == "fp32" and record["engine"] == "single"
    ran = [phases["estimate"], phases["evaluate"], *phases["train"].values()]
    assert [r["offload_text_encoders"] for r in ran] == [True, True, True, True, False]
    for r in ran:
        assert MEASURED <= set(r) and r["fits"] and r["finite"] and r["tried"] == [r["asked"]] == [r["largest_fit"]]
        assert r["seconds"] > 0 and r["images_per_s"] > 0 and r["peak_device_bytes"] is None
        assert r["host_rss_peak_bytes"] > 0
    assert record["fits"] is True and record["host_rss_peak_bytes"] >= phases["evaluate"]["host_rss_peak_bytes"]
    est = phases["estimate"]
    assert (est["T"], est["N"], est["K"], est["asked"], est["images"]) == (2, 1, 2, 4, 4)  # every job of the prompt
    assert est["denoiser_steps"] == 2 * (1 + 2)  # K rollouts from t = 1 and from t = 2
    assert est["projected_estimate_seconds"] == pytest.approx(3 * est["projected_prompt_seconds"], rel=1e-3)
    eager, compiled = phases["train"]["eager"], phases["train"]["compile"]
    assert compiled["compile"] and compiled["compile_backend"] == "aot_eager" and not eager["compile"]
    assert eager["images"] == 2 and eager["pairs"] == 2 * 1  # G images × the T' = 1 trained step of T = 2
    # peft's trainable count is the build phase's r·(in + out) count, and the record's
    assert eager["trainable"] == phases["build"]["trainable"] == record["parameters"]["trainable"] > 0
    assert record["parameters"]["total"] == phases["build"]["parameters_total"]
    assert phases["evaluate"]["T"] == 2 and phases["evaluate"]["scorers"] == 3  # two rewards and one judge
    # clip and the aesthetic judge are their networks on random weights; only ocr is stood in for
    assert record["stand_ins"]["rewards"] == {"ocr": "toy_sharpness"}
    assert set(phases["rewards"]) == {"clip", "aesthetic"}
    for r in phases["rewards"].values():
        assert r["finite"] and r["images"] == r["batch"] == 16 and r["images_per_s"] > 0 and r["device"] == "cpu"
    assert "fits on cpu at this setting's batch sizes" in shown and "train (compile)" in shown
    assert "train (eager, offload off)" in shown and "reward aesthetic" in shown


def test_a_paper_setting_s_evaluate_chunk_runs_at_its_size_on_the_tiny_architecture(tmp_path):
    record, _ = run(tmp_path, "--setting", "ocr", "--scale", "tiny", "--phases", "evaluate", keys=RUN_KEYS)
    evaluate = record["phases"]["evaluate"]
    assert (evaluate["asked"], evaluate["images"], evaluate["T"], evaluate["guidance_scale"]) == (16, 16, 40, 4.5)
    assert evaluate["scorers"] == 8 and evaluate["fits"] and evaluate["finite"]  # 4 rewards and 4 judges, stood in for
    assert set(record["stand_ins"]["rewards"]) == {"ocr", "hpsv3", "unifiedreward"}  # the rest: their networks


def test_an_out_of_memory_halves_the_batch_and_reports_the_largest_that_fits(tmp_path, small, monkeypatch):
    from recast_cli.policy.sd3 import SD3Policy

    velocity = SD3Policy.velocity

    def one_at_a_time(self, x, sigma, cond):  # a device that holds one sample's activations
        if len(x) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return velocity(self, x, sigma, cond)

    monkeypatch.setattr(SD3Policy, "velocity", one_at_a_time)
    # the halving is the subject here; the compiled step's wiring is the test above's (compiling is most of the time)
    monkeypatch.setattr(torch, "compile", lambda model, **options: model)
    record, shown = run(tmp_path, "--setting", small, "--scale", "tiny", "--phases", "estimate,train,evaluate",
                        keys=RUN_KEYS)
    phases = record["phases"]
    assert phases["estimate"]["tried"] == [4, 2, 1] and phases["evaluate"]["tried"] == [2, 1]
    for train in phases["train"].values():
        assert train["tried"] == [2, 1] and train["largest_fit"] == 1 and train["sample_batch"] == 1
    assert all(not r["fits"] and r["largest_fit"] == 1 for r in [phases["estimate"], phases["evaluate"]])
    assert record["fits"] is False and "Traceback" not in shown
    assert "does not fit on cpu at this setting's batch sizes; it would at: estimate at 1" in " ".join(shown.split())


def test_a_failing_phase_is_a_row_and_one_line_not_a_traceback(tmp_path, small, monkeypatch):
    from recast_cli.policy.sd3 import SD3Policy

    def broken(self, latents):
        raise RuntimeError("decoder exploded\nsecond line")

    monkeypatch.setattr(SD3Policy, "decode", broken)
    out = tmp_path / "pf"
    result = recast("preflight", "--out", out, "--setting", small, "--scale", "tiny", "--phases", "build,evaluate")
    assert result.exit_code == 1 and "Traceback" not in result.stdout + result.stderr
    assert result.stderr.strip() == "recast: error: preflight phase evaluate: RuntimeError: decoder exploded"
    record = json.loads((out / "preflight.json").read_text())  # written whole, with the failure in it
    assert record["phases"]["evaluate"] == {"error": "RuntimeError: decoder exploded", "fits": False}
    assert record["fits"] is False and record["phases"]["build"]["parameters_total"] > 0


def test_fit_halves_until_one_fits_and_says_when_none_does():
    def below(limit):
        def run(batch):
            if batch > limit:
                raise torch.cuda.OutOfMemoryError("injected")
            return {"ran": batch}
        return run

    cpu = torch.device("cpu")
    assert fit(below(5), 64, cpu) == {"asked": 64, "tried": [64, 32, 16, 8, 4], "largest_fit": 4, "fits": False,
                                      "ran": 4}
    assert fit(below(9), 9, cpu) == {"asked": 9, "tried": [9], "largest_fit": 9, "fits": True, "ran": 9}
    assert fit(below(0), 6, cpu) == {"asked": 6, "tried": [6, 3, 1], "largest_fit": None, "fits": False}
    with pytest.raises(ValueError):  # only an out-of-memory is retried
        fit(lambda batch: (_ for _ in ()).throw(ValueError("a bug")), 4, cpu)


def test_random_weights_are_materialised_deterministically_with_real_buffers_and_ties():
    from recast_cli.policy.tiny import build_pipeline
    from recast_cli.preflight.stage import random_pipeline
    from recast_cli.toy.pretrain import toy_words

    one, two = (random_pipeline(None, torch.device("cpu"), torch.float32, 8) for _ in range(2))
    reference = build_pipeline("sd3", toy_words())  # built on the CPU the ordinary way
    for name in ("transformer", "vae", "text_encoder", "text_encoder_3"):
        a, b = one.components[name].state_dict(), two.components[name].state_dict()
        assert all(torch.equal(a[k], b[k]) and torch.isfinite(a[k].float()).all() for k in a)
        for key, buffer in reference.components[name].named_buffers():
            assert torch.equal(one.components[name].get_buffer(key), buffer)
    t5 = one.text_encoder_3
    assert t5.shared.weight is t5.encoder.embed_tokens.weight
    assert all(p.device.type == "cpu" for p in one.transformer.parameters())


@pytest.mark.parametrize("args, needle", [
    (["--setting", "ocr", "--phases", "bild"], "--phases takes build,rewards,estimate,train,evaluate"),
    (["--setting", "ocr", "--scale", "huge"], "--scale must be one of full, tiny"),
    (["--setting", "twoscale"], "recast preflight builds sd3 policies"),
    (["--setting", "flux-ocr"], "recast tiny-model --family flux"),
    (["--setting", "ocr", "--real-weights"], "random weights only"),
    (["--setting", "ocr", "--phases", "build,train"], "at --scale full needs a CUDA device"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needle):
    if "CUDA" in needle and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert_one_line_exit_2(recast("preflight", "--out", tmp_path / "pf", *args), needle)
    assert not (tmp_path / "pf").exists()


def test_a_launch_of_several_processes_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert_one_line_exit_2(recast("preflight", "--out", tmp_path / "pf", "--setting", "ocr", "--phases", "build"),
                           "runs in one process")


def test_a_model_folder_s_configs_build_a_working_random_pipeline(tmp_path):
    """The --scale full path (configs of a folder in diffusers layout, its scheduler, the word tokenizers
    at the encoders' lengths), on a recast tiny-model folder so that it runs on a CPU."""
    from recast_cli.policy.tiny import write_tiny_model
    from recast_cli.preflight.stage import random_pipeline
    from recast_cli.preflight.phases import Bench
    from recast_cli.setting.load import load_setting

    folder = tmp_path / "model"
    write_tiny_model("sd3", folder)
    setting = load_setting("ocr")  # T5 padded to its max_sequence_length = 128
    pipe = random_pipeline(folder, torch.device("cpu"), torch.float32, setting.policy.max_sequence_length)
    assert type(pipe).__name__ == "StableDiffusion3Pipeline" and pipe.scheduler.config.shift == 3.0
    assert pipe.tokenizer.model_max_length == pipe.text_encoder.config.max_position_embeddings
    policy = Bench(pipe, setting, torch.device("cpu"), "no", None, ()).policy(steps=3)
    cond = policy.encode_prompts(["a red circle on a white background"] * 2)
    assert cond.prompt_embeds.shape[1] == pipe.tokenizer.model_max_length + 128  # CLIP's tokens, then T5's
    trajectory = policy.sample(cond, 0.7, torch.arange(2))
    images = policy.decode(trajectory.states[:, -1])
    assert images.shape == (2, 3, 32, 32) and torch.isfinite(images).all()
    assert torch.isfinite(trajectory.log_probs).all()
