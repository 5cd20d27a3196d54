"""Steps of an NCCL COLL log (traffic.traces.nccl_log): found from the log's own period, warm-up left out,
opCount restarts still splitting, `collectives_per_step` / `--step-ops` overriding, ranks kept consistent.

Every log is written by the test, line by line, in the format of NCCL 2.x with `NCCL_DEBUG_SUBSYS=COLL`
(`host:pid:tid [dev] NCCL INFO <Op>: opCount <hex> ... count <n> datatype <d> ... comm <ptr> [nranks=<n>] ...`);
the expected steps and bytes are worked out by hand next to each log."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabriclab.cli import build_parser, main
from traffic.traces import load
from traffic.traces.nccl_log import _tail_period
from traffic.workload import Workload

FP32, BF16, INT64 = 7, 9, 4  # NCCL datatype codes (4, 2 and 8 bytes per element)
MAIN = "0x55d100000010"  # the data-parallel communicator's pointer in process 4001
SMALL = "0x55d100000020"  # a second communicator of the same process


def call(op: str, opcount: int, count: int, datatype: int = FP32, *, comm: str = MAIN, nranks: int = 2,
         pid: int = 4001, dev: int = 0, globalrank: int | None = None) -> str:
    """One `NCCL INFO <op>: opCount ...` line."""
    tail = "" if globalrank is None else f" task 0 globalrank {globalrank}"
    return (f"node1:{pid}:{pid + 100} [{dev}] NCCL INFO {op}: opCount {opcount:x} sendbuff 0x7f1000000000 "
            f"recvbuff 0x7f1000400000 count {count} datatype {datatype} op 0 root 0 comm {comm} "
            f"[nranks={nranks}] stream 0x55d100000100{tail}\n")


def log_of(calls: list[tuple[str, int, int]]) -> str:
    """A log of (op, count, datatype) calls of one process on one communicator, opCount counting up from 0
    (never restarting)."""
    return "".join(call(op, i, count, dtype) for i, (op, count, dtype) in enumerate(calls))


def step_table(w: Workload) -> list[list[list[tuple[str, int]]]]:
    """Per rank, per step: (kind, bytes) of each collective."""
    return [[[(c.kind, c.size_bytes) for c in s.collectives] for s in r.steps] for r in w.ranks]


def notes(w: Workload) -> str:
    return "\n".join(w.notes)


# --- a warm-up and three periods -------------------------------------------------------------------------------

# Warm-up: Broadcast 53 x int64 = 424 bytes, AllReduce 1000 x fp32 = 4000 bytes: 2 calls, 4424 bytes.
# Period (one step): AllReduce 2049000 x fp32 = 8196000, AllReduce 7875584 x fp32 = 31502336,
# AllGather 1000 x bf16 per rank x 2 ranks = 4000; 3 calls, 8196000 + 31502336 + 4000 = 39702336 bytes a step.
WARMUP = [("Broadcast", 53, INT64), ("AllReduce", 1000, FP32)]
PERIOD = [("AllReduce", 2049000, FP32), ("AllReduce", 7875584, FP32), ("AllGather", 1000, BF16)]
STEP = [("all_reduce", 8196000), ("all_reduce", 31502336), ("all_gather", 4000)]
STEP_BYTES = 39702336


def test_warmup_and_three_periods(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("node1:4001:4001 [0] NCCL INFO Bootstrap : Using eth0:198.18.0.1<0>\n"
                   + log_of(WARMUP + PERIOD * 3))
    w = load(log)
    assert step_table(w) == [[STEP, STEP, STEP]]
    assert [s.number for s in w.ranks[0].steps] == [0, 1, 2]
    assert [sum(c.size_bytes for c in s.collectives) for s in w.ranks[0].steps] == [STEP_BYTES] * 3
    said = notes(w)
    assert f"period of 3 calls found on comm {MAIN} [nranks=2]" in said and "3 periods = 3 steps" in said
    assert "2 warm-up calls (4424 bytes) before the first period left out" in said


def test_warmup_that_ends_like_a_step_does_not_shift_the_steps(tmp_path: Path) -> None:
    # The warm-up's last call is the period's last call (AllGather 1000 bf16): the repeats reach one call further
    # back, but periods are counted whole from the end of the log, so the steps keep their phase.
    log = tmp_path / "job.log"
    log.write_text(log_of([("Broadcast", 53, INT64), ("AllGather", 1000, BF16)] + PERIOD * 3))
    w = load(log)
    assert step_table(w) == [[STEP, STEP, STEP]]
    assert "2 warm-up calls (4424 bytes) before the first period left out" in notes(w)  # 424 + 4000


def test_the_issues_resnet50_log_is_nine_steps_and_one_warmup_call(tmp_path: Path) -> None:
    # The issue: a 9-step ResNet-50 DDP run logs 37 all-reduces of four repeating sizes. Its 25,557,032 fp32
    # gradients (102,228,128 bytes) in four buckets of 2049000 + 7875584 + 6563840 + 9068608 elements; the
    # first call (here one of the same size as the last bucket) is the warm-up: 9068608 x 4 = 36274432 bytes.
    buckets = [2049000, 7875584, 6563840, 9068608]
    assert sum(buckets) == 25_557_032
    log = tmp_path / "resnet50.log"
    log.write_text(log_of([("AllReduce", 9068608, FP32)] + [("AllReduce", n, FP32) for n in buckets] * 9))
    w = load(log)
    (rank,) = w.ranks
    assert len(rank.steps) == 9 and all(len(s.collectives) == 4 for s in rank.steps)
    assert {sum(c.size_bytes for c in s.collectives) for s in rank.steps} == {102_228_128}
    assert "period of 4 calls found" in notes(w) and "9 periods" in notes(w)
    assert "1 warm-up call (36274432 bytes) before the first period left out" in notes(w)


def test_smallest_period_covering_the_most_calls(tmp_path: Path) -> None:
    # Steps of [A, B, B]: the log ends in "B, B", a repeat of 1 call, but the period of 3 covers all 9 calls.
    log = tmp_path / "abb.log"
    log.write_text(log_of([("AllReduce", 100, FP32), ("AllReduce", 200, FP32), ("AllReduce", 200, FP32)] * 3))
    w = load(log)
    assert step_table(w) == [[[("all_reduce", 400), ("all_reduce", 800), ("all_reduce", 800)]] * 3]
    assert "period of 3 calls" in notes(w) and "no warm-up calls before the first period" in notes(w)


def tail_period_by_blocks(seq: list[tuple[str, int, str]]) -> tuple[int, int] | None:
    """The same rule, slowly: for every p, count the whole blocks of p items at the end equal to the last."""
    n, best = len(seq), None
    for p in range(1, n // 2 + 1):
        k = 1
        while (k + 1) * p <= n and seq[n - (k + 1) * p:n - k * p] == seq[n - p:]:
            k += 1
        if k >= 2 and (best is None or k * p > best[0] * best[1]):
            best = (p, k)
    return None if best is None or 2 * best[0] * best[1] < n else best


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from([("AllReduce", 1, "float32"), ("AllReduce", 2, "float32"),
                                 ("AllGather", 1, "bfloat16")]), max_size=40),
       st.integers(min_value=0, max_value=6))
def test_tail_period_agrees_with_comparing_blocks(seq: list[tuple[str, int, str]], repeat_tail: int) -> None:
    # repeat_tail: also the sequence followed by repeats of its own last few items, so that periods are common
    tail = seq[-repeat_tail:] if repeat_tail and seq else []
    for s in (seq, seq + tail * 3):
        assert _tail_period(s) == tail_period_by_blocks(s)


# --- no period ---------------------------------------------------------------------------------------------------

def test_no_period_is_one_step_and_the_note_says_so(tmp_path: Path) -> None:
    log = tmp_path / "once.log"
    log.write_text(log_of([("Broadcast", 53, INT64)] + PERIOD))
    w = load(log)
    assert step_table(w) == [[[("broadcast", 424)] + STEP]]  # everything, in log order, as one step
    said = notes(w)
    assert "no period found" in said and f"comm {MAIN} [nranks=2]" in said
    assert "one step of all 4 collectives" in said and "warm-up" not in said


def test_two_equal_calls_at_the_end_are_not_a_period(tmp_path: Path) -> None:
    # One step that happens to end in two equal all-reduces: a repeat of 1 call covering 2 of 5 calls is less than
    # half of the log, so it is no period (else: two "steps" of one call after three calls of warm-up).
    log = tmp_path / "dd.log"
    log.write_text(log_of([("AllReduce", n, FP32) for n in (10, 20, 30, 40, 40)]))
    w = load(log)
    assert [len(s.collectives) for s in w.ranks[0].steps] == [5]
    assert "no period found" in notes(w)


# --- several ranks, several communicators ------------------------------------------------------------------------

def rank_log(pid: int, steps: int, globalrank: int | None = None) -> list[str]:
    """One rank's lines: a small Broadcast (8 x int64 = 64 bytes, on a second communicator) and an AllReduce of
    100 fp32 (400 bytes) before the first period, then `steps` periods of AllReduce 1000 fp32 (4000), the small
    Broadcast (64), AllReduce 3000 fp32 (12000); each process has its own pointers (pid in them)."""
    main_comm, small_comm = f"0x{pid}0010", f"0x{pid}0020"

    def on(comm: str, op: str, opcount: int, count: int, datatype: int) -> str:
        return call(op, opcount, count, datatype, comm=comm, pid=pid, globalrank=globalrank)

    lines = [on(small_comm, "Broadcast", 0, 8, INT64), on(main_comm, "AllReduce", 0, 100, FP32)]
    for i in range(steps):
        lines += [on(main_comm, "AllReduce", 2 * i + 1, 1000, FP32), on(small_comm, "Broadcast", i + 1, 8, INT64),
                  on(main_comm, "AllReduce", 2 * i + 2, 3000, FP32)]
    return lines


MULTI_STEP = [("all_reduce", 4000), ("broadcast", 64), ("all_reduce", 12000)]  # 16064 bytes a step


@pytest.mark.parametrize("layout", ["one file per rank", "one file with globalrank"])
def test_ranks_of_a_data_parallel_job_get_the_same_steps(tmp_path: Path, layout: str) -> None:
    if layout == "one file per rank":
        (tmp_path / "rank0.log").write_text("".join(rank_log(4001, 3)))
        (tmp_path / "rank1.log").write_text("".join(rank_log(4002, 3)))
        w = load(tmp_path)
    else:  # the two ranks' lines interleaved, as one launcher's log of the whole job
        zero, one = rank_log(4001, 3, globalrank=0), rank_log(4002, 3, globalrank=1)
        (tmp_path / "job.log").write_text("".join(a + b for a, b in zip(zero, one, strict=True)))
        w = load(tmp_path / "job.log")
    assert [r.rank for r in w.ranks] == [0, 1]
    # the busiest communicator (the all-reduces: 16000 bytes a step against 64) defines the period; the other
    # communicator's Broadcast goes to the step it falls in by log order, and its first one is warm-up
    assert step_table(w) == [[MULTI_STEP] * 3, [MULTI_STEP] * 3]
    said = notes(w)
    assert "steps (ranks 0-1): period of 2 calls found on comm 0x40010010 [nranks=2] on rank 0" in said
    assert "2 warm-up calls (464 bytes) before the first period left out" in said  # 64 + 400
    assert "disagree" not in said


def test_ranks_that_disagree_are_named(tmp_path: Path) -> None:
    # Rank 1's log ends one step early (say, killed): 3 steps on rank 0, 2 on rank 1, and a note says so.
    (tmp_path / "rank0.log").write_text("".join(rank_log(4001, 3)))
    (tmp_path / "rank1.log").write_text("".join(rank_log(4002, 2)))
    w = load(tmp_path)
    assert [len(r.steps) for r in w.ranks] == [3, 2]
    said = notes(w)
    assert "steps (rank 0): period of 2 calls" in said and "steps (rank 1): period of 2 calls" in said
    assert "ranks disagree on the number of steps (2 step(s) on rank 1; 3 step(s) on rank 0)" in said


# --- opCount restarts and collectives_per_step -------------------------------------------------------------------

def test_opcount_restarts_still_split(tmp_path: Path) -> None:
    # Steps [A, B, C] then [A, B], each on a fresh communicator at the same pointer (opCount back to 0): no period
    # at the end of the log, but two steps where the opCount restarts.
    a, b, c = ("AllReduce", 10, FP32), ("AllReduce", 20, FP32), ("AllReduce", 30, FP32)
    log = tmp_path / "restart.log"
    log.write_text(log_of([a, b, c]) + log_of([a, b]))
    w = load(log)
    assert step_table(w) == [[[("all_reduce", 40), ("all_reduce", 80), ("all_reduce", 120)],
                              [("all_reduce", 40), ("all_reduce", 80)]]]
    assert "split where a communicator's opCount restarts (goes back): 2 steps" in notes(w)


def test_collectives_per_step_overrides_the_period(tmp_path: Path) -> None:
    # 2 warm-up + 9 period calls = 11 calls in steps of 4: 4, 4, 3; the warm-up is no longer left out.
    log = tmp_path / "job.log"
    log.write_text(log_of(WARMUP + PERIOD * 3))
    w = load(log, collectives_per_step=4)
    assert [len(s.collectives) for s in w.ranks[0].steps] == [4, 4, 3]
    assert w.ranks[0].steps[0].collectives[0].kind == "broadcast"
    assert "every 4 collectives" in notes(w) and "period" not in notes(w)


def test_collectives_per_step_overrides_opcount_restarts(tmp_path: Path) -> None:
    a = ("AllReduce", 10, FP32)
    log = tmp_path / "restart.log"
    log.write_text(log_of([a, a, a]) + log_of([a, a]))
    assert [len(s.collectives) for s in load(log, collectives_per_step=1).ranks[0].steps] == [1] * 5


# --- --step-ops on the command line ------------------------------------------------------------------------------

def test_step_ops_on_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "job.log"
    log.write_text(log_of(WARMUP + PERIOD * 3))
    assert main(["trace", "show", str(log), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["steps"] == 3 and [s["size_bytes"] for s in found["per_step"]] == [STEP_BYTES] * 3
    assert main(["trace", "show", str(log), "--step-ops", "4", "--json"]) == 0
    split = json.loads(capsys.readouterr().out)
    assert split["steps"] == 3 and [s["collectives"] for s in split["per_step"]] == [4, 4, 3]
    assert main(["trace", "show", str(log), "--step-ops", "3"]) == 0  # the table, not JSON
    assert "every 3 collectives" in capsys.readouterr().out
    assert main(["trace", "show", str(log), "--step-ops", "0"]) == 2
    assert "collectives_per_step must be >= 1 (--step-ops), got 0" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["replay"], ["sim"], ["compare"], ["crosscheck"]])
def test_step_ops_is_parsed_by_every_command_that_reads_a_trace(tmp_path: Path, command: list[str]) -> None:
    log = tmp_path / "job.log"
    log.write_text(log_of(WARMUP + PERIOD * 3))
    assert build_parser().parse_args([*command, str(log), "--step-ops", "4"]).step_ops == 4
    assert build_parser().parse_args([*command, str(log)]).step_ops is None


def test_sim_and_compare_run_the_steps_step_ops_gives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Found from the period: 3 steps of 3 collectives (the 2 warm-up calls left out). --step-ops 11: all 11
    # calls in one step. The simulator runs what it is given (replay shares the options; it needs root).
    log = tmp_path / "job.log"
    log.write_text(log_of(WARMUP + PERIOD * 3))
    sim = ["sim", str(log), "--topology", "pyramid-16", "--routing", "ecmp", "--ranks", "4", "--json"]
    for extra, steps, collectives in (([], 3, 9), (["--step-ops", "11"], 1, 11)):
        assert main([*sim, "--out", str(tmp_path / f"sim{steps}"), *extra]) == 0
        summary = json.loads(capsys.readouterr().out)["runs"][0]["summary"]
        assert (summary["step_time_us"]["n"], summary["collectives"]) == (steps, collectives)
    compare = ["compare", str(log), "--sizes", "8", "--topology", "pyramid-16", "--routing", "ecmp", "--no-cache",
               "--jobs", "1", "--json"]
    for extra, steps in (([], 3), (["--step-ops", "11"], 1)):
        assert main([*compare, "--out", str(tmp_path / f"compare{steps}"), *extra]) == 0
        (row,) = json.loads(capsys.readouterr().out)["rows"]
        assert row["steps"] == steps


def test_step_ops_refused_for_a_trace_with_its_own_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the built-in Kineto recording (replay, sim and compare default to it): its steps are its ProfilerSteps
    assert main(["sim", "--step-ops", "4", "--out", str(tmp_path / "o")]) == 2
    assert "apply to NCCL logs only" in capsys.readouterr().err
    assert main(["compare", "builtin", "--step-ops", "4", "--sizes", "8", "--topology", "pyramid-16", "--routing", "ecmp",
                 "--no-cache", "--jobs", "1", "--out", str(tmp_path / "c")]) == 2
    assert "--step-ops" in capsys.readouterr().err
