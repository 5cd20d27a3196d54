"""PyTorch profiler (Kineto) Chrome-trace JSON, gzipped or not, into a one-rank `Workload`, streamed with ijson.

What is read (`ts`/`dur` are microseconds; GPU kernels have `pid` = device, `tid` = stream):
- Steps: `ProfilerStep#N` CPU annotations (`cat` user_annotation, or cpu_op in old traces); a number seen on
  several CPU tracks counts once (the union of its intervals); GPU copies (`gpu_user_annotation`) are not steps.
  A trace without markers is one step, 0, over the whole trace.
- Collectives, new style (NCCL kernels `ncclKernel_*` / `ncclDevKernel_*` carrying `Collective name`,
  `In msg nelems`, `Out msg nelems`, `dtype`, `Group size`, `Process Group Ranks`): one per kernel, bytes =
  max(In, Out msg nelems) x dtype size, which is the nccl-tests size of every kind. Such a kernel is attached to
  its annotation as below only so that the annotation is not counted again.
- Collectives, old style (NCCL kernels without `In msg nelems`/`Out msg nelems`; the sizes are only on the CPU
  annotations `nccl:<kind>` / `gloo:<kind>`, args `Input Dims` and `Input type`): the annotations are the
  collectives, their count and bytes; the kernels give only device timing (start, duration, stream, name). A
  kernel is attached
  1. through its launch, the `cuda_runtime`/`cuda_driver` event with the same `args.correlation`: to the
     innermost collective annotation enclosing the launch on the launch's CPU thread;
  2. where the launch is not in the trace (no correlation, or one no launch has; the profiler window cuts
     launches at its edges), by stream, kind and order. On each stream, in device order, the kernels attached
     through their launch are anchors. A stream runs kernels in issue order, so a run of launch-less kernels
     between two anchors belongs to `nccl:` annotations with no kernel yet that started in between: at or after
     the latest annotation start of the earlier anchors, at or before the earliest of the later ones. In that
     window, kind by kind (the kernel's from its name: `ncclKernel_AllReduce_*` all_reduce, `AllGather`,
     `ReduceScatter`, `Broadcast`, `Reduce`; `SendRecv` kernels go with all_to_all, send, recv, gather and
     scatter annotations, which PyTorch runs as grouped point-to-point calls), kernels and annotations are paired
     in order, an annotation only with a kernel that started after it. Where their counts differ, a run before
     the stream's first anchor is paired from its end (the window's start cut off the earliest kernels'
     annotations), any other from its start (the window's end cut off the latest annotations' kernels). Runs
     bounded on both sides are paired first, then those open on one side, then streams without anchors
     (`traffic.traces.kineto_attach`).
  A kernel left unattached (its launch enclosed by no annotation, no annotation of its kind left for it in order, or
  a name that does not tell its kind) lies outside the recorded collectives, like its annotation: it is counted and
  named in a note, provided the trace has a `nccl:` annotation with `Input Dims`; without one nothing gives its size
  and the trace is refused. The kernels of one annotation make one collective, from the first one's device start to
  the last one's end, on the first one's stream. The annotation's inputs are what PyTorch passed to the backend, so
  bytes = sum over tensor inputs of numel x dtype size, times the group size for all_gather and gather (their input
  is one rank's part; nccl-tests counts the whole output); reduce_scatter and all_to_all inputs are already the
  whole buffer. The process group is not recorded in this style: every collective is taken over all ranks of the job
  (noted). Where the annotations and the kernels without sizes differ in number, a note gives both. A collective
  annotation with no kernel (a CPU-only gloo trace, or a kernel outside the recording) is a collective timed by the
  annotation.
- Sizes are checked where they are read: a negative `Input Dims` dimension or message count, or a collective of
  more than 2^48 bytes (`MAX_COLLECTIVE_BYTES`), is a TraceError naming the file and the event (name and ts).
- Receives (`recv`) are left out: a point-to-point transfer counts once, at its sender (noted).
- Step membership: a new-style kernel belongs to the step whose CPU interval contains its launch (where the
  launch is not in the trace, its device start); an annotation's collective to the step containing the
  annotation's start (which encloses its kernels' launches). Collectives outside every step are left out (noted).
- Compute per step: the union of the non-NCCL GPU `kernel` intervals launched in the step (memcpy and memset are
  not compute); in a trace with no GPU kernels at all, the union of the step's CPU ops (`cpu_op`) that are not
  communication ops (`c10d::*`, `record_param_comms`) and not inside a collective annotation on their thread.
  Times are relative to the step start; device work may run past the step's CPU end and is kept as recorded.

Memory grows with steps and collectives (and the merged compute intervals returned), not with events. Pass 1
keeps steps, collective annotations, NCCL kernels and a bounded sample of the launches' (correlation, ts); pass 2
(the file reopened) keeps the launches of the NCCL kernels and folds compute kernels into per-step merged
intervals. CUPTI correlation ids grow with launch
time, so the sample tells which step a correlation id belongs to, except in a few narrow id windows around step
boundaries, whose kernels are held until their launch is seen. Parsing uses ijson's C backend (`yajl2_c`) where it
is installed, else ijson's default (`BACKEND` says which).
"""
from __future__ import annotations

import ast
import bisect
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ijson

from traffic.traces.files import open_trace, read_error
from traffic.traces.kineto_attach import Annotation, NcclKernel, attach, by_thread, enclosing
from traffic.workload import (DTYPE_BYTES, Collective, Interval, RankTrace, Step, TraceError, Workload,
                              canonical_dtype, checked_size, collective_kind, is_receive, merge_intervals)

try:
    _IJSON: Any = ijson.get_backend("yajl2_c")
except ImportError:  # no compiled backend on this platform: ijson's default (pure Python or cffi)
    _IJSON = ijson
#: The ijson backend in use ("yajl2_c" where the C extension is available).
BACKEND: str = str(_IJSON.backend_name)

NCCL_KERNEL_PREFIXES = ("ncclKernel_", "ncclDevKernel_")
COLLECTIVE_ANNOTATION_PREFIXES = ("nccl:", "gloo:")
_STEP_PREFIX = "ProfilerStep#"
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
_ANNOTATION_CATS = frozenset({"user_annotation", "cpu_op"})
_COMM_CPU_OPS = ("c10d::", "record_param_comms", "nccl:", "gloo:", _STEP_PREFIX)
_READ_ERRORS = (ijson.JSONError, EOFError, OSError, zlib.error, UnicodeDecodeError)
_HEADER_KEYS = frozenset({"distributedInfo"})  # top-level metadata kept from the header
_MAX_SAMPLES = 1 << 13  # launch (correlation, ts) samples kept in pass 1; thinned by half when full
_NAMED_KERNELS = 10  # unattributed NCCL kernels named in the note (the rest are counted)


@dataclass
class _Pass1:
    steps: dict[int, list[float]] = field(default_factory=dict)  # number -> [start_us, end_us]
    annotations: list[Annotation] = field(default_factory=list)
    nccl_kernels: list[NcclKernel] = field(default_factory=list)
    compute_kernels: int = 0
    first_us: float = float("inf")
    last_us: float = float("-inf")
    samples: list[tuple[int, float]] = field(default_factory=list)  # (correlation, ts) of launches, thinned
    sample_stride: int = 1
    launches_seen: int = 0
    min_launch: tuple[int, float] | None = None
    max_launch: tuple[int, float] | None = None


class _Busy:
    """Merged busy intervals, folded as they come so memory follows the merged result, not the input."""

    def __init__(self) -> None:
        self.merged: list[Interval] = []
        self.pending: list[Interval] = []

    def add(self, start: float, end: float) -> None:
        self.pending.append((start, end))
        if len(self.pending) > max(256, len(self.merged)):
            self._fold()

    def _fold(self) -> None:
        if self.pending:
            self.merged = list(merge_intervals(self.merged + self.pending))
            self.pending = []

    def result(self) -> tuple[Interval, ...]:
        self._fold()
        return tuple(self.merged)


def read_kineto(path: Path, *, in_directory: bool = False) -> Workload:
    """One Kineto trace file (one rank) as a Workload; `in_directory` makes a missing rank an error instead of 0."""
    header = _read_header(path)
    info = _distributed_info(header.get("distributedInfo"))
    notes: list[str] = []
    rank = _rank(path, info, in_directory, notes)
    p1 = _pass1(path)
    steps = _steps(p1, notes)
    bounds = _Boundaries(steps, p1)
    gpu = p1.compute_kernels > 0 or bool(p1.nccl_kernels)
    launches, busy, unlaunched = _pass2(path, p1, steps, bounds, gpu)
    tag = f"{path.name}: " if in_directory else ""  # per-file facts, so that a directory's notes say whose
    if unlaunched:
        notes.append(f"{tag}{unlaunched} GPU kernel(s) without a launch event in the trace: placed by their "
                     "device start")
    world = _world_size(info, p1, rank)
    per_step: list[list[Collective]] = [[] for _ in steps]
    outside = _collectives(path, p1, launches, steps, bounds, world, per_step, notes, tag)
    total = sum(len(c) for c in per_step)
    if total == 0:
        what = "no collectives inside the ProfilerStep markers" if outside else "no collectives at all"
        raise TraceError(f"{path}: {what} (no NCCL kernels and no nccl:/gloo: annotations)")
    if outside:
        notes.append(f"{tag}{outside} collective(s) outside every ProfilerStep were left out")
    if gpu:
        notes.append("compute = union of the non-NCCL GPU kernels launched in the step (memcpy/memset excluded)")
    else:
        notes.append("CPU-only trace: compute = union of the step's CPU ops outside collective annotations")
    out_steps = []
    for i, (number, start, end) in enumerate(steps):
        compute = tuple((a - start, b - start) for a, b in busy[i].result())
        busy[i] = _Busy()  # drop the absolute copy before building the next step
        out_steps.append(Step(number, end - start, compute,
                              tuple(sorted(per_step[i], key=lambda c: (c.start_us or 0.0, c.name)))))
    return Workload(name=_stem(path), source=str(path), format="kineto", world_size=world,
                    ranks=(RankTrace(rank, tuple(out_steps)),), timed=True, notes=tuple(notes))


# --- reading ------------------------------------------------------------------------------------------------------

def _events(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with open_trace(path) as f:
            for ev in _IJSON.items(f, "traceEvents.item", use_float=True):
                if not isinstance(ev, dict):
                    raise TraceError(f"{path}: a traceEvents entry is not an object: {str(ev)[:80]!r}")
                yield ev
    except _READ_ERRORS as exc:
        raise read_error(path, exc) from None


def _read_header(path: Path) -> dict[str, Any]:
    """The top-level keys before `traceEvents` (Kineto writes its metadata there); checks it is a Chrome trace."""
    header: dict[str, Any] = {}
    try:
        with open_trace(path) as f:
            parser = _IJSON.parse(f, use_float=True)
            first = next(parser, None)
            if first is None or first[1] != "start_map":
                raise TraceError(f"{path}: JSON that is not a Chrome trace (the top level is not an object "
                                 "with traceEvents)")
            key: str | None = None
            builder: Any = None
            for prefix, event, value in parser:
                if prefix == "" and event in ("map_key", "end_map"):
                    if key is not None and builder is not None:
                        header[key] = builder.value
                    if event == "end_map":
                        break
                    if value == "traceEvents":
                        return header
                    key, builder = value, (ijson.ObjectBuilder() if value in _HEADER_KEYS else None)
                elif builder is not None:
                    builder.event(event, value)
    except _READ_ERRORS as exc:
        raise read_error(path, exc) from None
    raise TraceError(f"{path}: JSON that is not a Chrome trace (no traceEvents)")


def _distributed_info(raw: Any) -> dict[str, Any]:
    """Kineto's `distributedInfo`: an object, or (recent PyTorch) a string holding a Python dict literal."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(raw)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, dict):
                return value
    return {}


def _rank(path: Path, info: dict[str, Any], in_directory: bool, notes: list[str]) -> int:
    value = info.get("rank")
    if isinstance(value, int) and value >= 0:
        return value
    m = re.search(r"(?:rank|worker)[_\-]?(\d+)", path.name) or re.search(r"(\d+)\D*$", path.name)
    if m:
        notes.append(f"{path.name}: no distributedInfo.rank; rank {int(m.group(1))} taken from the file name")
        return int(m.group(1))
    if in_directory:
        raise TraceError(f"{path}: cannot tell the rank (no distributedInfo.rank and no number in the file name)")
    notes.append(f"{path.name}: no distributedInfo.rank; taken as rank 0")
    return 0


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    args = ev.get("args")
    return args if isinstance(args, dict) else {}


def _thread(ev: dict[str, Any]) -> tuple[str, str]:
    """(pid, tid) of a CPU event, as strings (Chrome traces allow numbers or names)."""
    return str(ev.get("pid")), str(ev.get("tid"))


def _num(ev: dict[str, Any], key: str, path: Path) -> float:
    value = ev.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TraceError(f"{path}: event {str(ev.get('name'))[:60]!r} has no numeric {key!r} (got {value!r})")


def _pass1(path: Path) -> _Pass1:
    p = _Pass1()
    for ev in _events(path):
        cat = ev.get("cat")
        if cat == "kernel" or cat == "Kernel":
            name = str(ev.get("name", ""))
            start = _num(ev, "ts", path)
            end = start + _num(ev, "dur", path)
            if name.startswith(NCCL_KERNEL_PREFIXES):
                args = _args(ev)
                corr = args.get("correlation")
                p.nccl_kernels.append(NcclKernel(name, corr if isinstance(corr, int) else None,
                                                  str(ev.get("tid")), start, end - start, args))
            else:
                p.compute_kernels += 1
        elif cat in _LAUNCH_CATS:
            corr = _args(ev).get("correlation")
            if isinstance(corr, int):
                _sample(p, corr, _num(ev, "ts", path))
            continue
        elif cat in _ANNOTATION_CATS:
            name = str(ev.get("name", ""))
            if name.startswith(_STEP_PREFIX):
                _add_step(p, name, ev, path)
            elif name.startswith(COLLECTIVE_ANNOTATION_PREFIXES):
                p.annotations.append(_annotation(name, ev, path))
        else:
            continue
        start = _num(ev, "ts", path)
        p.first_us = min(p.first_us, start)
        p.last_us = max(p.last_us, start + float(ev.get("dur") or 0.0))
    return p


def _sample(p: _Pass1, corr: int, ts: float) -> None:
    if p.min_launch is None or corr < p.min_launch[0]:
        p.min_launch = (corr, ts)
    if p.max_launch is None or corr > p.max_launch[0]:
        p.max_launch = (corr, ts)
    p.launches_seen += 1
    if p.launches_seen % p.sample_stride:
        return
    p.samples.append((corr, ts))
    if len(p.samples) >= _MAX_SAMPLES:
        p.samples.sort()
        p.samples = p.samples[::2]
        p.sample_stride *= 2


def _add_step(p: _Pass1, name: str, ev: dict[str, Any], path: Path) -> None:
    try:
        number = int(name[len(_STEP_PREFIX):])
    except ValueError:
        raise TraceError(f"{path}: step marker {name!r} has no step number") from None
    start = _num(ev, "ts", path)
    end = start + _num(ev, "dur", path)
    known = p.steps.get(number)
    if known is None:
        p.steps[number] = [start, end]
    else:  # the same step on another CPU track: count it once
        known[0], known[1] = min(known[0], start), max(known[1], end)


def _annotation(name: str, ev: dict[str, Any], path: Path) -> Annotation:
    op = name.split(":", 1)[1]
    kind = collective_kind(op)
    if kind is None:
        raise TraceError(f"{path}: unknown collective {name!r} at ts {ev.get('ts')}")
    start = _num(ev, "ts", path)
    args = _args(ev)
    sized = _input_bytes(args.get("Input Dims"), args.get("Input type"), f"{path} at ts {start}",
                         f"annotation {name!r}")
    return Annotation(name, kind, is_receive(op), _thread(ev), start,
                       start + _num(ev, "dur", path), sized[0] if sized else None, sized[1] if sized else "unknown")


def _input_bytes(dims: Any, types: Any, where: str, what: str) -> tuple[int, str] | None:
    """Sum of numel x dtype size over the tensor inputs, and the first tensor's dtype; None if there are none.
    A negative dimension, or more than MAX_COLLECTIVE_BYTES, is a TraceError naming `where` and `what`."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0
    first: str | None = None
    for shape, type_name in zip(dims, types):
        if isinstance(shape, list) and any(isinstance(d, int) and d < 0 for d in shape):
            raise TraceError(f"{where}: {what}: negative dimension in Input Dims {str(shape)[:80]}")
        dtype = canonical_dtype(type_name) if isinstance(type_name, str) else None
        if dtype is None or not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            continue
        tensor = DTYPE_BYTES[dtype] if 0 not in shape else 0
        for d in shape:
            # refused as soon as it is too big: a hostile shape's exact product could take long to compute
            tensor = checked_size(where, f"{what}: Input Dims {str(shape)[:80]} x {dtype}", tensor * d)
        total = checked_size(where, f"{what}: Input Dims x Input type summed", total + tensor)
        first = first or dtype
    return (total, first) if first else None


# --- steps and correlation ids ------------------------------------------------------------------------------------

def _steps(p: _Pass1, notes: list[str]) -> list[tuple[int, float, float]]:
    """(number, start_us, end_us) by start; overlapping markers are cut at the next step's start."""
    if not p.steps:
        if p.first_us == float("inf"):
            return []
        notes.append("no ProfilerStep markers: the whole trace is taken as one step (0)")
        return [(0, p.first_us, p.last_us)]
    ordered = sorted((start, end, number) for number, (start, end) in p.steps.items())
    out = []
    for i, (start, end, number) in enumerate(ordered):
        if i + 1 < len(ordered):
            end = min(end, ordered[i + 1][0])
        out.append((number, start, end))
    return out


class _Boundaries:
    """Step boundaries in time, and what a correlation id says about which side of each a launch was.

    Region r = the number of boundaries (step starts and ends, in order) at or before a time: region 2i+1 is step
    i, even regions lie between steps. Correlation ids grow with launch time, so from the sampled launches, for
    boundary j: ids <= lo[j] were launched before it and ids >= hi[j] after it; ids in between are ambiguous and
    resolved from their own launch in pass 2."""

    def __init__(self, steps: list[tuple[int, float, float]], p: _Pass1) -> None:
        self.times = [t for _, start, end in steps for t in (start, end)]
        samples = list(p.samples)
        for extreme in (p.min_launch, p.max_launch):
            if extreme is not None:
                samples.append(extreme)
        samples.sort(key=lambda s: s[1])
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.launch_range = (p.min_launch[0] if p.min_launch else 0, p.max_launch[0] if p.max_launch else -1)
        if not samples:
            return
        ts = [s[1] for s in samples]
        prefix_max: list[int] = []
        for corr, _ in samples:
            prefix_max.append(max(corr, prefix_max[-1]) if prefix_max else corr)
        suffix_min = [0] * len(samples)
        running: int | None = None
        for i in range(len(samples) - 1, -1, -1):
            running = samples[i][0] if running is None else min(running, samples[i][0])
            suffix_min[i] = running
        below = min(s[0] for s in samples) - 1
        above = max(s[0] for s in samples) + 1
        for t in self.times:
            i = bisect.bisect_left(ts, t)
            self.lo.append(prefix_max[i - 1] if i > 0 else below)
            self.hi.append(suffix_min[i] if i < len(samples) else above)

    @property
    def linkable(self) -> bool:
        return bool(self.lo)

    def has_launch_range(self, corr: int) -> bool:
        """Whether `corr` lies within the correlation ids of the trace's launches (outside, the launch was not
        recorded, e.g. it happened before the profiler started)."""
        return self.launch_range[0] <= corr <= self.launch_range[1]

    def region_of_time(self, t: float) -> int:
        return bisect.bisect_right(self.times, t)

    def region_of_correlation(self, corr: int) -> int | None:
        surely_after = min(bisect.bisect_right(self.hi, corr), bisect.bisect_left(self.lo, corr))
        maybe_after = max(bisect.bisect_right(self.hi, corr), bisect.bisect_left(self.lo, corr))
        return surely_after if surely_after == maybe_after else None


def _step_index(region: int) -> int | None:
    return (region - 1) // 2 if region % 2 == 1 else None


# --- pass 2: launches and compute ----------------------------------------------------------------------------------

def _pass2(path: Path, p: _Pass1, steps: list[tuple[int, float, float]], bounds: _Boundaries,
           gpu: bool) -> tuple[dict[int, tuple[float, tuple[str, str]]], list[_Busy], int]:
    """Launch (ts, (pid, tid)) of every NCCL kernel, each step's merged compute intervals (absolute times), and
    how many compute kernels had no launch event in the trace (placed by their own device start)."""
    busy = [_Busy() for _ in steps]
    nccl_corrs = {k.correlation for k in p.nccl_kernels if k.correlation is not None}
    launches: dict[int, tuple[float, tuple[str, str]]] = {}
    held: list[tuple[int, float, float]] = []  # compute kernels whose correlation id is ambiguous
    held_launch: dict[int, float] = {}
    unlaunched = 0
    annotations = by_thread(p.annotations)
    for ev in _events(path):
        cat = ev.get("cat")
        if cat in _LAUNCH_CATS:
            corr = _args(ev).get("correlation")
            if not isinstance(corr, int):
                continue
            if corr in nccl_corrs:
                launches[corr] = (_num(ev, "ts", path), _thread(ev))
            if gpu and bounds.linkable and bounds.region_of_correlation(corr) is None:
                held_launch[corr] = _num(ev, "ts", path)
        elif gpu and (cat == "kernel" or cat == "Kernel"):
            name = str(ev.get("name", ""))
            if name.startswith(NCCL_KERNEL_PREFIXES):
                continue
            start = _num(ev, "ts", path)
            end = start + _num(ev, "dur", path)
            corr = _args(ev).get("correlation")
            if not bounds.linkable or not isinstance(corr, int) or not bounds.has_launch_range(corr):
                unlaunched += 1  # its launch is not in the trace: placed by its device start
                region = bounds.region_of_time(start)
            else:
                linked = bounds.region_of_correlation(corr)
                if linked is None:
                    held.append((corr, start, end))
                    continue
                region = linked
            index = _step_index(region)
            if index is not None:
                busy[index].add(start, end)
        elif not gpu and cat == "cpu_op":
            name = str(ev.get("name", ""))
            if name.startswith(_COMM_CPU_OPS):
                continue
            start = _num(ev, "ts", path)
            end = start + _num(ev, "dur", path)
            index = _step_index(bounds.region_of_time(start))
            if index is not None and enclosing(annotations, _thread(ev), start, end) is None:
                busy[index].add(start, end)
    for corr, start, end in held:
        launched = held_launch.get(corr)
        if launched is None:
            unlaunched += 1
        index = _step_index(bounds.region_of_time(start if launched is None else launched))
        if index is not None:
            busy[index].add(start, end)
    return launches, busy, unlaunched


# --- collectives ----------------------------------------------------------------------------------------------------

def _world_size(info: dict[str, Any], p: _Pass1, rank: int) -> int:
    sizes = [rank + 1]
    if isinstance(info.get("world_size"), int):
        sizes.append(info["world_size"])
    for k in p.nccl_kernels:
        if isinstance(k.args.get("Group size"), int):
            sizes.append(k.args["Group size"])
        sizes.extend(r + 1 for r in _parse_ranks(k.args.get("Process Group Ranks")) or ())
    return max(sizes)


def _parse_ranks(raw: Any) -> tuple[int, ...] | None:
    """`Process Group Ranks`: a list, or a string such as "[0, 1]"; None if absent or unreadable."""
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(r, int) and r >= 0 for r in value):
        return tuple(sorted(value))
    return None


def _collectives(path: Path, p: _Pass1, launches: dict[int, tuple[float, tuple[str, str]]],
                 steps: list[tuple[int, float, float]], bounds: _Boundaries, world: int,
                 per_step: list[list[Collective]], notes: list[str], tag: str) -> int:
    """Fill per_step with the step's collectives; return how many fell outside every step."""
    attach(p.annotations, p.nccl_kernels, launches)
    whole = tuple(range(world))
    outside = receives = 0

    def place(index: int | None, coll: Collective) -> None:
        nonlocal outside
        if index is None:
            outside += 1
            return
        start = steps[index][1]
        per_step[index].append(Collective(coll.kind, coll.size_bytes, coll.dtype, coll.group_ranks, coll.stream,
                                          (coll.start_us or 0.0) - start, coll.duration_us, coll.name))

    unlaunched = 0
    for k in p.nccl_kernels:  # new style: one collective per kernel
        if not k.sized:
            continue
        if k.launch_us is None:
            unlaunched += 1
        op = str(k.args["Collective name"])
        if is_receive(op):
            receives += 1
            continue
        launched = k.start_us if k.launch_us is None else k.launch_us
        place(_step_index(bounds.region_of_time(launched)), _new_style(path, k, op, whole))
    _unattributed(path, p, notes, tag)
    counted = cpu_only = by_annotation = 0
    for ann in p.annotations:  # old style, and CPU-only: one collective per annotation
        kernels = sorted((k for k in ann.kernels if not k.sized), key=lambda k: k.start_us)
        if ann.kernels and not kernels:
            continue  # its new-style kernels carry the collective
        counted += 1
        if ann.receive:
            receives += 1
            continue
        if kernels:
            end = max(k.start_us + k.duration_us for k in kernels)
            coll = _from_annotation(path, ann, whole, kernels[0].stream, kernels[0].start_us,
                                    end - kernels[0].start_us, kernels[0].name)
        else:
            cpu_only += 1
            coll = _from_annotation(path, ann, whole, f"thread:{ann.thread[1]}", ann.start_us,
                                    ann.end_us - ann.start_us, ann.name)
        by_annotation += 1
        place(_step_index(bounds.region_of_time(ann.start_us)), coll)
    unsized = [k for k in p.nccl_kernels if not k.sized]
    by_order = sum(1 for k in unsized if k.launch_us is None and k.annotation is not None)
    if by_annotation:
        notes.append(f"process groups are not recorded on nccl:/gloo: annotations: those collectives are taken "
                     f"over all {world} ranks")
    if unsized and counted != len(unsized):
        notes.append(f"{tag}collectives counted from the {counted} nccl:/gloo: annotation(s), receives included; "
                     f"the {len(unsized)} NCCL kernel(s) without sizes give their timing only")
    if cpu_only and (p.nccl_kernels or p.compute_kernels):
        notes.append(f"{tag}{cpu_only} collective(s) had no device kernel: timed by their CPU annotation")
    if receives:
        notes.append(f"{tag}{receives} receive(s) left out: a point-to-point transfer counts once, at its sender")
    if unlaunched:
        notes.append(f"{tag}{unlaunched} NCCL kernel(s) without a launch event in the trace: placed by their "
                     "device start")
    if by_order:
        notes.append(f"{tag}{by_order} NCCL kernel(s) without a launch event in the trace: attached to their "
                     "nccl: annotation by stream, kind and order")
    return outside


def _unattributed(path: Path, p: _Pass1, notes: list[str], tag: str) -> None:
    """Note the kernels without sizes that no annotation took: in a trace sized by its annotations, the profiler
    window cut theirs off, so they are outside the recording like any collective there. Without such annotations
    nothing gives their size: the trace is refused."""
    left = sorted((k for k in p.nccl_kernels if not k.sized and k.annotation is None), key=lambda k: k.start_us)
    if not left:
        return
    if not any(a.input_bytes is not None and a.name.startswith("nccl:") for a in p.annotations):
        raise TraceError(f"{path}: NCCL kernel {left[0].short_name!r} at ts {left[0].start_us} has no size: no "
                         "'In msg nelems' args, and no nccl:* annotation in the trace has 'Input Dims' to give it")
    named = ", ".join(f"{k.short_name!r} at ts {k.start_us}" for k in left[:_NAMED_KERNELS])
    more = f" and {len(left) - _NAMED_KERNELS} more" if len(left) > _NAMED_KERNELS else ""
    notes.append(f"{tag}{len(left)} NCCL kernel(s) without sizes matched no nccl: annotation (the profiler window "
                 f"cut theirs off), left out: {named}{more}")


def _new_style(path: Path, k: NcclKernel, op: str, whole: tuple[int, ...]) -> Collective:
    where, what = f"{path} at ts {k.start_us}", f"NCCL kernel {k.short_name!r}"
    kind = collective_kind(op)
    if kind is None:
        raise TraceError(f"{where}: {what}: unknown 'Collective name' {op!r}")
    raw_dtype = k.args.get("dtype")
    dtype = canonical_dtype(raw_dtype) if isinstance(raw_dtype, str) else None
    if dtype is None:
        raise TraceError(f"{where}: {what}: unknown dtype {raw_dtype!r}")
    nelems = {key: k.args.get(key) for key in ("In msg nelems", "Out msg nelems")}
    sizes = [checked_size(where, f"{what} {key} {n} x {dtype}", n * DTYPE_BYTES[dtype])  # each: max() hides one
             for key, n in nelems.items() if isinstance(n, int) and not isinstance(n, bool)]
    if not sizes:
        raise TraceError(f"{where}: {what}: message sizes {list(nelems.values())!r} are not counts")
    ranks = _parse_ranks(k.args.get("Process Group Ranks"))
    size = k.args.get("Group size")
    if ranks is None or (isinstance(size, int) and len(ranks) != size):
        if isinstance(size, int) and size != len(whole):
            raise TraceError(f"{where}: {what}: process group of {size} ranks but "
                             f"'Process Group Ranks' {k.args.get('Process Group Ranks')!r} does not list them")
        ranks = whole
    return Collective(kind, max(sizes), dtype, ranks, k.stream, k.start_us, k.duration_us, k.name)


def _from_annotation(path: Path, ann: Annotation, whole: tuple[int, ...], stream: str, start_us: float,
                     duration_us: float, name: str) -> Collective:
    if ann.input_bytes is None:
        if ann.kind != "barrier":
            raise TraceError(f"{path}: collective without sizes: annotation {ann.name!r} at ts {ann.start_us} has "
                             "no 'Input Dims'/'Input type' (record with record_shapes=True)")
        size = 0
    else:
        group = len(whole) if ann.kind in ("all_gather", "gather") else 1
        size = checked_size(f"{path} at ts {ann.start_us}",
                            f"annotation {ann.name!r}: {ann.input_bytes} input bytes x {group} rank(s)",
                            ann.input_bytes * group)
    return Collective(ann.kind, size, ann.dtype, whole, stream, start_us, duration_us, name)
