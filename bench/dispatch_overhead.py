"""Overhead of a DP_COMPUTE round trip against raw Ray object transfer, for 1 MB and 100 MB batches.

    python bench/dispatch_overhead.py [--sizes-mb 1 100] [--workers 2] [--repeats 9] [--json PATH]

The same tensors travel four ways, each timed as the median of ``--repeats`` runs, the ways taking
turns within every repeat:

* ``dp_compute``: ``wg.echo(batch)`` on a 2-worker group: pad, chunk, ship each chunk to its
  worker, return it, concat, unpad (the path every role method takes);
* ``raw_actor``: the round trip in plain Ray: the tensors as zero-copy numpy views (Ray's fastest
  path), split into one row chunk per worker, ``ray.put`` of each, one plain actor per chunk returns
  it, ``ray.get``: the same bytes out and back, in parallel, without the worker-group machinery;
* ``raw_merged``: the raw round trip, then the returned chunks merged into one batch of tensors
  (``np.concatenate``): the result ``dp_compute`` hands back, which the raw round trip does not
  make (it returns read-only chunks);
* ``raw_put_get``: ``ray.get(ray.put(tensors))`` in the driver: the object store alone, no worker.

It prints each time and the ratio of ``dp_compute`` to each baseline; the target is ``dp_compute`` within
1.2x of the raw round trip (``raw_actor``) at 100 MB; the other rows are informational.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Callable

import numpy as np
import ray
import torch

from rlflow.protocol import DataProto
from rlflow.utils.device import limit_cpu_threads
from rlflow.workers import DP_COMPUTE, RayWorkerGroup, ResourcePool, Worker, init_ray, register, shutdown_ray

from machine import machine_line
from results import BenchResult, Row, write_result

TARGET = 1.2
TARGET_MB = 100.0

SEQ_LEN = 256


class EchoWorker(Worker):
    """Returns its chunk unchanged: the round trip is all dispatch and transport."""

    @register(dispatch_mode=DP_COMPUTE)
    def echo(self, data: DataProto) -> DataProto:
        return data


@ray.remote(num_cpus=0.5)
class RawEcho:
    """The baseline actor: plain Ray, no dispatch."""

    def echo(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return arrays


def raw_round_trip(actors: list, chunks: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The same round trip in plain Ray: one chunk per actor, ``ray.put``, echo, ``ray.get``."""
    return ray.get([actor.echo.remote(ray.put(chunk)) for actor, chunk in zip(actors, chunks)])


def raw_round_trip_merged(actors: list, chunks: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """The raw round trip, then one batch of tensors in memory of their own, as ``dp_compute`` returns."""
    parts = raw_round_trip(actors, chunks)
    return {key: torch.from_numpy(np.concatenate([part[key] for part in parts])) for key in parts[0]}


def numpy_chunks(batch: DataProto, parts: int) -> list[dict[str, np.ndarray]]:
    """The batch's tensors as zero-copy numpy views, split by rows like DP_COMPUTE splits them
    (numpy is Ray's zero-copy path, the fastest a plain-Ray user gets)."""
    arrays = {key: value.numpy() for key, value in batch.batch.items()}
    return [{key: value[index] for key, value in arrays.items()}
            for index in np.array_split(np.arange(len(batch)), parts)]


def make_batch(megabytes: float) -> DataProto:
    """input_ids (int64) + log_probs (float32) rows of SEQ_LEN tokens, about ``megabytes`` in total."""
    rows = max(2, int(megabytes * 2**20 / (SEQ_LEN * (8 + 4))))
    return DataProto.from_dict(
        {"input_ids": torch.randint(0, 32000, (rows, SEQ_LEN)), "log_probs": torch.randn(rows, SEQ_LEN)}
    )


def interleaved_medians(ways: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each way, run in turn within every repeat, so that all of them meet the
    same object-store state (a warm or cold store moved one way's time 2x between blocks of runs)."""
    for fn in ways.values():
        fn()  # warm-up: worker imports, first allocations
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 100.0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", default=None, help="write the result file (bench/results.py) here")
    args = parser.parse_args()
    print(machine_line())

    limit_cpu_threads(1)  # the driver too: on a loaded 2-core box two threads made torch.cat 200x slower
    init_ray(num_cpus=4, temp_dir=tempfile.mkdtemp(prefix="r", dir="/tmp"), object_store_memory=2 * 2**30)
    pool = ResourcePool(procs_per_node=args.workers, cpus_per_proc=0.5, device="cpu", name="bench")
    raw = [RawEcho.remote() for _ in range(args.workers)]
    result = BenchResult(bench="dispatch_overhead", title="DP_COMPUTE round trip vs raw Ray object transfer",
                         notes=[f"{args.workers} workers, medians of {args.repeats}; raw round trip: the batch as numpy "
                                f"views split into {args.workers} row chunks, ray.put each, one plain actor per chunk "
                                "echoes it, ray.get (read-only chunks back); merged: then np.concatenate per key, the one "
                                "batch DP_COMPUTE returns; in-driver put/get: the object store alone, no worker"])
    try:
        with RayWorkerGroup(pool, EchoWorker, name="bench") as wg:
            print(f"{'size':>8} {'dp_compute':>11} {'raw_actor':>10} {'raw_merged':>11} {'raw_put_get':>12} "
                  f"{'vs actor':>9} {'vs merged':>10} {'vs put/get':>11}")
            for megabytes in args.sizes_mb:
                batch = make_batch(megabytes)
                out = wg.echo(batch)
                assert torch.equal(out.batch["input_ids"], batch.batch["input_ids"]), "echo changed the data"
                chunks = numpy_chunks(batch, args.workers)
                t_dp, t_actor, t_merged, t_put = interleaved_medians({
                    "dp_compute": lambda: wg.echo(batch),
                    "raw_actor": lambda: raw_round_trip(raw, chunks),
                    "raw_merged": lambda: raw_round_trip_merged(raw, chunks),
                    "raw_put_get": lambda: ray.get(ray.put(batch.batch)),
                }, args.repeats).values()
                print(
                    f"{megabytes:>6.0f}MB {t_dp * 1e3:>9.1f}ms {t_actor * 1e3:>8.1f}ms {t_merged * 1e3:>9.1f}ms "
                    f"{t_put * 1e3:>10.1f}ms {t_dp / t_actor:>8.2f}x {t_dp / t_merged:>9.2f}x {t_dp / t_put:>10.2f}x"
                )
                for baseline_name, baseline in (("raw round trip (ray.put, actor echo, ray.get)", t_actor),
                                                ("raw round trip, then merged into one batch", t_merged),
                                                ("in-driver ray.put/ray.get", t_put)):
                    gated = megabytes == TARGET_MB and baseline is t_actor  # the target; the rest inform
                    result.rows.append(Row(
                        name=f"DP_COMPUTE echo {megabytes:g} MB", value=t_dp, baseline_name=baseline_name, baseline=baseline,
                        unit="s", ratio=t_dp / baseline, ratio_meaning="value / baseline",
                        target=f"<= {TARGET}" if gated else "", met=t_dp / baseline <= TARGET if gated else None))
    finally:
        for actor in raw:
            ray.kill(actor)
        shutdown_ray()
    write_result(args.json, result)


if __name__ == "__main__":
    main()
