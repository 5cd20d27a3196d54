"""Workload files read without silent assumptions (issue 42): SimAI compute in the simulated step, in SimAI's layer
order; AICB expert-parallel rows with and without `--ep`; a timed log's warm-up step; a cut AICB log; a generated
AICB file's computation rows. Every file is written here; every expected value is worked by hand in the comments.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fabric import topofile
from fabriclab.cli import main
from tests.conftest import simulated
from traffic.metrics import compose_program, step_times
from traffic.replay import ReplayOptions
from traffic.traces import load, summarize
from traffic.workload import LEFT_OUT_STREAM, Collective, Step, TraceError

MiB = 1 << 20
DP16 = topofile.load("dual-plane-16")  # 16 hosts, one GPU each


# --- the composition of a program-ordered step ----------------------------------------------------------------------

def _c(stream: str, at_us: float, blocking: bool) -> Collective:
    return Collective("all_reduce", 1024, "bfloat16", (0, 1), stream, at_us, None, "", 1, blocking=blocking)


def test_compose_program_by_hand() -> None:
    # layout (communication taking no time): compute [0, 10] [10, 30] [30, 40]; a blocking "tp" call at 10, a
    # non-blocking "dp" call at 30, another non-blocking "dp" call at 40 (after the last compute)
    step = Step(0, None, ((0.0, 40.0),), (_c("tp", 10.0, True), _c("dp", 30.0, False), _c("dp", 40.0, False)))
    tl = compose_program(step, [5.0, 25.0, 3.0])
    # tp call 10 -> 15, the compute after it waits: [15, 35]; dp call at 30 + 5 = 35 -> 60, compute [35, 45] beside
    # it; the second dp call is issued at 45 but its stream is busy until 60: 60 -> 63; the step ends at 63
    assert tl.collectives == ((10.0, 15.0), (35.0, 60.0), (60.0, 63.0))
    assert tl.compute == ((0.0, 10.0), (15.0, 35.0), (35.0, 45.0))
    t = step_times(tl)
    # compute 40; exposed: [10, 15] and [45, 63] = 5 + 18 = 23; idle 0
    assert (t.step_us, t.compute_us, t.exposed_comm_us, t.idle_us) == pytest.approx((63.0, 40.0, 23.0, 0.0))
    # all blocking: every call delays the compute after it: 40 + 5 + 25 + 3 = 73
    step_b = Step(0, None, ((0.0, 40.0),), (_c("tp", 10.0, True), _c("dp", 30.0, True), _c("dp", 40.0, True)))
    assert step_times(compose_program(step_b, [5.0, 25.0, 3.0])).step_us == pytest.approx(73.0)


# --- SimAI ------------------------------------------------------------------------------------------------------------

SIMAI_HEAD = ("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 1 pp: 1 vpp: 2 ga: 1 all_gpus: 16 "
              "checkpoints: 0 checkpoint_initiates: 0 pp_comm: 0")
# name, reserved, fwd ns, type, size, ig ns, type, size, wg ns, type, size, update ns
SIMAI_LAYERS = [f"attention\t-1\t100000\tALLREDUCE\t{16 * MiB}\t200000\tALLREDUCE\t{16 * MiB}\t300000\tALLREDUCE\t"
                f"{32 * MiB}\t0",
                f"mlp\t-1\t50000\tNONE\t0\t60000\tNONE\t0\t70000\tALLREDUCE\t{8 * MiB}\t0"]


def test_simai_compute_is_in_the_simulated_step(tmp_path: Path) -> None:
    path = tmp_path / "w.txt"
    path.write_text("\n".join([SIMAI_HEAD, "2", *SIMAI_LAYERS]) + "\n")
    w = load(path)
    assert w.program and not w.timed
    res = simulated(w, "t", DP16, "adaptive", ReplayOptions(ports="planned"))
    # the calls in replay order: each tp group's forward all-reduce (8 groups), the 8 dp groups' mlp wg
    # all-reduce, ... Rank 0's own calls: fwd AR on (0, 1) [16 MiB, tp], mlp wg AR on its dp group [8 MiB],
    # attention ig AR [16 MiB, tp], attention wg AR [32 MiB, dp]
    by = {}
    for c in res.collectives:
        by.setdefault((c.stream, c.size_bytes), []).append(c.duration_real_us)
    # rank 0's step by SimAI's order: compute fwd 100 us, its tp AR (blocking, d1); mlp fwd 50; backward: mlp ig
    # 60, mlp wg 70, its dp AR (non-blocking, d4); attention ig 200, its tp AR (blocking, d2); attention wg 300,
    # its dp AR (non-blocking, d3) ends the step; d4 ends long before (it has 200 + d2 + 300 us of compute beside it)
    d_tp = by[("tp", 16 * MiB)]
    d1, d2 = d_tp[0], d_tp[8]  # rank 0's group is the first of the 8 at each place
    d3 = by[("dp", 32 * MiB)][0]
    d4 = by[("dp", 8 * MiB)][0]
    assert d4 < 200 + d2 + 300
    compute = 100 + 50 + 60 + 70 + 200 + 300
    rank0 = next(s for s in res.steps if s.rank == 0)
    assert rank0.compute_us == pytest.approx(compute)
    assert rank0.step_us == pytest.approx(compute + d1 + d2 + d3, rel=1e-9)
    assert rank0.exposed_comm_us == pytest.approx(d1 + d2 + d3, rel=1e-9)
    assert rank0.utilisation == pytest.approx(compute / (compute + d1 + d2 + d3))
    assert all(d > 0 for d in (d1, d2, d3, d4))


def test_simai_pipeline_transfers_per_micro_batch_not_per_layer(tmp_path: Path) -> None:
    # AICB writes vpp = layers per stage (here 2), ga 3: one transfer each way per micro-batch, x3, whatever vpp says
    head = SIMAI_HEAD.replace("pp: 1", "pp: 2").replace("ga: 1", "ga: 3").replace("pp_comm: 0", "pp_comm: 4096")
    for vpp in (1, 2, 48):
        path = tmp_path / f"pp{vpp}.txt"
        path.write_text("\n".join([head.replace("vpp: 2", f"vpp: {vpp}"), "2", *SIMAI_LAYERS]) + "\n")
        w = load(path)
        p2p = [c for c in w.ranks[0].steps[0].collectives if c.kind == "send_recv"]
        assert [(c.count, c.size_bytes, c.blocking) for c in p2p] == [(3, 4096, False), (3, 4096, False)]
        assert any(f"vpp {vpp} not applied" in n for n in w.notes)


def test_simai_rejects_ep_size(tmp_path: Path) -> None:
    path = tmp_path / "w.txt"
    path.write_text("\n".join([SIMAI_HEAD, "2", *SIMAI_LAYERS]) + "\n")
    with pytest.raises(TraceError, match="ep_size .--ep. applies to AICB CSVs only"):
        load(path, ep_size=2)


# --- AICB -------------------------------------------------------------------------------------------------------------

HEADER = "comm_type,comm_group,comm_group_size,msg_size,stage,dst,src,additional,_elapsed_time,algbw,busbw,count"


def _row(ctype: str, group: str, size: str, msg: int, stage: str, ms: str, count: int = 1) -> str:
    return f"CommType.{ctype},CommGroup.{group},{size},{msg},{stage},None,None,,{ms},None,None,{count}"


def _epoch(ms: str) -> str:
    return f"CommType.epoch_end,CommGroup.all,,0,epoch,None,None,,{ms},None,None,1"


def _ep_log(first_ep_ms: str = "100.0") -> list[str]:
    """16 ranks, tp 2 (dp 8); two epochs of: tp AR 1 ms, ep all-to-all (no size) fwd, ep all-to-all x2 bwd,
    dp AR 3 ms."""
    step = [_row("all_reduce", "tp_group", "2", 4 * MiB, "forward.attn", "1.0"),
            _row("all_to_all", "ep_group", "", 8 * MiB, "forward.moe", "{fwd}"),
            _row("all_to_all", "ep_group", "", 8 * MiB, "backward.moe", "2.0", 2),
            _row("all_reduce", "dp_group", "8", 16 * MiB, "backward.grad", "3.0")]
    return (["[rank0 ~ rank15]", HEADER] + [r.format(fwd=first_ep_ms) for r in step] + [_epoch("120.0")]
            + [r.format(fwd="2.0") for r in step] + [_epoch("12.0")])


def test_aicb_ep_rows_without_ep_are_left_out_with_their_time(tmp_path: Path) -> None:
    path = tmp_path / "ep.csv"
    path.write_text("\n".join(_ep_log()) + "\n")
    w = load(path)
    s1 = w.ranks[0].steps[1]
    # step 1: rows 1 + 2 + 2 + 3 = 8 ms of its 12: compute 4 ms (1 ms before each of its 4 collectives)
    assert s1.compute_us == pytest.approx(4000.0)
    assert s1.left_out_us == pytest.approx(4000.0)  # the ep rows' 2 + 2 ms, on their own stream
    assert {c.stream for c in s1.collectives if c.left_out} == {LEFT_OUT_STREAM}
    # trace show counts only what is replayed: 2 all-reduces, 4 + 16 MiB
    assert s1.bytes_by_kind() == {"all_reduce": (2, 20 * MiB)}
    # the note: 4 ep rows over the 2 steps, 6 calls (1 + 2 per step), 3 x 8 MiB x 2 = 48 MiB, 100 + 2 + 2 + 2 ms
    note = next(n for n in w.notes if "ep_group row(s)" in n)
    assert f"4 ep_group row(s) (6 collective(s), {48 * MiB} bytes, 106 ms recorded)" in note
    assert "--ep N" in note
    summary = summarize(w)
    row = next(r for r in summary.step_summaries if r.rank == 0 and r.number == 1)
    assert row.left_out_us == pytest.approx(4000.0) and row.exposed_comm_us == pytest.approx(8000.0)


def test_aicb_ep_rows_with_ep_on_their_groups(tmp_path: Path) -> None:
    path = tmp_path / "ep.csv"
    path.write_text("\n".join(_ep_log()) + "\n")
    w = load(path, ep_size=4)
    # tp 2, dp 8, expert grid etp 2 x ep 4 x edp 2: rank = etp_i + 2 (ep_i + 4 edp_i); rank 0's ep group
    # ep_i 0..3 at etp_i 0, edp_i 0 -> (0, 2, 4, 6); rank 9 = (1, 0, 1) -> 1 + 2 ep_i + 8 -> (9, 11, 13, 15)
    ep0 = [c for c in w.ranks[0].steps[1].collectives if c.kind == "all_to_all"]
    assert [c.group_ranks for c in ep0] == [(0, 2, 4, 6)] * 2 and [c.count for c in ep0] == [1, 2]
    assert [c.group_ranks for c in w.ranks[9].steps[1].collectives if c.kind == "all_to_all"][0] == (9, 11, 13, 15)
    assert not any(c.left_out for r in w.ranks for s in r.steps for c in s.collectives)
    assert not any("ep_group row(s)" in n for n in w.notes)
    with pytest.raises(TraceError, match="--ep .ep_size. 3 does not divide the job's 16 ranks"):
        load(path, ep_size=3)
    odd = tmp_path / "odd.csv"  # an all-to-all of 6 MiB + 2 bytes does not split 4 ways
    odd.write_text("\n".join(_ep_log()).replace(str(8 * MiB), str(6 * MiB + 2)) + "\n")
    with pytest.raises(TraceError, match="does not split into 4 equal parts"):
        load(odd, ep_size=4)


def test_aicb_ep_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ep.csv"
    path.write_text("\n".join(_ep_log()) + "\n")
    assert main(["trace", "show", str(path), "--ep", "3"]) == 2
    err = capsys.readouterr().err
    assert "3 does not divide the job's 16 ranks" in err and "Traceback" not in err
    assert main(["trace", "show", str(path), "--ep", "4"]) == 0
    assert "ep=4" in capsys.readouterr().out


def test_aicb_warm_up_step(tmp_path: Path) -> None:
    # the first ep call took 100 ms in step 0 against 2 ms in step 1: 50x > 10x -> warm-up
    path = tmp_path / "warm.csv"
    path.write_text("\n".join(_ep_log("100.0")) + "\n")
    w = load(path)
    assert [s.warmup for s in w.ranks[0].steps] == [True, False]
    assert any("step 0 marked warm-up" in n and "100 ms" in n and "50x" in n for n in w.notes)
    # 19 ms: 9.5x the median, not warm-up
    calm = tmp_path / "calm.csv"
    calm.write_text("\n".join(_ep_log("19.0")) + "\n")
    assert [s.warmup for s in load(calm).ranks[0].steps] == [False, False]


def test_aicb_cut_log_drops_the_partial_step(tmp_path: Path) -> None:
    lines = _ep_log() + [_row("all_reduce", "tp_group", "2", 4 * MiB, "forward.attn", "1.0"),
                         _row("all_reduce", "dp_group", "8", 16 * MiB, "backward.grad", "3.0")]
    path = tmp_path / "cut.csv"
    path.write_text("\n".join(lines) + "\n")
    w = load(path)
    assert w.steps == 2  # the two rows after the last epoch_end are no step
    assert any("2 row(s) after the last epoch_end left out: a partial step" in n for n in w.notes)


def test_aicb_untimed_without_epoch_end_is_one_step(tmp_path: Path) -> None:
    rows = [_row("all_reduce", "tp_group", "2", 4 * MiB, "forward.attn", "None"),
            _row("all_reduce", "dp_group", "8", 16 * MiB, "backward.grad", "None")]
    path = tmp_path / "gen.csv"
    path.write_text("\n".join(["[rank0 ~ rank15]", HEADER, *rows]) + "\n")
    w = load(path)
    assert w.steps == 1 and not w.timed and not w.program
    assert any("no epoch_end row: all its rows read as one step" in n for n in w.notes)


def test_aicb_generated_file_keeps_its_computation_rows(tmp_path: Path) -> None:
    comp = "CommType.computation,None,None,(4096 2048),{stage},None,None,,{ms},None,None,1"
    rows = [comp.format(stage="forward.attn", ms="0.5"),
            _row("all_reduce", "tp_group", "2", 4 * MiB, "forward.attn", "None"),
            comp.format(stage="backward.attn", ms="1.0"),
            _row("all_reduce", "dp_group", "8", 16 * MiB, "backward.grad", "None"), _epoch("None")]
    path = tmp_path / "gen.csv"
    path.write_text("\n".join(["[rank0 ~ rank15]", HEADER, *rows]) + "\n")
    w = load(path)
    assert w.program and not w.timed
    s = w.ranks[0].steps[0]
    # compute 500 us then the tp all-reduce, 1000 us then the dp all-reduce
    assert s.compute == ((0.0, 1500.0),)
    assert [c.start_us for c in s.collectives] == [500.0, 1500.0]
    res = simulated(w, "t", DP16, "adaptive", ReplayOptions(ports="planned"))
    d_tp = next(c.duration_real_us for c in res.collectives if c.stream == "tp")
    d_dp = next(c.duration_real_us for c in res.collectives if c.stream == "dp")
    rank0 = next(r for r in res.steps if r.rank == 0)
    # each collective waited for where it stands: 500 + d_tp + 1000 + d_dp
    assert rank0.step_us == pytest.approx(1500 + d_tp + d_dp, rel=1e-9)
    assert rank0.compute_us == pytest.approx(1500.0)
