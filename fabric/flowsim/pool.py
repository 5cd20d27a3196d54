"""The transfer pool: the state of the transfers of every job that has started and not completed, as
arrays indexed by pool index, each job in a contiguous range of them (from `base[job]`), reused once the
job has completed. So a replay of many calls needs the memory of its concurrent calls, not of all of
them; a completed job's transfer times are kept apart (if the options ask for them).
"""
from __future__ import annotations

import bisect

import numpy as np

from fabric.flowsim.maxmin import FloatArray, IntArray
from fabric.flowsim.shapes import _Template

#: the pool's arrays: one entry per transfer of every job that has started and not completed
_POOL = {"t_size": np.int64, "t_job": np.intp, "t_pair": np.intp,
         "deps_left": np.int64, "start_s": np.float64, "end_s": np.float64, "parts_left": np.int64,
         "hops": np.int64, "wait_left": np.int64, "sent_s": np.float64}


class TransferPool:
    """The running jobs' transfers by pool index: size, job, host pair (index; -1: both ranks on one
    host), dependencies not yet delivered (`deps_left`), start and delivery times, parts still sending
    (`parts_left`), links on the longest part's path (`hops`, only with a per-hop delay) and, for
    cut-through, dependencies not yet delivered of a sent transfer (`wait_left`) and when its last byte
    left (`sent_s`). Job j's template is `templates[job_tpl[j]]`."""

    def __init__(self, templates: list[_Template], job_tpl: list[int], transfer_times: bool) -> None:
        self.templates, self.job_tpl = templates, job_tpl
        self.transfer_times = transfer_times
        self.cap = 0
        self.t_job = self.t_pair = np.zeros(0, dtype=np.intp)
        self.t_size = self.deps_left = self.parts_left = self.hops = self.wait_left = np.zeros(0, dtype=np.int64)
        self.start_s = self.end_s = self.sent_s = np.zeros(0)
        self._grow(0)  # each its own array
        self.base: dict[int, int] = {}  # active job -> its first index in the pool
        # the free ranges below `top` (sorted, coalesced) and the end of the highest range in use: so a
        # job is placed first-fit without walking the active jobs (thousands run at once at 1024 GPUs)
        self._holes: list[list[int]] = []
        self._top = 0
        self.kept_start: dict[int, FloatArray] = {}  # completed job -> its transfers' times (transfer_times)
        self.kept_end: dict[int, FloatArray] = {}

    def template(self, j: int) -> _Template:
        return self.templates[self.job_tpl[j]]

    def start(self, j: int) -> slice:
        """Job j starts: its transfers take a range of the pool, set from its template (none begun);
        returns the range."""
        tpl = self.template(j)
        n = len(tpl.size)
        base = self._allocate(j, n)
        part = slice(base, base + n)
        self.t_size[part] = tpl.size
        self.t_job[part] = j
        self.t_pair[part] = tpl.pair
        self.deps_left[part] = tpl.dep_count
        self.start_s[part] = np.nan
        self.end_s[part] = np.nan
        # (`parts_left` and `hops` are written when a transfer starts its flows, before any read; not
        # touching them here keeps a large DAG's pages untouched until used)
        return part

    def _allocate(self, j: int, n: int) -> int:
        """A range of n free pool entries for job j (the first gap between active jobs that fits, or
        the end, the pool grown as needed); returns its first index."""
        at = -1
        for i, hole in enumerate(self._holes):
            if hole[1] - hole[0] >= n:
                at = hole[0]
                if hole[1] - hole[0] == n:
                    del self._holes[i]
                else:
                    hole[0] += n
                break
        if at < 0:
            at = self._top
            self._top += n
        if at + n > self.cap:
            self._grow(max(at + n, 2 * self.cap))
        self.base[j] = at
        return at

    def _free(self, a: int, b: int) -> None:
        """The range [a, b) is free again: a hole, joined to its neighbours; the top lowered under it."""
        holes = self._holes
        i = bisect.bisect_left(holes, [a, b])
        if i > 0 and holes[i - 1][1] == a:
            i -= 1
            holes[i][1] = b
        else:
            holes.insert(i, [a, b])
        if i + 1 < len(holes) and holes[i + 1][0] == holes[i][1]:
            holes[i][1] = holes.pop(i + 1)[1]
        if holes[i][1] == self._top:
            self._top = holes.pop(i)[0]

    def _grow(self, cap: int) -> None:
        """The pool's arrays at `cap` entries, what they hold kept."""
        for name, dtype in _POOL.items():
            old = getattr(self, name)
            grown = np.zeros(cap, dtype=dtype)
            grown[:old.size] = old[:cap]
            setattr(self, name, grown)
        self.cap = cap

    def release(self, j: int) -> None:
        """Job j completed: keep its transfers' times (if asked) and free its pool range."""
        base = self.base.pop(j)
        n = len(self.template(j).size)
        if self.transfer_times:
            self.kept_start[j] = self.start_s[base:base + n].copy()
            self.kept_end[j] = self.end_s[base:base + n].copy()
        if n:
            self._free(base, base + n)

    def by_job(self, g: IntArray) -> list[tuple[int, IntArray]]:
        """Transfers `g` (pool indexes) grouped by job: (job, its transfers among `g`)."""
        of = self.t_job[g]
        if of.size and of[0] == of[-1] and bool((of == of[0]).all()):  # the usual batch: one job
            return [(int(of[0]), g)]
        # one stable sort, not a pass over the batch per job (a delivery of a step's pipeline sends has
        # thousands of jobs): each job's transfers keep their order in `g`
        order = np.argsort(of, kind="stable")
        sorted_of = of[order]
        cut = np.flatnonzero(sorted_of[1:] != sorted_of[:-1]) + 1
        starts = np.concatenate(([0], cut)).tolist()
        ends = np.concatenate((cut, [of.size])).tolist()
        jobs = sorted_of[starts].tolist() if of.size else []
        gs = g[order]
        return [(job, gs[a:b]) for job, a, b in zip(jobs, starts, ends)]

    def out_edges(self, job: int, mine: IntArray) -> tuple[_Template, IntArray]:
        """`job`'s template and the indexes (into its `succ`) of the edges leaving transfers `mine`."""
        tpl = self.template(job)
        local = mine - self.base[job]
        if local.size > 1024:
            first, last = int(local.min()), int(local.max())
            if last - first + 1 == local.size:  # a range of transfers (distinct): its edges are a range
                return tpl, np.arange(tpl.succ_ptr[first], tpl.succ_ptr[last + 1], dtype=np.intp)
            if 16 * local.size >= tpl.size.size:  # a large share of the DAG (chained phases): one pass
                mine_mask = np.zeros(tpl.size.size, dtype=np.bool_)
                mine_mask[local] = True
                return tpl, np.flatnonzero(np.repeat(mine_mask, tpl.shape.succ_count))
        lo, hi = tpl.succ_ptr[local], tpl.succ_ptr[local + 1]
        k = hi - lo
        if k.size and k[0] == k[-1] and bool((k == k[0]).all()):  # as many edges each (a ring: one)
            w = int(k[0])
            return tpl, lo if w == 1 else (lo[:, None] + np.arange(w)).ravel()
        total = int(k.sum())
        if not total:
            return tpl, np.zeros(0, dtype=np.intp)
        return tpl, np.repeat(lo, k) + np.arange(total) - np.repeat(np.cumsum(k) - k, k)

    def times(self, j: int) -> tuple[FloatArray, FloatArray] | None:
        """Job j's transfers' start and delivery times (nan: not yet): a running job's (copies), a
        completed one's if kept; None for a job that never started or whose times were not kept."""
        if j in self.base:
            part = slice(self.base[j], self.base[j] + len(self.template(j).size))
            return self.start_s[part].copy(), self.end_s[part].copy()
        if j in self.kept_start:
            return self.kept_start[j], self.kept_end[j]
        return None
