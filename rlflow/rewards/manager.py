"""Turning generated responses into token-level scores: decode, score by data_source, place on the last token.

``RewardManager(tokenizer, reward_config)`` is built once by the driver and called on every
batch. With ``reward.num_workers > 0`` the samples are split into that many contiguous
chunks and scored in a pool of worker processes (started with ``spawn``, so they are safe
next to Ray and torch threads, and reused across batches); each worker runs the same
``score_samples`` as the serial path, so the scores are identical. Each worker imports the
driver's plugins (``trainer.plugins``) when it starts, before it unpickles a task, so reward
functions a plugin registered reach it by reference.

``timeout_s`` bounds each batch (``trainer.timeouts.reward_s``): past it the worker processes
are killed, or the in-process call is abandoned in its thread (``rlflow.rewards.deadline``),
and ``RewardTimeoutError`` ends the run. There is no per-sample limit: a hung sample holds the
whole batch until the batch limit.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Optional

import numpy as np
import torch

from rlflow.errors import UserError
from rlflow.protocol import DataProto
from rlflow.rewards.custom import load_custom_function
from rlflow.rewards.deadline import RewardTimeoutError, kill_pool, run_with_deadline
from rlflow.rewards.registry import RewardFn, get_reward_fn
from rlflow.rewards.scoring import RewardInput, ScoreResult, score_samples
from rlflow.utils.logging import get_logger
from rlflow.utils.plugins import import_plugins, loaded_plugins

logger = get_logger(__name__)

# Failed samples logged in full per batch; the rest are counted in one line.
MAX_LOGGED_ERRORS = 5


class RewardManager:
    """Scores a batch of responses with rule rewards (or the custom function), serially or in worker processes.

    ``timeout_s``: the limit on one batch (None: none); past it ``RewardTimeoutError`` is raised.
    """

    def __init__(self, tokenizer: Any, reward_config: Any, timeout_s: Optional[float] = None):
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.custom_function: Optional[str] = reward_config.custom_function or None
        self.num_workers = int(reward_config.num_workers)
        self.error_score = float(reward_config.error_score)
        if self.num_workers < 0:
            raise UserError(f"config key 'reward.num_workers': must be >= 0, got {self.num_workers}")
        if self.custom_function:
            load_custom_function(self.custom_function)  # fail at start-up, not at the first batch
        self._pool: Optional[ProcessPoolExecutor] = None

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        """``(token_level_scores [B, T_resp] float32, metrics)`` for a batch with ``responses``, ``response_mask``
        and non-tensor ``data_source``, ``ground_truth`` (``extra_info`` optional).

        Each score sits on the last token where ``response_mask`` is 1 (token 0 for an empty
        response); all other entries are 0.
        """
        token_level_scores, metrics, _ = self.score_with_results(data)
        return token_level_scores, metrics

    def score_with_results(self, data: DataProto) -> tuple[torch.Tensor, dict[str, float], list[ScoreResult]]:
        """What ``__call__`` returns plus each sample's ``ScoreResult`` (extras, ``pred``), in batch order."""
        responses, response_mask = data.batch["responses"], data.batch["response_mask"].bool()
        samples = self._samples(data, responses, response_mask)
        results = self._score(samples)
        self._log_errors(samples, results)
        positions = torch.arange(responses.shape[1]).expand_as(responses)
        last = torch.where(response_mask, positions, torch.zeros_like(positions)).max(dim=1).values
        token_level_scores = torch.zeros(responses.shape, dtype=torch.float32)
        token_level_scores[torch.arange(len(results)), last] = torch.tensor([r.score for r in results], dtype=torch.float32)
        return token_level_scores, reward_metrics(samples, results), results

    def _samples(self, data: DataProto, responses: torch.Tensor, response_mask: torch.Tensor) -> list[RewardInput]:
        texts = self.tokenizer.batch_decode(
            [row[mask].tolist() for row, mask in zip(responses, response_mask)], skip_special_tokens=True
        )
        extra_info = data.non_tensor_batch.get("extra_info", np.full(len(texts), None, dtype=object))
        return [
            RewardInput(str(source), text, truth, dict(extra or {}))
            for source, text, truth, extra in zip(
                data.non_tensor_batch["data_source"], texts, data.non_tensor_batch["ground_truth"], extra_info
            )
        ]

    def _functions(self, samples: list[RewardInput]) -> Optional[dict[str, RewardFn]]:
        """The registry function of each data_source in the batch (None when a custom function replaces them)."""
        if self.custom_function:
            return None
        return {source: get_reward_fn(source) for source in sorted({s.data_source for s in samples})}

    def _score(self, samples: list[RewardInput]) -> list[ScoreResult]:
        functions = self._functions(samples)
        if self.num_workers == 0 or len(samples) < 2:
            return run_with_deadline(score_samples, (samples, functions, self.custom_function, self.error_score),
                                     self.timeout_s, f"the reward function in the driver, on {len(samples)} samples")
        _check_picklable(functions)
        n_chunks = min(self.num_workers, len(samples))
        bounds = np.linspace(0, len(samples), n_chunks + 1).astype(int)
        pool = self._get_pool()
        futures = [
            pool.submit(score_samples, samples[start:stop], functions, self.custom_function, self.error_score)
            for start, stop in zip(bounds[:-1], bounds[1:])
        ]
        _, pending = wait_futures(futures, timeout=self.timeout_s)
        if pending:
            kill_pool(pool)
            self._pool = None
            chunks = [f"samples {start}-{stop - 1}" for future, start, stop in zip(futures, bounds[:-1], bounds[1:])
                      if future in pending]
            raise RewardTimeoutError(self.timeout_s, f"reward worker processes on {', '.join(chunks)}")
        return [result for future in futures for result in future.result()]

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.num_workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=import_plugins,
                initargs=(loaded_plugins(),),
            )
        return self._pool

    def _log_errors(self, samples: list[RewardInput], results: list[ScoreResult]) -> None:
        failed = [(i, s, r) for i, (s, r) in enumerate(zip(samples, results)) if r.error is not None]
        for index, sample, result in failed[:MAX_LOGGED_ERRORS]:
            logger.warning(
                "reward for sample %d (data_source=%s) %s; scored %s. ground_truth=%r response=%r",
                index, sample.data_source, result.error, result.score, sample.ground_truth, sample.solution_str[:300],
            )
        if len(failed) > MAX_LOGGED_ERRORS:
            logger.warning("%d more samples in this batch failed to score and got %s", len(failed) - MAX_LOGGED_ERRORS, self.error_score)

    def close(self) -> None:
        """Stop the worker processes (if any were started)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> "RewardManager":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def reward_metrics(samples: list[RewardInput], results: list[ScoreResult]) -> dict[str, float]:
    """``reward/error_count``, the mean score per data_source and the mean of each extra number functions reported."""
    by_source: dict[str, list[float]] = defaultdict(list)
    extras: dict[str, list[float]] = defaultdict(list)
    for sample, result in zip(samples, results):
        by_source[sample.data_source].append(result.score)
        for key, value in result.extras.items():
            extras[key].append(value)
    metrics = {"reward/error_count": float(sum(r.error is not None for r in results))}
    metrics.update({f"reward/source/{source}/mean": float(np.mean(scores)) for source, scores in by_source.items()})
    metrics.update({f"reward/extra/{key}/mean": float(np.mean(values)) for key, values in extras.items()})
    return metrics


def _check_picklable(functions: Optional[dict[str, RewardFn]]) -> None:
    for source, fn in (functions or {}).items():
        try:
            pickle.dumps(fn)
        except Exception as error:  # noqa: BLE001 - lambdas and local functions cannot reach worker processes
            raise UserError(
                f"the reward function for data_source {source!r} ({fn!r}) cannot be sent to reward worker processes "
                f"({type(error).__name__}); define it at module level, or set reward.num_workers=0"
            ) from None


def score_batch(data: DataProto, tokenizer: Any, reward_config: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """One-shot form of ``RewardManager``: ``(token_level_scores, metrics)``. A driver scoring many
    batches should keep a ``RewardManager`` so its worker pool is started only once."""
    with RewardManager(tokenizer, reward_config) as manager:
        return manager(data)
