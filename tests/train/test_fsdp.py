"""The FSDP engine: 2 CPU processes over gloo, the transformer sharded by FSDP2, train what 1 process trains.

``accelerate launch --config_file pipelines/accelerate/fsdp.yaml`` (fsdp_version: 2) starts the
processes; recast shards the transformer itself with ``fully_shard`` (each block, then the root),
so it runs on CPUs although accelerate's FSDP plugin is GPU-only. The tiny setting with EMA on
trains 2 steps in 1 process and in 2 FSDP processes; a third run stops after step 1 and is
resumed under FSDP, a copy of it (an FSDP checkpoint) is resumed by 1 process.

Measured (torch 2.14.1 CPU build, 2 cores; 62 LoRA tensors, |lora_B| ≤ 2e-3 after 2 steps):
FSDP vs 1 process — losses |Δ| ≤ 1e-8 (values ~1e-6), KL |Δ| ≤ 9e-11 (values ~2e-5), grad norms
|Δ| ≤ 9.3e-10 (values ~1e-2), reward means |Δ| ≤ 2.7e-7 at step 2 (step 1 bit-identical), final
LoRA max |Δ| = 8.3e-7, EMA LoRA and AdamW moments max |Δ| = 1.6e-7; the adapter files carry the
same keys, shapes and LoRA metadata. FSDP stopped at step 1 and resumed under FSDP: every metric
and every checkpoint tensor bit-identical to the uninterrupted FSDP run. Wall (2 steps, 2 shared
cores): 1 process 10 s, 2 DDP processes 21 s, 2 FSDP processes 19-21 s (start-up and communication).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from recast_cli.errors import BadInput
from recast_cli.train.config import TrainConfig
from recast_cli.train.metrics import read_metrics
from recast_cli.train.plan import check_fsdp
from tests.train.conftest import FSDP_CONFIG, free_port, launch, run_cli, tiny_train_setting

STEPS = 2
COMMON = ["train", "--weights", "static", "--quiet", "--device", "cpu", "--set", "save_every=1",
          "--set", "sample_batch=2"]
EMA = "ema_decay = 0.9\n"
LORA_ATOL = 1e-5  # measured 8.3e-7
LOSS_ATOL = 1e-7  # measured 1e-8
REWARD_ATOL = 1e-6  # measured 2.7e-7
GRAD_RTOL = 1e-6  # measured 8e-8
FILES = ("adapter/pytorch_lora_weights.safetensors", "adapter_ema/pytorch_lora_weights.safetensors",
         "state.safetensors")


def _single(*args: str) -> list[str]:
    return [sys.executable, "-m", "recast_cli", *args]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    setting = tiny_train_setting(root, EMA)
    args = [*COMMON, "--setting", str(setting)]
    one, two, resumed, crossed = (root / name for name in ("one", "two", "resumed", "crossed"))
    run_cli(_single(*args, "--max-steps", str(STEPS), "--out", str(one)))
    run_cli(launch(*args, "--max-steps", str(STEPS), "--out", str(two), config=FSDP_CONFIG))
    run_cli(launch(*args, "--max-steps", "1", "--out", str(resumed), config=FSDP_CONFIG))
    shutil.copytree(resumed, crossed)
    run_cli(launch(*args, "--max-steps", str(STEPS), "--resume", "--out", str(resumed), config=FSDP_CONFIG))
    run_cli(_single(*args, "--max-steps", str(STEPS), "--resume", "--out", str(crossed)))
    return {"one": one, "two": two, "resumed": resumed, "crossed": crossed}


def _metrics(run: Path):
    return read_metrics(run / "metrics.parquet").to_pandas().sort_values(["step", "reward"]).reset_index(drop=True)


def _checkpoint(run: Path, step: int = STEPS) -> Path:
    return run / "checkpoints" / f"step-{step:06d}"


def _tensors(run: Path, name: str) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(_checkpoint(run) / name)).items() if not k.startswith("rng/")}


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def test_each_run_records_its_engine_and_process_count(runs):
    for name, n, kind in (("one", 1, "single"), ("two", 2, "fsdp"), ("resumed", 2, "fsdp"), ("crossed", 1, "single")):
        state = json.loads((_checkpoint(runs[name]) / "state.json").read_text())
        assert (state["processes"], state["engine"]) == (n, kind), name
    config = json.loads((runs["two"] / "run.json").read_text())["config"]
    assert config["processes"] == 2 and config["engine"] == "fsdp"
    assert sorted(p.name for p in (runs["two"] / "checkpoints").iterdir()) == ["step-000001", f"step-{STEPS:06d}"]
    assert len(_metrics(runs["two"])) == STEPS * 3


def test_fsdp_metrics_match_a_single_process_run(runs):
    a, b = _metrics(runs["one"]), _metrics(runs["two"])
    assert list(a["step"]) == list(b["step"]) and list(a["reward"]) == list(b["reward"])
    first = a["step"] == 1
    np.testing.assert_array_equal(a.loc[first, "reward_mean"], b.loc[first, "reward_mean"])
    np.testing.assert_allclose(a["reward_mean"], b["reward_mean"], rtol=0, atol=REWARD_ATOL)
    for col in ("loss", "policy_loss", "kl", "clip_frac"):
        np.testing.assert_allclose(a[col], b[col], rtol=0, atol=LOSS_ATOL, err_msg=col)
    assert (a["kl"][~first] > 0).all()
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=GRAD_RTOL)


def test_fsdp_lora_ema_and_moments_match_a_single_process_run(runs):
    for name in FILES:
        a, b = _tensors(runs["one"], name), _tensors(runs["two"], name)
        assert _max_diff(a, b) <= LORA_ATOL, name
    lora = _tensors(runs["one"], FILES[0])
    assert max(float(v.abs().max()) for k, v in lora.items() if ".lora_B." in k) > 100 * LORA_ATOL


def test_an_fsdp_adapter_file_is_the_single_process_format(runs):
    a, b = (_checkpoint(runs[name]) / FILES[0] for name in ("one", "two"))
    with safe_open(str(a), "pt") as x, safe_open(str(b), "pt") as y:
        assert x.metadata() == y.metadata()
        assert sorted(x.keys()) == sorted(y.keys())
        for key in x.keys():
            assert (x.get_slice(key).get_shape(), x.get_slice(key).get_dtype()) == \
                   (y.get_slice(key).get_shape(), y.get_slice(key).get_dtype())


def test_an_fsdp_run_resumed_under_fsdp_equals_the_uninterrupted_run(runs):
    a, b = _metrics(runs["two"]), _metrics(runs["resumed"])
    cols = ["step", "reward", "reward_mean", "reward_std", "aggregate", "loss", "policy_loss", "kl", "grad_norm"]
    assert a[cols].equals(b[cols])
    for name in FILES:
        a, b = _tensors(runs["two"], name), _tensors(runs["resumed"], name)
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), name


def test_an_fsdp_checkpoint_is_resumed_by_one_process(runs):
    a, b = _metrics(runs["one"]), _metrics(runs["crossed"])
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=0, atol=LOSS_ATOL)
    np.testing.assert_allclose(a["reward_mean"], b["reward_mean"], rtol=0, atol=REWARD_ATOL)
    for name in FILES:
        assert _max_diff(_tensors(runs["one"], name), _tensors(runs["crossed"], name)) <= LORA_ATOL, name


def test_an_fsdp1_launch_is_refused_with_one_line(tmp_path):
    config = tmp_path / "fsdp1.yaml"
    config.write_text(FSDP_CONFIG.read_text().replace("fsdp_version: 2", "fsdp_version: 1"))
    setting = tiny_train_setting(tmp_path)
    done = run_cli(launch(*COMMON, "--setting", str(setting), "--out", str(tmp_path / "run"), config=config), expect=1)
    assert "recast train shards with FSDP2: set fsdp_version: 2 in the accelerate config (got 1" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("change, processes, message", [
    ({}, 1, "an FSDP launch needs at least 2 processes"),
    ({"lora_rank": 0}, 2, "trains LoRA adapters only"),
    ({"compile": True}, 2, "compile = true is not supported under FSDP"),
])
def test_what_the_fsdp_engine_does_not_run_is_refused(change, processes, message):
    check_fsdp(TrainConfig(lora_rank=2), 2, 2)
    with pytest.raises(BadInput, match=message):
        check_fsdp(TrainConfig(**{"lora_rank": 2, **change}), 2, processes)


# ------------------------------------------------------------------ the sharding helpers, in 2 gloo processes


def _sharded_worker(rank: int, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from recast_cli.train.sharding import clip_grad_norm, full_tensor, shard, shard_like

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        net = torch.nn.Module()
        net.transformer_blocks = torch.nn.ModuleList(torch.nn.Linear(4, 5) for _ in range(3))
        reference = [p.detach().clone() for p in net.parameters()]
        shard(net, torch.device("cpu"), ("transformer_blocks",))
        assert all(isinstance(b, FSDPModule) for b in net.transformer_blocks) and isinstance(net, FSDPModule)
        params = list(net.parameters())
        for p, whole in zip(params, reference):
            assert isinstance(p, DTensor) and p.to_local().shape[0] == whole.chunk(2)[rank].shape[0]
            assert torch.equal(full_tensor(p), whole)
            assert torch.equal(shard_like(whole, p).to_local(), p.to_local())
        for p in params:  # each rank's gradient: its own rows of 10·p (a global norm of 10·|θ|)
            p.grad = shard_like(10 * full_tensor(p).detach(), p)
        expected = 10 * float(torch.linalg.vector_norm(torch.cat([w.flatten() for w in reference])))
        norm = clip_grad_norm(params, 1.0)
        assert abs(norm - expected) <= 1e-5 * expected, (norm, expected)
        for p, whole in zip(params, reference):
            torch.testing.assert_close(full_tensor(p.grad), 10 * whole / expected, rtol=1e-5, atol=1e-7)
    finally:
        dist.destroy_process_group()


def test_sharding_splits_every_parameter_and_clips_by_the_global_norm():
    """``shard`` makes every block and the root FSDP units with half the rows on each process;
    ``full_tensor``/``shard_like`` invert each other; ``clip_grad_norm`` uses the norm over all shards."""
    torch.multiprocessing.spawn(_sharded_worker, args=(free_port(),), nprocs=2, join=True)
