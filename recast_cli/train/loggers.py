"""Where a training run's scalars and pictures go besides ``metrics.parquet``: the ``[train] logger`` list.

Every logger is one small class behind the :class:`Logger` protocol (scalars, an image with its caption,
a histogram, close): ``tensorboard`` (``RUN/tensorboard``, torch's ``SummaryWriter``) and ``wandb``
(Weights & Biases, the optional extra ``recast[wandb]``). :class:`RunLoggers` fans each call out to the
loggers that work: one that fails to start (not installed, ``wandb.init`` raising) or to log is one
warning line on stderr and is dropped; the run, and ``metrics.parquet``, go on without it.

Credentials are the loggers' own business: W&B reads ``WANDB_API_KEY`` (or its login file) from the
environment; recast never reads, logs or records it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from recast_cli.errors import cut

#: The logger names ``[train] logger`` may list, in the order they start.
LOGGERS = ("tensorboard", "wandb")


class Logger(Protocol):
    """One destination of a run's logs; ``step`` is the training step (0: before the first)."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...

    def image(self, step: int, key: str, image: np.ndarray, caption: str) -> None:
        """``image``: RGB [H, W, 3] uint8."""

    def histogram(self, step: int, key: str, values: np.ndarray) -> None: ...

    def close(self) -> None: ...


class TensorBoardLogger:
    """Event files under ``RUN/tensorboard``; a caption becomes a text summary beside its image."""

    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def image(self, step: int, key: str, image: np.ndarray, caption: str) -> None:
        self.writer.add_image(key, image, step, dataformats="HWC")
        self.writer.add_text(key, caption, step)
        self.writer.flush()

    def histogram(self, step: int, key: str, values: np.ndarray) -> None:
        self.writer.add_histogram(key, values, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A W&B run named after the run folder, in ``project``; its local files go under ``WANDB_DIR`` when
    that is set, else under ``RUN/wandb``. The W&B run id is fixed by the run folder (its path and its
    ``run.json``), so a resumed run goes on logging into the same W&B run."""

    def __init__(self, run: Path, project: str, config: Mapping[str, Any]):
        import wandb

        self.wandb = wandb
        labels = wandb_labels(run, config)
        self.run = wandb.init(project=project, name=labels["name"], group=labels["group"], tags=labels["tags"],
                              id=wandb_run_id(run), resume="allow",
                              dir=None if os.environ.get("WANDB_DIR") else str(run), config=dict(config),
                              # the progress bar redraws itself on stderr: not worth a copy in the W&B run
                              settings=wandb.Settings(console="off"))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def image(self, step: int, key: str, image: np.ndarray, caption: str) -> None:
        self.run.log({key: self.wandb.Image(image, caption=caption)}, step=step)

    def histogram(self, step: int, key: str, values: np.ndarray) -> None:
        self.run.log({key: self.wandb.Histogram(values)}, step=step)

    def close(self) -> None:
        self.run.finish()


def wandb_labels(run: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """The W&B run's name, group and tags. A study's run folder ``STUDY/runs/BUDGET/MODE-sSEED`` (``make
    all``) is grouped by study and budget (``STUDY/BUDGET``) and named ``BUDGET/MODE-sSEED``, so the
    seeds of one budget sit together; any run is tagged with its mode, its seed and its setting's name."""
    train = config.get("train") if isinstance(config.get("train"), Mapping) else {}
    setting = Path(str(config.get("setting", ""))).stem
    tags = [str(t) for t in (config.get("mode"), f"seed{train.get('seed')}" if "seed" in train else None,
                             setting or None) if t]
    parts = run.resolve().parts
    if len(parts) >= 4 and parts[-3] == "runs":
        study, budget = parts[-4], parts[-2]
        return {"name": f"{budget}/{run.name}", "group": f"{study}/{budget}", "tags": tags}
    return {"name": run.name, "group": None, "tags": tags}


def wandb_run_id(run: Path) -> str:
    """The W&B run id of a run folder: the same for every start of one run (``--resume``), another for a
    run restarted or started anew in the same folder (its ``run.json`` is rewritten)."""
    record = (run / "run.json").read_bytes() if (run / "run.json").is_file() else b""
    return hashlib.sha256(str(run.resolve()).encode() + b"\0" + record).hexdigest()[:16]


class RunLoggers:
    """The loggers of one run; each call goes to every logger still working (see the module docstring)."""

    def __init__(self, loggers: Mapping[str, Logger] | None = None):
        self.loggers: dict[str, Logger] = dict(loggers or {})

    def __bool__(self) -> bool:
        return bool(self.loggers)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._each("log", lambda lg: lg.scalars(step, values))

    def image(self, step: int, key: str, image: np.ndarray, caption: str) -> None:
        self._each("log", lambda lg: lg.image(step, key, image, caption))

    def histogram(self, step: int, key: str, values: np.ndarray) -> None:
        self._each("log", lambda lg: lg.histogram(step, key, values))

    def close(self) -> None:
        self._each("close", lambda lg: lg.close())
        self.loggers.clear()

    def drawn(self, what: str, log: Callable[[], None]) -> None:
        """Run ``log``, which draws a picture and logs it: a picture that cannot be drawn (a decoder out of
        memory, a plotting failure) is one warning line, never a lost step."""
        try:
            log()
        except Exception as exc:
            warn(f"{what} could not be drawn for the loggers ({describe(exc)}); training goes on")

    def _each(self, what: str, call: Callable[[Logger], None]) -> None:
        for name, logger in list(self.loggers.items()):
            try:
                call(logger)
            except Exception as exc:  # a logger's failure is never the run's
                del self.loggers[name]
                warn(f"logger {name} failed to {what} ({describe(exc)}); training goes on without it")


def start_loggers(names: Sequence[str], run: Path, project: str, config: Mapping[str, Any]) -> RunLoggers:
    """Start the named loggers (each of :data:`LOGGERS`) for the run folder ``run``."""
    makers: dict[str, Callable[[], Logger]] = {
        "tensorboard": lambda: TensorBoardLogger(run / "tensorboard"),
        "wandb": lambda: WandbLogger(run, project, config),
    }
    started: dict[str, Logger] = {}
    for name in names:
        try:
            started[name] = makers[name]()
        except Exception as exc:  # not installed, no credentials, no network: the run trains without it
            warn(f"logger {name} did not start ({describe(exc)}); training goes on without it")
    return RunLoggers(started)


def describe(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message, cut."""
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    return cut(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)


def warn(message: str) -> None:
    sys.stderr.write(f"recast: warning: {message}\n")
    sys.stderr.flush()
