"""One GPU per job of a study's Make graph: ``make all SETTING=S JOBS=4 GPUS=0,1,2,3``.

``make -j N`` runs N recipes at once, but nothing in a recipe says which GPU it may use: every
``recast train`` would take ``cuda:0``. With ``GPUS`` set, the graph calls recast through this
wrapper::

    python -m recast_cli.study.slots --dir ROOT/.slots --gpus 0,1,2,3 -- recast train ...

which takes the first free GPU of the list (a lock file per GPU, ``ROOT/.slots/gpu-I.lock``, held with
``flock`` for as long as the command runs, so a crashed or killed job frees its GPU at once), runs the
command with ``CUDA_VISIBLE_DEVICES=I`` and exits with its exit code. A job that finds every GPU taken
waits for one. A GPU entry may name several devices for one job (``GPUS="0+1,2+3"``: two jobs of two
GPUs each, e.g. with ``[train]`` under accelerate).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WAIT_S = 0.5


def parse_gpus(text: str) -> list[str]:
    """``0,1,2`` → ["0", "1", "2"]; ``0+1,2+3`` → ["0,1", "2,3"] (a job's CUDA_VISIBLE_DEVICES each)."""
    slots = []
    for entry in text.split(","):
        devices = [d.strip() for d in entry.split("+")]
        if not entry.strip() or not all(d.isdigit() for d in devices):
            raise ValueError(f"GPUS={text!r}: a comma-separated list of GPU indices (0,1,2), '+' joining the GPUs "
                             "of one job (0+1,2+3)")
        slots.append(",".join(devices))
    if len(set(slots)) != len(slots):
        raise ValueError(f"GPUS={text!r} names a GPU twice")
    return slots


def acquire(folder: Path, slots: list[str]) -> tuple[int, str]:
    """(the locked file's descriptor, the slot's devices): the first free slot, waiting for one."""
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        for slot in slots:
            fd = os.open(folder / f"gpu-{slot.replace(',', '+')}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd, slot
        time.sleep(WAIT_S)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        split = args.index("--")
        options, command = args[:split], args[split + 1:]
        values = dict(zip(options[::2], options[1::2]))
        if len(options) % 2 or set(values) != {"--dir", "--gpus"} or not command:
            raise ValueError
        slots = parse_gpus(values["--gpus"])
    except ValueError as exc:
        message = str(exc) or "usage: python -m recast_cli.study.slots --dir DIR --gpus 0,1,... -- COMMAND ..."
        sys.stderr.write(f"recast: error: {message}\n")
        return 2
    fd, slot = acquire(Path(values["--dir"]), slots)
    child = subprocess.Popen(command, env={**os.environ, "CUDA_VISIBLE_DEVICES": slot})

    def forward(signum, _frame) -> None:
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        return child.wait()
    finally:
        os.close(fd)  # the lock goes with it


if __name__ == "__main__":
    sys.exit(main())
