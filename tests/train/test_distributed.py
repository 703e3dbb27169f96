"""`accelerate launch` with 2 processes trains exactly what 1 process trains at the same global batch.

Two CPU processes (torchrun under accelerate, gloo): the groups of a step are split over the
processes, gradients are all-reduced by DDP, metrics are gathered/reduced, rank 0 writes.
(FSDP, the other engine: tests/train/test_fsdp.py.)

How the 2-process run is launched on a CPU-only machine matters: ``accelerate launch --cpu
--num_processes 2`` goes through accelerate's *simple* launcher, which starts ONE process
(multi-process CPU there means mpirun with ``--mpirun_hostfile``); the run then silently
trains with 1 process. ``--multi_gpu`` goes through torchrun and, with no visible GPU,
accelerate picks MULTI_CPU over gloo. ``CUDA_VISIBLE_DEVICES=""`` keeps it on the CPU on a
GPU machine too (two ranks cannot share one GPU under NCCL).

A launch that accelerate does not make distributed (no ``--device cpu`` on a machine without
a GPU: every process would train alone into the same run folder) is refused: each process exits
2 with one line, the launcher then exits 1.

Measured (tiny setting, 2 steps, lr 1e-3, sample_batch = G = 2, 62 LoRA tensors, |lora_B| ≤ 2e-3
after 2 steps): step-1 rewards bit-identical (prompts are encoded one at a time, so the text
embeddings do not depend on which prompts share a process); step-2 reward means |Δ| ≤ 2.4e-7
(micro-batches split differently: roundoff in the update), loss |Δ| ≤ 1e-8 (values ~1e-6; at
step 1 the advantages cancel to 0 on one process and to ~1e-8 as a mean of two partial sums),
KL |Δ| ≤ 1.1e-10 (values ~2e-5), grad norms equal, final LoRA tensors max |Δ| ≈ 8.5e-7 (Adam's
normalised step turns summation-order differences of ~1e-5-sized gradients into update
differences). The tolerances below are 4-10× the measurements.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from recast_cli.train.metrics import read_metrics
from tests.train.conftest import launch, run_cli, tiny_train_setting

STEPS = 2
# sample_batch = G: both runs sample the same 2-image batches, so step 1 is bit-identical
COMMON = ["train", "--weights", "static", "--max-steps", str(STEPS), "--quiet", "--device", "cpu",
          "--set", "save_every=2", "--set", "sample_batch=2"]
LORA_ATOL = 1e-5  # measured 8.5e-7
LOSS_ATOL = 1e-7  # measured 1e-8 (loss values ~1e-6)
REWARD_ATOL = 1e-6  # step 2 only (step 1 is compared exactly); measured 2.4e-7
GRAD_RTOL = 1e-6  # measured 0 (equal)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    setting = tiny_train_setting(root)
    args = [*COMMON, "--setting", str(setting)]
    one, two = root / "one", root / "two"
    run_cli([sys.executable, "-m", "recast_cli", *args, "--out", str(one)])
    run_cli(launch(*args, "--out", str(two)))
    return one, two, setting


def _metrics(run: Path):
    return read_metrics(run / "metrics.parquet").to_pandas().sort_values(["step", "reward"]).reset_index(drop=True)


def _adapter(run: Path) -> dict:
    return load_file(str(run / "checkpoints" / f"step-{STEPS:06d}" / "adapter" / "pytorch_lora_weights.safetensors"))


def test_two_processes_really_ran(runs):
    one, two, _ = runs
    for run, n, kind in ((one, 1, "single"), (two, 2, "ddp")):
        state = json.loads((run / "checkpoints" / f"step-{STEPS:06d}" / "state.json").read_text())
        assert state["processes"] == n and state["engine"] == kind
        config = json.loads((run / "run.json").read_text())["config"]
        assert config["processes"] == n and config["engine"] == kind
    # rank 0 alone writes: one checkpoint, no temporary folders left behind, one metrics row per (step, reward)
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == [f"step-{STEPS:06d}"]
    assert len(_metrics(two)) == STEPS * 3


def test_metrics_match_a_single_process_run(runs):
    a, b = (_metrics(r) for r in runs[:2])
    assert list(a["step"]) == list(b["step"]) and list(a["reward"]) == list(b["reward"])
    assert (a["images"] == b["images"]).all() and (a["images"] == 4).all()  # the global batch: 2 groups × G = 2
    first = a["step"] == 1
    # step 1 samples with the initial LoRA (B = 0): the images do not depend on the process count
    np.testing.assert_array_equal(a.loc[first, "reward_mean"], b.loc[first, "reward_mean"])
    np.testing.assert_array_equal(a.loc[first, "reward_std"], b.loc[first, "reward_std"])
    np.testing.assert_allclose(a["reward_mean"], b["reward_mean"], rtol=0, atol=REWARD_ATOL)
    np.testing.assert_allclose(a["aggregate"], b["aggregate"], rtol=0, atol=4 * REWARD_ATOL)
    for col in ("loss", "policy_loss", "kl", "clip_frac"):
        np.testing.assert_allclose(a[col], b[col], rtol=0, atol=LOSS_ATOL, err_msg=col)
    assert (a["kl"][~first] > 0).all()  # the KL term is live at step 2, so the comparison means something
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=GRAD_RTOL)


def test_final_lora_matches_a_single_process_run(runs):
    a, b = (_adapter(r) for r in runs[:2])
    assert set(a) == set(b) and all(k.startswith("transformer.") for k in a)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float(a[k].abs().max()) for k in a if ".lora_B." in k)
    assert moved > 100 * LORA_ATOL  # the adapter moved away from B = 0 far more than the tolerance
    assert diff <= LORA_ATOL, f"max |LoRA(1 process) - LoRA(2 processes)| = {diff:.3g}"


def test_a_launch_accelerate_does_not_distribute_is_refused(runs, tmp_path):
    setting = runs[2]
    args = [a for a in COMMON if a not in ("--device", "cpu")]
    done = run_cli(launch(*args, "--setting", str(setting), "--out", str(tmp_path / "run")), expect=1)
    assert "launched as 2 processes, but accelerate runs this one alone" in done.stderr
    assert not (tmp_path / "run").exists()
