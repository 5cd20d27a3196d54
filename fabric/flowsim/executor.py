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

Rates are the max-min fair shares of the flows active at the moment (`max_min_rates`), recomputed
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

Congestion moves (`SimOptions.poll_s` > 0, for a policy that reacts to loads): every `poll_s` while
flows run, the policy's `on_loads` gets the current rate of every switch egress link and of every
slot (each flow's rate added at every decision point on its path, in the slot its source port
selects there), as the controller gets them from port and flow counters every poll; the slots it
moves re-route their flows at once. The rates are exact (no counter windows) and the move costs no
time. Rates are in bits per second, times in seconds.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fabric.flowsim.connections import Connection, plan_connections
from fabric.flowsim.maxmin import FloatArray, FlowSimError, IntArray, max_min_rates
from fabric.flowsim.result import DirectedLinkName, FlowSimResult
from fabric.model import Fabric
from fabric.routing.policy import RoutingPolicy
from fabric.transfers import Placement, TransferDag, split_bytes

#: flows due to end within this share of the step are taken to end together with it
END_TOL = 1e-9


@dataclass(frozen=True)
class Job:
    """One transfer DAG on hosts, started at `start_s`, and not before every job in `after` (indexes
    of earlier jobs in the same run) has completed."""

    dag: TransferDag
    placement: Placement
    start_s: float = 0.0
    after: tuple[int, ...] = ()


@dataclass(frozen=True)
class LinkEvent:
    """The link at `switch`'s `port` goes down (or up) at `time_s`, both directions at once."""

    time_s: float
    switch: str
    port: int
    up: bool = False


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

    def check(self) -> None:
        if self.per_transfer_s < 0 or self.per_hop_s < 0:
            raise FlowSimError(f"overheads must be >= 0, got per_transfer_s={self.per_transfer_s}, "
                               f"per_hop_s={self.per_hop_s}")
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
             link_events: Sequence[LinkEvent] = ()) -> FlowSimResult:
    """Run `jobs` over `fabric` with `policy` routing (module docstring). The policy is driven by the
    link events (its state changes): give it a fresh one per run."""
    opts = options or SimOptions()
    opts.check()
    if policy.table.fabric is not fabric:
        raise FlowSimError(f"the policy routes fabric {policy.table.fabric.name!r}, not the one given")
    return _Run(fabric, policy, list(jobs), opts, list(link_events)).run()


class _Run:
    """One simulation's state. Flows are parts of transfers, kept in parallel lists by flow id."""

    def __init__(self, fabric: Fabric, policy: RoutingPolicy, jobs: list[Job], opts: SimOptions,
                 events: list[LinkEvent]) -> None:
        self.fabric, self.policy, self.jobs, self.opts = fabric, policy, jobs, opts
        self.links, self.capacity_bps = directed_links(fabric)
        self.link_id = {l: i for i, l in enumerate(self.links)}
        offsets: list[int] = []
        n = 0
        for j in jobs:
            if j.start_s < 0 or not math.isfinite(j.start_s):
                raise FlowSimError(f"job {j.dag.label or len(offsets)}: start_s must be finite and >= 0")
            for r in j.dag.ranks:
                host = j.placement.host(r)
                if host not in fabric.host_by_name:
                    raise FlowSimError(f"rank {r} is placed on {host!r}, not a host of fabric {fabric.name!r}")
            offsets.append(n)
            n += len(j.dag)
        self.waiting = [len(set(j.after)) for j in jobs]  # jobs still to complete before this one may start
        self.dependents: list[list[int]] = [[] for _ in jobs]
        for k, j in enumerate(jobs):
            for a in sorted(set(j.after)):
                if not 0 <= a < k:
                    raise FlowSimError(f"job {k} ({j.dag.label or 'unlabelled'}) waits for job {a}: "
                                       f"a job may wait only for earlier jobs (0..{k - 1})")
                self.dependents[a].append(k)
        self.left = [len(j.dag) for j in jobs]  # transfers not yet delivered, per job
        self.job_begun_s = np.full(len(jobs), np.nan)
        self.job_done_s = np.full(len(jobs), np.nan)
        self.offsets = tuple(offsets)
        self.n = n
        self.job_of = [j for j, job in enumerate(jobs) for _ in job.dag.transfers]  # transfer -> its job
        pairs = {(j.placement.host(t.src), j.placement.host(t.dst)) for j in jobs for t in j.dag.transfers}
        self.conns = plan_connections(fabric, policy.entropy, {p for p in pairs if p[0] != p[1]},
                                      channels=opts.channels, ports=opts.ports, seed=opts.seed)
        self.path_of: dict[int, IntArray | None] = {}  # connection id -> its links now (None: dropped)
        self.nodes_of: dict[int, tuple[str, ...]] = {}  # connection id -> its path's nodes now
        # (switch, port) of each directed link leaving a switch, for the congestion feedback
        self.egress_key: list[tuple[str, int] | None] = []
        for here, there in self.links:
            self.egress_key.append((here, fabric.port_towards(here, there)) if here in fabric.switch_by_name else None)
        reacts = type(policy).react_to_loads is not RoutingPolicy.react_to_loads
        self.poll_s = opts.poll_s if reacts else 0.0
        self.poll_pending = False
        self.polls = 0
        self.congestion_moves = 0
        self.start_s = np.full(n, np.nan)
        self.end_s = np.full(n, np.nan)
        self.deps_left = [len(t.deps) for j in jobs for t in j.dag.transfers]
        self.parts_left = [0] * n
        self.hops = [0] * n
        # active flows
        self.f_conn: list[Connection] = []
        self.f_transfer: list[int] = []
        self.f_left_bits: list[float] = []
        self.f_links: list[IntArray | None] = []
        self.rates = np.zeros(0)
        self.dirty = True
        # timed events: (time, order, kind, payload); kinds: 0 link event, 1 job start, 2 delivery, 3 poll
        self.heap: list[tuple[float, int, int, int]] = []
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
        self.load_link: list[IntArray] = []  # per interval
        self.load_bps: list[FloatArray] = []
        self.rate_updates = 0
        self.route_changes = 0

    def _push(self, time_s: float, kind: int, payload: int) -> None:
        heapq.heappush(self.heap, (time_s, self.seq, kind, payload))
        self.seq += 1

    # ---- transfers -----------------------------------------------------------------------------
    def _where(self, g: int) -> tuple[Job, int]:
        j = self.job_of[g]
        return self.jobs[j], g - self.offsets[j]

    def _begin(self, g: int) -> None:
        job, i = self._where(g)
        t = job.dag.transfers[i]
        self.start_s[g] = self.now
        a, b = job.placement.host(t.src), job.placement.host(t.dst)
        if a == b:
            self._deliver(g)
            return
        conns = self.conns[(a, b)]
        parts = [(c, size) for c, size in zip(conns, split_bytes(t.size_bytes, len(conns))) if size > 0]
        hops = 0
        for c, size in parts:
            links = self._path(c)
            hops = max(hops, 0 if links is None else len(links))
            self.f_conn.append(c)
            self.f_transfer.append(g)
            self.f_left_bits.append(size * 8.0)
            self.f_links.append(links)
        if not parts:  # a 0-byte transfer: only the overheads
            hops = max((len(links) for c in conns if (links := self._path(c)) is not None), default=0)
        self.hops[g] = hops
        self.parts_left[g] = len(parts)
        self.dirty = True
        if parts and self.poll_s > 0 and not self.poll_pending:
            self.poll_pending = True
            self._push(self.now + self.poll_s, 3, 0)
        if not parts:
            self._drained(g)

    def _drained(self, g: int) -> None:
        delay = self.opts.per_transfer_s + self.opts.per_hop_s * self.hops[g]
        if delay > 0:
            self._push(self.now + delay, 2, g)
        else:
            self._deliver(g)

    def _deliver(self, g: int) -> None:
        """Transfer `g` is delivered now; start whatever it was the last dependency of."""
        todo = [g]
        while todo:
            g = todo.pop()
            self.end_s[g] = self.now
            job, i = self._where(g)
            base = g - i
            j = self.job_of[g]
            self.left[j] -= 1
            if not self.left[j]:
                self._job_done(j)
            for s in job.dag.successors[i]:
                self.deps_left[base + s] -= 1
                if self.deps_left[base + s] == 0:
                    self._begin(base + s)

    def _job_done(self, j: int) -> None:
        self.job_done_s[j] = self.now
        for k in self.dependents[j]:
            self.waiting[k] -= 1
            if not self.waiting[k]:
                self._push(max(self.now, self.jobs[k].start_s), 1, k)

    def _start_job(self, j: int) -> None:
        self.job_begun_s[j] = self.now
        if not self.left[j]:  # an empty DAG completes as it starts
            self._job_done(j)
            return
        base = self.offsets[j]
        for i in range(len(self.jobs[j].dag)):
            if self.deps_left[base + i] == 0 and math.isnan(self.start_s[base + i]):
                self._begin(base + i)

    # ---- routing -------------------------------------------------------------------------------
    def _path(self, c: Connection) -> IntArray | None:
        if c.id not in self.path_of:
            nodes = self.policy.path(c.src, c.dst, c.sport)
            self.nodes_of[c.id] = nodes or ()
            self.path_of[c.id] = None if nodes is None else np.asarray(
                [self.link_id[(u, v)] for u, v in itertools.pairwise(nodes)], dtype=np.intp)
        return self.path_of[c.id]

    def _reroute_all(self) -> None:
        self.path_of.clear()
        self.nodes_of.clear()
        self.f_links = [self._path(c) for c in self.f_conn]
        self.dirty = True

    def _poll(self) -> None:
        """The congestion feedback (module docstring): link and slot rates to the policy."""
        self.poll_pending = False
        if not self.f_conn:
            return
        if self.dirty:
            self._update_rates()
        self.polls += 1
        load = np.zeros(len(self.links))
        routed, paths = self._routed()
        if routed:
            np.add.at(load, np.concatenate(paths), np.repeat(self.rates[routed], [len(p) for p in paths]))
        port_rates = {k: float(load[i]) for i, k in enumerate(self.egress_key) if k is not None}
        slot_rates: dict[tuple[str, str, int], float] = {}
        pol = self.policy
        for f, c in enumerate(self.f_conn):
            rate = float(self.rates[f])
            if rate <= 0:
                continue
            dest = c.dst.switch
            for node in self.nodes_of.get(c.id, ())[1:-2]:  # the switches before the destination's
                if pol.is_decision(node, dest):
                    key = (node, dest, pol.entropy.slot(pol.tier(node), c.sport))
                    slot_rates[key] = slot_rates.get(key, 0.0) + rate
        moves = pol.on_loads(port_rates, slot_rates, self.now)
        if moves:
            self.congestion_moves += len(moves)
            self._reroute_all()
        self.poll_pending = True
        self._push(self.now + self.poll_s, 3, 0)

    def _link_event(self, e: LinkEvent) -> None:
        self.policy.on_link_change(e.switch, e.port, e.up, self.now)
        self.route_changes += 1
        self._reroute_all()

    # ---- the loop ------------------------------------------------------------------------------
    def _routed(self) -> tuple[list[int], list[IntArray]]:
        """The active flows that have a path, and their paths."""
        flows = [f for f, links in enumerate(self.f_links) if links is not None]
        return flows, [links for links in self.f_links if links is not None]

    def _update_rates(self) -> None:
        routed, paths = self._routed()
        self.rates = np.zeros(len(self.f_conn))
        if routed:
            flow = np.repeat(np.arange(len(routed)), [len(p) for p in paths])
            self.rates[routed] = max_min_rates(len(routed), flow, np.concatenate(paths), self.capacity_bps)
            self.rate_updates += 1
        self.dirty = False

    def _record(self, until_s: float) -> None:
        """Log the link loads from now until `until_s` (one interval)."""
        routed, paths = self._routed()
        if until_s <= self.now or not routed:
            return
        link = np.concatenate(paths)
        weight = np.repeat(self.rates[routed], [len(p) for p in paths])
        load = np.bincount(link, weights=weight, minlength=len(self.links)).astype(np.float64)
        used = np.flatnonzero(load > 0).astype(np.intp)
        if self.edges and self.edges[-1] != self.now:
            self.ptr.append(self.ptr[-1])  # an idle gap: an interval with no load
            self.edges.append(self.now)
        if not self.edges:
            self.edges.append(self.now)
        self.edges.append(until_s)
        self.load_link.append(used)
        self.load_bps.append(load[used])
        self.ptr.append(self.ptr[-1] + used.size)

    def _advance(self, until_s: float) -> None:
        if self.f_conn and until_s > self.now:
            self._record(until_s)
            dt = until_s - self.now
            # never below 0: a flow whose end rounds to just before the event advanced to would
            # otherwise be left owing -1e-9 bits, with a negative time to finish that is never reached
            self.f_left_bits = [max(0.0, left - r * dt) for left, r in zip(self.f_left_bits, self.rates)]
        self.now = until_s

    def _finish_flows(self, done: list[int]) -> None:
        drained = []
        for f in done:
            g = self.f_transfer[f]
            self.parts_left[g] -= 1
            if self.parts_left[g] == 0:
                drained.append(g)
        keep = sorted(set(range(len(self.f_conn))) - set(done))
        self.f_conn = [self.f_conn[f] for f in keep]
        self.f_transfer = [self.f_transfer[f] for f in keep]
        self.f_left_bits = [self.f_left_bits[f] for f in keep]
        self.f_links = [self.f_links[f] for f in keep]
        self.rates = self.rates[keep]
        self.dirty = True
        for g in drained:
            self._drained(g)

    def run(self) -> FlowSimResult:
        while True:
            if self.dirty:
                self._update_rates()
            next_event = self.heap[0][0] if self.heap else math.inf
            done: list[int] = []
            step = math.inf
            if self.f_conn:
                moving = self.rates > 0
                if moving.any():
                    left = np.asarray(self.f_left_bits)
                    finish = np.full(len(self.f_conn), np.inf)
                    finish[moving] = left[moving] / self.rates[moving]
                    step = float(finish.min())
                    if self.now + step <= next_event:
                        done = [int(f) for f in np.flatnonzero(finish <= step * (1 + END_TOL))]
            if step == math.inf and (next_event == math.inf or self._only_polls()):
                break  # nothing moves and nothing will happen: finished, or stalled
            if done:
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
                    self._deliver(payload)
                else:
                    self._poll()
        return self._result()

    def _only_polls(self) -> bool:
        """Nothing but polls is pending, and no flow moves: a poll cannot make a flow without a path move."""
        return all(kind == 3 for _, _, kind, _ in self.heap)

    def _result(self) -> FlowSimResult:
        return FlowSimResult(
            links=self.links, capacity_bps=self.capacity_bps, job_offsets=self.offsets,
            job_start_s=self.job_begun_s, job_end_s=self.job_done_s,
            transfer_start_s=self.start_s, transfer_end_s=self.end_s,
            edges_s=np.asarray(self.edges, dtype=float), load_ptr=np.asarray(self.ptr, dtype=np.intp),
            load_link=np.concatenate([np.zeros(0, dtype=np.intp), *self.load_link]),
            load_bps=np.concatenate([np.zeros(0), *self.load_bps]),
            rate_updates=self.rate_updates, route_changes=self.route_changes, polls=self.polls,
            congestion_moves=self.congestion_moves,
            stalled=tuple(int(g) for g in np.flatnonzero(np.isnan(self.end_s))))
