"""Kineto old-style traces: NCCL kernels attached to their `nccl:*` annotations when launches are missing, and
sizes checked where they are read (traffic/traces/kineto_events.py, kineto_collectives.py).

Every trace here is written by the test. Expected counts, bytes and times are worked out by hand in the comments
next to them: bytes = numel x dtype size of the annotation's `Input Dims` / `Input type` (x the group size for
all_gather), times = the kernel's device start minus the step start, and its duration.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fabriclab.cli import main
from tests.real_traces import DLRM, needs
from tests.test_traces import DLRM_SIZES, _read_json_gz, _sizes, _write_json_gz
from traffic.traces import load
from traffic.workload import Step, TraceError

CPU_THREAD = 10
STREAM = 7
SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
ALLGATHER = "ncclKernel_AllGather_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)"
REDUCESCATTER = "ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
BROADCAST = "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _step(number: int, ts: float, dur: float) -> dict[str, Any]:
    return _x("user_annotation", f"ProfilerStep#{number}", 1, CPU_THREAD, ts, dur)


def _annotation(op: str, ts: float, dims: Any, types: Any, dur: float = 20.0) -> dict[str, Any]:
    return _x("user_annotation", f"nccl:{op}", 1, CPU_THREAD, ts, dur, **{"Input Dims": dims, "Input type": types})


def _launch(correlation: int, ts: float) -> dict[str, Any]:
    return _x("cuda_runtime", "cudaLaunchKernel", 1, CPU_THREAD, ts, 3.0, correlation=correlation)


def _kernel(name: str, ts: float, dur: float, correlation: int | None, **args: Any) -> dict[str, Any]:
    if correlation is not None:
        args["correlation"] = correlation
    return _x("kernel", name, 0, STREAM, ts, dur, **args)


def _write(tmp_path: Path, events: list[dict[str, Any]], name: str = "rank0.json", world: int = 4) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": world}, "traceEvents": events}))
    return path


def _rows(step: Step) -> list[tuple[str, int, float | None, float | None, str]]:
    return [(c.kind, c.size_bytes, c.start_us, c.duration_us, c.stream) for c in step.collectives]


# --- an old-style trace: 4 ranks, steps 1 [1000, 2000] and 2 [2000, 3000], one CPU thread, one NCCL stream ---------

# (op, annotation ts, Input Dims, Input type, correlation, kernel, kernel ts, kernel dur). Each annotation lasts
# 20 us and launches its kernel 5 us after it starts; the GPU lags the CPU, so several annotations start before
# the first kernel runs (time alone does not say which kernel is whose).
BASE = [
    ("all_to_all", 1010.0, [[256]], ["float"], 101, SENDRECV, 1100.0, 50.0),
    ("all_reduce", 1040.0, [[1000]], ["float"], 102, ALLREDUCE, 1160.0, 100.0),
    ("all_to_all", 1070.0, [[32, 2]], ["long int"], 103, SENDRECV, 1270.0, 30.0),
    ("all_gather", 1300.0, [[100]], ["c10::Half"], 104, ALLGATHER, 1320.0, 40.0),
    ("all_reduce", 2010.0, [[10]], ["float"], 105, ALLREDUCE, 2050.0, 10.0),
    ("all_to_all", 2100.0, [[8]], ["int"], 106, SENDRECV, 2600.0, 20.0),
    ("reduce_scatter", 2300.0, [[400]], ["float"], 107, REDUCESCATTER, 2700.0, 30.0),
]
K = str(STREAM)
# Bytes: 256 float x 4 = 1024; 1000 float x 4 = 4000; 32 x 2 long int x 8 = 512; 100 half x 2 = 200 per rank,
# x 4 ranks = 800 (all_gather counts the whole output); 10 float = 40; 8 int x 4 = 32; 400 float = 1600.
# Times: kernel ts - step start (1000 or 2000), kernel dur.
STEP1 = [("all_to_all", 1024, 100.0, 50.0, K), ("all_reduce", 4000, 160.0, 100.0, K),
         ("all_to_all", 512, 270.0, 30.0, K), ("all_gather", 800, 320.0, 40.0, K)]
STEP2 = [("all_reduce", 40, 50.0, 10.0, K), ("all_to_all", 32, 600.0, 20.0, K),
         ("reduce_scatter", 1600, 700.0, 30.0, K)]


def _old_style(*, no_launch: tuple[int, ...] = (), no_correlation: tuple[int, ...] = (),
               no_kernel: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """BASE as events; the kernels with correlation in `no_launch` lose their launch event, those in
    `no_correlation` lose their correlation arg too, those in `no_kernel` are not in the trace."""
    events = [_step(1, 1000.0, 1000.0), _step(2, 2000.0, 1000.0)]
    for op, ts, dims, types, corr, kernel, kts, kdur in BASE:
        events.append(_annotation(op, ts, dims, types))
        if corr not in no_launch and corr not in no_correlation:
            events.append(_launch(corr, ts + 5.0))
        if corr not in no_kernel:
            events.append(_kernel(kernel, kts, kdur, None if corr in no_correlation else corr))
    return events


def test_base_trace_reads_as_worked_out(tmp_path: Path) -> None:
    w = load(_write(tmp_path, _old_style()))
    assert [s.number for s in w.ranks[0].steps] == [1, 2]
    assert [_rows(s) for s in w.ranks[0].steps] == [STEP1, STEP2]
    assert not any(what in n for n in w.notes
                   for what in ("collectives counted from", "matched no nccl:", "without a launch event"))


def test_kernels_without_launch_at_the_window_start(tmp_path: Path) -> None:
    # The profiler window cut the launches of the first two kernels (correlations 101, 102 match no launch), and
    # one more SendRecv kernel at ts 1020 whose launch and annotation both precede the window (its annotation
    # is not there). The first anchor is kernel 103 (annotation at 1070): before it, send_recv kernels at 1020
    # and 1100 for one all_to_all annotation (1010), and the all_reduce kernel (1160) for the all_reduce (1040).
    # Paired from the end, the 1100 kernel gets the annotation; the 1020 kernel is left over, and named.
    events = _old_style(no_launch=(101, 102)) + [_kernel(SENDRECV, 1020.0, 5.0, 99)]
    w = load(_write(tmp_path, events))
    assert [_rows(s) for s in w.ranks[0].steps] == [STEP1, STEP2]
    notes = "\n".join(w.notes)
    assert ("1 NCCL kernel(s) without sizes matched no nccl: annotation (the profiler window cut theirs off), "
            "left out: 'ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t' at ts 1020.0") in notes
    # 7 annotations, 8 kernels
    assert ("collectives counted from the 7 nccl:/gloo: annotation(s), receives included; the 8 NCCL kernel(s) "
            "without sizes give their timing only") in notes
    assert "2 NCCL kernel(s) without a launch event in the trace: attached to their nccl: annotation" in notes


def test_kernels_without_launch_in_the_middle(tmp_path: Path) -> None:
    # Kernel 104 (all_gather) has no correlation at all and 105 (all_reduce, the first of step 2) one that matches
    # no launch. Between the anchors 103 (annotation 1070) and 106 (annotation 2100) the free annotations are
    # the all_gather (1300) and the all_reduce (2010): each kernel gets its own kind's.
    w = load(_write(tmp_path, _old_style(no_launch=(105,), no_correlation=(104,))))
    assert [_rows(s) for s in w.ranks[0].steps] == [STEP1, STEP2]
    assert any("2 NCCL kernel(s) without a launch event in the trace: attached" in n for n in w.notes)
    assert not any("matched no nccl: annotation" in n or "collectives counted from" in n for n in w.notes)


def test_kernels_without_launch_at_the_window_end(tmp_path: Path) -> None:
    # The last two kernels (106 send_recv at 2600, 107 reduce_scatter at 2700) have no launch, and one more
    # all_to_all annotation at 2500 ([[16]] float = 64 bytes) had its kernel cut off by the window's end. After
    # the last anchor (105, annotation 2010) the free send_recv annotations are at 2100 and 2500, both before the
    # 2600 kernel: paired from the start, the kernel goes to 2100; the 2500 one is timed by its annotation
    # (start 500 in step 2, 20 us, on the CPU thread).
    events = _old_style(no_launch=(106, 107)) + [_annotation("all_to_all", 2500.0, [[16]], ["float"])]
    w = load(_write(tmp_path, events))
    step1, step2 = w.ranks[0].steps
    assert _rows(step1) == STEP1
    assert _rows(step2) == STEP2[:1] + [("all_to_all", 64, 500.0, 20.0, f"thread:{CPU_THREAD}")] + STEP2[1:]
    notes = "\n".join(w.notes)
    assert "the 7 NCCL kernel(s) without sizes" in notes and "from the 8 nccl:/gloo: annotation(s)" in notes
    assert "1 collective(s) had no device kernel: timed by their CPU annotation" in notes
    assert "2 NCCL kernel(s) without a launch event in the trace: attached" in notes
    assert "matched no nccl: annotation" not in notes


def test_sizes_on_annotations_only(tmp_path: Path) -> None:
    # The all_to_all of 1070 has no kernel in the trace at all: it is counted from its annotation (512 bytes) and
    # timed by it (70, 20 us, on the CPU thread). Kernels 102 (all_reduce), 104 (all_gather) and 106 (send_recv)
    # have no launch; the anchors are 101, 105 and 107. Between 101 and 105 the free annotations are the
    # all_reduce (1040), that all_to_all (1070) and the all_gather (1300): each kernel takes its own kind's, not
    # the next one in time. Between 105 and 107 only the all_to_all of 2100 is free: the send_recv kernel takes it,
    # not the earlier kernel-less one of 1070 (which lies before the anchor 105).
    w = load(_write(tmp_path, _old_style(no_kernel=(103,), no_launch=(102, 104, 106))))
    step1, step2 = w.ranks[0].steps
    cpu = f"thread:{CPU_THREAD}"
    assert _rows(step1) == [("all_to_all", 512, 70.0, 20.0, cpu), STEP1[0], STEP1[1], STEP1[3]]
    assert _rows(step2) == STEP2
    notes = "\n".join(w.notes)
    assert "from the 7 nccl:/gloo: annotation(s)" in notes and "the 6 NCCL kernel(s)" in notes
    assert "3 NCCL kernel(s) without a launch event in the trace: attached" in notes
    assert "1 collective(s) had no device kernel" in notes


def test_no_launch_at_all_pairs_by_kind_order_and_time(tmp_path: Path) -> None:
    # No launch event in the trace (no anchors). Step 1 [0, 1000]: a SendRecv kernel at 100 whose annotation the
    # window cut off; an all_to_all annotation at 150 (10 float = 40 bytes) and its kernel at 200; an all_reduce at
    # 160 (5 float = 20 bytes) and its kernel at 260. The 100 kernel ran before any all_to_all annotation started,
    # so it is not that one's: the 200 kernel is.
    events = [_step(1, 0.0, 1000.0), _kernel(SENDRECV, 100.0, 10.0, 1),
              _annotation("all_to_all", 150.0, [[10]], ["float"]), _kernel(SENDRECV, 200.0, 30.0, 2),
              _annotation("all_reduce", 160.0, [[5]], ["float"]), _kernel(ALLREDUCE, 260.0, 40.0, 3)]
    w = load(_write(tmp_path, events))
    assert _rows(w.ranks[0].steps[0]) == [("all_to_all", 40, 200.0, 30.0, K), ("all_reduce", 20, 260.0, 40.0, K)]
    notes = "\n".join(w.notes)
    assert "left out: 'ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t' at ts 100.0" in notes
    assert "2 NCCL kernel(s) without a launch event in the trace: attached" in notes


def test_send_recv_kernels_of_all_to_all_send_and_recv(tmp_path: Path) -> None:
    # 2 ranks, step 1 [0, 1000]. An all_to_all (1024 float = 4096 bytes) launching two SendRecv kernels (one
    # collective from 100 to 135); a send (50 signed char = 50 bytes) and a recv whose kernels (300, 500) have no
    # launch; a last send (25 float = 100 bytes) with its launch. The recv is left out (counted at its sender).
    events = [
        _step(1, 0.0, 1000.0),
        _annotation("all_to_all", 10.0, [[1024]], ["float"], dur=30.0), _launch(1, 15.0), _launch(2, 20.0),
        _kernel(SENDRECV, 100.0, 10.0, 1), _kernel(SENDRECV, 115.0, 20.0, 2),
        _annotation("send", 200.0, [[50]], ["signed char"]), _kernel(SENDRECV, 300.0, 5.0, 3),
        _annotation("recv", 400.0, [[50]], ["signed char"]), _kernel(SENDRECV, 500.0, 5.0, 4),
        _annotation("send", 600.0, [[25]], ["float"]), _launch(5, 605.0), _kernel(SENDRECV, 650.0, 5.0, 5),
    ]
    w = load(_write(tmp_path, events, world=2))
    (step,) = w.ranks[0].steps
    assert _rows(step) == [("all_to_all", 4096, 100.0, 35.0, K), ("send_recv", 50, 300.0, 5.0, K),
                           ("send_recv", 100, 650.0, 5.0, K)]
    assert [c.dtype for c in step.collectives] == ["float32", "int8", "float32"]
    notes = "\n".join(w.notes)
    assert "1 receive(s) left out" in notes
    assert "2 NCCL kernel(s) without a launch event in the trace: attached" in notes
    assert "matched no nccl: annotation" not in notes  # the recv's kernel found the recv
    assert "from the 4 nccl:/gloo: annotation(s)" in notes and "the 5 NCCL kernel(s)" in notes


def test_left_over_kernels_are_named_and_the_trace_is_read(tmp_path: Path) -> None:
    # Two kernels that no annotation can have: an all_reduce launched at 2800 outside every annotation (its own
    # is outside the recording), and a broadcast without launch in a trace with no broadcast annotation.
    extra = [_launch(200, 2800.0), _kernel(ALLREDUCE, 2900.0, 10.0, 200), _kernel(BROADCAST, 2950.0, 10.0, 201)]
    w = load(_write(tmp_path, _old_style() + extra))
    assert [_rows(s) for s in w.ranks[0].steps] == [STEP1, STEP2]
    assert any(n.startswith("2 NCCL kernel(s) without sizes matched no nccl: annotation")
               and "left out: 'ncclKernel_AllReduce_RING_LL_Sum_float' at ts 2900.0, "
                   "'ncclKernel_Broadcast_RING_LL_Sum_int8_t' at ts 2950.0" in n for n in w.notes)


def test_a_collective_with_no_size_anywhere_is_refused(tmp_path: Path) -> None:
    # Old-style kernels and no nccl: annotation at all: nothing gives their size.
    events = [e for e in _old_style() if not e["name"].startswith("nccl:")]
    path = _write(tmp_path, events)
    with pytest.raises(TraceError, match=(rf"^{re.escape(str(path))}: NCCL kernel "
                                          r"'ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t' at ts 1100.0 has no size")):
        load(path)
    # An annotation without Input Dims: its kernel has no size either.
    events = _old_style()
    del events[2]["args"]["Input Dims"]  # the first annotation after the two steps
    path = _write(tmp_path, events, name="dimless.json")
    with pytest.raises(TraceError, match=(rf"^{re.escape(str(path))}: collective without sizes: annotation "
                                          r"'nccl:all_to_all' at ts 1010.0")):
        load(path)


# --- new style: kernels carry their sizes ---------------------------------------------------------------------------

def _new_style_kernel(ts: float, correlation: int, in_nelems: int, out_nelems: int) -> dict[str, Any]:
    return _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", ts, 10.0,
                   correlation, **{"Collective name": "allreduce", "In msg nelems": in_nelems,
                                   "Out msg nelems": out_nelems, "dtype": "Float", "Group size": 2,
                                   "Process Group Ranks": "[0, 1]"})


def test_new_style_kernel_without_launch_is_not_counted_twice(tmp_path: Path) -> None:
    # A new-style kernel (100 floats = 400 bytes) whose launch is missing, under an annotation with sizes: one
    # collective, from the kernel (placed by its device start), not a second one from the annotation.
    events = [_step(1, 0.0, 1000.0), _annotation("all_reduce", 10.0, [[100]], ["float"]),
              _new_style_kernel(100.0, 7, 100, 100)]
    w = load(_write(tmp_path, events, world=2))
    assert _rows(w.ranks[0].steps[0]) == [("all_reduce", 400, 100.0, 10.0, K)]
    assert any("1 NCCL kernel(s) without a launch event in the trace: placed by their device start" in n
               for n in w.notes)


# --- sizes checked where read -----------------------------------------------------------------------------------------

def _with_first_dims(dims: Any) -> list[dict[str, Any]]:
    events = _old_style()
    events[2]["args"]["Input Dims"] = dims  # the all_to_all at 1010, float
    return events


HOSTILE = [
    pytest.param(_with_first_dims([[-256]]),
                 r"at ts 1010.0: annotation 'nccl:all_to_all': negative dimension in Input Dims \[-256\]",
                 id="negative-dim"),
    # two negative dimensions: their product is positive, still refused
    pytest.param(_with_first_dims([[-16, -16]]), r"at ts 1010.0: annotation 'nccl:all_to_all': negative dimension",
                 id="two-negative-dims"),
    # 2^46 + 1 floats = 2^48 + 4 bytes
    pytest.param(_with_first_dims([[2**46 + 1]]),
                 (r"at ts 1010.0: annotation 'nccl:all_to_all': Input Dims \[70368744177665\] x float32: "
                  r"281474976710660 bytes is more than the 2\^48"),
                 id="old-style-over-2^48"),
    # all_gather: 2^45 + 1 halves = 2^46 + 2 input bytes, fine; x 4 ranks = 2^48 + 8 bytes is not
    pytest.param([_step(1, 0.0, 1000.0), _annotation("all_gather", 10.0, [[2**45 + 1]], ["c10::Half"])],
                 (r"at ts 10.0: annotation 'nccl:all_gather': 70368744177666 input bytes x 4 rank\(s\): "
                  r"281474976710664 bytes is more than"),
                 id="all-gather-factor-over-2^48"),
    # -5 x 4 bytes, although Out msg nelems (100) is a count
    pytest.param([_step(1, 0.0, 1000.0), _new_style_kernel(100.0, 1, -5, 100)],
                 (r"at ts 100.0: NCCL kernel 'ncclDevKernel_AllReduce_Sum_f32_RING_LL' In msg nelems -5 x float32: "
                  r"negative size \(-20 bytes\)"),
                 id="negative-in-nelems"),
    pytest.param([_step(1, 0.0, 1000.0), _new_style_kernel(100.0, 1, 2**46 + 1, 2**46 + 1)],
                 (r"at ts 100.0: NCCL kernel 'ncclDevKernel_AllReduce_Sum_f32_RING_LL' In msg nelems 70368744177665 "
                  r"x float32: 281474976710660 bytes is more than the 2\^48"),
                 id="new-style-over-2^48"),
]


@pytest.mark.parametrize("events, message", HOSTILE)
def test_hostile_sizes_are_refused(tmp_path: Path, events: list[dict[str, Any]], message: str) -> None:
    path = _write(tmp_path, events)
    with pytest.raises(TraceError, match=f"^{re.escape(str(path))} {message}"):
        load(path)


def test_sizes_at_the_limit_are_read(tmp_path: Path) -> None:
    # 2^46 floats = 2^48 bytes exactly: the largest size a collective may have
    w = load(_write(tmp_path, _with_first_dims([[2**46]])))
    assert w.ranks[0].steps[0].collectives[0].size_bytes == 2**48


def test_cli_refuses_a_hostile_trace_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, [_step(1, 0.0, 1000.0), _new_style_kernel(100.0, 1, -5, 100)])
    assert main(["trace", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path} at ts 100.0: NCCL kernel 'ncclDevKernel_AllReduce_Sum_f32_RING_LL' In msg nelems -5" in err
    assert "Traceback" not in err


# --- the real DLRM trace with launches removed --------------------------------------------------------------------

@needs(DLRM)
def test_dlrm_rank_with_launches_cut_at_both_edges_and_in_the_middle(tmp_path: Path) -> None:
    # rank0 has 8 NCCL kernels on stream 84, launched from two CPU threads (see tests/test_traces.py). Remove the
    # launches of the 1st, 2nd (window start), 5th, 6th (middle) and 8th (window end) kernel in device order:
    # every collective must keep its size and its own kernel's timing.
    data = _read_json_gz(DLRM / "rank0.json.gz")
    events = data["traceEvents"]
    nccl = sorted((e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")),
                  key=lambda e: e["ts"])
    cut = {nccl[i]["args"]["correlation"] for i in (0, 1, 4, 5, 7)}
    data["traceEvents"] = [e for e in events if not (e.get("cat") in ("cuda_runtime", "cuda_driver")
                                                    and e.get("args", {}).get("correlation") in cut)]
    w = load(_write_json_gz(tmp_path / "rank0.json.gz", data))
    (step,) = w.ranks[0].steps
    assert _sizes(step) == DLRM_SIZES
    # each collective is timed by one kernel: the kernels' (ts, dur), relative to the step start (whole us here)
    step_start = next(e["ts"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert sorted((c.start_us, c.duration_us) for c in step.collectives) == [
        (k["ts"] - step_start, k["dur"]) for k in nccl]
    # and by the right one: rank0's kernels run in the order of its annotations, whose sizes in CPU order are
    # (tests/test_traces.py, the DLRM comment) all_to_all 24576, 192, 1536, 13568, all_reduce 1576964,
    # all_to_all 24576, all_reduce 448, 907840
    assert [(c.kind, c.size_bytes) for c in sorted(step.collectives, key=lambda c: c.start_us or 0.0)] == [
        ("all_to_all", 24576), ("all_to_all", 192), ("all_to_all", 1536), ("all_to_all", 13568),
        ("all_reduce", 1576964), ("all_to_all", 24576), ("all_reduce", 448), ("all_reduce", 907840)]
    assert any("5 NCCL kernel(s) without a launch event in the trace: attached" in n for n in w.notes)
    assert not any("matched no nccl: annotation" in n for n in w.notes)
