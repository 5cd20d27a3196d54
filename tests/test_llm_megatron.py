"""Megatron-Core's rules for what a step issues (issue 41), each on and off, on small jobs whose calls are counted
by hand here: gradient buckets only on the first stage's first chunk; full recompute re-running the forward's
collectives (uniform and block); the input embedding's, output layer's and loss's TP collectives.

The job: GPT style, 4 layers, h 64, ffn 256, 4 heads, vocabulary 1000, sequence 32, micro-batch 2, global batch 8,
TP2 PP2 DP2, so m = 8 / (2 x 2) = 2 micro-batches and 2 layers a stage. One micro-batch's activation is
b s h 2 = 2 x 32 x 64 x 2 = 8,192 bytes; the loss's all-reduces carry one fp32 value per token, b s 4 = 256 bytes.
"""
from __future__ import annotations

from collections import Counter

import pytest

from traffic.llm import model, program, rules
from traffic.llm.config import parse_config

ACT, LOSS, M, LAYERS_PER_STAGE = 2 * 32 * 64 * 2, 2 * 32 * 4, 2, 2
BASE = {"name": "tiny", "micro_batch": 2, "global_batch": 8,
        "model": {"layers": 4, "hidden": 64, "ffn_hidden": 256, "heads": 4, "kv_heads": 4, "vocab": 1000,
                  "seq_len": 32, "gated_ffn": False, "tied_embeddings": True},
        "parallel": {"tp": 2, "pp": 2, "dp": 2}}


def job(parallel: dict | None = None, compute: dict | None = None, model_: dict | None = None, **top: object):
    data = {**BASE, **top, "parallel": {**BASE["parallel"], **(parallel or {})},
            "model": {**BASE["model"], **(model_ or {})}, "compute": {"gpu": "h100", **(compute or {})}}
    return parse_config(data)


def calls(cfg, stage: int, slot: str = "tp") -> Counter:
    """(kind, bytes) -> calls a step of `stage` issues on `slot`."""
    out: Counter = Counter()
    for op in program.stage_program(cfg, stage).ops:
        if isinstance(op, (program.Block, program.Async)):  # where a collective is issued (a Join only waits)
            for c in op.colls:
                if c.slot == slot:
                    out[(c.kind, c.size_bytes)] += c.count
    return out


# ---- full recompute and the layers around the layers, without sequence parallelism ------------------------------

@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_tp_all_reduces_per_step_without_sp(recompute: str) -> None:
    cfg = job(compute={"recompute": recompute})
    # per layer and micro-batch: 2 forward (attention and MLP outputs) and 2 backward (their input grads); full
    # recompute runs the 2 forward ones again in backward: 6 (Megatron-Core's CheckpointFunction re-runs the
    # layer's forward), selective only the attention core (no collective): 4
    per_layer = 6 if recompute == "full" else 4
    layers = per_layer * LAYERS_PER_STAGE * M
    # stage 0: the vocab-parallel embedding's forward all-reduce per micro-batch (VocabParallelEmbedding.forward)
    assert calls(cfg, 0) == Counter({("all_reduce", ACT): layers + M})
    # stage 1: the output layer's input-grad all-reduce (the f operator's backward) and the vocab-parallel cross
    # entropy's three fp32 all-reduces (max, target logits, sum of exponentials) per micro-batch
    assert calls(cfg, 1) == Counter({("all_reduce", ACT): layers + M, ("all_reduce", LOSS): 3 * M})


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_tp_gathers_and_scatters_per_step_with_sp(recompute: str) -> None:
    cfg = job(parallel={"sequence_parallel": True}, compute={"recompute": recompute})
    # per layer and micro-batch, forward: an all-gather before and a reduce-scatter after each block (2 + 2);
    # backward: per block the output grad's all-gather, the input all-gathered again for the weight grads and the
    # input grad's reduce-scatter (4 + 2); full recompute adds the forward's 2 + 2 again: 8 all-gathers and 6
    # reduce-scatters, selective 6 and 4
    ag, rs = (8, 6) if recompute == "full" else (6, 4)
    n = LAYERS_PER_STAGE * M
    # stage 0: the embedding reduce-scatters into the sequence-parallel region (forward) and all-gathers its grads
    assert calls(cfg, 0) == Counter({("all_gather", ACT): ag * n + M, ("reduce_scatter", ACT): rs * n + M})
    # stage 1: the output layer all-gathers its input (forward), again for its weight grads, and reduce-scatters its
    # input grad (backward); the loss's three all-reduces
    assert calls(cfg, 1) == Counter({("all_gather", ACT): ag * n + 2 * M, ("reduce_scatter", ACT): rs * n + M,
                                     ("all_reduce", LOSS): 3 * M})


def test_block_recompute_re_runs_only_the_first_layers_of_each_stage() -> None:
    # 4 layers a stage (8 layers, PP2), --recompute-method block --recompute-num-layers 1: layer 0 of stage 0 and
    # layer 4 of stage 1 recompute; every other layer does not
    cfg = job(model_={"layers": 8}, compute={"recompute": "full", "recompute_method": "block",
                                             "recompute_num_layers": 1})
    assert [i for i in range(8) if model.recomputed(cfg, i)] == [0, 4]
    assert calls(cfg, 0)[("all_reduce", ACT)] == (4 * 4 + 2 * 1) * M + M
    # its FLOPs too: 3 x forward for the recomputed layer, 2 x for the others
    fwd = model.layer_flops(cfg, 1, 64, "fwd")
    assert model.layer_flops(cfg, 0, 64, "bwd") == pytest.approx(3 * fwd)
    assert model.layer_flops(cfg, 1, 64, "bwd") == pytest.approx(2 * fwd)
    uniform = job(model_={"layers": 8}, compute={"recompute": "full"})
    assert all(model.recomputed(uniform, i) for i in range(8))
    assert calls(uniform, 0)[("all_reduce", ACT)] == 6 * 4 * M + M


def test_full_recompute_re_runs_the_moe_layers_all_to_alls() -> None:
    # 8 experts top-2, EP4 over DP8 (PP1, TP1), 4 layers of which layer 0 dense: 3 MoE layers, M = 16 / (2 x 8) = 1.
    # all-to-all size: tokens b s = 64 x top-2 x h 64 x 2 bytes = 16,384; per MoE layer and micro-batch: dispatch
    # and combine forward, their grads backward (4), and with full recompute dispatch and combine again (6)
    moe = {"experts": 8, "top_k": 2, "expert_ffn_hidden": 128, "dense_layers": 1}
    a2a = 2 * 32 * 2 * 64 * 2
    for recompute, per_layer in (("selective", 4), ("full", 6)):
        cfg = job(parallel={"tp": 1, "pp": 1, "dp": 8, "ep": 4}, compute={"recompute": recompute},
                  model_={"gated_ffn": True, "tied_embeddings": False, "moe": moe}, global_batch=16)
        assert calls(cfg, 0, "ep") == Counter({("all_to_all", a2a): per_layer * 3 * 1}), recompute


# ---- gradient buckets -------------------------------------------------------------------------------------------

def _dp_calls(cfg, stage: int) -> list[tuple[str, int]]:
    return [(c.kind, c.size_bytes) for op in program.stage_program(cfg, stage).ops
            if isinstance(op, (program.Block, program.Async)) for c in op.colls if c.slot in ("dp", "edp")]


def test_buckets_on_the_first_stage_one_buffer_elsewhere() -> None:
    # bucket_params 10,000 (the worked split in tests/test_llm_rules.py): stage 0 issues 4 fp32 all-reduces of
    # 16,576, 16,864, 10,560 and 40,416 parameters; stage 1 (pp rank 1, no bucketing in Megatron-Core) one of its
    # whole buffer: 2 layers of 25,184 + the final norm 128 + the tied embedding copy 32,000 = 82,496
    cfg = job(parallel={"bucket_params": 10000})
    assert _dp_calls(cfg, 0) == [("all_reduce", 4 * n) for n in (16576, 16864, 10560, 40416)]
    assert _dp_calls(cfg, 1) == [("all_reduce", 4 * 82496)]
    # the same bytes either way: the stage's gradients once
    assert sum(b for _, b in _dp_calls(cfg, 1)) == sum(b.size_bytes for b in rules.dp_buckets(cfg, 1))


def test_interleaved_chunks_after_the_first_are_one_buffer() -> None:
    # 8 layers, PP2, 2 chunks: stage 0 holds chunk 0 = layers 0, 1 (+ the embedding), chunk 1 = layers 4, 5.
    # Megatron-Core's get_model wraps chunks after the first with disable_bucketing: chunk 1 is one bucket of 2 x
    # 25,184 = 50,368, ready first (its backward ends first); chunk 0 splits at 10,000 as before, layers 0, 1
    cfg = job(model_={"layers": 8}, parallel={"bucket_params": 10000, "virtual_stages": 2}, global_batch=8)
    buckets = rules.dp_buckets(cfg, 0)
    assert [(b.params, b.first_layer, b.last_layer) for b in buckets] == [
        (50368, 4, 5), (16576, 1, 1), (16864, 0, 1), (10560, 0, 0), (40416, -1, 0)]
    # stage 1: chunk 0 (layers 2, 3) and chunk 1 (layers 6, 7 + final norm + embedding copy) one buffer each
    assert [(b.params, b.first_layer, b.last_layer) for b in rules.dp_buckets(cfg, 1)] == [
        (2 * 25184 + 128 + 32000, 6, 8), (2 * 25184, 2, 3)]


# ---- TP collectives under the backward GEMMs --------------------------------------------------------------------

H100_PEAK, EFF = 989e12, 0.5


def one_layer(nvlink_gbps: float, overlap: bool):
    """1 layer, h 1024, ffn 4096, 16 heads, sequence 1024, micro-batch 1, vocabulary 32768; TP2 only, one step of
    one micro-batch."""
    return parse_config({"name": "one", "micro_batch": 1, "global_batch": 1, "nvlink_gbps": nvlink_gbps,
                         "model": {"layers": 1, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 16,
                                   "vocab": 32768, "seq_len": 1024, "gated_ffn": False, "tied_embeddings": False},
                         "parallel": {"tp": 2, "pp": 1, "dp": 1, "tp_comm_overlap_bwd": overlap},
                         "compute": {"gpu": "h100", "kernel_efficiency": EFF}})


def us(flops_per_rank: float) -> float:
    return flops_per_rank / (H100_PEAK * EFF) * 1e6


@pytest.mark.parametrize("nvlink_gbps", [3600.0, 1000.0])
def test_a_column_parallel_linears_input_grad_all_reduce_runs_under_its_weight_grad_gemm(nvlink_gbps: float) -> None:
    from traffic.llm import build_workload

    t, h, ffn, vocab = 1024, 1024, 4096, 32768
    # each TP rank's weight-grad GEMM of a column-parallel linear is its forward: QKV 2 t h 3h / 2, the MLP's first
    # linear 2 t h ffn / 2, the output layer 2 t h vocab / 2 FLOPs
    gemm = {"attention": us(2 * t * h * 3 * h / 2), "mlp": us(2 * t * h * ffn / 2), "output": us(2 * t * h * vocab / 2)}
    assert gemm["attention"] == pytest.approx(6.514, abs=1e-3) and gemm["mlp"] == pytest.approx(8.685, abs=1e-3)
    # each block's input-grad all-reduce: t h 2 bytes over 2 ranks (busbw factor 2 (2 - 1) / 2 = 1) at NVLink's rate
    ar = t * h * 2 * 8 / (nvlink_gbps * 1e3)
    # at 3,600 Gbit/s (4.66 us) every all-reduce is shorter than its GEMM: fully hidden; at 1,000 (16.78 us) the
    # attention's and the MLP's are longer: each is exposed by its difference (10.26 and 8.09 us), the output
    # layer's (69.5 us GEMM) still hidden
    hidden = sum(min(ar, g) for g in gemm.values())
    exposed = {k: max(0.0, ar - g) for k, g in gemm.items()}
    if nvlink_gbps == 3600.0:
        assert hidden == pytest.approx(3 * ar) and all(v == 0 for v in exposed.values())
    else:
        assert exposed["attention"] == pytest.approx(10.263, abs=1e-3) and exposed["mlp"] == pytest.approx(8.092, abs=1e-3)
    step = {o: build_workload(one_layer(nvlink_gbps, o)).ranks[0].steps[0].duration_us for o in (False, True)}
    # blocking, the step holds every all-reduce whole; overlapped, what each GEMM hides comes off it
    assert step[False] - step[True] == pytest.approx(hidden, rel=1e-9)


def test_sm_slowdown_stretches_the_gemm_under_an_overlapped_collective() -> None:
    from traffic.llm import build_workload

    cfg = one_layer(3600.0, True)
    slow = cfg.model_copy(update={"compute": cfg.compute.model_copy(update={"overlap_sm_slowdown": 0.1})})
    t, h, ffn, vocab = 1024, 1024, 4096, 32768
    gemms = us(2 * t * h * 3 * h / 2) + us(2 * t * h * ffn / 2) + us(2 * t * h * vocab / 2)
    # every all-reduce is hidden at 3,600 Gbit/s, so the step grows by 10% of the three GEMMs it ran under
    d = [build_workload(c).ranks[0].steps[0].duration_us for c in (cfg, slow)]
    assert d[1] - d[0] == pytest.approx(0.1 * gemms, rel=1e-9)


# ---- Megatron-LM 2021's settings (the SC'21 rows) ---------------------------------------------------------------

def test_pipeline_scatter_gather_sends_a_tp_share_and_gathers_it_on_arrival() -> None:
    cfg = job(parallel={"pipeline_scatter_gather": True})
    # TP2 without SP: each TP rank sends ACT / 2 = 4,096 bytes a micro-batch each way; the receiving stage
    # all-gathers the whole 8,192-byte tensor over TP: stage 1 per received activation (M), stage 0 per received
    # gradient (M)
    for stage in (0, 1):
        p2p = calls(cfg, stage, "pp_next" if stage == 0 else "pp_prev")
        assert p2p == Counter({("send_recv", ACT // 2): 2 * M}), stage
        assert calls(cfg, stage)[("all_gather", ACT)] == M, stage
    # off (Megatron-Core): whole tensors, no gather; with SP the tensor is already split: no gather either
    assert calls(job(), 1, "pp_prev") == Counter({("send_recv", ACT): 2 * M})
    assert ("all_gather", ACT) not in calls(job(), 1)
    sp = job(parallel={"pipeline_scatter_gather": True, "sequence_parallel": True})
    assert calls(sp, 1, "pp_prev") == Counter({("send_recv", ACT // 2): 2 * M})
    assert calls(sp, 1)[("all_gather", ACT)] == calls(job(parallel={"sequence_parallel": True}), 1)[("all_gather", ACT)]


def test_fp16_gradient_reduction_halves_the_bucket_bytes() -> None:
    # stage 1's one buffer: 82,496 parameters (test_buckets_on_the_first_stage_one_buffer_elsewhere) at 2 bytes
    cfg = job(parallel={"grad_reduce_dtype": "float16"})
    (b,) = rules.dp_buckets(cfg, 1)
    assert (b.kind, b.dtype, b.size_bytes) == ("all_reduce", "float16", 2 * 82496)
