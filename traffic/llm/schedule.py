"""One training step of a generated LLM job: every rank's program and the nominal timeline (pure).

Programs (per pipeline stage; every rank of a stage runs the same one over its own groups):
- Megatron's non-interleaved 1F1B: stage s of `pp` runs W = min(pp - s - 1, m) warm-up forwards, m - W
  steady forward/backward pairs, then W cool-down backwards (m = micro-batches). Point-to-point transfers
  are batched as Megatron's `send_forward_recv_backward` / `send_backward_recv_forward` do, and block
  compute (Megatron waits on them); the two transfers of a batch run one after the other on stream "pp".
- With `virtual_stages` v > 1, Megatron's interleaved order (`_interleaved_order`); its transfers are
  modelled as data flow: a pass waits for its input right before it and sends its output without waiting
  (the last stage's chunk c feeds the first stage's chunk c + 1).
- A forward of a micro-batch: receive the activation, compute the chunk's layers (plus the output layer
  on the last stage), the layers' tensor-, context- and expert-parallel collectives (one entry per kind
  and size, `count` = layers x per-layer count; they block compute), send it on. A backward mirrors it.
  Compute per GPU = whole-layer FLOPs / (tp x cp) at `model.compute_us`. FSDP (zero 3) gathers a chunk's
  parameters (blocking) before each of its passes.
- Gradient buckets (`rules.dp_buckets`) go on stream "dp" ("edp" for expert buckets) as the last
  micro-batch's backward finishes their layers (`overlap_grad_reduce`; else all after the flush), without
  blocking compute; the tied-embedding all-reduce ("emb") after the flush. The step then waits for them,
  runs the optimizer (`optimizer_us`), and the ZeRO-1/2 parameter all-gathers (`rules.param_gathers`).
Nominal timeline: a collective starts when every member has issued it and its stream is free on each
(NCCL: the slowest member gates it; asynchronous ones keep their issue order on a stream) and lasts
size x count x busbw_factor x 8 / bandwidth, the bandwidth being `nvlink_gbps` for a group inside one
server (rank // gpus_per_server) and `nic_gbps` otherwise; no latency term, no contention between groups.
Ranks are advanced earliest clock first, so collectives are issued in time order.
Stragglers scale a rank's compute (`compute_multipliers`); the optimizer is memory-bound and not scaled.
Every step starts for all ranks when the slowest rank ended the previous one.
"""
from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from dataclasses import dataclass, replace
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

# ops of a program: (code, payload). _COMPUTE (us, micro-batch or -1, tag); _BLOCK / _ASYNC a tuple of collective
# templates (slot, identity, kind, size, count, dtype, name) that compute waits for / does not wait for; _WAIT: wait
# for every asynchronous one. A slot names the rank's group ("tp", "dp", "pp_next", ...); the identity (the k-th on
# its slot, or a message's own name) is the same on every member.
_COMPUTE, _BLOCK, _ASYNC, _WAIT = 0, 1, 2, 3
_STREAM = {"pp_prev": "pp", "pp_next": "pp", "pp_wrap": "pp"}


@dataclass(frozen=True)
class StageProgram:
    """One pipeline stage's step: `ops` as (code, payload) and the order of its micro-batch passes."""

    stage: int
    ops: tuple[tuple[int, Any], ...]
    passes: tuple[str, ...]  # its compute's micro-batch passes "F0", "B0", ... in program order
    forward_us: float  # compute of one micro-batch's forward (all chunks) on one GPU, before stragglers
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


def _interleaved_order(pp: int, stage: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Megatron's interleaved 1F1B order on `stage` with `v` model chunks: [(pass, chunk, micro-batch), ...].
    Virtual micro-batch k runs chunk (k mod pp*v) // pp (backward: v - 1 - that) of micro-batch
    (k // (pp*v)) x pp + k mod pp; warm-up (pp - stage - 1) x 2 + (v - 1) x pp forwards (all when m = pp)."""
    total = m * v
    warm = total if m == pp else min((pp - stage - 1) * 2 + (v - 1) * pp, total)

    def at(k: int, forward: bool) -> tuple[int, int]:
        chunk = (k % (pp * v)) // pp
        return (chunk if forward else v - 1 - chunk), (k // (pp * v)) * pp + k % pp

    out = [("F", *at(k, True)) for k in range(warm)]
    for k in range(total - warm):
        out += [("F", *at(k + warm, True)), ("B", *at(k, False))]
    out += [("B", *at(k, False)) for k in range(total - warm, total)]
    return out


def stage_program(cfg: LLMConfig, stage: int, ep_rank: int | None = None) -> StageProgram:
    """The ops of one step on `stage` (see the module docstring); `ep_rank`: the expert-parallel rank whose
    all-to-all sizes to use under skewed routing (None: the uniform size)."""
    par = cfg.parallel
    pp, m, v = par.pp, cfg.micro_batches, par.virtual_stages
    if v > 1 and m % pp:
        raise TraceError(f"{cfg.name}: the interleaved schedule (virtual_stages {v}) needs micro-batches ({m}) "
                         f"divisible by pp ({pp}), as Megatron does")
    first, last = stage == 0, stage == pp - 1
    chunks = [list(model.stage_layers(cfg, stage, c)) for c in range(v)]
    tokens = cfg.micro_batch * cfg.model.seq_len
    split = par.tp * par.cp

    def us(flops: float) -> float:
        return model.compute_us(cfg, flops / split)

    fwd_layer = [[us(model.layer_flops(cfg, i, tokens, "fwd")) for i in ls] for ls in chunks]
    bwd_layer = [[us(model.layer_flops(cfg, i, tokens, "bwd")) for i in ls] for ls in chunks]
    head_f = [us(model.head_flops(cfg, tokens, "fwd")) if last and c == v - 1 else 0.0 for c in range(v)]
    head_b = [us(model.head_flops(cfg, tokens, "bwd")) if last and c == v - 1 else 0.0 for c in range(v)]
    occ: dict[str, int] = {}

    def coll(slot: str, kind: str, size: int, count: int, dtype: str, name: str, ident: object = None) -> tuple:
        """A collective template; `ident` (the same on every member) or the k-th on this slot matches it."""
        if ident is None:
            k = occ.get(slot, 0)
            occ[slot] = k + 1
            ident = k
        return (slot, ident, kind, size, count, dtype, name)

    def layer_comms(layers: list[int], pass_: Pass) -> list[tuple[str, str, int, str, str, int]]:
        """The layers' collectives of one pass, one entry per (axis, kind, size, dtype) with their count."""
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

    comms = [{"fwd": layer_comms(ls, "fwd"), "bwd": layer_comms(ls, "bwd")} for ls in chunks]
    p2p = rules.pp_p2p_bytes(cfg)

    def chunk_of(layer: int) -> int:  # -1: the input embedding (chunk 0); model.layers: the output layer (last)
        if layer < 0:
            return 0
        if layer >= cfg.model.layers:
            return v - 1
        return next(c for c, ls in enumerate(chunks) if layer in ls)

    buckets = [[b for b in rules.dp_buckets(cfg, stage) if chunk_of(b.first_layer) == c] for c in range(v)]
    gathers = rules.param_gathers(cfg, stage) if par.zero == 3 else []
    half = len(gathers) // 2  # FSDP: the forward gathers, then the backward ones
    fsdp = [{"fwd": [g for g in gathers[:half] if chunk_of(g.layer if g.layer is not None else 0) == c],
             "bwd": [g for g in gathers[half:] if chunk_of(g.layer if g.layer is not None else 0) == c]}
            for c in range(v)]
    ops: list[tuple[int, Any]] = []

    def act(slot: str, ident: object = None) -> tuple:
        return coll(slot, "send_recv", p2p, 1, cfg.dtype, "activation", ident)

    def grad(slot: str, ident: object = None) -> tuple:
        return coll(slot, "send_recv", p2p, 1, cfg.dtype, "activation gradient", ident)

    def block(*colls: tuple) -> None:
        ops.append((_BLOCK, colls))

    def tag(p: str, c: int, i: int) -> str:
        return f"{p}{i}" if v == 1 else f"{p}{i}.{c}"

    def compute(us_: float, mb: int, what: str) -> None:
        ops.append((_COMPUTE, (us_, mb, what)))

    def run_comms(c: int, pass_: Pass) -> None:
        for axis, kind, size, dtype, name, count in comms[c][pass_]:
            block(coll(axis, kind, size, count, dtype, name))

    def issue_buckets(which: list) -> None:
        if which:
            ops.append((_ASYNC, tuple(coll(b.axis, b.kind, b.size_bytes, 1, b.dtype,
                                           f"gradients of layers {b.first_layer}-{b.last_layer}") for b in which)))

    def fsdp_gathers(c: int, pass_: Pass) -> None:  # FSDP: a layer's parameters are gathered before each pass
        for spec in fsdp[c][pass_]:
            block(coll(spec.axis, spec.kind, spec.size_bytes, spec.count, spec.dtype, spec.what))

    def forward(c: int, i: int) -> None:
        fsdp_gathers(c, "fwd")
        compute(sum(fwd_layer[c]) + head_f[c], i, tag("F", c, i))
        run_comms(c, "fwd")

    def backward(c: int, i: int) -> None:
        fsdp_gathers(c, "bwd")
        layers = chunks[c]
        if i == m - 1 and par.overlap_grad_reduce:  # grads fill in reverse: issue each bucket when its layers are done
            compute(head_b[c], i, tag("B", c, i))
            top = layers[-1] if layers else -1
            issue_buckets([b for b in buckets[c] if b.first_layer > top])  # the output layer's
            pending = [b for b in buckets[c] if b.first_layer <= top]
            for pos in reversed(range(len(layers))):
                compute(bwd_layer[c][pos], i, tag("B", c, i))
                issue_buckets([b for b in pending if b.first_layer == layers[pos]])
                pending = [b for b in pending if b.first_layer != layers[pos]]
            run_comms(c, "bwd")
            issue_buckets(pending)  # the input embedding's (layer -1)
        else:
            compute(sum(bwd_layer[c]) + head_b[c], i, tag("B", c, i))
            run_comms(c, "bwd")

    if v == 1:
        warm = min(pp - stage - 1, m)
        steady = m - warm
        for i in range(warm):
            if not first:
                block(act("pp_prev"))
            forward(0, i)
            if not last:
                block(act("pp_next"))
        if steady and not first:
            block(act("pp_prev"))
        for i in range(steady):
            forward(0, warm + i)
            if not last:
                block(act("pp_next"), grad("pp_next"))  # send_forward_recv_backward
            backward(0, i)
            if not first:
                if i == steady - 1:
                    block(grad("pp_prev"))
                else:
                    block(act("pp_prev"), grad("pp_prev"))  # send_backward_recv_forward
        for i in range(steady, m):
            if not last:
                block(grad("pp_next"))
            backward(0, i)
            if not first:
                block(grad("pp_prev"))
    else:
        # data flow: a pass receives its input (blocking) right before it and sends its output without waiting;
        # the message's identity (what, destination stage, chunk, micro-batch) matches the two ends
        for p, c, i in _interleaved_order(pp, stage, m, v):
            if p == "F":
                if not (first and c == 0):
                    block(act("pp_prev" if not first else "pp_wrap", ("act", stage, c, i)))
                forward(c, i)
                if not (last and c == v - 1):
                    dest = (stage + 1, c) if not last else (0, c + 1)
                    ops.append((_ASYNC, (act("pp_next" if not last else "pp_wrap", ("act", *dest, i)),)))
            else:
                if not (last and c == v - 1):
                    block(grad("pp_next" if not last else "pp_wrap", ("grad", stage, c, i)))
                backward(c, i)
                if not (first and c == 0):
                    dest = (stage - 1, c) if not first else (pp - 1, c - 1)
                    ops.append((_ASYNC, (grad("pp_prev" if not first else "pp_wrap", ("grad", *dest, i)),)))
    if not par.overlap_grad_reduce:
        issue_buckets([b for bs in buckets[::-1] for b in bs])
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
    return StageProgram(stage, tuple(ops), tuple(passes), sum(map(sum, fwd_layer)) + sum(head_f),
                        sum(map(sum, bwd_layer)) + sum(head_b))


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


# --- stragglers -----------------------------------------------------------------------------------------------


def compute_multipliers(cfg: LLMConfig) -> np.ndarray:
    """Compute multipliers, shape (steps, ranks, micro-batches) with `jitter_per: microbatch`, else (steps, ranks,
    1): lognormal jitter of mean 1 and CV `jitter_cv` (sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2) drawn from
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
    shape = (cfg.steps, world, m if st.jitter_per == "microbatch" else 1)
    out = np.broadcast_to(base[None, :, None], shape).copy()
    if st.jitter_cv > 0:
        rng = np.random.default_rng(st.seed)
        sigma2 = np.log1p(st.jitter_cv ** 2)
        out *= rng.lognormal(-sigma2 / 2, np.sqrt(sigma2), size=shape)
    return out


# --- the nominal timeline ---------------------------------------------------------------------------------------


def simulate_step(cfg: LLMConfig, programs: list[StageProgram], groups: _Groups, slots: list[dict[str, int]],
                  mult: np.ndarray, t0: float, sim: list[int], members_of: list[tuple[int, ...]]
                  ) -> tuple[list[tuple[tuple[Interval, ...], tuple[Collective, ...], float]], float]:
    """Run the programs (`programs[rank]`) of the ranks `sim` from `t0`; per rank of `sim` (compute intervals,
    collectives, end), times relative to `t0`, and the slowest rank's end (absolute). `mult`: the ranks' compute
    multipliers per micro-batch; `members_of`: per group, its members among `sim`."""
    world = cfg.world_size
    rows = mult.tolist()
    per_mb = mult.shape[-1] > 1
    # (gid, identity) -> [members left to issue, last issue, start, end, gid, stream, duration, [(member, blocks)], fifo]
    insts: dict[tuple[int, object], list] = {}
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
    ready = [(t0, r) for r in sim]  # (clock, rank): ranks advance earliest first, so issues come in time order

    def start(key: tuple[int, object]) -> None:
        todo = [key]
        while todo:
            k = todo.pop()
            inst = insts[k]
            stream, fifo = inst[5], inst[8]
            members = members_of[inst[4]]
            t = inst[1]
            for mem in members:
                if fifo and queues[(mem, stream)][0] != k:
                    break
                f = free.get((mem, stream), t0)
                if f > t:
                    t = f
            else:
                end = t + inst[6]
                inst[2], inst[3] = t, end
                for mem in members:
                    free[(mem, stream)] = end
                for mem, blocking in inst[7]:
                    if blocking:
                        wait_left[mem] -= 1
                        if wait_left[mem] == 0 and waiting[mem] == 1:
                            waiting[mem] = 0
                            heappush(ready, (max(end, clock[mem]), mem))
                    else:
                        async_open[mem] -= 1
                        if end > async_end[mem]:
                            async_end[mem] = end
                        if async_open[mem] == 0 and waiting[mem] == 2:
                            waiting[mem] = 0
                            heappush(ready, (max(async_end[mem], clock[mem]), mem))
                if fifo:
                    for mem in members:
                        q = queues[(mem, stream)]
                        q.popleft()
                        if q and insts[q[0]][0] == 0:
                            todo.append(q[0])

    def issue(rank: int, tmpl: tuple, t: float, blocking: bool) -> None:
        slot = tmpl[0]
        gid = slots[rank][slot]
        key = (gid, tmpl[1])
        inst = insts.get(key)
        stream = _STREAM.get(slot, slot)
        dur = tmpl[3] * tmpl[4] * busbw_factor(tmpl[2], len(groups.tuples[gid])) * 8 / (groups.bw_gbps[gid] * 1e3)
        if inst is None:
            # asynchronous collectives (gradient buckets) keep their issue order on a stream; blocking ones and
            # point-to-point transfers start as soon as every member has issued them and the stream is free
            inst = insts[key] = [len(members_of[gid]), t, 0.0, 0.0, gid, stream, dur, [], not blocking and stream != "pp"]
        else:  # the last member to issue it and the largest send buffer (skewed all-to-all) decide
            if t > inst[1]:
                inst[1] = t
            if dur > inst[6]:
                inst[6] = dur
        inst[0] -= 1
        inst[7].append((rank, blocking))
        if inst[8]:
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
        r = heappop(ready)[1]
        ops = programs[r].ops
        n_ops = len(ops)
        i = pc[r]
        t = clock[r]
        if waiting[r] == 0 and i > 0:  # resumed after a block or the wait
            prev = ops[i - 1]
            if prev[0] == _BLOCK:
                t = max([t] + [insts[(slots[r][c[0]], c[1])][3] for c in prev[1]
                               if len(groups.tuples[slots[r][c[0]]]) > 1])
        mrow = rows[r]
        while i < n_ops:
            code, payload = ops[i]
            if code == _COMPUTE:
                us, mb, _ = payload
                if us > 0:
                    end = t + us * (mrow[mb if per_mb else 0] if mb >= 0 else 1.0)
                    iv = compute[r]
                    if iv and iv[-1][1] == t:
                        iv[-1][1] = end
                    else:
                        iv.append([t, end])
                    t = end
                i += 1
                if ready and t > ready[0][0]:  # let the ranks behind catch up before issuing more
                    heappush(ready, (t, r))
                    break
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
    stuck = [r for r in sim if pc[r] < len(programs[r].ops)]
    if stuck:
        raise TraceError(f"{cfg.name}: the step schedule deadlocked: rank {stuck[0]} (and {len(stuck) - 1} more) "
                         f"waits at op {pc[stuck[0]]} (a bug in traffic.llm.schedule)")
    made: dict[tuple[tuple[int, object], int], Collective] = {}  # one object per instance and template, shared by members
    out = []
    for r in sim:
        colls = []
        for tmpl, gid, key in records[r]:
            c = made.get((key, id(tmpl)))
            if c is None:
                inst = insts[key]
                c = made[(key, id(tmpl))] = Collective(
                    kind=tmpl[2], size_bytes=tmpl[3], dtype=tmpl[5], group_ranks=groups.tuples[gid], stream=inst[5],
                    start_us=inst[2] - t0, duration_us=inst[3] - inst[2], name=tmpl[6], count=tmpl[4])
            colls.append(c)
        colls.sort(key=lambda c: c.start_us or 0.0)  # by start: what members share is listed in one order on all of them
        out.append((tuple((a - t0, b - t0) for a, b in compute[r]), tuple(colls), clock[r] - t0))
    return out, max(clock[r] for r in sim)


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


def _expand(number: int, result: list[tuple[tuple[Interval, ...], tuple[Collective, ...], float]], tp: int,
            world: int) -> list[Step]:
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
                    d = shifted[(id(c), j)] = replace(c, group_ranks=g)
                mine.append(d)
            out.append(Step(number, end, compute, tuple(mine)))
    if len(out) != world:
        raise TraceError(f"internal: {len(out)} rank timelines for {world} ranks")
    return out
