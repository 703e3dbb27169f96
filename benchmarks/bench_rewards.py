"""Batched vs one-image-at-a-time scoring throughput of the reward scorers on CPU, same process.

Scorers: clip, pick, aesthetic and hps on the tests' tiny same-architecture models (random
weights, 32-pixel model inputs, so the numbers measure recast's batching and preprocessing
path, not a ViT-L/H), and ocr on the real bundled PP-OCRv4 models. Each scorer scores the
same N images (256 x 256 noise for the CLIP family, rendered text for OCR) once in batches
of B and once one image per call; the table prints median images/s of both and the ratio
batched / one-at-a-time (> 1: batching pays). rapidocr detects one image at a time, so its
ratio only shows the per-call overhead.

Run: .venv/bin/python benchmarks/bench_rewards.py [--n 32] [--batch 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tiny models live with the tests

from recast_cli.rewards import build_scorer  # noqa: E402
from tests.rewards import tiny_models  # noqa: E402


def noise(n: int, size: int = 256) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


def rendered(n: int) -> list[Image.Image]:
    font = ImageFont.load_default(size=32)
    images = []
    for i in range(n):
        image = Image.new("RGB", (320, 96), "white")
        ImageDraw.Draw(image).text((12, 32), f"RECAST {i}", fill="black", font=font)
        images.append(image)
    return images


def median_rate(fn, n: int, repeats: int) -> float:
    fn()  # warm-up: lazy inits, allocator
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32, help="images per measurement")
    parser.add_argument("--batch", type=int, default=16, help="batch size of the batched path")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier ratios on a shared CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        clip_dir = tiny_models.save_tiny_clip((root / "clip"))
        hps_config, hps_checkpoint = tiny_models.save_tiny_hps(root)
        head = tiny_models.save_tiny_aesthetic_head(root)
        setups = {
            "clip": ({"weights": clip_dir}, noise(args.n), ["a photo of a cat"] * args.n),
            "pick": ({"weights": clip_dir, "processor": clip_dir}, noise(args.n), ["a photo of a cat"] * args.n),
            "aesthetic": ({"weights": head, "clip": clip_dir}, noise(args.n), [""] * args.n),
            "hps": ({"weights": hps_checkpoint, "arch": str(hps_config)}, noise(args.n), ["a photo of a cat"] * args.n),
            "ocr": ({}, rendered(args.n), ['a sign "recast"'] * args.n),
        }
        table = Table(title=f"scoring throughput on CPU ({torch.get_num_threads()} threads), N = {args.n}, "
                            f"B = {args.batch}: batched vs one image per call, same process", title_justify="left")
        for column in ("scorer", "batched img/s", "one-at-a-time img/s", "batched / one-at-a-time"):
            table.add_column(column, justify="left" if column == "scorer" else "right")
        for name, (options, images, prompts) in setups.items():
            batched = build_scorer(name, **options, **({"batch_size": args.batch} if name != "ocr" else {}))
            single = build_scorer(name, **options, **({"batch_size": 1} if name != "ocr" else {}))
            fast = median_rate(lambda: batched.score(images, prompts), args.n, args.repeats)
            slow = median_rate(lambda: [single.score([im], [p]) for im, p in zip(images, prompts)], args.n,
                               args.repeats)
            table.add_row(name, f"{fast:.1f}", f"{slow:.1f}", f"{fast / slow:.2f}x")
        Console().print(table)


if __name__ == "__main__":
    main()
