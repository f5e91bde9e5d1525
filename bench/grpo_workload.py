"""The GRPO workload both frameworks run in ``bench/grpo_vs_trl.py``, and the pure arithmetic of
the comparison (FLOP limit, step statistics, choosing TRL's best configuration).

The workload (issue 16): rlflow's random ``25m`` Qwen2 preset (one HF folder both frameworks
load), ``prompts`` addition prompts x ``samples`` samples x ``new_tokens`` new tokens, rlflow's
``addition`` rule reward, one on-policy update per step (one epoch, one mini-batch), fp32.

**FLOP limit.** ``FLOPs = 2 * P * generated_tokens + 6 * P * trained_tokens`` where ``P`` counts
every parameter that takes part in a matmul: all of them except the input embedding table (a
lookup, no multiply-adds; the 25m preset's untied ``lm_head`` is counted, it is the biggest
matmul of the step). Generated tokens are the sampled response tokens; trained tokens are all
tokens of the update's forward (prompt + response, no padding). Prompt prefill and any extra
forward pass (old log-probs, a reference) get no credit, so the limit is a floor no framework
reaches. Limit time = FLOPs / (summed fp32 matmul rate of one 1-thread process per core).

Importable as ``grpo_workload`` because the benches run as ``python bench/<name>.py``.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

# the phases every contender's step is split into (seconds), in the breakdown figure's order
PHASES = ("generation", "old_log_probs", "update", "weight_sync", "other")


@dataclass(frozen=True)
class Workload:
    """What one GRPO step does; the same for both frameworks."""

    preset: str = "25m"
    prompts: int = 32
    samples: int = 8
    new_tokens: int = 64
    dtype: str = "float32"
    lr: float = 1e-6
    n_train: int = 512
    n_val: int = 8
    seed: int = 0
    device: str = "cpu"  # where both frameworks compute: cpu, or cuda (every visible GPU)

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    def describe(self) -> str:
        return (f"{self.preset} preset, {self.prompts} prompts x {self.samples} samples x {self.new_tokens} new tokens, "
                f"addition rule reward, {self.dtype} on {self.device}, AdamW lr {self.lr}, one on-policy update per step")

    def as_dict(self) -> dict:
        return asdict(self)


def prepare_inputs(workload: Workload, out: Path) -> tuple[Path, Path]:
    """Build (once) the preset's HF folder and the addition task's parquet files under ``out``."""
    from rlflow.data.tasks import build_task, write_task_files
    from rlflow.data.tasks.corpus import tokenizer_corpus
    from rlflow.models.presets import build_preset

    model = build_preset(out / f"model-{workload.preset}", tokenizer_corpus(), preset=workload.preset, seed=workload.seed)
    data = out / "data-addition"
    if not (data / "train.parquet").is_file():
        write_task_files(build_task("addition"), data, n_train=workload.n_train, n_val=workload.n_val, seed=workload.seed)
    return Path(model), data


def matmul_params(named_numels: Iterable[tuple[str, int]]) -> int:
    """Parameters that take part in a matmul: all but the input embedding table (``embed_tokens``)."""
    return sum(numel for name, numel in named_numels if "embed_tokens" not in name)


def step_flops(params: int, generated_tokens: float, trained_tokens: float) -> float:
    """``2 * params * generated + 6 * params * trained`` (no credit for extra forward passes)."""
    return 2.0 * params * generated_tokens + 6.0 * params * trained_tokens


@dataclass
class StepStats:
    """One contender's timed steps: step time and phases per step, tokens per step."""

    name: str
    steps: list[dict]  # each: {"step_s", phase..., "generated_tokens", "trained_tokens"}

    def _values(self, key: str) -> list[float]:
        return [float(step.get(key, 0.0)) for step in self.steps]

    @property
    def median_step(self) -> float:
        return statistics.median(self._values("step_s"))

    def summary(self) -> dict[str, float]:
        """min/median/max step time, the median of each phase, and tokens/s at the median step."""
        times = self._values("step_s")
        generated = statistics.median(self._values("generated_tokens"))
        trained = statistics.median(self._values("trained_tokens"))
        median = statistics.median(times)
        return {"steps": len(times), "min_s": min(times), "median_s": median, "max_s": max(times),
                **{f"{phase}_s": statistics.median(self._values(phase)) for phase in PHASES},
                "generated_tokens": generated, "trained_tokens": trained,
                "generated_tok_per_s": generated / median, "trained_tok_per_s": trained / median}

    def breakdown(self) -> dict[str, float]:
        """Median seconds per phase, for the report's figure."""
        return {phase: statistics.median(self._values(phase)) for phase in PHASES}


def with_other(step: dict) -> dict:
    """``step`` with ``other`` = step time minus the named phases (never negative)."""
    named = sum(float(step.get(phase, 0.0)) for phase in PHASES if phase != "other")
    return {**step, "other": max(0.0, float(step["step_s"]) - named)}


def best_config(trials: dict[str, float]) -> str:
    """The configuration with the smallest median step time (the first one on a tie)."""
    if not trials:
        raise ValueError("no TRL configuration finished; nothing to choose from")
    return min(trials, key=lambda name: trials[name])


def format_summary(summary: dict[str, float]) -> str:
    phases = ", ".join(f"{phase} {summary[f'{phase}_s']:.2f}" for phase in PHASES)
    return (f"step min/median/max {summary['min_s']:.2f}/{summary['median_s']:.2f}/{summary['max_s']:.2f} s "
            f"({summary['steps']} steps); phases (median s): {phases}; "
            f"{summary['generated_tok_per_s']:.0f} generated tok/s, {summary['trained_tok_per_s']:.0f} trained tok/s")
