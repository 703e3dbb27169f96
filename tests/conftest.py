"""Shared fixtures: the shipped exact gmm1d example and small synthetic gain tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import pytest

from recast_cli.artifacts import GainTable, write_gains
from recast_cli.grid import GridSpec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "pipelines" / "examples" / "gmm1d-exact-alpha2.parquet"


@pytest.fixture(autouse=True, scope="session")
def empty_hub_cache(tmp_path_factory):
    """No test reads the machine's own Hugging Face cache (a GPU node's, after ``recast fetch``): this
    process's cache and its children's is an empty folder, unless a test points it elsewhere."""
    from tests.hubcache import using_cache

    with using_cache(tmp_path_factory.mktemp("hf-cache"), offline=False) as cache:
        yield cache


def bump_gains(peaks: list[float], widths: list[float], steps: int) -> np.ndarray:
    """Gaussian bumps over t = 1..T: one informative window per reward."""
    t = np.arange(1, steps + 1)
    return np.array([np.exp(-0.5 * ((t - p) / w) ** 2) for p, w in zip(peaks, widths)])


def make_table(gain: np.ndarray, rewards: tuple[str, ...] | None = None, grid: GridSpec | None = GridSpec("linear"),
               with_intervals: bool = False) -> GainTable:
    """A valid recast.gains/2 table whose D telescopes from ``gain`` (D_T = 0)."""
    m, steps = gain.shape
    rewards = rewards or tuple(f"r{i}" for i in range(m))
    D = np.concatenate([np.cumsum(gain[:, ::-1], axis=1)[:, ::-1], np.zeros((m, 1))], axis=1)
    sigmas = (grid or GridSpec("linear")).sigmas(steps)
    meta = {
        "alpha": 2.0, "beta": 1.0, "N": 8, "K": 2, "P": 4, "sampling": "pplus", "crn": True,
        "monotone": "isotonic", "reward_std": {r: 1.0 for r in rewards},
        "policy": {"name": "synthetic"}, "positives": {"source": "synthetic"},
    }
    if grid is not None:
        meta["grid"] = grid.to_json()
    intervals = {}
    if with_intervals:
        intervals = {"D_lo": D * 0.9, "D_hi": D * 1.1, "gain_lo": gain * 0.8, "gain_hi": gain * 1.2}
    return GainTable(rewards=rewards, sigmas=sigmas, D=D, gain_raw=gain.copy(), gain=gain, meta=meta, **intervals)


def tiny_toy_setting(root: Path, seed: int, steps: int) -> Path:
    """A setting TOML over a randomly initialised tiny SD3-architecture toy model saved under ``root``."""
    from recast_cli.toy.model import build_pipeline, save_pipeline
    from recast_cli.toy.pretrain import toy_words

    save_pipeline(build_pipeline(toy_words(), seed=seed), root / "model")
    path = root / "tiny.toml"
    path.write_text(f'[policy]\nkind = "sd3"\npath = "model"\nsteps = {steps}\nguidance_scale = 2.0\n'
                    'resolution = 32\nmax_sequence_length = 1\nprecision = "no"\nprompt_check = "toy"\n')
    return path


@pytest.fixture
def example_path() -> Path:
    return EXAMPLE


@pytest.fixture
def gains_path(tmp_path: Path) -> Path:
    """Four rewards with windows at different steps of a 25-step grid, written through the real writer."""
    gain = 0.05 * bump_gains([20, 12, 5, 2], [4, 3, 2, 1], 25)
    path = tmp_path / "gains.parquet"
    write_gains(path, make_table(gain, ("clip", "hps", "pick", "ocr")), config={"test": True})
    return path


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``).

    The tiny models are all call overhead; spinning threads on a shared 2-core machine make
    them ~10x slower. Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
