"""One timed run of each framework for ``bench/grpo_vs_trl.py``, parsed into per-step records
(``{"step_s", phase..., "generated_tokens", "trained_tokens"}``) plus the peak RSS per process,
and the two checks that both frameworks see the same task (prompt token ids, reward rule).

* rlflow: ``python -m rlflow.trainer.main_ppo`` with Hydra overrides. The workload's overrides
  (model, data, batch sizes, dtype, learning rate, ``trainer.n_procs_per_node`` = cores or GPUs,
  ``actor.engine.micro_batch_size`` = each rank's whole share of the batch) alone run rlflow at its
  defaults: FSDP2 actor colocated with an in-process rollout (vLLM or HF ``generate``), GRPO, the
  on-policy old-log-prob reuse, one torch thread per process. ``tuned_overrides`` are rlflow's
  documented speed settings, added unless ``tuned=False`` (the bench's "rlflow best" has them,
  "rlflow defaults" not; other benches keep them): on a CPU the actor's decoder layers compiled
  (``actor.engine.compile``, docs/engines.md), its attention ``sdpa_varlen`` (no filler in the
  linear layers; it gained nothing on a GPU) and ``share_prefix`` (each GRPO group's prompt
  computed once in the update; it needs sdpa_varlen); with vLLM its compiled graphs
  (``rollout.enforce_eager=false``). Both compile during the first steps, then run faster. Step
  and phases come from the run's ``metrics.jsonl`` (``timing_s/*``).
* TRL: ``bench/trl_grpo_runner.py`` in the TRL venv, one ``TrlConfig`` (torch threads, gradient
  checkpointing, micro-batches per step); its JSON lines on stdout.

Importable as ``grpo_runs`` because the benches run as ``python bench/<name>.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from grpo_workload import Workload, with_other
from machine_limits import PeakRSS
from trl_venv import REPO, runner_env

# rlflow timing key -> the bench's phase
RLFLOW_PHASES = {"timing_s/gen": "generation", "timing_s/log_probs_and_values": "old_log_probs",
                 "timing_s/update_actor": "update", "timing_s/weight_sync": "weight_sync"}


def tuned_overrides(device: str, rollout: str) -> list[str]:
    """rlflow's documented speed settings for ``device`` and ``rollout``. Compiled layers pay on a CPU
    from the second update on (the first compiles); on a GPU, where a step takes a few hundred ms, a
    run of a few steps would be mostly compiling, so they stay off there. ``sdpa_varlen`` made the update
    3.5% faster on a CPU and gained nothing on an H200 (docs/benchmarks.md); ``share_prefix`` needs it."""
    cpu = ["actor.engine.compile=true", "actor.engine.attn_implementation=sdpa_varlen",
           "actor.engine.share_prefix=true"] if device == "cpu" else []
    return cpu + (["rollout.enforce_eager=false"] if rollout == "vllm" else [])


def rlflow_overrides(workload: Workload, model: Path, data: Path, run_dir: Path, steps: int, workers: int,
                     rollout: str = "vllm", tuned: bool = True) -> list[str]:
    """The Hydra overrides of one rlflow run: the workload's, then ``tuned_overrides`` when ``tuned``
    (without them rlflow runs at its defaults)."""
    workload_overrides = [
        "algorithm=grpo", "actor.engine=fsdp2", f"rollout={rollout}", f"trainer.device={workload.device}",
        "model=hf", f"model.path={model}",
        f"data.train_files=[{data / 'train.parquet'}]", f"data.val_files=[{data / 'val.parquet'}]",
        f"data.train_batch_size={workload.prompts}", f"rollout.n={workload.samples}",
        f"data.max_response_length={workload.new_tokens}", f"actor.ppo_mini_batch_size={workload.prompts}",
        f"actor.engine.micro_batch_size={workload.sequences // workers}", f"actor.engine.param_dtype={workload.dtype}",
        f"rollout.dtype={workload.dtype}", f"actor.engine.optimizer.lr={workload.lr}",
        f"trainer.n_procs_per_node={workers}", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}", f"data.seed={workload.seed}",
    ]
    return workload_overrides + (tuned_overrides(workload.device, rollout) if tuned else [])


def parse_rlflow_metrics(lines: list[str]) -> list[dict]:
    """Per-step records from ``metrics.jsonl`` lines (training steps only, in order)."""
    steps = []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if "timing_s/step" not in record:
            continue
        step = {"step_s": record["timing_s/step"], "generated_tokens": record.get("rollout/generated_tokens", 0.0),
                "trained_tokens": record.get("perf/total_num_tokens", 0.0)}
        step.update({phase: record.get(key, 0.0) for key, phase in RLFLOW_PHASES.items()})
        steps.append(with_other(step))
    return steps


def trl_events(lines: list[str]) -> list[dict]:
    """The TRL runner's JSON records among its stdout lines (the others are TRL's logging)."""
    return [json.loads(line) for line in lines if line.startswith('{"event"')]


def parse_trl_lines(lines: list[str]) -> tuple[list[dict], dict]:
    """TRL runner stdout -> (per-step records, the settings line)."""
    steps, settings = [], {}
    for record in trl_events(lines):
        event = record.pop("event")
        if event == "step":
            steps.append(with_other(record))
        elif event == "settings":
            settings = record
    return steps, settings


def _run(command: list[str], env: dict, log: Path, timeout: float) -> tuple[int, dict[str, float]]:
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        sampler = PeakRSS(process.pid)
        sampler.start()
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        peaks = sampler.stop()
        left = sampler.wait_for_exit()
        if left:
            print(f"warning: processes of the run logged in {log.name} still alive: {left}", flush=True)
        return code, peaks


def run_rlflow(workload: Workload, model: Path, data: Path, out: Path, steps: int, workers: int,
               timeout: float, extra: tuple[str, ...] = (), name: str = "rlflow",
               rollout: str = "vllm", tuned: bool = True) -> tuple[list[dict], dict[str, float]]:
    """Run rlflow for ``steps`` steps (``extra``: more Hydra overrides; ``tuned``: with ``tuned_overrides``)
    in ``out/<name>-run``; its per-step records and peak RSS per process."""
    run_dir = out / f"{name}-run"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # written by this bench only: a fresh run each time
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "rlflow.trainer.main_ppo",
               *rlflow_overrides(workload, model, data, run_dir, steps, workers, rollout, tuned), *extra]
    code, rss = _run(command, env, out / f"{name}.log", timeout)
    if code != 0:
        raise RuntimeError(f"rlflow exited {code}; see {out / f'{name}.log'}")
    return parse_rlflow_metrics((run_dir / "metrics.jsonl").read_text().splitlines()), rss


@dataclass(frozen=True)
class TrlConfig:
    """One TRL configuration: torch threads, gradient checkpointing, micro-batches per step (the
    batch split for gradient accumulation; the step trains and generates the same batch for any)."""

    threads: int
    gradient_checkpointing: bool
    accumulation: int

    @property
    def name(self) -> str:
        return (f"{self.threads} thread{'s' if self.threads > 1 else ''}, gradient checkpointing "
                f"{'on' if self.gradient_checkpointing else 'off'}, "
                f"{self.accumulation} micro-batch{'es' if self.accumulation > 1 else ''}")

    def args(self) -> list[str]:
        """The TRL runner's options for this configuration."""
        return (["--threads", str(self.threads), "--accumulation", str(self.accumulation)]
                + (["--gradient-checkpointing"] if self.gradient_checkpointing else []))


def trl_command(python: Path, workload: Workload, model: Path, data: Path, steps: int, config: TrlConfig) -> list[str]:
    """The TRL runner's command line (printed by the bench as TRL's settings)."""
    return [str(python), str(REPO / "bench" / "trl_grpo_runner.py"), "--model", str(model),
            "--train", str(data / "train.parquet"), "--steps", str(steps),
            "--prompts", str(workload.prompts), "--samples", str(workload.samples),
            "--new-tokens", str(workload.new_tokens), "--dtype", workload.dtype, "--lr", str(workload.lr),
            "--seed", str(workload.seed), "--device", workload.device, *config.args()]


def trl_log(out: Path, workload: Workload, config: TrlConfig) -> Path:
    """Where the TRL run of ``config`` at ``workload.dtype`` writes its output."""
    return out / (f"trl-{workload.dtype}-{config.threads}t-gc{int(config.gradient_checkpointing)}"
                  f"-acc{config.accumulation}.log")


def run_trl(python: Path, workload: Workload, model: Path, data: Path, out: Path, steps: int, config: TrlConfig,
            timeout: float) -> tuple[list[dict], dict[str, float]]:
    """Run TRL for ``steps`` steps; its per-step records and peak RSS per process (raises if it failed, or
    if its step did not generate the whole batch at once)."""
    log = trl_log(out, workload, config)
    command = trl_command(python, workload, model, data, steps, config)
    code, rss = _run(command, runner_env(config.threads), log, timeout)
    if code != 0:
        raise RuntimeError(f"TRL exited {code}; see {log}")
    records, settings = parse_trl_lines(log.read_text().splitlines())
    if settings.get("generation_batch_size") != workload.sequences:  # every configuration generates the whole batch
        raise RuntimeError(f"TRL generated {settings.get('generation_batch_size')} completions a step, "
                           f"not {workload.sequences}; see {log}")
    return records, rss


def same_prompt_line(model: Path, data: Path, trl_run_log: Path) -> str:
    """Check that rlflow's data loader gives the first prompt TRL tokenised (in ``trl_run_log``) the
    same token ids; raise if not, else one line saying so with each side's token count."""
    from rlflow.data.rl_dataset import RLDataset
    from rlflow.models.loading import load_tokenizer

    trl = next(record for record in trl_events(trl_run_log.read_text().splitlines()) if record["event"] == "prompt")
    dataset = RLDataset(data / "train.parquet", load_tokenizer(model))
    ours = next(row.input_ids for row in dataset.rows if row.raw_prompt == trl["messages"])
    if ours != trl["ids"]:
        raise RuntimeError(f"the prompts differ: rlflow {ours}, TRL {trl['ids']} for {trl['messages']}")
    return (f"first prompt TRL tokenised: rlflow {len(ours)} tokens, TRL {len(trl['ids'])} tokens, "
            f"the same ids (both: the tokenizer's chat template): {trl['messages'][-1]['content']!r}")


def check_reward_rule(data: Path) -> None:
    """The TRL runner scores with ``score_final_answer`` (rlflow/data/tasks/answer.py, loaded by path);
    raise unless that is what rlflow's reward runs for every data source of the train file (its task
    keeps ``SyntheticTask.score``, which returns ``score_final_answer``)."""
    import pyarrow.parquet as pq

    from rlflow.data.tasks import SyntheticTask, get_task_cls

    sources = set(pq.read_table(data / "train.parquet", columns=["data_source"]).column("data_source").to_pylist())
    changed = sorted(source for source in sources if get_task_cls(source).score is not SyntheticTask.score)
    if changed:
        raise RuntimeError(f"rlflow's reward for {changed} is no longer score_final_answer; update the TRL runner")
