"""The per-link load log: the links' rates over time, piecewise constant between events, as the result
keeps it (`FlowSimResult.edges_s`, `load_ptr`, `load_link`, `load_bps`).

An interval that follows one with the same allocation (the same memoised load arrays: a ring's steps)
extends it instead of adding one. Past `LOAD_LOG_ENTRIES` (interval, link) entries the log's resolution
is halved (`LoadLog._coarsen`: neighbouring intervals averaged, every link's bytes kept), and from then on
a new interval lasts at least the mean interval's length, so the log grows with simulated time, not
with the number of events.
"""
from __future__ import annotations

import numpy as np

from fabric.flowsim.maxmin import FloatArray, IntArray

#: the per-link load log holds at most this many (interval, link) entries; beyond, its resolution is
#: halved (neighbouring intervals averaged, bytes kept): 8M entries are 128 MB
LOAD_LOG_ENTRIES = 8_000_000


class LoadLog:
    """The load log over `n_links` directed links: interval k from `edges[k]` to `edges[k + 1]`, its
    links and rates in `load_link[k]`, `load_bps[k]` (`ptr`: the entries' running count)."""

    def __init__(self, n_links: int) -> None:
        self.n_links = n_links
        self.edges: list[float] = []
        self.ptr: list[int] = [0]
        self.load_link: list[IntArray] = []  # per interval
        self.load_bps: list[FloatArray] = []
        # once coarsened (`_coarsen`): the log's intervals last at least bin_s, the open one's bits per
        # link add up in acc_bits until acc_to
        self.bin_s = 0.0
        self.acc_bits: FloatArray = np.zeros(0)  # allocated at the first coarsening
        self.acc_to = 0.0
        self.coarsened = 0  # times the log's resolution was halved (LOAD_LOG_ENTRIES)

    def record(self, from_s: float, until_s: float, used: IntArray, rate: FloatArray) -> None:
        """Links `used` at rates `rate` from `from_s` (the last edge or later) until `until_s`, which is
        later (one interval; once the log has been coarsened, added to the open interval, `_record_coarse`)."""
        if self.bin_s:
            self._record_coarse(from_s, used, rate, until_s)
            return
        if self.edges and self.edges[-1] == from_s and self.load_link and self.load_link[-1] is used:
            self.edges[-1] = until_s  # the same allocation as the interval before: one interval
            return
        if self.edges and self.edges[-1] != from_s:
            self._idle_interval(from_s)
        if not self.edges:
            self.edges.append(from_s)
        self.edges.append(until_s)
        self.load_link.append(used)
        self.load_bps.append(rate)
        self.ptr.append(self.ptr[-1] + used.size)
        if self.ptr[-1] > LOAD_LOG_ENTRIES:
            self._coarsen()

    def _idle_interval(self, until_s: float) -> None:
        """An interval with no load, from the log's last edge to `until_s`."""
        self.ptr.append(self.ptr[-1])
        self.edges.append(until_s)
        self.load_link.append(np.zeros(0, dtype=np.intp))
        self.load_bps.append(np.zeros(0))

    def _record_coarse(self, from_s: float, used: IntArray, rate: FloatArray, until_s: float) -> None:
        """The coarse log: loads add up, as bits per link, in the open interval (from the log's last
        edge), closed once it is `bin_s` long; an idle gap of at least `bin_s` is an interval of its own."""
        if from_s - self.acc_to >= self.bin_s:  # an idle gap since the last load
            if self.acc_to > self.edges[-1]:
                self._close_bin(self.acc_to)
            self._idle_interval(from_s)
            self.acc_to = from_s
        self.acc_bits[used] += rate * (until_s - from_s)
        self.acc_to = until_s
        if until_s - self.edges[-1] >= self.bin_s:
            self._close_bin(until_s)

    def _close_bin(self, end_s: float) -> None:
        """Close the coarse log's open interval at `end_s`: its links at their mean rates."""
        acc = self.acc_bits
        links = np.flatnonzero(acc)
        self.load_link.append(links.astype(np.intp))
        self.load_bps.append(acc[links] / (end_s - self.edges[-1]))
        acc[links] = 0.0
        self.edges.append(end_s)
        self.ptr.append(self.ptr[-1] + links.size)
        self.acc_to = end_s
        if self.ptr[-1] > LOAD_LOG_ENTRIES:
            self._coarsen()

    def flush(self) -> None:
        """The coarse log's open interval closed (at the end of the run)."""
        if self.bin_s and self.acc_to > self.edges[-1]:
            self._close_bin(self.acc_to)

    def _coarsen(self) -> None:
        """Halve the load log's resolution until it holds at most half its budget: each two
        neighbouring intervals become one, every link at its time-weighted mean rate over both (the
        bytes each link carried are kept). From then on the log is coarse (`_record_coarse`): a new
        interval lasts at least the mean interval's length, so the log grows with simulated time,
        not with the number of events, and is coarsened again only as that time grows."""
        edges = np.asarray(self.edges)
        k = edges.size - 1
        n_links = self.n_links
        interval = np.repeat(np.arange(k), np.diff(np.asarray(self.ptr)))
        links = np.concatenate(self.load_link)
        bits = np.concatenate(self.load_bps) * np.diff(edges)[interval]
        while True:
            edges = edges[::2] if k % 2 == 0 else np.append(edges[::2], edges[-1])
            k = edges.size - 1
            # within an interval the links ascend, so the keys are runs in order: a stable sort
            # (timsort) merges them in about linear time
            key = interval // 2 * n_links + links
            order = np.argsort(key, kind="stable")
            key = key[order]
            starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
            bits = np.add.reduceat(bits[order], starts) if starts.size else bits[:0]
            key = key[starts]
            interval, links = key // n_links, key % n_links
            self.coarsened += 1
            if key.size <= LOAD_LOG_ENTRIES // 2 or k <= 1:
                break
        rate = bits / np.diff(edges)[interval]
        self.edges = edges.tolist()
        self.ptr = np.concatenate([[0], np.cumsum(np.bincount(interval, minlength=k))]).tolist()
        self.load_link = [links.astype(np.intp)]
        self.load_bps = [rate]
        self.bin_s = (self.edges[-1] - self.edges[0]) / k
        if not self.acc_bits.size:
            self.acc_bits = np.zeros(n_links)
        self.acc_to = self.edges[-1]
