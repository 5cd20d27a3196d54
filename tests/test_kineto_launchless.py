"""Kineto GPU compute kernels without a launch event (traffic/traces/kineto.py): left out of the steps' compute by
default, as HolisticTraceAnalysis does (a GPU event takes its CPU launch's iteration, else none); with
`launchless_kernels="by-time"` put in the step whose window holds their device start, clipped to its end.

The trace is written by the test. Every expected interval, sum and note figure is worked out by hand in the comments
from the event table below (times in us, absolute; a step's compute is relative to its start).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fabriclab.cli import build_parser, main
from fabriclab.study.spec import RunOptions, RunSpec, WorkloadSpec, resolve
from traffic.traces import load
from traffic.traces.kineto import read_kineto
from traffic.workload import TraceError

CPU = 10
STREAM = 7
NCCL_STREAM = 9


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _launch(corr: int, ts: float) -> dict[str, Any]:
    return _x("cuda_runtime", "cudaLaunchKernel", 1, CPU, ts, 3.0, correlation=corr)


def _kernel(name: str, ts: float, dur: float, corr: int | None, stream: int = STREAM, **args: Any) -> dict[str, Any]:
    if corr is not None:
        args["correlation"] = corr
    return _x("kernel", name, 0, stream, ts, dur, **args)


def _allreduce(ts: float, corr: int | None) -> dict[str, Any]:
    return _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts, 50.0, corr, NCCL_STREAM, **{
        "Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float",
        "Group size": 2, "Process Group Ranks": "[0, 1]"})


# Steps 1 [1000, 2000) and 2 [2000, 3000). Launch correlation ids grow with launch time, as CUPTI's do.
#   corr 11 launched 1010 (step 1): gemm [1100, 1300)
#   corr 12 launched 1020 (step 1): gemm [1250, 1400)         -> with 11: [1100, 1400]
#   corr 13 launched 1500 (step 1): all-reduce [1600, 1650), 4000 bytes
#   corr 14 launched 1900 (step 1): gemm [2050, 2080)         -> runs in step 2's window, belongs to step 1 (launch)
#   corr 21 launched 2010 (step 2): gemm [2100, 2200)
# Kernels with no launch event:
#   A  no correlation            [1500, 1550)   in step 1
#   B  corr 5 (below every id)   [1950, 2100)   starts in step 1, straddles its end at 2000
#   C  corr 16 (between launched ids 14 and 21, but no launch has it)   [2300, 2400)   in step 2
#   D  corr 6                    [3100, 3150)   after every step
#   and an all-reduce kernel, corr 99, no launch, [2500, 2550): a collective, placed by its device start (step 2)
EVENTS = [
    _x("user_annotation", "ProfilerStep#1", 1, CPU, 1000.0, 1000.0),
    _x("user_annotation", "ProfilerStep#2", 1, CPU, 2000.0, 1000.0),
    _launch(11, 1010.0), _launch(12, 1020.0), _launch(13, 1500.0), _launch(14, 1900.0), _launch(21, 2010.0),
    _kernel("gemm", 1100.0, 200.0, 11), _kernel("gemm", 1250.0, 150.0, 12), _allreduce(1600.0, 13),
    _kernel("gemm", 2050.0, 30.0, 14), _kernel("gemm", 2100.0, 100.0, 21),
    _kernel("elementwise_A", 1500.0, 50.0, None), _kernel("elementwise_B", 1950.0, 150.0, 5),
    _kernel("elementwise_C", 2300.0, 100.0, 16), _kernel("elementwise_D", 3100.0, 50.0, 6),
    _allreduce(2500.0, 99),
]

# leave-out: only launched kernels.
#   step 1: [1100, 1400] and [2050, 2080] -> relative (100, 400), (1050, 1080): 300 + 30 = 330
#   step 2: [2100, 2200] -> (100, 200): 100
LEAVE_OUT = [((100.0, 400.0), (1050.0, 1080.0)), ((100.0, 200.0),)]
LEAVE_OUT_US = [330.0, 100.0]
# by-time: plus A and B in step 1 (B clipped to [1950, 2000): 50 of its 150), C in step 2; D in no step.
#   step 1: (100, 400), (500, 550), (950, 1000), (1050, 1080): 300 + 50 + 50 + 30 = 430 (unclipped B would give 500:
#           [1950, 2100] merged with [2050, 2080] -> 150, and 300 + 50 + 150 = 500)
#   step 2: (100, 200), (300, 400): 100 + 100 = 200
BY_TIME = [((100.0, 400.0), (500.0, 550.0), (950.0, 1000.0), (1050.0, 1080.0)), ((100.0, 200.0), (300.0, 400.0))]
BY_TIME_US = [430.0, 200.0]
# The note: 4 kernels (A, B, C, D); durations 50 + 150 + 100 + 50 = 350; first start 1500 (A); last end 3150 (D).
NOTE = "4 GPU compute kernel(s) without a launch event in the trace (350 us in all, the first starting at ts 1500, " \
       "the last ending at ts 3150)"
# Collectives, the same both ways: step 1 the all-reduce at 1600 - 1000 = 600; step 2 the launch-less one placed by
# its device start, 2500 - 2000 = 500. 1000 floats = 4000 bytes each.
COLLECTIVES = [[("all_reduce", 4000, 600.0, 50.0)], [("all_reduce", 4000, 500.0, 50.0)]]


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": EVENTS}))
    return path


def _collectives(w: Any) -> list[list[tuple[str, int, float | None, float | None]]]:
    return [[(c.kind, c.size_bytes, c.start_us, c.duration_us) for c in s.collectives] for s in w.ranks[0].steps]


def test_left_out_by_default_as_hta_does(tmp_path: Path) -> None:
    w = load(_trace(tmp_path))
    steps = w.ranks[0].steps
    assert [s.number for s in steps] == [1, 2]
    assert [s.compute for s in steps] == LEAVE_OUT
    assert [s.compute_us for s in steps] == pytest.approx(LEAVE_OUT_US)
    assert _collectives(w) == COLLECTIVES
    (note,) = [n for n in w.notes if "GPU compute kernel(s) without a launch event" in n]
    assert note.startswith(NOTE + ": left out of compute")
    assert "HolisticTraceAnalysis" in note
    assert read_kineto(_trace(tmp_path)).ranks[0].steps == steps  # the reader's own default is the same


def test_by_time_puts_them_in_the_step_window_clipped(tmp_path: Path) -> None:
    w = load(_trace(tmp_path), launchless_kernels="by-time")
    steps = w.ranks[0].steps
    assert [s.compute for s in steps] == BY_TIME
    assert [s.compute_us for s in steps] == pytest.approx(BY_TIME_US)
    assert steps[0].compute_us <= steps[0].duration_us
    assert _collectives(w) == COLLECTIVES  # collectives are attributed as before
    (note,) = [n for n in w.notes if "GPU compute kernel(s) without a launch event" in n]
    assert note.startswith(NOTE + ": put in the step whose window holds their device start, clipped to its end")
    assert note.endswith("1 outside every step, left out")  # D


def test_note_figures_parse_back(tmp_path: Path) -> None:
    # the same figures read back as numbers, so that a change of wording does not hide a wrong sum
    (note,) = [n for n in load(_trace(tmp_path)).notes if "without a launch event" in n and "compute" in n]
    m = re.match(r"(\d+) GPU compute kernel\(s\) .*\(([\d.]+) us in all, the first starting at ts ([\d.]+), "
                 r"the last ending at ts ([\d.]+)\)", note)
    assert m is not None
    assert (int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))) == (4, 350.0, 1500.0, 3150.0)


def test_no_note_without_launchless_kernels(tmp_path: Path) -> None:
    path = tmp_path / "clean.json"
    events = [e for e in EVENTS if not e["name"].startswith("elementwise") and e["ts"] != 2500.0]
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": events}))
    for mode in ("leave-out", "by-time"):
        w = load(path, launchless_kernels=mode)
        assert [s.compute for s in w.ranks[0].steps] == LEAVE_OUT
        assert not any("without a launch event" in n for n in w.notes)


def test_bad_value_and_other_formats_are_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"launchless_kernels .*must be one of leave-out, by-time, got 'sideways'"):
        load(_trace(tmp_path), launchless_kernels="sideways")
    log = tmp_path / "job.log"
    log.write_text("node1:4001:4101 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f1000000000 recvbuff "
                   "0x7f2000000000 count 1024 datatype 7 op 0 root 0 comm 0x5500 [nranks=2] stream 0x9900\n")
    with pytest.raises(TraceError, match=r"launchless_kernels \(--launchless-kernels\) applies to Kineto traces only"):
        load(log, launchless_kernels="leave-out")
    with pytest.raises(TraceError, match=r"launchless_kernels \(--launchless-kernels\) applies to Kineto traces only"):
        load("llm:gpt3-175b", launchless_kernels="by-time")


def test_cli_trace_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace(tmp_path)
    for args, want in (([], LEAVE_OUT_US), (["--launchless-kernels", "leave-out"], LEAVE_OUT_US),
                       (["--launchless-kernels", "by-time"], BY_TIME_US)):
        assert main(["trace", "show", str(path), "--json", *args]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert [s["compute_us"] for s in shown["per_step"]] == pytest.approx(want)
    with pytest.raises(SystemExit) as exc:
        main(["trace", "show", str(path), "--launchless-kernels", "sideways"])
    assert exc.value.code == 2
    assert "invalid choice: 'sideways'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["replay"], ["sim"], ["compare"], ["plan"], ["crosscheck"]])
def test_every_command_that_reads_a_trace_takes_the_option(tmp_path: Path, command: list[str]) -> None:
    path = str(_trace(tmp_path))
    assert build_parser().parse_args([*command, path, "--launchless-kernels", "by-time"]).launchless_kernels == \
        "by-time"
    assert build_parser().parse_args([*command, path]).launchless_kernels is None


def test_the_resolved_run_carries_it(tmp_path: Path) -> None:
    spec = RunSpec(WorkloadSpec.parse(str(_trace(tmp_path))), RunOptions(launchless_kernels="by-time"))
    run = resolve(spec, 2, "dual-plane-16", "adaptive")
    assert run.launchless_kernels == "by-time" and run.doc()["launchless_kernels"] == "by-time"
    assert run.replay_options().launchless_kernels == "by-time"
    assert resolve(RunSpec(spec.workload), 2, "dual-plane-16", "adaptive").launchless_kernels is None

