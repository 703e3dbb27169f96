"""``[policy] offload_text_encoders``: the text encoders wait on the host and visit the device only to
encode prompts the cache lacks; embeddings, sampled latents and a step's loss and gradient are the
same as without offload (on the CPU, and on CUDA where there is one)."""

from __future__ import annotations

import pytest
import torch

from recast_cli.errors import BadInput
from recast_cli.policy.pipeline import HOST, offload_by_default, text_encoders
from recast_cli.policy.sd3 import SD3Policy
from recast_cli.setting.load import load_setting
from recast_cli.toy.model import build_pipeline, save_pipeline

WORDS = "a red green blue yellow circle square triangle on white black background".split()
PROMPTS = ["a red circle on a white background", "a blue square on a black background"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("sd3-t5") / "model"
    save_pipeline(build_pipeline(WORDS, with_t5=True, seed=0), path)
    return path


def load(folder, device, offload, **kw):
    return SD3Policy.from_pretrained(folder, steps=4, guidance_scale=3.0, max_sequence_length=8, device=device,
                                     precision="no", offload_text_encoders=offload, **kw)


def spy_moves(policy) -> list[tuple[str, str]]:
    """(encoder, device type) for every ``.to`` of a text encoder from now on."""
    moves: list[tuple[str, str]] = []
    for name, module in text_encoders(policy.pipe).items():
        original = module.to

        def to(*args, _name=name, _original=original, **kwargs):
            moves.append((_name, torch.device(args[0]).type))
            return _original(*args, **kwargs)

        module.to = to
    return moves


def step_loss(policy, cond, traj) -> tuple[torch.Tensor, torch.Tensor]:
    """−log π(x_{t−1} | x_t) of the trajectory's first step (what the PPO update differentiates) and
    the gradient of the transformer's first projection."""
    weight = policy.pipe.transformer.pos_embed.proj.weight
    weight.requires_grad_(True)
    weight.grad = None
    t = torch.full((traj.states.shape[0],), policy.T, dtype=torch.long)
    out = policy.step(traj.states[:, 0], t, cond, 0.7, prev_sample=traj.states[:, 1])
    loss = -out.log_prob.mean()
    loss.backward()
    grad = weight.grad.detach().clone()
    weight.requires_grad_(False)
    return loss.detach(), grad


@pytest.mark.parametrize("device", DEVICES)
def test_offload_gives_the_same_embeddings_latents_and_loss(folder, device):
    on, off = load(folder, device, True), load(folder, device, False)
    a, b = on.encode_prompts(PROMPTS), off.encode_prompts(PROMPTS)
    for field in ("prompt_embeds", "pooled", "negative_embeds", "negative_pooled"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    seeds = torch.tensor([3, 4])
    ta, tb = on.sample(a, 0.7, seeds), off.sample(b, 0.7, seeds)
    assert torch.equal(ta.states, tb.states) and torch.equal(ta.log_probs, tb.log_probs)
    (la, ga), (lb, gb) = step_loss(on, a, ta), step_loss(off, b, tb)
    assert torch.equal(la, lb) and torch.equal(ga, gb) and torch.isfinite(la) and ga.abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_offloaded_encoders_wait_on_the_host_and_visit_the_device_only_for_new_prompts(folder, device):
    policy = load(folder, device, True)
    names = set(text_encoders(policy.pipe))
    assert names == {"text_encoder", "text_encoder_2", "text_encoder_3"}
    assert all(p.device.type == HOST.type for m in text_encoders(policy.pipe).values() for p in m.parameters())
    assert policy.pipe.transformer.pos_embed.proj.weight.device.type == device
    seen: list[str] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append(next(mod.parameters()).device.type))
             for m in text_encoders(policy.pipe).values()]
    moves = spy_moves(policy)
    policy.encode_prompts(PROMPTS)
    assert seen and set(seen) == {device}  # every encoder ran on the policy's device
    assert sorted(moves) == sorted([(n, device) for n in names] + [(n, HOST.type) for n in names])
    assert moves[: len(names)] == [(n, device) for n in text_encoders(policy.pipe)]  # there first, then back
    moves.clear()
    policy.encode_prompts(PROMPTS[:1])  # cached: the encoders stay where they are
    assert moves == []
    for hook in hooks:
        hook.remove()


def test_without_offload_the_encoders_stay_on_the_device_and_never_move(folder):
    policy = load(folder, "cpu", False)
    moves = spy_moves(policy)
    policy.encode_prompts(PROMPTS)
    assert moves == [] and not policy.offload_text_encoders


def test_the_default_offloads_when_the_encoders_outweigh_what_is_trained(folder):
    pipe = build_pipeline(WORDS, with_t5=True, seed=0)
    encoders = sum(p.numel() for m in text_encoders(pipe).values() for p in m.parameters())
    assert offload_by_default(pipe, 0) and offload_by_default(pipe, encoders - 1)
    assert not offload_by_default(pipe, encoders)
    everything = sum(p.numel() for p in build_pipeline(WORDS, with_t5=True).transformer.parameters())
    assert everything > encoders  # trained in full, the tiny transformer outweighs its encoders
    assert not load(folder, "cpu", None, trainable=lambda t: sum(p.numel() for p in t.parameters())).offload_text_encoders
    assert load(folder, "cpu", None, trainable=lambda t: 10).offload_text_encoders
    assert load(folder, "cpu", None).offload_text_encoders  # nothing trained (estimate, evaluate)
    assert not load(folder, "cpu", False, trainable=lambda t: 10).offload_text_encoders  # explicit wins


def test_the_setting_key_takes_true_or_false_and_nothing_else(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[policy]\nkind = "sd3"\npath = "m"\noffload_text_encoders = false\n')
    assert load_setting(str(path)).policy.offload_text_encoders is False
    path.write_text('[policy]\nkind = "sd3"\npath = "m"\n')
    assert load_setting(str(path)).policy.offload_text_encoders is None
    path.write_text('[policy]\nkind = "sd3"\npath = "m"\noffload_text_encoders = "yes"\n')
    with pytest.raises(BadInput, match=r"\[policy\] offload_text_encoders = \"yes\" is not true or false"):
        load_setting(str(path))
    path.write_text('[policy]\nkind = "sd3"\npath = "m"\noffload_text_encoder = true\n')
    with pytest.raises(BadInput, match="unknown \\[policy\\] keys offload_text_encoder;.*offload_text_encoders"):
        load_setting(str(path))
