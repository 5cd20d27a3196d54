"""One training step of a generated LLM job: every rank's nominal timeline (pure).

Every rank runs its stage's program (`traffic.llm.program`: the 1F1B or interleaved order of compute and
collectives) over its own groups (`_Groups`: per slot, "tp", "dp", "pp_next", ..., the rank's group).
Nominal timeline (`simulate_step`, a `_Timeline`): a collective starts when every member has issued it and
its stream is free on each (NCCL: the slowest member gates it; asynchronous ones keep their issue order on a
stream) and lasts size x count x busbw_factor x 8 / bandwidth, the bandwidth being `nvlink_gbps` for a group
inside one server (rank // gpus_per_server) and `nic_gbps` otherwise; no latency term, no contention between
groups. Ranks are advanced earliest clock first, so collectives are issued in time order.
Stragglers scale a rank's compute (`traffic.llm.stragglers.compute_multipliers`); the optimizer is
memory-bound and not scaled. Every step starts for all ranks when the slowest rank ended the previous one
(`rank_traces`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from heapq import heappop, heappush

import numpy as np

from traffic.llm.config import LLMConfig
from traffic.llm.program import Async, Block, CollectiveTemplate, Compute, Join, StageProgram, stage_program
from traffic.llm.stragglers import compute_multipliers
from traffic.metrics import busbw_factor
from traffic.workload import Collective, Interval, RankTrace, Step, TraceError

__all__ = ["compute_multipliers", "rank_traces", "simulate_step", "stage_program"]

#: One simulated rank's step: its compute intervals, its collectives and its end, relative to the step start.
RankStep = tuple[tuple[Interval, ...], tuple[Collective, ...], float]


# --- groups ---------------------------------------------------------------------------------------------------


class _Groups:
    """Each rank's group per slot, numbered; a group's size and bandwidth (Gbit/s)."""

    def __init__(self, cfg: LLMConfig) -> None:
        self.cfg = cfg
        self.grid = cfg.grid
        self.tuples: list[tuple[int, ...]] = []
        self.bw_gbps: list[float] = []
        self._ids: dict[tuple[str, tuple[int, ...]], int] = {}

    def gid(self, stream: str, ranks: tuple[int, ...]) -> int:
        """The number of `ranks`' group on `stream` (one group of ranks on two streams counts twice: its
        collectives there are matched separately)."""
        g = self._ids.get((stream, ranks))
        if g is None:
            g = self._ids[(stream, ranks)] = len(self.tuples)
            self.tuples.append(ranks)
            gs = self.cfg.gpus_per_server
            self.bw_gbps.append(self.cfg.nvlink_gbps if ranks[0] // gs == ranks[-1] // gs else self.cfg.nic_gbps)
        return g

    def slots(self, rank: int) -> dict[str, int]:
        grid, par = self.grid, self.cfg.parallel
        out: dict[str, int] = {}
        for axis in ("tp", "cp", "ep", "edp"):
            out[axis] = self.gid(axis, grid.group_of(axis, rank))
        out["etp"] = self.gid("etp", grid.group_of("etp", rank))
        if par.cp > 1:  # Megatron reduces dense gradients over data x context parallel ranks
            ranks = tuple(sorted(r for c in grid.group_of("cp", rank) for r in grid.group_of("dp", c)))
            out["dp"] = self.gid("dp", ranks)
        else:
            out["dp"] = self.gid("dp", grid.group_of("dp", rank))
        pp_group = grid.group_of("pp", rank)
        stage = grid.coords(rank)["pp"]
        if stage > 0:
            out["pp_prev"] = self.gid("pp", (pp_group[stage - 1], rank))
        if stage < par.pp - 1:
            out["pp_next"] = self.gid("pp", (rank, pp_group[stage + 1]))
        if par.pp > 1:
            out["emb"] = self.gid("emb", (pp_group[0], pp_group[-1]))
            if stage in (0, par.pp - 1):  # interleaved: the last stage's chunk c feeds the first stage's chunk c + 1
                out["pp_wrap"] = self.gid("pp", (pp_group[0], pp_group[-1]))
        return out


# --- the nominal timeline ---------------------------------------------------------------------------------------

#: what a rank waits for: nothing, its blocking batch, its asynchronous ones, some asynchronous ones (a Join)
_RUNNING, _ON_BLOCK, _ON_ASYNC, _ON_JOIN = 0, 1, 2, 3


@dataclass(slots=True, eq=False)
class _Instance:
    """A collective on one group, the members' issues of one template (matched by group and identity)."""

    left: int  # members still to issue it
    issued: float  # the last issue so far: it starts no earlier
    gid: int
    stream: str
    duration: float  # us; the largest of the members' (the largest send buffer of a skewed all-to-all)
    fifo: bool  # keeps its issue order on its stream on every member (asynchronous, not point-to-point)
    issuers: list[tuple[int, bool]] = field(default_factory=list)  # (member, whether its compute waits for it)
    start: float = 0.0
    end: float = 0.0
    started: bool = False


class _Timeline:
    """One step's nominal timeline over the ranks `sim` (`simulate_step`): their program counters and clocks,
    the collective instances, and each (rank, stream)'s free time and queue of asynchronous instances."""

    def __init__(self, cfg: LLMConfig, programs: list[StageProgram], groups: _Groups, slots: list[dict[str, int]],
                 mult: np.ndarray, t0: float, sim: list[int], members_of: list[tuple[int, ...]]) -> None:
        world = cfg.world_size
        self.cfg, self.programs, self.groups = cfg, programs, groups
        self.t0, self.sim, self.members_of = t0, sim, members_of
        # per rank, slot -> its group, or -1 where the group is the rank alone (nothing to issue)
        self.gid_of: list[dict[str, int]] = [{} for _ in range(world)]
        for r in sim:
            self.gid_of[r] = {s: (g if len(groups.tuples[g]) > 1 else -1) for s, g in slots[r].items()}
        self.rows = mult.tolist()
        self.per_mb = mult.shape[-1] > 1
        self.insts: dict[tuple[int, object], _Instance] = {}  # (gid, identity) -> its instance
        self.queues: dict[tuple[int, str], deque[_Instance]] = {}
        self.free: dict[tuple[int, str], float] = {}
        self.pc = [0] * world
        self.clock = [t0] * world
        self.wait_left = [0] * world  # blocking collectives not ended yet
        self.async_open = [0] * world
        self.async_end = [t0] * world
        self.waiting = [_RUNNING] * world
        self.joining: list[list[_Instance]] = [[] for _ in range(world)]  # what a rank's Join waits for
        self.compute: list[list[list[float]]] = [[] for _ in range(world)]
        self.records: list[list[tuple[CollectiveTemplate, _Instance]]] = [[] for _ in range(world)]
        self.ready = [(t0, r) for r in sim]  # (clock, rank): ranks advance earliest first, so issues come in time order

    def run(self) -> tuple[list[RankStep], float]:
        """Every rank of `sim` to its program's end; per rank its step (times relative to t0), and the slowest
        rank's end (absolute)."""
        ready = self.ready
        while ready:
            self._advance(heappop(ready)[1])
        stuck = [r for r in self.sim if self.pc[r] < len(self.programs[r].ops)]
        if stuck:
            raise TraceError(f"{self.cfg.name}: the step schedule deadlocked: rank {stuck[0]} (and {len(stuck) - 1} "
                             f"more) waits at op {self.pc[stuck[0]]} (a bug in traffic.llm.schedule)")
        return self._rank_steps(), max(self.clock[r] for r in self.sim)

    def _advance(self, r: int) -> None:
        """Rank `r`'s ops from its program counter on, until it waits, ends, or its clock passes the next rank's."""
        ops = self.programs[r].ops
        n_ops = len(ops)
        i = self.pc[r]
        t = self.clock[r]
        gid_of, insts, ready, waiting = self.gid_of[r], self.insts, self.ready, self.waiting
        if waiting[r] == _RUNNING and i > 0:  # resumed after a block or the wait
            prev = ops[i - 1]
            if isinstance(prev, (Block, Join)):
                t = max([t] + [insts[(gid_of[c.slot], c.ident)].end for c in prev.colls if gid_of[c.slot] >= 0])
        mrow, per_mb = self.rows[r], self.per_mb
        while i < n_ops:
            op = ops[i]
            if isinstance(op, Compute):
                us = op.us
                if us > 0:
                    mb = op.micro_batch
                    end = t + us * (mrow[mb if per_mb else 0] if mb >= 0 else 1.0)
                    iv = self.compute[r]
                    if iv and iv[-1][1] == t:
                        iv[-1][1] = end
                    else:
                        iv.append([t, end])
                    t = end
                i += 1
                if ready and t > ready[0][0]:  # let the ranks behind catch up before issuing more
                    heappush(ready, (t, r))
                    break
            elif isinstance(op, Block):
                i += 1
                for c in op.colls:
                    if gid_of[c.slot] >= 0:
                        self._issue(r, c, t, True)
                if self.wait_left[r]:
                    waiting[r] = _ON_BLOCK
                    break
                ends = [insts[(gid_of[c.slot], c.ident)].end for c in op.colls if gid_of[c.slot] >= 0]
                if ends:
                    t = max(t, max(ends))
            elif isinstance(op, Async):
                for c in op.colls:
                    if gid_of[c.slot] >= 0:
                        self._issue(r, c, t, False)
                i += 1
            elif isinstance(op, Join):
                i += 1
                mine = [insts[(gid_of[c.slot], c.ident)] for c in op.colls if gid_of[c.slot] >= 0]
                if not all(inst.started for inst in mine):
                    self.joining[r] = mine
                    waiting[r] = _ON_JOIN
                    break
                t = max([t] + [inst.end for inst in mine])
            else:  # WaitAsync
                if self.async_open[r]:
                    waiting[r] = _ON_ASYNC
                    break
                t = max(t, self.async_end[r])
                i += 1
        self.pc[r] = i
        self.clock[r] = t

    def _issue(self, rank: int, tmpl: CollectiveTemplate, t: float, blocking: bool) -> None:
        """`rank` issues `tmpl` at `t` on its group; the last member to issue it starts it (`_start`)."""
        gid = self.gid_of[rank][tmpl.slot]
        key = (gid, tmpl.ident)
        inst = self.insts.get(key)
        stream = tmpl.stream
        groups = self.groups
        dur = (tmpl.size_bytes * tmpl.count * busbw_factor(tmpl.kind, len(groups.tuples[gid])) * 8
               / (groups.bw_gbps[gid] * 1e3))
        if inst is None:
            # asynchronous collectives (gradient buckets) keep their issue order on a stream; blocking ones and
            # point-to-point transfers start as soon as every member has issued them and the stream is free
            inst = self.insts[key] = _Instance(len(self.members_of[gid]), t, gid, stream, dur,
                                               not blocking and stream != "pp")
        else:  # the last member to issue it and the largest send buffer (skewed all-to-all) decide
            if t > inst.issued:
                inst.issued = t
            if dur > inst.duration:
                inst.duration = dur
        inst.left -= 1
        inst.issuers.append((rank, blocking))
        if inst.fifo:
            q = self.queues.get((rank, stream))
            if q is None:
                q = self.queues[(rank, stream)] = deque()
            q.append(inst)
        self.records[rank].append((tmpl, inst))
        if blocking:
            self.wait_left[rank] += 1
        else:
            self.async_open[rank] += 1
        if inst.left == 0:
            self._start(inst)

    def _start(self, first: _Instance) -> None:
        """Start `first`, issued by every member, once its stream is free (and, fifo, it heads its queue) on each;
        then the instances it held up in their queues."""
        queues, free, t0 = self.queues, self.free, self.t0
        todo = [first]
        while todo:
            inst = todo.pop()
            stream, fifo = inst.stream, inst.fifo
            members = self.members_of[inst.gid]
            t = inst.issued
            for mem in members:
                if fifo and queues[(mem, stream)][0] is not inst:
                    break
                f = free.get((mem, stream), t0)
                if f > t:
                    t = f
            else:
                end = t + inst.duration
                inst.start, inst.end, inst.started = t, end, True
                for mem in members:
                    free[(mem, stream)] = end
                for mem, blocking in inst.issuers:
                    self._ended(mem, blocking, end)
                if fifo:
                    for mem in members:
                        q = queues[(mem, stream)]
                        q.popleft()
                        if q and q[0].left == 0:
                            todo.append(q[0])

    def _ended(self, rank: int, blocking: bool, end: float) -> None:
        """A collective `rank` issued ends at `end`: `rank` runs on if it was the last one it waited for."""
        waiting = self.waiting
        if blocking:
            self.wait_left[rank] -= 1
            if self.wait_left[rank] == 0 and waiting[rank] == _ON_BLOCK:
                waiting[rank] = _RUNNING
                heappush(self.ready, (max(end, self.clock[rank]), rank))
        else:
            self.async_open[rank] -= 1
            if end > self.async_end[rank]:
                self.async_end[rank] = end
            if self.async_open[rank] == 0 and waiting[rank] == _ON_ASYNC:
                waiting[rank] = _RUNNING
                heappush(self.ready, (max(self.async_end[rank], self.clock[rank]), rank))
            elif waiting[rank] == _ON_JOIN and all(inst.started for inst in self.joining[rank]):
                waiting[rank] = _RUNNING
                heappush(self.ready, (max([self.clock[rank]] + [inst.end for inst in self.joining[rank]]), rank))

    def _rank_steps(self) -> list[RankStep]:
        """Per rank of `sim`: compute intervals, collectives (by start) and end, relative to t0."""
        t0, groups = self.t0, self.groups
        made: dict[tuple[int, int], Collective] = {}  # one object per instance and template, shared by members
        out = []
        for r in self.sim:
            colls = []
            for tmpl, inst in self.records[r]:
                c = made.get((id(inst), id(tmpl)))
                if c is None:
                    c = made[(id(inst), id(tmpl))] = Collective(
                        kind=tmpl.kind, size_bytes=tmpl.size_bytes, dtype=tmpl.dtype,
                        group_ranks=groups.tuples[inst.gid], stream=inst.stream, start_us=inst.start - t0,
                        duration_us=inst.end - inst.start, name=tmpl.name, count=tmpl.count)
                colls.append(c)
            colls.sort(key=lambda c: c.start_us or 0.0)  # by start: what members share is listed in one order on all
            out.append((tuple((a - t0, b - t0) for a, b in self.compute[r]), tuple(colls), self.clock[r] - t0))
        return out


def simulate_step(cfg: LLMConfig, programs: list[StageProgram], groups: _Groups, slots: list[dict[str, int]],
                  mult: np.ndarray, t0: float, sim: list[int], members_of: list[tuple[int, ...]]
                  ) -> tuple[list[RankStep], float]:
    """Run the programs (`programs[rank]`) of the ranks `sim` from `t0`; per rank of `sim` (compute intervals,
    collectives, end), times relative to `t0`, and the slowest rank's end (absolute). `mult`: the ranks' compute
    multipliers per micro-batch; `members_of`: per group, its members among `sim`."""
    return _Timeline(cfg, programs, groups, slots, mult, t0, sim, members_of).run()


# --- the job's steps --------------------------------------------------------------------------------------------


def _tp_symmetric(cfg: LLMConfig, mult: np.ndarray) -> bool:
    """Whether the ranks of every TP group run the same timeline, so that one of them stands for all: the same
    compute, no expert group across TP ranks (etp = tp, or no EP), groups shifted by a TP offset staying
    inside or across servers as they were (tp divides the server or the server divides tp), and no stream whose
    order depends on the order ranks are run in."""
    par, g = cfg.parallel, cfg.gpus_per_server
    if par.tp == 1 or (par.ep > 1 and par.expert_tp != par.tp) or (g % par.tp and par.tp % g):
        return False
    if par.virtual_stages > 1 or par.zero == 3:
        # streams there are shared by transfers that start in the order the ranks get to them (interleaved
        # point-to-point, FSDP gathers next to buckets): running fewer ranks would change that order
        return False
    by_group = mult.reshape(mult.shape[0], -1, par.tp, mult.shape[2])
    return bool((by_group == by_group[:, :, :1, :]).all())


def rank_traces(cfg: LLMConfig) -> tuple[tuple[RankTrace, ...], list[float]]:
    """Every rank's `cfg.steps` steps on the nominal timeline, and each step's time (the slowest rank's).
    Where TP ranks are alike (`_tp_symmetric`) only TP rank 0 of each group is run; TP rank j's timeline is its,
    with every group but the TP group shifted by j ranks."""
    par = cfg.parallel
    grid = cfg.grid
    world = cfg.world_size
    skewed = cfg.model.moe is not None and cfg.model.moe.routing_skew > 0 and par.ep > 1
    keys = [(grid.coords(r)["pp"], grid.expert_coords(r)["ep"] if skewed else None) for r in range(world)]
    index: dict[tuple[int, int | None], int] = {}
    programs: list[StageProgram] = []
    for key in keys:
        if key not in index:
            index[key] = len(programs)
            programs.append(stage_program(cfg, *key))
    prog_of = [programs[index[key]] for key in keys]
    groups = _Groups(cfg)
    slots = [groups.slots(r) for r in range(world)]
    mult = compute_multipliers(cfg)
    tp = par.tp if _tp_symmetric(cfg, mult) else 1
    sim = list(range(0, world, tp))
    members_of = [tuple(r for r in g if r % tp == 0) for g in groups.tuples]
    varies = cfg.stragglers.jitter_cv > 0
    steps: list[list[Step]] = [[] for _ in range(world)]
    step_us: list[float] = []
    t0 = 0.0
    made: list[Step] | None = None
    for k in range(cfg.steps):
        if made is None or varies:
            result, t_end = simulate_step(cfg, prog_of, groups, slots, mult[k], t0, sim, members_of)
            made = _expand(k, result, tp, world)
            step_us.append(t_end - t0)
        else:
            made = [Step(k, s.duration_us, s.compute, s.collectives) for s in made]
            step_us.append(step_us[-1])
        t0 += step_us[-1]
        for r, s in enumerate(made):
            steps[r].append(s)
    return tuple(RankTrace(r, tuple(s)) for r, s in enumerate(steps)), step_us


def _with_group(c: Collective, group_ranks: tuple[int, ...]) -> Collective:
    """`c` over `group_ranks`: `dataclasses.replace` without its generic machinery (a 1,024-GPU step makes 300k;
    `Collective` has no `__post_init__` to run)."""
    d = object.__new__(Collective)
    d.__dict__.update(c.__dict__)
    d.__dict__["group_ranks"] = group_ranks
    return d


def _expand(number: int, result: list[RankStep], tp: int, world: int) -> list[Step]:
    """Every rank's Step from the simulated ranks' (TP rank 0 of each group when tp > 1)."""
    out: list[Step] = []
    shifted: dict[tuple[int, int], Collective] = {}  # (id of rank 0's collective, offset) -> rank j's, shared
    groups: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}
    for compute, colls, end in result:
        out.append(Step(number, end, compute, colls))
        rep = len(out) - 1  # the simulated rank, TP rank 0 of its group
        for j in range(1, tp):
            mine = []
            for c in colls:
                if rep + j in c.group_ranks:  # its TP group: the same collective
                    mine.append(c)
                    continue
                d = shifted.get((id(c), j))
                if d is None:
                    g = groups.get((c.group_ranks, j))
                    if g is None:
                        g = groups[(c.group_ranks, j)] = tuple(r + j for r in c.group_ranks)
                    d = shifted[(id(c), j)] = _with_group(c, g)
                mine.append(d)
            out.append(Step(number, end, compute, tuple(mine)))
    if len(out) != world:
        raise TraceError(f"internal: {len(out)} rank timelines for {world} ranks")
    return out
