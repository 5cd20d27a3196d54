"""The event-driven executor: transfer DAGs run over a fabric as max-min fair flows.

Each job is a `TransferDag` placed on hosts (`Placement`), started at `start_s` or, if it lists jobs
in `after`, once those have all completed (whichever is later): a replay's collectives, each waiting
for the ones before it on its stream. A transfer
begins when every transfer it depends on has been delivered; between two hosts it is split evenly
over the pair's connections (`fabric.flowsim.connections`: the replay's NIC, plane and source-port
rule), and each part is one flow on the path the routing policy gives for its connection
(`RoutingPolicy.path`). A transfer between ranks on one host is delivered at once. A transfer is
delivered `per_transfer_s + per_hop_s x hops` after its last byte left (hops: links on its longest
part's path when it began); both are 0 by default, for a later calibration against the emulator.

Rates are the max-min fair shares of the flows active at the moment (`max_min_rates_on_paths`), recomputed
only when something changes: a flow starts or ends, or a link event (`LinkEvent`) is applied through
the policy's `on_link_change` and every active flow is re-routed on its connection's new path. So
the cost grows with the number of events, not with simulated time. A flow whose path is dropped (a
dead link with no live alternative) waits at rate 0 for a later event; if none comes, its transfer
is reported as stalled.

What is modelled: link capacities, routing (paths as the policy's data plane forwards them, ECMP
collisions included), fair sharing, dependencies, failures at given times. What is not: packets,
queues, buffers, TCP dynamics (slow start, loss recovery, the time a failure takes to detect), path
latency beyond the overhead parameters, the replay's cut-through forwarding (a transfer here waits
for its dependencies in full; for bandwidth-bound collectives with equal shares the times agree),
and transfers of one connection queueing in order (here they share the path's bandwidth).

How it runs (the cost): only the jobs running at the moment hold per-transfer state (a pool, reused
as jobs complete; jobs of one DAG share its arrays), so a replay of many calls needs the memory of
its concurrent calls, not of all of them; `SimOptions.transfer_times=False` keeps no per-transfer
times for the result either. Transfers are handled in batches (all that become ready at one instant) on
numpy arrays, flows too; every connection's path is one row of a padded array, recomputed only when
the routing changes (a link event or a congestion move). Max-min rates are memoised by the multiset of
active connections and the routing's version: the steps of a ring, whose flows are alike, compute
them once. So the Python work per event is independent of the number of flows, and the cost grows
with the number of distinct events.

Lockstep (`SimOptions.lockstep`): a collective's steps (the DAG's phases) open one after the other. A
ring's steps repeat one another: same host pairs, same sizes, so on an idle fabric the same flows,
rates and events, shifted in time. The first such phase is simulated event by event and watched; a
later one with the same routing version, pairs and sizes, beginning with no other flow active and no
timed event due before it would end, is replayed: its transfers delivered at the watched phase's
times and its load intervals logged again, in one event. Anything else (another job, a link event,
congestion polling) and the phase is simulated. Without lockstep the same replay applies where the
DAG's own dependencies make a phase run alone: its watched twin delivered everything at one instant,
and every later phase waits for the one before it (`_Shape.tight_from`); a ring whose flows all
get one rate (planned source ports) is such a DAG, one with ECMP collisions drifts apart and is
simulated step by step.

Congestion moves (`SimOptions.poll_s` > 0, for a policy that reacts to loads): every `poll_s` while
flows run, the policy's `on_loads` gets the current rate of every switch egress link and of every
slot (each flow's rate added at every decision point on its path, in the slot its source port
selects there), as the controller gets them from port and flow counters every poll; the slots it
moves re-route their flows at once. The rates are exact (no counter windows) and the move costs no
time. Rates are in bits per second, times in seconds.
"""
from __future__ import annotations

import functools
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.flowsim.connections import ConnectionTable, plan_connection_table, sorted_unique
from fabric.flowsim.maxmin import FloatArray, FlowSimError, IntArray, max_min_rates_on_paths
from fabric.flowsim.result import DirectedLinkName, FlowSimResult
from fabric.model import Fabric
from fabric.flowsim.routes import LinkRoutes
from fabric.routing.policy import RoutingPolicy
from fabric.transfers import Placement, TransferColumns, TransferDag

#: flows due to end within this share of the step are taken to end together with it
END_TOL = 1e-9
#: memoised max-min results kept at most, by total flows held
RATE_MEMO_FLOWS = 4_000_000
#: the per-link load log holds at most this many (interval, link) entries; beyond, its resolution is
#: halved (neighbouring intervals averaged, bytes kept): 8M entries are 128 MB
LOAD_LOG_ENTRIES = 8_000_000


@dataclass(frozen=True)
class Job:
    """One transfer DAG (either form) on hosts, started at `start_s`, and not before every job in
    `after` (indexes of earlier jobs in the same run) has completed."""

    dag: TransferDag | TransferColumns
    placement: Placement
    start_s: float = 0.0
    after: tuple[int, ...] = ()
    lane: int = 0  # the set of connections its transfers use (the replay's lane: one per stream of a trace)
    # its phases in lockstep (`SimOptions.lockstep`); None: as the options say
    lockstep: bool | None = None
    # phase sampling (an approximation for DAGs of many phases alike in shape but not in host pairs, such
    # as an all-to-all's rounds; needs lockstep): its phases in blocks of this many, the first of a block
    # to begin on an otherwise idle fabric simulated, the block's later ones replayed from it
    # (`_Run._sampled_replay`); 1: every phase simulated
    sample_phases: int = 1

    @property
    def columns(self) -> TransferColumns:
        return self.dag if isinstance(self.dag, TransferColumns) else self.dag.columns


@dataclass(frozen=True)
class LinkEvent:
    """The link at `switch`'s `port` goes down (or up) at `time_s`, both directions at once."""

    time_s: float
    switch: str
    port: int
    up: bool = False


@dataclass(frozen=True)
class SimProgress:
    """Where a run is (`simulate`'s `progress` callback): simulated time, jobs, events, rate computations,
    and each job's completion time so far (nan: not completed; a view, valid during the call)."""

    now_s: float
    jobs_done: int
    jobs: int
    events: int
    rate_updates: int
    job_end_s: FloatArray


#: a run reports its progress at most this often (wall seconds)
PROGRESS_EVERY_S = 0.5


@dataclass(frozen=True)
class SimOptions:
    channels: int = 2  # connections per plane per host pair (as the replay's --channels)
    ports: str = "planned"  # source ports: "planned" or "hashed" (as the replay's --ports)
    seed: int = 0  # for hashed source ports
    per_transfer_s: float = 0.0  # fixed delay per transfer (e.g. software overhead), seconds
    per_hop_s: float = 0.0  # latency per link of a transfer's path, seconds
    # congestion feedback: every poll_s of simulated time while flows run, the policy is given the
    # rates of every switch egress link and every slot (as the controller's port and flow counters give
    # them) and may move slots; 0: never (a policy without a load reaction is never polled)
    poll_s: float = 0.0
    # flows due to end within this long after the first to end are taken to end with it (their last
    # bits are dropped): transfers of one step whose sizes differ by a byte end as one event, not as
    # two that let the steps drift apart event by event; the error is at most this per event
    resolution_s: float = 1e-9
    # keep every transfer's start and end time for the result (`FlowSimResult.transfer_start_s`); off,
    # only the jobs' times are kept, and memory holds only the jobs that run at the moment
    transfer_times: bool = True
    # the share of a link's rate that carries the transfers' bytes (the rest: packet headers, ACKs), for
    # a calibration against the emulator (TCP over Ethernet at MTU 1500: ~1448 / 1514); 1: all of it
    goodput_share: float = 1.0
    # bulk-synchronous steps: a transfer begins only once every transfer of its job in an earlier
    # phase (the DAG's `phase`, a collective's step) has been delivered, as well as its own
    # dependencies. An approximation for scale: a ring's steps then start together, so flows that
    # ECMP collisions slow do not drift apart event by event (each step repeats the one before, and
    # its rates come from the memo). Not exact: a step that could overlap the next one waits. A phase
    # that begins on an idle fabric with the same host pairs and sizes as an earlier one is replayed
    # from it (one event instead of its flows' events; same times, same loads)
    lockstep: bool = False
    # cut-through, as the replay's agents forward (`traffic.replay.agent`): a transfer may begin once
    # each transfer it depends on has begun (received data is forwarded as it arrives) or, for the same
    # sender's earlier sends, has been sent; it is delivered no earlier than those it depends on; and a
    # host pair's transfers take its connections one after another, in order (each connection's parts
    # are sent in turn). The per-transfer delay then holds the pair before the first byte (the agent's
    # work per transfer), the per-hop delay is the latency between the last byte sent and delivered.
    # Off: store and forward (a transfer waits for its dependencies in full; it is delivered both
    # delays after its last byte), and transfers of one pair share its connections at once. Not with
    # lockstep
    cut_through: bool = False

    def check(self) -> None:
        if self.cut_through and self.lockstep:
            raise FlowSimError("cut_through and lockstep exclude each other (lockstep waits for whole steps)")
        if self.per_transfer_s < 0 or self.per_hop_s < 0:
            raise FlowSimError(f"overheads must be >= 0, got per_transfer_s={self.per_transfer_s}, "
                               f"per_hop_s={self.per_hop_s}")
        if not (0 <= self.resolution_s <= 1e-3):
            raise FlowSimError(f"resolution_s must be in [0, 1 ms], got {self.resolution_s}")
        if not 0 < self.goodput_share <= 1:
            raise FlowSimError(f"goodput_share must be in (0, 1], got {self.goodput_share}")
        if not (self.poll_s >= 0 and math.isfinite(self.poll_s)):
            raise FlowSimError(f"poll_s must be finite and >= 0, got {self.poll_s}")


def directed_links(fabric: Fabric) -> tuple[tuple[DirectedLinkName, ...], FloatArray]:
    """Every directed link (from node, to node) of the fabric and its capacity in bits per second."""
    names: list[DirectedLinkName] = []
    caps: list[float] = []
    for link in fabric.links:
        for a, b in ((link.a.node, link.b.node), (link.b.node, link.a.node)):
            names.append((a, b))
            caps.append(link.rate_gbps * 1e9)
    return tuple(names), np.asarray(caps)


def simulate(fabric: Fabric, policy: RoutingPolicy, jobs: Sequence[Job], *, options: SimOptions | None = None,
             link_events: Sequence[LinkEvent] = (), connections: ConnectionTable | None = None,
             routes: tuple[IntArray, IntArray] | None = None,
             progress: Callable[[SimProgress], None] | None = None) -> FlowSimResult:
    """Run `jobs` over `fabric` with `policy` routing (module docstring). The policy is driven by the
    link events (its state changes): give it a fresh one per run. `connections`: the host pairs'
    connections, if already planned (`plan_connection_table` with the options' channels, ports and
    seed, for at least the jobs' pairs); else planned here. `routes`: their paths with the policy as
    given (`LinkRoutes.rows` of every connection), if already walked; else walked as they are used.
    `progress` is called every `PROGRESS_EVERY_S` of wall time while it runs, and once at the end."""
    opts = options or SimOptions()
    opts.check()
    if policy.table.fabric is not fabric:
        raise FlowSimError(f"the policy routes fabric {policy.table.fabric.name!r}, not the one given")
    if routes is not None and connections is None:
        raise FlowSimError("routes are given for the connections they were walked for: give those too")
    return _Run(fabric, policy, list(jobs), opts, list(link_events), connections, routes, progress).run()


#: phase replays (lockstep) kept at most, by total transfers held
PHASE_MEMO_TRANSFERS = 4_000_000
#: replay phases that repeat an earlier one (`_Run._phase_replay`); off: every phase simulated
PHASE_REPLAY = True
#: a phase's sizes are looked up by size >> this (a ring's chunks differ by a byte from step to step);
#: a match must then be within the resolution (`_Run._phase_replay`)
PHASE_SIZE_SHIFT = 6
#: sampled chains whose load intervals are kept for later calls of their collective, at most
CHAIN_LOADS_KEPT = 4096
#: `deps_left` of a transfer a chain of replayed phases began: it never reaches 0 again
CHAINED = 1 << 60


@dataclass
class _PhaseWatch:
    """A lockstep phase running on an otherwise idle fabric, watched so that its run can be replayed:
    its key (routing version, pairs and sizes in key order), job, phase, transfers in key order, start,
    and the load intervals logged meanwhile (start and end offsets, links, rates)."""

    key: tuple[int, bytes, bytes]
    job: int
    phase: int
    g: IntArray
    start_s: float
    loads: list[tuple[float, float, IntArray, FloatArray]]
    events: int
    sampled: bool = False  # the simulated phase of its block (`Job.sample_phases`): `g` in DAG order


@dataclass(frozen=True)
class _PhaseRun:
    """What a watched phase did: its duration, each transfer's size and delivery (offset from the
    start), in key order, how many bytes each may differ by in a replay, the load intervals, and how
    many events it took."""

    duration_s: float
    size: IntArray
    end_off_s: FloatArray
    slack_bytes: FloatArray
    loads: tuple[tuple[float, float, IntArray, FloatArray], ...]
    events: int

    def fits(self, size: IntArray) -> bool:
        """Whether a phase of these sizes (in key order) runs as this one did, to within the resolution."""
        return bool((np.abs(size - self.size) <= self.slack_bytes).all())


def _slack_bytes(resolution_s: float, size: IntArray, end_off_s: FloatArray) -> FloatArray:
    """How many bytes each transfer of a watched phase may differ by in a replay: a transfer's rate only
    grows while its phase runs (max-min shares, flows only leaving), so d bytes more or fewer move its end
    by at most d / (its mean rate): within the resolution for d <= resolution x size / time, the
    simulator's own tolerance for ends taken together."""
    slack = np.zeros(size.size)
    np.divide(resolution_s * size, end_off_s, out=slack, where=end_off_s > 0)
    return slack


#: the pool's arrays (`_Run`): one entry per transfer of every job that has started and not completed
_POOL = {"t_size": np.int64, "t_job": np.intp, "t_pair": np.intp,
         "deps_left": np.int64, "start_s": np.float64, "end_s": np.float64, "parts_left": np.int64,
         "hops": np.int64, "wait_left": np.int64, "sent_s": np.float64}


class _Shape:
    """What every job of one DAG on one placement shares, whatever its lane: its transfers' sizes,
    dependency counts, successors (CSR), the transfers without dependencies, the sending host of
    each, which are remote (sender and receiver on different hosts); the phases (lockstep only,
    computed on first use). A replay's collective on two streams (lanes) is one shape: at 16,384
    GPUs a hierarchical all-reduce's shape holds ~1 GB."""

    def __init__(self, cols: TransferColumns, src: IntArray, dst: IntArray) -> None:
        self.cols = cols  # kept: the run keys shapes by the DAG object's id
        self.size = cols.size_bytes
        self.dep_count = np.diff(cols.dep_ptr)
        self.succ_ptr, self.succ = cols.successors()
        self.roots = np.flatnonzero(self.dep_count == 0).astype(np.intp)
        self.src_host = src
        self.remote = src != dst

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
        phase replay needs it from its phase on (`_Run._phase_replay`): then a phase that delivers all
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
    pairs (-1: both ranks on one host)."""

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
           shapes: dict[tuple[int, Placement], _Shape]) -> _Template:
        """The job's template; its shape from `shapes` (keyed by the DAG object's id and the placement)
        if another lane made it, else made and added there."""
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
            shapes[key] = _Shape(cols, rank_host[cols.src], dst)
        return cls(shapes[key], dst, len(host_index), job.lane)

    def locate_pairs(self, pair_key: IntArray) -> None:
        remote = self.shape.remote
        self.pair[remote] = np.searchsorted(pair_key, self.keys[remote])
        del self.keys


class _Run:
    """One simulation's state, as arrays: transfers by their index in the pool (the jobs running at
    the moment, each in a range from `base[job]`; in the result, job offset + index in its DAG),
    connections by id, active flows in parallel arrays (a flow is one part of a transfer)."""

    def __init__(self, fabric: Fabric, policy: RoutingPolicy, jobs: list[Job], opts: SimOptions,
                 events: list[LinkEvent], connections: ConnectionTable | None = None,
                 routes: tuple[IntArray, IntArray] | None = None,
                 progress: Callable[[SimProgress], None] | None = None) -> None:
        self.fabric, self.policy, self.jobs, self.opts = fabric, policy, jobs, opts
        self.progress = progress
        self.next_report_s = 0.0
        # a transfer's hops (`hops`) are kept only where they cost time (a per-hop delay)
        self.per_hop = opts.per_hop_s > 0
        self.links, self.capacity_bps = directed_links(fabric)
        self.goodput_bps = self.capacity_bps * opts.goodput_share  # what the transfers' bytes may use
        self.link_id = {l: i for i, l in enumerate(self.links)}
        host_index = {h.name: i for i, h in enumerate(fabric.hosts)}
        # per distinct (DAG, placement): its transfers' hosts, sizes, dependency counts and successors
        # (a replay's calls of one collective share them); the jobs' state lives in a pool (below)
        self.templates: list[_Template] = []
        shapes: dict[tuple[int, Placement], _Shape] = {}
        by_key: dict[tuple[int, Placement, int], int] = {}
        self.job_tpl: list[int] = []
        offsets: list[int] = []
        n = 0
        for k, j in enumerate(jobs):
            if j.start_s < 0 or not math.isfinite(j.start_s):
                raise FlowSimError(f"job {j.dag.label or k}: start_s must be finite and >= 0")
            key = (id(j.dag), j.placement, j.lane)
            if key not in by_key:
                by_key[key] = len(self.templates)
                self.templates.append(_Template.of(j, fabric, host_index, shapes))
            self.job_tpl.append(by_key[key])
            offsets.append(n)
            n += len(self.templates[by_key[key]].size)
        self.offsets = tuple(offsets)
        self.lock = [opts.lockstep if j.lockstep is None else j.lockstep for j in jobs]
        for k, j in enumerate(jobs):
            if j.sample_phases < 1:
                raise FlowSimError(f"job {j.dag.label or k}: sample_phases must be >= 1, got {j.sample_phases}")
            if j.sample_phases > 1 and not self.lock[k]:
                raise FlowSimError(f"job {j.dag.label or k}: phase sampling needs lockstep")
        if opts.cut_through and any(self.lock):
            raise FlowSimError("cut_through and lockstep exclude each other (lockstep waits for whole steps)")
        # phase sampling: per (template, block), what the block's simulated phase did (calls of one
        # collective share them: a later call's blocks all run as the first call's did)
        # (its routing version, its run; transfers in DAG order)
        self.sample_runs: dict[tuple[int, int], tuple[int, _PhaseRun]] = {}
        # (template, first phase, phases, routing version) -> a replayed chain's load interval
        self.chain_loads: dict[tuple[int, int, int, int], tuple[tuple[float, float, IntArray, FloatArray], ...]] = {}
        self.phases_sampled = 0
        # the pool: the state of the transfers of every job that has started and not completed, each
        # job in a contiguous range of it (`self.base`), reused once the job has completed
        self.cap = 0
        self.t_job = self.t_pair = np.zeros(0, dtype=np.intp)
        self.t_size = self.deps_left = self.parts_left = self.hops = self.wait_left = np.zeros(0, dtype=np.int64)
        self.start_s = self.end_s = self.sent_s = np.zeros(0)
        self._grow(0)  # each its own array
        self.base: dict[int, int] = {}  # active job -> its first index in the pool
        self.kept_start: dict[int, FloatArray] = {}  # completed job -> its transfers' times (transfer_times)
        self.kept_end: dict[int, FloatArray] = {}
        # lockstep: per running job, its open phase (every earlier one delivered), the transfers each
        # phase has left, and the ready transfers of later phases held back, by phase
        self.open_phase: dict[int, int] = {}
        # phase replays (`_phase_replay`): the phase being watched, what watched phases did, replays due
        self.watch: _PhaseWatch | None = None
        self.phase_memo: dict[tuple[int, bytes, bytes], _PhaseRun] = {}
        self.phase_memo_transfers = 0
        # replays due, by event: (phases as (transfers, start, delivery offsets), each one's load intervals,
        # whether sampled)
        self.replays: dict[int, tuple[list[tuple[IntArray, float, FloatArray]],
                                      list[tuple[tuple[float, float, IntArray, FloatArray], ...]], bool]] = {}
        self.phases_replayed = 0
        self.phase_left: dict[int, IntArray] = {}
        self.held: dict[int, dict[int, list[IntArray]]] = {}
        # jobs
        self.waiting = [len(set(j.after)) for j in jobs]  # jobs still to complete before this one may start
        self.dependents: list[list[int]] = [[] for _ in jobs]
        for k, j in enumerate(jobs):
            for a in sorted(set(j.after)):
                if not 0 <= a < k:
                    raise FlowSimError(f"job {k} ({j.dag.label or 'unlabelled'}) waits for job {a}: "
                                       f"a job may wait only for earlier jobs (0..{k - 1})")
                self.dependents[a].append(k)
        self.left = np.asarray([len(j.dag) for j in jobs], dtype=np.int64)  # transfers not yet delivered
        self.job_begun_s = np.full(len(jobs), np.nan)
        self.job_done_s = np.full(len(jobs), np.nan)
        # connections: per host pair (lane, sender, receiver) a contiguous range of ids, as arrays
        pair_keys = np.unique(np.concatenate([np.zeros(0, dtype=np.int64), *(t.pair_keys for t in self.templates)]))
        if connections is None:
            connections = plan_connection_table(fabric, policy.entropy, pair_keys, channels=opts.channels,
                                                ports=opts.ports, seed=opts.seed)
        elif connections.fabric is not fabric or not bool(np.isin(pair_keys, connections.pair_key).all()):
            raise FlowSimError("the connections given were planned for other host pairs or another fabric")
        self.ct = connections
        self.pair_key = connections.pair_key.astype(np.intp)
        self.pair_ptr = connections.pair_ptr
        n_conns = len(connections)
        # cut-through: the transfer sending on each pair (-1: none) and those queued behind it, in order
        self.pair_busy = np.full(self.pair_key.size, -1, dtype=np.intp)
        self.pair_queue: dict[int, deque[int]] = {}
        for t in self.templates:
            t.locate_pairs(self.pair_key)
        # every connection's path: a row of link indexes padded with -1 (all -1: dropped), walked on
        # arrays (`LinkRoutes`) when first used and after every routing change; `routes`, if given, are
        # every connection's with the policy as it is now (fresh until the first routing change)
        self.routes = LinkRoutes(fabric, policy, self.links)
        if routes is not None:
            if routes[0].shape[0] != n_conns or routes[1].shape != (n_conns,):
                raise FlowSimError(f"routes for {routes[0].shape[0]} connections given, {n_conns} planned")
            self.conn_path, self.conn_hops = routes[0], routes[1].astype(np.int64)
            self.conn_fresh = np.ones(n_conns, dtype=bool)
        else:
            self.conn_path = np.full((n_conns, 1), -1, dtype=np.intp)
            self.conn_hops = np.zeros(n_conns, dtype=np.int64)
            self.conn_fresh = np.zeros(n_conns, dtype=bool)
        self.width = self.conn_path.shape[1]
        self.route_version = 0
        # each directed link's first node (the switch it leaves; the congestion feedback's decision points)
        self.link_from = tuple(a for a, _ in self.links)
        # active flows
        self.f_conn = np.zeros(0, dtype=np.intp)
        self.f_transfer = np.zeros(0, dtype=np.intp)
        self.f_left_bits = np.zeros(0)
        self.rates = np.zeros(0)
        self.load = (np.zeros(0, dtype=np.intp), np.zeros(0))  # (links, rates) of the current allocation
        self.dirty = True
        self.memo: dict[tuple[int, bytes], tuple[FloatArray, IntArray, FloatArray]] = {}
        self.memo_flows = 0
        # timed events: (time, order, kind, payload); kinds: 0 link event, 1 job start, 2 delivery of a
        # batch of transfers (payload: index into self.batches), 3 poll, 4 a replayed phase's end
        # (payload: index into self.replays), 5 transfers done with their per-transfer delay (cut-through;
        # payload: index into self.batches)
        self.heap: list[tuple[float, int, int, int]] = []
        self.batches: dict[int, IntArray] = {}
        self.seq = 0
        self.link_events = sorted(events, key=lambda e: e.time_s)
        for i, e in enumerate(self.link_events):
            if e.time_s < 0 or not math.isfinite(e.time_s):
                raise FlowSimError(f"link event {e}: time_s must be finite and >= 0")
            self._push(e.time_s, 0, i)
        for i, j in enumerate(jobs):
            if not self.waiting[i]:
                self._push(j.start_s, 1, i)
        self.now = 0.0
        self.edges: list[float] = []
        self.ptr: list[int] = [0]
        # once coarsened (`_coarsen`): the log's intervals last at least bin_s, the open one's bits per
        # link add up in acc_bits until acc_to
        self.bin_s = 0.0
        self.acc_bits: FloatArray = np.zeros(0)  # allocated at the first coarsening
        self.acc_to = 0.0
        self.load_link: list[IntArray] = []  # per interval
        self.load_bps: list[FloatArray] = []
        self.rate_updates = 0
        self.route_changes = 0
        self.events = 0  # instants at which something happened (flows ended, timed events)
        self.coarsened = 0  # times the load log's resolution was halved (LOAD_LOG_ENTRIES)
        # congestion feedback: (switch, port) of each directed link leaving a switch
        self.egress_key: list[tuple[str, int] | None] = []
        for here, there in self.links:
            self.egress_key.append((here, fabric.port_towards(here, there)) if here in fabric.switch_by_name else None)
        reacts = type(policy).react_to_loads is not RoutingPolicy.react_to_loads
        self.poll_s = opts.poll_s if reacts else 0.0
        self.poll_pending = False
        self.polls = 0
        self.congestion_moves = 0

    def _push(self, time_s: float, kind: int, payload: int) -> None:
        heapq.heappush(self.heap, (time_s, self.seq, kind, payload))
        self.seq += 1

    # ---- routing -------------------------------------------------------------------------------
    def _route(self, ids: IntArray) -> None:
        """(Re)compute the paths of connections `ids` that are not fresh for the current routing."""
        stale = ids[~self.conn_fresh[ids]]
        if not stale.size:
            return
        c = sorted_unique(stale)
        rows, n_links = self.routes.rows(self.ct.src_nic[c], self.ct.dst_nic[c], self.ct.sport[c], self.width)
        if rows.shape[1] > self.width:
            pad = np.full((self.conn_path.shape[0], rows.shape[1] - self.width), -1, dtype=np.intp)
            self.conn_path = np.hstack([self.conn_path, pad])
            self.width = rows.shape[1]
        self.conn_path[c] = rows
        self.conn_hops[c] = n_links
        self.conn_fresh[c] = True

    def _reroute_all(self) -> None:
        self.conn_fresh[:] = False
        self.routes.reset()
        self.route_version += 1
        self._route(self.f_conn)
        self.dirty = True

    # ---- transfers -----------------------------------------------------------------------------
    def _begin(self, g: IntArray) -> None:
        """Transfers `g` (their dependencies delivered) begin now."""
        if self.opts.cut_through:
            self._begin_ct(g)
            return
        # a work list, not recursion: transfers with nothing to send (0 bytes, or both ranks on one
        # host) are delivered at once, and a chain of thousands of them (a trace's empty
        # collectives, one after another) must not exhaust Python's stack. `phased`: whether the
        # batch may be a lockstep phase (what `_begin` was called with, or what zero-byte transfers
        # drained into; what local transfers make ready runs on as before).
        # (the same order as recursion: what zero-byte transfers make ready begins, and all that
        # follows from it, before the local transfers of the batch are delivered)
        todo: list[tuple[IntArray, bool, bool]] = [(g, True, False)]  # (transfers, phased, deliver first)
        while todo:
            g, phased, deliver = todo.pop()
            if deliver:
                g = self._deliver(g)
            if not g.size:
                continue
            if phased and PHASE_REPLAY:
                self.watch = None  # whatever was watched no longer runs alone
                if self._phase_replay(g):
                    continue
            self.start_s[g] = self.now
            local = g[self.t_pair[g] < 0]
            g = g[self.t_pair[g] >= 0]
            if local.size:
                todo.append((local, False, True))
            if g.size:
                empty = self._start_flows(g)
                if empty.size:
                    now_ = self._drained_now(empty)
                    if now_.size:
                        todo.append((self._deliver(now_), True, False))

    def _start_flows(self, g: IntArray) -> IntArray:
        """Transfers `g` (between two hosts) start sending now: one flow per connection of their pair;
        returns those with nothing to send (0 bytes)."""
        pair = self.t_pair[g]
        lo, hi = self.pair_ptr[pair], self.pair_ptr[pair + 1]
        k = hi - lo  # connections per transfer
        if k[0] == k[-1] and bool((k == k[0]).all()):  # the usual case: as many for every pair
            # one row per transfer, one column per connection of its pair
            w = int(k[0])
            j = np.arange(w)
            part_t = np.repeat(g, w)
            conn = (lo[:, None] + j).ravel()
            base, extra = np.divmod(self.t_size[g], w)
            part_bytes = (base[:, None] + (j < extra[:, None])).ravel()
            self._route(conn)
            keep = part_bytes > 0
            if w == 1:  # (numpy's reductions along a short axis cost ~0.1 ms a call: not for one column)
                if self.per_hop:
                    self.hops[g] = self.conn_hops[conn]
                self.parts_left[g] = keep
            else:
                hops = self.conn_hops[conn].reshape(-1, w)
                kept = keep.reshape(-1, w)
                most, count = hops[:, 0].copy(), kept[:, 0].astype(np.int64)
                for c in range(1, w):
                    np.maximum(most, hops[:, c], out=most)
                    count += kept[:, c]
                if self.per_hop:
                    self.hops[g] = most
                self.parts_left[g] = count
        else:
            part_t = np.repeat(g, k)  # one row per (transfer, connection)
            jk = np.arange(part_t.size) - np.repeat(np.cumsum(k) - k, k)  # connection's rank in its pair
            conn = np.repeat(lo, k) + jk
            base, extra = np.divmod(self.t_size[g], k)
            part_bytes = np.repeat(base, k) + (jk < np.repeat(extra, k))
            self._route(conn)
            if self.per_hop:
                self.hops[g] = np.maximum.reduceat(self.conn_hops[conn], np.cumsum(k) - k)
            keep = part_bytes > 0
            self.parts_left[g] = np.add.reduceat(keep.astype(np.int64), np.cumsum(k) - k)
        if keep.any():
            if not self.f_conn.size and keep.all():  # the usual case after a ring's step
                self.f_conn, self.f_transfer, self.f_left_bits = conn, part_t, part_bytes * 8.0
            else:
                self.f_conn = np.concatenate([self.f_conn, conn[keep]])
                self.f_transfer = np.concatenate([self.f_transfer, part_t[keep]])
                self.f_left_bits = np.concatenate([self.f_left_bits, part_bytes[keep] * 8.0])
            self.dirty = True
            if self.poll_s > 0 and not self.poll_pending:
                self.poll_pending = True
                self._push(self.now + self.poll_s, 3, 0)
        return g[self.parts_left[g] == 0]

    # ---- cut-through (SimOptions.cut_through) ----------------------------------------------------
    def _begin_ct(self, g: IntArray, granted: IntArray | None = None) -> None:
        """Cut-through: transfers `g` may begin (`SimOptions.cut_through`); those whose pair is busy
        queue behind it. `granted`: transfers taken off their pair's queue, which hold it already."""
        todo: list[tuple[IntArray, bool]] = [(g, False)]
        if granted is not None:
            todo.append((granted, True))
        while todo:
            g, holds = todo.pop()
            if not g.size:
                continue
            if not holds:
                g = self._fifo(g)
                if not g.size:
                    continue
            self.start_s[g] = self.now
            remote = self.t_pair[g] >= 0
            local = g[~remote]
            if remote.any() and self.opts.per_transfer_s > 0:
                # the per-transfer delay holds the pair before the first byte (`_setup_done`)
                self.batches[self.seq] = g[remote]
                self._push(self.now + self.opts.per_transfer_s, 5, self.seq)
                started = local
            else:
                started = g
            todo.extend(self._sending(started))

    def _sending(self, g: IntArray) -> list[tuple[IntArray, bool]]:
        """Cut-through: transfers `g` start sending now (those between hosts as flows); returns what
        may begin because of it, as `_begin_ct`'s work items."""
        remote = self.t_pair[g] >= 0
        sent = self._start_flows(g[remote]) if remote.any() else g[:0]
        out = [(self._released(g, same_sender=False), False)]
        for done in (g[~remote], sent):  # nothing to send: sent at once
            if done.size:
                more, freed = self._sent_ct(done)
                out += [(more, False), (freed, True)]
        return out

    def _setup_done(self, g: IntArray) -> None:
        """Cut-through: transfers `g` have held their pairs for the per-transfer delay: they send now."""
        for batch, holds in self._sending(g):
            if holds:
                self._begin_ct(batch[:0], batch)
            else:
                self._begin_ct(batch)

    def _fifo(self, g: IntArray) -> IntArray:
        """Of transfers `g`, those that may start sending now: one per pair whose connections are free
        (the first in order); the others queue behind, in order. A queued pair is busy."""
        pair = self.t_pair[g]
        remote = np.flatnonzero(pair >= 0)
        if not remote.size:
            return g
        rp = pair[remote]
        first = np.zeros(rp.size, dtype=bool)
        first[np.unique(rp, return_index=True)[1]] = True
        free = first & (self.pair_busy[rp] < 0)
        hold = remote[~free]
        for i in hold.tolist():
            self.pair_queue.setdefault(int(pair[i]), deque()).append(int(g[i]))
        self.pair_busy[rp[free]] = g[remote[free]]
        if not hold.size:
            return g
        keep = np.ones(g.size, dtype=bool)
        keep[hold] = False
        return g[keep]

    def _sent_ct(self, g: IntArray) -> tuple[IntArray, IntArray]:
        """Cut-through: transfers `g` have sent their last byte (or are local): each one's pair goes to
        the next transfer queued on it, the same sender's later sends waiting for them may begin, and
        they are delivered once everything they depend on is (after the overheads). Returns (released
        successors, transfers granted their pair)."""
        self.sent_s[g] = self.now
        remote = g[self.t_pair[g] >= 0]
        granted: list[int] = []
        if remote.size:
            pairs = self.t_pair[remote]
            self.pair_busy[pairs] = -1
            for p in pairs.tolist():
                queue = self.pair_queue.get(p)
                if queue:
                    t = queue.popleft()
                    self.pair_busy[p] = t
                    granted.append(t)
                    if not queue:
                        del self.pair_queue[p]
        released = self._released(g, same_sender=True)
        self._deliver_due(g[self.wait_left[g] == 0])
        return released, np.asarray(granted, dtype=np.intp)

    def _released(self, g: IntArray, same_sender: bool) -> IntArray:
        """Cut-through: the successors of transfers `g` whose dependencies have all begun (or been sent,
        for the same sender's earlier sends) once those on `g` count: the edges to a successor with
        the same sender (`same_sender`) or with another one."""
        out = []
        for job, mine in self._by_job(g):
            tpl, edge = self._out_edges(job, mine)
            edge = edge[tpl.shape.succ_same_sender[edge] == same_sender]
            nxt = tpl.succ[edge] + self.base[job]
            np.subtract.at(self.deps_left, nxt, 1)
            out.append(nxt[self.deps_left[nxt] == 0])
        if not out:
            return np.zeros(0, dtype=np.intp)
        return sorted_unique(out[0] if len(out) == 1 else np.concatenate(out))

    def _delay_ct(self, g: IntArray) -> FloatArray:
        """Cut-through: the delay between a transfer's last byte sent and its delivery: the path's
        latency (the per-transfer delay was spent holding the pair before the first byte)."""
        return self._hop_delay(g)

    def _hop_delay(self, g: IntArray) -> FloatArray:
        """The per-hop latency of transfers `g`'s paths (their longest connection's)."""
        if not self.per_hop:
            return np.zeros(g.size)
        return np.asarray(self.opts.per_hop_s * self.hops[g], dtype=np.float64)

    def _deliver_due(self, g: IntArray) -> None:
        """Transfers `g`, sent and with all they depend on delivered: delivered after the path latency."""
        if not g.size:
            return
        now_ = self._after(g, self._delay_ct(g))
        if now_.size:
            self._deliver(now_)

    def _after(self, g: IntArray, delay: npt.NDArray[np.floating]) -> IntArray:
        """Transfers `g` are delivered `delay` from now: those with a delay as timed events (one per
        distinct delay); returns those without, to deliver now."""
        later = g[delay > 0]
        if later.size:
            d = delay[delay > 0]
            for value in np.unique(d).tolist():
                self.batches[self.seq] = later[d == value]
                self._push(self.now + value, 2, self.seq)
        return g[delay <= 0]

    def _deliver_ct(self, g: IntArray) -> None:
        """Cut-through: transfers `g` are delivered now; those sent and waiting only for them follow
        (after their overheads; at once if none)."""
        work = [g]
        while work:
            g = work.pop()
            if not g.size:
                continue
            self.end_s[g] = self.now
            groups = self._by_job(g)
            due = []
            for job, mine in groups:
                tpl, edge = self._out_edges(job, mine)
                if edge.size:
                    nxt = tpl.succ[edge] + self.base[job]
                    np.subtract.at(self.wait_left, nxt, 1)
                    due.append(sorted_unique(nxt[(self.wait_left[nxt] == 0) & ~np.isnan(self.sent_s[nxt])]))
            self._finished(groups)
            if due:
                waiting = np.concatenate(due)
                work.append(self._after(waiting, self._delay_ct(waiting)))

    # ---- phase replays (lockstep) ----------------------------------------------------------------
    def _phase_replay(self, g: IntArray) -> bool:
        """Transfers `g` begin now. If they are one whole phase of one job, beginning on an idle
        fabric (no other flow, no congestion polling), the phase runs as any identical phase before it
        ran: same routing version, same host pairs, same sizes (so the same flows, rates, events and
        deliveries, shifted in time). A ring's steps are such phases: the first is simulated event by
        event and watched (`_PhaseWatch`), the others are replayed from it in one timed event
        (`_phase_replayed`), unless some other event falls inside the phase. Returns True if the phase
        is replayed.

        Without lockstep (the DAG's own dependencies), a phase is replayed only from a watched run
        that delivered every transfer at one instant (`_watch_delivered`), and only where every later
        phase is tight (`_Shape.tight_from`): then nothing begins while it runs, and when it ends
        exactly the next phase begins, all of it, as under lockstep. A ring whose flows all get the
        same rate (planned source ports) is such a DAG; where they do not, its steps drift apart and
        are all simulated."""
        if self.f_conn.size:
            return False
        of = self.t_job[g]
        job = int(of[0])
        if of[-1] != job or not bool((of == job).all()):
            return False
        tpl = self.templates[self.job_tpl[job]]
        if not tpl.shape.phases_closed:
            return False
        phase = tpl.shape.phase_of[g - self.base[job]]
        p = int(phase[0])
        pair = self.t_pair[g]
        if g.size != tpl.shape.phase_size[p] or not bool((phase == p).all()) or bool((pair < 0).any()):
            return False
        if self.jobs[job].sample_phases > 1:
            return self._sampled_replay(job, tpl, p)
        if self.poll_s > 0:
            return False
        if not self.lock[job] and p < tpl.shape.tight_from:
            return False
        g, key = self._phase_key(g)
        run = self.phase_memo.get(key)
        if run is None or not run.fits(self.t_size[g]):
            self.watch = _PhaseWatch(key, job, p, g, self.now, [], self.events)
            return False
        end_s = self.now + run.duration_s
        next_event_s = self.heap[0][0] if self.heap else math.inf
        if next_event_s <= end_s:  # something else happens meanwhile: simulate it
            return False
        def alike(h: IntArray) -> IntArray | None:  # (the same pairs: none local, as the first)
            h, key_q = self._phase_key(h)
            return h if key_q == key and run.fits(self.t_size[h]) else None

        chain, end_s = self._chain(job, tpl, p, g, run, next_event_s, len(tpl.shape.phase_size), alike)
        self.replays[self.seq] = (chain, [run.loads] * len(chain), False)
        self._push(end_s, 4, self.seq)
        return True

    def _chain(self, job: int, tpl: _Template, p: int, g: IntArray, run: _PhaseRun, next_event_s: float,
               stop: int, alike: Callable[[IntArray], IntArray | None]) -> tuple[list[tuple[IntArray, float,
                                                                                           FloatArray]], float]:
        """Phase `p` of `job` (its transfers `g`, in `run`'s order) begins now and runs as `run` ran; so do
        the phases after it, before phase `stop`, one after another while each is `alike` (which gives its
        transfers in `run`'s order, or None) and ends before `next_event_s`. With the phases closed, all of
        a phase's dependencies are in earlier phases, so under lockstep the whole phase begins when the one
        before delivers its last transfer. Returns the chain (transfers, start, delivery offsets) and its
        end."""
        self.start_s[g] = self.now
        chain = [(g, self.now, run.end_off_s)]
        end_s = self.now + run.duration_s
        order, ptr = tpl.shape.phase_members
        base = self.base[job]
        held = self.held.get(job, {})
        q = p + 1
        while q < stop and end_s + run.duration_s < next_event_s and ptr[q + 1] - ptr[q] == g.size:
            h = alike(order[ptr[q]:ptr[q + 1]] + base)
            if h is None:
                break
            held.pop(q, None)  # (what waited for this phase begins with it, here)
            self.start_s[h] = end_s
            # never ready again: begun here (their dependencies are delivered with the chain's)
            self.deps_left[h] = CHAINED
            chain.append((h, end_s, run.end_off_s))
            end_s += run.duration_s
            q += 1
        return chain, end_s

    def _sampled_replay(self, job: int, tpl: _Template, p: int) -> bool:
        """Phase sampling (`Job.sample_phases` = k): phase `p` of `job` begins now, whole, on an otherwise
        idle fabric. If the simulated phase of its block (phases k x b .. k x b + k - 1) is known, on the
        same routing, with as many transfers and sizes that fit, `p` and the block's phases after it run
        as that one ran, transfer for transfer in DAG order (each delivered at its counterpart's offset
        from the phase's start), one after another as far as no other event falls inside; their bytes
        are logged on their own connections' paths, evenly over the chain. Otherwise `p` is
        simulated and watched: it becomes its block's. The simulated phases are kept per template (DAG,
        placement and lane) and block: a later call of the same collective runs all its blocks from them.
        Returns True if `p` is replayed.

        What it assumes: a phase of a block takes as long, and delivers in the same order, as the one
        simulated, although its host pairs differ (an all-to-all's rounds: rank q sends to q + k in
        round k). What it keeps exact: every byte on its own path (the links' loads), the dependencies,
        and everything that does not run alone (another job, a link event, a poll)."""
        k = self.jobs[job].sample_phases
        order, ptr = tpl.shape.phase_members
        h = order[ptr[p]:ptr[p + 1]] + self.base[job]
        version, run = self.sample_runs.get((self.job_tpl[job], p // k), (-1, None))
        if run is None or version != self.route_version or run.size.size != h.size or not run.fits(self.t_size[h]):
            # (a sampled watch's key holds only the routing version: its phase is matched by block, not pairs)
            self.watch = _PhaseWatch((self.route_version, b"", b""), job, p, h, self.now, [], self.events,
                                     sampled=True)
            return False
        next_event_s = self.heap[0][0] if self.heap else math.inf
        if next_event_s <= self.now + run.duration_s:  # something else happens meanwhile: simulate it
            return False

        def alike(hq: IntArray) -> IntArray | None:
            return hq if run.fits(self.t_size[hq]) and not bool((self.t_pair[hq] < 0).any()) else None

        chain, end_s = self._chain(job, tpl, p, h, run, next_event_s, min(len(ptr) - 1, (p // k + 1) * k), alike)
        # the chain's bytes on their own paths, evenly over it (one interval: a chain is at most a block of
        # phases, far shorter than the report's bins); the same chain of a later call logs the same
        key = (self.job_tpl[job], p, len(chain), self.route_version)
        loads = self.chain_loads.get(key)
        if loads is None:
            loads = self._own_loads(np.concatenate([g for g, _, _ in chain]), end_s - self.now)
            if len(self.chain_loads) >= CHAIN_LOADS_KEPT:
                self.chain_loads.clear()
            self.chain_loads[key] = loads
        self.replays[self.seq] = (chain, [loads] + [()] * (len(chain) - 1), True)
        self._push(end_s, 4, self.seq)
        return True

    def _own_loads(self, g: IntArray, duration_s: float) -> tuple[tuple[float, float, IntArray, FloatArray], ...]:
        """Transfers `g`'s bytes as one load interval of `duration_s` on their connections' paths (the
        parts split as `_start_flows` splits them): ((0, duration, links, bits per second),)."""
        if not duration_s > 0:
            return ()
        pair = self.t_pair[g]
        lo, hi = self.pair_ptr[pair], self.pair_ptr[pair + 1]
        k = hi - lo
        jk = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
        conn = np.repeat(lo, k) + jk
        each, extra = np.divmod(self.t_size[g], k)
        part_bits = (np.repeat(each, k) + (jk < np.repeat(extra, k))) * 8.0
        self._route(conn)
        rows = self.conn_path[conn]
        on = rows >= 0
        bits = np.bincount(rows[on], weights=np.broadcast_to(part_bits[:, None], rows.shape)[on],
                           minlength=len(self.links))
        used = np.flatnonzero(bits > 0).astype(np.intp)
        return ((0.0, duration_s, used, bits[used] / duration_s),)

    def _phase_key(self, g: IntArray) -> tuple[IntArray, tuple[int, bytes, bytes]]:
        """Transfers `g` (one phase) in key order, and the key of a phase replay: the routing version,
        the host pairs and the sizes (to within 2**PHASE_SIZE_SHIFT bytes)."""
        pair = self.t_pair[g]
        size = self.t_size[g]
        if not bool((pair[1:] > pair[:-1]).all()):  # (a ring's step has its pairs in order already)
            order = np.lexsort((size, pair))
            g, pair, size = g[order], pair[order], size[order]
        return g, (self.route_version, pair.tobytes(), (size >> PHASE_SIZE_SHIFT).tobytes())

    def _phase_replayed(self, payload: int) -> None:
        """Replayed phases end now: their load intervals logged, their transfers delivered at their times."""
        chain, loads, sampled = self.replays.pop(payload)
        end_s = self.now
        for (_, start_s, _), intervals in zip(chain, loads):
            for t0, t1, used, rate in intervals:
                self.now = start_s + t0
                self.load = (used, rate)
                self._record(start_s + t1)
        self.now = end_s
        self.load = (np.zeros(0, dtype=np.intp), np.zeros(0))
        if sampled:
            self.phases_sampled += len(chain)
        else:
            self.phases_replayed += len(chain)
        g = np.concatenate([g for g, _, _ in chain])
        self._begin(self._deliver(g, np.concatenate([start_s + off for _, start_s, off in chain])))

    def _watch_delivered(self, g: IntArray) -> None:
        """Without lockstep: transfers `g` are delivered now while a phase is watched. The watch is
        kept (`_watched_phase_done`) only if they are the whole watched phase, delivered at one
        instant; anything else ends it."""
        w = self.watch
        if w is not None and g.size == w.g.size and bool((np.sort(g) == np.sort(w.g)).all()):
            self._watched_phase_done()
        self.watch = None

    def _watched_phase_done(self) -> None:
        """The watched phase has delivered its last transfer: remember what it did."""
        w, self.watch = self.watch, None
        if w is None:
            return
        end_off = self.end_s[w.g] - w.start_s
        size = self.t_size[w.g].copy()
        run = _PhaseRun(self.now - w.start_s, size, end_off, _slack_bytes(self.opts.resolution_s, size, end_off),
                        tuple(w.loads), self.events - w.events)
        if w.sampled:  # its loads are not replayed (a block's phases log their own bytes)
            self.sample_runs[(self.job_tpl[w.job], w.phase // self.jobs[w.job].sample_phases)] = (w.key[0], run)
            return
        if self.phase_memo_transfers + w.g.size > PHASE_MEMO_TRANSFERS:
            self.phase_memo.clear()
            self.phase_memo_transfers = 0
        self.phase_memo[w.key] = run
        self.phase_memo_transfers += w.g.size

    def _drained(self, g: IntArray) -> None:
        """Transfers `g` sent their last byte now: delivered after the overheads."""
        if self.opts.cut_through:
            released, granted = self._sent_ct(g)
            self._begin_ct(released, granted)
            return
        now_ = self._drained_now(g)
        if now_.size:
            self._begin(self._deliver(now_))

    def _drained_now(self, g: IntArray) -> IntArray:
        """Store and forward: of transfers `g`, which sent their last byte now, those delivered now
        (no overheads); the others are delivered after them (`_after`)."""
        if not self.per_hop and self.opts.per_transfer_s <= 0:  # no overheads: all of them now
            return g
        return self._after(g, self.opts.per_transfer_s + self._hop_delay(g))

    def _by_job(self, g: IntArray) -> list[tuple[int, IntArray]]:
        """Transfers `g` (pool indexes) grouped by job: (job, its transfers among `g`)."""
        of = self.t_job[g]
        if of.size and of[0] == of[-1] and bool((of == of[0]).all()):  # the usual batch: one job
            return [(int(of[0]), g)]
        return [(job, g[of == job]) for job in np.unique(of).tolist()]

    def _out_edges(self, job: int, mine: IntArray) -> tuple[_Template, IntArray]:
        """`job`'s template and the indexes (into its `succ`) of the edges leaving transfers `mine`."""
        tpl = self.templates[self.job_tpl[job]]
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

    def _finished(self, groups: list[tuple[int, IntArray]]) -> None:
        """The jobs of delivered transfers (`_by_job`'s groups): those with none left complete."""
        for job, mine in groups:
            self.left[job] -= mine.size
            if not self.left[job]:
                self._job_done(job)
                self._release(job)

    def _deliver(self, g: IntArray, end_s: FloatArray | None = None) -> IntArray:
        """Transfers `g` are delivered now (their delivery times: `end_s` if given, a replayed phase's);
        returns the transfers that became ready (to begin)."""
        if self.opts.cut_through:
            self._deliver_ct(g)
            return np.zeros(0, dtype=np.intp)
        self.end_s[g] = self.now if end_s is None else end_s
        if self.watch is not None and not self.lock[self.watch.job]:
            self._watch_delivered(g)
        groups = self._by_job(g)
        ready = []
        for job, mine in groups:
            tpl, edge = self._out_edges(job, mine)
            if self.lock[job]:
                released = self._phases_delivered(job, tpl, mine - self.base[job])
                if released is not None:
                    ready.append(released)
            if edge.size:
                nxt = tpl.succ[edge] + self.base[job]
                np.subtract.at(self.deps_left, nxt, 1)
                nxt = nxt[self.deps_left[nxt] == 0]
                ready.append(self._gate(job, tpl, nxt) if self.lock[job] else nxt)
        self._finished(groups)
        if not ready:
            return np.zeros(0, dtype=np.intp)
        return sorted_unique(ready[0] if len(ready) == 1 else np.concatenate(ready))

    def _gate(self, job: int, tpl: _Template, ready: IntArray) -> IntArray:
        """Lockstep: of the ready transfers `ready` (pool indexes) of `job`, those of its open phase or
        earlier; the others are held until their phase opens."""
        phase = tpl.shape.phase_of[ready - self.base[job]]
        now_open = self.open_phase[job]
        later = phase > now_open
        if not later.any():
            return ready
        held = self.held[job]
        for p in np.unique(phase[later]).tolist():
            held.setdefault(p, []).append(ready[phase == p])
        return ready[~later]

    def _phases_delivered(self, job: int, tpl: _Template, local: IntArray) -> IntArray | None:
        """Lockstep: transfers `local` (indexes in the job's DAG) of `job` were delivered; if that
        completes its open phase, open the next (and any already complete) and return the held
        transfers that may begin now."""
        left = self.phase_left[job]
        phase = tpl.shape.phase_of[local]
        if phase.size and phase[0] == phase[-1] and bool((phase == phase[0]).all()):  # the usual batch: one phase
            left[phase[0]] -= phase.size
        else:
            np.subtract.at(left, phase, 1)
        p = self.open_phase[job]
        if left[p]:
            return None
        if self.watch is not None and self.watch.job == job and self.watch.phase == p:
            self._watched_phase_done()
        while p < left.size and not left[p]:
            p += 1
        self.open_phase[job] = p
        held = self.held[job]
        out = [a for q in sorted(q for q in held if q <= p) for a in held.pop(q)]
        return np.concatenate(out) if out else None

    def _job_done(self, j: int) -> None:
        self.job_done_s[j] = self.now
        for k in self.dependents[j]:
            self.waiting[k] -= 1
            if not self.waiting[k]:
                self._push(max(self.now, self.jobs[k].start_s), 1, k)

    def _allocate(self, j: int, n: int) -> int:
        """A range of n free pool entries for job j (the first gap between active jobs that fits, or
        the end, the pool grown as needed); returns its first index."""
        at = 0
        for b, size in sorted((self.base[k], len(self.templates[self.job_tpl[k]].size)) for k in self.base):
            if b - at >= n:
                break
            at = max(at, b + size)
        if at + n > self.cap:
            self._grow(max(at + n, 2 * self.cap))
        self.base[j] = at
        return at

    def _grow(self, cap: int) -> None:
        """The pool's arrays at `cap` entries, what they hold kept."""
        for name, dtype in _POOL.items():
            old = getattr(self, name)
            grown = np.zeros(cap, dtype=dtype)
            grown[:old.size] = old[:cap]
            setattr(self, name, grown)
        self.cap = cap

    def _release(self, j: int) -> None:
        """Job j completed: keep its transfers' times (if asked) and free its pool range."""
        base = self.base.pop(j)
        n = len(self.templates[self.job_tpl[j]].size)
        self.open_phase.pop(j, None)
        self.phase_left.pop(j, None)
        self.held.pop(j, None)
        if self.opts.transfer_times:
            self.kept_start[j] = self.start_s[base:base + n].copy()
            self.kept_end[j] = self.end_s[base:base + n].copy()

    def _start_job(self, j: int) -> None:
        self.job_begun_s[j] = self.now
        self.watch = None
        if not self.left[j]:  # an empty DAG completes as it starts
            self._job_done(j)
            return
        tpl = self.templates[self.job_tpl[j]]
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
        if self.opts.cut_through:
            self.wait_left[part] = tpl.dep_count
            self.sent_s[part] = np.nan
        roots = tpl.roots + base
        if self.lock[j]:
            self.open_phase[j] = 0
            self.phase_left[j] = tpl.shape.phase_size.copy()
            self.held[j] = {}
            roots = self._gate(j, tpl, roots)
        self._begin(roots)

    # ---- rates ---------------------------------------------------------------------------------
    def _update_rates(self) -> None:
        order = np.argsort(self.f_conn, kind="stable")
        key = (self.route_version, self.f_conn[order].tobytes())
        found = self.memo.get(key)
        if found is not None:
            hit = found
        else:
            sorted_rates: FloatArray = np.zeros(len(order))
            has_path = self.conn_hops[self.f_conn[order]] > 0
            routed = order[has_path]
            pos = np.flatnonzero(has_path)
            if routed.size:
                sorted_rates[pos], load = max_min_rates_on_paths(self.conn_path[self.f_conn[routed]],
                                                                 self.goodput_bps)
                self.rate_updates += 1
                used: IntArray = np.flatnonzero(load > 0).astype(np.intp)
                used_bps: FloatArray = np.asarray(load[used], dtype=np.float64)
                hit = (sorted_rates, used, used_bps)
            else:
                hit = (sorted_rates, np.zeros(0, dtype=np.intp), np.zeros(0))
            if self.memo_flows + len(order) > RATE_MEMO_FLOWS:
                self.memo.clear()
                self.memo_flows = 0
            self.memo[key] = hit
            self.memo_flows += len(order)
        self.rates = np.empty(len(order))
        self.rates[order] = hit[0]
        self.load = (hit[1], hit[2])
        self.dirty = False

    def _record(self, until_s: float) -> None:
        """Log the link loads from now until `until_s` (one interval; once the log has been coarsened,
        added to the open interval, `_record_coarse`)."""
        used, rate = self.load
        if until_s <= self.now or not used.size:
            return
        if self.watch is not None:
            w = self.watch
            w.loads.append((self.now - w.start_s, until_s - w.start_s, used, rate))
        if self.bin_s:
            self._record_coarse(used, rate, until_s)
            return
        if self.edges and self.edges[-1] == self.now and self.load_link and self.load_link[-1] is used:
            self.edges[-1] = until_s  # the same allocation as the interval before: one interval
            return
        if self.edges and self.edges[-1] != self.now:
            self._idle_interval(self.now)
        if not self.edges:
            self.edges.append(self.now)
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

    def _record_coarse(self, used: IntArray, rate: FloatArray, until_s: float) -> None:
        """The coarse log: loads add up, as bits per link, in the open interval (from the log's last
        edge), closed once it is `bin_s` long; an idle gap of at least `bin_s` is an interval of its own."""
        if self.now - self.acc_to >= self.bin_s:  # an idle gap since the last load
            if self.acc_to > self.edges[-1]:
                self._close_bin(self.acc_to)
            self._idle_interval(self.now)
            self.acc_to = self.now
        self.acc_bits[used] += rate * (until_s - self.now)
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

    def _flush_log(self) -> None:
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
        n_links = len(self.links)
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

    def _advance(self, until_s: float) -> None:
        if self.f_conn.size and until_s > self.now:
            self._record(until_s)
            # never below 0: a flow whose end rounds to just before the event advanced to would
            # otherwise be left owing -1e-9 bits, with a negative time to finish that is never reached
            self.f_left_bits = np.maximum(0.0, self.f_left_bits - self.rates * (until_s - self.now))
        self.now = until_s

    def _finish_flows(self, done: IntArray) -> None:
        ended = self.f_transfer[done]
        np.subtract.at(self.parts_left, ended, 1)
        t = sorted_unique(ended)
        drained = t[self.parts_left[t] == 0]
        if done.size == self.f_conn.size:  # every flow ended (a ring's step)
            self.f_conn, self.f_transfer = self.f_conn[:0], self.f_transfer[:0]
            self.f_left_bits, self.rates = self.f_left_bits[:0], self.rates[:0]
        else:
            keep = np.ones(self.f_conn.size, dtype=bool)
            keep[done] = False
            self.f_conn, self.f_transfer = self.f_conn[keep], self.f_transfer[keep]
            self.f_left_bits, self.rates = self.f_left_bits[keep], self.rates[keep]
        self.dirty = True
        if drained.size:
            self._drained(drained)

    # ---- congestion feedback -------------------------------------------------------------------
    def _poll(self) -> None:
        """The congestion feedback (module docstring): link and slot rates to the policy."""
        self.poll_pending = False
        if not self.f_conn.size:
            return
        if self.dirty:
            self._update_rates()
        self.polls += 1
        load = np.zeros(len(self.links))
        load[self.load[0]] = self.load[1]
        port_rates = {k: float(load[i]) for i, k in enumerate(self.egress_key) if k is not None}
        per_conn = np.bincount(self.f_conn, weights=self.rates, minlength=len(self.ct))
        slot_rates: dict[tuple[str, str, int], float] = {}
        pol = self.policy
        nics = self.fabric.nic_ports
        for c in np.flatnonzero(per_conn > 0).tolist():
            rate, sport = float(per_conn[c]), int(self.ct.sport[c])
            dest = nics[int(self.ct.dst_nic[c])].switch
            # the switches before the destination's: where the path's links 1 .. hops - 2 leave
            for link in self.conn_path[c, 1:self.conn_hops[c] - 1].tolist():
                node = self.link_from[link]
                if pol.is_decision(node, dest):
                    key = (node, dest, pol.entropy.slot(pol.tier(node), sport))
                    slot_rates[key] = slot_rates.get(key, 0.0) + rate
        moves = pol.on_loads(port_rates, slot_rates, self.now)
        if moves:
            self.congestion_moves += len(moves)
            self._reroute_all()
        self.poll_pending = True
        self._push(self.now + self.poll_s, 3, 0)

    def _link_event(self, e: LinkEvent) -> None:
        self.watch = None
        self.policy.on_link_change(e.switch, e.port, e.up, self.now)
        self.route_changes += 1
        self._reroute_all()

    # ---- the loop ------------------------------------------------------------------------------
    def _only_polls(self) -> bool:
        """Nothing but polls is pending, and no flow moves: a poll cannot make a flow without a path move."""
        return all(kind == 3 for _, _, kind, _ in self.heap)

    def _report(self) -> None:
        if self.progress is not None:
            self.next_report_s = time.monotonic() + PROGRESS_EVERY_S
            done = int(np.count_nonzero(~np.isnan(self.job_done_s)))
            self.progress(SimProgress(self.now, done, len(self.jobs), self.events, self.rate_updates,
                                      self.job_done_s))

    def run(self) -> FlowSimResult:
        self.next_report_s = time.monotonic() + PROGRESS_EVERY_S
        while True:
            if self.progress is not None and time.monotonic() >= self.next_report_s:
                self._report()
            if self.dirty:
                self._update_rates()
            next_event = self.heap[0][0] if self.heap else math.inf
            done = np.zeros(0, dtype=np.intp)
            step = math.inf
            if self.f_conn.size:
                moving = self.rates > 0
                finish = None
                if moving.all():  # the usual case: every flow has a path
                    finish = self.f_left_bits / self.rates
                elif moving.any():
                    finish = np.full(self.f_conn.size, np.inf)
                    finish[moving] = self.f_left_bits[moving] / self.rates[moving]
                if finish is not None:
                    step = float(finish.min())
                    if self.now + step <= next_event:
                        done = np.flatnonzero(finish <= step + max(step * END_TOL, self.opts.resolution_s))
            if step == math.inf and (next_event == math.inf or self._only_polls()):
                break  # nothing moves and nothing will happen: finished, or stalled
            self.events += 1
            if done.size:
                self._advance(self.now + step)
                self._finish_flows(done)
                continue
            self._advance(next_event)
            while self.heap and self.heap[0][0] <= self.now:
                _, _, kind, payload = heapq.heappop(self.heap)
                if kind == 0:
                    self._link_event(self.link_events[payload])
                elif kind == 1:
                    self._start_job(payload)
                elif kind == 2:
                    self._begin(self._deliver(self.batches.pop(payload)))
                elif kind == 4:
                    self._phase_replayed(payload)
                elif kind == 5:
                    self._setup_done(self.batches.pop(payload))
                else:
                    self._poll()
        self._flush_log()
        self._report()
        return self._result()

    def _result(self) -> FlowSimResult:
        starts: list[FloatArray] = []
        ends: list[FloatArray] = []
        stalled: list[IntArray] = []
        for j in range(len(self.jobs)):
            n = len(self.templates[self.job_tpl[j]].size)
            if j in self.base:  # started, never completed: its undelivered transfers stalled
                part = slice(self.base[j], self.base[j] + n)
                start, end = self.start_s[part].copy(), self.end_s[part].copy()
                stalled.append(self.offsets[j] + np.flatnonzero(np.isnan(end)))
            elif j in self.kept_start:
                start, end = self.kept_start[j], self.kept_end[j]
            else:
                start, end = np.full(n, np.nan), np.full(n, np.nan)
                if self.left[j]:  # never started (it waited for a job that never completed)
                    stalled.append(self.offsets[j] + np.arange(n))
            if self.opts.transfer_times:
                starts.append(start)
                ends.append(end)
        return FlowSimResult(
            links=self.links, capacity_bps=self.capacity_bps, job_offsets=self.offsets,
            job_start_s=self.job_begun_s, job_end_s=self.job_done_s,
            transfer_start_s=np.concatenate([np.zeros(0), *starts]),
            transfer_end_s=np.concatenate([np.zeros(0), *ends]),
            edges_s=np.asarray(self.edges, dtype=float), load_ptr=np.asarray(self.ptr, dtype=np.intp),
            load_link=np.concatenate([np.zeros(0, dtype=np.intp), *self.load_link]),
            load_bps=np.concatenate([np.zeros(0), *self.load_bps]),
            rate_updates=self.rate_updates, route_changes=self.route_changes, polls=self.polls, events=self.events,
            coarsened=self.coarsened,
            congestion_moves=self.congestion_moves, phases_replayed=self.phases_replayed,
            phases_sampled=self.phases_sampled,
            stalled=tuple(int(g) for g in np.concatenate([np.zeros(0, dtype=np.intp), *stalled])))
