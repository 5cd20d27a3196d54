"""How transfers are forwarded: when a transfer may begin and when it is delivered, as one of two
strategies chosen once per run (`SimOptions.cut_through`).

- `StoreAndForward`: a transfer begins once every transfer it depends on has been delivered in full
  (and, under lockstep, its phase has opened), and is delivered `per_transfer_s + per_hop_s x hops`
  after its last byte left; transfers of one host pair share its connections at once. Phases that
  repeat an earlier one are replayed from it (`phases.PhaseReplays`).
- `CutThrough`, as the replay's agents forward: a transfer may begin once each transfer it depends on
  has begun (for the same sender's earlier sends: has been sent), takes its pair's connections after
  the pair's earlier transfers (in order), holds them `per_transfer_s` before its first byte, and is
  delivered `per_hop_s x hops` after its last byte, no earlier than those it depends on.

In-server transfers (between two GPUs of a server: no pair, `t_pair` < 0, and a time in the shape's
`local_s`) take that time and no link: store and forward delivers them that long after they begin;
cut-through counts them as sent then.

Both work on the pool's arrays (`pool.TransferPool`) and start flows (`flows.Flows.start`); the run
calls `begin`, `deliver`, `drained` (a transfer's last byte left) and, for cut-through, `setup_done` (a
pair's per-transfer delay spent), and `admit` as a job starts; `finished` is the run's callback for
delivered transfers, grouped by job.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from fabric.flowsim.clock import DELIVERY, SETUP_DONE, Clock
from fabric.flowsim.connections import sorted_unique
from fabric.flowsim.flows import Flows
from fabric.flowsim.inputs import SimOptions
from fabric.flowsim.maxmin import FloatArray, IntArray
from fabric.flowsim.phases import Lockstep, PhaseReplays
from fabric.flowsim.pool import TransferPool
from fabric.flowsim.shapes import _Template

#: the run's callback for delivered transfers: (job, its transfers delivered) per job
Finished = Callable[[list[tuple[int, IntArray]]], None]


class Forwarding(ABC):
    """What both strategies share: the pool, the flows, the clock, the overheads, and timed deliveries."""

    def __init__(self, pool: TransferPool, flows: Flows, clock: Clock, opts: SimOptions, finished: Finished) -> None:
        self.pool, self.flows, self.clock, self.finished = pool, flows, clock, finished
        self.per_transfer_s = opts.per_transfer_s
        self.per_hop_s = opts.per_hop_s
        self.nvlink_latency_s = opts.nvlink_latency_s
        self.per_hop = opts.per_hop_s > 0  # (the pool's `hops` are kept only then)
        # per job, (network, NVLink) latency scales (`Job.net_latency_scale`); None: all 1
        self.job_scale: npt.NDArray[np.float64] | None = None

    @abstractmethod
    def begin(self, g: IntArray) -> None:
        """Transfers `g` may begin now (their dependencies met, as the strategy has them)."""

    @abstractmethod
    def deliver(self, g: IntArray, end_s: FloatArray | None = None) -> IntArray:
        """Transfers `g` are delivered now (their delivery times: `end_s` if given, a replayed phase's);
        returns the transfers that became ready (to `begin`)."""

    @abstractmethod
    def drained(self, g: IntArray) -> None:
        """Transfers `g` sent their last byte now."""

    def admit(self, part: slice, tpl: _Template) -> None:
        """A job's transfers take pool range `part` (its template `tpl`)."""

    def setup_done(self, g: IntArray) -> None:
        """Transfers `g` have spent their per-transfer delay (scheduled only by `CutThrough`)."""
        raise NotImplementedError

    def _local_delay(self, g: IntArray) -> FloatArray:
        """The NVLink time of local transfers `g`, plus `SimOptions.nvlink_latency_s` each (0 for those of ranks on
        one host)."""
        out = np.zeros(g.size)
        pool = self.pool
        of = pool.t_job[g]
        for job in np.unique(of).tolist():
            shape = pool.template(job).shape
            if shape.local_s is not None and shape.nvlink is not None:  # (set together: in-server transfers)
                mine = of == job
                at = g[mine] - pool.base[job]
                latency = self.nvlink_latency_s * (1.0 if self.job_scale is None else self.job_scale[job, 1])
                out[mine] = shape.local_s[at] + latency * shape.nvlink[at]
        return out

    def _hop_delay(self, g: IntArray) -> FloatArray:
        """The per-hop latency of transfers `g`'s paths (their longest connection's)."""
        if not self.per_hop:
            return np.zeros(g.size)
        return np.asarray(self.per_hop_s * self.pool.hops[g], dtype=np.float64)

    def _after(self, g: IntArray, delay: npt.NDArray[np.floating]) -> IntArray:
        """Transfers `g` are delivered `delay` from now: those with a delay as timed events (one per
        distinct delay); returns those without, to deliver now."""
        later = g[delay > 0]
        if later.size:
            d = delay[delay > 0]
            for value in np.unique(d).tolist():
                self.clock.push_batch(self.clock.now + value, DELIVERY, later[d == value])
        return g[delay <= 0]


class StoreAndForward(Forwarding):
    """A transfer waits for its dependencies in full (`SimOptions.cut_through` off). `lock`: per job,
    whether its phases run in lockstep (`lockstep`); `replays`: the phase replays."""

    def __init__(self, pool: TransferPool, flows: Flows, clock: Clock, opts: SimOptions, finished: Finished,
                 lock: list[bool], lockstep: Lockstep, replays: PhaseReplays) -> None:
        super().__init__(pool, flows, clock, opts, finished)
        self.lock, self.lockstep, self.replays = lock, lockstep, replays

    def begin(self, g: IntArray) -> None:
        """Transfers `g` (their dependencies delivered) begin now."""
        # a work list, not recursion: transfers with nothing to send (0 bytes, or both ranks on one
        # host) are delivered at once, and a chain of thousands of them (a trace's empty
        # collectives, one after another) must not exhaust Python's stack. `phased`: whether the
        # batch may be a lockstep phase (what `begin` was called with, or what zero-byte transfers
        # drained into; what local transfers make ready runs on as before).
        # (the same order as recursion: what zero-byte transfers make ready begins, and all that
        # follows from it, before the local transfers of the batch are delivered)
        pool = self.pool
        todo: list[tuple[IntArray, bool, bool]] = [(g, True, False)]  # (transfers, phased, deliver first)
        while todo:
            g, phased, deliver = todo.pop()
            if deliver:
                g = self.deliver(g)
            if not g.size:
                continue
            if phased and self.replays.begin(g):
                continue
            pool.start_s[g] = self.clock.now
            local = g[pool.t_pair[g] < 0]
            g = g[pool.t_pair[g] >= 0]
            if local.size:
                local = self._after(local, self._local_delay(local))  # in-server: after their NVLink time
            if local.size:
                todo.append((local, False, True))
            if g.size:
                empty = self.flows.start(g)
                if empty.size:
                    now_ = self._drained_now(empty)
                    if now_.size:
                        todo.append((self.deliver(now_), True, False))

    def drained(self, g: IntArray) -> None:
        """Transfers `g` sent their last byte now: delivered after the overheads."""
        now_ = self._drained_now(g)
        if now_.size:
            self.begin(self.deliver(now_))

    def _drained_now(self, g: IntArray) -> IntArray:
        """Of transfers `g`, which sent their last byte now, those delivered now (no overheads); the
        others are delivered after them (`_after`)."""
        if not self.per_hop and self.per_transfer_s <= 0:  # no overheads: all of them now
            return g
        delay = self.per_transfer_s + self._hop_delay(g)
        if self.job_scale is not None:
            delay = delay * self.job_scale[self.pool.t_job[g], 0]
        return self._after(g, delay)

    def deliver(self, g: IntArray, end_s: FloatArray | None = None) -> IntArray:
        pool = self.pool
        pool.end_s[g] = self.clock.now if end_s is None else end_s
        if self.replays.watch is not None:
            self.replays.delivered(g)
        groups = pool.by_job(g)
        ready = []
        for job, mine in groups:
            if not self.lock[job] and not pool.template(job).succ.size:  # no edges (a send_recv): nothing follows
                continue
            tpl, edge = pool.out_edges(job, mine)
            if self.lock[job]:
                done, released = self.lockstep.delivered(job, tpl, mine - pool.base[job])
                if done >= 0:
                    self.replays.phase_done(job, done)
                if released is not None:
                    ready.append(released)
            if edge.size:
                nxt = tpl.succ[edge] + pool.base[job]
                np.subtract.at(pool.deps_left, nxt, 1)
                nxt = nxt[pool.deps_left[nxt] == 0]
                ready.append(self.lockstep.gate(job, tpl, nxt) if self.lock[job] else nxt)
        self.finished(groups)
        if not ready:
            return np.zeros(0, dtype=np.intp)
        return sorted_unique(ready[0] if len(ready) == 1 else np.concatenate(ready))


class CutThrough(Forwarding):
    """Cut-through (`SimOptions.cut_through`; not with lockstep): per host pair (index), the transfer
    sending on it (`pair_busy`, -1: none) and those queued behind it, in order (`pair_queue`)."""

    def __init__(self, pool: TransferPool, flows: Flows, clock: Clock, opts: SimOptions, finished: Finished,
                 n_pairs: int) -> None:
        super().__init__(pool, flows, clock, opts, finished)
        self.pair_busy = np.full(n_pairs, -1, dtype=np.intp)
        self.pair_queue: dict[int, deque[int]] = {}

    def admit(self, part: slice, tpl: _Template) -> None:
        self.pool.wait_left[part] = tpl.dep_count
        self.pool.sent_s[part] = np.nan

    def drained(self, g: IntArray) -> None:
        released, granted = self._sent(g)
        self.begin(released, granted)

    def begin(self, g: IntArray, granted: IntArray | None = None) -> None:
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
            self.pool.start_s[g] = self.clock.now
            remote = self.pool.t_pair[g] >= 0
            if not remote.all():
                # in-server transfers count as sent once their NVLink time has passed (`setup_done`)
                delay = np.zeros(g.size)
                delay[~remote] = self._local_delay(g[~remote])
                timed = delay > 0
                if timed.any():
                    for value in np.unique(delay[timed]).tolist():
                        self.clock.push_batch(self.clock.now + value, SETUP_DONE, g[delay == value])
                    g, remote = g[~timed], remote[~timed]
            local = g[~remote]
            if remote.any() and self.per_transfer_s > 0:
                # the per-transfer delay holds the pair before the first byte (`setup_done`)
                self.clock.push_batch(self.clock.now + self.per_transfer_s, SETUP_DONE, g[remote])
                started = local
            else:
                started = g
            todo.extend(self._sending(started))

    def _sending(self, g: IntArray) -> list[tuple[IntArray, bool]]:
        """Cut-through: transfers `g` start sending now (those between hosts as flows); returns what
        may begin because of it, as `begin`'s work items."""
        remote = self.pool.t_pair[g] >= 0
        sent = self.flows.start(g[remote]) if remote.any() else g[:0]
        out = [(self._released(g, same_sender=False), False)]
        for done in (g[~remote], sent):  # nothing to send: sent at once
            if done.size:
                more, freed = self._sent(done)
                out += [(more, False), (freed, True)]
        return out

    def setup_done(self, g: IntArray) -> None:
        """Cut-through: transfers `g` have held their pairs for the per-transfer delay: they send now."""
        for batch, holds in self._sending(g):
            if holds:
                self.begin(batch[:0], batch)
            else:
                self.begin(batch)

    def _fifo(self, g: IntArray) -> IntArray:
        """Of transfers `g`, those that may start sending now: one per pair whose connections are free
        (the first in order); the others queue behind, in order. A queued pair is busy."""
        pair = self.pool.t_pair[g]
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

    def _sent(self, g: IntArray) -> tuple[IntArray, IntArray]:
        """Cut-through: transfers `g` have sent their last byte (or are local): each one's pair goes to
        the next transfer queued on it, the same sender's later sends waiting for them may begin, and
        they are delivered once everything they depend on is (after the overheads). Returns (released
        successors, transfers granted their pair)."""
        self.pool.sent_s[g] = self.clock.now
        remote = g[self.pool.t_pair[g] >= 0]
        granted: list[int] = []
        if remote.size:
            pairs = self.pool.t_pair[remote]
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
        self._deliver_due(g[self.pool.wait_left[g] == 0])
        return released, np.asarray(granted, dtype=np.intp)

    def _released(self, g: IntArray, same_sender: bool) -> IntArray:
        """Cut-through: the successors of transfers `g` whose dependencies have all begun (or been sent,
        for the same sender's earlier sends) once those on `g` count: the edges to a successor with
        the same sender (`same_sender`) or with another one."""
        out = []
        for job, mine in self.pool.by_job(g):
            tpl, edge = self.pool.out_edges(job, mine)
            edge = edge[tpl.shape.succ_same_sender[edge] == same_sender]
            nxt = tpl.succ[edge] + self.pool.base[job]
            np.subtract.at(self.pool.deps_left, nxt, 1)
            out.append(nxt[self.pool.deps_left[nxt] == 0])
        if not out:
            return np.zeros(0, dtype=np.intp)
        return sorted_unique(out[0] if len(out) == 1 else np.concatenate(out))

    def _delay(self, g: IntArray) -> FloatArray:
        """Cut-through: the delay between a transfer's last byte sent and its delivery: the path's
        latency (the per-transfer delay was spent holding the pair before the first byte)."""
        return self._hop_delay(g)

    def _deliver_due(self, g: IntArray) -> None:
        """Transfers `g`, sent and with all they depend on delivered: delivered after the path latency."""
        if not g.size:
            return
        now_ = self._after(g, self._delay(g))
        if now_.size:
            self.deliver(now_)

    def deliver(self, g: IntArray, end_s: FloatArray | None = None) -> IntArray:
        """Cut-through: transfers `g` are delivered now; those sent and waiting only for them follow
        (after their overheads; at once if none)."""
        work = [g]
        while work:
            g = work.pop()
            if not g.size:
                continue
            self.pool.end_s[g] = self.clock.now
            groups = self.pool.by_job(g)
            due = []
            for job, mine in groups:
                tpl, edge = self.pool.out_edges(job, mine)
                if edge.size:
                    nxt = tpl.succ[edge] + self.pool.base[job]
                    np.subtract.at(self.pool.wait_left, nxt, 1)
                    due.append(sorted_unique(nxt[(self.pool.wait_left[nxt] == 0) & ~np.isnan(self.pool.sent_s[nxt])]))
            self.finished(groups)
            if due:
                waiting = np.concatenate(due)
                work.append(self._after(waiting, self._delay(waiting)))
        return np.zeros(0, dtype=np.intp)
