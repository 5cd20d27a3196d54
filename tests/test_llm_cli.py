"""`fabriclab trace show` on the generated GPT-3 175B step at 1,024 GPUs: rank 0's collectives per step and
process group, against Megatron's rules worked out here by hand (issue 26's "what must be shown")."""
from __future__ import annotations

import json

import pytest

from fabriclab.cli import main

# GPT-3 175B (Brown et al. 2020; Megatron's padded vocabulary): the preset's shape
L, H, S, V, B, GBS = 96, 12288, 2048, 51200, 1, 1536
TP = 8
ACT_BYTES = B * S * H * 2  # one micro-batch's activations in bf16: 50,331,648


def stage0_params_per_tp_rank(layers: int) -> int:
    """GPT-3's stage 0 on one TP rank, by Megatron's split: QKV (h x 3h + 3h bias), the attention's output
    projection (h x h), the MLP (h x 4h + 4h bias, 4h x h) are split by TP; the row-parallel biases (h, h)
    and both layer norms (2 x 2h) are whole; the word embedding is vocabulary-parallel (V h / TP) and the
    learned position embedding (s x h) is whole."""
    split = 3 * H * H + 3 * H + H * H + 4 * H * H + 4 * H + 4 * H * H
    whole = H + H + 2 * 2 * H
    return layers * (split // TP + whole) + V * H // TP + S * H


@pytest.mark.parametrize("pp, dp", [(8, 16), (16, 8)])
def test_trace_show_gpt3_175b_per_group_matches_megatrons_rules(pp, dp, capsys):
    spec = "llm:gpt3-175b" if pp == 8 else "llm:gpt3-175b,parallel.pp=16,parallel.dp=8"
    assert main(["trace", "show", spec, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == TP * pp * dp == 1024
    rows = {(r["group"], r["kind"]): r for r in out["by_group"]["rows"]}
    assert out["by_group"]["rank"] == 0 and {r["step"] for r in out["by_group"]["rows"]} == {0}
    m = GBS // (B * dp)  # micro-batches per step
    layers = L // pp  # on stage 0
    # TP without sequence parallelism: 2 all-reduces forward and 2 backward per layer and micro-batch (the
    # preset's selective recompute re-runs no collective), and stage 0's vocab-parallel input embedding sums its
    # partial lookups: one more all-reduce of the activation per micro-batch
    tp = rows[("tp", "all_reduce")]
    assert (tp["count"], tp["min_bytes"], tp["max_bytes"], tp["group_size"]) == ((4 * layers + 1) * m, ACT_BYTES,
                                                                               ACT_BYTES, TP)
    # PP: stage 0 sends each micro-batch's activations forward and receives its gradient back
    p2p = rows[("pp", "send_recv")]
    assert (p2p["count"], p2p["min_bytes"], p2p["max_bytes"], p2p["group_size"]) == (2 * m, ACT_BYTES, ACT_BYTES, 2)
    # DP: the stage's gradients on one TP rank, fp32 (4 bytes), in buckets of at least Megatron-Core's
    # max(40M, 1M x dp) parameters (the last may be smaller), over the dp ranks
    grads = rows[("dp", "all_reduce")]
    assert grads["total_bytes"] == 4 * stage0_params_per_tp_rank(layers)
    assert grads["group_size"] == dp
    assert grads["min_bytes"] >= 0 and grads["max_bytes"] >= 4 * max(40_000_000, 1_000_000 * dp)
    # tied embeddings: one all-reduce of the word embedding's gradient (V h / TP, fp32) between the first
    # and last stage
    emb = rows[("emb", "all_reduce")]
    assert (emb["count"], emb["total_bytes"], emb["group_size"]) == (1, 4 * V * H // TP, 2)
    assert set(rows) == {("tp", "all_reduce"), ("pp", "send_recv"), ("dp", "all_reduce"), ("emb", "all_reduce")}


def test_workload_llm_says_how_far_the_groups_reach_on_the_pyramid(capsys):
    """Under the default (block) placement on pyramid-1024-rail, worked out by hand: a TP group is one
    server; a DP group (stride 8: GPU g of 16 consecutive servers) stays on rail g's ToR of its rail group of
    32 servers; a PP pair (servers s and s + 16) shares a ToR when both lie in one rail group (the first 16
    servers of each of the 4 groups: half), else crosses pods through the core."""
    assert main(["workload", "llm", "gpt3-175b", "--topology", "pyramid-1024-rail", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    reach = {r["group"]: r for r in out["reach"]}
    assert reach["tp"]["groups"] == 128 and reach["tp"]["reach"] == {"server": 128}
    assert reach["dp"]["groups"] == 64 and reach["dp"]["reach"] == {"tor": 64}
    # 7 stage boundaries x 128 (tp, dp) columns of pairs
    assert reach["pp"]["groups"] == 7 * 128
    assert reach["pp"]["reach"] == {"tor": 4 * 128, "core": 3 * 128}


@pytest.mark.parametrize("argv", [
    ["workload", "llm", "gpt3-175b,parallel.dp=17,global_batch=1632", "--topology", "pyramid-1024-rail"],
    ["sim", "llm:gpt3-175b,parallel.dp=17,global_batch=1632", "--topology", "pyramid-1024-rail", "--routing", "ecmp"],
])
def test_a_job_bigger_than_the_fabric_is_refused_with_both_counts(argv, capsys):
    # TP8 x PP8 x DP17 = 1,088 GPUs; pyramid-1024-rail has 1,024 GPU hosts, 128 servers of 8: block placement
    # would put two ranks on one GPU (issue 42, defect 5)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "1088 GPUs do not fit on pyramid-1024-rail, which has 1024 (128 servers of 8)" in err
    # exactly the fabric's size still runs
    assert main(["workload", "llm", "gpt3-175b,parallel.dp=16", "--topology", "pyramid-1024-rail"]) == 0
