"""traffic.llm.model and traffic.llm.rules: parameters, FLOPs and collective sizes worked out by hand."""
from __future__ import annotations

import pytest

from traffic.llm import model, rules
from traffic.llm.config import load_config, parse_config
from traffic.workload import KINDS, TraceError

# the tiny dense job: GPT style (biases, LayerNorm, learned positions, 2-matrix MLP), tied embeddings
TINY = {"name": "tiny", "micro_batch": 2, "global_batch": 8,
        "model": {"layers": 4, "hidden": 64, "ffn_hidden": 256, "heads": 4, "kv_heads": 4, "vocab": 1000,
                  "seq_len": 32, "gated_ffn": False, "tied_embeddings": True},
        "parallel": {"tp": 2, "pp": 2, "dp": 2}}


def tiny(**parallel):
    data = {**TINY, "parallel": {**TINY["parallel"], **parallel}}
    return parse_config(data)


def moe_job(**parallel):
    """8 experts top-2 (gated, no biases), layer 0 dense, EP4 over DP8: edp = 8 / (1 x 4 x 1) = 2."""
    data = {"name": "moe", "micro_batch": 2, "global_batch": 16,
            "model": {"layers": 4, "hidden": 64, "ffn_hidden": 256, "heads": 4, "kv_heads": 4, "vocab": 1000,
                      "seq_len": 32, "gated_ffn": True, "tied_embeddings": False,
                      "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 128, "dense_layers": 1}},
            "parallel": {"dp": 8, "ep": 4, **parallel}}
    return parse_config(data)


B, S, H = 2, 32, 64
ACT = B * S * H * 2  # one micro-batch's activation, bf16: 8192 bytes


def kinds(specs):
    return [(c.kind, c.size_bytes, c.count, c.axis) for c in specs]


# ---- tensor parallelism ----------------------------------------------------------------------------------

def test_tp_without_sp_is_two_all_reduces_each_way():
    cfg = tiny()
    assert kinds(rules.tp_comms(cfg, 0, "fwd")) == [("all_reduce", 8192, 1, "tp")] * 2
    assert kinds(rules.tp_comms(cfg, 3, "bwd")) == [("all_reduce", ACT, 1, "tp")] * 2
    assert all(c.dtype == "bfloat16" for c in rules.tp_comms(cfg, 0, "fwd"))


def test_tp_with_sp_is_gathers_and_scatters_of_the_whole_buffer():
    cfg = tiny(sequence_parallel=True)
    fwd = rules.tp_comms(cfg, 0, "fwd")
    # per block (attention, MLP): all-gather in, reduce-scatter out
    assert [c.kind for c in fwd] == ["all_gather", "reduce_scatter"] * 2
    assert {c.size_bytes for c in fwd} == {ACT}
    bwd = rules.tp_comms(cfg, 0, "bwd")
    # per block: the reduce-scatter's grad (all-gather), the input re-gathered for weight grads, the input grad
    assert [c.kind for c in bwd] == ["all_gather", "all_gather", "reduce_scatter"] * 2
    assert {c.size_bytes for c in bwd} == {ACT}


def test_no_tp_no_tp_comms_and_cp_divides_the_sequence():
    assert rules.tp_comms(tiny(tp=1, dp=4), 0, "fwd") == []
    cfg = tiny(cp=2, dp=1)
    assert kinds(rules.tp_comms(cfg, 0, "fwd")) == [("all_reduce", B * (S // 2) * H * 2, 1, "tp")] * 2


def test_bad_pass_is_an_error():
    with pytest.raises(TraceError, match="pass_"):
        rules.tp_comms(tiny(), 0, "fwdd")  # type: ignore[arg-type]


# ---- context parallelism ---------------------------------------------------------------------------------

def test_cp_ring_attention_sends_kv_chunks_cp_minus_1_times():
    cfg = tiny(cp=2, dp=1)
    # K and V of this rank's s/cp = 16 tokens, b = 2, kv_heads x head_dim = 64 split by tp 2, bf16
    kv = 2 * 16 * 2 * 64 // 2 * 2
    assert kinds(rules.cp_comms(cfg, 0, "fwd")) == [("send_recv", kv, 1, "cp")]
    assert kinds(rules.cp_comms(cfg, 0, "bwd")) == [("send_recv", kv, 1, "cp")] * 2
    cfg4 = parse_config({**TINY, "parallel": {"tp": 1, "cp": 4}})
    assert kinds(rules.cp_comms(cfg4, 0, "fwd")) == [("send_recv", 2 * 8 * 2 * 64 * 2, 3, "cp")]
    assert rules.cp_comms(tiny(), 0, "fwd") == []


# ---- pipeline, embeddings --------------------------------------------------------------------------------

def test_pp_activation_is_split_by_tp_only_with_sp():
    assert rules.pp_p2p_bytes(tiny()) == ACT
    assert rules.pp_p2p_bytes(tiny(sequence_parallel=True)) == ACT // 2


def test_stage_layers_contiguous_and_interleaved():
    cfg = tiny()
    assert [model.stage_layers(cfg, s) for s in (0, 1)] == [range(0, 2), range(2, 4)]
    inter = tiny(virtual_stages=2)
    # chunk c of stage p: layer c x 4/2 + p x 4/(2 x 2)
    assert [list(model.stage_layers(inter, p, c)) for p in (0, 1) for c in (0, 1)] == [[0], [2], [1], [3]]


def test_tied_embedding_sync_over_first_and_last_stage():
    spec = rules.embedding_sync(tiny())
    assert spec is not None
    assert (spec.axis, spec.kind, spec.size_bytes, spec.dtype) == ("emb", "all_reduce", 1000 * 64 // 2 * 4, "float32")
    assert rules.embedding_sync(tiny(pp=1, dp=4)) is None
    assert rules.embedding_sync(parse_config({**TINY, "model": {**TINY["model"], "tied_embeddings": False}})) is None


# ---- data parallelism ------------------------------------------------------------------------------------

# parameters of one tiny layer on one of 2 TP ranks: LayerNorms (2 x (weight + bias) = 4h) whole; QKV weight
# h x 3h and bias 3h split; projection weight h x h split, its bias h whole; fc1 h x 4h and bias 4h split;
# fc2 4h x h split, its bias h whole
LAYER = 4 * 64 + 64 * 192 // 2 + 192 // 2 + 64 * 64 // 2 + 64 + 64 * 256 // 2 + 256 // 2 + 256 * 64 // 2 + 64
EMB = 1000 * 64 // 2  # vocab-parallel
POS = 32 * 64  # learned positions, whole
FINAL_NORM = 2 * 64


def test_one_bucket_per_stage_under_the_default_size_fp32_then_bf16():
    assert LAYER == 25184
    (b0,) = rules.dp_buckets(tiny(), 0)
    assert (b0.axis, b0.kind, b0.dtype, b0.first_layer, b0.last_layer) == ("dp", "all_reduce", "float32", -1, 1)
    assert b0.size_bytes == (2 * LAYER + EMB + POS) * 4
    (b1,) = rules.dp_buckets(tiny(), 1)
    # the last stage: its layers, the final norm and its copy of the tied embedding
    assert b1.size_bytes == (2 * LAYER + FINAL_NORM + EMB) * 4
    assert (b1.first_layer, b1.last_layer) == (2, 4)
    (h0,) = rules.dp_buckets(tiny(grad_reduce_dtype="bfloat16"), 0)
    assert h0.size_bytes == (2 * LAYER + EMB + POS) * 2 and h0.dtype == "bfloat16"


def test_default_bucket_size_is_megatron_cores():
    assert rules.default_bucket_params(tiny()) == 40_000_000
    assert rules.default_bucket_params(load_config("gpt3-175b,parallel.dp=64,parallel.pp=2")) == 64_000_000
    assert rules.default_bucket_params(tiny(overlap_grad_reduce=False)) is None
    assert rules.default_bucket_params(tiny(bucket_params=123)) == 123


def test_buckets_close_once_full_in_backward_order_on_the_first_stage_only():
    buckets = rules.dp_buckets(tiny(bucket_params=10000), 0)
    # stage 0 (pp rank 0, its only chunk): backward order: layer 1's fc2 bias 64 + fc2 8192 + fc1 bias 128 + fc1
    # 8192 = 16576 (>= 10000, closes); layer 1's rest (norm 128, proj bias 64, proj 2048, qkv bias 96, qkv 6144,
    # norm 128 = 8608) + layer 0's fc2 bias 64 + fc2 8192 = 16864; fc1 bias 128 + fc1 8192 + norm 128 + proj bias
    # 64 + proj 2048 = 10560; qkv bias 96 + qkv 6144 + norm 128 + positions 2048 + word embedding 32000 = 40416
    assert [(b.params, b.first_layer, b.last_layer) for b in buckets] == [
        (16576, 1, 1), (16864, 0, 1), (10560, 0, 0), (40416, -1, 0)]
    assert sum(b.params for b in buckets) == 2 * LAYER + POS + EMB
    assert all(b.size_bytes == b.params * 4 for b in buckets)
    # stage 1 (pp rank 1): Megatron-Core turns bucketing off (`DistributedDataParallel`: pp_rank > 0), so the whole
    # buffer is one bucket, reduced once the stage's last backward ends: 2 layers + final norm + embedding copy
    (whole,) = rules.dp_buckets(tiny(bucket_params=10000), 1)
    assert (whole.params, whole.first_layer, whole.last_layer) == (2 * LAYER + FINAL_NORM + EMB, 2, 4)


def test_without_model_parallelism_the_buckets_hold_every_parameter_once():
    # tp 1, ep 1: a rank holds whole layers, so the stages' buckets add up to total_params (model.py counts them
    # its own way), plus the last stage's copy of the tied embedding (vocab x hidden)
    cfg = tiny(tp=1, dp=4)
    held = sum(b.params for stage in (0, 1) for b in rules.dp_buckets(cfg, stage))
    assert held == model.total_params(cfg) + 1000 * 64
    moe = moe_job(ep=1)
    assert sum(b.params for b in rules.dp_buckets(moe, 0)) == model.total_params(moe)


def test_zero1_reduce_scatters_the_buckets_and_all_gathers_bf16_params_in_forward_order():
    cfg = tiny(bucket_params=10000, zero=1)
    buckets = rules.dp_buckets(cfg, 0)
    assert {b.kind for b in buckets} == {"reduce_scatter"}
    assert [b.params for b in buckets] == [16576, 16864, 10560, 40416]  # as in the test above
    gathers = rules.param_gathers(cfg, 0)
    assert [(g.kind, g.axis, g.size_bytes, g.dtype) for g in gathers] == [
        ("all_gather", "dp", n * 2, "bfloat16") for n in (40416, 10560, 16864, 16576)]
    # the distributed optimizer's reduce-scatter follows the same buckets: one on pp rank 1
    assert [b.kind for b in rules.dp_buckets(cfg, 1)] == ["reduce_scatter"]
    assert rules.param_gathers(tiny(), 1) == []


def test_interleaved_stage_has_a_buffer_per_chunk_the_last_chunk_ready_first():
    buckets = rules.dp_buckets(tiny(virtual_stages=2), 0)
    # stage 0 holds chunk 0 = layer 0 (+ the embedding) and chunk 1 = layer 2; chunk 1's backward ends first
    assert [(b.first_layer, b.last_layer, b.params) for b in buckets] == [(2, 2, LAYER), (-1, 0, LAYER + EMB + POS)]


def test_zero3_gathers_each_layer_before_forward_and_backward():
    cfg = tiny(zero=3)
    buckets = rules.dp_buckets(cfg, 0)
    assert [(b.first_layer, b.params, b.kind) for b in buckets] == [
        (1, LAYER, "reduce_scatter"), (0, LAYER, "reduce_scatter"), (-1, EMB + POS, "reduce_scatter")]
    gathers = rules.param_gathers(cfg, 0)
    assert [(g.layer, g.size_bytes) for g in gathers] == [
        (-1, (EMB + POS) * 2), (0, LAYER * 2), (1, LAYER * 2), (1, LAYER * 2), (0, LAYER * 2), (-1, (EMB + POS) * 2)]


def test_grad_groups_span_dp_and_cp_and_the_embedding_ends():
    cfg = parse_config({**TINY, "parallel": {"tp": 2, "cp": 2, "dp": 2, "pp": 2}})
    # rank = tp + 2 (cp + 2 (dp + 2 pp)): rank 1 is tp 1, cp 0, dp 0, pp 0
    assert rules.grad_group(cfg, "dp", 1) == (1, 3, 5, 7)  # cp in {0, 1} x dp in {0, 1}
    assert rules.grad_group(cfg, "dp", 9) == (9, 11, 13, 15)  # the same on stage 1
    assert rules.grad_group(cfg, "emb", 3) == (3, 11)  # tp 1, cp 1, dp 0 on stages 0 and 1
    assert rules.grad_group(tiny(), "dp", 0) == (0, 2)  # no cp: the plain dp group
    assert rules.grad_group(moe_job(), "edp", 0) == moe_job().grid.group_of("edp", 0) == (0, 4)
    with pytest.raises(TraceError, match="axis 'tp'"):
        rules.grad_group(cfg, "tp", 0)


# ---- expert parallelism ----------------------------------------------------------------------------------

def test_ep4_top2_four_all_to_alls_per_moe_layer():
    cfg = moe_job()
    assert cfg.grid.edp == 2
    assert rules.ep_comms(cfg, 0, "fwd") == [] and rules.tp_comms(cfg, 1, "fwd") == []  # dense layer; tp 1
    size = B * S * 2 * H * 2  # tokens x top_k x hidden x 2 B x capacity 1.0 = 16384
    for layer in (1, 2, 3):
        assert kinds(rules.ep_comms(cfg, layer, "fwd")) == [("all_to_all", size, 1, "ep")] * 2
        assert kinds(rules.ep_comms(cfg, layer, "bwd")) == [("all_to_all", size, 1, "ep")] * 2
    padded = moe_job()
    padded = parse_config({**padded.model_dump(), "model": {**padded.model.model_dump(),
                                                          "moe": {**padded.model.moe.model_dump(),
                                                                  "capacity_factor": 1.25}}})
    assert rules.ep_comms(padded, 1, "fwd")[0].size_bytes == round(size * 1.25)


def test_ep_with_sp_sends_the_tp_ranks_share_of_tokens():
    cfg = moe_job(tp=2, dp=4, sequence_parallel=True)
    size = B * S // 2 * 2 * H * 2
    assert kinds(rules.ep_comms(cfg, 1, "fwd")) == [("all_to_all", size, 1, "ep")] * 2
    # expert TP = TP: the routed tokens gathered over TP and reduce-scattered back (whole buffer b s top_k h 2)
    tp = rules.tp_comms(cfg, 1, "fwd")
    assert [c.kind for c in tp] == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
    assert [c.size_bytes for c in tp] == [ACT, ACT, B * S * 2 * H * 2, B * S * 2 * H * 2]


def test_expert_params_reduce_over_edp_and_dense_over_dp():
    buckets = rules.dp_buckets(moe_job(), 0)
    experts = [b for b in buckets if b.axis == "edp"]
    dense = [b for b in buckets if b.axis == "dp"]
    # 2 local experts x 3 matrices x 64 x 128, in layers 1..3
    assert [b.params for b in experts] == [3 * 2 * 3 * 64 * 128]
    per_moe_layer = 2 * 64 + 4 * 64 * 64 + 64 * 8  # RMSNorms, Q K V O, router
    dense_layer = 2 * 64 + 4 * 64 * 64 + 3 * 64 * 256
    assert [b.params for b in dense] == [2 * 1000 * 64 + 64 + dense_layer + 3 * per_moe_layer]


def test_routing_skew_varies_the_return_sizes_reproducibly():
    uniform = moe_job()
    assert rules.ep_rank_shares(uniform, 1) == [0.25] * 4
    data = uniform.model_dump()
    data["model"]["moe"]["routing_skew"] = 1.5
    skewed = parse_config(data)
    shares = rules.ep_rank_shares(skewed, 1)
    assert sum(shares) == pytest.approx(1.0)
    assert max(shares) > 0.25 > min(shares)
    assert rules.ep_rank_shares(skewed, 1) == shares  # seeded
    data["model"]["moe"]["seed"] = 7
    assert rules.ep_rank_shares(parse_config(data), 1) != shares
    base = B * S * 2 * H * 2
    for r in range(4):
        dispatch, combine = rules.ep_comms(skewed, 1, "fwd", ep_rank=r)
        assert dispatch.size_bytes == base  # every rank sends all its tokens' copies
        assert combine.size_bytes == round(base * 4 * shares[r])  # what its experts got, sent back
    with pytest.raises(TraceError, match="ep_rank 4"):
        rules.ep_comms(skewed, 1, "fwd", ep_rank=4)


def test_every_spec_uses_a_known_kind():
    for name in ("gpt3-175b", "llama3-70b", "mixtral-8x22b", "deepseek-v3", "llama3-405b"):
        cfg = load_config(name)
        last = cfg.model.layers - 1
        specs = [*rules.tp_comms(cfg, last, "bwd"), *rules.cp_comms(cfg, last, "bwd"),
                 *rules.ep_comms(cfg, last, "bwd"), *rules.param_gathers(cfg, 0)]
        assert all(s.kind in KINDS for s in specs)
        assert all(b.kind in KINDS for b in rules.dp_buckets(cfg, cfg.parallel.pp - 1))


# ---- parameters and FLOPs --------------------------------------------------------------------------------

def test_gpt3_175b_parameters():
    cfg = load_config("gpt3-175b")
    l, h, V, s = 96, 12288, 51200, 2048
    # Narayanan et al.: 12 l h^2 (1 + 13 / (12 h)) per layers, + V h word embedding; + s h positions + 2h final LN
    expected = 12 * l * h * h * (1 + 13 / (12 * h)) + V * h + s * h + 2 * h
    assert model.total_params(cfg) == pytest.approx(expected, rel=1e-12)
    assert model.total_params(cfg) == pytest.approx(174.6e9, rel=1e-3)


def test_llama3_70b_parameters():
    cfg = load_config("llama3-70b")
    l, h, f, V = 80, 8192, 28672, 128256
    kv = 8 * 128
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h  # Q, K V (GQA), O, SwiGLU, 2 RMSNorms
    assert model.total_params(cfg) == l * per_layer + 2 * V * h + h
    assert model.total_params(cfg) == pytest.approx(70.6e9, rel=2e-3)


def test_gpt3_flops_with_full_recompute_match_narayanan():
    cfg = load_config("gpt3-175b,compute.recompute=full")
    Bt, s, l, h, V = 1536, 2048, 96, 12288, 51200
    narayanan = 96 * Bt * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    tokens = Bt * s
    ours = sum(model.layer_flops(cfg, i, tokens, "fwd") + model.layer_flops(cfg, i, tokens, "bwd") for i in range(l))
    ours += model.head_flops(cfg, tokens, "fwd") + model.head_flops(cfg, tokens, "bwd")
    assert ours == pytest.approx(narayanan, rel=0.01)
    # model FLOPs (MFU's numerator) count no recompute: 72 B s l h^2 (1 + s / (6h) + V / (12 l h))
    mfu = 72 * Bt * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert model.model_flops_per_step(cfg) == pytest.approx(mfu, rel=0.01)
    assert model.model_flops_per_step(load_config("gpt3-175b")) == model.model_flops_per_step(cfg)


def test_recompute_modes_add_to_backward():
    base = tiny()
    fwd = model.layer_flops(base, 0, 64, "fwd")
    # per token: QKV 2 x 3h^2, out 2h^2, MLP 2 x 8h^2 (= 24 h^2), attention 4 s h
    assert fwd == 64 * (24 * 64 * 64 + 4 * 32 * 64)
    assert model.layer_flops(base, 0, 64, "bwd") == 2 * fwd
    sel = parse_config({**TINY, "compute": {"recompute": "selective"}})
    assert model.layer_flops(sel, 0, 64, "bwd") == 2 * fwd + 64 * 4 * 32 * 64
    full = parse_config({**TINY, "compute": {"recompute": "full"}})
    assert model.layer_flops(full, 0, 64, "bwd") == 3 * fwd


def test_moe_layer_flops_count_top_k_experts_and_the_router():
    cfg = moe_job()
    per_token = 2 * 4 * 64 * 64 + 4 * 32 * 64 + 2 * 2 * 3 * 64 * 128 + 2 * 64 * 8
    assert model.layer_flops(cfg, 1, 10, "fwd") == 10 * per_token
    dense = 2 * 4 * 64 * 64 + 4 * 32 * 64 + 2 * 3 * 64 * 256
    assert model.layer_flops(cfg, 0, 10, "fwd") == 10 * dense
    assert model.head_flops(cfg, 10, "fwd") == 2 * 10 * 64 * 1000


def test_compute_time_at_kernel_efficiency():
    cfg = load_config("gpt3-175b")
    assert model.compute_us(cfg, 1e15) == pytest.approx(1e15 / (989e12 * 0.5) * 1e6)
    a100 = load_config("gpt3-175b,compute.gpu=a100,compute.kernel_efficiency=0.8")
    assert model.compute_us(a100, 312e12) == pytest.approx(1e6 / 0.8)
