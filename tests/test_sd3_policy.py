"""The SD3 policy on tiny SD3-architecture folders written with save_pretrained, loaded by the real loader."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from recast_cli.errors import BadInput
from recast_cli.grid import GridSpec
from recast_cli.policy.sd3 import SD3Policy
from recast_cli.toy.model import build_pipeline, save_pipeline

WORDS = "a red green blue yellow circle square triangle on white black background".split()
PROMPTS = ["a red circle on a white background", "a blue square on a black background"]


@pytest.fixture(scope="module", params=[False, True], ids=["clip-only", "with-t5"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("sd3") / "model"
    save_pipeline(build_pipeline(WORDS, with_t5=request.param, seed=0), path)
    return path


@pytest.fixture(scope="module")
def policy(folder):
    return SD3Policy.from_pretrained(folder, steps=6, guidance_scale=3.0, max_sequence_length=8, device="cpu")


def test_loads_and_samples_through_the_real_loader(policy, folder):
    has_t5 = (folder / "text_encoder_3").is_dir()
    assert (policy.pipe.text_encoder_3 is not None) == has_t5
    cond = policy.encode_prompts(PROMPTS)
    traj = policy.sample(cond, noise_level=0.7, seeds=torch.tensor([0, 1]))
    assert traj.states.shape == (2, 7, *policy.latent_shape) and policy.latent_shape == (4, 8, 8)
    assert traj.log_probs.shape == (2, 6) and torch.isfinite(traj.log_probs).all()
    images = policy.decode(traj.states[:, -1])
    assert images.shape == (2, 3, 32, 32) and 0 <= float(images.min()) and float(images.max()) <= 1
    assert policy.encode(images).shape == (2, *policy.latent_shape)


def test_grid_is_the_schedulers_in_paper_order(policy):
    torch.testing.assert_close(policy.sigmas, torch.from_numpy(GridSpec("flowmatch", shift=3.0).sigmas(6)))


def test_prompt_embeddings_are_cached_and_per_prompt(policy):
    a = policy.encode_prompts([PROMPTS[0]])
    both = policy.encode_prompts(PROMPTS)
    torch.testing.assert_close(both.prompt_embeds[0], a.prompt_embeds[0])
    assert not torch.allclose(both.pooled[0], both.pooled[1])
    assert set(PROMPTS) <= set(policy._cache)


def test_sampling_is_deterministic_from_seeds(policy):
    cond = policy.encode_prompts(PROMPTS)
    a = policy.sample(cond, 0.7, torch.tensor([5, 6])).states
    b = policy.sample(cond, 0.7, torch.tensor([5, 6])).states
    assert torch.equal(a, b)


def test_mixed_t_rollouts_equal_per_t_sequential_rollouts(policy):
    cond = policy.encode_prompts([PROMPTS[i % 2] for i in range(6)])
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, *policy.latent_shape, generator=gen)
    t = torch.tensor([6, 1, 4, 2, 6, 3])
    seeds = torch.tensor([10, 11, 12, 13, 14, 15])
    mixed = policy.rollout(x, t, cond, noise_level=1.414, seeds=seeds)
    for i in range(6):
        alone = policy.rollout(x[i : i + 1], t[i : i + 1], cond.take(torch.tensor([i])), 1.414, seeds[i : i + 1])
        torch.testing.assert_close(mixed[i : i + 1], alone, atol=1e-5, rtol=1e-5)


def test_common_random_numbers_share_step_noise_across_start_steps(policy):
    cond = policy.encode_prompts([PROMPTS[0]] * 2)
    x = torch.randn(1, *policy.latent_shape).repeat(2, 1, 1, 1)
    # From the same x_1 with the same seed, two rollouts are identical however they are batched.
    out = policy.rollout(x, torch.tensor([1, 1]), cond, 1.414, torch.tensor([7, 7]))
    torch.testing.assert_close(out[0], out[1])


def test_bad_steps_and_noise_levels_are_bad_input(policy):
    cond = policy.encode_prompts([PROMPTS[0]])
    x = torch.randn(1, *policy.latent_shape)
    with pytest.raises(BadInput, match=r"step t must lie in 1\.\.6"):
        policy.rollout(x, torch.tensor([7]), cond, 1.0, torch.tensor([0]))
    with pytest.raises(BadInput, match=r"step t must lie in 1\.\.6"):
        policy.rollout(x, torch.tensor([0]), cond, 1.0, torch.tensor([0]))
    with pytest.raises(BadInput, match="noise level"):
        policy.rollout(x, torch.tensor([2]), cond, -0.5, torch.tensor([0]))


def test_missing_folder_or_component_is_named(tmp_path, folder):
    with pytest.raises(BadInput, match="does not exist"):
        SD3Policy.from_pretrained(tmp_path / "absent", steps=4)
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(BadInput, match="vae/ is missing"):
        SD3Policy.from_pretrained(broken, steps=4)
    index = json.loads((broken / "model_index.json").read_text())
    del index["transformer"]
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(BadInput, match="no 'transformer' component"):
        SD3Policy.from_pretrained(broken, steps=4)
