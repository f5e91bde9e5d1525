"""Data-parallel meshes: each worker's membership, and the controller's table of a whole group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class MeshInfo:
    """One worker's place in a named data-parallel mesh.

    ``dp_rank``/``dp_size``: which data shard this worker computes on. Every rank of a DP group
    (all its TP/PP/CP ranks) gets the same shard; exactly one of them ``is_collect`` and returns
    the result the controller keeps.
    """

    name: str
    dp_rank: int
    dp_size: int
    is_collect: bool

    def __post_init__(self) -> None:
        if self.dp_size < 1 or not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"mesh '{self.name}': need 0 <= dp_rank < dp_size, got {self.dp_rank}, {self.dp_size}")


@dataclass(frozen=True)
class MeshTable:
    """The controller's view of one mesh over a worker group: who gets which shard, who answers."""

    name: str | None
    dp_size: int
    dp_rank_of: tuple[int, ...]  # indexed by worker rank
    collect_ranks: tuple[int, ...]  # indexed by dp rank: the worker whose output is kept

    @classmethod
    def data_parallel(cls, world_size: int) -> "MeshTable":
        """The default mesh: every worker is its own DP rank (no TP/PP)."""
        ranks = tuple(range(world_size))
        return cls(None, world_size, ranks, ranks)

    @classmethod
    def from_members(cls, name: str, members: Sequence[MeshInfo | None]) -> "MeshTable":
        """Build and validate the table from each rank's ``MeshInfo`` (in rank order)."""
        missing = [rank for rank, info in enumerate(members) if info is None]
        if missing:
            raise ValueError(
                f"ranks {missing} have not registered mesh '{name}'; call self.register_mesh('{name}', "
                "dp_rank, dp_size, is_collect) in the worker (in __init__ or an init method) before dispatching"
            )
        sizes = {info.dp_size for info in members}
        if len(sizes) != 1:
            raise ValueError(f"mesh '{name}': ranks disagree on dp_size: {[info.dp_size for info in members]}")
        dp_size = sizes.pop()
        collectors: dict[int, list[int]] = {dp: [] for dp in range(dp_size)}
        covered = set()
        for rank, info in enumerate(members):
            covered.add(info.dp_rank)
            if info.is_collect:
                collectors[info.dp_rank].append(rank)
        if covered != set(range(dp_size)):
            raise ValueError(f"mesh '{name}': dp ranks {sorted(set(range(dp_size)) - covered)} have no worker")
        bad = {dp: ranks for dp, ranks in collectors.items() if len(ranks) != 1}
        if bad:
            raise ValueError(f"mesh '{name}': each dp rank needs exactly one is_collect worker; got {bad} (dp -> ranks)")
        return cls(
            name,
            dp_size,
            tuple(info.dp_rank for info in members),
            tuple(collectors[dp][0] for dp in range(dp_size)),
        )
