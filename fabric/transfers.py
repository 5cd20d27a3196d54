"""The transfer DAG: point-to-point transfers between ranks, with sizes and dependencies.

A neutral data type. `traffic.collectives` turns a collective (all-reduce, all-to-all, ...) into a
DAG; both backends execute the very same DAG: the emulation replay (real TCP bytes between
emulated hosts) and the flow-level simulator. Ranks are integers; where a rank runs (which host) is
a separate placement (`Placement`), so one schedule can be placed on any fabric.

Transfers are stored in a topological order: every dependency of transfer `i` has an index below
`i`. A transfer may start once all of its dependencies have been delivered in full.

Two forms of one DAG: `TransferDag`, a tuple of `Transfer` objects (what the replay walks), and
`TransferColumns`, the same as arrays (a column per field, dependencies in compressed rows), which
the simulator executes and which large collectives are built as directly (a ring all-reduce over
1024 ranks is 2 million transfers: objects cost seconds and hundreds of MB there, columns a few
tens of MB). `TransferDag.columns` converts; `TransferColumns.to_dag` converts back.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from fabric.errors import FabriclabError

IntColumn = npt.NDArray[np.int64]


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

    @cached_property
    def columns(self) -> TransferColumns:
        """The same DAG as arrays."""
        ts = self.transfers
        counts = np.fromiter((len(t.deps) for t in ts), dtype=np.int64, count=len(ts))
        return TransferColumns(
            src=np.fromiter((t.src for t in ts), dtype=np.int64, count=len(ts)),
            dst=np.fromiter((t.dst for t in ts), dtype=np.int64, count=len(ts)),
            size_bytes=np.fromiter((t.size_bytes for t in ts), dtype=np.int64, count=len(ts)),
            phase=np.fromiter((t.phase for t in ts), dtype=np.int64, count=len(ts)),
            dep_ptr=np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)]),
            dep=np.fromiter((d for t in ts for d in t.deps), dtype=np.int64, count=int(counts.sum())),
            ranks=self.ranks, label=self.label, checked=True)


@dataclass(frozen=True, eq=False)
class TransferColumns:
    """A transfer DAG as arrays: transfer i sends `size_bytes[i]` from rank `src[i]` to rank `dst[i]`
    in step `phase[i]`, after the transfers `dep[dep_ptr[i]:dep_ptr[i + 1]]` (ascending, each below
    i). Checked as `TransferDag` checks, on the arrays (`checked`: already checked by its maker)."""

    src: IntColumn
    dst: IntColumn
    size_bytes: IntColumn
    phase: IntColumn
    dep_ptr: IntColumn
    dep: IntColumn
    ranks: tuple[int, ...]
    label: str = ""
    checked: bool = False

    def __post_init__(self) -> None:
        if self.checked:
            return
        what = self.label or "transfer DAG"
        n = self.src.size
        if len(set(self.ranks)) != len(self.ranks):
            raise TransferError(f"{what}: duplicate ranks in {self.ranks}")
        if not (self.dst.size == self.size_bytes.size == self.phase.size == n and self.dep_ptr.size == n + 1
                and self.dep_ptr[0] == 0 and self.dep_ptr[-1] == self.dep.size
                and bool(np.all(np.diff(self.dep_ptr) >= 0))):
            raise TransferError(f"{what}: columns of different lengths")

        def where(i: int) -> str:
            return f"{what}: transfer {i} ({int(self.src[i])} -> {int(self.dst[i])})"

        members = np.asarray(sorted(self.ranks), dtype=np.int64)
        for col in (self.src, self.dst):
            pos = np.clip(np.searchsorted(members, col), 0, max(0, members.size - 1))
            bad = np.flatnonzero(members[pos] != col) if members.size else np.arange(n)
            if bad.size:
                raise TransferError(f"{where(int(bad[0]))}: rank not in the DAG's ranks {self.ranks}")
        for wrong, problem in ((self.src == self.dst, "a transfer needs two different ranks"),
                               (self.size_bytes < 0, "size_bytes must be >= 0")):
            if wrong.any():
                raise TransferError(f"{where(int(np.flatnonzero(wrong)[0]))}: {problem}")
        owner = np.repeat(np.arange(n), np.diff(self.dep_ptr))
        bad = np.flatnonzero((self.dep < 0) | (self.dep >= owner))
        if bad.size:
            i = int(owner[bad[0]])
            raise TransferError(f"{where(i)}: dependency {int(self.dep[bad[0]])} is not an earlier transfer")

    def __len__(self) -> int:
        return int(self.src.size)

    @cached_property
    def total_bytes(self) -> int:
        return int(self.size_bytes.sum())

    def phases(self) -> int:
        return 1 + int(self.phase.max()) if self.src.size else 0

    def deps_of(self, i: int) -> tuple[int, ...]:
        return tuple(self.dep[self.dep_ptr[i]:self.dep_ptr[i + 1]].tolist())

    def successors(self) -> tuple[IntColumn, IntColumn]:
        """(ptr, succ): transfer i's dependents are succ[ptr[i]:ptr[i + 1]], ascending."""
        n = self.src.size
        owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.dep_ptr))
        order = np.argsort(self.dep, kind="stable")
        ptr = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(np.bincount(self.dep, minlength=n))])
        return ptr, owner[order]

    def to_dag(self) -> TransferDag:
        dep, ptr = self.dep.tolist(), self.dep_ptr.tolist()
        return TransferDag(tuple(Transfer(a, b, c, tuple(dep[ptr[i]:ptr[i + 1]]), p) for i, (a, b, c, p) in
                                 enumerate(zip(self.src.tolist(), self.dst.tolist(), self.size_bytes.tolist(),
                                               self.phase.tolist()))), self.ranks, self.label)

    def same_as(self, other: TransferColumns) -> bool:
        """Equal transfer for transfer (fields and dependencies), ranks and label."""
        return (self.ranks == other.ranks and self.label == other.label
                and all(np.array_equal(getattr(self, f), getattr(other, f))
                        for f in ("src", "dst", "size_bytes", "phase", "dep_ptr", "dep")))


@dataclass(frozen=True)
class Placement:
    """Rank -> host name. Several ranks may share a host (their transfers then stay inside it; a replay
    plan refuses such transfers with bytes, as a host is one GPU)."""

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
