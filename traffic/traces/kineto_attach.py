"""Which NCCL kernel belongs to which collective annotation, in a Kineto trace (`traffic.traces.kineto`).

A kernel is attached through its launch (the `cuda_runtime`/`cuda_driver` event with its correlation id) to
the innermost `nccl:`/`gloo:` annotation enclosing that launch on its CPU thread. Where the launch is not in
the trace (the profiler's window cut it off), by stream, kind and order: on each stream, the launch-less
kernels between two attached ones (anchors) go, kind class by kind class (SendRecv kernels with
all_to_all, send/recv, gather and scatter annotations), in order, to the annotations without a kernel whose
start lies between those anchors' annotations and precedes the kernel; a run before a stream's first
anchor is paired from its end (the window's start cut off the earliest annotations), any other from its
start. Runs bounded on both sides choose first.
"""
from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from traffic.workload import collective_kind

#: annotations checked (latest-starting first) when looking for the one enclosing a launch
ENCLOSING_LOOKBACK = 16


@dataclass
class Annotation:
    """A CPU collective annotation (`nccl:all_reduce`, `gloo:broadcast`, ...)."""
    name: str
    kind: str
    receive: bool
    thread: tuple[str, str]  # (pid, tid)
    start_us: float
    end_us: float
    input_bytes: int | None  # sum of numel x dtype size over the tensor inputs; None without `Input Dims`
    dtype: str
    kernels: list[NcclKernel] = field(default_factory=list)  # the NCCL kernels attached to it (`attach`)


@dataclass
class NcclKernel:
    name: str
    correlation: int | None
    stream: str
    start_us: float
    duration_us: float
    args: dict[str, Any]
    launch_us: float | None = None  # its launch event's ts, where the trace has it
    annotation: Annotation | None = None  # the collective annotation it is attached to

    @property
    def sized(self) -> bool:
        """New style: the kernel carries its own collective and size."""
        return "Collective name" in self.args and ("In msg nelems" in self.args or "Out msg nelems" in self.args)

    @property
    def short_name(self) -> str:
        return self.name.split("(", 1)[0]


def by_thread(annotations: list[Annotation]) -> dict[tuple[str, str], tuple[list[float], list[Annotation]]]:
    groups: dict[tuple[str, str], list[Annotation]] = {}
    for a in annotations:
        groups.setdefault(a.thread, []).append(a)
    out = {}
    for thread, items in groups.items():
        items.sort(key=lambda a: a.start_us)
        out[thread] = ([a.start_us for a in items], items)
    return out


def enclosing(index: dict[tuple[str, str], tuple[list[float], list[Annotation]]], thread: tuple[str, str],
               start: float, end: float) -> Annotation | None:
    """The innermost collective annotation on `thread` that contains [start, end]."""
    entry = index.get(thread)
    if entry is None:
        return None
    starts, items = entry
    i = bisect.bisect_right(starts, start) - 1
    for j in range(i, max(-1, i - ENCLOSING_LOOKBACK), -1):
        if items[j].start_us <= start and end <= items[j].end_us:
            return items[j]
    return None


# --- attaching NCCL kernels to their collective annotations --------------------------------------------------------

#: Annotation kinds that NCCL runs as SendRecv kernels: PyTorch issues all_to_all, send/recv, gather and scatter as
#: grouped point-to-point calls.
_SEND_RECV_KINDS = frozenset({"all_to_all", "send_recv", "gather", "scatter"})
_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


@dataclass
class _Run:
    """Consecutive kernels of one stream, in device order, that have no launch event in the trace, between the
    stream's anchors (kernels attached through their launch)."""
    kernels: list[NcclKernel]
    after_us: float  # their annotations started at or after this: the latest annotation start of earlier anchors
    before_us: float  # ... and at or before this: the earliest annotation start of later anchors
    from_end: bool  # paired from the end: the run precedes the stream's first anchor

    @property
    def open_sides(self) -> int:
        return (self.after_us == float("-inf")) + (self.before_us == float("inf"))


def attach(annotations: list[Annotation], kernels: list[NcclKernel],
           launches: dict[int, tuple[float, tuple[str, str]]]) -> None:
    """Attach the NCCL kernels to their collective annotations: through the launch (same correlation id) to the
    innermost annotation enclosing it on its thread; a kernel whose launch is not in the trace, by stream, kind
    and order (`_attach_run`). A kernel whose launch no annotation encloses stays unattached (its annotation is
    outside the recording)."""
    index = by_thread(annotations)
    for k in kernels:
        launch = launches.get(k.correlation) if k.correlation is not None else None
        if launch is None:
            continue
        k.launch_us = launch[0]
        ann = enclosing(index, launch[1], launch[0], launch[0])
        if ann is not None:
            _link(k, ann)
    free = sorted((a for a in annotations if a.name.startswith("nccl:") and not a.kernels),
                  key=lambda a: a.start_us)
    starts = [a.start_us for a in free]
    for run in sorted(_runs(kernels), key=lambda r: r.open_sides):  # the tightest windows choose first
        window = free[bisect.bisect_left(starts, run.after_us):bisect.bisect_right(starts, run.before_us)]
        _attach_run(run, window)


def _link(k: NcclKernel, ann: Annotation) -> None:
    k.annotation = ann
    ann.kernels.append(k)


def _runs(kernels: list[NcclKernel]) -> list[_Run]:
    """The runs of launch-less kernels on each stream. A stream runs its kernels in the order they were issued, so
    a kernel's annotation started after those of the anchors before it and before those of the anchors after it."""
    streams: dict[str, list[NcclKernel]] = {}
    for k in kernels:
        streams.setdefault(k.stream, []).append(k)
    runs: list[_Run] = []
    for on_stream in streams.values():
        on_stream.sort(key=lambda k: k.start_us)
        anchor_starts = [k.annotation.start_us if k.annotation else float("inf") for k in reversed(on_stream)]
        before = list(itertools.accumulate(anchor_starts, min))[::-1]  # before[i]: min over anchors from i on
        after = float("-inf")
        pending: list[NcclKernel] = []
        for i, k in enumerate(on_stream):
            if k.annotation is not None:
                if pending:
                    runs.append(_Run(pending, after, before[i], from_end=after == float("-inf")))
                pending = []
                after = max(after, k.annotation.start_us)
            elif k.launch_us is None:
                pending.append(k)
        if pending:
            runs.append(_Run(pending, after, float("inf"), from_end=False))
    return runs


def _attach_run(run: _Run, window: list[Annotation]) -> None:
    """Pair a run's kernels with the annotations of `window` (by start) that have no kernel yet, kind class by
    kind class (`_kernel_class`), in order (`_pair`)."""
    by_class: dict[str, list[NcclKernel]] = {}
    for k in run.kernels:
        cls = _kernel_class(k.name)
        if cls is not None:
            by_class.setdefault(cls, []).append(k)
    for cls, kernels in by_class.items():
        candidates = [a for a in window if not a.kernels and _kind_class(a.kind) == cls]
        for k, ann in _pair(kernels, candidates, run.from_end):
            _link(k, ann)


def _pair(kernels: list[NcclKernel], annotations: list[Annotation],
          from_end: bool) -> list[tuple[NcclKernel, Annotation]]:
    """Kernels (by device start) and annotations (by CPU start) paired in order, an annotation only with a kernel
    that started after it, as many pairs as possible. Where the counts differ, the pairing starts from the end
    before the stream's first anchor (the window's start cut off the annotations of the earliest kernels) and
    from the start elsewhere (the window's end cut off the kernels of the latest annotations)."""
    ks = kernels[::-1] if from_end else kernels
    anns = annotations[::-1] if from_end else annotations
    pairs = []
    i = j = 0
    while i < len(ks) and j < len(anns):
        if anns[j].start_us <= ks[i].start_us:
            pairs.append((ks[i], anns[j]))
            i += 1
            j += 1
        elif from_end:
            j += 1  # this annotation started after the kernel: its own kernel is not in the trace
        else:
            i += 1  # no annotation left started before this kernel: its own is not in the trace
    return pairs


def _kind_class(kind: str) -> str:
    """The NCCL kernel an annotation of `kind` runs as: its kind, or send_recv for the point-to-point ones."""
    return "send_recv" if kind in _SEND_RECV_KINDS else kind


def _kernel_class(name: str) -> str | None:
    """The kind class of an NCCL kernel from its name (`ncclKernel_AllReduce_RING_LL_Sum_float` -> all_reduce,
    `ncclDevKernel_SendRecv` -> send_recv); None if the name does not tell."""
    m = _KERNEL_OP.match(name)
    kind = collective_kind(m.group(1)) if m else None
    return _kind_class(kind) if kind is not None else None
