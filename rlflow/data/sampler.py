"""Seeded, resumable batching for RL and SFT datasets.

``ResumableBatchSampler`` turns a dataset size into batches of indices, epoch after epoch.
The order of epoch ``e`` depends only on ``(seed, e)``, never on what ran before, so a run
restored from ``state_dict()`` sees exactly the batches an uninterrupted run would have seen.

Epochs and ``drop_last``:

* ``drop_last=True`` (training): an epoch has ``num_samples // batch_size`` batches, all full;
  the left-over samples of that epoch's order are skipped (a different set each epoch when
  shuffling). A dataset smaller than one batch is an error.
* ``drop_last=False`` (validation): ``ceil(num_samples / batch_size)`` batches; the last may be
  smaller.

Iterating yields the *remaining* batches of the current epoch and then moves to the next
epoch; a training loop is therefore ``for epoch in range(loader.epoch, total_epochs): for
batch in loader: ...``. The state advances as each batch is handed out, so a checkpoint taken
after consuming a batch resumes at the next one.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

import numpy as np

from rlflow.errors import UserError
from rlflow.protocol import DataProto

_STATE_KEYS_THAT_MUST_MATCH = ("num_samples", "batch_size", "shuffle", "seed", "drop_last")


class ResumableBatchSampler:
    """Batches of dataset indices over epochs, shuffled per epoch from ``(seed, epoch)``, with a resumable position."""

    def __init__(self, num_samples: int, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True):
        if batch_size < 1:
            raise UserError(f"batch size must be >= 1, got {batch_size}")
        if num_samples < 1:
            raise UserError("the dataset is empty (0 samples after filtering)")
        if drop_last and num_samples < batch_size:
            raise UserError(
                f"the dataset has {num_samples} samples, fewer than one batch of {batch_size}; "
                "lower the batch size or add data"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.next_batch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch`` (identity when not shuffling)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        """Yield ``(epoch, indices)`` for the rest of the current epoch, then advance to the next epoch."""
        epoch, order = self.epoch, self.epoch_order(self.epoch)
        while self.epoch == epoch and self.next_batch < len(self):
            start = self.next_batch * self.batch_size
            indices = order[start : start + self.batch_size].tolist()
            self.next_batch += 1
            if self.next_batch == len(self):
                self.epoch, self.next_batch = epoch + 1, 0
            yield epoch, indices

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, next batch) plus the settings a resume must share."""
        return {"epoch": self.epoch, "next_batch": self.next_batch, **{k: getattr(self, k) for k in _STATE_KEYS_THAT_MUST_MATCH}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; raises ``UserError`` if the data or batching settings changed since."""
        changed = [f"{k}: {state.get(k)!r} -> {getattr(self, k)!r}" for k in _STATE_KEYS_THAT_MUST_MATCH if state.get(k) != getattr(self, k)]
        if changed:
            raise UserError(f"cannot resume the data loader: its settings changed since the checkpoint ({'; '.join(changed)})")
        if not 0 <= state["next_batch"] < len(self):
            raise UserError(f"cannot resume the data loader: batch {state['next_batch']} is outside an epoch of {len(self)}")
        self.epoch, self.next_batch = int(state["epoch"]), int(state["next_batch"])


class CollatingDataset(Protocol):
    """What ``BatchLoader`` needs from a dataset: its size and a collate of chosen rows."""

    def __len__(self) -> int: ...

    def collate(self, indices: list[int], epoch: int) -> DataProto: ...


class BatchLoader:
    """Iterates a dataset as ``DataProto`` batches in the order of a ``ResumableBatchSampler``."""

    def __init__(self, dataset: CollatingDataset, sampler: ResumableBatchSampler):
        self.dataset = dataset
        self.sampler = sampler

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.sampler)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self.sampler.epoch

    def __iter__(self) -> Iterator[DataProto]:
        for epoch, indices in self.sampler:
            yield self.dataset.collate(indices, epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def build_loader(
    dataset: CollatingDataset, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True
) -> BatchLoader:
    """A ``BatchLoader`` over ``dataset`` (see the module docstring for the epoch and drop_last rules)."""
    return BatchLoader(dataset, ResumableBatchSampler(len(dataset), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last))
