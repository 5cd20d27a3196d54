"""The transfer DAG: point-to-point transfers between ranks, with sizes and dependencies.

A neutral data type. `traffic.collectives` turns a collective (all-reduce, all-to-all, ...) into a
DAG; both backends execute the very same DAG: the emulation replay (real TCP bytes between
emulated hosts) and the flow-level simulator. Ranks are integers; where a rank runs (which host) is
a separate placement (`Placement`), so one schedule can be placed on any fabric.

Transfers are stored in a topological order: every dependency of transfer `i` has an index below
`i`. A transfer may start once all of its dependencies have been delivered in full.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

from fabric.errors import FabriclabError


class TransferError(FabriclabError):
    """A transfer DAG or placement is malformed; the message names the offending item."""


@dataclass(frozen=True)
class Transfer:
    """`size_bytes` from rank `src` to rank `dst`, after the transfers listed in `deps` (indexes into
    the same DAG). `phase` numbers the algorithm's steps (0, 1, ...) for reports and aggregation."""

    src: int
    dst: int
    size_bytes: int
    deps: tuple[int, ...] = ()
    phase: int = 0


@dataclass(frozen=True)
class TransferDag:
    transfers: tuple[Transfer, ...]
    ranks: tuple[int, ...]  # the ranks taking part (every src and dst is one of them)
    label: str = ""  # e.g. "all_reduce ring 8 ranks 1048576 B"

    def __post_init__(self) -> None:
        members = set(self.ranks)
        if len(members) != len(self.ranks):
            raise TransferError(f"{self.label or 'transfer DAG'}: duplicate ranks in {self.ranks}")
        for i, t in enumerate(self.transfers):
            where = f"{self.label or 'transfer DAG'}: transfer {i} ({t.src} -> {t.dst})"
            if t.src not in members or t.dst not in members:
                raise TransferError(f"{where}: rank not in the DAG's ranks {self.ranks}")
            if t.src == t.dst:
                raise TransferError(f"{where}: a transfer needs two different ranks")
            if t.size_bytes < 0:
                raise TransferError(f"{where}: size_bytes must be >= 0, got {t.size_bytes}")
            for d in t.deps:
                if not 0 <= d < i:
                    raise TransferError(f"{where}: dependency {d} is not an earlier transfer")

    def __len__(self) -> int:
        return len(self.transfers)

    @cached_property
    def total_bytes(self) -> int:
        return sum(t.size_bytes for t in self.transfers)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """Transfer index -> the transfers that depend on it."""
        out: list[list[int]] = [[] for _ in self.transfers]
        for i, t in enumerate(self.transfers):
            for d in t.deps:
                out[d].append(i)
        return tuple(tuple(x) for x in out)

    def bytes_between(self) -> dict[tuple[int, int], int]:
        """(src rank, dst rank) -> bytes sent over the whole DAG."""
        out: dict[tuple[int, int], int] = defaultdict(int)
        for t in self.transfers:
            out[(t.src, t.dst)] += t.size_bytes
        return dict(out)

    def phases(self) -> int:
        return 1 + max((t.phase for t in self.transfers), default=-1)


@dataclass(frozen=True)
class Placement:
    """Rank -> host name. Several ranks may share a host (their transfers then stay inside it)."""

    hosts: tuple[str, ...]  # hosts[rank]

    def host(self, rank: int) -> str:
        try:
            return self.hosts[rank]
        except IndexError:
            raise TransferError(f"rank {rank} has no host (placement covers ranks 0..{len(self.hosts) - 1})") from None

    def __len__(self) -> int:
        return len(self.hosts)


def split_bytes(size_bytes: int, parts: int) -> tuple[int, ...]:
    """`size_bytes` cut into `parts` pieces that differ by at most one byte and sum to `size_bytes`."""
    if parts < 1:
        raise TransferError(f"cannot split {size_bytes} B into {parts} parts")
    if size_bytes < 0:
        raise TransferError(f"size_bytes must be >= 0, got {size_bytes}")
    base, extra = divmod(size_bytes, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))
