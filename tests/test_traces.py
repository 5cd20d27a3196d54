"""Trace ingestion (traffic.traces): the real Kineto traces in shared/traces, malformed inputs, NCCL logs, streaming.

Expected numbers for the real traces were read off the files independently of the parser, with the shell
commands quoted next to them (system python3's json module, run once by hand from shared/traces/kineto).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from tests.real_traces import CHAKRA, DLRM, RESNET, needs
from traffic.traces import BUILTIN_TRACE, detect_format, load, summarize
from traffic.traces import kineto_events
from traffic.workload import TraceError, Workload

ROOT = Path(__file__).resolve().parent.parent


def _sizes(step: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for c in step.collectives:
        out.setdefault(c.kind, []).append(c.size_bytes)
    return {k: sorted(v) for k, v in out.items()}


def _read_json_gz(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        data: dict[str, Any] = json.load(f)
    return data


def _write_json_gz(path: Path, data: Any) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


# --- real traces -------------------------------------------------------------------------------------------------

# ResNet-50, new style. Collectives per step, by the step whose CPU interval holds the kernel's launch:
#   zcat resnet50_ddp_2xA100_rank0.json.gz | python3 -c "import json,sys,collections; \
#     ev=json.load(sys.stdin)['traceEvents']; rt={e['args']['correlation']:e['ts'] for e in ev \
#     if e.get('cat')=='cuda_runtime'}; st=[e for e in ev if e.get('cat')=='user_annotation' and \
#     e['name'].startswith('ProfilerStep#')]; sz={'Float':4,'Long':8}; [print(s['name'], \
#     sorted(collections.Counter((k['args']['Collective name'], max(k['args']['In msg nelems'], \
#     k['args']['Out msg nelems'])*sz[k['args']['dtype']]) for k in ev if k.get('cat')=='kernel' and \
#     k['name'].startswith('nccl') and s['ts']<=rt[k['args']['correlation']]<=s['ts']+s['dur']).items())) for s in st]"
# printed, for each of ProfilerStep#4, #5, #6 (one marker each; dtypes Float = 4 bytes, Long = 8 bytes):
#   allreduce 8196000, 9724160, 26255360, 26550272, 31502336 (once each); broadcast 424, 212480 (once each)
RESNET_STEPS = [4, 5, 6]
RESNET_SIZES = {"all_reduce": [8196000, 9724160, 26255360, 26550272, 31502336], "broadcast": [424, 212480]}

# Compute and exposed communication per step, from this script (`zcat FILE | python3 indep.py`), which links
# every kernel to its launch by correlation (a kernel whose launch is missing from the trace belongs to no step, as
# in HolisticTraceAnalysis; tests/test_kineto_launchless.py has the option that places those by time):
#   import json,sys
#   ev=json.load(sys.stdin)['traceEvents']
#   rt={e['args']['correlation']:e['ts'] for e in ev if e.get('cat') in ('cuda_runtime','cuda_driver')}
#   def union(iv):
#       m=[]
#       for x,y in sorted(iv):
#           if m and x<=m[-1][1]: m[-1][1]=max(m[-1][1],y)
#           else: m.append([x,y])
#       return m
#   for s in sorted((e for e in ev if e.get('cat')=='user_annotation' and e['name'].startswith('ProfilerStep#')),
#                   key=lambda e:e['ts']):
#       a,b=s['ts'],s['ts']+s['dur']
#       ks=[k for k in ev if k.get('cat')=='kernel' and k['args'].get('correlation') in rt
#           and a<=rt[k['args']['correlation']]<=b]
#       comp=union((k['ts'],k['ts']+k['dur']) for k in ks if not k['name'].startswith('nccl'))
#       comm=union((k['ts'],k['ts']+k['dur']) for k in ks if k['name'].startswith('nccl'))
#       exp=0.0
#       for x,y in comm:
#           cur=x
#           for p,q in comp:
#               if q<=cur or p>=y: continue
#               if p>cur: exp+=p-cur
#               cur=max(cur,q)
#           if cur<y: exp+=y-cur
#       print(s['name'], round(sum(y-x for x,y in comp),3), round(exp,3), s['dur'])
# ResNet printed: #4 38506.396 10163.762 222442.191; #5 38429.425 10539.61 219726.905; #6 38720.022 18856.094 224936.243
RESNET_COMPUTE_US = [38506.396, 38429.425, 38720.022]
RESNET_EXPOSED_US = [10163.762, 10539.61, 18856.094]
RESNET_DURATION_US = [222442.191, 219726.905, 224936.243]

# DLRM, old style, one file per rank. Annotations with their sizes, per rank:
#   for r in 0 1 2 3 4 5 6 7; do zcat dlrm_8xV100_step12/rank$r.json.gz | python3 -c "import json,sys; \
#     d=json.load(sys.stdin); ev=d['traceEvents']; print(d['distributedInfo'], \
#     [e['name'] for e in ev if e.get('name','').startswith('ProfilerStep')], \
#     len([e for e in ev if e.get('cat')=='kernel' and e['name'].startswith('nccl')]), \
#     [(a['name'][5:], a['args'].get('Input Dims'), a['args'].get('Input type')) for a in sorted([e for e in ev \
#     if e.get('cat')=='user_annotation' and e['name'].startswith('nccl:')], key=lambda e:e['ts'])])"; done
# printed the same for every rank r (with 'rank': r, 'world_size': 8), ['ProfilerStep#10'], 8 NCCL kernels, and
#   all_to_all [[6144]] float, [[24]] long int, [[384]] int, [[3392]] int, [[6144]] float;
#   all_reduce [[394241]] float, [[112]] float, [[226960]] float.
# Bytes (float/int 4, long int 8): all_to_all 24576, 192, 1536, 13568, 24576; all_reduce 1576964, 448, 907840.
DLRM_SIZES = {"all_to_all": [192, 1536, 13568, 24576, 24576], "all_reduce": [448, 907840, 1576964]}
# The script above on each rank file printed (compute, exposed, duration) for ProfilerStep#10. Ranks 1 and 3 hold
# 64 compute kernels each with no launch event (correlation ids below every launch's: launched before the profiler
# started), 203 us and 176 us in all, inside the step: placed by their own start they made 1246 and 1240.
DLRM_COMPUTE_EXPOSED_US = {0: (1034, 5537, 14455), 1: (1043, 11056, 19901), 2: (1068, 3217, 13017),
                           3: (1064, 9450, 19313), 4: (1126, 6550, 17979), 5: (1041, 6211, 17797),
                           6: (1051, 3289, 13091), 7: (1059, 1580, 12509)}


@needs(RESNET)
def test_resnet_new_style_steps_collectives_and_sizes() -> None:
    w = load(RESNET)
    assert (w.format, w.timed, w.world_size) == ("kineto", True, 2)
    assert [r.rank for r in w.ranks] == [0]
    steps = w.ranks[0].steps
    assert [s.number for s in steps] == RESNET_STEPS
    for s, compute, exposed, duration in zip(steps, RESNET_COMPUTE_US, RESNET_EXPOSED_US, RESNET_DURATION_US):
        assert _sizes(s) == RESNET_SIZES
        assert s.compute_us == pytest.approx(compute, abs=1e-3)
        assert s.exposed_comm_us == pytest.approx(exposed, abs=1e-3)
        assert s.duration_us == pytest.approx(duration, abs=1e-3)
        for c in s.collectives:
            assert c.group_ranks == (0, 1) and c.stream == "40"
            assert c.start_us is not None and 0 < c.start_us < s.duration_us
        assert {c.dtype for c in s.collectives} == {"float32", "int64"}
        starts = [c.start_us for c in s.collectives]
        assert starts == sorted(starts)


@needs(RESNET)
def test_resnet_maps_onto_more_ranks() -> None:
    w = load(RESNET).mapped_to(8)
    assert w.world_size == 8 and len(w.ranks) == 8
    assert {c.group_ranks for c in w.collectives()} == {tuple(range(8))}


@needs(DLRM)
def test_dlrm_old_style_directory_all_ranks() -> None:
    w = load(DLRM)
    assert (w.format, w.world_size, w.source) == ("kineto", 8, str(DLRM))
    assert [r.rank for r in w.ranks] == list(range(8))
    for r in w.ranks:
        assert [s.number for s in r.steps] == [10]
        step = r.steps[0]
        assert _sizes(step) == DLRM_SIZES
        compute, exposed, duration = DLRM_COMPUTE_EXPOSED_US[r.rank]
        assert step.compute_us == pytest.approx(compute)
        assert step.exposed_comm_us == pytest.approx(exposed)
        assert step.duration_us == pytest.approx(duration)
        assert {c.group_ranks for c in step.collectives} == {tuple(range(8))}
        assert {c.stream for c in step.collectives} == {"84"}
    assert any("process groups are not recorded" in n for n in w.notes)


@needs(DLRM)
def test_single_dlrm_rank_file() -> None:
    w = load(DLRM / "rank3.json.gz")
    assert [r.rank for r in w.ranks] == [3] and w.world_size == 8
    assert _sizes(w.ranks[0].steps[0]) == DLRM_SIZES


@needs(RESNET)
def test_step_counted_once_across_tracks(tmp_path: Path) -> None:
    data = _read_json_gz(RESNET)
    copies = []
    for e in data["traceEvents"]:
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"):
            copies.append(dict(e, cat="gpu_user_annotation", pid=0, tid=7, ts=e["ts"] + 50.0))  # device track
            copies.append(dict(e, tid=e["tid"] + 1, ts=e["ts"] + 1.0, dur=e["dur"] - 2.0))  # another CPU thread
    data["traceEvents"].extend(copies)
    w = load(_write_json_gz(tmp_path / "dup.json.gz", data))
    assert [s.number for s in w.ranks[0].steps] == RESNET_STEPS
    assert all(_sizes(s) == RESNET_SIZES for s in w.ranks[0].steps)


@needs(RESNET)
def test_launch_sampling_thinned_gives_the_same_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep only a handful of launch samples, so most step boundaries fall in ambiguous correlation windows that
    # must be resolved from the launches themselves: the result must not change.
    monkeypatch.setattr(kineto_events, "_MAX_SAMPLES", 8)
    w = load(RESNET)
    assert [s.compute_us for s in w.ranks[0].steps] == pytest.approx(RESNET_COMPUTE_US, abs=1e-3)
    assert [s.exposed_comm_us for s in w.ranks[0].steps] == pytest.approx(RESNET_EXPOSED_US, abs=1e-3)


@needs(RESNET)
def test_summary() -> None:
    w = load(RESNET)
    s = summarize(w)
    assert (s.ranks, s.steps, s.world_size, s.timed, s.format) == ((0,), 3, 2, True, "kineto")
    assert [row.number for row in s.step_summaries] == RESNET_STEPS
    first = s.step_summaries[0]
    assert {k.kind: (k.count, k.size_bytes) for k in first.kinds} == {
        "all_reduce": (5, sum(RESNET_SIZES["all_reduce"])), "broadcast": (2, sum(RESNET_SIZES["broadcast"]))}
    assert first.exposed_comm_share == pytest.approx(RESNET_EXPOSED_US[0] / RESNET_DURATION_US[0])
    assert first.compute_us == pytest.approx(RESNET_COMPUTE_US[0], abs=1e-3)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["per_step"][0]["collectives"] == 7 and d["notes"] == list(w.notes)


@needs(RESNET, DLRM, CHAKRA)
def test_detects_formats() -> None:
    assert detect_format(RESNET) == "kineto"
    assert detect_format(DLRM / "rank0.json.gz") == "kineto"
    assert detect_format(CHAKRA) == "chakra"


@needs(CHAKRA)
def test_chakra_missing_is_a_trace_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "traffic.traces.chakra", None)  # makes the import fail
    with pytest.raises(TraceError, match="Chakra support is missing"):
        load(CHAKRA)


# --- hand-made Kineto traces: CPU-only (gloo) semantics ----------------------------------------------------------

def _cpu_only_trace() -> dict[str, Any]:
    def x(cat: str, name: str, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}
    return {"distributedInfo": {"backend": "gloo", "rank": 1, "world_size": 4}, "traceEvents": [
        x("user_annotation", "ProfilerStep#7", 10, 1000.0, 1000.0),
        x("cpu_op", "aten::mm", 10, 1100.0, 200.0),  # compute [100, 300]
        x("cpu_op", "c10d::allreduce_", 10, 1310.0, 10.0),  # a communication op: not compute
        x("user_annotation", "gloo:all_reduce", 20, 1200.0, 400.0, **{"Input Dims": [[250]],
                                                                      "Input type": ["float"]}),
        x("cpu_op", "aten::copy_", 20, 1250.0, 100.0),  # inside the collective annotation: not compute
        x("cpu_op", "aten::relu", 10, 1700.0, 200.0),  # compute [700, 900]
        x("user_annotation", "gloo:all_gather", 20, 1650.0, 20.0, **{"Input Dims": [[100]],
                                                                     "Input type": ["c10::BFloat16"]}),
        x("user_annotation", "gloo:recv", 21, 1800.0, 20.0, **{"Input Dims": [[100]], "Input type": ["float"]}),
        x("user_annotation", "gloo:broadcast", 20, 2500.0, 20.0, **{"Input Dims": [[8]], "Input type": ["int"]}),
    ]}


def test_cpu_only_trace(tmp_path: Path) -> None:
    w = load(_write_json_gz(tmp_path / "trace.json.gz", _cpu_only_trace()))
    assert [r.rank for r in w.ranks] == [1] and w.world_size == 4
    (step,) = w.ranks[0].steps
    assert step.number == 7 and step.duration_us == 1000.0
    assert step.compute == ((100.0, 300.0), (700.0, 900.0))
    # all_reduce: 250 floats; all_gather: 100 bf16 per rank x 4 ranks; the recv and the broadcast after the
    # step are left out.
    assert [(c.kind, c.size_bytes, c.dtype, c.stream, c.start_us, c.duration_us) for c in step.collectives] == [
        ("all_reduce", 1000, "float32", "thread:20", 200.0, 400.0),
        ("all_gather", 800, "bfloat16", "thread:20", 650.0, 20.0)]
    assert step.collectives[0].group_ranks == (0, 1, 2, 3)
    # exposed: the all_reduce [200, 600] less compute [100, 300] = 300; the all_gather [650, 670] is exposed
    assert step.exposed_comm_us == pytest.approx(300.0 + 20.0)
    assert any("CPU-only trace" in n for n in w.notes)
    assert any("1 receive(s) left out" in n for n in w.notes)
    assert any("1 collective(s) outside every ProfilerStep" in n for n in w.notes)


def test_trace_without_step_markers_is_one_step(tmp_path: Path) -> None:
    data = _cpu_only_trace()
    data["traceEvents"] = [e for e in data["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    w = load(_write_json_gz(tmp_path / "trace.json.gz", data))
    (step,) = w.ranks[0].steps
    assert step.number == 0 and step.duration_us == 2520.0 - 1100.0  # first event start to last event end
    assert [c.kind for c in step.collectives] == ["all_reduce", "all_gather", "broadcast"]
    assert any("no ProfilerStep markers" in n for n in w.notes)


def test_distributed_info_as_string(tmp_path: Path) -> None:
    data = _cpu_only_trace()
    data["distributedInfo"] = "{'backend': 'gloo', 'rank': 2, 'world_size': 4}"  # recent PyTorch writes this
    w = load(_write_json_gz(tmp_path / "trace.json.gz", data))
    assert [r.rank for r in w.ranks] == [2]


def test_rank_from_file_name_in_a_directory(tmp_path: Path) -> None:
    for r in (0, 1):
        data = _cpu_only_trace()
        del data["distributedInfo"]
        _write_json_gz(tmp_path / f"worker{r}.json.gz", data)
    w = load(tmp_path)
    assert [r.rank for r in w.ranks] == [0, 1] and w.world_size == 2


# --- malformed inputs -----------------------------------------------------------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nope.json.*no such file"):
        load(tmp_path / "nope.json")


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="empty directory"):
        load(tmp_path)


@needs(RESNET)
def test_truncated_gzip(tmp_path: Path) -> None:
    raw = RESNET.read_bytes()
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match=r"cut\.json\.gz: truncated"):
        load(bad)


@needs(RESNET)
def test_truncated_plain_json(tmp_path: Path) -> None:
    with gzip.open(RESNET, "rb") as f:
        raw = f.read()
    bad = tmp_path / "cut.json"
    bad.write_bytes(raw[: len(raw) // 3])
    with pytest.raises(TraceError, match=r"cut\.json: .*premature EOF"):
        load(bad)


def test_not_a_known_format(tmp_path: Path) -> None:
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(TraceError, match="blob.bin: .*not a known trace format"):
        load(binary)
    text = tmp_path / "notes.txt"
    text.write_text("just some text\n")
    with pytest.raises(TraceError, match="notes.txt: .*not a known trace format"):
        load(text)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty.json: empty file"):
        load(empty)


def test_json_that_is_not_a_chrome_trace(tmp_path: Path) -> None:
    obj = tmp_path / "config.json"
    obj.write_text(json.dumps({"name": "x", "layers": [1, 2, 3]}))
    with pytest.raises(TraceError, match="config.json: JSON that is not a Chrome trace"):
        load(obj)
    arr = tmp_path / "list.json"
    arr.write_text("[1, 2, 3]")
    with pytest.raises(TraceError, match="list.json: JSON that is not a Chrome trace"):
        load(arr)
    bad_event = tmp_path / "events.json"
    bad_event.write_text(json.dumps({"traceEvents": [1, 2]}))
    with pytest.raises(TraceError, match="events.json: a traceEvents entry is not an object"):
        load(bad_event)


def test_invalid_utf8_inside_json(tmp_path: Path) -> None:
    bad = tmp_path / "bytes.json.gz"
    with gzip.open(bad, "wb") as f:
        f.write(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "\xff\xfe", "ts": 1, "dur": 1}]}')
    with pytest.raises(TraceError, match="bytes.json.gz: "):
        load(bad)


@needs(RESNET)
def test_no_collectives(tmp_path: Path) -> None:
    data = _read_json_gz(RESNET)
    data["traceEvents"] = [e for e in data["traceEvents"] if "nccl" not in str(e.get("name", "")).lower()]
    with pytest.raises(TraceError, match="quiet.json.gz: no collectives at all"):
        load(_write_json_gz(tmp_path / "quiet.json.gz", data))


@needs(DLRM)
def test_collectives_without_sizes(tmp_path: Path) -> None:
    data = _read_json_gz(DLRM / "rank0.json.gz")
    for e in data["traceEvents"]:
        if str(e.get("name", "")).startswith("nccl:all_reduce"):
            del e["args"]["Input Dims"]
            break
    with pytest.raises(TraceError, match="rank0.json.gz: collective without sizes: annotation 'nccl:all_reduce'"):
        load(_write_json_gz(tmp_path / "rank0.json.gz", data))


@needs(DLRM)
def test_directory_mixing_formats(tmp_path: Path) -> None:
    shutil.copy(DLRM / "rank0.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "rank1.log").write_text(NCCL_LOG_OLD)
    with pytest.raises(TraceError, match="mixing trace formats: rank0.json.gz \\(kineto\\), rank1.log \\(nccl-log\\)"):
        load(tmp_path)


@needs(RESNET)
def test_nccl_options_rejected_for_kineto() -> None:
    with pytest.raises(TraceError, match="apply to NCCL logs only"):
        load(RESNET, compute_gap_us=100.0)


@needs(DLRM)
def test_duplicate_rank_in_directory(tmp_path: Path) -> None:
    shutil.copy(DLRM / "rank0.json.gz", tmp_path / "a.json.gz")
    shutil.copy(DLRM / "rank0.json.gz", tmp_path / "b.json.gz")
    with pytest.raises(TraceError, match="rank 0 appears in both"):
        load(tmp_path)


# --- NCCL debug logs --------------------------------------------------------------------------------------------------

# Two ranks of one host, one GPU per process (pids 4001, 4002), no globalrank: ranks by (host, pid) order.
# Sizes by hand: AllReduce 237184 x fp32(4) = 948736; AllGather 1000 bf16(2) per rank x 2 ranks = 4000;
# ReduceScatter 500 fp16(2) per rank x 2 = 2000; Broadcast 53 x int64(8) = 424; Send 10 x uint8(1) = 10.
# opCount restarts (back to 0) start a second step: one AllReduce of 64 fp32 = 256 bytes.
NCCL_LOG_OLD = (
    "node1:4001:4001 [0] NCCL INFO Bootstrap : Using eth0:198.18.0.1<0>\n"
    "node1:4001:4101 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f1000000000 recvbuff 0x7f1000400000 "
    "count 237184 datatype 7 op 0 root 0 "
    "comm 0x55d100000010 [nranks=2] stream 0x55d100000100\n"
    "node1:4002:4201 [1] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f2000000000 recvbuff 0x7f2000400000 "
    "count 237184 datatype 7 op 0 root 0 "
    "comm 0x55d200000010 [nranks=2] stream 0x55d200000100\n"
    "node1:4001:4101 [0] NCCL INFO AllGather: opCount 1 sendbuff 0x7f1000800000 recvbuff 0x7f1000900000 acc (nil) "
    "count 1000 datatype 9 op 0 root 0 "
    "comm 0x55d100000010 [nranks=2] stream 0x55d100000100\n"
    "node1:4002:4201 [1] NCCL INFO AllGather: opCount 1 sendbuff 0x7f2000800000 recvbuff 0x7f2000900000 acc (nil) "
    "count 1000 datatype 9 op 0 root 0 "
    "comm 0x55d200000010 [nranks=2] stream 0x55d200000100\n"
    "node1:4001:4101 [0] NCCL INFO ReduceScatter: opCount 2 sendbuff 0x7f1000a00000 recvbuff 0x7f1000b00000 "
    "count 500 datatype 6 op 0 root 0 "
    "comm 0x55d100000010 [nranks=2] stream 0x55d100000100\n"
    "node1:4002:4201 [1] NCCL INFO ReduceScatter: opCount 2 sendbuff 0x7f2000a00000 recvbuff 0x7f2000b00000 "
    "count 500 datatype 6 op 0 root 0 "
    "comm 0x55d200000010 [nranks=2] stream 0x55d200000100\n"
    "node1:4001:4101 [0] NCCL INFO Broadcast: opCount 3 sendbuff 0x7f1000c00000 recvbuff 0x7f1000c00000 "
    "count 53 datatype 4 op 0 root 0 "
    "comm 0x55d100000010 [nranks=2] stream 0x55d100000100\n"
    "node1:4002:4201 [1] NCCL INFO Broadcast: opCount 3 sendbuff 0x7f2000c00000 recvbuff 0x7f2000c00000 "
    "count 53 datatype 4 op 0 root 0 "
    "comm 0x55d200000010 [nranks=2] stream 0x55d200000100\n"
    "node1:4001:4101 [0] NCCL INFO Send: opCount 4 sendbuff 0x7f1000d00000 recvbuff (nil) "
    "count 10 datatype 1 op 0 root 1 "
    "comm 0x55d100000010 [nranks=2] stream 0x55d100000100\n"
    "node1:4002:4201 [1] NCCL INFO Recv: opCount 4 sendbuff (nil) recvbuff 0x7f2000d00000 "
    "count 10 datatype 1 op 0 root 0 "
    "comm 0x55d200000010 [nranks=2] stream 0x55d200000100\n"
    "node1:4001:4101 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f1000000000 recvbuff 0x7f1000400000 "
    "count 64 datatype 7 op 0 root 0 "
    "comm 0x55d100000010 [nranks=2] stream 0x55d100000100\n"
    "node1:4002:4201 [1] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f2000000000 recvbuff 0x7f2000400000 "
    "count 64 datatype 7 op 0 root 0 "
    "comm 0x55d200000010 [nranks=2] stream 0x55d200000100\n"
)

# Newer NCCL: `task T globalrank G` at the end; the launcher prefixes lines. Ranks 2 and 3 of a 4-rank job:
# a 4-rank communicator (AllReduce 1048576 bf16 = 2097152 bytes; opCount 1a = 26) and a 2-rank one over {2, 3}
# (AllGather 4096 fp32 per rank x 2 = 32768).
NCCL_LOG_NEW = (
    "(worker pid=7001) node2:7001:7101 [0] NCCL INFO AllReduce: "
    "opCount 1a sendbuff 0x7f3000000000 recvbuff 0x7f3000000000 "
    "count 1048576 datatype 9 op 0 root 0 "
    "comm 0x55e100000010 [nranks=4] stream 0x55e100000100 task 0 globalrank 2\n"
    "(worker pid=7002) node2:7002:7201 [1] NCCL INFO AllReduce: "
    "opCount 1a sendbuff 0x7f4000000000 recvbuff 0x7f4000000000 "
    "count 1048576 datatype 9 op 0 root 0 "
    "comm 0x55e200000010 [nranks=4] stream 0x55e200000100 task 0 globalrank 3\n"
    "(worker pid=7001) node2:7001:7101 [0] NCCL INFO AllGather: "
    "opCount 0 sendbuff 0x7f3000100000 recvbuff 0x7f3000200000 "
    "count 4096 datatype 7 op 0 root 0 "
    "comm 0x55e100000020 [nranks=2] stream 0x55e100000100 task 1 globalrank 2\n"
    "(worker pid=7002) node2:7002:7201 [1] NCCL INFO AllGather: "
    "opCount 0 sendbuff 0x7f4000100000 recvbuff 0x7f4000200000 "
    "count 4096 datatype 7 op 0 root 0 "
    "comm 0x55e200000020 [nranks=2] stream 0x55e200000100 task 1 globalrank 3\n"
)


def test_nccl_log_sizes_ranks_and_steps(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(NCCL_LOG_OLD)
    assert detect_format(log) == "nccl-log"
    w = load(log)
    assert (w.format, w.timed, w.world_size) == ("nccl-log", False, 2)
    assert [r.rank for r in w.ranks] == [0, 1]
    r0, r1 = w.ranks
    assert [s.number for s in r0.steps] == [0, 1]
    assert [(c.kind, c.size_bytes, c.dtype) for c in r0.steps[0].collectives] == [
        ("all_reduce", 948736, "float32"), ("all_gather", 4000, "bfloat16"), ("reduce_scatter", 2000, "float16"),
        ("broadcast", 424, "int64"), ("send_recv", 10, "uint8")]
    assert [(c.kind, c.size_bytes) for c in r1.steps[0].collectives] == [  # rank 1's Recv is left out
        ("all_reduce", 948736), ("all_gather", 4000), ("reduce_scatter", 2000), ("broadcast", 424)]
    assert [(c.kind, c.size_bytes) for c in r0.steps[1].collectives] == [("all_reduce", 256)]
    assert all(c.group_ranks == (0, 1) for c in w.collectives())
    assert r0.steps[0].collectives[0].stream == "0x55d100000100"
    assert all(c.start_us is None and c.duration_us is None for c in w.collectives())
    assert all(s.duration_us is None and s.compute == () for r in w.ranks for s in r.steps)
    assert any("no timings" in n for n in w.notes) and any("no compute assumed" in n for n in w.notes)
    assert any("1 Recv line(s) left out" in n for n in w.notes)
    assert summarize(w).step_summaries[0].exposed_comm_share is None


def test_nccl_log_compute_gap_and_explicit_steps(tmp_path: Path) -> None:
    log = tmp_path / "job.log.gz"
    with gzip.open(log, "wt") as f:
        f.write(NCCL_LOG_OLD)
    w = load(log, compute_gap_us=250.0, collectives_per_step=2)
    r0 = w.ranks[0]
    # rank 0 has 6 counted collectives: steps of 2, 2, 2
    assert [len(s.collectives) for s in r0.steps] == [2, 2, 2]
    s = r0.steps[0]
    assert [c.start_us for c in s.collectives] == [250.0, 500.0]
    assert s.compute == ((0.0, 500.0),) and s.compute_us == 500.0
    assert any("assumed 250 us of compute before each collective" in n for n in w.notes)
    assert any("every 2 collectives" in n for n in w.notes)


def test_nccl_log_globalrank_and_groups(tmp_path: Path) -> None:
    log = tmp_path / "new.log"
    log.write_text(NCCL_LOG_NEW)
    w = load(log)
    assert w.world_size == 4 and [r.rank for r in w.ranks] == [2, 3]
    for r in w.ranks:
        (step,) = r.steps
        assert [(c.kind, c.size_bytes, c.dtype, c.group_ranks) for c in step.collectives] == [
            ("all_reduce", 2097152, "bfloat16", (0, 1, 2, 3)), ("all_gather", 32768, "float32", (2, 3))]


def test_nccl_log_directory_of_per_rank_logs(tmp_path: Path) -> None:
    lines = NCCL_LOG_OLD.splitlines(keepends=True)
    (tmp_path / "rank0.log").write_text("".join(ln for ln in lines if ":4001:" in ln))
    (tmp_path / "rank1.log").write_text("".join(ln for ln in lines if ":4002:" in ln))
    w = load(tmp_path)
    assert [r.rank for r in w.ranks] == [0, 1] and w.name == tmp_path.name


def test_nccl_log_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.log"
    bad.write_text("node1:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 count ?? datatype 7\n")
    with pytest.raises(TraceError, match=r"bad.log:1: an NCCL collective line that does not parse"):
        load(bad)
    dtype = tmp_path / "dtype.log"
    dtype.write_text(NCCL_LOG_OLD.replace("datatype 7", "datatype 42", 1))
    with pytest.raises(TraceError, match=r"dtype.log:2: unknown NCCL datatype 42"):
        load(dtype)
    quiet = tmp_path / "quiet.log"
    quiet.write_text("node1:4001:4001 [0] NCCL INFO Bootstrap : Using eth0:198.18.0.1<0>\n")
    with pytest.raises(TraceError, match="quiet.log: no collectives at all"):
        load(quiet)
    with pytest.raises(TraceError, match="collectives_per_step must be >= 1"):
        load(bad, collectives_per_step=0)


# --- streaming ----------------------------------------------------------------------------------------------------

def _bench_module() -> Any:
    spec = importlib.util.spec_from_file_location("trace_ingest_bench", ROOT / "benchmarks" / "trace_ingest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs(RESNET)
def test_streaming_memory_stays_far_below_the_file_size(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    copies = _bench_module().write_repeated_trace(RESNET, big, 50_000_000)
    size = big.stat().st_size
    assert size >= 50_000_000
    tracemalloc.start()
    try:
        w: Workload = load(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert w.steps == 3 * copies
    assert all(_sizes(s) == RESNET_SIZES for s in w.ranks[0].steps)
    assert [s.compute_us for s in w.ranks[0].steps[-3:]] == pytest.approx(RESNET_COMPUTE_US, abs=1e-3)
    assert peak < size / 10, f"peak {peak / 1e6:.1f} MB while parsing a {size / 1e6:.0f} MB trace"


def test_builtin_trace_constant_points_into_the_package() -> None:
    assert BUILTIN_TRACE.parent.name == "data" and BUILTIN_TRACE.parent.parent.name == "traffic"
