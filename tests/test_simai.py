"""SimAI workload files (traffic.traces.simai) read into every rank of the job, on files the tests write.

Grid of the example (Megatron-Core order tp-cp-dp-pp): all_gpus 8, tp (model_parallel_NPU_group) 2, pp 2, so
dp = 8 / (2 x 2) = 2 and rank = tp_i + 2 * (dp_i + 2 * pp_i). Rank 5 = (tp_i 1, dp_i 0, pp_i 1): its tp group
(4, 5), dp group 1 + 2 * (dp_i + 2) -> (5, 7), pipeline 1 + 2 * (0 + 2 * pp_i) -> (1, 5); rank 0's pipeline (0, 4).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import cli_refuses
from traffic.traces import detect_format, load
from traffic.workload import MAX_COLLECTIVE_BYTES, TraceError

MiB = 1 << 20
HEAD = ("HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 ep: 1 pp: 2 vpp: 2 ga: 3 all_gpus: 8 "
        "checkpoints: 0 checkpoint_initiates: 0 pp_comm: 4096")
# name, reserved, fwd time (ns), type, size, ig time, type, size, wg time, type, size, wg update time
ATTN = f"attention\t-1\t1000\tALLREDUCE\t{MiB}\t2000\tALLREDUCE\t{MiB}\t3000\tNONE\t0\t100"
MLP = f"mlp\t-1\t4000\tALLREDUCE\t{2 * MiB}\t5000\tNONE\t0\t6000\tREDUCESCATTER\t{8 * MiB}\t100"


def write(tmp_path: Path, lines: list[str], name: str = "job.txt") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_layers_forward_then_backward_in_reverse(tmp_path: Path) -> None:
    path = write(tmp_path, [HEAD, "2", ATTN, MLP])
    assert detect_format(path) == "simai"
    w = load(path)
    assert (w.format, w.world_size, len(w.ranks), w.steps, w.timed) == ("simai", 8, 8, 1, False)
    s = w.ranks[5].steps[0]
    # forward: attention's all-reduce, mlp's; rank 5 (last stage) then exchanges activations with stage 0 (rank 1);
    # backward in reverse: mlp's weight-gradient reduce-scatter (dp), attention's input-gradient all-reduce (tp),
    # then the gradients' exchange with stage 0; pipeline transfers ga = 3 times
    assert [(c.kind, c.stream, c.group_ranks, c.size_bytes, c.count) for c in s.collectives] == [
        ("all_reduce", "tp", (4, 5), MiB, 1), ("all_reduce", "tp", (4, 5), 2 * MiB, 1),
        ("send_recv", "pp", (1, 5), 4096, 3), ("reduce_scatter", "dp", (5, 7), 8 * MiB, 1),
        ("all_reduce", "tp", (4, 5), MiB, 1), ("send_recv", "pp", (1, 5), 4096, 3)]
    # compute, ns -> us, in SimAI's order with each layer's update (0.1) after each of its blocking comms (forward,
    # input-gradient): attention fwd 1, comm, update 0.1; mlp fwd 4, comm, update 0.1; | mlp ig 5 (no comm), wg 6,
    # its reduce-scatter; attention ig 2, comm, update 0.1, wg 3 (no comm)
    assert s.compute_us == pytest.approx(1 + 0.1 + 4 + 0.1 + 5 + 6 + 2 + 0.1 + 3)
    starts = [c.start_us for c in s.collectives]  # collectives instantaneous between the compute
    assert starts == pytest.approx([1, 1.1 + 4, 5.2, 5.2 + 5 + 6, 16.2 + 2, 18.3 + 3])
    # the compute waits for forward and input-gradient comms; weight-gradient and pipeline ones run beside it
    assert [c.blocking for c in s.collectives] == [True, True, False, False, True, False]
    assert w.program
    assert all(c.duration_us is None for c in s.collectives)
    assert [c.group_ranks for c in w.ranks[0].steps[0].collectives if c.kind == "send_recv"] == [(0, 4), (0, 4)]
    assert w.ranks[1].steps[0].collectives[2] is s.collectives[2]  # both ranks list the same transfer


def test_expert_suffixes_and_broadcast(tmp_path: Path) -> None:
    head = "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 2 pp: 1 vpp: 1 ga: 1 all_gpus: 8"
    moe = "moe\t-1\t10\tALLTOALL_EP\t4096\t10\tALLTOALL_EP\t4096\t10\tALLREDUCE_DP_EP\t8192\t1"
    norm = "norm\t-1\t0\tBROADCAST\t16384\t1\tNONE\t0\t1\tNONE\t0\t1"
    w = load(write(tmp_path, [head, "2", norm, moe]))
    # tp 2, pp 1, dp 4; expert grid etp 2, ep 2, edp 8 / (2 x 2) = 2: rank = etp_i + 2 * (ep_i + 2 * edp_i);
    # rank 5 = (etp_i 1, ep_i 0, edp_i 1): ep group 1 + 2 * (ep_i + 2) -> (5, 7), edp group 1 + 2 * (0 + 2 edp_i)
    # -> (1, 5)
    s = w.ranks[5].steps[0]
    assert [(c.kind, c.stream, c.group_ranks) for c in s.collectives] == [
        ("all_to_all", "ep", (5, 7)), ("all_to_all", "ep", (5, 7)), ("all_reduce", "edp", (1, 5))]
    assert any("BROADCAST" in n and "16384 bytes" in n for n in w.notes)


def test_micro_file_on_the_whole_job(tmp_path: Path) -> None:
    path = write(tmp_path, ["MICRO", "2", "micro_test\t-1\t1\tNONE\t0\t1\tNONE\t0\t1\tALLREDUCE\t4096\t1",
                            "micro_test\t-1\t1\tNONE\t0\t1\tNONE\t0\t1\tALLGATHER\t8192\t1"])
    with pytest.raises(TraceError, match="world_size"):
        load(path)
    w = load(path, world_size=4)
    s = w.ranks[3].steps[0]  # backward in reverse: the second layer's all-gather first
    assert [(c.kind, c.group_ranks, c.size_bytes) for c in s.collectives] == [
        ("all_gather", (0, 1, 2, 3), 8192), ("all_reduce", (0, 1, 2, 3), 4096)]


def test_world_size_overrides_all_gpus(tmp_path: Path) -> None:
    w = load(write(tmp_path, [HEAD, "2", ATTN, MLP]), world_size=16)
    # dp = 16 / (2 x 2) = 4; rank 5 = 1 + 2 * (dp_i 2 + 4 * pp_i 0): dp group 1 + 2 * dp_i -> (1, 3, 5, 7)
    assert [c.group_ranks for c in w.ranks[5].steps[0].collectives if c.stream == "dp"] == [(1, 3, 5, 7)]
    assert any("mapped onto 16" in n for n in w.notes)


# --- hostile input ------------------------------------------------------------------------------------------------

def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], *named: str) -> None:
    cli_refuses(capsys, write(tmp_path, lines), *named)


@pytest.mark.parametrize(("bad", "named"), [
    (ATTN.replace(f"ALLREDUCE\t{MiB}", "ALLREDUCE\t-5", 1), ("job.txt:3", "fwd_comm_size", "negative")),
    (ATTN.replace(str(MiB), str(MAX_COLLECTIVE_BYTES + 1), 1), ("job.txt:3", "2^48")),
    (ATTN.replace(str(MiB), "9" * 5000, 1), ("job.txt:3", "fwd_comm_size", "not an integer")),
    (ATTN.replace("1000", "fast", 1), ("job.txt:3", "fwd_compute_time")),
    (ATTN.replace("1000", "-1000", 1), ("job.txt:3", "fwd_compute_time")),
    (ATTN.replace("ALLREDUCE", "ALLFOO", 1), ("job.txt:3", "fwd_comm_type", "ALLFOO")),
    (ATTN.rsplit("\t", 1)[0], ("job.txt:3", "11 fields")),
    (ATTN + "\textra", ("job.txt:3", "13 fields")),
])
def test_bad_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, named: tuple[str, ...]) -> None:
    refused(tmp_path, capsys, [HEAD, "2", bad, MLP], *named)


def test_fewer_layers_than_declared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEAD, "3", ATTN, MLP], "2 layer line(s)", "line 2 says 3")


def test_more_layers_than_declared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEAD, "1", ATTN, MLP], "job.txt:4", "more layer lines")


def test_only_a_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEAD], "only a header")


def test_bad_layer_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEAD, "two", ATTN], "job.txt:2", "number of layers")


def test_policy_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, ["HYBRID_DLRM DLRM_LAST_BOTTOM_LAYER: 1", "1", ATTN], "job.txt:1", "HYBRID_DLRM")


def test_header_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEAD.replace("all_gpus: 8", "all_gpus: x"), "2", ATTN, MLP], "job.txt:1", "all_gpus")
    refused(tmp_path, capsys, [HEAD.replace("all_gpus: 8", "all_gpus: 7"), "2", ATTN, MLP], "7", "tp x pp")


def test_binary_junk_after_the_header(tmp_path: Path) -> None:
    path = tmp_path / "junk.txt"
    path.write_bytes((HEAD + "\n2\n").encode() + bytes(range(256)) * 4)
    with pytest.raises(TraceError, match=str(path)):
        load(path)
