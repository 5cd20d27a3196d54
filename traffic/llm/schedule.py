"""One training step of a generated LLM job: every rank's program and the nominal timeline (pure).

Programs (per pipeline stage; every rank of a stage runs the same one over its own groups):
- Megatron's non-interleaved 1F1B: stage s of `pp` runs W = min(pp - s - 1, m) warm-up forwards, m - W
  steady forward/backward pairs, then W cool-down backwards (m = micro-batches). Point-to-point transfers
  are batched as Megatron's `send_forward_recv_backward` / `send_backward_recv_forward` do, and block
  compute (Megatron waits on them); the two transfers of a batch run one after the other on stream "pp".
- A forward of a micro-batch: receive the activation (stage > 0), compute its layers (plus the output
  layer on the last stage), the layers' tensor-, context- and expert-parallel collectives (one entry per
  kind and size, `count` = layers x per-layer count; they block compute), send to the next stage. A
  backward mirrors it. Compute per GPU = whole-layer FLOPs / (tp x cp) at `model.compute_us`.
- Gradient buckets (`rules.dp_buckets`) go on stream "dp" ("edp" for expert buckets) as the last
  micro-batch's backward finishes their layers (`overlap_grad_reduce`; else all after the flush), without
  blocking compute; the tied-embedding all-reduce ("emb") after the flush. The step then waits for them,
  runs the optimizer (`optimizer_us`), and the ZeRO parameter all-gathers (`rules.param_gathers`).
Nominal timeline: a collective starts when every member has issued it and its stream is free on each
(NCCL: the slowest member gates it) and lasts size x busbw_factor x 8 / bandwidth, the bandwidth being
`nvlink_gbps` for a group inside one server (rank // gpus_per_server) and `nic_gbps` otherwise; no
latency term. Stragglers scale a rank's compute (`compute_multipliers`); the optimizer is memory-bound and
not scaled. Every step starts for all ranks when the slowest rank ended the previous one.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from traffic.llm import model, rules
from traffic.llm.model import Pass
from traffic.llm.config import LLMConfig
from traffic.metrics import busbw_factor
from traffic.workload import Collective, Interval, RankTrace, Step, TraceError

#: HBM bandwidth per GPU in bytes/s (vendor data sheets: A100 80GB SXM, H100 SXM, H200, B200), for the optimizer.
HBM_BYTES_PER_S = {"a100": 2.039e12, "h100": 3.35e12, "h200": 4.8e12, "b200": 8.0e12}
#: Bytes the Adam step reads and writes per parameter with fp32 master weights: reads grad, master, m, v
#: (4 x 4), writes master, m, v (3 x 4) and the bf16 copy (2).
ADAM_BYTES_PER_PARAM = 30

# ops of a program: (op code, payload); collectives are templates (slot, occ, kind, size, count, dtype, name)
_COMPUTE, _BLOCK, _ASYNC, _WAIT = 0, 1, 2, 3
_STREAM = {"pp_prev": "pp", "pp_next": "pp"}
_BLOCKING_SLOTS = {"tp", "cp", "ep", "etp", "pp_prev", "pp_next"}


@dataclass(frozen=True)
class StageProgram:
    """One pipeline stage's step: `ops` as (code, payload) and the order of its micro-batch passes."""

    stage: int
    ops: tuple[tuple[int, Any], ...]
    passes: tuple[str, ...]  # its compute's micro-batch passes "F0", "B0", ... in program order
    forward_us: float  # compute of one micro-batch's forward on one GPU, before stragglers
    backward_us: float


def optimizer_us(cfg: LLMConfig, stage: int) -> float:
    """The optimizer step on one GPU of `stage`, memory-bound: ADAM_BYTES_PER_PARAM x its parameters / HBM
    bandwidth. Its parameters: those of the stage's gradient buckets (already split over tp, and experts over
    etp x ep), over dp x cp more (experts: edp) with a distributed optimizer (zero >= 1)."""
    par = cfg.parallel
    params = 0.0
    for b in rules.dp_buckets(cfg, stage):
        share = 1 if par.zero == 0 else (par.dp * par.cp if b.axis == "dp" else cfg.grid.edp)
        params += b.params / share
    return params * ADAM_BYTES_PER_PARAM / HBM_BYTES_PER_S[cfg.compute.gpu] * 1e6


def stage_program(cfg: LLMConfig, stage: int, ep_rank: int | None = None) -> StageProgram:
    """The ops of one step on `stage` (see the module docstring); `ep_rank`: the expert-parallel rank whose
    all-to-all sizes to use under skewed routing (None: the uniform size)."""
    par = cfg.parallel
    if par.virtual_stages > 1:
        raise TraceError(f"{cfg.name}: parallel.virtual_stages = {par.virtual_stages}: the interleaved 1F1B schedule "
                         "is not supported yet (use virtual_stages = 1)")
    pp, m = par.pp, cfg.micro_batches
    first, last = stage == 0, stage == pp - 1
    layers = list(model.stage_layers(cfg, stage))
    tokens = cfg.micro_batch * cfg.model.seq_len
    split = par.tp * par.cp
    fwd_layer = [model.compute_us(cfg, model.layer_flops(cfg, i, tokens, "fwd") / split) for i in layers]
    bwd_layer = [model.compute_us(cfg, model.layer_flops(cfg, i, tokens, "bwd") / split) for i in layers]
    head_f = model.compute_us(cfg, model.head_flops(cfg, tokens, "fwd") / split) if last else 0.0
    head_b = model.compute_us(cfg, model.head_flops(cfg, tokens, "bwd") / split) if last else 0.0
    occ: dict[str, int] = {}

    def coll(slot: str, kind: str, size: int, count: int, dtype: str, name: str) -> tuple:
        k = occ.get(slot, 0)
        occ[slot] = k + 1
        return (slot, k, kind, size, count, dtype, name)

    def layer_comms(pass_: Pass) -> list[tuple[str, str, int, str, str, int]]:
        """The stage's layer collectives of one pass, one entry per (axis, kind, size, dtype) with their count."""
        count: dict[tuple[str, str, int, str], int] = {}
        whats: dict[tuple[str, str, int, str], list[str]] = {}
        for i in layers:
            for spec in (rules.tp_comms(cfg, i, pass_) + rules.cp_comms(cfg, i, pass_)
                         + rules.ep_comms(cfg, i, pass_, ep_rank)):
                key = (spec.axis, spec.kind, spec.size_bytes, spec.dtype)
                count[key] = count.get(key, 0) + spec.count
                if spec.what not in whats.setdefault(key, []):
                    whats[key].append(spec.what)
        span = f"layers {layers[0]}-{layers[-1]}" if layers else "no layers"
        return [(a, k, s, d, f"{pass_} {span}: {'; '.join(whats[(a, k, s, d)])}", n)
                for (a, k, s, d), n in count.items()]

    comms = {"fwd": layer_comms("fwd"), "bwd": layer_comms("bwd")}
    p2p = rules.pp_p2p_bytes(cfg)
    buckets = rules.dp_buckets(cfg, stage)
    ops: list[tuple[int, Any]] = []

    def act(slot: str) -> tuple:
        return coll(slot, "send_recv", p2p, 1, cfg.dtype, "activation")

    def grad(slot: str) -> tuple:
        return coll(slot, "send_recv", p2p, 1, cfg.dtype, "activation gradient")

    def block(*colls: tuple) -> None:
        ops.append((_BLOCK, colls))

    def compute(us: float, mb: int, what: str) -> None:
        ops.append((_COMPUTE, (us, mb, what)))

    def run_comms(pass_: Pass) -> None:
        for axis, kind, size, dtype, name, count in comms[pass_]:
            block(coll(axis, kind, size, count, dtype, name))

    def issue_buckets(which: list) -> None:
        if which:
            ops.append((_ASYNC, tuple(coll(b.axis, b.kind, b.size_bytes, 1, b.dtype,
                                           f"gradients of layers {b.first_layer}-{b.last_layer}") for b in which)))

    gathers = rules.param_gathers(cfg, stage) if par.zero == 3 else []
    n_fwd_gathers = len(gathers) // 2

    def fsdp_gathers(pass_: Pass) -> None:  # FSDP: a layer's parameters are gathered before each pass over it
        for spec in (gathers[:n_fwd_gathers] if pass_ == "fwd" else gathers[n_fwd_gathers:]):
            block(coll(spec.axis, spec.kind, spec.size_bytes, spec.count, spec.dtype, spec.what))

    def forward(i: int) -> None:
        fsdp_gathers("fwd")
        compute(sum(fwd_layer) + head_f, i, f"F{i}")
        run_comms("fwd")

    def backward(i: int) -> None:
        fsdp_gathers("bwd")
        if i == m - 1 and par.overlap_grad_reduce:  # grads fill in reverse: issue each bucket when its layers are done
            compute(head_b, i, f"B{i}")
            issue_buckets([b for b in buckets if b.first_layer > layers[-1]])  # the output layer's
            pending = [b for b in buckets if b.first_layer <= layers[-1]]
            for pos in reversed(range(len(layers))):
                compute(bwd_layer[pos], i, f"B{i}")
                ready = [b for b in pending if b.first_layer == layers[pos]]
                pending = [b for b in pending if b.first_layer != layers[pos]]
                issue_buckets(ready)
            run_comms("bwd")
            issue_buckets(pending)  # the input embedding's (layer -1)
        else:
            compute(sum(bwd_layer) + head_b, i, f"B{i}")
            run_comms("bwd")

    warm = min(pp - stage - 1, m)
    steady = m - warm
    for i in range(warm):
        if not first:
            block(act("pp_prev"))
        forward(i)
        if not last:
            block(act("pp_next"))
    if steady and not first:
        block(act("pp_prev"))
    for i in range(steady):
        forward(warm + i)
        if not last:
            block(act("pp_next"), grad("pp_next"))  # send_forward_recv_backward
        backward(i)
        if not first:
            if i == steady - 1:
                block(grad("pp_prev"))
            else:
                block(act("pp_prev"), grad("pp_prev"))  # send_backward_recv_forward
    for i in range(steady, m):
        if not last:
            block(grad("pp_next"))
        backward(i)
        if not first:
            block(grad("pp_prev"))
    if not par.overlap_grad_reduce:
        issue_buckets(list(buckets))
    emb = rules.embedding_sync(cfg)
    if emb is not None and (first or last):
        ops.append((_ASYNC, (coll("emb", emb.kind, emb.size_bytes, emb.count, emb.dtype, emb.what),)))
    ops.append((_WAIT, None))
    ops.append((_COMPUTE, (optimizer_us(cfg, stage), -1, "optimizer")))
    for spec in rules.param_gathers(cfg, stage) if par.zero in (1, 2) else []:
        block(coll(spec.axis, spec.kind, spec.size_bytes, spec.count, spec.dtype, spec.what))
    passes: list[str] = []
    for code, payload in ops:
        if code == _COMPUTE and payload[2] != "optimizer" and (not passes or passes[-1] != payload[2]):
            passes.append(payload[2])
    return StageProgram(stage, tuple(ops), tuple(passes), sum(fwd_layer) + head_f, sum(bwd_layer) + head_b)


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
        return out


# --- stragglers -----------------------------------------------------------------------------------------------


def compute_multipliers(cfg: LLMConfig) -> np.ndarray:
    """Per (step, rank, micro-batch) compute multipliers: lognormal jitter of mean 1 and CV `jitter_cv`
    (sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2), drawn per (rank, step) or per (rank, step, micro-batch) from
    numpy's Generator(seed), times `slow_factor` on `slow_ranks` and the ranks of `slow_servers`."""
    st, world, m = cfg.stragglers, cfg.world_size, cfg.micro_batches
    base = np.ones(world)
    for r in st.slow_ranks:
        if not 0 <= r < world:
            raise TraceError(f"{cfg.name}: stragglers.slow_ranks: rank {r} is not in the {world}-rank job")
        base[r] *= st.slow_factor
    servers = -(-world // cfg.gpus_per_server)
    for s in st.slow_servers:
        if not 0 <= s < servers:
            raise TraceError(f"{cfg.name}: stragglers.slow_servers: server {s} is not in the job's {servers} servers")
        base[s * cfg.gpus_per_server:(s + 1) * cfg.gpus_per_server] *= st.slow_factor
    out = np.broadcast_to(base[None, :, None], (cfg.steps, world, m)).copy()
    if st.jitter_cv > 0:
        rng = np.random.default_rng(st.seed)
        sigma2 = np.log1p(st.jitter_cv ** 2)
        shape = (cfg.steps, world, m if st.jitter_per == "microbatch" else 1)
        out *= rng.lognormal(-sigma2 / 2, np.sqrt(sigma2), size=shape)
    return out


# --- the nominal timeline ---------------------------------------------------------------------------------------


def simulate_step(cfg: LLMConfig, programs: list[StageProgram], groups: _Groups, slots: list[dict[str, int]],
                  mult: np.ndarray, t0: float) -> tuple[list[tuple[tuple[Interval, ...], tuple[Collective, ...], float]],
                                                        float]:
    """Run every rank's program (`programs[rank]`) from `t0`; per rank (compute intervals, collectives, end), times
    relative to `t0`, and the slowest rank's end (absolute). `mult`: the rank's compute multipliers per micro-batch."""
    world = cfg.world_size
    rows = mult.tolist()
    insts: dict[tuple[int, int], list] = {}  # (gid, occ) -> [left, issue, start, end, gid, stream, dur, blocking]
    queues: dict[tuple[int, str], deque] = {}
    free: dict[tuple[int, str], float] = {}
    pc = [0] * world
    clock = [t0] * world
    wait_left = [0] * world  # blocking collectives not ended yet
    async_open = [0] * world
    async_end = [t0] * world
    waiting = [0] * world  # 0 running, 1 blocked on a batch, 2 on the asynchronous ones
    compute: list[list[list[float]]] = [[] for _ in range(world)]
    records: list[list] = [[] for _ in range(world)]
    ready = list(range(world - 1, -1, -1))

    def start(key: tuple[int, int]) -> None:
        todo = [key]
        while todo:
            k = todo.pop()
            inst = insts[k]
            stream = inst[5]
            members = groups.tuples[inst[4]]
            t = inst[1]
            for mem in members:
                q = queues[(mem, stream)]
                if q[0] != k:
                    break
                f = free.get((mem, stream), t0)
                if f > t:
                    t = f
            else:
                end = t + inst[6]
                inst[2], inst[3] = t, end
                for mem in members:
                    q = queues[(mem, stream)]
                    q.popleft()
                    free[(mem, stream)] = end
                    if inst[7]:
                        wait_left[mem] -= 1
                        if wait_left[mem] == 0 and waiting[mem] == 1:
                            waiting[mem] = 0
                            ready.append(mem)
                    else:
                        async_open[mem] -= 1
                        if end > async_end[mem]:
                            async_end[mem] = end
                        if async_open[mem] == 0 and waiting[mem] == 2:
                            waiting[mem] = 0
                            ready.append(mem)
                    if q:
                        nxt = insts[q[0]]
                        if nxt[0] == 0:
                            todo.append(q[0])

    def issue(rank: int, tmpl: tuple, t: float, blocking: bool) -> None:
        slot = tmpl[0]
        gid = slots[rank][slot]
        key = (gid, tmpl[1])
        inst = insts.get(key)
        stream = _STREAM.get(slot, slot)
        n = len(groups.tuples[gid])
        dur = tmpl[3] * tmpl[4] * busbw_factor(tmpl[2], n) * 8 / (groups.bw_gbps[gid] * 1e3)
        if inst is None:
            inst = insts[key] = [n, t, 0.0, 0.0, gid, stream, dur, blocking]
        else:  # the last member to issue it and the largest send buffer (skewed all-to-all) decide
            if t > inst[1]:
                inst[1] = t
            if dur > inst[6]:
                inst[6] = dur
        inst[0] -= 1
        q = queues.get((rank, stream))
        if q is None:
            q = queues[(rank, stream)] = deque()
        q.append(key)
        records[rank].append((tmpl, gid, key))
        if blocking:
            wait_left[rank] += 1
        else:
            async_open[rank] += 1
        if inst[0] == 0:
            start(key)

    while ready:
        r = ready.pop()
        ops = programs[r].ops
        n_ops = len(ops)
        i = pc[r]
        t = clock[r]
        if waiting[r] == 0 and i > 0:  # resumed after a block or the wait
            prev = ops[i - 1]
            if prev[0] == _BLOCK:
                t = max(t, max(insts[(slots[r][c[0]], c[1])][3] for c in prev[1]))
        mrow = rows[r]
        while i < n_ops:
            code, payload = ops[i]
            if code == _COMPUTE:
                us, mb, _ = payload
                if us > 0:
                    end = t + us * (mrow[mb] if mb >= 0 else 1.0)
                    iv = compute[r]
                    if iv and iv[-1][1] == t:
                        iv[-1][1] = end
                    else:
                        iv.append([t, end])
                    t = end
                i += 1
            elif code == _BLOCK:
                i += 1
                for c in payload:
                    if len(groups.tuples[slots[r][c[0]]]) > 1:
                        issue(r, c, t, True)
                if wait_left[r]:
                    waiting[r] = 1
                    break
                ends = [insts[(slots[r][c[0]], c[1])][3] for c in payload
                        if len(groups.tuples[slots[r][c[0]]]) > 1]
                if ends:
                    t = max(t, max(ends))
            elif code == _ASYNC:
                for c in payload:
                    if len(groups.tuples[slots[r][c[0]]]) > 1:
                        issue(r, c, t, False)
                i += 1
            else:
                if async_open[r]:
                    waiting[r] = 2
                    break
                t = max(t, async_end[r])
                i += 1
        pc[r] = i
        clock[r] = t
    stuck = [r for r in range(world) if pc[r] < len(programs[r].ops)]
    if stuck:
        raise TraceError(f"{cfg.name}: the step schedule deadlocked: rank {stuck[0]} (and {len(stuck) - 1} more) "
                         f"waits at op {pc[stuck[0]]} (a bug in traffic.llm.schedule)")
    made: dict[tuple[tuple[int, int], int], Collective] = {}  # one object per instance and template, shared by members
    out = []
    for r in range(world):
        colls = []
        for tmpl, gid, key in records[r]:
            c = made.get((key, id(tmpl)))
            if c is None:
                inst = insts[key]
                c = made[(key, id(tmpl))] = Collective(
                    kind=tmpl[2], size_bytes=tmpl[3], dtype=tmpl[5], group_ranks=groups.tuples[gid], stream=inst[5],
                    start_us=inst[2] - t0, duration_us=inst[3] - inst[2], name=tmpl[6], count=tmpl[4])
            colls.append(c)
        out.append((tuple((a - t0, b - t0) for a, b in compute[r]), tuple(colls), clock[r] - t0))
    return out, max(clock)


def rank_traces(cfg: LLMConfig) -> tuple[tuple[RankTrace, ...], list[float]]:
    """Every rank's `cfg.steps` steps on the nominal timeline, and each step's time (the slowest rank's)."""
    par = cfg.parallel
    grid = cfg.grid
    skewed = cfg.model.moe is not None and cfg.model.moe.routing_skew > 0 and par.ep > 1
    keys = [(grid.coords(r)["pp"], grid.expert_coords(r)["ep"] if skewed else None) for r in range(cfg.world_size)]
    index: dict[tuple[int, int | None], int] = {}
    programs: list[StageProgram] = []
    for key in keys:
        if key not in index:
            index[key] = len(programs)
            programs.append(stage_program(cfg, *key))
    prog_of = [index[key] for key in keys]
    groups = _Groups(cfg)
    slots = [groups.slots(r) for r in range(cfg.world_size)]
    mult = compute_multipliers(cfg)
    varies = cfg.stragglers.jitter_cv > 0
    steps: list[list[Step]] = [[] for _ in range(cfg.world_size)]
    step_us: list[float] = []
    t0 = 0.0
    made: list[Step] | None = None
    for k in range(cfg.steps):
        if made is None or varies:
            result, t_end = simulate_step(cfg, [programs[i] for i in prog_of], groups, slots, mult[k], t0)
            made = [Step(k, end, compute, colls) for compute, colls, end in result]
            step_us.append(t_end - t0)
        else:
            made = [Step(k, s.duration_us, s.compute, s.collectives) for s in made]
            step_us.append(step_us[-1])
        t0 += step_us[-1]
        for r, s in enumerate(made):
            steps[r].append(s)
    return tuple(RankTrace(r, tuple(s)) for r, s in enumerate(steps)), step_us
