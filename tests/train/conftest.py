"""A tiny trainable toy setting (random-initialised SD3-architecture model, T = 4, small batches),
and the 2-process CPU launch the distributed tests share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tiny_toy_setting

TRAIN_TABLE = """
[train]
rewards = ["toy_color", "toy_shape", "toy_sharpness"]
lambda = [1, 2, 1]
prompts = "toy"
max_steps = 4
group_size = 2
prompts_per_step = 2
micro_batch = 5
sample_batch = 3
learning_rate = 1e-3
clip_range = 0.2
beta_kl = 0.05
lora_rank = 2
lora_alpha = 4
save_every = 2
"""


def tiny_train_setting(root: Path, extra: str = "") -> Path:
    """``root/tiny.toml``: the tiny toy policy (T = 4) plus a [train] table (and ``extra`` keys in it)."""
    path = tiny_toy_setting(root, seed=0, steps=4)
    path.write_text(path.read_text() + TRAIN_TABLE + extra)
    return path


@pytest.fixture(scope="module")
def train_setting(tmp_path_factory) -> Path:
    return tiny_train_setting(tmp_path_factory.mktemp("train"))


ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FSDP_CONFIG = ROOT / "pipelines" / "accelerate" / "fsdp.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env() -> dict[str, str]:
    """CPU only (two ranks cannot share one GPU under NCCL), one thread per process."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               TOKENIZERS_PARALLELISM="false")
    env.pop("WORLD_SIZE", None)
    return env


def launch(*args: str, config: Path | None = None) -> list[str]:
    """``accelerate launch`` of 2 processes running ``recast ARGS``: torchrun + gloo (DDP), or ``config``'s engine."""
    how = ["--config_file", str(config)] if config is not None else \
        ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return [str(BIN / "accelerate"), "launch", *how, "--num_processes", "2", "--main_process_port", str(free_port()),
            "-m", "recast_cli", *args]


def run_cli(cmd: list[str], expect: int = 0, timeout: float = 240) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert done.returncode == expect, f"{' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done
