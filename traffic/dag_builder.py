"""Building a transfer DAG as arrays, transfer by transfer or block by block (`DagBuilder`).

`traffic.collectives` writes every algorithm against this one builder: a ring pass or an all-to-all
round of n ranks goes in as one block of arrays (the forms that reach millions of transfers), the
rest transfer by transfer. The result is a `fabric.transfers.TransferColumns`; its `to_dag` gives the
same DAG as objects.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from fabric.transfers import IntColumn, TransferColumns


class DagBuilder:
    """Collects transfers in a topological order: transfer i is the i-th added, by `send` or by `block`.

    `send` adds the in-order dependency per connection (src, dst, channel): each transfer waits for
    the previous one on its connection, as a connection delivers in order (algorithms that run
    independent streams use one channel each). A `block` adds none by itself: its caller gives the
    rows' dependencies and records the connections' last transfers (`previous_on`, `record_on`)."""

    def __init__(self) -> None:
        self.n = 0  # transfers added so far
        self._blocks: list[tuple[IntColumn, ...]] = []
        self._sends: list[tuple[int, int, int, int, list[int]]] = []  # `send`s not yet in a block
        self._last_on: dict[tuple[int, int, int], int] = {}

    def previous_on(self, src: int, dst: int, channel: int = 0) -> tuple[int, ...]:
        """The last transfer added on the connection so far, if any."""
        prev = self._last_on.get((src, dst, channel))
        return () if prev is None else (prev,)

    def record_on(self, src: int, dst: int, index: int, channel: int = 0) -> None:
        """Transfer `index` is now the last on the connection."""
        self._last_on[(src, dst, channel)] = index

    def send(self, src: int, dst: int, size_bytes: int, phase: int, after: Iterable[int] = (), channel: int = 0) -> int:
        """One transfer after `after` and the previous one on its connection; returns its index."""
        index = self.n
        self._sends.append((src, dst, size_bytes, phase, [*after, *self.previous_on(src, dst, channel)]))
        self.n += 1
        self.record_on(src, dst, index, channel)
        return index

    def block(self, src: IntColumn, dst: IntColumn, size_bytes: IntColumn, phase: IntColumn, deps: IntColumn) -> None:
        """Transfers self.n, self.n + 1, ...: row i of the 2-D `deps` lists transfer i's dependencies (-1
        pads; any order, repeats allowed)."""
        self._flush()
        deps = np.sort(deps, axis=1)
        keep = deps >= 0
        keep[:, 1:] &= deps[:, 1:] != deps[:, :-1]  # each dependency once
        self._blocks.append((src, dst, size_bytes, phase, keep.sum(axis=1), deps[keep]))
        self.n += src.size

    def _flush(self) -> None:
        """The pending `send`s as one block."""
        if not self._sends:
            return
        sends, self._sends = self._sends, []
        self.n -= len(sends)
        src, dst, size, phase, after = zip(*sends)
        counts = np.fromiter(map(len, after), dtype=np.int64, count=len(after))
        deps = np.full((len(after), max(1, int(counts.max()))), -1, dtype=np.int64)
        rows = np.repeat(np.arange(len(after)), counts)
        deps[rows, np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)] = \
            np.fromiter((d for a in after for d in a), dtype=np.int64, count=rows.size)
        src_col, dst_col, size_col, phase_col = (np.asarray(c, dtype=np.int64) for c in (src, dst, size, phase))
        self.block(src_col, dst_col, size_col, phase_col, deps)

    def columns(self, ranks: Sequence[int], label: str) -> TransferColumns:
        """The DAG built so far, checked as `TransferColumns` checks."""
        self._flush()
        cols = list(zip(*self._blocks)) if self._blocks else [()] * 6
        src, dst, size, phase, counts, dep = (np.concatenate([np.zeros(0, dtype=np.int64), *c]) for c in cols)
        ptr = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)])
        return TransferColumns(src, dst, size, phase, ptr, dep, tuple(ranks), label)
