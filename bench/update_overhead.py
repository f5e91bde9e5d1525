"""Cost of driving the actor update from the controller: two Ray round trips per mini-batch.

    python bench/update_overhead.py [--workers 1] [--rows 256] [--mini-batches 4] [--micro-batch-size 16] [--repeats 5]
                                  [--json PATH]

The PPO driver (``PPOTrainer._update_actor``) runs the update Tinker-style: for each
mini-batch it calls ``actor.forward_backward(mini)`` (``DP_COMPUTE``) and then
``actor.optim_step()`` (``ONE_TO_ALL``). One worker group (tiny preset, fsdp2 engine on CPU,
``--workers`` ranks) hosts two colocated roles built from the same config and seed, so they
start from the same weights and do the same work on the same processes:

* ``controller``: the real ``Actor`` role, driven exactly as the PPO driver drives it:
  ``2 x mini-batches`` round trips per update;
* ``in_worker``: a subclass with one extra method that receives every mini-batch shard at
  once (``ALL_TO_ALL``) and runs the same ``forward_backward`` / ``optim_step`` loop inside
  the worker: one round trip per update.

Each update is one PPO epoch over ``--rows`` sequences split into ``--mini-batches`` shuffled
mini-batches (``DataProto.make_iterator``, same seed for both). Each of ``--repeats`` rounds
(after a warm-up one) times both, in alternating order, and checks that their gradient norms
match step for step.
It prints the median (and range) of each one's update time, the overhead per extra round trip
(the difference of the medians over ``2 x mini-batches - 1``) and the ratio controller / in_worker.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto
from rlflow.roles.actor import Actor
from rlflow.trainer.entry_points import compose_ppo_config
from rlflow.utils.device import limit_cpu_threads
from rlflow.workers import ALL_TO_ALL, RayWorkerGroup, ResourcePool, WorkerSpec, init_ray, register, shutdown_ray

from machine import machine_line
from results import BenchResult, Row, write_result


class InWorkerLoopActor(Actor):
    """The baseline: the ``Actor`` role plus a whole update loop that runs inside the worker."""

    @register(dispatch_mode=ALL_TO_ALL)
    def update_in_worker(self, shards: list[DataProto]) -> list[dict[str, float]]:
        """``forward_backward`` then ``optim_step`` on each of this rank's mini-batch shards, locally."""
        return [{**self.forward_backward(shard).meta_info["metrics"], **self.optim_step()} for shard in shards]


def ppo_config(model_path: Path, mini_batch_rows: int, micro_batch_size: int, workers: int) -> Any:
    """The validated ``ppo_trainer`` config of the bench: tiny model, fsdp2 actor on CPU, GRPO loss."""
    overrides = [
        f"model.path={model_path}",
        "model.preset=null",
        "rollout=hf",
        "rollout.n=1",
        f"actor.ppo_mini_batch_size={mini_batch_rows}",
        "actor.engine=fsdp2",
        "actor.engine.device=cpu",
        f"actor.engine.micro_batch_size={micro_batch_size}",
        "trainer.device=cpu",
        f"trainer.n_procs_per_node={workers}",
    ]
    return compose_ppo_config(overrides)


def make_rollout_batch(rows: int, prompt_len: int, response_len: int, vocab: int) -> DataProto:
    """A rollout-shaped batch (no left padding): prompt + response ids, masks, positions, advantages."""
    generator = torch.Generator().manual_seed(0)
    seq_len = prompt_len + response_len
    input_ids = torch.randint(0, vocab, (rows, seq_len), generator=generator)
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": torch.ones(rows, seq_len, dtype=torch.long),
            "position_ids": torch.arange(seq_len).expand(rows, seq_len).clone(),
            "responses": input_ids[:, prompt_len:].clone(),
            "response_mask": torch.ones(rows, response_len, dtype=torch.long),
            "advantages": torch.randn(rows, response_len, generator=generator),
        },
        meta_info={"temperature": 1.0},
    )


def controller_update(actor: Any, minis: list[DataProto]) -> list[float]:
    """``PPOTrainer._update_actor``'s loop: two group calls per mini-batch. Returns the grad norms."""
    return [{**actor.forward_backward(mini).meta_info["metrics"], **actor.optim_step()[0]}["actor/grad_norm"] for mini in minis]


def in_worker_update(baseline: Any, minis: list[DataProto], ranks: int) -> list[float]:
    """Every rank's shards of every mini-batch (what ``DP_COMPUTE`` would send it), in one call."""
    shards = [mini.chunk(ranks) for mini in minis]
    per_rank = baseline.update_in_worker([[mini[rank] for mini in shards] for rank in range(ranks)])
    return [step["actor/grad_norm"] for step in per_rank[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="ranks of the worker group (pure DP)")
    parser.add_argument("--rows", type=int, default=256, help="sequences per update")
    parser.add_argument("--mini-batches", type=int, default=4, help="optimizer steps per update")
    parser.add_argument("--micro-batch-size", type=int, default=16, help="sequences per forward/backward")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--response-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the result file (bench/results.py) here (informational rows)")
    args = parser.parse_args()
    print(machine_line())
    mini_rows = args.rows // args.mini_batches
    if mini_rows * args.mini_batches != args.rows or mini_rows % args.workers:
        parser.error("--rows must split into --mini-batches mini-batches, each a multiple of --workers rows")

    limit_cpu_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    model_path = build_preset(tmp / "model", tokenizer_corpus(), preset="tiny", seed=0)
    config = ppo_config(model_path, mini_rows, args.micro_batch_size, args.workers)
    vocab = AutoConfig.from_pretrained(model_path).vocab_size
    batch = make_rollout_batch(args.rows, args.prompt_len, args.response_len, vocab)

    roles = {"actor": WorkerSpec(Actor, config.actor, str(model_path)),
             "in_worker": WorkerSpec(InWorkerLoopActor, config.actor, str(model_path))}
    try:
        init_ray(num_cpus=4, temp_dir=str(tmp / "ray"), object_store_memory=2**30)
        pool = ResourcePool(procs_per_node=args.workers, cpus_per_proc=0.5, device="cpu", name="bench")
        with RayWorkerGroup(pool, roles, name="bench") as group:
            actor, baseline = group.role("actor"), group.role("in_worker")
            batch = batch.union(actor.compute_log_prob(batch).select(batch_keys=["old_log_probs"]))
            updates = {"controller": lambda minis: controller_update(actor, minis),
                       "in_worker": lambda minis: in_worker_update(baseline, minis, args.workers)}
            seconds: dict[str, list[float]] = {name: [] for name in updates}
            for repeat in range(args.repeats + 1):  # repeat 0 is the warm-up
                minis = list(batch.make_iterator(mini_rows, epochs=1, shuffle=True, seed=repeat))
                norms = {}
                for name in sorted(updates, reverse=repeat % 2 == 1):  # alternate which goes first
                    start = time.perf_counter()
                    norms[name] = updates[name](minis)
                    if repeat:
                        seconds[name].append(time.perf_counter() - start)
                same = torch.allclose(torch.tensor(norms["controller"]), torch.tensor(norms["in_worker"]), rtol=1e-4)
                assert same, f"the two ways computed different updates (grad norms): {norms}"
    finally:
        shutdown_ray()
        shutil.rmtree(tmp, ignore_errors=True)

    t_ctl, t_in = (statistics.median(seconds[name]) for name in ("controller", "in_worker"))
    extra_trips = 2 * args.mini_batches - 1
    settings = (f"tiny preset, fsdp2 on CPU, {args.workers} rank(s), {args.rows} x {args.prompt_len}+{args.response_len} "
                f"tokens, {args.mini_batches} mini-batches, medians of {args.repeats}")
    print(settings)
    for name, median, trips in (("controller", t_ctl, 2 * args.mini_batches), ("in_worker", t_in, 1)):
        spread = f"{min(seconds[name]) * 1e3:.0f}..{max(seconds[name]) * 1e3:.0f}"
        print(f"  {name:10s} {median * 1e3:8.1f} ms/update  (range {spread} ms; {trips} round trip(s))")
    print(f"  overhead   {(t_ctl - t_in) / extra_trips * 1e3:8.1f} ms per extra round trip; "
          f"ratio controller / in_worker {t_ctl / t_in:.3f}x")
    write_result(args.json, BenchResult(
        bench="update_overhead", title="Actor update driven from the controller vs a loop inside the worker",
        rows=[Row(name=f"controller-driven update ({2 * args.mini_batches} round trips)", value=t_ctl,
                  baseline_name="in-worker loop (1 round trip)", baseline=t_in, unit="s", ratio=t_ctl / t_in,
                  ratio_meaning="value / baseline (informational)")],
        notes=[settings, f"overhead {(t_ctl - t_in) / extra_trips * 1e3:.1f} ms per extra round trip"]))


if __name__ == "__main__":
    main()
