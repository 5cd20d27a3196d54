"""A 16-GPU slice of the generated GPT-3 175B step on the emulation (issue 26): the 175B layer shape, 8 of
its layers, TP 4 inside each of dual-plane-16-rail's 4 servers, PP 2 and DP 2 across them.

Worked by hand (h 12288, s 2048, V 51200, micro-batch 1, 4 micro-batches, bf16 activations, fp32 grads):
- TP: every all-reduce stays in its server: no bytes on the fabric; a call of k all-reduces of S = s h 2
  bytes takes k x 2(n - 1)/n x S x 8 bit at NVLink's 3600 Gbit/s (a ring over n = 4 GPUs). A stage's
  forward pass is one call (k = 8: 2 per layer x 4 layers), its backward two (k = 4 each); stage 0 adds
  the input embedding's (k = 1), stage 1 the output layer's input grad (k = 1) and the loss's three.
- Rails: GPU g of every server is on leaf g, and every cross-server group (PP pairs r, r + 8; DP pairs r,
  r + 4; the tied embedding's r, r + 8) joins GPUs of one index: nothing crosses a spine.
- Bytes into the hosts: PP 8 pairs x 4 micro-batches x 2 ways x S; DP 2-rank rings (each rank sends its
  whole gradient once) of the stage's fp32 gradients on one TP rank (stage 0: 4 layers of (12h^2 + 7h)/4
  + 6h, the word embedding V h / 4 and the position embedding s h; stage 1: the same layers, the final
  norm 2h and the tied output embedding V h / 4), 8 groups; the embedding all-reduce, 8 pairs of 2 x V h
  / 4 x 4 bytes. On the wire that is x the bytes scale, plus Ethernet/IP/TCP headers and ACKs."""
from __future__ import annotations

import pytest

from fabric import topofile
from tests.conftest import replayed
from traffic import report
from traffic.llm import build_workload, load_config
from traffic.replay import ReplayOptions

pytestmark = pytest.mark.emulation

SPEC = ("gpt3-175b,name=gpt3-175b-slice16,model.layers=8,parallel.tp=4,parallel.pp=2,parallel.dp=2,"
        "global_batch=8,gpus_per_server=4")
H, S_LEN, V, TP = 12288, 2048, 51200, 4
S = S_LEN * H * 2
NVLINK_BPS = 3600e9


def grads_bytes(stage: int) -> int:
    layers = 4 * ((12 * H * H + 7 * H) // TP + 6 * H)
    extra = V * H // TP + (S_LEN * H if stage == 0 else 2 * H)
    return 4 * (layers + extra)


def test_a_16_gpu_slice_of_gpt3_175b_keeps_tp_in_its_servers_and_its_rings_on_their_rails(tmp_path):
    fab = topofile.load("dual-plane-16-rail")
    workload = build_workload(load_config(SPEC))
    result = replayed(workload, "gpt3-175b-slice16", fab, "adaptive", ReplayOptions(), out_dir=tmp_path)

    # Per micro-batch and DP replica (4 x 2), worked by hand from Megatron-Core's layers (docs/workloads.md):
    # stage 0: its 4 layers' forward all-reduces in one call (8 of S), their backward in two (the attention's
    # and the MLP's input grads, 4 of S each: each hides under its own GEMMs), the input embedding's (1 of S);
    # stage 1: the same three layer calls, the output layer's input grad (1 of S) and the loss's three fp32
    # all-reduces of one value per token (s x 4 bytes).
    tp = [c for c in result.collectives if c.stream == "tp"]
    big = [c for c in tp if c.size_bytes % S == 0]
    loss = [c for c in tp if c.size_bytes == S_LEN * 4]
    assert len(tp) == len(big) + len(loss) == 4 * 2 * (4 + 7), len(tp)
    assert len(loss) == 4 * 3 * 2, len(loss)  # stage 1 only: 4 micro-batches x 3 x its 2 TP groups
    assert sorted(c.size_bytes // S for c in big) == sorted([8] * 16 + [4] * 32 + [1] * 16)
    unit_us = 2 * 3 / 4 * S * 8 / NVLINK_BPS * 1e6  # one all-reduce of S over a 4-GPU ring at NVLink rate
    for c in big:
        assert c.duration_real_us == pytest.approx(c.size_bytes // S * unit_us, rel=0.01)
    for c in loss:
        assert 0 < c.duration_real_us < unit_us

    host_in = sum(l.emu_bytes for l in result.links if l.tier == "host")
    spine = sum(l.emu_bytes for l in result.links if l.tier == "fabric")
    assert spine < 0.01 * host_in, (spine, host_in)

    pp = 8 * 4 * 2 * S
    dp = 4 * 2 * grads_bytes(0) + 4 * 2 * grads_bytes(1)
    emb = 8 * 2 * (4 * V * H // TP)
    hand = (pp + dp + emb) * result.meta.bytes_scale
    # wire bytes: 1514-byte frames carry 1448 payload bytes (x 1.046), plus the ACKs coming back
    assert 1.0 <= host_in / hand <= 1.15, (host_in, hand)

    summary = report.summarize(result)
    assert summary.step_time_us is not None and summary.mfu is not None and 0 < summary.mfu < 1
