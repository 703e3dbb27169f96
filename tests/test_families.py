"""Every image family end to end through the CLI, on `recast tiny-model` folders.

For sd3, flux and qwenimage: tiny-model → check-setting → estimate → solve-w → train
--max-steps 2 → evaluate; the σ grid is the family's diffusers pipeline's (FLUX and Qwen-Image:
dynamic shift μ of the token count, Qwen's stretch to 0.02) and is what the gain table and W
record; the E1 log-probabilities of the policy's steps equal ``sde_step`` on that grid; the ODE
sampler equals the diffusers pipeline's own sampling loop; the trained LoRA loads with the
family's own ``pipe.load_lora_weights`` and gives the trainer's velocity.

Measured (CPU, fp32): the ODE sampler against the pipeline, max |Δ| 0 (sd3, flux) and 7e-7
(qwenimage, whose pipeline runs the CFG halves as two calls, ours as one masked call); the LoRA
loaded by diffusers against the trainer's, max |Δ| 0; FLUX trained by 2 FSDP processes (its
single-stream blocks sharded too) against 1 process, LoRA max |Δ| 5.9e-7 (|lora_B| up to 0.02).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from recast_cli.artifacts import read_gains, read_scores, read_weights
from recast_cli.grid import GridSpec
from recast_cli.policy.families import FAMILIES, policy_class
from recast_cli.policy.sde import sde_step
from tests.test_cli import assert_one_line_exit_2, recast

PROMPTS = ["a red circle on a white background", "a blue square on a black background"]
STEPS = 4
LR = 0.02  # two steps at this rate move lora_B clearly off zero
MOVED = 1e-3  # the trained velocity differs from the base by more than this
ATOL = 1e-6

SETTING = """[policy]
kind = "{family}"
path = "model"
steps = {steps}
resolution = 32
max_sequence_length = 8
precision = "no"
noise_level = 0.7
prompt_check = "toy"

[train]
rewards = ["toy_color", "toy_shape"]
lambda = [1, 1]
prompts = "toy"
max_steps = 2
group_size = 2
prompts_per_step = 1
micro_batch = 8
sample_batch = 2
lora_rank = 2
lora_alpha = 4
save_every = 1

[evaluate]
prompts = "toy"
n = 1
batch_size = 24
"""


def ok(*args):
    result = recast(*args)
    assert result.exit_code == 0, (args[0], result.stdout, result.stderr)
    return result


@pytest.fixture(scope="module", params=list(FAMILIES))
def chain(request, tmp_path_factory):
    """The whole chain through the CLI for one family; returns its folder."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    ok("tiny-model", "--family", family, "--out", root / "model")
    setting = root / "smoke.toml"
    setting.write_text(SETTING.format(family=family, steps=STEPS))
    shown = ok("check-setting", setting).stdout
    ok("estimate", "--policy", setting, "--rewards", "toy_color,toy_shape", "--steps", STEPS, "--n", 2, "--k", 1,
       "--p", 2, "--bootstrap", 0, "--out", root / "g.parquet")
    ok("solve-w", "--gains", root / "g.parquet", "--lambda", "1,1", "--skip-clean", 1, "--out", root / "W.safetensors")
    ok("train", "--setting", setting, "--weights", root / "W.safetensors", "--out", root / "run", "--max-steps", 2,
       "--lr", LR, "--device", "cpu", "--quiet")
    ok("evaluate", "--run", root / "run", "--out", root / "E.parquet", "--device", "cpu")
    return family, root, shown


def policy_of(family: str, root: Path, steps: int = STEPS):
    return policy_class(family).from_pretrained(root / "model", steps=steps, guidance_scale=FAMILIES[family].guidance,
                                                resolution=32, max_sequence_length=8, precision="no", device="cpu")


def test_the_chain_writes_every_artifact_on_the_familys_grid(chain):
    family, root, shown = chain
    policy = policy_of(family, root)
    grid = policy.grid_spec
    assert grid.kind == ("flowmatch" if family == "sd3" else "dynamic") and f"{family} model folder" in shown
    gains = read_gains(root / "g.parquet")
    assert GridSpec.from_json(gains.meta["grid"]) == grid
    np.testing.assert_array_equal(gains.sigmas, policy.sigmas.numpy())  # the exact σ grid, recorded
    np.testing.assert_array_equal(grid.sigmas(STEPS), policy.sigmas.numpy())  # the family rebuilds it exactly
    assert read_scores(root / "g.scores.parquet").meta["policy"]["kind"] == family
    np.testing.assert_array_equal(read_weights(root / "W.safetensors").sigmas, policy.sigmas.numpy()[::-1])
    run = json.loads((root / "run" / "run.json").read_text())
    np.testing.assert_array_equal(run["sigmas"], policy.sigmas.numpy()[::-1])
    assert (root / "run" / "checkpoints" / "step-000002").is_dir() and (root / "E.parquet").is_file()


def test_the_grid_is_the_pipelines_own(chain):
    """The σ's the family's diffusers pipeline samples on (FLUX / Qwen: set_timesteps(sigmas, mu))."""
    family, root, _ = chain
    policy = policy_of(family, root, steps=7)
    pipe = policy.pipe
    if family == "sd3":
        pipe.scheduler.set_timesteps(7)
    else:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        c = pipe.scheduler.config
        tokens = (32 // policy.vae_scale // 2) ** 2
        mu = calculate_shift(tokens, c.base_image_seq_len, c.max_image_seq_len, c.base_shift, c.max_shift)
        pipe.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 7, 7), mu=mu)
        assert policy.grid_spec.mu == pytest.approx(mu, abs=1e-12)
    np.testing.assert_array_equal(policy.sigmas.numpy(), pipe.scheduler.sigmas.numpy().astype(np.float64)[::-1])
    sigmas, spec = policy_class(family).folder_grid(root / "model", 7, 32)  # configs only, no weights
    assert spec == policy.grid_spec and np.array_equal(sigmas, policy.sigmas.numpy())


def test_step_log_probs_are_e1_on_the_familys_grid_and_mixed_t_is_one_call(chain):
    family, root, _ = chain
    policy = policy_of(family, root)
    cond = policy.encode_prompts(PROMPTS + PROMPTS)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, *policy.latent_shape, generator=g)
    t = torch.tensor([4, 3, 2, 1])
    noise = torch.randn(x.shape, generator=g)
    out = policy.step(x, t, cond, 0.7, noise=noise)
    with torch.no_grad():
        v = policy.velocity(x, policy.sigmas[t].float(), cond)
    x_next, mean, std, log_prob = sde_step(x, v, policy.sigmas[t].float(), policy.sigmas[t - 1].float(), 0.7,
                                           noise=noise)
    torch.testing.assert_close(out.x_next, x_next, rtol=0, atol=0)
    torch.testing.assert_close(out.log_prob, log_prob, rtol=0, atol=0)
    again = policy.step(x, t, cond, 0.7, prev_sample=out.x_next)  # the trainer's ratio path
    torch.testing.assert_close(again.log_prob, out.log_prob, rtol=0, atol=1e-5)
    for i in range(4):  # each sample at its own σ in one call = each alone
        alone = policy.velocity(x[i : i + 1], policy.sigmas[t[i : i + 1]].float(), cond.take(torch.tensor([i])))
        torch.testing.assert_close(alone, v[i : i + 1], rtol=0, atol=1e-5)
    traj = policy.sample(policy.encode_prompts(PROMPTS), 0.7, torch.tensor([5, 6]))
    assert traj.log_probs.shape == (2, STEPS) and torch.isfinite(traj.log_probs).all()


def test_the_ode_sampler_is_the_pipelines_sampling_loop(chain):
    family, root, _ = chain
    policy = policy_of(family, root)
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode_prompts(PROMPTS)
    z = x.clone()
    for t in range(STEPS, 0, -1):
        z = policy.step(z, torch.full((2,), t), cond, 0.0).x_next
    options = {"sd3": {"guidance_scale": FAMILIES["sd3"].guidance, "max_sequence_length": 8, "negative_prompt": ""},
               "flux": {"guidance_scale": FAMILIES["flux"].guidance, "max_sequence_length": 8},
               "qwenimage": {"true_cfg_scale": FAMILIES["qwenimage"].guidance, "negative_prompt": [" "] * 2,
                             "max_sequence_length": 8}}[family]
    latents = x if family == "sd3" else policy.pack(x)
    ref = policy.pipe(PROMPTS, num_inference_steps=STEPS, height=32, width=32, latents=latents, output_type="latent",
                      **options).images
    ref = ref if family == "sd3" else policy.unpack(ref)
    print(f"{family}: max |ours - pipeline| = {float((z - ref).abs().max()):.3g}")
    torch.testing.assert_close(z, ref, rtol=0, atol=1e-5)
    images = policy.decode(z)
    assert images.shape == (2, 3, 32, 32) and policy.encode(images).shape == x.shape


def test_the_trained_lora_loads_with_the_familys_own_load_lora_weights(chain):
    from recast_cli.policy.lora import load_lora_into_policy, resolve_adapter
    from recast_cli.train.config import DEFAULT_LORA_TARGETS
    from recast_cli.train.params import Parameters

    family, root, _ = chain
    trained = policy_of(family, root)
    params = Parameters(trained.network, 2, 4.0, DEFAULT_LORA_TARGETS, seed=0, keep_reference=False)
    params.load(resolve_adapter(root / "run").parent)
    loaded = policy_of(family, root)
    assert load_lora_into_policy(loaded, root / "run") == resolve_adapter(root / "run")  # pipe.load_lora_weights
    assert "recast" in loaded.pipe.transformer.peft_config
    base = policy_of(family, root)
    cond = loaded.encode_prompts(PROMPTS)
    x = torch.randn(2, *loaded.latent_shape, generator=torch.Generator().manual_seed(1))
    sigma = loaded.sigmas[torch.tensor([2, 3])].float()
    with torch.no_grad():
        v_loaded, v_trained, v_base = (p.velocity(x, sigma, cond) for p in (loaded, trained, base))
    moved = float((v_trained - v_base).abs().max())
    print(f"{family}: max |diffusers LoRA - trainer| = {float((v_loaded - v_trained).abs().max()):.3g}, moved {moved:.3g}")
    assert moved > MOVED
    torch.testing.assert_close(v_loaded, v_trained, rtol=0, atol=ATOL)


def test_a_folder_of_another_family_is_one_line(chain, tmp_path):
    family, root, _ = chain
    other = "flux" if family != "flux" else "qwenimage"
    setting = tmp_path / "wrong.toml"
    setting.write_text(SETTING.format(family=other, steps=STEPS).replace('path = "model"',
                                                                        f'path = "{root / "model"}"'))
    assert_one_line_exit_2(recast("check-setting", setting), f"a {other} policy needs a")


def test_a_w_on_another_resolutions_grid_is_refused_with_the_flags_that_fix_it(chain):
    """FLUX / Qwen grids shift with the resolution (μ): a W solved at another μ does not fit the run."""
    family, root, _ = chain
    if family == "sd3":
        pytest.skip("the sd3 grid does not depend on the resolution")
    mu = policy_of(family, root).grid_spec.mu
    ok("solve-w", "--gains", root / "g.parquet", "--lambda", "1,1", "--skip-clean", 1, "--mu", mu + 0.3,
       "--out", root / "W-other.safetensors")
    result = recast("train", "--setting", root / "smoke.toml", "--weights", root / "W-other.safetensors",
                    "--out", root / "refused", "--device", "cpu", "--quiet")
    assert_one_line_exit_2(result, "another σ grid")
    assert f"--grid dynamic --mu {mu!r}" in result.stderr and not (root / "refused").exists()
    ok("solve-w", "--gains", root / "g.parquet", "--lambda", "1,1", "--skip-clean", 1, "--steps", STEPS,
       "--grid", "dynamic", "--mu", repr(mu), "--out", root / "W-fixed.safetensors")  # the flags it names
    np.testing.assert_array_equal(read_weights(root / "W-fixed.safetensors").sigmas,
                                  read_weights(root / "W.safetensors").sigmas)


def test_flux_under_fsdp_trains_what_one_process_trains(chain):
    """FLUX's double- and single-stream blocks each an FSDP unit (2 gloo processes) = 1 process."""
    from safetensors.torch import load_file

    from tests.train.conftest import FSDP_CONFIG, launch, run_cli

    family, root, _ = chain
    if family != "flux":
        pytest.skip("the FSDP engine is tested on sd3 in tests/train/test_fsdp.py; flux adds single-stream blocks")
    args = ["train", "--setting", str(root / "smoke.toml"), "--weights", str(root / "W.safetensors"), "--quiet",
            "--device", "cpu", "--max-steps", "1", "--lr", str(LR), "--set", "prompts_per_step=2"]
    run_cli([sys.executable, "-m", "recast_cli", *args, "--out", str(root / "one")])
    run_cli(launch(*args, "--out", str(root / "fsdp"), config=FSDP_CONFIG))
    assert json.loads((root / "fsdp" / "run.json").read_text())["config"]["engine"] == "fsdp"
    a, b = (load_file(str(root / run / "checkpoints" / "step-000001" / "adapter" / "pytorch_lora_weights.safetensors"))
            for run in ("one", "fsdp"))
    assert set(a) == set(b) and any("single_transformer_blocks" in k for k in a)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"flux: max |LoRA(2 FSDP processes) - LoRA(1 process)| = {diff:.3g}")
    assert diff <= 1e-5 and max(float(v.abs().max()) for k, v in a.items() if ".lora_B." in k) > 1e-4
