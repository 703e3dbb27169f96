"""The trainer on the tiny toy setting (T = 4), driven through plan_run + Trainer (its run opened by ``with``).

E13 inside the loss (static W = λ̂-weighted advantage at every step; a one-step W row
moves that reward's gradient to that step only), exact resume, crash-safe checkpoints and
``--init``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from recast_cli.errors import BadInput
from recast_cli.setting.load import load_setting
from recast_cli.train import checkpoint as ckpt
from recast_cli.train.config import TrainConfig, config_from_setting
from recast_cli.train.metrics import TIMING_COLUMNS, read_metrics
from recast_cli.train.objective import group_advantages, step_advantages
from recast_cli.train.params import LORA_FILE
from recast_cli.train.plan import plan_run, static_run_weights
from recast_cli.train.runfolder import RunLock
from recast_cli.train.trainer import Trainer

# Losses and gradients of two mathematically identical advantage tensors: the model runs in
# float32, so agreement is demanded to float32 round-off (in practice they are bit-equal).
RTOL, ATOL = 1e-6, 1e-10


def base_config(setting: Path) -> TrainConfig:
    s = load_setting(str(setting))
    return config_from_setting(s)


def make_trainer(setting: Path, cfg: TrainConfig, run: Path, resume: bool = False, init: str | None = None) -> Trainer:
    """A trainer of a static-W run, built; ``with make_trainer(...) as trainer`` opens the run."""
    plan = plan_run(load_setting(str(setting)), cfg, "static", run, resume, init, "cpu")
    return Trainer(plan, quiet=True, loggers=False)


def all_pairs(trainer: Trainer, B: int, steps) -> np.ndarray:
    return np.array([(b, t) for b in range(B) for t in steps], dtype=np.int64)


def loss_and_grads(trainer: Trainer, batch, adv_t: torch.Tensor, pairs: np.ndarray):
    trainer.optimizer.zero_grad(set_to_none=True)
    loss, _ = trainer.pair_loss(batch, adv_t, pairs)
    loss.backward()
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in trainer.params.tensors]
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grads


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cfg(train_setting) -> TrainConfig:
    return base_config(train_setting)


@pytest.fixture(scope="module")
def probe(train_setting, cfg, tmp_path_factory):
    """A trainer whose LoRA is moved off its zero-B init (so every tensor has a gradient), and one sampled batch
    (no run opened: nothing of it is written)."""
    trainer = make_trainer(train_setting, cfg, tmp_path_factory.mktemp("probe") / "run")
    gen = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in trainer.params.tensors:
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    batch = trainer.sample(0)
    return trainer, batch


@pytest.fixture(scope="module")
def straight(train_setting, cfg, tmp_path_factory) -> Path:
    """A 4-step run in one go (checkpoints at steps 2 and 4)."""
    run = tmp_path_factory.mktemp("straight") / "run"
    with make_trainer(train_setting, cfg, run) as trainer:
        assert trainer.train() == 4
    return run


# ------------------------------------------------------------------ E13 inside the loss


def test_static_W_gives_the_lambda_hat_weighted_advantage_at_every_step(probe, cfg):
    trainer, batch = probe
    B, T = len(batch.prompts), trainer.T
    adv = group_advantages(batch.rewards, cfg.group_size, global_std=cfg.adv_std == "global")
    assert adv.abs().max() > 0.1  # the toy rewards differ within the groups
    lam_hat = torch.tensor(cfg.lam, dtype=torch.float64) / sum(cfg.lam)
    W = torch.as_tensor(static_run_weights(cfg, np.linspace(1, 0, T + 1)).W)
    by_e13 = step_advantages(adv, W, clip=cfg.adv_clip, trained=len(trainer.trained_steps))
    # Σ_i λ̂_i·A_i on every trained step (E13 with T'), 0 on the untrained cleanest step
    trained = [t - 1 for t in trainer.trained_steps]
    assert trained == [3, 2, 1] and torch.all(W[:, 0] == 0)
    by_sum = torch.zeros(B, T, dtype=torch.float64)
    by_sum[:, trained] = (adv @ lam_hat).clamp(-cfg.adv_clip, cfg.adv_clip)[:, None]
    assert torch.allclose(by_e13, by_sum, rtol=1e-12, atol=1e-12)
    _, from_trainer = trainer.advantages(batch.rewards)  # the trainer's own path, with its static W
    assert torch.allclose(from_trainer, by_sum, rtol=1e-12, atol=1e-12)

    pairs = all_pairs(trainer, B, trainer.trained_steps)
    loss_a, grads_a = loss_and_grads(trainer, batch, by_e13, pairs)
    loss_b, grads_b = loss_and_grads(trainer, batch, by_sum, pairs)
    assert torch.isfinite(loss_a) and cfg.beta_kl > 0
    assert torch.allclose(loss_a, loss_b, rtol=RTOL, atol=ATOL)
    assert all(torch.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in zip(grads_a, grads_b))
    # every LoRA tensor gets a gradient, except the last block's context queries (its context output is unused)
    dead = [n for n, g in zip(trainer.params.names, grads_a) if g.abs().max() == 0]
    assert len(dead) <= 2 and all(".attn.add_q_proj." in n for n in dead), dead

    # the comparison can fail: a W with the same rows spent at other times moves the gradient
    rng = np.random.default_rng(0)
    K = rng.random(tuple(W.shape))
    K[:, 0] = 0.0
    W_other = torch.as_tensor(K / K.sum(axis=1, keepdims=True) * lam_hat.numpy()[:, None])
    _, grads_c = loss_and_grads(trainer, batch, step_advantages(adv, W_other, clip=cfg.adv_clip,
                                                                trained=len(trainer.trained_steps)), pairs)
    assert not all(torch.allclose(a, c, rtol=RTOL, atol=ATOL) for a, c in zip(grads_a, grads_c))


# (2, 4, 2.0): a weight large enough that T·W·A_i passes the ±adv_clip clip
@pytest.mark.parametrize("i, t0, weight", [(0, 3, None), (1, 2, None), (2, 4, 2.0)])
def test_a_W_row_on_one_step_puts_that_rewards_gradient_on_that_step_only(probe, cfg, monkeypatch, i, t0, weight):
    trainer, batch = probe
    B, T, m = len(batch.prompts), trainer.T, len(cfg.rewards)
    lam_hat = np.asarray(cfg.lam) / np.sum(cfg.lam)
    rng = np.random.default_rng(i)
    W = rng.random((m, T)) * lam_hat[:, None] / T * 2  # other rows arbitrary
    W[i] = 0.0
    W[i, t0 - 1] = lam_hat[i] if weight is None else weight
    rewards = torch.full((B, m), 0.3, dtype=torch.float64)  # constant within each group: zero advantage
    rewards[:, i] = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64)[:B]
    monkeypatch.setattr(trainer, "W", torch.as_tensor(W))
    monkeypatch.setattr(trainer, "cfg", replace(cfg, beta_kl=0.0))
    adv, adv_t = trainer.advantages(rewards)
    assert torch.count_nonzero(adv[:, [k for k in range(m) if k != i]]) == 0
    expected = (len(trainer.trained_steps) * W[i, t0 - 1] * adv[:, i]).clamp(-cfg.adv_clip, cfg.adv_clip)  # E13, T'·W
    assert torch.allclose(adv_t[:, t0 - 1], expected, rtol=1e-12, atol=0) and torch.count_nonzero(expected) == B
    if weight is not None:
        assert torch.equal(adv_t[:, t0 - 1].abs(), torch.full((B,), cfg.adv_clip, dtype=torch.float64))
    assert torch.count_nonzero(adv_t[:, [t - 1 for t in range(1, T + 1) if t != t0]]) == 0
    for t in range(1, T + 1):
        _, grads = loss_and_grads(trainer, batch, adv_t, all_pairs(trainer, B, [t]))
        nonzero = sum(int(torch.count_nonzero(g)) for g in grads)
        if t == t0:
            assert nonzero > 0
        else:
            assert nonzero == 0, f"step {t} has a gradient though only step {t0} carries reward {i}'s weight"
    # with the KL on, the other steps do get a (KL-only) gradient: beta_kl = 0 is what isolates them
    monkeypatch.setattr(trainer, "cfg", cfg)
    other = next(t for t in trainer.trained_steps if t != t0)
    _, grads = loss_and_grads(trainer, batch, adv_t, all_pairs(trainer, B, [other]))
    assert sum(int(torch.count_nonzero(g)) for g in grads) > 0


# ------------------------------------------------------------------ resume, checkpoints, --init


def test_a_resumed_run_reproduces_the_straight_run_exactly(train_setting, cfg, straight, tmp_path):
    run = tmp_path / "split"
    with make_trainer(train_setting, replace(cfg, max_steps=2), run) as first:
        assert first.train() == 2
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [2]
    with make_trainer(train_setting, cfg, run, resume=True) as second:
        assert second.iteration == 2 and second.plan.resume_from == ckpt.step_dir(run, 2)
        assert second.train() == 4

    a = read_metrics(straight / "metrics.parquet").to_pandas()
    b = read_metrics(run / "metrics.parquet").to_pandas()
    assert len(a) == 4 * len(cfg.rewards) and list(a["step"].unique()) == [1, 2, 3, 4]
    pd.testing.assert_frame_equal(a.drop(columns=list(TIMING_COLUMNS)), b.drop(columns=list(TIMING_COLUMNS)),
                                  check_exact=True)

    for step in (2, 4):
        ca, cb = ckpt.step_dir(straight, step), ckpt.step_dir(run, step)
        lora_a = load_file(str(ca / "adapter" / LORA_FILE))
        lora_b = load_file(str(cb / "adapter" / LORA_FILE))
        assert lora_a.keys() == lora_b.keys() and lora_a
        assert all(torch.equal(lora_a[k], lora_b[k]) for k in lora_a), f"LoRA differs at step {step}"
        state_a, json_a = ckpt.read_checkpoint(ca)
        state_b, json_b = ckpt.read_checkpoint(cb)
        optim = [k for k in state_a if k.startswith("optim/")]
        assert optim and set(optim) == {k for k in state_b if k.startswith("optim/")}
        assert all(torch.equal(state_a[k], state_b[k]) for k in optim), f"optimizer state differs at step {step}"
        assert json_a == json_b
    # a trained LoRA moved away from its init
    assert any(v.abs().max() > 0 for k, v in lora_a.items() if "lora_B" in k)


def test_a_failed_save_leaves_the_last_good_checkpoint(train_setting, cfg, tmp_path, monkeypatch):
    run = tmp_path / "run"
    with make_trainer(train_setting, cfg, run) as trainer:
        good = trainer.save()
        assert good == ckpt.step_dir(run, 0)
        adapter_bytes = (good / "adapter" / LORA_FILE).read_bytes()
        with torch.no_grad():
            for p in trainer.params.tensors:
                p.add_(1.0)
        trainer.iteration = 2

        seen = {}

        def dies_after_the_adapter(tensors, filename, *args, **kwargs):
            folder = Path(filename).parent
            seen["adapter_written"] = (folder / "adapter" / LORA_FILE).is_file()
            seen["folder"] = folder
            raise OSError("No space left on device")

        monkeypatch.setattr("recast_cli.train.checkpoint.save_file", dies_after_the_adapter)
        with pytest.raises(OSError):
            trainer.save()
        assert seen["adapter_written"] and seen["folder"] != ckpt.step_dir(run, 2)

        def check_intact(expected_steps):
            assert [s for s, _ in ckpt.list_checkpoints(run)] == expected_steps
            assert ckpt.latest_checkpoint(run) == ckpt.step_dir(run, expected_steps[-1])
            assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step-{s:06d}" for s in expected_steps]
            _, state = ckpt.read_checkpoint(good)
            assert state["step"] == 0
            assert (good / "adapter" / LORA_FILE).read_bytes() == adapter_bytes

        check_intact([0])

        # a rerun that fails while a checkpoint of the same step exists keeps that one too
        monkeypatch.undo()
        again = trainer.save()
        assert again == ckpt.step_dir(run, 2)
        step2_bytes = (again / "adapter" / LORA_FILE).read_bytes()
        monkeypatch.setattr("recast_cli.train.checkpoint.save_file", dies_after_the_adapter)
        with torch.no_grad():
            for p in trainer.params.tensors:
                p.add_(1.0)
        with pytest.raises(OSError):
            trainer.save()
        check_intact([0, 2])
        ckpt.read_checkpoint(again)
        assert (again / "adapter" / LORA_FILE).read_bytes() == step2_bytes


def test_a_built_trainer_writes_nothing_and_the_open_one_owns_the_run_lock(train_setting, cfg, tmp_path):
    run = tmp_path / "run"
    trainer = make_trainer(train_setting, cfg, run)
    assert not run.exists()
    with pytest.raises(RuntimeError, match="not open"):
        trainer.train()
    with trainer:
        assert (run / "run.json").is_file() and trainer.is_open
        with pytest.raises(BadInput, match="being written by another recast train"):
            RunLock(run)
    assert not trainer.is_open
    RunLock(run).release()  # released when the block ended


def test_init_starts_from_the_checkpoints_lora_with_a_fresh_optimizer(train_setting, cfg, straight, tmp_path):
    latest = ckpt.latest_checkpoint(straight)
    assert latest == ckpt.step_dir(straight, 4)
    trained = load_file(str(latest / "adapter" / LORA_FILE))
    # another learning rate is fine: --init takes the weights only, not the run
    new_cfg = replace(cfg, learning_rate=5e-4)
    with make_trainer(train_setting, new_cfg, tmp_path / "from-run", init=str(straight)) as trainer:
        assert trainer.plan.init_from == latest / "adapter"
        live = trainer.params.state()
        assert live.keys() == trained.keys()
        assert all(torch.equal(live[k], trained[k]) for k in trained)
        assert trainer.iteration == 0 and len(trainer.optimizer.state) == 0
        assert all(g["lr"] == 5e-4 for g in trainer.optimizer.param_groups)
    assert ckpt.list_checkpoints(tmp_path / "from-run") == []

    # a checkpoint folder works too, and gives that checkpoint's tensors
    older = ckpt.step_dir(straight, 2)
    from_ckpt = make_trainer(train_setting, cfg, tmp_path / "from-ckpt", init=str(older))
    older_tensors = load_file(str(older / "adapter" / LORA_FILE))
    live = from_ckpt.params.state()
    assert all(torch.equal(live[k], older_tensors[k]) for k in older_tensors)
    assert any(not torch.equal(older_tensors[k], trained[k]) for k in trained)

    # without --init the LoRA is the fresh one, not the trained one
    fresh = make_trainer(train_setting, cfg, tmp_path / "fresh").params.state()
    assert any(not torch.equal(fresh[k], trained[k]) for k in trained)


# ------------------------------------------------------------------ torch.compile


def _cxx_compiler() -> bool:
    import shutil

    return any(shutil.which(c) for c in ("c++", "g++", "clang++"))


# inductor, the default backend, where a C++ compiler makes it run on CPUs, else aot_eager (which
# tests/test_preflight.py also trains with, compiled, in every phase)
@pytest.mark.parametrize("backend", ["inductor" if _cxx_compiler() else "aot_eager"])
def test_a_compiled_run_follows_the_eager_run(train_setting, cfg, tmp_path, backend):
    """``compile = true`` runs the same training through the compiled denoiser (graphs really built)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    run = tmp_path / "compiled"
    # one batch size everywhere (the setting's 3 + 1 samples and 5 + 5 + 2 pairs would compile each shape), so
    # the adapter-off reference call looks like a sampling call to the compiler but for the adapter's state
    with make_trainer(train_setting, replace(cfg, sample_batch=4, micro_batch=4), tmp_path / "eager") as eager:
        assert eager.train() == 4
    with make_trainer(train_setting, replace(cfg, sample_batch=4, micro_batch=4, compile=True,
                                             compile_backend=backend), run) as trainer:
        assert trainer.policy.denoiser is not trainer.policy.pipe.transformer
        assert trainer.train() == 4
    assert counters["stats"]["unique_graphs"] >= 3  # sampling (no grad), the policy (grad), the adapter-off reference

    a = read_metrics(eager.run / "metrics.parquet").to_pandas().drop(columns=list(TIMING_COLUMNS))
    b = read_metrics(run / "metrics.parquet").to_pandas().drop(columns=list(TIMING_COLUMNS))
    # a list column is compared exactly by pandas: the advantage correlations (of advantages near zero, where
    # the compiled kernels' rounding shows most) are compared to a tolerance of their own
    np.testing.assert_allclose(np.stack(a.pop("adv_corr")), np.stack(b.pop("adv_corr")), atol=1e-4)
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-4, atol=1e-6)
    lora_a = load_file(str(ckpt.step_dir(eager.run, 4) / "adapter" / LORA_FILE))
    lora_b = load_file(str(ckpt.step_dir(run, 4) / "adapter" / LORA_FILE))
    assert lora_a.keys() == lora_b.keys() and lora_a
    for k in lora_a:
        # compiled kernels round differently, and AdamW normalises each coordinate: where a gradient is
        # near zero, that rounding becomes a visible step. Bound: 0.1% of the tensor's scale
        # (aot_eager runs the eager kernels and is bit-equal; inductor's largest difference was 2.7e-6)
        scale = float(lora_a[k].abs().max())
        torch.testing.assert_close(lora_b[k], lora_a[k], rtol=1e-4, atol=max(1e-3 * scale, 1e-8),
                                   msg=lambda m: f"{k}: {m}")
    # how the denoiser executes is not part of the run's identity: the eager trainer resumes it
    with make_trainer(train_setting, replace(cfg, sample_batch=4, micro_batch=4, max_steps=5), run,
                      resume=True) as resumed:
        assert resumed.iteration == 4 and resumed.policy.denoiser is resumed.policy.pipe.transformer
