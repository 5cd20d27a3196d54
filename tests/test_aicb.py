"""AICB CSV files (traffic.traces.aicb) read into every rank of the job, on files the tests write.

Rank grid of the examples (Megatron-Core order tp-cp-dp-pp, cp = 1): world 8, tp 2, pp 2, dp 2,
    rank = tp_i + tp * (dp_i + dp * pp_i) = tp_i + 2 * (dp_i + 2 * pp_i)
so rank 1 = (tp_i 1, dp_i 0, pp_i 0), rank 5 = (tp_i 1, dp_i 0, pp_i 1):
    tp group of 1: tp_i 0..1 at dp_i 0, pp_i 0 -> (0, 1);  of 5: (4, 5)
    dp group of 1: 1 + 2 * (dp_i + 0) -> (1, 3);           of 5: 1 + 2 * (dp_i + 2) -> (5, 7)
    pp group of 1 and of 5: 1 + 2 * (0 + 2 * pp_i) -> (1, 5): stage 0 is rank 1, stage 1 rank 5.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fabriclab.cli import main
from tests.conftest import cli_refuses
from traffic.traces import detect_format, load, summarize
from traffic.workload import MAX_COLLECTIVE_BYTES, TraceError

HEADER = "comm_type,comm_group,comm_group_size,msg_size,stage,dst,src,additional,_elapsed_time,algbw,busbw,count"
MiB = 1 << 20


def row(ctype: str, group: str, gsize: object, size: object, stage: str = "forward", additional: str = "",
        ms: object = "None", count: object = 1) -> str:
    g = "None" if group == "None" else f"CommGroup.{group}"
    return f"CommType.{ctype},{g},{gsize},{size},{stage},None,None,{additional},{ms},None,None,{count}"


def write(tmp_path: Path, lines: list[str], name: str = "job.csv") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


# --- a timed file with one section per pipeline stage ---------------------------------------------------------------

def staged(tmp_path: Path) -> Path:
    def stage(k: int, ranks: range, body: list[str], epoch_ms: str) -> list[str]:
        return [f"[ pp_stage{k}: [{', '.join(f'rank{r}' for r in ranks)}] ]", HEADER,
                row("all_reduce", "dp_group", 2, 8, "init.model_setup", ms="0.5"),
                row("epoch_end", "None", "None", 0, "", ms="3.0"),  # the set-up epoch
                *body,
                row("epoch_end", "None", "None", 0, "", ms=epoch_ms),
                row("all_gather", "dp_group", 2, 4 * MiB, "step", ms="0.5"),
                row("epoch_end", "None", "None", 0, "", ms="1.5")]
    ar = row("all_reduce", "tp_group", 2, MiB, "forward.MegatronRowLinear", ms="0.25", count=4)
    rs = row("reduce_scatter", "dp_group", 2, 4 * MiB, "step", ms="0.5")
    first = stage(0, range(0, 4), [ar, row("isend", "pp_group", 1, 65536, "forward_step", "send_next", "0.1"),
                                   row("irecv", "pp_group", 1, 65536, "backward_step", "recv_next", "0.1"), rs],
                  "2.0")
    last = stage(1, range(4, 8), [row("irecv", "pp_group", 1, 65536, "forward_step", "recv_prev", "0.1"), ar,
                                  row("isend", "pp_group", 1, 65536, "backward_step", "send_prev", "0.1"), rs],
                 "2.2")
    return write(tmp_path, first + last)


def test_staged_file_every_rank_on_its_groups(tmp_path: Path) -> None:
    path = staged(tmp_path)
    assert detect_format(path) == "aicb"
    w = load(path)
    assert (w.format, w.world_size, len(w.ranks), w.steps, w.timed) == ("aicb", 8, 8, 2, True)
    r1, r5 = w.ranks[1].steps[0], w.ranks[5].steps[0]
    # stage 0 (rank 1): tp all-reduce x4 on (0, 1), the send to and the receive from stage 1, dp reduce-scatter
    assert [(c.kind, c.group_ranks, c.stream, c.count) for c in r1.collectives] == [
        ("all_reduce", (0, 1), "tp", 4), ("send_recv", (1, 5), "pp", 1), ("send_recv", (1, 5), "pp", 1),
        ("reduce_scatter", (1, 3), "dp", 1)]
    assert [(c.kind, c.group_ranks) for c in r5.collectives] == [
        ("send_recv", (1, 5)), ("all_reduce", (4, 5)), ("send_recv", (1, 5)), ("reduce_scatter", (5, 7))]
    assert r1.collectives[0].total_bytes == 4 * MiB  # count 4 x 1 MiB
    assert r1.bytes_by_kind()["send_recv"] == (2, 2 * 65536)
    # the set-up rows (init.model_setup) and the set-up epoch are no step
    assert [c.kind for c in w.ranks[1].steps[1].collectives] == ["all_gather"]
    assert any("set-up row" in n and "init" in n for n in w.notes)


def test_staged_file_timings_ms_to_us_and_compute_is_epoch_minus_comm(tmp_path: Path) -> None:
    w = load(staged(tmp_path))
    s = w.ranks[1].steps[0]
    rows_us = (0.25 + 0.1 + 0.1 + 0.5) * 1000  # the epoch's rows: 950 us
    assert s.duration_us == pytest.approx(2.0 * 1000)  # epoch_end's 2.0 ms
    assert s.compute_us == pytest.approx(2000 - rows_us)  # 1050 us
    gap = (2000 - rows_us) / 4  # spread before the 4 collectives
    ar = s.collectives[0]
    assert ar.start_us == pytest.approx(gap) and ar.duration_us == pytest.approx(250)
    assert s.collectives[1].start_us == pytest.approx(gap + 250 + gap)
    assert s.collectives[3].end_us == pytest.approx(2000)
    assert s.exposed_comm_us == pytest.approx(rows_us)
    s5 = w.ranks[5].steps[0]  # stage 1's epoch took 2.2 ms
    assert s5.compute_us == pytest.approx(2200 - rows_us)
    assert s5.collectives[0].start_us == pytest.approx((2200 - rows_us) / 4)
    s1 = w.ranks[1].steps[1]
    assert (s1.duration_us, s1.compute_us, s1.collectives[0].start_us) == pytest.approx((1500, 1000, 1000))


def test_staged_file_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = staged(tmp_path)
    assert main(["trace", "show", str(path), "--json"]) == 0
    assert '"format": "aicb"' in capsys.readouterr().out
    summary = summarize(load(path))
    row0 = next(r for r in summary.step_summaries if r.rank == 1 and r.number == 0)
    assert row0.collectives == 4 + 1 + 1 + 1  # the all-reduce row counts 4


# --- an untimed SPMD file ([rank0 ~ rank7]) -------------------------------------------------------------------------

def spmd(tmp_path: Path, world: int = 8) -> Path:
    return write(tmp_path, [
        f"[rank0 ~ rank{world - 1}]", HEADER,
        row("broadcast", "tp_group", 2, 40, "forward_step"),
        row("all_to_all", "tp_group", 2, 2048, "forward.moe", count=3),  # MoE all-to-all on the TP group
        row("all_to_all", "ep_group", 2, 4096, "forward.moe"),
        row("isend", "pp_group", 1, 65536, "forward_step", "send_next"),
        row("all_reduce", "embedding_group", 2, 1024, "backward.embedding"),
        row("all_reduce", "dp_group", 2, MiB, "step"),
        row("barrier", "all", world, 0, "step"),
        row("epoch_end", "None", "None", 0, ""),
    ])


def test_spmd_file_groups_and_untimed(tmp_path: Path) -> None:
    w = load(spmd(tmp_path))
    assert (w.world_size, w.steps, w.timed) == (8, 1, False)
    s5 = w.ranks[5].steps[0]
    # expert grid etp = tp = 2, ep = 2, edp = 8 / (2 x 2 x 2) = 1: rank = etp_i + 2 * (ep_i + 2 * (edp_i + pp_i)),
    # rank 5 = (etp_i 1, ep_i 0, pp_i 1): its ep group 1 + 2 * (ep_i + 2) -> (5, 7)
    # rank 5 is the last stage: its send_next has no peer; its embedding group is its pipeline's ends (1, 5)
    assert [(c.kind, c.stream, c.group_ranks) for c in s5.collectives] == [
        ("broadcast", "tp", (4, 5)), ("all_to_all", "tp", (4, 5)), ("all_to_all", "ep", (5, 7)),
        ("all_reduce", "emb", (1, 5)), ("all_reduce", "dp", (5, 7)), ("barrier", "world", tuple(range(8)))]
    assert s5.collectives[1].count == 3 and s5.collectives[1].total_bytes == 3 * 2048
    assert all(c.start_us is None and c.duration_us is None for c in s5.collectives)
    assert s5.duration_us is None and s5.compute == ()
    s1 = w.ranks[1].steps[0]  # stage 0: its send_next goes to rank 5
    assert ("send_recv", (1, 5), 65536) in [(c.kind, c.group_ranks, c.size_bytes) for c in s1.collectives]
    assert any("send_next" in n and "left out" in n for n in w.notes)


def test_spmd_ranks_of_one_group_share_the_collective(tmp_path: Path) -> None:
    w = load(spmd(tmp_path))
    assert w.ranks[4].steps[0].collectives[0] is w.ranks[5].steps[0].collectives[0]  # tp group (4, 5)


def test_world_size_maps_onto_more_ranks(tmp_path: Path) -> None:
    w = load(spmd(tmp_path), world_size=16)
    # dp = 16 / (tp 2 x pp 2) = 4; rank 5 = 1 + 2 * (dp_i 2 + 4 * pp_i 0): its dp group 1 + 2 * dp_i -> (1, 3, 5, 7)
    assert w.world_size == 16 and len(w.ranks) == 16
    dp = [c for c in w.ranks[5].steps[0].collectives if c.stream == "dp"]
    assert [c.group_ranks for c in dp] == [(1, 3, 5, 7)]
    assert any("mapped onto 16 ranks" in n for n in w.notes)


def test_default_world_is_tp_pp_dp_without_a_rank_line(tmp_path: Path) -> None:
    w = load(write(tmp_path, [HEADER, row("all_reduce", "tp_group", 4, 64), row("all_reduce", "dp_group", 3, 64)]))
    assert w.world_size == 4 * 3  # tp 4 x pp 1 x dp 3
    assert w.ranks[5].steps[0].collectives[1].group_ranks == (1, 5, 9)  # rank 5 = 1 + 4 * dp_i 1


def test_micro_benchmark_file_without_group_sizes_needs_world_size(tmp_path: Path) -> None:
    path = write(tmp_path, ["comm_type,comm_group,msg_size,stage,dst,src,additional,_elapsed_time,algbw,busbw,count",
                            "CommType.all_gather,CommGroup.dp_group,4096,warmup,None,None,,None,None,None,1"])
    with pytest.raises(TraceError, match="world_size"):
        load(path)
    w = load(path, world_size=4)
    assert w.ranks[2].steps[0].collectives[0].group_ranks == (0, 1, 2, 3)


def test_world_size_for_another_format_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "nccl.log"
    log.write_text("node1:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x2 count 4 datatype 7 "
                   "op 0 root 0 comm 0x3 [nranks=1] stream 0x4\n")
    with pytest.raises(TraceError, match="world_size applies to AICB and SimAI"):
        load(log, world_size=4)


def test_big_job_is_fast(tmp_path: Path) -> None:
    import time
    body = [row("all_reduce", "tp_group", 8, MiB), row("all_reduce", "dp_group", 64, MiB)] * 500
    path = write(tmp_path, ["[rank0 ~ rank1023]", HEADER, *body, row("epoch_end", "None", "None", 0, "")])
    t0 = time.perf_counter()
    w = load(path)  # tp 8, pp 1, dp 64 on 1024 ranks x 1000 rows
    assert time.perf_counter() - t0 < 20  # a few seconds; generous for a loaded 2-core machine
    assert len(w.ranks) == 1024 and len(w.ranks[1023].steps[0].collectives) == 1000


# --- hostile input: TraceError naming file:line and the field, exit 2 from the CLI -------------------------------

def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], *named: str) -> None:
    cli_refuses(capsys, write(tmp_path, lines), *named)


@pytest.mark.parametrize(("bad", "named"), [
    (row("all_reduce", "tp_group", 2, -8), ("job.csv:3", "negative size")),
    (row("all_reduce", "tp_group", 2, MAX_COLLECTIVE_BYTES + 1), ("job.csv:3", "2^48")),
    (row("all_reduce", "tp_group", 2, MAX_COLLECTIVE_BYTES // 2, count=3), ("job.csv:3", "count 3", "2^48")),
    (row("all_reduce", "tp_group", 2, "abc"), ("job.csv:3", "msg_size", "not an integer")),
    (row("all_reduce", "tp_group", 2, "9" * 5000), ("job.csv:3", "msg_size", "not an integer")),
    (row("frobnicate", "tp_group", 2, 8), ("job.csv:3", "comm_type", "frobnicate")),
    (row("all_reduce", "xx_group", 2, 8), ("job.csv:3", "comm_group", "xx_group")),
    (row("all_reduce", "tp_group", 2, 8, count=0), ("job.csv:3", "count 0")),
    (row("all_reduce", "tp_group", 10 ** 7, 8), ("job.csv:3", "comm_group_size")),
    (row("all_reduce", "tp_group", "x", 8), ("job.csv:3", "comm_group_size")),
    (row("all_reduce", "tp_group", 2, 8, ms="inf"), ("job.csv:3", "_elapsed_time")),
    (row("all_reduce", "tp_group", 2, 8, ms="fast"), ("job.csv:3", "_elapsed_time", "not a number")),
    (row("isend", "pp_group", 1, 8, additional=""), ("job.csv:3", "isend", "send_next")),
    ("CommType.all_reduce,CommGroup.tp_group,2,8", ("job.csv:3", "missing", "stage")),
    (row("all_reduce", "tp_group", 2, 8) + ",extra", ("job.csv:3", "fields")),
])
def test_bad_row(tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, named: tuple[str, ...]) -> None:
    refused(tmp_path, capsys, ["[rank0 ~ rank3]", HEADER, bad, row("epoch_end", "None", "None", 0, "")], *named)


def test_a_field_beyond_the_csv_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEADER, row("all_reduce", "tp_group", 2, 8, "x" * 200_000)], "job.csv:2", "CSV")


def test_only_a_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEADER], "only a header")


def test_header_without_msg_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, ["comm_type,comm_group,stage", "CommType.all_reduce,CommGroup.tp_group,x"],
            "job.csv:1", "msg_size")


def test_group_sizes_that_disagree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEADER, row("all_reduce", "tp_group", 2, 8), row("all_reduce", "tp_group", 4, 8)],
            "job.csv:3", "line 2")


def test_dp_group_against_the_rank_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, ["[rank0 ~ rank7]", HEADER, row("all_reduce", "dp_group", 3, 8)],
            "job.csv:3", "dp_group of 3", "dp = 8")


def test_timed_and_untimed_rows_mixed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEADER, row("all_reduce", "tp_group", 2, 8, ms="0.5"), row("all_reduce", "tp_group", 2, 8)],
            "job.csv:3", "_elapsed_time missing")


def test_stage_listing_other_than_megatron_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = staged(tmp_path).read_text().splitlines()
    lines[0] = "[ pp_stage0: [rank0, rank1, rank2, rank5] ]"  # stage 0 of 8 ranks, tp 2, dp 2 is ranks 0..3
    refused(tmp_path, capsys, lines, "job.csv:1", "pp_stage0")


def test_only_set_up_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(tmp_path, capsys, [HEADER, row("all_reduce", "tp_group", 2, 8, "init.model_setup")], "init")


def test_binary_junk_after_the_header(tmp_path: Path) -> None:
    path = tmp_path / "junk.csv"
    path.write_bytes((HEADER + "\n").encode() + bytes(range(256)) * 4)
    with pytest.raises(TraceError, match=str(path)):
        load(path)


def test_huge_world_size_refused_before_building(tmp_path: Path) -> None:
    body = [row("all_reduce", "tp_group", 2, 8)] * 100  # 100 rows x 2^20 ranks: above the 5e7 collectives cap
    with pytest.raises(TraceError, match="more than"):
        load(write(tmp_path, [HEADER, *body], "big.csv"), world_size=1 << 20)
    with pytest.raises(TraceError, match="world_size must be"):
        load(spmd(tmp_path), world_size=0)


def test_computation_rows_are_compute_where_they_stand(tmp_path: Path) -> None:
    w = load(write(tmp_path, [
        HEADER,
        "CommType.computation,None,None,(4096 2048),forward.attention,None,None,,1.0,None,None,1",
        row("all_reduce", "tp_group", 2, MiB, ms="0.5"),
        row("epoch_end", "None", "None", 0, "", ms="2.0")]))
    s = w.ranks[0].steps[0]
    # rows 1.0 + 0.5 ms of the epoch's 2.0: 0.5 ms more compute, before the one collective, after the computation
    assert len(s.compute) == 1 and s.compute[0] == pytest.approx((0.0, 1500.0))
    assert (s.collectives[0].start_us, s.collectives[0].duration_us, s.duration_us) == pytest.approx((1500, 500, 2000))


def test_rows_longer_than_their_epoch(tmp_path: Path) -> None:
    w = load(write(tmp_path, [HEADER, row("all_reduce", "tp_group", 2, MiB, ms="3.0"),
                              row("epoch_end", "None", "None", 0, "", ms="2.0")]))
    s = w.ranks[1].steps[0]
    assert (s.duration_us, s.compute_us) == pytest.approx((3000, 0))  # the rows' 3 ms, no compute
    assert any("longer than the epoch" in n for n in w.notes)


def test_gzipped_file(tmp_path: Path) -> None:
    import gzip
    path = tmp_path / "job.csv.gz"
    path.write_bytes(gzip.compress(spmd(tmp_path).read_bytes()))
    assert detect_format(path) == "aicb"
    assert load(path).world_size == 8
