"""What every job of one DAG shares: its shape (`_Shape`: sizes, dependency counts, successors, phases)
and, per lane, its template (`_Template`: the shape and the host pairs its transfers use);
`job_templates`: a run's jobs' templates.

A replay calls one collective many times, and on two streams (lanes): the run keeps one shape per
distinct (DAG, placement) and one template per (DAG, placement, lane), so the DAG's arrays are held once
whatever the number of calls, and each lane holds only its host pairs.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

from fabric.flowsim.inputs import Job
from fabric.flowsim.maxmin import FlowSimError, IntArray
from fabric.model import Fabric
from fabric.transfers import Placement, TransferColumns


class _Shape:
    """What every job of one DAG on one placement shares, whatever its lane: its transfers' sizes,
    dependency counts, successors (CSR), the transfers without dependencies, the sending host of
    each, which are remote (sender and receiver on different hosts); the phases (lockstep only,
    computed on first use). A replay's collective on two streams (lanes) is one shape: at 16,384
    GPUs a hierarchical all-reduce's shape holds ~1 GB."""

    def __init__(self, cols: TransferColumns, src: IntArray, dst: IntArray, server: IntArray | None = None,
                 nvlink_bps: float = 0.0) -> None:
        self.cols = cols  # kept: the run keys shapes by the DAG object's id
        self.size = cols.size_bytes
        self.dep_count = np.diff(cols.dep_ptr)
        self.succ_ptr, self.succ = cols.successors()
        self.roots = np.flatnonzero(self.dep_count == 0).astype(np.intp)
        self.src_host = src
        # remote: across the fabric (different servers, `server`: each host index's; None: every host its own)
        self.remote = src != dst if server is None else server[src] != server[dst]
        # per transfer, the seconds an in-server transfer between two GPUs takes at the NVLink rate (0:
        # across the fabric, or both ranks on one host); None: there is none
        self.local_s: npt.NDArray[np.float64] | None = None
        self.nvlink: npt.NDArray[np.bool_] | None = None  # between two GPUs of a server (`SimOptions.nvlink_latency_s`)
        nvlink = ~self.remote & (src != dst)
        if bool(nvlink.any()):
            self.local_s = np.where(nvlink, self.size * 8 / nvlink_bps, 0.0)
            self.nvlink = nvlink

    @functools.cached_property
    def phase_of(self) -> IntArray:
        """Each transfer's phase, numbered densely from 0 (SimOptions.lockstep)."""
        phase = self.cols.phase
        if not phase.size:
            return np.zeros(0, dtype=np.intp)
        lo, hi = int(phase.min()), int(phase.max())
        if hi - lo > 4 * phase.size:  # sparse numbers: sort them
            _, inverse = np.unique(phase, return_inverse=True)
            return inverse.astype(np.intp).reshape(-1)
        # the usual numbering (0, 1, ... steps): a table from number to rank, no sort of every transfer
        shifted = (phase - lo).astype(np.intp, copy=False)
        present = np.zeros(hi - lo + 1, dtype=np.intp)
        present[shifted] = 1
        if bool(present.all()):  # every number from lo to hi used: already dense
            return shifted
        return (np.cumsum(present) - 1)[shifted]

    @functools.cached_property
    def phase_size(self) -> IntArray:
        """Each phase's transfer count."""
        return np.bincount(self.phase_of).astype(np.int64)

    @functools.cached_property
    def phase_members(self) -> tuple[IntArray, IntArray]:
        """(order, ptr): phase q's transfers are order[ptr[q]:ptr[q + 1]], ascending (lockstep)."""
        ph = self.phase_of
        if self.phases_in_order:
            order = np.arange(ph.size, dtype=np.intp)
        else:
            order = np.argsort(ph, kind="stable").astype(np.intp)
        return order, np.concatenate(([0], np.cumsum(self.phase_size))).astype(np.intp)

    @functools.cached_property
    def succ_count(self) -> IntArray:
        """Each transfer's successor count."""
        return np.diff(self.succ_ptr)

    @functools.cached_property
    def edge_src(self) -> IntArray:
        """Per successor edge (aligned with `succ`): the transfer it leaves."""
        return np.repeat(np.arange(self.size.size, dtype=np.intp), self.succ_count)

    @functools.cached_property
    def succ_same_sender(self) -> npt.NDArray[np.bool_]:
        """Per successor edge (aligned with `succ`): the successor has the same sending host as the
        transfer it depends on (an earlier send of that host, not data it received; cut-through)."""
        return np.asarray(self.src_host[self.succ] == self.src_host[self.edge_src])

    @functools.cached_property
    def phases_in_order(self) -> bool:
        """Phase numbers never fall along the transfers (a schedule's steps come in order)."""
        ph = self.phase_of
        return ph.size < 2 or bool((ph[1:] >= ph[:-1]).all())

    @functools.cached_property
    def phases_closed(self) -> bool:
        """No transfer depends on one of its own phase or a later one: under lockstep a phase's
        transfers then all begin together, when it opens (what a phase replay needs)."""
        ph = self.phase_of
        dep, dep_ptr = self.cols.dep, self.cols.dep_ptr
        if not dep.size:
            return True
        if self.phases_in_order:
            # Every dependency is an earlier transfer (`TransferColumns` requires it), so with phases
            # in order it is in an earlier phase exactly when it comes before its transfer's phase's
            # first transfer: each transfer's latest dependency, found in one pass over them, against
            # that first transfer (no per-edge lookup of phases)
            has = self.dep_count > 0
            last_dep = np.maximum.reduceat(dep, dep_ptr[:-1][has])
            first_of_phase = self.phase_members[1]
            return bool((last_dep < first_of_phase[ph[has]]).all())
        return bool((ph[self.succ] > np.repeat(ph, self.succ_count)).all())

    @functools.cached_property
    def tight_from(self) -> int:
        """The first phase p such that every transfer of every later phase depends on a transfer of
        the phase just before its own (a ring's steps: step s + 1 waits for step s). Without lockstep a
        phase replay needs it from its phase on (`phases.PhaseReplays`): then a phase that delivers all
        at one instant makes exactly the next phase ready, all of it, and nothing else."""
        ph = self.phase_of
        dep, dep_ptr = self.cols.dep, self.cols.dep_ptr
        has_prev = np.zeros(ph.size, dtype=np.bool_)
        if dep.size and self.phases_in_order and self.phases_closed:
            # (as in `phases_closed`) every dependency is in an earlier phase, and with phases in order
            # one is in the phase just before exactly when the latest is: at or after its first transfer
            has = self.dep_count > 0
            last_dep = np.maximum.reduceat(dep, dep_ptr[:-1][has])
            before = np.maximum(ph[has] - 1, 0)
            has_prev[has] = last_dep >= self.phase_members[1][before]
        elif dep.size:
            owner = np.repeat(np.arange(ph.size, dtype=np.intp), np.diff(dep_ptr))
            has_prev[owner[ph[dep] == ph[owner] - 1]] = True
        loose = ph[(ph > 0) & ~has_prev]
        return int(loose.max()) if loose.size else 0


class _Template:
    """One DAG on one placement on one lane: its `_Shape` (shared with the other lanes; its arrays
    referenced here too) and the host pairs it uses: `pair_keys` (lane, sender, receiver as one
    integer) and, once `locate_pairs` has run, `pair`: each transfer's pair index among all the run's
    pairs (-1: both ranks on one server)."""

    def __init__(self, shape: _Shape, dst: IntArray, n_hosts: int, lane: int = 0) -> None:
        self.shape = shape
        self.size, self.dep_count, self.roots = shape.size, shape.dep_count, shape.roots
        self.succ_ptr, self.succ = shape.succ_ptr, shape.succ
        # a pair's key: (lane, sender, receiver) in one integer
        self.keys = (lane * n_hosts + shape.src_host.astype(np.int64)) * n_hosts + dst
        self.pair_keys = np.unique(self.keys[shape.remote])
        self.pair = np.full(dst.size, -1, dtype=np.intp)

    @classmethod
    def of(cls, job: Job, fabric: Fabric, host_index: dict[str, int],
           shapes: dict[tuple[int, Placement], _Shape], server: IntArray | None = None) -> _Template:
        """The job's template; its shape from `shapes` (keyed by the DAG object's id and the placement)
        if another lane made it, else made and added there. `server`: each host index's server (None:
        one GPU per server)."""
        cols = job.columns
        rank_host = np.full(max(cols.ranks, default=0) + 1, -1, dtype=np.intp)
        for r in cols.ranks:
            host = job.placement.host(r)
            if host not in fabric.host_by_name:
                raise FlowSimError(f"rank {r} is placed on {host!r}, not a host of fabric {fabric.name!r}")
            rank_host[r] = host_index[host]
        if job.lane < 0:
            raise FlowSimError(f"job {job.dag.label or ''}: lane must be >= 0, got {job.lane}")
        dst = rank_host[cols.dst]
        key = (id(job.dag), job.placement)
        if key not in shapes:
            shapes[key] = _Shape(cols, rank_host[cols.src], dst, server, fabric.nvlink_bps)
        return cls(shapes[key], dst, len(host_index), job.lane)

    def locate_pairs(self, pair_key: IntArray) -> None:
        remote = self.shape.remote
        self.pair[remote] = np.searchsorted(pair_key, self.keys[remote])
        del self.keys



def job_templates(fabric: Fabric, jobs: list[Job]) -> tuple[list[_Template], list[int], tuple[int, ...]]:
    """The jobs checked (start times, placements, lanes) and their templates, one per distinct (DAG,
    placement, lane), those of one (DAG, placement) sharing a shape (a replay's calls of one collective
    share them): (templates, each job's template, each job's first transfer's number in the result)."""
    host_index = {h.name: i for i, h in enumerate(fabric.hosts)}
    server = (np.asarray([fabric.server_of(h.name) for h in fabric.hosts], dtype=np.intp)
              if fabric.gpus_per_server > 1 else None)
    templates: list[_Template] = []
    shapes: dict[tuple[int, Placement], _Shape] = {}
    by_key: dict[tuple[int, int, int], int] = {}
    job_tpl: list[int] = []
    offsets: list[int] = []
    n = 0
    for k, j in enumerate(jobs):
        if j.start_s < 0 or not math.isfinite(j.start_s):
            raise FlowSimError(f"job {j.dag.label or k}: start_s must be finite and >= 0")
        if not (j.hold_s >= 0 and math.isfinite(j.hold_s)) or (j.hold_s > 0 and len(j.dag)):
            raise FlowSimError(f"job {j.dag.label or k}: hold_s must be finite and >= 0, and only for a job "
                               f"without transfers, got {j.hold_s} with {len(j.dag)} transfers")
        key = (id(j.dag), id(j.placement), j.lane)  # (a placement by identity: hashing its host tuple per job cost
        # 1.2 s for 217k jobs of one placement; equal placements that are distinct objects only share less)
        if key not in by_key:
            by_key[key] = len(templates)
            templates.append(_Template.of(j, fabric, host_index, shapes, server))
        job_tpl.append(by_key[key])
        offsets.append(n)
        n += len(templates[by_key[key]].size)
    return templates, job_tpl, tuple(offsets)
