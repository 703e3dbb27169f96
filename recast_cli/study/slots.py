"""One GPU per job of a study's Make graph: ``make all SETTING=S JOBS=4 GPUS=0,1,2,3``.

``make -j N`` runs N recipes at once, but nothing in a recipe says which GPU it may use: every
``recast train`` would take ``cuda:0``. With ``GPUS`` set, the graph calls recast through this
wrapper::

    python -m recast_cli.study.slots --dir ROOT/.slots --gpus 0,1,2,3 -- recast train ...

which takes the first free GPU of the list (a lock file per GPU, ``ROOT/.slots/gpu-I.lock``, held with
``flock`` for as long as the command runs, so a crashed or killed job frees its GPU at once), runs the
command with ``CUDA_VISIBLE_DEVICES=I`` and exits with its exit code. A job that finds every GPU taken
waits for one. The command runs in a process group of its own and holds the lock's descriptor too: a
stop signal to the wrapper (SIGINT, SIGTERM, SIGHUP) reaches the command's group, which has ``GRACE_S``
before SIGKILL; a wrapper killed outright leaves its command the lock (and the command is sent SIGTERM).
A command killed by signal N exits 128 + N, as the shell reports it. A GPU entry may name several
devices for one job (``GPUS="0+1,2+3"``: two jobs of two GPUs each, e.g. with ``[train]`` under
accelerate).
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import time
from pathlib import Path

from recast_cli import processes
from recast_cli.artifacts.regular import open_regular
from recast_cli.errors import BadInput

WAIT_S = 0.5
#: Seconds the command has, once the wrapper is stopped, before SIGKILL: a training run writing its
#: checkpoint needs longer than a server.
GRACE_S = 120.0
_GPU_INDEX = re.compile(r"[0-9]{1,4}")


def parse_gpus(text: str) -> list[str]:
    """``0,1,2`` → ["0", "1", "2"]; ``0+1,2+3`` → ["0,1", "2,3"] (a job's CUDA_VISIBLE_DEVICES each). Indices
    are ASCII digits (``str.isdigit`` also takes ``¹`` and ``٣``, which CUDA does not)."""
    slots = []
    for entry in text.split(","):
        devices = [d.strip() for d in entry.split("+")]
        if not entry.strip() or not all(_GPU_INDEX.fullmatch(d) for d in devices):
            raise ValueError(f"GPUS={text[:200]!r}: a comma-separated list of GPU indices (0,1,2), '+' joining the "
                             "GPUs of one job (0+1,2+3)")
        slots.append(",".join(devices))
    if len(set(slots)) != len(slots):
        raise ValueError(f"GPUS={text[:200]!r} names a GPU twice")
    return slots


def acquire(folder: Path, slots: list[str]) -> tuple[int, str]:
    """(the locked file's descriptor, the slot's devices): the first free slot, waiting for one. A lock is a
    regular file of its own in ``folder`` (a symbolic link, FIFO or folder there is BadInput)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise BadInput(f"--dir {folder}: not a folder") from None
    except OSError as exc:
        raise BadInput(f"--dir {folder}: cannot create it ({exc.strerror or exc})") from None
    while True:
        for slot in slots:
            fd = open_regular(folder / f"gpu-{slot.replace(',', '+')}.lock", "the GPU lock file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd, slot
        time.sleep(WAIT_S)


def main(argv: list[str] | None = None) -> int:
    """Parse, take a GPU, run the command on it; its exit code (128 + N when signal N ended it or the
    wrapper). Bad input is one line on stderr and exit 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        split = args.index("--") if "--" in args else len(args)
        options, command = args[:split], args[split + 1:]
        values = dict(zip(options[::2], options[1::2]))
        if len(options) % 2 or set(values) != {"--dir", "--gpus"} or not command:
            raise BadInput("usage: python -m recast_cli.study.slots --dir DIR --gpus 0,1,... -- COMMAND ...")
        try:
            slots = parse_gpus(values["--gpus"])
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        with processes.raising_on_stop():
            return _run_on_slot(Path(values["--dir"]), slots, command)
    except BadInput as exc:
        sys.stderr.write(f"recast: error: {' '.join(str(exc).split())}\n")
        return 2
    except (KeyboardInterrupt, processes.Stopped) as exc:
        return 128 + processes.signal_of(exc)


def _run_on_slot(folder: Path, slots: list[str], command: list[str]) -> int:
    """``command`` on the first free slot. The command holds the lock too (its descriptor is passed on): a
    wrapper killed with SIGKILL cannot free the GPU while its command still runs on it."""
    fd, slot = acquire(folder, slots)
    try:
        try:
            return processes.run(command, grace=GRACE_S, env={**os.environ, "CUDA_VISIBLE_DEVICES": slot},
                                 pass_fds=(fd,))
        except FileNotFoundError:
            raise BadInput(f"{command[0][:200]}: no such command") from None
        except PermissionError:
            raise BadInput(f"{command[0][:200]}: not an executable") from None
    finally:
        os.close(fd)  # the lock goes with the last descriptor: this one, and the command's


if __name__ == "__main__":
    sys.exit(main())
