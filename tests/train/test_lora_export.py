"""A trained checkpoint's LoRA is a diffusers LoRA: `StableDiffusion3Pipeline.load_lora_weights` reads it.

One short run (1 step at lr 0.02, so lora_B is clearly non-zero; the tiny setting trains rank 2,
alpha 4, i.e. scale 2 ≠ 1). The file carries diffusers' ``lora_adapter_metadata`` (the
LoraConfig): without it diffusers assumes alpha = r and applies the adapter at half the scale
(measured before the fix: |trainer − diffusers| = 0.074 on an output that moved 0.14).

Measured: the diffusers transformer's output equals the trainer's LoRA transformer's output bit
for bit (max |Δ| = 0, both fp32 on the CPU through the same peft layers); it differs from the
base by ~0.14 (the trainer's base, peft with the adapter disabled, and diffusers' plain base agree
to 6e-7: roundoff). ``load_lora_into_policy`` gives the trained velocity bit for bit (CFG on).
Tolerance: 1e-6 absolute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.errors import BadInput
from recast_cli.policy.sd3 import SD3Policy
from recast_cli.train.config import DEFAULT_LORA_TARGETS
from recast_cli.policy.lora import load_lora_into_policy, resolve_adapter
from recast_cli.train.params import LORA_FILE, Parameters
from tests.train.conftest import tiny_train_setting

ATOL = 1e-6  # measured 0.0
MOVED = 1e-2  # the adapter moves the output by ~0.14; anything above this is "clearly not the base"
RANK, ALPHA = 2, 4.0  # the tiny setting's lora_rank / lora_alpha


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    setting = tiny_train_setting(root)
    run = root / "run"
    result = CliRunner().invoke(app, ["train", "--setting", str(setting), "--weights", "static", "--out", str(run),
                                      "--max-steps", "1", "--set", "save_every=1", "--lr", "0.02", "--device", "cpu",
                                      "--quiet"])
    assert result.exit_code == 0, result.stderr
    return root / "model", run


def _policy(model: Path) -> SD3Policy:
    return SD3Policy.from_pretrained(model, steps=4, guidance_scale=2.0, resolution=32, max_sequence_length=1,
                                     precision="no", device="cpu")


def _trainer_policy(model: Path, run: Path) -> tuple[SD3Policy, Parameters]:
    """The policy as the trainer holds it: peft LoRA added by Parameters, the checkpoint loaded by it."""
    policy = _policy(model)
    params = Parameters(policy.pipe.transformer, RANK, ALPHA, DEFAULT_LORA_TARGETS, seed=0, keep_reference=False)
    params.load(resolve_adapter(run).parent)
    return policy, params


def _inputs(transformer) -> dict:
    cfg = transformer.config
    g = torch.Generator().manual_seed(0)
    size = cfg.sample_size
    return {"hidden_states": torch.randn(2, cfg.in_channels, size, size, generator=g),
            "timestep": torch.tensor([250.0, 750.0]),
            "encoder_hidden_states": torch.randn(2, 3, cfg.joint_attention_dim, generator=g),
            "pooled_projections": torch.randn(2, cfg.pooled_projection_dim, generator=g)}


@torch.no_grad()
def _out(transformer, inputs) -> torch.Tensor:
    return transformer(**inputs, return_dict=False)[0]


def test_the_adapter_file_is_a_diffusers_lora_with_its_config(trained):
    _, run = trained
    path = resolve_adapter(run)
    tensors = load_file(str(path))
    assert all(k.startswith("transformer.") and (".lora_A.weight" in k or ".lora_B.weight" in k) for k in tensors)
    assert max(float(v.abs().max()) for k, v in tensors.items() if ".lora_B." in k) > 1e-3  # trained, not B = 0
    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["lora_adapter_metadata"])
    assert meta["transformer.r"] == RANK and meta["transformer.lora_alpha"] == ALPHA
    assert sorted(meta["transformer.target_modules"]) == sorted({k[len("transformer."):].split(".lora_")[0]
                                                                  for k in tensors})


def test_diffusers_load_lora_weights_equals_the_trainer_transformer(trained):
    from diffusers import StableDiffusion3Pipeline

    model, run = trained
    policy, params = _trainer_policy(model, run)
    ours_t = policy.pipe.transformer
    inputs = _inputs(ours_t)
    ours = _out(ours_t, inputs)
    with params.reference_policy(policy):
        base = _out(ours_t, inputs)
    pipe = StableDiffusion3Pipeline.from_pretrained(model, text_encoder_3=None, tokenizer_3=None, local_files_only=True)
    torch.testing.assert_close(_out(pipe.transformer, inputs), base, rtol=0, atol=ATOL)  # the same base
    pipe.load_lora_weights(str(resolve_adapter(run).parent))  # the folder, default weight name, as a user would
    theirs = _out(pipe.transformer, inputs)
    assert float((ours - base).abs().max()) > MOVED
    print(f"max |diffusers - trainer| = {float((theirs - ours).abs().max()):.3g}, "
          f"max |trainer - base| = {float((ours - base).abs().max()):.3g}")
    torch.testing.assert_close(theirs, ours, rtol=0, atol=ATOL)


def test_load_lora_into_policy_gives_the_trained_velocity(trained):
    model, run = trained
    trained_policy, _ = _trainer_policy(model, run)
    base_policy = _policy(model)
    policy = _policy(model)
    assert load_lora_into_policy(policy, run) == resolve_adapter(run)
    cond = policy.encode_prompts(["a red circle on a white background", "a blue square on a black background"])
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
    sigma = policy.sigmas[torch.tensor([2, 3])].float()
    with torch.no_grad():
        v = policy.velocity(x, sigma, cond)
        v_trained = trained_policy.velocity(x, sigma, cond)
        v_base = base_policy.velocity(x, sigma, cond)
    assert float((v_trained - v_base).abs().max()) > MOVED
    print(f"max |velocity(load_lora_into_policy) - velocity(trainer)| = {float((v - v_trained).abs().max()):.3g}")
    torch.testing.assert_close(v, v_trained, rtol=0, atol=ATOL)


def test_resolve_adapter_accepts_run_checkpoint_and_file(trained, tmp_path):
    _, run = trained
    checkpoint = run / "checkpoints" / "step-000001"
    file = checkpoint / "adapter" / LORA_FILE
    assert resolve_adapter(run) == resolve_adapter(checkpoint) == resolve_adapter(file) == file
    assert resolve_adapter(str(checkpoint / "adapter")) == file
    with pytest.raises(BadInput, match="no LoRA adapter"):
        resolve_adapter(tmp_path)
    (tmp_path / "empty-run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(BadInput, match="no complete checkpoint"):
        resolve_adapter(tmp_path / "empty-run")


def test_an_adapter_without_its_lora_config_is_refused(trained, tmp_path):
    model, run = trained
    stale = tmp_path / LORA_FILE  # as the trainer wrote it before the config went into the file
    save_file(load_file(str(resolve_adapter(run))), str(stale), metadata={"format": "pt", "recast.kind": "lora"})
    with pytest.raises(BadInput, match="without its LoRA config"):
        load_lora_into_policy(_policy(model), stale)


def test_the_adapter_of_given_values_maps_them_as_peft_maps_the_live_ones(trained):
    """``Parameters.state(values)`` (the EMA's adapter, and the path FSDP's gathered tensors take)
    writes each value under the key peft's own state dict gives its parameter."""
    from peft.utils import get_peft_model_state_dict

    model, run = trained
    policy, params = _trainer_policy(model, run)
    live = get_peft_model_state_dict(policy.pipe.transformer)
    plain = params.state()
    assert set(plain) == {"transformer." + k for k in live}
    assert all(torch.equal(plain["transformer." + k], v) for k, v in live.items())
    shifted = {n: p.detach() + i + 1 for i, (n, p) in enumerate(params.named)}
    moved = params.state(shifted)
    assert set(moved) == set(plain) and len(shifted) == len(plain)
    for name, value in shifted.items():  # peft's key: the parameter's name without the adapter's
        assert torch.equal(moved["transformer." + name.replace(".default.", ".")], value)
