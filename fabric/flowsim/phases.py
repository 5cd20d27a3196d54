"""Lockstep and phase replays: a DAG's phases (a collective's steps) opened one after another, and a
phase that repeats an earlier one replayed from it in one event instead of simulated event by event.

- `Lockstep` (`SimOptions.lockstep`, `Job.lockstep`): a transfer begins only once every transfer of its
  job in an earlier phase has been delivered, as well as its own dependencies.
- `PhaseReplays`: a phase beginning on an otherwise idle fabric is watched (`_PhaseWatch`) and what it
  did kept (`_PhaseRun`); a later phase with the same routing version, host pairs and sizes is replayed
  from it (its transfers delivered at the watched times, its load intervals logged again), and so are the
  alike phases after it (`_chain`) while no other event falls inside them. Phase sampling
  (`Job.sample_phases`) replays a block of phases from its first, although their host pairs differ.

The executor's docstring says when a phase is replayed and what it assumes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fabric.flowsim.clock import REPLAY_END, Clock
from fabric.flowsim.flows import Flows
from fabric.flowsim.maxmin import FloatArray, IntArray
from fabric.flowsim.pool import TransferPool
from fabric.flowsim.routes import ConnectionPaths
from fabric.flowsim.shapes import _Template

#: phase replays (lockstep) kept at most, by total transfers held
PHASE_MEMO_TRANSFERS = 4_000_000
#: replay phases that repeat an earlier one (`PhaseReplays._phase_replay`); off: every phase simulated
PHASE_REPLAY = True
#: a phase's sizes are looked up by size >> this (a ring's chunks differ by a byte from step to step);
#: a match must then be within the resolution (`PhaseReplays._phase_replay`)
PHASE_SIZE_SHIFT = 6
#: sampled chains whose load intervals are kept for later calls of their collective, at most
CHAIN_LOADS_KEPT = 4096
#: `deps_left` of a transfer a chain of replayed phases began: it never reaches 0 again
CHAINED = 1 << 60

#: load intervals: (start, end, links, bits per second), the times as offsets from a phase's start
Intervals = tuple[tuple[float, float, IntArray, FloatArray], ...]
#: a chain of replayed phases: per phase, its transfers, its start and their delivery offsets
Chain = list[tuple[IntArray, float, FloatArray]]


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

    def log(self, from_s: float, until_s: float, used: IntArray, rate: FloatArray) -> None:
        """A load interval logged while the phase runs (absolute times), kept as offsets from its start."""
        self.loads.append((from_s - self.start_s, until_s - self.start_s, used, rate))


@dataclass(frozen=True)
class _PhaseRun:
    """What a watched phase did: its duration, each transfer's size and delivery (offset from the
    start), in key order, how many bytes each may differ by in a replay, the load intervals, and how
    many events it took."""

    duration_s: float
    size: IntArray
    end_off_s: FloatArray
    slack_bytes: FloatArray
    loads: Intervals
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


class Lockstep:
    """Per running job in lockstep: its open phase (every earlier one delivered), the transfers each
    phase has left, and the ready transfers of later phases held back, by phase."""

    def __init__(self, pool: TransferPool) -> None:
        self.pool = pool
        self.open_phase: dict[int, int] = {}
        self.phase_left: dict[int, IntArray] = {}
        self.held: dict[int, dict[int, list[IntArray]]] = {}

    def start(self, job: int, tpl: _Template, roots: IntArray) -> IntArray:
        """`job` starts with its phase 0 open: of its transfers without dependencies `roots` (pool
        indexes), those that may begin now (`gate`)."""
        self.open_phase[job] = 0
        self.phase_left[job] = tpl.shape.phase_size.copy()
        self.held[job] = {}
        return self.gate(job, tpl, roots)

    def forget(self, job: int) -> None:
        """`job` completed."""
        self.open_phase.pop(job, None)
        self.phase_left.pop(job, None)
        self.held.pop(job, None)

    def gate(self, job: int, tpl: _Template, ready: IntArray) -> IntArray:
        """Of the ready transfers `ready` (pool indexes) of `job`, those of its open phase or earlier;
        the others are held until their phase opens."""
        phase = tpl.shape.phase_of[ready - self.pool.base[job]]
        now_open = self.open_phase[job]
        later = phase > now_open
        if not later.any():
            return ready
        held = self.held[job]
        for p in np.unique(phase[later]).tolist():
            held.setdefault(p, []).append(ready[phase == p])
        return ready[~later]

    def delivered(self, job: int, tpl: _Template, local: IntArray) -> tuple[int, IntArray | None]:
        """Transfers `local` (indexes in the job's DAG) of `job` were delivered; if that completes its
        open phase, open the next (and any already complete). Returns (the phase completed, -1 if none;
        the held transfers that may begin now, None if none)."""
        left = self.phase_left[job]
        phase = tpl.shape.phase_of[local]
        if phase.size and phase[0] == phase[-1] and bool((phase == phase[0]).all()):  # the usual batch: one phase
            left[phase[0]] -= phase.size
        else:
            np.subtract.at(left, phase, 1)
        p = done = self.open_phase[job]
        if left[p]:
            return -1, None
        while p < left.size and not left[p]:
            p += 1
        self.open_phase[job] = p
        held = self.held[job]
        out = [a for q in sorted(q for q in held if q <= p) for a in held.pop(q)]
        return done, np.concatenate(out) if out else None


class PhaseReplays:
    """The phase being watched (`watch`), what watched phases did (`memo`; per block for phase sampling,
    `sample_runs`), and the replays due, by their event's key (`replays`). `lock` and `sample_phases` are
    per job; `polling`: whether the congestion feedback polls (a phase then never runs alone)."""

    def __init__(self, pool: TransferPool, flows: Flows, paths: ConnectionPaths, clock: Clock, lockstep: Lockstep,
                 lock: list[bool], sample_phases: list[int], polling: bool, resolution_s: float,
                 n_links: int) -> None:
        self.pool, self.flows, self.paths, self.clock, self.lockstep = pool, flows, paths, clock, lockstep
        self.lock, self.sample_phases, self.polling = lock, sample_phases, polling
        self.resolution_s, self.n_links = resolution_s, n_links
        self.job_scale: FloatArray | None = None  # per job, its latency scales (`Job`); None: all 1
        self.watch: _PhaseWatch | None = None
        self.memo: dict[tuple[int, bytes, bytes], _PhaseRun] = {}
        self.memo_transfers = 0
        # replays due, by event: (the chain of phases, each one's load intervals, whether sampled)
        self.replays: dict[int, tuple[Chain, list[Intervals], bool]] = {}
        # phase sampling: per (template, block), what the block's simulated phase did (calls of one
        # collective share them: a later call's blocks all run as the first call's did)
        # (its routing version, its run; transfers in DAG order)
        self.sample_runs: dict[tuple[int, int], tuple[int, _PhaseRun]] = {}
        # (template, first phase, phases, routing version) -> a replayed chain's load interval
        self.chain_loads: dict[tuple[int, int, int, int], Intervals] = {}
        self.phases_replayed = 0
        self.phases_sampled = 0

    def begin(self, g: IntArray) -> bool:
        """Transfers `g` (a batch that may be a phase) begin now: whatever was watched no longer runs
        alone. Returns True if they are a phase replayed (`_phase_replay`)."""
        if not PHASE_REPLAY:
            return False
        self.watch = None
        return self._phase_replay(g)

    def _phase_replay(self, g: IntArray) -> bool:
        """Transfers `g` begin now. If they are one whole phase of one job, beginning on an idle
        fabric (no other flow, no congestion polling), the phase runs as any identical phase before it
        ran: same routing version, same host pairs, same sizes (so the same flows, rates, events and
        deliveries, shifted in time). A ring's steps are such phases: the first is simulated event by
        event and watched (`_PhaseWatch`), the others are replayed from it in one timed event
        (`replayed`), unless some other event falls inside the phase. Returns True if the phase
        is replayed.

        Without lockstep (the DAG's own dependencies), a phase is replayed only from a watched run
        that delivered every transfer at one instant (`delivered`), and only where every later
        phase is tight (`_Shape.tight_from`): then nothing begins while it runs, and when it ends
        exactly the next phase begins, all of it, as under lockstep. A ring whose flows all get the
        same rate (planned source ports) is such a DAG; where they do not, its steps drift apart and
        are all simulated."""
        if self.flows.conn.size:
            return False
        of = self.pool.t_job[g]
        job = int(of[0])
        if of[-1] != job or not bool((of == job).all()):
            return False
        tpl = self.pool.template(job)
        if not tpl.shape.phases_closed:
            return False
        phase = tpl.shape.phase_of[g - self.pool.base[job]]
        p = int(phase[0])
        pair = self.pool.t_pair[g]
        if g.size != tpl.shape.phase_size[p] or not bool((phase == p).all()) or bool((pair < 0).any()):
            return False
        if self.sample_phases[job] > 1:
            return self._sampled_replay(job, tpl, p)
        if self.polling:
            return False
        if not self.lock[job] and p < tpl.shape.tight_from:
            return False
        g, key = self._phase_key(g)
        run = self.memo.get(key)
        if run is None or not run.fits(self.pool.t_size[g]):
            self.watch = _PhaseWatch(key, job, p, g, self.clock.now, [], self.clock.events)
            return False
        end_s = self.clock.now + run.duration_s
        next_event_s = self.clock.next_s()
        if next_event_s <= end_s:  # something else happens meanwhile: simulate it
            return False
        def alike(h: IntArray) -> IntArray | None:  # (the same pairs: none local, as the first)
            h, key_q = self._phase_key(h)
            return h if key_q == key and run.fits(self.pool.t_size[h]) else None

        chain, end_s = self._chain(job, tpl, p, g, run, next_event_s, len(tpl.shape.phase_size), alike)
        self._due(end_s, chain, [run.loads] * len(chain), False)
        return True

    def _chain(self, job: int, tpl: _Template, p: int, g: IntArray, run: _PhaseRun, next_event_s: float,
               stop: int, alike: Callable[[IntArray], IntArray | None]) -> tuple[Chain, float]:
        """Phase `p` of `job` (its transfers `g`, in `run`'s order) begins now and runs as `run` ran; so do
        the phases after it, before phase `stop`, one after another while each is `alike` (which gives its
        transfers in `run`'s order, or None) and ends before `next_event_s`. With the phases closed, all of
        a phase's dependencies are in earlier phases, so under lockstep the whole phase begins when the one
        before delivers its last transfer. Returns the chain (transfers, start, delivery offsets) and its
        end."""
        self.pool.start_s[g] = self.clock.now
        chain = [(g, self.clock.now, run.end_off_s)]
        end_s = self.clock.now + run.duration_s
        order, ptr = tpl.shape.phase_members
        base = self.pool.base[job]
        held = self.lockstep.held.get(job, {})
        q = p + 1
        while q < stop and end_s + run.duration_s < next_event_s and ptr[q + 1] - ptr[q] == g.size:
            h = alike(order[ptr[q]:ptr[q + 1]] + base)
            if h is None:
                break
            held.pop(q, None)  # (what waited for this phase begins with it, here)
            self.pool.start_s[h] = end_s
            # never ready again: begun here (their dependencies are delivered with the chain's)
            self.pool.deps_left[h] = CHAINED
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
        k = self.sample_phases[job]
        order, ptr = tpl.shape.phase_members
        h = order[ptr[p]:ptr[p + 1]] + self.pool.base[job]
        version, run = self.sample_runs.get((self.pool.job_tpl[job], p // k), (-1, None))
        if run is None or version != self.paths.version or run.size.size != h.size or not run.fits(self.pool.t_size[h]):
            # (a sampled watch's key holds only the routing version: its phase is matched by block, not pairs)
            self.watch = _PhaseWatch((self.paths.version, b"", b""), job, p, h, self.clock.now, [], self.clock.events,
                                     sampled=True)
            return False
        next_event_s = self.clock.next_s()
        if next_event_s <= self.clock.now + run.duration_s:  # something else happens meanwhile: simulate it
            return False

        def alike(hq: IntArray) -> IntArray | None:
            return hq if run.fits(self.pool.t_size[hq]) and not bool((self.pool.t_pair[hq] < 0).any()) else None

        chain, end_s = self._chain(job, tpl, p, h, run, next_event_s, min(len(ptr) - 1, (p // k + 1) * k), alike)
        # the chain's bytes on their own paths, evenly over it (one interval: a chain is at most a block of
        # phases, far shorter than the report's bins); the same chain of a later call logs the same
        key = (self.pool.job_tpl[job], p, len(chain), self.paths.version)
        loads = self.chain_loads.get(key)
        if loads is None:
            loads = self._own_loads(np.concatenate([g for g, _, _ in chain]), end_s - self.clock.now)
            if len(self.chain_loads) >= CHAIN_LOADS_KEPT:
                self.chain_loads.clear()
            self.chain_loads[key] = loads
        self._due(end_s, chain, [loads] + [()] * (len(chain) - 1), True)
        return True

    def _due(self, end_s: float, chain: Chain, loads: list[Intervals], sampled: bool) -> None:
        """The chain's phases end at `end_s` (`replayed`), each one's load intervals logged then."""
        key = self.clock.seq
        self.replays[key] = (chain, loads, sampled)
        self.clock.push(end_s, REPLAY_END, key)

    def _own_loads(self, g: IntArray, duration_s: float) -> Intervals:
        """Transfers `g`'s bytes as one load interval of `duration_s` on their connections' paths (the
        parts split as `Flows.start` splits them): ((0, duration, links, bits per second),)."""
        if not duration_s > 0:
            return ()
        pair = self.pool.t_pair[g]
        lo, hi = self.paths.pair_ptr[pair], self.paths.pair_ptr[pair + 1]
        k = hi - lo
        jk = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
        conn = np.repeat(lo, k) + jk
        each, extra = np.divmod(self.pool.t_size[g], k)
        part_bits = (np.repeat(each, k) + (jk < np.repeat(extra, k))) * 8.0
        self.paths.route(conn)
        rows = self.paths.conn_path[conn]
        on = rows >= 0
        bits = np.bincount(rows[on], weights=np.broadcast_to(part_bits[:, None], rows.shape)[on],
                           minlength=self.n_links)
        used = np.flatnonzero(bits > 0).astype(np.intp)
        return ((0.0, duration_s, used, bits[used] / duration_s),)

    def _phase_key(self, g: IntArray) -> tuple[IntArray, tuple[int, bytes, bytes]]:
        """Transfers `g` (one phase) in key order, and the key of a phase replay: the routing version,
        the host pairs and the sizes (to within 2**PHASE_SIZE_SHIFT bytes)."""
        pair = self.pool.t_pair[g]
        size = self.pool.t_size[g]
        if not bool((pair[1:] > pair[:-1]).all()):  # (a ring's step has its pairs in order already)
            order = np.lexsort((size, pair))
            g, pair, size = g[order], pair[order], size[order]
        key = (size >> PHASE_SIZE_SHIFT).tobytes()
        if self.job_scale is not None and g.size:  # a job's latency scales time its phase too
            key += self.job_scale[self.pool.t_job[g[0]]].tobytes()
        return g, (self.paths.version, pair.tobytes(), key)

    def replayed(self, payload: int) -> tuple[list[tuple[float, float, IntArray, FloatArray]], IntArray, FloatArray]:
        """Replayed phases (`replays[payload]`) end now: returns their load intervals to log (start, end,
        links, rates: times absolute, in order), their transfers and the times they were delivered."""
        chain, loads, sampled = self.replays.pop(payload)
        log = [(start_s + t0, start_s + t1, used, rate)
               for (_, start_s, _), intervals in zip(chain, loads) for t0, t1, used, rate in intervals]
        if sampled:
            self.phases_sampled += len(chain)
        else:
            self.phases_replayed += len(chain)
        g = np.concatenate([g for g, _, _ in chain])
        return log, g, np.concatenate([start_s + off for _, start_s, off in chain])

    def delivered(self, g: IntArray) -> None:
        """Transfers `g` are delivered now. Without lockstep, while a phase is watched: the watch is
        kept (`_watched_phase_done`) only if they are the whole watched phase, delivered at one
        instant; anything else ends it."""
        w = self.watch
        if w is None or self.lock[w.job]:
            return
        if g.size == w.g.size and bool((np.sort(g) == np.sort(w.g)).all()):
            self._watched_phase_done()
        self.watch = None

    def phase_done(self, job: int, p: int) -> None:
        """Lockstep: phase `p` of `job` has delivered its last transfer (`Lockstep.delivered`)."""
        if self.watch is not None and self.watch.job == job and self.watch.phase == p:
            self._watched_phase_done()

    def _watched_phase_done(self) -> None:
        """The watched phase has delivered its last transfer: remember what it did."""
        w, self.watch = self.watch, None
        if w is None:
            return
        end_off = self.pool.end_s[w.g] - w.start_s
        size = self.pool.t_size[w.g].copy()
        run = _PhaseRun(self.clock.now - w.start_s, size, end_off, _slack_bytes(self.resolution_s, size, end_off),
                        tuple(w.loads), self.clock.events - w.events)
        if w.sampled:  # its loads are not replayed (a block's phases log their own bytes)
            self.sample_runs[(self.pool.job_tpl[w.job], w.phase // self.sample_phases[w.job])] = (w.key[0], run)
            return
        if self.memo_transfers + w.g.size > PHASE_MEMO_TRANSFERS:
            self.memo.clear()
            self.memo_transfers = 0
        self.memo[w.key] = run
        self.memo_transfers += w.g.size

