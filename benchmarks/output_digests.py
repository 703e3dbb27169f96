"""The sha256 of every file a fixed chain of recast commands writes: a refactor that changes no
behaviour leaves this manifest unchanged, byte for byte.

    python -m benchmarks.output_digests > before.txt          # on the old code
    python -m benchmarks.output_digests --compare before.txt  # on the new code: exit 1 on any difference

The chain covers every stage on the worlds that run here: the toy world (renderer positives,
sampled gains, W, Fig. 1, D curves, two training runs, an evaluation, `inspect --json` of every
artifact kind) and the analytic worlds (the exact gmm1d table, W on it, and a whole flow1d study
through `study-makefile` + make: exact and sampled gains, W per mode, runs, curve evaluations,
the report; the same study through `recast study`; the shipped twoscale studies' Make graphs).
``SOURCE_DATE_EPOCH`` pins ``created_at``; files that hold wall-clock times by nature (TensorBoard
event files, run logs) are listed by name only, and a cell's engine seconds are masked.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Files whose bytes hold wall-clock times (named in the manifest, not hashed).
TIMED = ("events.out.tfevents",)

FLOW1D = """
[policy]
kind = "flow1d"
steps = 6
noise_level = 0.7

[train]
rewards = ["coarse", "fine"]
lambda = [1, 1]
prompts = "prompts.txt"
train_fraction = 1.0
lora_rank = 0
max_steps = 4
group_size = 4
prompts_per_step = 4
micro_batch = 96
sample_batch = 16
learning_rate = 3e-3
beta_kl = 0.01
save_every = 2
keep_checkpoints = 2

[evaluate]
n = 256
seed = 10000
batch_size = 256
judges = []

[study]
budgets = [[1, 2]]
seeds = [1]
modes = ["static", "recast", "nosink", "reversed"]
gains = "exact"
estimate_steps = 6
n = 16
k = 1
p = 1
"""


def chain(work: Path) -> list[list[str]]:
    """The commands, in order (argv after ``recast``); ``>NAME`` as the last item captures stdout."""
    toy, example = "toy", str(ROOT / "pipelines/examples/gmm1d-exact-alpha2.parquet")
    w = str(work / "W.safetensors")
    return [
        ["sample-positive", "--setting", toy, "--source", "renderer", "--n", "4", "--out", str(work / "positives")],
        ["estimate", "--policy", toy, "--rewards", "toy_color,toy_shape,toy_sharpness", "--positives",
         str(work / "positives"), "--steps", "6", "--n", "2", "--k", "2", "--p", "4", "--out", str(work / "gains.parquet")],
        ["solve-w", "--gains", str(work / "gains.parquet"), "--lambda", "1,1,1", "--skip-clean", "1", "--steps", "10", "--grid", "flowmatch", "--shift", "3", "--out", w],
        ["inspect", w, "--plot", str(work / "fig1.png"), ">inspect-W.txt"],
        ["plot", "--gains", str(work / "gains.parquet"), "--d-curves", "--out", str(work / "D.png")],
        ["train", "--setting", toy, "--weights", w, "--out", str(work / "run"), "--max-steps", "2", "--save-every", "1",
         "--device", "cpu", "--quiet"],
        ["train", "--setting", toy, "--weights", "static", "--out", str(work / "run-static"), "--max-steps", "1",
         "--device", "cpu", "--quiet"],
        ["evaluate", "--run", str(work / "run"), "--n", "1", "--out", str(work / "E.parquet"), "--device", "cpu", "--quiet"],
        ["solve-w", "--gains", example, "--lambda", "1,2,1", "--steps", "10", "--out", str(work / "gmm1d-W.safetensors")],
        ["estimate", "--policy", "gmm1d", "--exact", "--rewards", "coarse,fine", "--steps", "6",
         "--out", str(work / "exact.parquet")],
        *[["inspect", str(work / name), *flag, f">inspect-{name}{ext}"] for name in
          ("gains.parquet", "gains.scores.parquet", "W.safetensors", "positives", "run", "E.parquet",
           "gmm1d-W.safetensors", "exact.parquet", "run/metrics.parquet", "run/checkpoints/step-000002")
          for flag, ext in ((["--json"], ".json"), ([], ".txt"))],
    ]


def run_chain(work: Path, env: dict[str, str]) -> None:
    recast = [sys.executable, "-m", "recast_cli"]
    for argv in chain(work):
        capture = argv[-1][1:] if argv[-1].startswith(">") else None
        args = argv[:-1] if capture else argv
        done = subprocess.run([*recast, *args], cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"recast {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        if capture:
            (work / capture.replace("/", "-")).write_text(done.stdout.replace(str(work), "WORK"))
    study = work / "study"
    study.mkdir()
    (study / "prompts.txt").write_text("x\n")
    (study / "flow1d.toml").write_text(FLOW1D)
    mk = subprocess.run([*recast, "study-makefile", "--setting", str(study / "flow1d.toml"), "--root", str(study / "a"),
                         "--recast", str(Path(sys.executable).parent / "recast")], cwd=ROOT, env=env, capture_output=True,
                        text=True, check=True).stdout
    (work / "study.mk").write_text(mk.replace(str(work), "WORK"))
    (study / "study.mk").write_text(mk)
    subprocess.run(["make", "-s", "-f", str(study / "study.mk"), "all"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    # the same [study] through the batched engine (`recast study`): its gains, W, cells and report
    subprocess.run([*recast, "study", str(study / "flow1d.toml"), "--out", str(work / "batched"), "--quiet"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    # the shipped two-timescale study's Make graph, as text
    for name in ("twoscale", "twoscale-control"):
        mk = subprocess.run([*recast, "study-makefile", "--setting", name, "--root", "ROOT", "--recast", "recast"],
                            cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
        (work / f"{name}.mk").write_text(mk.replace(str(ROOT), "REPO"))


SHA256 = re.compile(rb"[0-9a-f]{64}")
#: An evaluation's run id hashes the adapter file's sha256, whose safetensors header is ordered by
#: a hash map (arbitrary per process): masked like the digests themselves.
RUN_ID = re.compile(rb"(run_id\W{1,8})[0-9a-f]{16}")
#: A study cell records the seconds its engine ran (``engine.wall_s``), JSON inside JSON: masked.
WALL = re.compile(rb'(wall_s\\*"\s*:\s*)[-0-9.eE+]+')


def canonical(path: Path, work: Path) -> bytes:
    """The bytes that must not change: the work folder's path masked, every sha256 masked (a source's
    digest follows the bytes of its file, which has its own line), a safetensors header with its
    metadata keys sorted (the safetensors writer orders them by a hash map: arbitrary per run)."""
    if path.name == "state.safetensors":
        return canonical_state(path)
    data = path.read_bytes()
    if path.suffix == ".md":  # a report names each input by a sha256 prefix: masked like the digests
        data = re.sub(rb"\| [0-9a-f]{12} \|", b"| " + b"x" * 12 + b" |", data)
    if path.suffix == ".parquet" and path.parent.name not in ("positives",):
        data = canonical_table(path)
    if path.suffix == ".safetensors":
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
        data = json.dumps(header, sort_keys=True).encode() + data[8 + size:]
    data = SHA256.sub(b"x" * 64, data.replace(str(work).encode(), b"WORK"))
    data = re.sub(rb"sha256:[0-9a-f]{12}", b"sha256:" + b"x" * 12, data)  # inspect's short digests
    return WALL.sub(rb"\1x", RUN_ID.sub(rb"\1" + b"x" * 16, data))


def canonical_state(path: Path) -> bytes:
    """A checkpoint's state tensors but torch's global CPU generator (``rng/*``): the trainer draws
    from its own seeded generators, and the global one starts from the clock in every process."""
    from safetensors.numpy import load_file

    state = load_file(str(path))
    return b"".join(name.encode() + state[name].tobytes() for name in sorted(state) if not name.startswith("rng/"))


def canonical_table(path: Path) -> bytes:
    """A Parquet table as JSON: its key-value metadata (sorted) and every value, the columns of
    seconds a phase took (``*_s``, wall-clock) left out."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items() if k != b"ARROW:schema"}
    rows = table.drop_columns([c for c in table.column_names if c.endswith("_s")]).to_pylist()
    return json.dumps({"metadata": meta, "rows": rows}, sort_keys=True, default=repr).encode()


def manifest(work: Path) -> list[str]:
    lines = []
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        name = str(path.relative_to(work))
        if path.name.startswith(".") and path.name.endswith((".lock", ".tmp")):
            continue
        if any(t in path.name for t in TIMED):
            lines.append(f"{'(wall-clock times)':64}  {path.parent.relative_to(work)}/{TIMED[0]}")
            continue
        lines.append(f"{hashlib.sha256(canonical(path, work)).hexdigest()}  {name}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", type=Path, help="a manifest from before: print the differences, exit 1 if any")
    parser.add_argument("--of", type=Path, help="print the manifest of a folder kept earlier, running nothing")
    parser.add_argument("--keep", type=Path, help="run in this (new) folder and keep it")
    args = parser.parse_args()
    env = {**os.environ, "SOURCE_DATE_EPOCH": "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    work = args.of or args.keep or Path(tempfile.gettempdir()) / "recast-output-digests"
    if args.of is None:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)  # one fixed path: paths inside artifacts stay the same
        work.mkdir(parents=True)
        run_chain(work, env)
    lines = manifest(work)
    if args.compare is None:
        print("\n".join(lines))
        return 0
    before = args.compare.read_text().splitlines()
    gone, new = sorted(set(before) - set(lines)), sorted(set(lines) - set(before))
    for line in gone:
        print(f"- {line}")
    for line in new:
        print(f"+ {line}")
    print(f"{len(lines)} files; {'identical' if not gone and not new else f'{len(gone) + len(new)} lines differ'}")
    return 1 if gone or new else 0


if __name__ == "__main__":
    raise SystemExit(main())
