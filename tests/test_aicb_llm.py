"""An AICB CSV (written here) reads into the same Workload as the equivalent model config: the same
groups, counts and bytes per rank and group (issue 26). Both sides are checked against values worked
out by hand, not against each other alone.

The job: a GPT-style dense model (tied embeddings, learned positions, biases), 4 layers, h 64, ffn 256,
4 heads, vocabulary 1000, sequence 32, micro-batch 2, global batch 8, on 8 ranks: TP 2, PP 2, DP 2, so
m = 8 / (2 x 2) = 2 micro-batches; Megatron-Core order rank = tp_i + 2 (dp_i + 2 pp_i): stage 0 is ranks
0-3, stage 1 ranks 4-7.
- TP (no sequence parallelism): 2 all-reduces forward and 2 backward per layer and micro-batch, of
  b s h 2 = 2 x 32 x 64 x 2 = 8192 bytes; 2 layers per stage: 8 each way per step.
- PP: one activation per micro-batch forward and its gradient back, 8192 bytes each.
- DP: one bucket (Megatron-Core's is at least 40M parameters) of the stage's fp32 gradients on one TP
  rank: per layer (12 h^2 + 7 h) / 2 split + 6 h whole = 25,184; stage 0 adds the word embedding V h / 2 =
  32,000 and positions s h = 2,048 (84,416 x 4 = 337,664 bytes); stage 1 the final norm 2 h = 128 and the
  tied output embedding 32,000 (82,496 x 4 = 329,984 bytes).
- The tied embedding: one all-reduce of V h / 2 fp32 gradients = 128,000 bytes over the first and last
  stage.
The generated step has what AICB's generator leaves out besides (the input embedding's, output layer's and loss's
TP all-reduces), worked out in the test.
"""
from __future__ import annotations

from pathlib import Path

from traffic.llm import build_workload, load_config
from traffic.traces import llm_workload, load
from traffic.traces.groups import by_group
from traffic.workload import Workload

HEADER = "comm_type,comm_group,comm_group_size,msg_size,stage,dst,src,additional,_elapsed_time,algbw,busbw,count"
SPEC = ("gpt3-175b,name=tiny,model.layers=4,model.hidden=64,model.ffn_hidden=256,model.heads=4,model.kv_heads=4,"
        "model.vocab=1000,model.seq_len=32,parallel.tp=2,parallel.pp=2,parallel.dp=2,micro_batch=2,global_batch=8,"
        "gpus_per_server=2")
ACT = 2 * 32 * 64 * 2
GRADS = {0: 337_664, 1: 329_984}
EMB = 128_000
M = 2


def row(ctype: str, group: str, gsize: int, size: int, stage: str, additional: str = "", count: int = 1) -> str:
    g = "None" if group == "None" else f"CommGroup.{group}"
    return f"CommType.{ctype},{g},{gsize},{size},{stage},None,None,{additional},None,None,None,{count}"


def aicb_file(tmp_path: Path) -> Path:
    lines = []
    for k, ranks in ((0, range(0, 4)), (1, range(4, 8))):
        lines += [f"[ pp_stage{k}: [{', '.join(f'rank{r}' for r in ranks)}] ]", HEADER,
                  row("broadcast", "dp_group", 2, 8, "init.model_setup"), row("epoch_end", "None", 0, 0, "")]
        for _ in range(M):  # forward: receive (stage 1), the layers' TP all-reduces, send (stage 0)
            if k == 1:
                lines.append(row("irecv", "pp_group", 1, ACT, "forward_step", "recv_prev"))
            lines.append(row("all_reduce", "tp_group", 2, ACT, "forward.MegatronRowLinear", count=2 * 2))
            if k == 0:
                lines.append(row("isend", "pp_group", 1, ACT, "forward_step", "send_next"))
        for _ in range(M):  # backward
            if k == 0:
                lines.append(row("irecv", "pp_group", 1, ACT, "backward_step", "recv_next"))
            lines.append(row("all_reduce", "tp_group", 2, ACT, "backward.MegatronRowLinear", count=2 * 2))
            if k == 1:
                lines.append(row("isend", "pp_group", 1, ACT, "backward_step", "send_prev"))
        lines += [row("all_reduce", "dp_group", 2, GRADS[k], "backward.grad_reduce"),
                  row("all_reduce", "embedding_group", 2, EMB, "backward.embedding"),
                  row("epoch_end", "None", 0, 0, "")]
    p = tmp_path / "tiny.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def per_group(w: Workload, rank: int) -> set[tuple[str, str, int, int, int]]:
    """(group, kind, group size, count, total bytes) of the rank's one step, whatever the step's number."""
    return {(g.group, g.kind, g.group_size, g.count, g.total_bytes) for g in by_group(w, rank)}


def groups_of(w: Workload, rank: int) -> dict[str, set[tuple[int, ...]]]:
    out: dict[str, set[tuple[int, ...]]] = {}
    trace = next(r for r in w.ranks if r.rank == rank)
    for s in trace.steps:
        for c in s.collectives:
            out.setdefault(c.stream, set()).add(c.group_ranks)
    return out


def test_an_aicb_file_reads_into_the_workload_of_the_equivalent_config(tmp_path):
    from_csv = load(aicb_file(tmp_path))
    generated = build_workload(load_config(SPEC))
    assert from_csv.world_size == generated.world_size == 8
    assert from_csv.steps == generated.steps == 1
    for rank in range(8):
        stage = rank // 4
        hand = {("tp", "all_reduce", 2, 4 * 2 * M, 4 * 2 * M * ACT), ("pp", "send_recv", 2, 2 * M, 2 * M * ACT),
                ("dp", "all_reduce", 2, 1, GRADS[stage]), ("emb", "all_reduce", 2, 1, EMB)}
        assert per_group(from_csv, rank) == hand, rank
        # AICB's generator leaves out what Megatron-Core issues around the layers; the generator does not: on
        # stage 0 the input embedding's forward all-reduce (ACT), on stage 1 the output layer's input-grad
        # all-reduce (ACT) and the loss's three fp32 all-reduces of one value per token (b s 4 = 256 bytes), per
        # micro-batch
        extra = (M, M * ACT) if stage == 0 else (M + 3 * M, M * ACT + 3 * M * 2 * 32 * 4)
        tp = ("tp", "all_reduce", 2, 4 * 2 * M + extra[0], 4 * 2 * M * ACT + extra[1])
        assert per_group(generated, rank) == hand - {("tp", "all_reduce", 2, 4 * 2 * M, 4 * 2 * M * ACT)} | {tp}
        assert groups_of(from_csv, rank) == groups_of(generated, rank), rank
    # rank 5 = (tp_i 1, dp_i 0, pp_i 1): tp (4, 5), dp (5, 7), its pipeline and tied embedding (1, 5)
    assert groups_of(generated, 5) == {"tp": {(4, 5)}, "dp": {(5, 7)}, "pp": {(1, 5)}, "emb": {(1, 5)}}


# --- a measured profile in place of the stated kernel efficiency ------------------------------------------------------

def _kineto_profile(path: Path, compute_us: list[float], rank: int = 0) -> Path:
    """A CPU-only Kineto trace of one rank: per step a marker, one compute op `compute_us` long and a small
    all-reduce after it."""
    import json

    events, t = [], 1000.0
    for k, c in enumerate(compute_us):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 10,
                       "ts": t, "dur": c + 100.0, "args": {}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 10, "ts": t + 50.0, "dur": c,
                       "args": {}})
        events.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 20,
                       "ts": t + 60.0 + c, "dur": 20.0, "args": {"Input Dims": [[250]], "Input type": ["float"]}})
        t += c + 1000.0
    path.write_text(json.dumps({"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 8},
                                "traceEvents": events}))
    return path


def test_a_measured_profile_sets_the_kernel_efficiency(tmp_path):
    import pytest

    from traffic.workload import TraceError

    stated = build_workload(load_config(SPEC)).ranks[0].steps[0].compute_us  # at the stated 0.5: a scale only
    measured = 3.0 * stated  # the profile's rank 0 computes 3x as long per step (the median of its 3 steps)
    prof = _kineto_profile(tmp_path / "rank0.json", [0.9 * measured, measured, 1.2 * measured])
    w = llm_workload(load_config(f"{SPEC},compute.profile={prof}"))
    # the defining property: the generated step's compute on the profiled rank is the profile's
    assert w.ranks[0].steps[0].compute_us == pytest.approx(measured, rel=1e-9)
    assert w.training is not None and w.training.kernel_efficiency < 0.5 / 2
    assert any(str(prof) in n and "kernel efficiency" in n for n in w.notes)
    # a profile faster than the GPU's peak allows for this job's FLOPs is not of this job
    fast = _kineto_profile(tmp_path / "fast.json", [stated / 10])
    with pytest.raises(TraceError, match="faster than this job's FLOPs allow"):
        llm_workload(load_config(f"{SPEC},compute.profile={fast}"))
    with pytest.raises(TraceError, match="profile_rank 9"):
        llm_workload(load_config(f"{SPEC},compute.profile={prof},compute.profile_rank=9"))
