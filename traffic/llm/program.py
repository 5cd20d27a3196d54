"""One pipeline stage's program for a training step (pure): named ops, built in program order.

Every rank of a stage runs the same program over its own groups:
- Megatron's non-interleaved 1F1B: stage s of `pp` runs W = min(pp - s - 1, m) warm-up forwards, m - W
  steady forward/backward pairs, then W cool-down backwards (m = micro-batches). Point-to-point transfers
  are batched as Megatron's `send_forward_recv_backward` / `send_backward_recv_forward` do, and block
  compute (Megatron waits on them); the two transfers of a batch run one after the other on stream "pp".
- With `virtual_stages` v > 1, Megatron's interleaved order (`_interleaved_order`); its transfers are
  modelled as data flow: a pass waits for its input right before it and sends its output without waiting
  (the last stage's chunk c feeds the first stage's chunk c + 1).
- A forward of a micro-batch: receive the activation, compute the chunk's layers (plus the output layer
  on the last stage), the layers' tensor-, context- and expert-parallel collectives (one entry per kind
  and size, `count` = layers x per-layer count; they block compute), send it on. A backward mirrors it, except
  that each column-parallel block's TP collectives run under its GEMMs (`backward_comms`: issued asynchronously,
  the block's dgrad or wgrad GEMM, then a `Join`), as Megatron-Core's column-parallel linear backward does.
  Compute per GPU = whole-layer FLOPs / (tp x cp) at `model.compute_us`. FSDP (zero 3) gathers a chunk's
  parameters (blocking) before each of its passes.
- Gradient buckets (`rules.dp_buckets`) go on stream "dp" ("edp" for expert buckets) as the last
  micro-batch's backward finishes their layers (`overlap_grad_reduce`; else all after the flush), without
  blocking compute; the tied-embedding all-reduce ("emb") after the flush. The step then waits for them,
  runs the optimizer (`optimizer_us`), and the ZeRO-1/2 parameter all-gathers (`rules.param_gathers`).

The ops (`Op`): `Compute`, `Block` (collectives compute waits for), `Async` (collectives it does not wait
for) and `WaitAsync` (wait for every asynchronous one). A collective is a `CollectiveTemplate`: its slot
names the rank's group ("tp", "dp", "pp_next", ...), its identity (the k-th on its slot, or a message's own
name) is the same on every member. `stage_program` builds them with a `_ProgramBuilder`;
`traffic.llm.schedule` runs them on the nominal timeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from traffic.llm import model, rules
from traffic.llm.config import LLMConfig
from traffic.llm.model import Pass
from traffic.llm.rules import Bucket, CommSpec
from traffic.workload import TraceError

#: HBM bandwidth per GPU in bytes/s (vendor data sheets: A100 80GB SXM, H100 SXM, H200, B200), for the optimizer.
HBM_BYTES_PER_S = {"a100": 2.039e12, "h100": 3.35e12, "h200": 4.8e12, "b200": 8.0e12}
#: Bytes the Adam step reads and writes per parameter with fp32 master weights: reads grad, master, m, v
#: (4 x 4), writes master, m, v (3 x 4) and the bf16 copy (2).
ADAM_BYTES_PER_PARAM = 30

#: The stream of a slot's collectives where it is not the slot's own name: point-to-point transfers share "pp".
_STREAM = {"pp_prev": "pp", "pp_next": "pp", "pp_wrap": "pp"}
#: the blocking point-to-point transfers that receive (slot, name): an activation from the previous stage, a
#: gradient from the next
_RECEIVES = {("pp_prev", "activation"), ("pp_next", "activation gradient")}


@dataclass(frozen=True, slots=True, eq=False)
class CollectiveTemplate:
    """A collective of a stage's program; each rank issues it on its own group for `slot`. Compared by
    identity: each one a program issues is its own."""

    slot: str  # the rank's group: "tp", "cp", "ep", "etp", "edp", "dp", "emb", "pp_prev", "pp_next", "pp_wrap"
    ident: object  # the same on every member: the k-th on its slot, or a message's own name
    kind: str
    size_bytes: int
    count: int
    dtype: str
    name: str
    stream: str  # the stream it runs on: the slot's name ("pp" for the point-to-point slots)


@dataclass(frozen=True, slots=True)
class Compute:
    us: float  # on one GPU, before stragglers
    micro_batch: int  # whose pass it is (its straggler multiplier); -1: none (the optimizer, not scaled)
    tag: str  # the pass ("F0", "B3", "F2.1" for chunk 1 when interleaved) or "optimizer"


@dataclass(frozen=True, slots=True)
class Block:
    colls: tuple[CollectiveTemplate, ...]  # issued together; compute waits for all of them


@dataclass(frozen=True, slots=True)
class Async:
    colls: tuple[CollectiveTemplate, ...]  # issued together; compute goes on


@dataclass(frozen=True, slots=True)
class WaitAsync:
    """Wait for every asynchronous collective issued so far."""


@dataclass(frozen=True, slots=True)
class Join:
    colls: tuple[CollectiveTemplate, ...]  # asynchronous ones issued before: compute waits for these to end


Op: TypeAlias = Compute | Block | Async | WaitAsync | Join


@dataclass(frozen=True, slots=True)
class StageProgram:
    """One pipeline stage's step: its ops and the order of its micro-batch passes."""

    stage: int
    ops: tuple[Op, ...]
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


def _layer_comms(cfg: LLMConfig, layers: list[int], pass_: Pass, ep_rank: int | None) -> list[CommSpec]:
    """The layers' collectives of one pass, one entry per (axis, kind, size, dtype) with their count, named
    after the layers and what they are for."""
    count: dict[tuple[str, str, int, str, str], int] = {}
    whats: dict[tuple[str, str, int, str, str], list[str]] = {}
    def of(i: int, p: Pass) -> list[CommSpec]:
        return rules.tp_comms(cfg, i, p) + rules.cp_comms(cfg, i, p) + rules.ep_comms(cfg, i, p, ep_rank)

    for i in layers:
        # full recompute runs the layer's forward again, collectives included, before its backward
        again = of(i, "fwd") if pass_ == "bwd" and model.recomputed(cfg, i) else []
        for spec in again + of(i, pass_):
            key = (spec.axis, spec.kind, spec.size_bytes, spec.dtype, spec.hides)
            count[key] = count.get(key, 0) + spec.count
            if spec.what not in whats.setdefault(key, []):
                whats[key].append(spec.what)
    span = f"layers {layers[0]}-{layers[-1]}" if layers else "no layers"
    return [CommSpec(a, k, s, n, d, f"{pass_} {span}: {'; '.join(whats[(a, k, s, d, h)])}", hides=h)
            for (a, k, s, d, h), n in count.items()]


class _ProgramBuilder:
    """Appends one stage's ops in program order (module docstring): `one_f_one_b` or `interleaved`, then
    `program`. Collectives are numbered per slot as they are appended, so the order of the calls is the
    order every member of a group matches them in."""

    def __init__(self, cfg: LLMConfig, stage: int, ep_rank: int | None) -> None:
        par = cfg.parallel
        self.cfg, self.stage = cfg, stage
        self.pp, self.m, self.v = par.pp, cfg.micro_batches, par.virtual_stages
        self.first, self.last = stage == 0, stage == par.pp - 1
        v = self.v
        self.chunks = [list(model.stage_layers(cfg, stage, c)) for c in range(v)]
        tokens = cfg.micro_batch * cfg.model.seq_len
        split = par.tp * par.cp

        def us(flops: float) -> float:
            return model.compute_us(cfg, flops / split)

        self.fwd_layer = [[us(model.layer_flops(cfg, i, tokens, "fwd")) for i in ls] for ls in self.chunks]
        self.bwd_layer = [[us(model.layer_flops(cfg, i, tokens, "bwd")) for i in ls] for ls in self.chunks]
        # one GEMM of each column-parallel block over each chunk's layers (and the output layer's on the last chunk of
        # the last stage): a block's backward TP collectives run under its dgrad and its wgrad GEMM of this size
        self.gemm = [{b: sum(us(model.column_gemm_flops(cfg, i, tokens, b)) for i in ls) for b in model.COLUMN_BLOCKS}
                     for ls in self.chunks]
        on_head = [self.last and c == v - 1 for c in range(v)]
        self.head_f = [us(model.head_flops(cfg, tokens, "fwd")) if h else 0.0 for h in on_head]
        self.head_b = [us(model.head_flops(cfg, tokens, "bwd")) if h else 0.0 for h in on_head]
        for g, h in zip(self.gemm, self.head_b):
            g["output layer"] = h / 2
        self.comms = [{"fwd": _layer_comms(cfg, ls, "fwd", ep_rank), "bwd": _layer_comms(cfg, ls, "bwd", ep_rank)}
                      for ls in self.chunks]
        if self.first:  # the input embedding's before chunk 0's layers (forward), after them (backward)
            self.comms[0]["fwd"] = rules.embedding_comms(cfg, "fwd") + self.comms[0]["fwd"]
            self.comms[0]["bwd"] = self.comms[0]["bwd"] + rules.embedding_comms(cfg, "bwd")
        if self.last:  # the output layer's and the loss's after the last chunk's layers (forward), before (backward)
            self.comms[-1]["fwd"] = self.comms[-1]["fwd"] + rules.head_comms(cfg, "fwd")
            self.comms[-1]["bwd"] = rules.head_comms(cfg, "bwd") + self.comms[-1]["bwd"]
        self.p2p = rules.pp_p2p_bytes(cfg)
        self.buckets = [[b for b in rules.dp_buckets(cfg, stage) if self.chunk_of(b.first_layer) == c]
                        for c in range(v)]
        gathers = rules.param_gathers(cfg, stage) if par.zero == 3 else []
        half = len(gathers) // 2  # FSDP: the forward gathers, then the backward ones
        self.fsdp = [{"fwd": [g for g in gathers[:half] if self.chunk_of(g.layer or 0) == c],
                      "bwd": [g for g in gathers[half:] if self.chunk_of(g.layer or 0) == c]} for c in range(v)]
        self.ops: list[Op] = []
        self._occ: dict[str, int] = {}  # slot -> collectives numbered on it so far

    def chunk_of(self, layer: int) -> int:
        """The model chunk of `layer`: -1 is the input embedding (chunk 0), model.layers the output layer (last)."""
        if layer < 0:
            return 0
        if layer >= self.cfg.model.layers:
            return self.v - 1
        return next(c for c, ls in enumerate(self.chunks) if layer in ls)

    # --- collectives -------------------------------------------------------------------------------------------

    def coll(self, slot: str, kind: str, size: int, count: int, dtype: str, name: str,
             ident: object = None) -> CollectiveTemplate:
        """A collective on `slot`; `ident` (the same on every member) or the k-th on this slot matches it."""
        if ident is None:
            k = self._occ.get(slot, 0)
            self._occ[slot] = k + 1
            ident = k
        return CollectiveTemplate(slot, ident, kind, size, count, dtype, name, _STREAM.get(slot, slot))

    def coll_of(self, spec: CommSpec) -> CollectiveTemplate:
        return self.coll(spec.axis, spec.kind, spec.size_bytes, spec.count, spec.dtype, spec.what)

    def act(self, slot: str, ident: object = None) -> CollectiveTemplate:
        return self.coll(slot, "send_recv", self.p2p, 1, self.cfg.dtype, "activation", ident)

    def grad(self, slot: str, ident: object = None) -> CollectiveTemplate:
        return self.coll(slot, "send_recv", self.p2p, 1, self.cfg.dtype, "activation gradient", ident)

    def block(self, *colls: CollectiveTemplate) -> None:
        self.ops.append(Block(colls))
        # pipeline scatter/gather: a received activation or gradient is all-gathered over TP before it is used. A
        # blocking point-to-point transfer receives an activation from the previous stage or a gradient from the
        # next (or, on the wrap, whichever comes in: sends on it are asynchronous)
        gather = rules.pp_gather(self.cfg)
        if gather is not None and any((c.slot, c.name) in _RECEIVES or c.slot == "pp_wrap" for c in colls):
            self.ops.append(Block((self.coll_of(gather),)))

    def issue_buckets(self, which: list[Bucket]) -> None:
        if which:
            self.ops.append(Async(tuple(self.coll(b.axis, b.kind, b.size_bytes, 1, b.dtype,
                                                  f"gradients of layers {b.first_layer}-{b.last_layer}")
                                        for b in which)))

    # --- passes ------------------------------------------------------------------------------------------------

    def tag(self, p: str, c: int, i: int) -> str:
        return f"{p}{i}" if self.v == 1 else f"{p}{i}.{c}"

    def compute(self, us: float, mb: int, tag: str) -> None:
        self.ops.append(Compute(us, mb, tag))

    def run_comms(self, c: int, pass_: Pass) -> None:
        for spec in self.comms[c][pass_]:
            self.block(self.coll_of(spec))

    def fsdp_gathers(self, c: int, pass_: Pass) -> None:
        """FSDP: a layer's parameters are gathered before each pass."""
        for spec in self.fsdp[c][pass_]:
            self.block(self.coll_of(spec))

    def forward(self, c: int, i: int) -> None:
        self.fsdp_gathers(c, "fwd")
        self.compute(sum(self.fwd_layer[c]) + self.head_f[c], i, self.tag("F", c, i))
        self.run_comms(c, "fwd")

    def backward(self, c: int, i: int) -> None:
        self.fsdp_gathers(c, "bwd")
        if i == self.m - 1 and self.cfg.parallel.overlap_grad_reduce:
            self._last_backward(c, i)
        else:
            hidden = self.hidden_us(c)
            self.compute(sum(self.bwd_layer[c]) + self.head_b[c] - hidden, i, self.tag("B", c, i))
            self.backward_comms(c, i, self.tag("B", c, i))

    def overlapped(self, c: int) -> dict[str, list[CommSpec]]:
        """Chunk `c`'s backward collectives by the GEMM they run under ("dgrad:BLOCK", "wgrad:BLOCK"; "" blocks), in
        issue order."""
        out: dict[str, list[CommSpec]] = {"": []}
        for spec in self.comms[c]["bwd"]:
            out.setdefault(spec.hides if self.cfg.parallel.tp_comm_overlap_bwd else "", []).append(spec)
        return out

    def gemm_us(self, c: int, hides: str) -> float:
        """The GEMM `hides` ("dgrad:BLOCK" or "wgrad:BLOCK") of chunk `c`, one micro-batch: the block's column GEMM."""
        return self.gemm[c][hides.partition(":")[2]]

    def hidden_us(self, c: int) -> float:
        """The backward GEMM time of chunk `c` (one micro-batch) that overlapped collectives run under."""
        return sum(self.gemm_us(c, k) for k in self.overlapped(c) if k)

    def backward_comms(self, c: int, i: int, tag: str) -> None:
        """A backward's collectives after its compute: the blocking ones, then each GEMM that collectives run under
        with them (Megatron-Core's column-parallel linear backward: issue asynchronously, run the GEMM, wait for
        both), so the exposed time is max(0, collectives - GEMM); `compute.overlap_sm_slowdown` slows the GEMM."""
        groups = self.overlapped(c)
        for spec in groups.pop(""):
            self.block(self.coll_of(spec))
        slow = 1.0 + self.cfg.compute.overlap_sm_slowdown
        for hides, specs in groups.items():
            colls = tuple(self.coll_of(spec) for spec in specs)
            self.ops.append(Async(colls))
            self.compute(self.gemm_us(c, hides) * slow, i, tag)
            self.ops.append(Join(colls))

    def _last_backward(self, c: int, i: int) -> None:
        """The last micro-batch's backward with `overlap_grad_reduce`: grads fill in reverse, so each bucket is
        issued as soon as the backward has done its layers."""
        layers, tag = self.chunks[c], self.tag("B", c, i)
        total = sum(self.bwd_layer[c]) + self.head_b[c]
        rest = 1.0 - self.hidden_us(c) / total if total > 0 else 1.0  # the GEMMs the collectives hide come last
        self.compute(self.head_b[c] * rest, i, tag)
        top = layers[-1] if layers else -1
        self.issue_buckets([b for b in self.buckets[c] if b.first_layer > top])  # the output layer's
        pending = [b for b in self.buckets[c] if b.first_layer <= top]
        for pos in reversed(range(len(layers))):
            self.compute(self.bwd_layer[c][pos] * rest, i, tag)
            self.issue_buckets([b for b in pending if b.first_layer == layers[pos]])
            pending = [b for b in pending if b.first_layer != layers[pos]]
        self.backward_comms(c, i, tag)
        self.issue_buckets(pending)  # the input embedding's (layer -1)

    # --- schedules ---------------------------------------------------------------------------------------------

    def one_f_one_b(self) -> None:
        """Non-interleaved 1F1B: warm-up forwards, steady forward/backward pairs, cool-down backwards."""
        first, last, m = self.first, self.last, self.m
        warm = min(self.pp - self.stage - 1, m)
        steady = m - warm
        for i in range(warm):
            if not first:
                self.block(self.act("pp_prev"))
            self.forward(0, i)
            if not last:
                self.block(self.act("pp_next"))
        if steady and not first:
            self.block(self.act("pp_prev"))
        for i in range(steady):
            self.forward(0, warm + i)
            if not last:
                self.block(self.act("pp_next"), self.grad("pp_next"))  # send_forward_recv_backward
            self.backward(0, i)
            if not first:
                if i == steady - 1:
                    self.block(self.grad("pp_prev"))
                else:
                    self.block(self.act("pp_prev"), self.grad("pp_prev"))  # send_backward_recv_forward
        for i in range(steady, m):
            if not last:
                self.block(self.grad("pp_next"))
            self.backward(0, i)
            if not first:
                self.block(self.grad("pp_prev"))

    def interleaved(self) -> None:
        """Megatron's interleaved order as data flow: a pass receives its input (blocking) right before it and
        sends its output without waiting; the message's identity (what, destination stage, chunk, micro-batch)
        matches the two ends."""
        first, last, stage, v = self.first, self.last, self.stage, self.v
        for p, c, i in _interleaved_order(self.pp, stage, self.m, v):
            if p == "F":
                if not (first and c == 0):
                    self.block(self.act("pp_prev" if not first else "pp_wrap", ("act", stage, c, i)))
                self.forward(c, i)
                if not (last and c == v - 1):
                    dest = (stage + 1, c) if not last else (0, c + 1)
                    self.ops.append(Async((self.act("pp_next" if not last else "pp_wrap", ("act", *dest, i)),)))
            else:
                if not (last and c == v - 1):
                    self.block(self.grad("pp_next" if not last else "pp_wrap", ("grad", stage, c, i)))
                self.backward(c, i)
                if not (first and c == 0):
                    dest = (stage - 1, c) if not first else (self.pp - 1, c - 1)
                    self.ops.append(Async((self.grad("pp_prev" if not first else "pp_wrap", ("grad", *dest, i)),)))

    def program(self) -> StageProgram:
        """The step's end (buckets not yet issued, the embedding all-reduce, the wait, the optimizer, ZeRO-1/2
        gathers) appended, the program."""
        cfg, par, stage = self.cfg, self.cfg.parallel, self.stage
        if not par.overlap_grad_reduce:
            self.issue_buckets([b for bs in self.buckets[::-1] for b in bs])
        emb = rules.embedding_sync(cfg)
        if emb is not None and (self.first or self.last):
            self.ops.append(Async((self.coll("emb", emb.kind, emb.size_bytes, emb.count, emb.dtype, emb.what),)))
        self.ops.append(WaitAsync())
        self.compute(optimizer_us(cfg, stage), -1, "optimizer")
        for spec in rules.param_gathers(cfg, stage) if par.zero in (1, 2) else []:
            self.block(self.coll_of(spec))
        passes: list[str] = []
        for op in self.ops:
            if isinstance(op, Compute) and op.tag != "optimizer" and (not passes or passes[-1] != op.tag):
                passes.append(op.tag)
        forward_us = sum(map(sum, self.fwd_layer)) + sum(self.head_f)
        backward_us = sum(map(sum, self.bwd_layer)) + sum(self.head_b)
        return StageProgram(stage, tuple(self.ops), tuple(passes), forward_us, backward_us)


def stage_program(cfg: LLMConfig, stage: int, ep_rank: int | None = None) -> StageProgram:
    """The ops of one step on `stage` (see the module docstring); `ep_rank`: the expert-parallel rank whose
    all-to-all sizes to use under skewed routing (None: the uniform size)."""
    par = cfg.parallel
    pp, m, v = par.pp, cfg.micro_batches, par.virtual_stages
    if v > 1 and m % pp:
        raise TraceError(f"{cfg.name}: the interleaved schedule (virtual_stages {v}) needs micro-batches ({m}) "
                         f"divisible by pp ({pp}), as Megatron does")
    builder = _ProgramBuilder(cfg, stage, ep_rank)
    if v == 1:
        builder.one_f_one_b()
    else:
        builder.interleaved()
    return builder.program()
