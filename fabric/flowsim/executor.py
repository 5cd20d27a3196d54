"""The event-driven executor: transfer DAGs run over a fabric as max-min fair flows (`simulate`).

Each job is a `TransferDag` placed on hosts (`Placement`), started at `start_s` or, if it lists jobs
in `after`, once those have all completed (whichever is later): a replay's collectives, each waiting
for the ones before it on its stream. Between two hosts a transfer is split evenly over the pair's
connections (`fabric.flowsim.connections`: the replay's NIC, plane and source-port rule), and each part
is one flow on the path the routing policy gives for its connection (`RoutingPolicy.path`). A transfer
between ranks on one host is delivered at once; one between two GPUs of a server (`Fabric.gpus_per_server`)
never touches the fabric: it is delivered size x 8 / `Fabric.nvlink_bps` after it begins (a fixed delay:
no contention on NVLink), or under cut-through counts as sent then. A job without transfers may hold
for `Job.hold_s` (a replay's all in-server collective). When a transfer begins and when it is delivered is the
forwarding's (`SimOptions.cut_through`, `fabric.flowsim.forwarding`):

- store and forward (the default): a transfer begins when every transfer it depends on has been
  delivered, and is delivered `per_transfer_s + per_hop_s x hops` after its last byte left (hops: links
  on its longest part's path when it began); the transfers of one host pair share its connections.
- cut-through, as the replay's agents forward: a transfer may begin once each transfer it depends on
  has begun (received data is forwarded as it arrives) or, for the same sender's earlier sends, has
  been sent; a host pair's transfers take its connections one after another, in order; the
  per-transfer delay holds the pair before the first byte, and a transfer is delivered `per_hop_s x
  hops` after its last byte, no earlier than those it depends on. Not with lockstep.

Both overheads are 0 by default, for a calibration against the emulator.

Rates are the max-min fair shares of the flows active at the moment (`max_min_rates_on_paths`), recomputed
only when something changes: a flow starts or ends, or a link event (`LinkEvent`) is applied through
the policy's `on_link_change` and every active flow is re-routed on its connection's new path. So
the cost grows with the number of events, not with simulated time. A flow whose path is dropped (a
dead link with no live alternative) waits at rate 0 for a later event; if none comes, its transfer
is reported as stalled.

What is modelled: link capacities, routing (paths as the policy's data plane forwards them, ECMP
collisions included), fair sharing, dependencies, the forwarding (store and forward, or the replay's
cut-through with each host pair's transfers in order), failures at given times. What is not: packets,
queues, buffers, TCP dynamics (slow start, loss recovery, the time a failure takes to detect), path
latency beyond the overhead parameters. Store and forward (the default) differs from the replay's
agents: a transfer waits for its dependencies in full (for bandwidth-bound collectives with equal shares
the times agree), and transfers of one pair share its bandwidth instead of queueing in order.

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
simulated step by step. Replays are store and forward's (cut-through excludes lockstep, and its
transfers begin before their phase's predecessors are delivered).

Congestion moves (`SimOptions.poll_s` > 0, for a policy that reacts to loads): every `poll_s` while
flows run, the policy gets the exact rates of every switch egress link and slot and may move slots,
at no cost in time (`fabric.flowsim.congestion`). Rates are in bits per second, times in seconds.

A run (`_Run`, the event loop here) is composed of: `clock.Clock` (simulated time, timed events),
`pool.TransferPool` (the running jobs' transfers), `routes.ConnectionPaths` (every connection's path),
`flows.Flows` (the active flows and their rates), a forwarding strategy (`forwarding.StoreAndForward` or
`forwarding.CutThrough`), `phases.Lockstep` and `phases.PhaseReplays`, `load_log.LoadLog` (the per-link
load over time) and `congestion.CongestionPoller`. What it is given: `inputs`; what jobs of one DAG
share: `shapes`.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from fabric.flowsim.clock import DELIVERY, EARLY_KINDS, JOB_END, JOB_START, LINK_EVENT, REPLAY_END, SETUP_DONE, Clock
from fabric.flowsim.congestion import CongestionPoller
from fabric.flowsim.connections import ConnectionTable, plan_connection_table
from fabric.flowsim.flows import Flows
from fabric.flowsim.forwarding import CutThrough, Forwarding, StoreAndForward
from fabric.flowsim.inputs import Job, LinkEvent, SimOptions, SimProgress, directed_links
from fabric.flowsim.load_log import LoadLog
from fabric.flowsim.maxmin import FloatArray, FlowSimError, IntArray
from fabric.flowsim.phases import Lockstep, PhaseReplays
from fabric.flowsim.pool import TransferPool
from fabric.flowsim.result import FlowSimResult
from fabric.flowsim.routes import ConnectionPaths
from fabric.flowsim.shapes import job_templates
from fabric.model import Fabric
from fabric.routing.policy import RoutingPolicy

#: flows due to end within this share of the step are taken to end together with it
END_TOL = 1e-9
#: a run reports its progress at most this often (wall seconds)
PROGRESS_EVERY_S = 0.5


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


class _Run:
    """One simulation: its jobs (per distinct DAG, placement and lane a template), their connections,
    and the parts it is composed of (module docstring), driven by the event loop (`run`). Transfers are
    indexed by their place in the pool (in the result: job offset + index in its DAG), connections by id."""

    def __init__(self, fabric: Fabric, policy: RoutingPolicy, jobs: list[Job], opts: SimOptions,
                 events: list[LinkEvent], connections: ConnectionTable | None = None,
                 routes: tuple[IntArray, IntArray] | None = None,
                 progress: Callable[[SimProgress], None] | None = None) -> None:
        self.fabric, self.policy, self.jobs, self.opts = fabric, policy, jobs, opts
        self.progress = progress
        self.next_report_s = 0.0
        self.links, self.capacity_bps = directed_links(fabric)
        # per distinct (DAG, placement, lane): its transfers' hosts, sizes, dependency counts and
        # successors (a replay's calls of one collective share them); the jobs' state lives in the pool
        self.templates, self.job_tpl, self.offsets = job_templates(fabric, jobs)
        self.lock = [opts.lockstep if j.lockstep is None else j.lockstep for j in jobs]
        for k, j in enumerate(jobs):
            if j.sample_phases < 1:
                raise FlowSimError(f"job {j.dag.label or k}: sample_phases must be >= 1, got {j.sample_phases}")
            if j.sample_phases > 1 and not self.lock[k]:
                raise FlowSimError(f"job {j.dag.label or k}: phase sampling needs lockstep")
        if opts.cut_through and any(self.lock):
            raise FlowSimError("cut_through and lockstep exclude each other (lockstep waits for whole steps)")
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
                                                ports=opts.ports, seed=opts.seed, merge_nics=opts.merge_nics)
        elif connections.fabric is not fabric or not bool(np.isin(pair_keys, connections.pair_key).all()):
            raise FlowSimError("the connections given were planned for other host pairs or another fabric")
        self.ct = connections
        self.pair_key = connections.pair_key.astype(np.intp)
        self.pair_ptr = connections.pair_ptr
        for t in self.templates:
            t.locate_pairs(self.pair_key)
        # the parts of the run
        self.clock = Clock()
        self.paths = ConnectionPaths(fabric, policy, self.links, connections, routes)
        self.pool = TransferPool(self.templates, self.job_tpl, opts.transfer_times)
        self.poller = CongestionPoller(fabric, policy, self.links, self.paths, self.clock, opts.poll_s)
        self.flows = Flows(self.pool, self.paths, self.capacity_bps * opts.goodput_share, opts.per_hop_s > 0,
                           self.poller.arm if self.poller.poll_s > 0 else None)
        self.lockstep = Lockstep(self.pool)
        self.replays = PhaseReplays(self.pool, self.flows, self.paths, self.clock, self.lockstep, self.lock,
                                    [j.sample_phases for j in jobs], self.poller.poll_s > 0, opts.resolution_s,
                                    len(self.links))
        self.forwarding: Forwarding
        if opts.cut_through:
            self.forwarding = CutThrough(self.pool, self.flows, self.clock, opts, self._finished, self.pair_key.size)
        else:
            self.forwarding = StoreAndForward(self.pool, self.flows, self.clock, opts, self._finished, self.lock,
                                              self.lockstep, self.replays)
        scales = np.asarray([(j.net_latency_scale, j.nvlink_latency_scale) for j in jobs], dtype=np.float64)
        if scales.size and not bool((scales == 1.0).all()):
            if opts.cut_through or not bool((scales >= 0).all()):
                raise FlowSimError("jobs' latency scales must be >= 0, and apply under store and forward only")
            self.forwarding.job_scale = self.replays.job_scale = scales
        self.log = LoadLog(len(self.links))
        self.route_changes = 0
        self.link_events = sorted(events, key=lambda e: e.time_s)
        for i, e in enumerate(self.link_events):
            if e.time_s < 0 or not math.isfinite(e.time_s):
                raise FlowSimError(f"link event {e}: time_s must be finite and >= 0")
            self.clock.push(e.time_s, LINK_EVENT, i)
        for i, j in enumerate(jobs):
            if not self.waiting[i]:
                self.clock.push(j.start_s, JOB_START, i)

    @property
    def cap(self) -> int:
        """The pool's size (transfers)."""
        return self.pool.cap

    # ---- jobs ----------------------------------------------------------------------------------
    def _start_job(self, j: int, pending: list[IntArray] | None = None) -> None:
        """Job `j` starts now: its roots begin, or (`pending` given) are added to it, to begin with the roots of the
        jobs that start next to it (`_begin_pending`)."""
        self.job_begun_s[j] = self.clock.now
        self.replays.watch = None
        if not self.left[j]:  # an empty DAG completes as it starts, or once its hold is over
            if self.jobs[j].hold_s > 0:
                self.clock.push(self.clock.now + self.jobs[j].hold_s, JOB_END, j)
            else:
                self._job_done(j)
            return
        part = self.pool.start(j)
        tpl = self.pool.template(j)
        self.forwarding.admit(part, tpl)
        roots = tpl.roots + part.start
        if self.lock[j]:
            roots = self.lockstep.start(j, tpl, roots)
        if pending is None:
            self.forwarding.begin(roots)
        else:
            pending.append(roots)

    def _begin_pending(self, pending: list[IntArray] | None) -> None:
        """The roots of jobs started one after another in the loop begin as one batch: their flows start in one
        `Flows.start` (in the order they would have one job at a time), not one call per job (a step of 1,024 GPUs
        starts 170k pipeline sends at a few hundred instants). A batch of several jobs is never one phase, as it
        was not one job at a time: the next job's start was due as the first began (`PhaseReplays.begin`)."""
        if pending:
            roots = pending[0] if len(pending) == 1 else np.concatenate(pending)
            pending.clear()
            self.forwarding.begin(roots)

    def _finished(self, groups: list[tuple[int, IntArray]]) -> None:
        """The jobs of delivered transfers (`TransferPool.by_job`'s groups): those with none left complete."""
        for job, mine in groups:
            self.left[job] -= mine.size
            if not self.left[job]:
                self._job_done(job)
                self.pool.release(job)
                self.lockstep.forget(job)

    def _job_done(self, j: int) -> None:
        now = self.clock.now
        self.job_done_s[j] = now
        for k in self.dependents[j]:
            self.waiting[k] -= 1
            if not self.waiting[k]:
                self.clock.push(max(now, self.jobs[k].start_s), JOB_START, k)

    # ---- events --------------------------------------------------------------------------------
    def _link_event(self, e: LinkEvent) -> None:
        self.replays.watch = None
        self.policy.on_link_change(e.switch, e.port, e.up, self.clock.now)
        self.route_changes += 1
        self.flows.reroute()

    def _replayed(self, payload: int) -> None:
        """Replayed phases end now: their load intervals logged, their transfers delivered at their times."""
        log, g, end_s = self.replays.replayed(payload)
        for from_s, until_s, used, rate in log:
            self._record(from_s, until_s, used, rate)
        self.flows.load = (np.zeros(0, dtype=np.intp), np.zeros(0))
        self.forwarding.begin(self.forwarding.deliver(g, end_s))

    def _record(self, from_s: float, until_s: float, used: IntArray, rate: FloatArray) -> None:
        """Links `used` carried `rate` from `from_s` until `until_s`: to the load log, and to the phase
        watched if there is one."""
        if until_s <= from_s or not used.size:
            return
        w = self.replays.watch
        if w is not None:
            w.log(from_s, until_s, used, rate)
        self.log.record(from_s, until_s, used, rate)

    def _advance(self, until_s: float) -> None:
        flows, clock = self.flows, self.clock
        if flows.conn.size and until_s > clock.now:
            used, rate = flows.load
            self._record(clock.now, until_s, used, rate)
            # never below 0: a flow whose end rounds to just before the event advanced to would
            # otherwise be left owing -1e-9 bits, with a negative time to finish that is never reached
            flows.left_bits = np.maximum(0.0, flows.left_bits - flows.rates * (until_s - clock.now))
        clock.now = until_s

    # ---- the loop ------------------------------------------------------------------------------
    def _report(self) -> None:
        if self.progress is not None:
            self.next_report_s = time.monotonic() + PROGRESS_EVERY_S
            done = int(np.count_nonzero(~np.isnan(self.job_done_s)))
            self.progress(SimProgress(self.clock.now, done, len(self.jobs), self.clock.events,
                                      self.flows.rate_updates, self.job_done_s))

    def run(self) -> FlowSimResult:
        clock, flows, forwarding = self.clock, self.flows, self.forwarding
        heap = clock.heap
        resolution_s = self.opts.resolution_s
        self.next_report_s = time.monotonic() + PROGRESS_EVERY_S
        # roots of jobs started one after another (store and forward; cut-through queues per pair in call order)
        pending: list[IntArray] | None = [] if isinstance(forwarding, StoreAndForward) else None
        while True:
            if self.progress is not None and time.monotonic() >= self.next_report_s:
                self._report()
            if flows.dirty:
                flows.update_rates()
            next_event = heap[0][0] if heap else math.inf
            done = np.zeros(0, dtype=np.intp)
            step = math.inf
            if flows.conn.size:
                rates = flows.rates
                moving = rates > 0
                finish = None
                if moving.all():  # the usual case: every flow has a path
                    finish = flows.left_bits / rates
                elif moving.any():
                    finish = np.full(flows.conn.size, np.inf)
                    finish[moving] = flows.left_bits[moving] / rates[moving]
                if finish is not None:
                    step = float(finish.min())
                    if clock.now + step <= next_event:
                        done = np.flatnonzero(finish <= step + max(step * END_TOL, resolution_s))
            if step == math.inf and (next_event == math.inf or clock.only_polls()):
                break  # nothing moves and nothing will happen: finished, or stalled
            clock.events += 1
            if done.size:
                self._advance(clock.now + step)
                drained = flows.finish(done)
                if drained.size:
                    forwarding.drained(drained)
                continue
            self._advance(next_event)
            # events due within the resolution after this one happen with it (`SimOptions.resolution_s`;
            # those of `EARLY_KINDS`, up to the first of another kind)
            due_s = clock.now + resolution_s
            while heap and (heap[0][0] <= clock.now or (heap[0][0] <= due_s and heap[0][2] in EARLY_KINDS)):
                kind, payload = clock.pop()
                if kind == JOB_START:
                    self._start_job(payload, pending)
                    continue
                self._begin_pending(pending)  # consecutive job starts begin together, before anything else
                if kind == LINK_EVENT:
                    self._link_event(self.link_events[payload])
                elif kind == DELIVERY:
                    forwarding.begin(forwarding.deliver(clock.batches.pop(payload)))
                elif kind == REPLAY_END:
                    self._replayed(payload)
                elif kind == SETUP_DONE:
                    forwarding.setup_done(clock.batches.pop(payload))
                elif kind == JOB_END:
                    self._job_done(payload)
                else:
                    self.poller.poll(flows)
            self._begin_pending(pending)
        self.log.flush()
        self._report()
        return self._result()

    def _result(self) -> FlowSimResult:
        starts: list[FloatArray] = []
        ends: list[FloatArray] = []
        stalled: list[IntArray] = []
        for j in range(len(self.jobs)):
            n = len(self.templates[self.job_tpl[j]].size)
            times = self.pool.times(j)
            if times is None:
                start, end = np.full(n, np.nan), np.full(n, np.nan)
                if self.left[j]:  # never started (it waited for a job that never completed)
                    stalled.append(self.offsets[j] + np.arange(n))
            else:
                start, end = times
                if j in self.pool.base:  # started, never completed: its undelivered transfers stalled
                    stalled.append(self.offsets[j] + np.flatnonzero(np.isnan(end)))
            if self.opts.transfer_times:
                starts.append(start)
                ends.append(end)
        log = self.log
        return FlowSimResult(
            links=self.links, capacity_bps=self.capacity_bps, job_offsets=self.offsets,
            job_start_s=self.job_begun_s, job_end_s=self.job_done_s,
            transfer_start_s=np.concatenate([np.zeros(0), *starts]),
            transfer_end_s=np.concatenate([np.zeros(0), *ends]),
            edges_s=np.asarray(log.edges, dtype=float), load_ptr=np.asarray(log.ptr, dtype=np.intp),
            load_link=np.concatenate([np.zeros(0, dtype=np.intp), *log.load_link]),
            load_bps=np.concatenate([np.zeros(0), *log.load_bps]),
            rate_updates=self.flows.rate_updates, route_changes=self.route_changes, polls=self.poller.polls,
            events=self.clock.events, coarsened=log.coarsened,
            congestion_moves=self.poller.congestion_moves, phases_replayed=self.replays.phases_replayed,
            phases_sampled=self.replays.phases_sampled,
            stalled=tuple(int(g) for g in np.concatenate([np.zeros(0, dtype=np.intp), *stalled])))
