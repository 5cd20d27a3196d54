"""Parameter counts, FLOPs and compute time of a transformer training step, from its shape (pure).

FLOPs count the matrix multiplications only (2 per multiply-add), as Narayanan et al. (SC'21, section 5.1
and appendix) do: per token and layer forward, 2 x the layer's matrix parameters touched (attention
projections with GQA, the MLP's 2 or 3 matrices, for MoE the top_k experts' and the shared experts' MLPs and the
router) plus the attention scores and values, 2 x 2 x seq_len x hidden (causal masking NOT halved,
as Narayanan et al. count it). Backward is 2 x forward; full recompute runs the forward again,
selective recompute the attention core (scores and values) again. The output layer (logits) is
2 x hidden x vocab per token. docs/workloads.md ("compute model") says what this leaves out.
"""
from __future__ import annotations

from typing import Literal

from traffic.llm.schema import LLMConfig
from traffic.workload import TraceError

Pass = Literal["fwd", "bwd"]

#: Dense bf16 tensor-core peak per GPU, FLOP/s (vendor data sheets, without sparsity).
GPU_PEAK_FLOPS: dict[str, float] = {"a100": 312e12, "h100": 989e12, "h200": 989e12, "b200": 2250e12}


def stage_layers(cfg: LLMConfig, stage: int, chunk: int = 0) -> range:
    """The global layer indexes of pipeline stage `stage` (its model chunk `chunk` when interleaved), as
    Megatron-Core assigns them (`get_transformer_layer_offset`): chunk c of stage p holds the
    L / (pp x v) layers from c x L / v + p x L / (pp x v)."""
    p = cfg.parallel
    if not 0 <= stage < p.pp:
        raise TraceError(f"stage {stage} is not one of the {p.pp} pipeline stages")
    if not 0 <= chunk < p.virtual_stages:
        raise TraceError(f"chunk {chunk} is not one of the {p.virtual_stages} model chunks")
    per_chunk = cfg.model.layers // (p.pp * p.virtual_stages)
    start = chunk * (cfg.model.layers // p.virtual_stages) + stage * per_chunk
    return range(start, start + per_chunk)


def _has_bias(cfg: LLMConfig) -> bool:
    return not cfg.model.gated_ffn  # GPT-3 style: linear biases and LayerNorm (weight + bias)


def _mlp_matrices(cfg: LLMConfig) -> int:
    return 3 if cfg.model.gated_ffn else 2


def _attention_matrix_params(cfg: LLMConfig) -> int:
    m = cfg.model
    kv = m.kv_heads * m.head_dim
    return m.hidden * (m.hidden + 2 * kv) + m.hidden * m.hidden  # Q, K, V, then the output projection


def _mlp_matrix_params(cfg: LLMConfig, ffn: int) -> int:
    return _mlp_matrices(cfg) * cfg.model.hidden * ffn


def layer_params(cfg: LLMConfig, layer: int) -> int:
    """Parameters of one transformer layer (all TP and EP ranks together): attention, MLP or MoE, norms, biases."""
    m = cfg.model
    h = m.hidden
    kv = m.kv_heads * m.head_dim
    n = _attention_matrix_params(cfg)
    norms = 2 * (2 * h if _has_bias(cfg) else h)  # before attention and before the MLP
    n += norms
    if _has_bias(cfg):
        n += (h + 2 * kv) + h  # QKV bias, output projection bias
    if m.is_moe_layer(layer):
        assert m.moe is not None
        moe = m.moe
        n += (moe.experts + moe.shared_experts) * _mlp_matrix_params(cfg, moe.expert_ffn_hidden)
        n += h * moe.experts  # router
    else:
        n += _mlp_matrix_params(cfg, m.ffn_hidden)
        if _has_bias(cfg):
            n += m.ffn_hidden + h
    return n


def embedding_params(cfg: LLMConfig) -> int:
    """The word embedding (+ learned positions for the GPT style) and, when untied, the output layer."""
    m = cfg.model
    n = m.vocab * m.hidden
    if not m.gated_ffn:
        n += m.seq_len * m.hidden  # learned absolute positions
    if not m.tied_embeddings:
        n += m.vocab * m.hidden
    return n


def final_norm_params(cfg: LLMConfig) -> int:
    h = cfg.model.hidden
    return 2 * h if _has_bias(cfg) else h


def total_params(cfg: LLMConfig) -> int:
    return (sum(layer_params(cfg, i) for i in range(cfg.model.layers)) + embedding_params(cfg)
            + final_norm_params(cfg))


def _attention_core_flops_per_token(cfg: LLMConfig) -> float:
    m = cfg.model
    return 2.0 * 2.0 * m.seq_len * m.hidden  # Q K^T and scores x V, causal mask not halved


def _fwd_flops_per_token(cfg: LLMConfig, layer: int) -> float:
    m = cfg.model
    f = 2.0 * _attention_matrix_params(cfg) + _attention_core_flops_per_token(cfg)
    if m.is_moe_layer(layer):
        assert m.moe is not None
        moe = m.moe
        f += 2.0 * (moe.top_k + moe.shared_experts) * _mlp_matrix_params(cfg, moe.expert_ffn_hidden)
        f += 2.0 * m.hidden * moe.experts  # router
    else:
        f += 2.0 * _mlp_matrix_params(cfg, m.ffn_hidden)
    return f


#: the column-parallel linear of each TP block (`rules._tp_block`'s names): QKV, the MLP's first linear (gated: gate
#: and up), the shared and the routed experts' first linears
COLUMN_BLOCKS = ("attention", "mlp", "shared experts", "experts")


def column_gemm_flops(cfg: LLMConfig, layer: int, tokens: int, block: str) -> float:
    """One GEMM of `block`'s column-parallel linear in `layer` over `tokens` tokens, whole layer (all TP ranks): its
    forward FLOPs. Its backward runs two GEMMs of this size, the input grad's (dgrad) and the weight grad's
    (wgrad); the block's backward TP collectives run under them (`rules.CommSpec.hides`). 0 where the layer has
    no such block."""
    m = cfg.model
    first = _mlp_matrices(cfg) - 1  # the first linear's matrices: up, or gate and up
    if block == "attention":
        return tokens * 2.0 * m.hidden * (m.hidden + 2 * m.kv_heads * m.head_dim)
    if block == "mlp":
        return 0.0 if m.is_moe_layer(layer) else tokens * 2.0 * first * m.hidden * m.ffn_hidden
    if block not in COLUMN_BLOCKS:
        raise TraceError(f"no column-parallel block {block!r} (one of {', '.join(COLUMN_BLOCKS)})")
    if not m.is_moe_layer(layer):
        return 0.0
    assert m.moe is not None
    per_expert = 2.0 * first * m.hidden * m.moe.expert_ffn_hidden
    return tokens * per_expert * (m.moe.shared_experts if block == "shared experts" else m.moe.top_k)


def recomputed(cfg: LLMConfig, layer: int) -> bool:
    """Whether full recompute runs `layer`'s forward again in its backward (collectives included): every layer
    under `recompute_method` "uniform", the first `recompute_num_layers` of each stage's model chunk under "block"
    (Megatron-Core `TransformerBlock._checkpointed_forward`); never without full recompute."""
    c = cfg.compute
    if c.recompute != "full":
        return False
    if c.recompute_method == "uniform":
        return True
    per_chunk = cfg.model.layers // (cfg.parallel.pp * cfg.parallel.virtual_stages)
    return layer % per_chunk < c.recompute_num_layers


def layer_flops(cfg: LLMConfig, layer: int, tokens: int, pass_: Pass) -> float:
    """FLOPs of one whole layer (all TP ranks) over `tokens` tokens; "bwd" includes the recompute."""
    fwd = tokens * _fwd_flops_per_token(cfg, layer)
    if pass_ == "fwd":
        return fwd
    if pass_ != "bwd":
        raise TraceError(f"pass_ must be 'fwd' or 'bwd', got {pass_!r}")
    recompute = cfg.compute.recompute
    if recompute == "full":
        return 3.0 * fwd if recomputed(cfg, layer) else 2.0 * fwd
    if recompute == "selective":
        return 2.0 * fwd + tokens * _attention_core_flops_per_token(cfg)
    return 2.0 * fwd


def head_flops(cfg: LLMConfig, tokens: int, pass_: Pass) -> float:
    """The output layer's logits over `tokens` tokens (last stage); never recomputed."""
    fwd = 2.0 * tokens * cfg.model.hidden * cfg.model.vocab
    if pass_ == "fwd":
        return fwd
    if pass_ != "bwd":
        raise TraceError(f"pass_ must be 'fwd' or 'bwd', got {pass_!r}")
    return 2.0 * fwd


def tokens_per_step(cfg: LLMConfig) -> int:
    return cfg.global_batch * cfg.model.seq_len


def model_flops_per_step(cfg: LLMConfig) -> float:
    """MFU's numerator: the whole job's fwd + bwd (3 x fwd) FLOPs per step, without recompute."""
    tokens = tokens_per_step(cfg)
    fwd = sum(tokens * _fwd_flops_per_token(cfg, i) for i in range(cfg.model.layers))
    fwd += head_flops(cfg, tokens, "fwd")
    return 3.0 * fwd


def compute_us(cfg: LLMConfig, flops: float) -> float:
    """Time of `flops` on ONE GPU at `kernel_efficiency` of its dense peak, microseconds."""
    rate = GPU_PEAK_FLOPS[cfg.compute.gpu] * cfg.compute.kernel_efficiency
    return flops / rate * 1e6
