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
  not compute). A compute kernel without a launch event in the trace (no `cuda_runtime`/`cuda_driver` event with its
  correlation id: launched before the profiler started, or not recorded) has no step and is left out, as
  HolisticTraceAnalysis does (a GPU event takes the iteration of its correlated CPU launch, else -1:
  `add_iteration` in hta/common/trace.py); a note gives their count, summed duration, first start and last end.
  With `launchless_kernels="by-time"` such a kernel goes to the step whose window [start, end) holds its device
  start, clipped to that step's end, so that it adds no time beyond the step. In a trace with no GPU kernels at
  all, the union of the step's CPU ops (`cpu_op`) that are not communication ops (`c10d::*`, `record_param_comms`)
  and not inside a collective annotation on their thread.
  Times are relative to the step start; device work may run past the step's CPU end and is kept as recorded.

Memory grows with steps and collectives (and the merged compute intervals returned), not with events. Pass 1
keeps steps, collective annotations, NCCL kernels, a bounded sample of the launches' (correlation, ts) and a bitmap
of their correlation ids (`LaunchIds`: a bit per id over the ids' span); pass 2
(the file reopened) keeps the launches of the NCCL kernels and folds compute kernels into per-step merged
intervals. CUPTI correlation ids grow with launch
time, so the sample tells which step a correlation id belongs to, except in a few narrow id windows around step
boundaries, whose kernels are held until their launch is seen. Parsing uses ijson's C backend (`yajl2_c`) where it
is installed, else ijson's default (`kineto_events.BACKEND` says which).

The modules: `kineto_events` reads the JSON and makes pass 1; `kineto_steps` finds the steps and their boundaries in
time and correlation ids; `kineto_attach` attaches NCCL kernels to annotations; `kineto_collectives` makes the
collectives and their notes; this module makes pass 2 (launches and compute) and the `Workload`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from traffic.traces.kineto_attach import by_thread, enclosing
from traffic.traces.kineto_collectives import collectives_into_steps, world_size
from traffic.traces.kineto_events import (LAUNCH_CATS, NCCL_KERNEL_PREFIXES, STEP_PREFIX, Pass1, distributed_info,
                                          event_args, events, num, pass1, read_header, thread)
from traffic.traces.kineto_steps import Boundaries, step_index, steps_of
from traffic.workload import (LAUNCHLESS_KERNELS, Collective, Interval, RankTrace, Step, TraceError, Workload,
                              merge_intervals)

_COMM_CPU_OPS = ("c10d::", "record_param_comms", "nccl:", "gloo:", STEP_PREFIX)


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


def read_kineto(path: Path, *, in_directory: bool = False, launchless_kernels: str = "leave-out") -> Workload:
    """One Kineto trace file (one rank) as a Workload; `in_directory` makes a missing rank an error instead of 0;
    `launchless_kernels` ("leave-out" or "by-time", `LAUNCHLESS_KERNELS`): what compute kernels without a launch
    event count as (module docstring)."""
    if launchless_kernels not in LAUNCHLESS_KERNELS:
        raise TraceError(f"{path}: launchless_kernels (--launchless-kernels) must be one of "
                         f"{', '.join(LAUNCHLESS_KERNELS)}, got {launchless_kernels!r}")
    header = read_header(path)
    info = distributed_info(header.get("distributedInfo"))
    notes: list[str] = []
    rank = _rank(path, info, in_directory, notes)
    p1 = pass1(path)
    steps = steps_of(p1, notes)
    bounds = Boundaries(steps, p1)
    gpu = p1.compute_kernels > 0 or bool(p1.nccl_kernels)
    by_time = launchless_kernels == "by-time"
    launches, busy, launchless = _pass2(path, p1, steps, bounds, gpu, by_time)
    tag = f"{path.name}: " if in_directory else ""  # per-file facts, so that a directory's notes say whose
    if launchless.count:
        notes.append(f"{tag}{launchless.describe(by_time)}")
    world = world_size(info, p1, rank)
    per_step: list[list[Collective]] = [[] for _ in steps]
    outside = collectives_into_steps(path, p1, launches, steps, bounds, world, per_step, notes, tag)
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


# --- pass 2: launches and compute ----------------------------------------------------------------------------------

class _Launchless:
    """The compute kernels without a launch event in the trace: how many, their summed duration, the first one's
    start and the last one's end, and (by time) how many started outside every step."""

    def __init__(self) -> None:
        self.count = 0
        self.total_us = 0.0
        self.first_us = float("inf")
        self.last_us = float("-inf")
        self.outside = 0

    def add(self, start: float, end: float) -> None:
        self.count += 1
        self.total_us += end - start
        self.first_us = min(self.first_us, start)
        self.last_us = max(self.last_us, end)

    def describe(self, by_time: bool) -> str:
        what = (f"{self.count} GPU compute kernel(s) without a launch event in the trace ({_us(self.total_us)} us in "
                f"all, the first starting at ts {_us(self.first_us)}, the last ending at ts {_us(self.last_us)})")
        if by_time:
            outside = f"; {self.outside} outside every step, left out" if self.outside else ""
            return (f"{what}: put in the step whose window holds their device start, clipped to its end "
                    f"(--launchless-kernels by-time){outside}")
        return (f"{what}: left out of compute, as HolisticTraceAnalysis leaves them out of every iteration (a GPU "
                "kernel belongs to its launch's step); --launchless-kernels by-time puts them in the step whose "
                "window holds them")


def _us(value: float) -> str:
    """A time in microseconds as a note prints it: up to 3 decimals, no trailing zeros, never an exponent."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _pass2(path: Path, p: Pass1, steps: list[tuple[int, float, float]], bounds: Boundaries, gpu: bool,
           by_time: bool) -> tuple[dict[int, tuple[float, tuple[str, str]]], list[_Busy], _Launchless]:
    """Launch (ts, (pid, tid)) of every NCCL kernel, each step's merged compute intervals (absolute times), and
    the compute kernels that had no launch event in the trace (left out, or `by_time` placed by their device
    start and clipped to the step's end)."""
    busy = [_Busy() for _ in steps]
    nccl_corrs = {k.correlation for k in p.nccl_kernels if k.correlation is not None}
    launches: dict[int, tuple[float, tuple[str, str]]] = {}
    held: list[tuple[int, float, float]] = []  # compute kernels whose correlation id is ambiguous
    held_launch: dict[int, float] = {}
    launchless = _Launchless()
    annotations = by_thread(p.annotations)
    for ev in events(path):
        cat = ev.get("cat")
        if cat in LAUNCH_CATS:
            corr = event_args(ev).get("correlation")
            if not isinstance(corr, int):
                continue
            if corr in nccl_corrs:
                launches[corr] = (num(ev, "ts", path), thread(ev))
            if gpu and bounds.linkable and bounds.region_of_correlation(corr) is None:
                held_launch[corr] = num(ev, "ts", path)
        elif gpu and (cat == "kernel" or cat == "Kernel"):
            name = str(ev.get("name", ""))
            if name.startswith(NCCL_KERNEL_PREFIXES):
                continue
            start = num(ev, "ts", path)
            end = start + num(ev, "dur", path)
            corr = event_args(ev).get("correlation")
            if not isinstance(corr, int) or corr not in p.launch_ids:  # its launch is not in the trace
                launchless.add(start, end)
                if by_time:
                    index = step_index(bounds.region_of_time(start))
                    if index is None:
                        launchless.outside += 1
                    else:
                        busy[index].add(start, min(end, steps[index][2]))
                continue
            region = bounds.region_of_correlation(corr)
            if region is None:
                held.append((corr, start, end))
                continue
            index = step_index(region)
            if index is not None:
                busy[index].add(start, end)
        elif not gpu and cat == "cpu_op":
            name = str(ev.get("name", ""))
            if name.startswith(_COMM_CPU_OPS):
                continue
            start = num(ev, "ts", path)
            end = start + num(ev, "dur", path)
            index = step_index(bounds.region_of_time(start))
            if index is not None and enclosing(annotations, thread(ev), start, end) is None:
                busy[index].add(start, end)
    for corr, start, end in held:  # each has its launch in the trace (`launch_ids`), seen in this pass
        index = step_index(bounds.region_of_time(held_launch[corr]))
        if index is not None:
            busy[index].add(start, end)
    return launches, busy, launchless
