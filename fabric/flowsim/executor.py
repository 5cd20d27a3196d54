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

How it runs (the cost): transfers are handled in batches (all that become ready at one instant) on
numpy arrays, flows too; every connection's path is one row of a padded array, recomputed only when
the routing changes (a link event or a congestion move). Max-min rates are memoised by the multiset of
active connections and the routing's version: the steps of a ring, whose flows are alike, compute
them once. So the Python work per event is independent of the number of flows, and the cost grows
with the number of distinct events.

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
from fabric.transfers import Placement, TransferColumns, TransferDag

#: flows due to end within this share of the step are taken to end together with it
END_TOL = 1e-9
#: memoised max-min results kept at most, by total flows held
RATE_MEMO_FLOWS = 4_000_000


@dataclass(frozen=True)
class Job:
    """One transfer DAG (either form) on hosts, started at `start_s`, and not before every job in
    `after` (indexes of earlier jobs in the same run) has completed."""

    dag: TransferDag | TransferColumns
    placement: Placement
    start_s: float = 0.0
    after: tuple[int, ...] = ()

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
    # the share of a link's rate that carries the transfers' bytes (the rest: packet headers, ACKs), for
    # a calibration against the emulator (TCP over Ethernet at MTU 1500: ~1448 / 1514); 1: all of it
    goodput_share: float = 1.0

    def check(self) -> None:
        if self.per_transfer_s < 0 or self.per_hop_s < 0:
            raise FlowSimError(f"overheads must be >= 0, got per_transfer_s={self.per_transfer_s}, "
                               f"per_hop_s={self.per_hop_s}")
        if not (0 <= self.resolution_s <= 1e-3):
            raise FlowSimError(f"resolution_s must be in [0, 1 ms], got {self.resolution_s}")
        if not 0 < self.goodput_share <= 1:
            raise FlowSimError(f"goodput_share must be in (0, 1], got {self.goodput_share}")
        if not (self.poll_s >= 0 and math.isfinite(self.poll_s)):
            raise FlowSimError(f"poll_s must be finite and >= 0, got {self.poll_s}")


def _distinct(values: IntArray) -> IntArray:
    """The distinct values, ascending (`np.unique` without its overhead, which per event adds up)."""
    if values.size < 2:
        return values
    v = np.sort(values)
    return v[np.concatenate(([True], v[1:] != v[:-1]))]


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
    """One simulation's state, as arrays: transfers by global index (job offset + index in its DAG),
    connections by id, active flows in parallel arrays (a flow is one part of a transfer)."""

    def __init__(self, fabric: Fabric, policy: RoutingPolicy, jobs: list[Job], opts: SimOptions,
                 events: list[LinkEvent]) -> None:
        self.fabric, self.policy, self.jobs, self.opts = fabric, policy, jobs, opts
        self.links, self.capacity_bps = directed_links(fabric)
        self.goodput_bps = self.capacity_bps * opts.goodput_share  # what the transfers' bytes may use
        self.link_id = {l: i for i, l in enumerate(self.links)}
        host_index = {h.name: i for i, h in enumerate(fabric.hosts)}
        offsets: list[int] = []
        src: list[IntArray] = []
        dst: list[IntArray] = []
        size: list[IntArray] = []
        job_of: list[IntArray] = []
        deps_left: list[IntArray] = []
        succ_count: list[IntArray] = []
        succ: list[IntArray] = []
        n = 0
        for k, j in enumerate(jobs):
            if j.start_s < 0 or not math.isfinite(j.start_s):
                raise FlowSimError(f"job {j.dag.label or k}: start_s must be finite and >= 0")
            cols = j.columns
            rank_host = np.full(max(cols.ranks, default=0) + 1, -1, dtype=np.intp)
            for r in cols.ranks:
                host = j.placement.host(r)
                if host not in fabric.host_by_name:
                    raise FlowSimError(f"rank {r} is placed on {host!r}, not a host of fabric {fabric.name!r}")
                rank_host[r] = host_index[host]
            offsets.append(n)
            src.append(rank_host[cols.src])
            dst.append(rank_host[cols.dst])
            size.append(cols.size_bytes)
            job_of.append(np.full(len(cols), k, dtype=np.intp))
            deps_left.append(np.diff(cols.dep_ptr))
            ptr, nxt = cols.successors()
            succ_count.append(np.diff(ptr))
            succ.append(nxt + n)
            n += len(cols)
        self.offsets = tuple(offsets)
        self.n = n

        def joined(parts: list[IntArray], dtype: type) -> IntArray:  # one job: its own arrays, no copy
            if len(parts) == 1 and parts[0].dtype == dtype:
                return parts[0]
            return np.concatenate([np.zeros(0, dtype=dtype), *parts]).astype(dtype, copy=False)

        self.t_src = joined(src, np.intp)
        self.t_dst = joined(dst, np.intp)
        self.t_size = joined(size, np.int64)
        self.t_job = joined(job_of, np.intp)
        self.deps_left = joined(deps_left, np.int64)
        self.succ_ptr = np.concatenate([np.zeros(1, dtype=np.intp), np.cumsum(joined(succ_count, np.intp))])
        self.succ = joined(succ, np.intp)
        self.start_s = np.full(n, np.nan)
        self.end_s = np.full(n, np.nan)
        self.parts_left = np.zeros(n, dtype=np.int64)
        self.hops = np.zeros(n, dtype=np.int64)
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
        # connections: per host pair (sender index, receiver index) a contiguous range of ids
        names = [h.name for h in fabric.hosts]
        remote = self.t_src != self.t_dst
        pair_keys = np.unique(self.t_src[remote] * len(names) + self.t_dst[remote]) if n else np.zeros(0, np.intp)
        pairs = [(names[int(k) // len(names)], names[int(k) % len(names)]) for k in pair_keys]
        plan = plan_connections(fabric, policy.entropy, pairs, channels=opts.channels, ports=opts.ports,
                                seed=opts.seed)
        self.conns: list[Connection] = []
        pair_ptr = [0]
        for pair in pairs:
            self.conns.extend(plan[pair])
            pair_ptr.append(len(self.conns))
        self.pair_key = pair_keys.astype(np.intp)
        self.pair_ptr = np.asarray(pair_ptr, dtype=np.intp)
        self.t_pair = np.full(n, -1, dtype=np.intp)
        if remote.any():
            self.t_pair[remote] = np.searchsorted(self.pair_key, self.t_src[remote] * len(names) + self.t_dst[remote])
        # every connection's path: a row of link indexes padded with -1 (all -1: dropped)
        self.width = 1
        self.conn_path = np.full((len(self.conns), 1), -1, dtype=np.intp)
        self.conn_hops = np.zeros(len(self.conns), dtype=np.int64)
        self.conn_nodes: list[tuple[str, ...]] = [()] * len(self.conns)
        self.conn_fresh = np.zeros(len(self.conns), dtype=bool)
        self.route_version = 0
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
        # batch of transfers (payload: index into self.batches), 3 poll
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
        self.load_link: list[IntArray] = []  # per interval
        self.load_bps: list[FloatArray] = []
        self.rate_updates = 0
        self.route_changes = 0
        self.events = 0  # instants at which something happened (flows ended, timed events)
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
        rows = []
        for c in np.unique(stale).tolist():
            conn = self.conns[c]
            nodes = self.policy.path(conn.src, conn.dst, conn.sport)
            self.conn_nodes[c] = nodes or ()
            rows.append((c, [] if nodes is None else [self.link_id[(u, v)] for u, v in itertools.pairwise(nodes)]))
        need = max(len(r) for _, r in rows)
        if need > self.width:
            pad = np.full((len(self.conns), need - self.width), -1, dtype=np.intp)
            self.conn_path = np.hstack([self.conn_path, pad])
            self.width = need
        for c, r in rows:
            self.conn_path[c, :] = -1
            self.conn_path[c, :len(r)] = r
            self.conn_hops[c] = len(r)
        self.conn_fresh[[c for c, _ in rows]] = True

    def _reroute_all(self) -> None:
        self.conn_fresh[:] = False
        self.route_version += 1
        self._route(self.f_conn)
        self.dirty = True

    # ---- transfers -----------------------------------------------------------------------------
    def _begin(self, g: IntArray) -> None:
        """Transfers `g` (their dependencies delivered) begin now."""
        todo = [g]
        while todo:
            g = todo.pop()
            if not g.size:
                continue
            self.start_s[g] = self.now
            local = g[self.t_pair[g] < 0]
            g = g[self.t_pair[g] >= 0]
            if g.size:
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
                    self.hops[g] = self.conn_hops[conn].reshape(-1, w).max(axis=1)
                    keep = part_bytes > 0
                    self.parts_left[g] = keep.reshape(-1, w).sum(axis=1)
                else:
                    part_t = np.repeat(g, k)  # one row per (transfer, connection)
                    jk = np.arange(part_t.size) - np.repeat(np.cumsum(k) - k, k)  # connection's rank in its pair
                    conn = np.repeat(lo, k) + jk
                    base, extra = np.divmod(self.t_size[g], k)
                    part_bytes = np.repeat(base, k) + (jk < np.repeat(extra, k))
                    self._route(conn)
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
                empty = g[self.parts_left[g] == 0]  # 0-byte transfers: only the overheads
                if empty.size:
                    self._drained(empty)
            if local.size:
                todo.append(self._deliver(local))

    def _drained(self, g: IntArray) -> None:
        """Transfers `g` sent their last byte now: delivered after the overheads."""
        delay = self.opts.per_transfer_s + self.opts.per_hop_s * self.hops[g]
        now_ = g[delay <= 0]
        later = g[delay > 0]
        if later.size:
            d = delay[delay > 0]
            for value in np.unique(d).tolist():
                self.batches[self.seq] = later[d == value]
                self._push(self.now + value, 2, self.seq)
        if now_.size:
            self._begin(self._deliver(now_))

    def _deliver(self, g: IntArray) -> IntArray:
        """Transfers `g` are delivered now; returns the transfers that became ready (to begin)."""
        self.end_s[g] = self.now
        of = self.t_job[g]
        if of.size and of[0] == of[-1] and bool((of == of[0]).all()):  # the usual batch: one job
            jobs_counts: tuple[list[int], list[int]] = ([int(of[0])], [int(of.size)])
        else:
            jobs, counts = np.unique(of, return_counts=True)
            jobs_counts = (jobs.tolist(), counts.tolist())
        for job, c in zip(*jobs_counts):
            self.left[job] -= c
            if not self.left[job]:
                self._job_done(job)
        lo, hi = self.succ_ptr[g], self.succ_ptr[g + 1]
        k = hi - lo
        if not k.sum():
            return np.zeros(0, dtype=np.intp)
        nxt = self.succ[np.repeat(lo, k) + np.arange(k.sum()) - np.repeat(np.cumsum(k) - k, k)]
        np.subtract.at(self.deps_left, nxt, 1)
        return _distinct(nxt[self.deps_left[nxt] == 0])

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
        idx = np.arange(base, base + len(self.jobs[j].dag))
        self._begin(idx[(self.deps_left[idx] == 0) & np.isnan(self.start_s[idx])])

    # ---- rates ---------------------------------------------------------------------------------
    def _crossings(self, flows: IntArray) -> tuple[IntArray, IntArray]:
        """(flow position in `flows`, link) for every link the flows cross."""
        paths = self.conn_path[self.f_conn[flows]]
        row, col = np.nonzero(paths >= 0)
        return row.astype(np.intp), paths[row, col]

    def _update_rates(self) -> None:
        order = np.argsort(self.f_conn, kind="stable")
        key = (self.route_version, self.f_conn[order].tobytes())
        found = self.memo.get(key)
        if found is not None:
            hit = found
        else:
            sorted_rates: FloatArray = np.zeros(len(order))
            routed = order[self.conn_hops[self.f_conn[order]] > 0]
            pos = np.flatnonzero(self.conn_hops[self.f_conn[order]] > 0)
            if routed.size:
                flow, link = self._crossings(routed)
                sorted_rates[pos] = max_min_rates(routed.size, flow, link, self.goodput_bps)
                self.rate_updates += 1
                load = np.bincount(link, weights=sorted_rates[pos][flow], minlength=len(self.links))
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
        """Log the link loads from now until `until_s` (one interval)."""
        used, rate = self.load
        if until_s <= self.now or not used.size:
            return
        if self.edges and self.edges[-1] == self.now and self.load_link and self.load_link[-1] is used:
            self.edges[-1] = until_s  # the same allocation as the interval before: one interval
            return
        if self.edges and self.edges[-1] != self.now:
            self.ptr.append(self.ptr[-1])  # an idle gap: an interval with no load
            self.edges.append(self.now)
            self.load_link.append(np.zeros(0, dtype=np.intp))
            self.load_bps.append(np.zeros(0))
        if not self.edges:
            self.edges.append(self.now)
        self.edges.append(until_s)
        self.load_link.append(used)
        self.load_bps.append(rate)
        self.ptr.append(self.ptr[-1] + used.size)

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
        t = _distinct(ended)
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
        per_conn = np.bincount(self.f_conn, weights=self.rates, minlength=len(self.conns))
        slot_rates: dict[tuple[str, str, int], float] = {}
        pol = self.policy
        for c in np.flatnonzero(per_conn > 0).tolist():
            conn, rate = self.conns[c], float(per_conn[c])
            dest = conn.dst.switch
            for node in self.conn_nodes[c][1:-2]:  # the switches before the destination's
                if pol.is_decision(node, dest):
                    key = (node, dest, pol.entropy.slot(pol.tier(node), conn.sport))
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
    def _only_polls(self) -> bool:
        """Nothing but polls is pending, and no flow moves: a poll cannot make a flow without a path move."""
        return all(kind == 3 for _, _, kind, _ in self.heap)

    def run(self) -> FlowSimResult:
        while True:
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
                else:
                    self._poll()
        return self._result()

    def _result(self) -> FlowSimResult:
        return FlowSimResult(
            links=self.links, capacity_bps=self.capacity_bps, job_offsets=self.offsets,
            job_start_s=self.job_begun_s, job_end_s=self.job_done_s,
            transfer_start_s=self.start_s, transfer_end_s=self.end_s,
            edges_s=np.asarray(self.edges, dtype=float), load_ptr=np.asarray(self.ptr, dtype=np.intp),
            load_link=np.concatenate([np.zeros(0, dtype=np.intp), *self.load_link]),
            load_bps=np.concatenate([np.zeros(0), *self.load_bps]),
            rate_updates=self.rate_updates, route_changes=self.route_changes, polls=self.polls, events=self.events,
            congestion_moves=self.congestion_moves,
            stalled=tuple(int(g) for g in np.flatnonzero(np.isnan(self.end_s))))
