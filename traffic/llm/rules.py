"""Which collectives a Megatron-Core training step issues, and how big they are (pure).

Per layer and micro-batch: tensor parallelism (`tp_comms`), context parallelism's ring attention
(`cp_comms`), expert parallelism's token all-to-alls (`ep_comms`); per micro-batch the pipeline's
activation (`pp_p2p_bytes`); per step the data-parallel gradient buckets (`dp_buckets`), the ZeRO /
FSDP parameter all-gathers (`param_gathers`) and the tied-embedding all-reduce (`embedding_sync`).
Sizes follow the nccl-tests convention (`traffic.workload`); docs/workloads.md ("collective rules")
says where each rule comes from.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
import numpy as np

from traffic.llm.model import Pass, stage_layers
from traffic.llm.schema import LLMConfig
from traffic.workload import TraceError

GRAD_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class CommSpec:
    axis: str  # the process group's axis: "tp", "cp", "pp", "dp", "edp", "ep", "emb"
    kind: str  # one of traffic.workload.KINDS
    size_bytes: int  # nccl-tests convention, per collective
    count: int  # back-to-back collectives of size_bytes each
    dtype: str
    what: str  # why it is issued
    layer: int | None = None  # the layer it belongs to, where one (param_gathers)
    # the GEMM it runs under in a column-parallel linear's backward (`LinearWithGradAccumulationAndAsyncCommunication
    # .backward`), "GEMM:BLOCK": "dgrad:..." (the SP input all-gather), "wgrad:..." (the input grad's all-reduce or
    # reduce-scatter), BLOCK the linear's block (`model.COLUMN_BLOCKS` or "output layer"); "" blocks compute
    hides: str = ""


@dataclass(frozen=True)
class Bucket:
    """A gradient bucket of one pipeline stage; ready when backward has done layer `first_layer` (grads fill in
    reverse). Layer -1 is the input embedding, `model.layers` the output layer and final norm."""

    axis: str  # "dp" (dense parameters) or "edp" (experts)
    kind: str  # all_reduce (zero 0) or reduce_scatter (zero >= 1)
    size_bytes: int
    dtype: str
    first_layer: int
    last_layer: int

    @property
    def params(self) -> int:
        return self.size_bytes // GRAD_BYTES[self.dtype]


# ---- tensor parallelism ------------------------------------------------------------------------------------

def _tokens(cfg: LLMConfig) -> int:
    """Tokens of one micro-batch on one context-parallel rank."""
    return cfg.micro_batch * cfg.model.seq_len // cfg.parallel.cp


def _tp_block(cfg: LLMConfig, pass_: Pass, block: str, size: int) -> list[CommSpec]:
    """One column-parallel -> row-parallel block (attention, MLP) of Megatron's tensor parallelism."""
    d = cfg.dtype
    if not cfg.parallel.sequence_parallel:
        if pass_ == "fwd":
            return [CommSpec("tp", "all_reduce", size, 1, d, f"{block} output (g)")]
        return [CommSpec("tp", "all_reduce", size, 1, d, f"{block} input grad (f)", hides=f"wgrad:{block}")]
    if pass_ == "fwd":
        return [CommSpec("tp", "all_gather", size, 1, d, f"{block} input (sequence parallel g)"),
                CommSpec("tp", "reduce_scatter", size, 1, d, f"{block} output (sequence parallel g-bar)")]
    return [CommSpec("tp", "all_gather", size, 1, d, f"{block} output grad (g-bar's backward)"),
            CommSpec("tp", "all_gather", size, 1, d, f"{block} input again, for the weight grads",
                     hides=f"dgrad:{block}"),
            CommSpec("tp", "reduce_scatter", size, 1, d, f"{block} input grad (g's backward)", hides=f"wgrad:{block}")]


def _check_pass(pass_: str) -> None:
    if pass_ not in ("fwd", "bwd"):
        raise TraceError(f"pass_ must be 'fwd' or 'bwd', got {pass_!r}")


def tp_comms(cfg: LLMConfig, layer: int, pass_: Pass) -> list[CommSpec]:
    """One layer's tensor-parallel collectives for one micro-batch, in issue order ([] with tp 1)."""
    _check_pass(pass_)
    p, m = cfg.parallel, cfg.model
    if p.tp == 1:
        return []
    act = _tokens(cfg) * m.hidden * cfg.dtype_bytes
    attention = _tp_block(cfg, pass_, "attention", act)
    mlp: list[CommSpec] = []
    if not m.is_moe_layer(layer):
        mlp = _tp_block(cfg, pass_, "mlp", act)
    else:
        assert m.moe is not None
        if m.moe.shared_experts:
            mlp += _tp_block(cfg, pass_, "shared experts", act)
        if p.expert_tp > 1:
            if not p.sequence_parallel:
                mlp += _tp_block(cfg, pass_, "experts", act)
            else:  # the token dispatcher gathers the routed tokens over TP and reduce-scatters them back
                routed = round(_tokens(cfg) * m.moe.top_k * m.hidden * cfg.dtype_bytes * m.moe.capacity_factor)
                # backward: the reduce-scatter's grad is an all-gather, the all-gather's a reduce-scatter
                what = (("routed tokens", "expert outputs") if pass_ == "fwd"
                        else ("expert output grads", "routed token grads"))
                mlp += [CommSpec("tp", "all_gather", routed, 1, cfg.dtype, f"{what[0]} over expert TP"),
                        CommSpec("tp", "reduce_scatter", routed, 1, cfg.dtype, f"{what[1]} over expert TP")]
    return attention + mlp if pass_ == "fwd" else mlp + attention


def embedding_comms(cfg: LLMConfig, pass_: Pass) -> list[CommSpec]:
    """The first stage's vocab-parallel input embedding, per micro-batch: its forward sums the TP ranks' partial
    lookups (`VocabParallelEmbedding.forward`: an all-reduce, or a reduce-scatter into the sequence-parallel
    region with SP, whose backward all-gathers the grads); [] with tp 1."""
    _check_pass(pass_)
    if cfg.parallel.tp == 1:
        return []
    act = _tokens(cfg) * cfg.model.hidden * cfg.dtype_bytes
    if not cfg.parallel.sequence_parallel:
        return [CommSpec("tp", "all_reduce", act, 1, cfg.dtype, "input embedding: partial lookups summed")] \
            if pass_ == "fwd" else []
    if pass_ == "fwd":
        return [CommSpec("tp", "reduce_scatter", act, 1, cfg.dtype, "input embedding into the sequence-parallel region")]
    return [CommSpec("tp", "all_gather", act, 1, cfg.dtype, "input embedding grads (the reduce-scatter's backward)")]


#: the vocab-parallel cross entropy's all-reduces (`VocabParallelCrossEntropy.forward`): the logits' max, the target
#: logits and the sum of exponentials, one fp32 value per token each
LOSS_ALL_REDUCES = ("logits max", "target logits", "sum of exponentials")


def head_comms(cfg: LLMConfig, pass_: Pass) -> list[CommSpec]:
    """The last stage's output layer (a column-parallel linear over the vocabulary) and vocab-parallel loss, per
    micro-batch, in issue order; [] with tp 1. Forward: with SP the input is all-gathered; the loss all-reduces
    three fp32 values per token. Backward: the input grad is all-reduced (the f operator's backward), or with SP
    the input is all-gathered again for the weight grad and the input grad reduce-scattered."""
    _check_pass(pass_)
    if cfg.parallel.tp == 1:
        return []
    act = _tokens(cfg) * cfg.model.hidden * cfg.dtype_bytes
    sp, d = cfg.parallel.sequence_parallel, cfg.dtype
    if pass_ == "fwd":
        gather = [CommSpec("tp", "all_gather", act, 1, d, "output layer input (sequence parallel)")] if sp else []
        return gather + [CommSpec("tp", "all_reduce", _tokens(cfg) * 4, 1, "float32", f"loss: {what}")
                         for what in LOSS_ALL_REDUCES]
    if not sp:
        return [CommSpec("tp", "all_reduce", act, 1, d, "output layer input grad (f)", hides="wgrad:output layer")]
    return [CommSpec("tp", "all_gather", act, 1, d, "output layer input again, for the weight grads",
                     hides="dgrad:output layer"),
            CommSpec("tp", "reduce_scatter", act, 1, d, "output layer input grad (sequence parallel)",
                     hides="wgrad:output layer")]


# ---- context parallelism -----------------------------------------------------------------------------------

def cp_comms(cfg: LLMConfig, layer: int, pass_: Pass) -> list[CommSpec]:
    """Ring attention (Megatron-Core's default cp_comm_type "p2p", Transformer Engine): cp - 1 sends of this
    rank's K and V chunk to the next CP rank forward; backward passes K, V and their grads around the ring."""
    _check_pass(pass_)
    p, m = cfg.parallel, cfg.model
    if p.cp == 1:
        return []
    kv = _tokens(cfg) * 2 * m.kv_heads * m.head_dim // p.tp * cfg.dtype_bytes
    if pass_ == "fwd":
        return [CommSpec("cp", "send_recv", kv, p.cp - 1, cfg.dtype, "ring attention: K, V to the next CP rank")]
    return [CommSpec("cp", "send_recv", kv, p.cp - 1, cfg.dtype, "ring attention backward: K, V"),
            CommSpec("cp", "send_recv", kv, p.cp - 1, cfg.dtype, "ring attention backward: dK, dV")]


# ---- expert parallelism ------------------------------------------------------------------------------------

def ep_rank_shares(cfg: LLMConfig, layer: int) -> list[float]:
    """Each EP rank's share of the routed tokens in one MoE layer (sums to 1): uniform with routing_skew 0; else
    expert e gets weight 1 / (pi(e) + 1)^skew, pi a permutation seeded by (moe.seed, layer), and an EP rank the
    sum of its experts' (experts / ep consecutive experts, as Megatron-Core places them)."""
    moe, ep = cfg.model.moe, cfg.parallel.ep
    if moe is None:
        raise TraceError(f"{cfg.name}: a dense model has no expert routing")
    if moe.routing_skew == 0:
        return [1.0 / ep] * ep
    return list(_skewed_shares(moe.experts, ep, moe.routing_skew, moe.seed, layer))


@lru_cache(maxsize=4096)
def _skewed_shares(experts: int, ep: int, skew: float, seed: int, layer: int) -> tuple[float, ...]:
    rng = np.random.default_rng([seed, layer])
    ranks = rng.permutation(experts)
    weights = 1.0 / (ranks + 1.0) ** skew
    weights /= weights.sum()
    return tuple(float(x) for x in weights.reshape(ep, experts // ep).sum(axis=1))


def ep_comms(cfg: LLMConfig, layer: int, pass_: Pass, ep_rank: int | None = None) -> list[CommSpec]:
    """One MoE layer's token all-to-alls for one micro-batch (dispatch and combine; [] for dense layers or ep 1).
    Size: tokens x top_k x hidden x 2 B x capacity_factor, tokens = micro_batch x seq_len / cp (/ tp with
    sequence parallelism). With routing_skew, `ep_rank`'s combine (fwd) and dispatch-grad (bwd) send what its
    experts got: the size x ep x its share (`ep_rank_shares`); None: the uniform size (the mean)."""
    _check_pass(pass_)
    m, p = cfg.model, cfg.parallel
    if not m.is_moe_layer(layer) or p.ep == 1:
        return []
    assert m.moe is not None
    tokens = _tokens(cfg) // (p.tp if p.sequence_parallel else 1)
    base = tokens * m.moe.top_k * m.hidden * cfg.dtype_bytes * m.moe.capacity_factor
    back = base
    if ep_rank is not None:
        if not 0 <= ep_rank < p.ep:
            raise TraceError(f"ep_rank {ep_rank} is not one of the {p.ep} expert-parallel ranks")
        back = base * p.ep * ep_rank_shares(cfg, layer)[ep_rank]
    d = cfg.dtype
    if pass_ == "fwd":
        return [CommSpec("ep", "all_to_all", round(base), 1, d, "dispatch: tokens to their experts"),
                CommSpec("ep", "all_to_all", round(back), 1, d, "combine: expert outputs back")]
    return [CommSpec("ep", "all_to_all", round(base), 1, d, "combine's backward: output grads to the experts"),
            CommSpec("ep", "all_to_all", round(back), 1, d, "dispatch's backward: input grads back")]


# ---- pipeline parallelism ----------------------------------------------------------------------------------

def pp_p2p_bytes(cfg: LLMConfig) -> int:
    """One activation (or its gradient) per micro-batch, sent by each TP rank of a stage to the next: micro_batch
    x seq_len / cp x hidden x 2 B, / tp with sequence parallelism (the tensor is already split)."""
    size = _tokens(cfg) * cfg.model.hidden * cfg.dtype_bytes
    return size // cfg.parallel.tp if cfg.parallel.sequence_parallel or scatter_gather(cfg) else size


def scatter_gather(cfg: LLMConfig) -> bool:
    """Megatron-LM 2021's pipeline scatter/gather applies: asked, TP > 1 and no SP (with SP the tensor is split)."""
    p = cfg.parallel
    return p.pipeline_scatter_gather and p.tp > 1 and not p.sequence_parallel


def pp_gather(cfg: LLMConfig) -> CommSpec | None:
    """With pipeline scatter/gather: the all-gather over TP of each received activation or gradient, b s h 2 B (the
    whole tensor, nccl-tests' all-gather size); None otherwise."""
    if not scatter_gather(cfg):
        return None
    return CommSpec("tp", "all_gather", _tokens(cfg) * cfg.model.hidden * cfg.dtype_bytes, 1, cfg.dtype,
                    "pipeline tensor gathered (scatter/gather in the pipeline)")


# ---- data parallelism: gradient buckets, parameter gathers -------------------------------------------------

Tensor = tuple[int, int, bool]  # (layer, parameters on one rank, is an expert parameter)


def _layer_tensors(cfg: LLMConfig, layer: int) -> list[Tensor]:
    """One layer's parameter tensors on one rank, in registration (forward) order."""
    m, p = cfg.model, cfg.parallel
    h, tp = m.hidden, p.tp
    bias = not m.gated_ffn
    norm = 2 * h if bias else h  # norms are replicated on the TP ranks: whole
    kv = m.kv_heads * m.head_dim
    qkv = h + 2 * kv
    out: list[Tensor] = [(layer, norm, False), (layer, h * qkv // tp, False)]
    if bias:
        out.append((layer, qkv // tp, False))  # column-parallel bias: split
    out.append((layer, h * h // tp, False))
    if bias:
        out.append((layer, h, False))  # row-parallel bias: whole
    out.append((layer, norm, False))
    mats = 3 if m.gated_ffn else 2
    if not m.is_moe_layer(layer):
        f = m.ffn_hidden
        out.append((layer, (mats - 1) * h * f // tp, False))
        if bias:
            out.append((layer, f // tp, False))
        out.append((layer, h * f // tp, False))
        if bias:
            out.append((layer, h, False))
        return out
    assert m.moe is not None
    moe = m.moe
    out.append((layer, h * moe.experts, False))  # router: replicated
    if moe.shared_experts:
        out.append((layer, moe.shared_experts * mats * h * moe.expert_ffn_hidden // tp, False))
    local = moe.experts // p.ep
    out.append((layer, local * mats * h * moe.expert_ffn_hidden // p.expert_tp, True))
    return out


def _stage_tensors(cfg: LLMConfig, stage: int, chunk: int) -> list[Tensor]:
    m, p = cfg.model, cfg.parallel
    h, tp = m.hidden, p.tp
    out: list[Tensor] = []
    if stage == 0 and chunk == 0:
        out.append((-1, m.vocab * h // tp, False))  # vocab-parallel word embedding
        if not m.gated_ffn:
            out.append((-1, m.seq_len * h, False))  # learned positions: whole
    for layer in stage_layers(cfg, stage, chunk):
        out += _layer_tensors(cfg, layer)
    if stage == p.pp - 1 and chunk == p.virtual_stages - 1:
        out.append((m.layers, 2 * h if not m.gated_ffn else h, False))  # final norm
        if not m.tied_embeddings or p.pp > 1:  # untied output layer, or the last stage's copy of the embedding
            out.append((m.layers, m.vocab * h // tp, False))
    return out


def default_bucket_params(cfg: LLMConfig) -> int | None:
    """Megatron-Core's DDP bucket size in parameters: `bucket_params`, else max(40e6, 1e6 x dp x cp)
    (`distributed_data_parallel_config.py`, `bucket_size`); None (one bucket) without overlap_grad_reduce."""
    p = cfg.parallel
    if not p.overlap_grad_reduce:
        return None
    if p.bucket_params is not None:
        return p.bucket_params
    return max(40_000_000, 1_000_000 * p.dp * p.cp)


def _split(tensors: list[Tensor], limit: int | None, per_layer: bool) -> list[list[Tensor]]:
    """Buckets of tensors taken in reverse (backward) order: a bucket closes once it holds >= limit parameters
    (Megatron-Core's `_ParamAndGradBuffer`), or at each layer's end (FSDP units)."""
    buckets: list[list[Tensor]] = []
    cur: list[Tensor] = []
    for t in reversed(tensors):
        if per_layer and cur and cur[-1][0] != t[0]:
            buckets.append(cur)
            cur = []
        cur.append(t)
        if not per_layer and limit is not None and sum(x[1] for x in cur) >= limit:
            buckets.append(cur)
            cur = []
    if cur:
        buckets.append(cur)
    return buckets


def dp_buckets(cfg: LLMConfig, stage: int) -> list[Bucket]:
    """The gradient buckets of one pipeline stage, in the order they become ready in backward: per model chunk
    (the last chunk's backward ends first), dense parameters over "dp" and experts over "edp" in separate
    buffers. ZeRO 0: all_reduce; 1/2: reduce_scatter; 3: reduce_scatter per layer (FSDP units)."""
    p = cfg.parallel
    if not 0 <= stage < p.pp:
        raise TraceError(f"stage {stage} is not one of the {p.pp} pipeline stages")
    kind = "all_reduce" if p.zero == 0 else "reduce_scatter"
    dtype = p.grad_reduce_dtype
    out: list[tuple[tuple[int, int, int], Bucket]] = []
    for chunk in range(p.virtual_stages):
        # Megatron-Core buckets only the first pipeline stage's first model chunk: on pp_rank > 0
        # (`DistributedDataParallel.__init__`: "bucket_size = None ... if disable_bucketing or pp_rank > 0") and
        # for model chunks after the first (`get_model`: disable_bucketing = model_chunk_idx > 0) each buffer is
        # one bucket, reduced once its chunk's last backward ends
        limit = default_bucket_params(cfg) if stage == 0 and chunk == 0 else None
        tensors = _stage_tensors(cfg, stage, chunk)
        for expert, axis in ((False, "dp"), (True, "edp")):
            mine = [t for t in tensors if t[2] == expert]
            for group in _split(mine, limit, per_layer=p.zero == 3):
                params = sum(t[1] for t in group)
                layers = [t[0] for t in group]
                b = Bucket(axis, kind, params * GRAD_BYTES[dtype], dtype, min(layers), max(layers))
                # readiness: later chunks first, then higher layers; a layer's experts (MLP) before its attention
                out.append(((-chunk, -b.first_layer, 0 if expert else 1), b))
    return [b for _, b in sorted(out, key=lambda kb: kb[0])]


def param_gathers(cfg: LLMConfig, stage: int) -> list[CommSpec]:
    """Parameter all-gathers of one stage per step. ZeRO 1/2 (distributed optimizer): the updated bf16
    parameters of each gradient bucket, in forward order (Megatron-Core overlaps them with the next forward);
    ZeRO 3 (FSDP): each layer's parameters before its forward and again before its backward; ZeRO 0: none."""
    p = cfg.parallel
    if p.zero == 0:
        return []
    size = cfg.dtype_bytes
    buckets = dp_buckets(cfg, stage)
    forward = buckets[::-1]  # the reverse of backward's readiness
    gather = [CommSpec(b.axis, "all_gather", b.params * size, 1, cfg.dtype,
                       f"parameters of layers {b.first_layer}..{b.last_layer}"
                       + (", before their forward" if p.zero == 3 else " after the optimizer"), b.first_layer)
              for b in forward]
    if p.zero < 3:
        return gather
    again = [CommSpec(b.axis, "all_gather", b.params * size, 1, cfg.dtype,
                      f"parameters of layers {b.first_layer}..{b.last_layer}, before their backward", b.first_layer)
             for b in buckets]
    return gather + again


def grad_group(cfg: LLMConfig, axis: str, rank: int) -> tuple[int, ...]:
    """The ranks `rank` reduces a bucket or the embedding with, ascending: "dp" is Megatron's data-parallel group
    with context parallelism (the dp x cp ranks sharing tp and pp coordinates; the plain dp group with cp 1),
    "edp" the expert grid's, "emb" the first- and last-stage ranks sharing tp, cp and dp coordinates."""
    grid = cfg.grid
    if not 0 <= rank < grid.world:
        raise TraceError(f"rank {rank} is not in the {grid.world}-rank job")
    if axis == "edp":
        return grid.group_of("edp", rank)
    c = grid.coords(rank)
    if axis == "dp":
        return tuple(sorted(grid.rank(tp=c["tp"], cp=cp, dp=dp, pp=c["pp"])
                            for cp in range(grid.cp) for dp in range(grid.dp)))
    if axis == "emb":
        ends = sorted({0, grid.pp - 1})
        return tuple(grid.rank(tp=c["tp"], cp=c["cp"], dp=c["dp"], pp=pp) for pp in ends)
    raise TraceError(f"grad_group: axis {axis!r} is not 'dp', 'edp' or 'emb'")


def embedding_sync(cfg: LLMConfig) -> CommSpec | None:
    """Tied embeddings with pp > 1: the first and last stage all-reduce the word-embedding grads (vocab-parallel:
    vocab x hidden / tp of them) after the pipeline flush (Megatron-Core `_allreduce_word_embedding_grads`)."""
    m, p = cfg.model, cfg.parallel
    if not m.tied_embeddings or p.pp == 1:
        return None
    dtype = p.grad_reduce_dtype
    return CommSpec("emb", "all_reduce", m.vocab * m.hidden // p.tp * GRAD_BYTES[dtype], 1, dtype,
                    "tied word-embedding grads, first and last stage")
