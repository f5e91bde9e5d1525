"""Metric trackers: console, jsonl, wandb and tensorboard, chosen by ``trainer.logger``.

``Tracking(project, experiment, backends, config, output_dir)`` fans every ``log(metrics,
step)`` out to the selected trackers; call it once per step with all of that step's metrics
(verl's names: ``critic/score/mean``, ``actor/pg_loss``, ``timing_s/gen`` ...). A new backend
is a ``Tracker`` subclass under ``@TRACKER_REGISTRY.register("name")``.

| backend | writes |
|---|---|
| ``console`` | a tqdm progress bar with ETA (stderr) and compact key-metric lines (stdout), about 30 a run (``console_shows``) |
| ``jsonl`` | ``<output_dir>/metrics.jsonl``: one JSON object per step with every metric |
| ``wandb`` | a wandb run under ``<output_dir>/wandb`` (offline with ``WANDB_MODE=offline``, online otherwise) |
| ``tensorboard`` | event files under ``<output_dir>/tensorboard`` |

Resuming (the drivers log a step before they checkpoint it, so the checkpointed step is always
recorded; a resumed run replays the steps after it): every backend keeps exactly one record per
step.

* jsonl: the file drops records of steps at or after the first step logged by the resumed run.
* tensorboard: the writer of a resumed run opens with ``purge_step`` = its first step, so
  TensorBoard discards the events the interrupted run wrote for the replayed steps.
* wandb: the run id is kept in ``<output_dir>/wandb_run_id`` and a resumed run (first step
  above 1) continues that run (``resume="allow"``); a run starting at step 0 or 1 is a new one. wandb ignores steps at or below the last step it holds, so the
  tracker skips them itself (the last step it sent is kept in ``<output_dir>/wandb_last_step``):
  a replayed step keeps the values its first attempt logged, and the new steps follow.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
import sys
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from rlflow.config import ConfigError
from rlflow.errors import UserError
from rlflow.utils.durable import write_atomic
from rlflow.utils.metric_values import numeric_metrics, to_plain
from rlflow.utils.registry import Registry


@dataclass(frozen=True)
class RunInfo:
    """What every tracker is told about the run it records."""

    project: str
    experiment: str
    config: dict[str, Any]
    output_dir: Path
    total_steps: Optional[int] = None


class Tracker(ABC):
    """A metrics backend: receives each step's metrics, then ``finish()`` once."""

    def __init__(self, run: RunInfo):
        self.run = run

    @abstractmethod
    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` (already converted to plain Python values) for ``step``."""

    def finish(self) -> None:
        """Flush and close; the default has nothing to close."""


TRACKER_REGISTRY: Registry[type[Tracker]] = Registry("tracker", "trainer.logger", error=ConfigError, base=Tracker)


# ---------------------------------------------------------------------------------------- console
# (label, metric-name pattern) shown in the console line, in this order; label None: the metric's own name.
KEY_METRICS: list[tuple[Optional[str], str]] = [
    ("reward", "critic/score/mean"),
    (None, "val-core/*"),
    (None, "val/loss"),
    ("loss", "train/loss"),
    ("pg_loss", "actor/pg_loss"),
    ("vf_loss", "critic/vf_loss"),
    ("ppo_kl", "actor/ppo_kl"),
    ("kl_loss", "actor/kl_loss"),
    ("kl_reward", "critic/kl"),
    ("entropy", "actor/entropy"),
    ("grad_norm", "actor/grad_norm"),
    ("grad_norm", "train/grad_norm"),
    ("lr", "actor/lr"),
    ("lr", "train/lr"),
    ("resp_len", "response_length/mean"),
    ("tok/s", "perf/throughput"),
]
TIMING_PREFIX = "timing_s/"


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def format_step_line(metrics: dict[str, float], step: int, total_steps: Optional[int]) -> str:
    """One compact line: the step, the key metrics present, and the phase timings."""
    parts = [f"step {step}" + (f"/{total_steps}" if total_steps else "")]
    shown: set[str] = set()
    for label, pattern in KEY_METRICS:
        for key in sorted(k for k in metrics if fnmatch.fnmatchcase(k, pattern) and k not in shown):
            shown.add(key)
            parts.append(f"{label or key} {_fmt(metrics[key])}")
    timings = [f"{k[len(TIMING_PREFIX):]} {metrics[k]:.2f}s" for k in metrics if k.startswith(TIMING_PREFIX)]
    if timings:
        parts.append("time " + " ".join(timings))
    return " | ".join(parts)


CONSOLE_STEP_LINES = 30  # about this many step lines a run on the console; the other trackers get every step


def console_shows(step: int, total_steps: Optional[int], metrics: dict[str, Any]) -> bool:
    """Whether the console prints ``step``'s line: the first and the last step, a step with validation metrics
    (``val*`` keys), and every ``ceil(total_steps / CONSOLE_STEP_LINES)``-th step (every step without a total)."""
    every = math.ceil(total_steps / CONSOLE_STEP_LINES) if total_steps else 1
    return step <= 1 or step % every == 0 or step == total_steps or any(key.startswith("val") for key in metrics)


@TRACKER_REGISTRY.register("console")
class ConsoleTracker(Tracker):
    """A progress bar with ETA on stderr and a compact key-metrics line on stdout for the steps ``console_shows``."""

    def __init__(self, run: RunInfo):
        super().__init__(run)
        self.bar = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from tqdm import tqdm

        if self.bar is None:  # created at the first step so a resumed run's bar starts where it left off
            self.bar = tqdm(total=self.run.total_steps, initial=max(step - 1, 0), desc=self.run.experiment, unit="step",
                            file=sys.stderr, dynamic_ncols=True)
        self.bar.update(step - self.bar.n)
        if console_shows(step, self.run.total_steps, metrics):
            tqdm.write(format_step_line(numeric_metrics(metrics), step, self.run.total_steps), file=sys.stdout)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------------------- jsonl
JSONL_NAME = "metrics.jsonl"


@TRACKER_REGISTRY.register("jsonl")
class JsonlTracker(Tracker):
    """Appends ``{"step": N, ...every metric}`` per step to ``<output_dir>/metrics.jsonl`` (resume-safe).

    Logging the same step twice merges into that step's line. Non-finite numbers are written
    as JSON's ``NaN``/``Infinity`` extensions (Python's json and pandas read them back).
    """

    def __init__(self, run: RunInfo):
        super().__init__(run)
        self.path = run.output_dir / JSONL_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._last: Optional[tuple[int, dict[str, Any], int]] = None  # (step, record, file offset of its line)
        self._checked_resume = False

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self._checked_resume:
            self._drop_records_from(step)
            self._checked_resume = True
        if self._last is not None and self._last[0] == step:
            record, offset = {**self._last[1], **metrics}, self._last[2]
        else:
            record, offset = {"step": step, **metrics}, self.path.stat().st_size if self.path.exists() else 0
        with open(self.path, "r+b" if self.path.exists() else "wb") as f:
            f.truncate(offset)
            f.seek(offset)
            f.write((json.dumps(record, default=str) + "\n").encode())
        self._last = (step, record, offset)

    def _drop_records_from(self, step: int) -> None:
        """Keep only complete records of earlier steps (a resumed run re-logs the steps after its checkpoint)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] < step:
                kept.append(line + "\n")
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.path)


# ---------------------------------------------------------------------------------------- wandb
@TRACKER_REGISTRY.register("wandb")
class WandbTracker(Tracker):
    """A wandb run under ``<output_dir>/wandb``; ``WANDB_MODE=offline`` keeps it local (``wandb sync`` uploads it).

    The run starts at the first logged step: a run that starts at step 0 or 1 (not resumed)
    gets a new run id; a later first step (a resumed run) continues the run whose id is in
    ``wandb_run_id`` and skips the steps it already holds (``wandb_last_step``).
    """

    RUN_ID_FILE = "wandb_run_id"
    LAST_STEP_FILE = "wandb_last_step"

    def __init__(self, run: RunInfo):
        super().__init__(run)
        try:
            import wandb
        except ImportError as error:
            raise UserError("trainer.logger has 'wandb' but wandb is not installed: pip install wandb") from error
        self.wandb = wandb
        self.wandb_run = None
        self.id_file = run.output_dir / self.RUN_ID_FILE
        self.last_step_file = run.output_dir / self.LAST_STEP_FILE
        self.last_step = -1

    def _start(self, first_step: int) -> None:
        run = self.run
        run.output_dir.mkdir(parents=True, exist_ok=True)
        resumed = first_step > 1 and self.id_file.exists()
        run_id = self.id_file.read_text().strip() if resumed else uuid.uuid4().hex[:12]
        if resumed and self.last_step_file.exists():
            self.last_step = int(self.last_step_file.read_text().strip() or -1)
        write_atomic(self.id_file, run_id + "\n")
        self.wandb_run = self.wandb.init(  # quiet: where the run is, not its 60-line history and summary at the end
            project=run.project, name=run.experiment, config=run.config, dir=str(run.output_dir), id=run_id,
            resume="allow", settings=self.wandb.Settings(quiet=True),
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.wandb_run is None:
            self._start(step)
        if step <= self.last_step:  # already in the run (logged before an interruption); wandb would drop it
            return
        self.wandb_run.log(numeric_metrics(metrics), step=step)
        self.last_step = step
        write_atomic(self.last_step_file, f"{step}\n")

    def finish(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()


# ---------------------------------------------------------------------------------------- tensorboard
@TRACKER_REGISTRY.register("tensorboard")
class TensorboardTracker(Tracker):
    """Scalars in tensorboard event files under ``<output_dir>/tensorboard``.

    The writer opens at the first logged step with ``purge_step`` set to it, so events a
    previous (interrupted) run wrote for that step and later ones are discarded by readers.
    """

    def __init__(self, run: RunInfo):
        super().__init__(run)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise UserError("trainer.logger has 'tensorboard' but tensorboard is not installed: pip install tensorboard") from error
        self.writer_class = SummaryWriter
        self.writer = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.writer is None:
            self.writer = self.writer_class(log_dir=str(self.run.output_dir / "tensorboard"), purge_step=step)
            self.writer.add_text("config", "```\n" + json.dumps(self.run.config, indent=2, default=str) + "\n```", step)
        for key, value in numeric_metrics(metrics).items():
            if math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()


# ---------------------------------------------------------------------------------------- fan-out
def plain_config(config: Any) -> dict[str, Any]:
    """A config (OmegaConf node, dataclass, dict or None) as a plain, resolved dict."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:
        pass
    return dict(config)


class Tracking:
    """Sends each step's metrics to every tracker named in ``backends`` (``trainer.logger``)."""

    def __init__(
        self,
        project: str,
        experiment: str,
        backends: Iterable[str],
        config: Any = None,
        output_dir: str | Path = ".",
        total_steps: Optional[int] = None,
    ):
        tracker_classes = {name: TRACKER_REGISTRY.get(name) for name in backends}  # all names checked before any starts
        run = RunInfo(project, experiment, plain_config(config), Path(output_dir), total_steps)
        self.trackers: dict[str, Tracker] = {name: cls(run) for name, cls in tracker_classes.items()}

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record one step's metrics in every tracker."""
        plain = {key: to_plain(value) for key, value in metrics.items()}
        for tracker in self.trackers.values():
            tracker.log(plain, step)

    def finish(self) -> None:
        """Close every tracker (flushes files, ends the wandb run, closes the progress bar)."""
        for tracker in self.trackers.values():
            tracker.finish()

    def __enter__(self) -> "Tracking":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.finish()
