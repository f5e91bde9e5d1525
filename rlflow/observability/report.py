"""End-of-run report: learning curves, a before/after accuracy summary and sample answers.

It reads what the trainers already write (``metrics.jsonl`` of each run, exported HF folders)
and evaluates model folders greedily with ``rlflow.observability.evaluate.evaluate_greedy_accuracy``
(``--backend``: vLLM when it is installed, else HF ``generate``; ``vllm`` or ``hf`` to choose).
Nothing in it is specific to one recipe; ``recipes/demo.sh`` calls it as its last phase::

    python -m rlflow.observability.report --out outputs/demo \\
        --run sft=outputs/demo/sft --run grpo=outputs/demo/grpo \\
        --model base=outputs/demo/model --model sft=outputs/demo/sft/hf --model grpo=outputs/demo/grpo/hf \\
        --data outputs/demo/data/val.parquet --phase-times outputs/demo/phase_times.tsv

Writes into ``--out``:

| file | what |
|---|---|
| ``curves.png`` | per step of the first RL run: train reward and val accuracy; response length and KL |
| ``samples.md`` | the first val prompts with each ``--model``'s greedy answer |
| ``summary.md`` / ``summary.json`` | val accuracy per model; steps, wall time and tokens/s per phase |

and prints the summary table.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Optional, Sequence

from rlflow.errors import UserError
from rlflow.utils.log_routing import LIBRARY_ENV, route_library_logs, worker_log_env

METRICS_FILE = "metrics.jsonl"
REWARD_KEY = "critic/score/mean"
# The val accuracy curve: verl's core mean over the N validation samples of each prompt
# (``val-core/<data_source>/<reward or acc>/mean@N``), averaged over the run's data sources.
VAL_CORE_MEAN = "val-core/*/mean@*"
RESPONSE_LENGTH_KEY = "response_length/mean"
# The KL shown on the curves, the first a run has: to the reference policy (runs with a KL loss or
# a KL reward penalty), else the per-update KL between the rollout policy and the updated policy.
KL_CURVES = {"actor/ref_kl": "KL(policy || reference)", "actor/ppo_kl": "KL(rollout policy || updated policy)"}


class TokenRate(NamedTuple):
    """How to read one tokens/s figure from a run's metrics: total tokens over total seconds of ``seconds_key``.

    ``tokens_key`` holds the step's token count, or with ``key_is_rate`` its tokens per second.
    """

    label: str
    tokens_key: str
    seconds_key: str
    key_is_rate: bool = False


# RL runs: generation and the actor update each have a rate; SFT runs: the training step.
RL_RATES = (TokenRate("rollout", "rollout/generated_tokens", "timing_s/gen"),
            TokenRate("train", "perf/total_num_tokens", "timing_s/update_actor"))
SFT_RATES = (TokenRate("train", "perf/throughput", "timing_s/step", key_is_rate=True),)


# ---------------------------------------------------------------------------------------- inputs
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (a run folder or the file itself), sorted by step."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise UserError(f"no metrics file at {path}: pass a run folder that holds {METRICS_FILE} (trainer.default_local_dir)")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{path} line {number}: not JSON ({error.msg})") from error
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise UserError(f"{path} line {number}: a record needs an integer 'step'")
        records.append(record)
    return sorted(records, key=lambda r: r["step"])


def read_phase_times(path: Optional[str | Path]) -> dict[str, float]:
    """``name<TAB>seconds`` lines (as ``recipes/demo.sh`` writes them) as a dict; a repeated name adds up."""
    times: dict[str, float] = {}
    if path is None or not Path(path).is_file():
        return times
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        name, _, seconds = line.partition("\t")
        try:
            times[name] = times.get(name, 0.0) + float(seconds)
        except ValueError as error:
            raise UserError(f"{path} line {number}: expected 'name<TAB>seconds', got {line!r}") from error
    return times


def named_paths(values: Sequence[str], flag: str) -> dict[str, Path]:
    """``["sft=path", ...]`` as ``{"sft": Path("path")}`` in the given order."""
    pairs: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise UserError(f"{flag} {value!r}: expected NAME=PATH")
        pairs[name] = Path(path)
    return pairs


# ---------------------------------------------------------------------------------------- numbers
def series(records: Iterable[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that have a finite ``key``."""
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(record["step"])
            values.append(float(value))
    return steps, values


def val_core_series(records: Iterable[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(steps, values) of the val accuracy: the mean of a record's ``VAL_CORE_MEAN`` metrics, where it has any."""
    steps, values = [], []
    for record in records:
        found = [v for k, v in record.items() if fnmatch.fnmatchcase(k, VAL_CORE_MEAN) and isinstance(v, (int, float))]
        if found and all(math.isfinite(v) for v in found):
            steps.append(record["step"])
            values.append(sum(found) / len(found))
    return steps, values


def is_rl_run(records: Sequence[dict[str, Any]]) -> bool:
    """Whether the records come from an RL driver (they carry a train reward)."""
    return any(REWARD_KEY in record for record in records)


def token_rate(records: Sequence[dict[str, Any]], rate: TokenRate) -> Optional[float]:
    """Total tokens / total seconds over the steps that report both keys of ``rate`` (None if none do)."""
    tokens = seconds = 0.0
    for record in records:
        value, elapsed = record.get(rate.tokens_key), record.get(rate.seconds_key)
        if isinstance(value, (int, float)) and isinstance(elapsed, (int, float)) and elapsed > 0:
            tokens += value * elapsed if rate.key_is_rate else value
            seconds += elapsed
    return tokens / seconds if seconds > 0 else None


@dataclass
class PhaseSummary:
    """One phase of a pipeline: its optimizer steps, wall time and token rates."""

    name: str
    steps: Optional[int] = None
    wall_s: Optional[float] = None
    tokens_per_s: dict[str, float] = field(default_factory=dict)


def summarize_run(name: str, records: Sequence[dict[str, Any]], wall_s: Optional[float]) -> PhaseSummary:
    """Steps and token rates of one run's metrics."""
    steps = max((r["step"] for r in records), default=0)
    tokens_per_s = {}
    for rate in RL_RATES if is_rl_run(records) else SFT_RATES:
        value = token_rate(records, rate)
        if value is not None:
            tokens_per_s[rate.label] = value
    return PhaseSummary(name, steps, wall_s, tokens_per_s)


# ---------------------------------------------------------------------------------------- curves
def plot_curves(records: Sequence[dict[str, Any]], out: str | Path, title: str = "") -> Path:
    """Two panels per step: train reward and val accuracy; response length and KL. Returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    top.plot(*series(records, REWARD_KEY), label="train reward (mean score)", color="tab:blue")
    val_steps, val_values = val_core_series(records)
    top.plot(val_steps, val_values, marker="o", label="val accuracy (val-core mean@N)", color="tab:green")
    top.set_ylabel("score / accuracy")
    top.set_ylim(-0.02, 1.02)
    top.grid(alpha=0.3)
    top.legend(loc="lower right")
    bottom.plot(*series(records, RESPONSE_LENGTH_KEY), label="response length (tokens)", color="tab:orange")
    bottom.set_ylabel("response length (tokens)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    kl_key = next((key for key in KL_CURVES if series(records, key)[0]), None)
    if kl_key is not None:
        kl_axis = bottom.twinx()
        kl_axis.plot(*series(records, kl_key), label=KL_CURVES[kl_key], color="tab:red")
        kl_axis.set_ylabel(f"KL ({kl_key})")
        lines = bottom.get_lines() + kl_axis.get_lines()
        bottom.legend(lines, [line.get_label() for line in lines], loc="upper right")
    else:
        bottom.legend(loc="upper right")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


# ---------------------------------------------------------------------------------------- evaluation
def evaluate_models(models: dict[str, Path], data: Sequence[str | Path], max_new_tokens: int,
                    limit: Optional[int], backend: str = "auto", tools: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Greedy accuracy (and the first examples) of every model folder on ``data``, decoded by ``backend``
    (with ``tools``, through the tool_agent loop)."""
    from rlflow.observability.evaluate import evaluate_greedy_accuracy

    results = {}
    for name, path in models.items():
        if not (path / "config.json").is_file():
            raise UserError(f"--model {name}={path}: not an HF model folder (no config.json); did that phase finish?")
        results[name] = evaluate_greedy_accuracy(path, list(data), max_new_tokens=max_new_tokens, limit=limit,
                                                 backend=backend, tools=tools)
    return results


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: line breaks as <br>, pipes escaped, control characters shown as U+FFFD.

    An untrained model emits arbitrary bytes; a control character such as \\x1e would end the table row.
    """
    lines = ("".join(char if char.isprintable() else "\ufffd" for char in line) for line in text.splitlines())
    return "<br>".join(lines).replace("|", "\\|")


def samples_markdown(results: dict[str, dict[str, Any]]) -> str:
    """A markdown table: each example prompt, its ground truth, and every model's answer (with its score)."""
    names = list(results)
    header = ["prompt", "truth", *names]
    lines = ["# Sample answers (greedy)", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    count = min(len(result["examples"]) for result in results.values())
    for row in range(count):
        first = results[names[0]]["examples"][row]
        answers = []
        for name in names:
            example = results[name]["examples"][row]
            mark = "✓" if example["score"] >= 1.0 else "✗"
            answers.append(f"{mark} `{_cell(example['response'].strip())}`")
        lines.append("| " + " | ".join([_cell(first["prompt"]), str(first["ground_truth"]), *answers]) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- summary
def _format_seconds(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def summary_markdown(accuracy: dict[str, float], num_prompts: Optional[int], phases: Sequence[PhaseSummary],
                     eval_backend: Optional[str] = None) -> str:
    """The summary as markdown: val accuracy per model (and the backend that decoded), then one row per phase."""
    lines = []
    if accuracy:
        lines += [f"val accuracy (greedy, {num_prompts} prompts, {eval_backend} decoding)", "",
                  "| " + " | ".join(accuracy) + " |", "|" + "---|" * len(accuracy),
                  "| " + " | ".join(f"{value:.1%}" for value in accuracy.values()) + " |", ""]
    lines += ["| phase | steps | wall time | tokens/s |", "|---|---|---|---|"]
    for phase in phases:
        rates = ", ".join(f"{label} {rate:,.0f}" for label, rate in phase.tokens_per_s.items()) or "-"
        steps = "-" if phase.steps is None else str(phase.steps)
        lines.append(f"| {phase.name} | {steps} | {_format_seconds(phase.wall_s)} | {rates} |")
    total = sum(phase.wall_s for phase in phases if phase.wall_s is not None)
    lines.append(f"| total | | {_format_seconds(total)} | |")
    return "\n".join(lines) + "\n"


def build_report(out: str | Path, runs: dict[str, Path], models: dict[str, Path], data: Sequence[str | Path],
                 phase_times: dict[str, float], max_new_tokens: int = 32, limit: Optional[int] = None,
                 backend: str = "auto", tools: Sequence[str] = ()) -> dict[str, Any]:
    """Write curves.png (if a run is an RL run), samples.md (if models are given), summary.md/json; return the summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    run_records = {name: read_metrics(path) for name, path in runs.items()}
    summary: dict[str, Any] = {"files": {}}
    rl_runs = [name for name, records in run_records.items() if is_rl_run(records)]
    if rl_runs:
        curves = plot_curves(run_records[rl_runs[0]], out / "curves.png", title=f"{rl_runs[0]}: learning curves")
        summary["files"]["curves"] = str(curves)
    accuracy: dict[str, float] = {}
    num_prompts = eval_backend = None
    if models:
        if not data:
            raise UserError("--model needs --data: the RL-format val files to evaluate on")
        results = evaluate_models(models, data, max_new_tokens, limit, backend, tools)
        accuracy = {name: result["accuracy"] for name, result in results.items()}
        num_prompts = next(iter(results.values()))["num_samples"]
        eval_backend = next(iter(results.values()))["backend"]
        (out / "samples.md").write_text(samples_markdown(results))
        summary["files"]["samples"] = str(out / "samples.md")
    phases = [summarize_run(name, run_records[name], phase_times.get(name)) if name in run_records
              else PhaseSummary(name, wall_s=seconds) for name, seconds in phase_times.items()]
    phases += [summarize_run(name, records, None) for name, records in run_records.items() if name not in phase_times]
    table = summary_markdown(accuracy, num_prompts, phases, eval_backend)
    (out / "summary.md").write_text("# Run summary\n\n" + table)
    summary.update(accuracy=accuracy, num_prompts=num_prompts, eval_backend=eval_backend,
                   phases=[asdict(phase) for phase in phases], table=table)
    summary["files"]["summary"] = str(out / "summary.md")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    """Command-line entry: build the report and print the summary table."""
    os.environ.update(LIBRARY_ENV)  # before rlflow.rollout imports vLLM, which would set up its own console logging
    from rlflow.rollout import rollout_names

    parser = argparse.ArgumentParser(prog="python -m rlflow.observability.report", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for curves.png, samples.md, summary.md, summary.json")
    parser.add_argument("--run", action="append", default=[], metavar="NAME=DIR",
                        help="a run folder holding metrics.jsonl (trainer.default_local_dir); repeatable")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                        help="an HF model folder to evaluate greedily on --data; repeatable, reported in order")
    parser.add_argument("--data", nargs="+", default=[], help="RL-format val files (parquet/jsonl) for --model")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="greedy decoding budget per answer")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N prompts")
    parser.add_argument("--backend", default="auto", choices=["auto", *rollout_names()],
                        help="decoder of the evaluation: vllm, hf (HF generate), or auto (vllm when installed)")
    parser.add_argument("--tools", nargs="*", default=[], metavar="TOOL",
                        help="evaluate through the tool_agent loop with these tools (docs/agents.md)")
    parser.add_argument("--phase-times", default=None, help="file of 'name<TAB>seconds' lines (wall time per phase)")
    args = parser.parse_args(argv)
    os.environ.update(worker_log_env(args.out))  # vLLM's INFO lines (three engines) go to <out>/logs/report.log
    route_library_logs("report")
    try:
        summary = build_report(args.out, named_paths(args.run, "--run"), named_paths(args.model, "--model"), args.data,
                               read_phase_times(args.phase_times), args.max_new_tokens, args.limit, args.backend,
                               args.tools)
    except (UserError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(summary["table"], end="")
    for name, path in summary["files"].items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
