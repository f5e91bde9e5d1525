"""TRL's side of ``bench/grpo_vs_trl.py``: ``trl.GRPOTrainer`` on the bench's workload, one JSON
line per step on stdout. Runs in the TRL venv that ``bench/trl_venv.py`` builds (a plain
``pip install trl``); it never imports rlflow.

The reward is rlflow's own rule, not a copy: rlflow's ``synthetic/addition`` reward
(``rlflow.rewards.synthetic.synthetic_task_score``) scores with ``score_final_answer`` of
``rlflow/data/tasks/answer.py`` (the addition task keeps ``SyntheticTask.score``; the bench checks
that), and that file imports only ``re``, so it is loaded here by path. ``synthetic.py`` itself is
not: it imports rlflow's task and reward registries.

Prompts are TRL's conversational format, which TRL turns into token ids with the tokenizer's
chat template, as rlflow's data loader does; the first prompt TRL tokenises is printed
(``{"event": "prompt"}``) so the bench can check rlflow gives it the same ids.

One step trains the whole batch: ``--accumulation`` K splits it into K micro-batches of
``prompts * samples / K`` sequences (``gradient_accumulation_steps`` K) while
``generation_batch_size`` stays ``prompts * samples``, so every step generates all completions once.

Phases are timed by wrapping the trainer's methods (bench code, TRL unchanged):

* ``generation``: ``GRPOTrainer._generate`` (HF ``generate`` on the policy);
* ``old_log_probs``: no-grad calls of ``_get_per_token_logps_and_entropies`` while a batch is
  scored (TRL skips them when the step is on-policy, as here);
* ``update``: the step minus ``_prepare_inputs`` (loss forward, backward, AdamW);
* ``other``: ``_prepare_inputs`` minus the two above (tokenising, rewards, advantages).

Each line: ``{"event": "step", "step_s", "generation", "old_log_probs", "update", "weight_sync": 0,
"generated_tokens", "trained_tokens"}``; the last: ``{"event": "done", "peak_rss_mb"}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ScoreRule = Callable[[object, object], float]

REWARD_FILE = Path(__file__).resolve().parents[1] / "rlflow" / "data" / "tasks" / "answer.py"


def emit(record: dict) -> None:
    """One JSON line on stdout (the bench reads the lines that start with ``{"event"``)."""
    print(json.dumps(record), flush=True)


def build_dataset(train_parquet: str):
    """TRL's conversational prompt format (the row's chat messages) plus the reward's ground truth."""
    import datasets

    raw = datasets.Dataset.from_parquet(train_parquet)
    return raw.map(lambda row: {"prompt": list(row["prompt"]), "ground_truth": row["reward_model"]["ground_truth"]},
                   remove_columns=[c for c in raw.column_names if c != "prompt"])


def load_score_rule() -> ScoreRule:
    """``score_final_answer`` from rlflow's ``answer.py``, loaded by path (rlflow is not importable here)."""
    spec = importlib.util.spec_from_file_location("rlflow_task_answer", REWARD_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.score_final_answer


def make_reward(score_rule: ScoreRule) -> Callable[..., list[float]]:
    """TRL's reward function: ``score_rule`` (rlflow's final-answer rule) on each completion's text."""

    def addition_reward(completions, ground_truth, **_) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score_rule(text, truth) for text, truth in zip(texts, ground_truth)]

    return addition_reward


def report_first_prompt(trainer) -> None:
    """Wrap ``_tokenize_prompts`` to emit the first prompt it tokenises: its messages and token ids."""
    original = trainer._tokenize_prompts

    def tokenize(prompts, *args, **kwargs):
        out = original(prompts, *args, **kwargs)
        trainer._tokenize_prompts = original  # only the first call is reported
        emit({"event": "prompt", "messages": list(prompts[0]), "ids": [int(t) for t in out[0][0]]})
        return out

    trainer._tokenize_prompts = tokenize


class PhaseClock:
    """Wraps the trainer's methods and accumulates each step's phase times."""

    def __init__(self, trainer) -> None:
        import torch

        self.torch, self.current = torch, {}
        self._wrap(trainer, "_generate", "generation")
        self._wrap(trainer, "_prepare_inputs", "prepare")
        original_score = trainer._generate_and_score_completions
        original_logps = trainer._get_per_token_logps_and_entropies

        def score(*args, **kwargs):
            out = original_score(*args, **kwargs)
            prompt_tokens = float(out["prompt_mask"].sum())
            generated = float(out["completion_mask"].sum())
            self.current["generated_tokens"] = self.current.get("generated_tokens", 0.0) + generated
            self.current["trained_tokens"] = self.current.get("trained_tokens", 0.0) + prompt_tokens + generated
            return out

        def logps(*args, **kwargs):
            if self.torch.is_grad_enabled():
                return original_logps(*args, **kwargs)
            start = time.perf_counter()
            try:
                return original_logps(*args, **kwargs)
            finally:
                self._add("old_log_probs", time.perf_counter() - start)

        trainer._generate_and_score_completions = score
        trainer._get_per_token_logps_and_entropies = logps

    def _add(self, phase: str, seconds: float) -> None:
        self.current[phase] = self.current.get(phase, 0.0) + seconds

    def _wrap(self, trainer, method: str, phase: str) -> None:
        original = getattr(trainer, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._add(phase, time.perf_counter() - start)

        setattr(trainer, method, timed)

    def step_record(self, step_s: float) -> dict:
        phases, self.current = self.current, {}
        generation, old = phases.get("generation", 0.0), phases.get("old_log_probs", 0.0)
        prepare = phases.get("prepare", 0.0)
        return {"event": "step", "step_s": step_s, "generation": generation, "old_log_probs": old,
                "update": max(0.0, step_s - prepare), "weight_sync": 0.0,
                "generated_tokens": phases.get("generated_tokens", 0.0), "trained_tokens": phases.get("trained_tokens", 0.0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", required=True, help="the task's train.parquet")
    parser.add_argument("--steps", type=int, required=True, help="steps in all, warm-up included")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--accumulation", type=int, default=1, help="micro-batches per step (gradient accumulation)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-bench-"), report_to="none", save_strategy="no",
        use_cpu=args.device == "cpu", bf16=args.dtype == "bfloat16", max_steps=args.steps, logging_steps=1, seed=args.seed,
        learning_rate=args.lr, per_device_train_batch_size=args.prompts * args.samples // args.accumulation,
        gradient_accumulation_steps=args.accumulation, generation_batch_size=args.prompts * args.samples,
        num_generations=args.samples, max_completion_length=args.new_tokens, temperature=1.0,
        beta=0.0, num_iterations=1, gradient_checkpointing=args.gradient_checkpointing,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=make_reward(load_score_rule()), args=config,
                          train_dataset=build_dataset(args.train))
    torch.set_num_threads(args.threads)
    clock = PhaseClock(trainer)
    report_first_prompt(trainer)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            emit(clock.step_record(time.perf_counter() - self.start))

    trainer.add_callback(StepTimer())
    weight = next(trainer.model.parameters())
    emit({"event": "settings", "trl_threads": torch.get_num_threads(),
          "gradient_checkpointing": config.gradient_checkpointing,
          "per_device_train_batch_size": config.per_device_train_batch_size,
          "gradient_accumulation_steps": config.gradient_accumulation_steps,
          "generation_batch_size": config.generation_batch_size, "steps_per_generation": config.steps_per_generation,
          "dtype": args.dtype, "device": str(weight.device), "model_dtype": str(weight.dtype)})
    trainer.train()
    emit({"event": "done", "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    return 0


if __name__ == "__main__":
    sys.exit(main())
