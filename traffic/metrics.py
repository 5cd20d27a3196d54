"""The measurement definitions, in one place for every backend and report (pure functions).

- Bandwidth: algbw = bytes x 8 / seconds (bits per second); busbw = algbw x the nccl-tests factor
  of the kind (`busbw_factor`). Sizes follow `traffic.workload` (the nccl-tests convention).
- Tails: `percentiles` by the nearest-rank method (an actual sample value, exact for small samples).
- Steps: `compose_step` rebuilds a training step's timeline from its recorded compute intervals and
  collectives with new collective durations (measured on a backend); `step_times` measures step,
  compute, exposed communication and idle time on that timeline; `check_step_identity` checks
  step = compute + exposed + idle. Utilisation = compute / step; communication share = exposed / step.
- Scaling efficiency at N = throughput per GPU at N / throughput per GPU at the base size.

The composition model (`compose_step`), in recorded step-relative microseconds:
- Compute is one stream: its intervals keep their order and durations.
- A compute interval starts after the previous one (the first after the step start) plus the
  recorded idle gap between them, except where in the recording it waited for collectives: the
  collectives that ended inside that idle gap (and started before the interval). Then it starts at
  the latest of: each such collective's new end plus the recorded lag from that collective's end to
  the interval's start, and the previous compute's new end plus the lag after the last of them. So
  the idle time explained by communication shrinks or grows with it; the rest is kept.
- A collective starts when the compute done before its recorded start is done again (its recorded
  start mapped onto the composed compute: same offset into the compute interval it started in, or
  same lag after the compute interval that preceded it) and when its stream is free (collectives on
  one stream run one at a time, in recorded start order). A collective that in the recording started
  the moment its stream freed up may have been ready earlier; the trace does not say, so it keeps its
  recorded point relative to compute.
- The step ends when everything has ended, and not before the recorded step end (where the step has
  one) mapped like a zero-length compute interval (so a recorded tail after the last event stays).
- With the recorded durations the composed timeline is the recorded one.
Step time, compute, exposed communication (collective time not overlapped by compute) and idle time
(neither computing nor in a collective) are all measured on the composed timeline; idle is not a
remainder, which is what makes the identity a check.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fabric.errors import FabriclabError
from traffic.workload import KINDS, Interval, Step, merge_intervals, overlap_us


class MetricError(FabriclabError):
    """A metric cannot be computed from these inputs; the message names the offending value."""


# --- bandwidth ----------------------------------------------------------------------------------------

def busbw_factor(kind: str, n: int) -> float:
    """The nccl-tests bus-bandwidth factor for `kind` over `n` ranks: all_reduce 2(n-1)/n;
    reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast, reduce 1. Beyond nccl-tests' table of
    the DESIGN: gather, scatter (n-1)/n and send_recv 1, as nccl-tests' gather, scatter and sendrecv
    tests define them. A barrier moves no data: asking for its factor is an error."""
    if n < 1:
        raise MetricError(f"{kind}: rank count must be >= 1, got {n}")
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if kind in ("broadcast", "reduce", "send_recv"):
        return 1.0
    if kind == "barrier":
        raise MetricError("barrier moves no data: it has no bus bandwidth")
    raise MetricError(f"unknown collective kind {kind!r}; known: {', '.join(KINDS)}")


def algbw_bps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bits per second: size_bytes x 8 / seconds."""
    if size_bytes < 0:
        raise MetricError(f"size_bytes must be >= 0, got {size_bytes}")
    if not seconds > 0:
        raise MetricError(f"seconds must be > 0, got {seconds}")
    return size_bytes * 8 / seconds


def busbw_bps(kind: str, size_bytes: int, n: int, seconds: float) -> float:
    """Bus bandwidth in bits per second: algbw x busbw_factor(kind, n)."""
    return algbw_bps(size_bytes, seconds) * busbw_factor(kind, n)


def mfu(model_flops_per_step: float, step_us: float, peak_flops_per_gpu: float, gpus: int) -> float:
    """Model FLOPs utilisation: the model's FLOPs per step (forward and backward, no recompute) over what
    `gpus` GPUs at their peak could do in the step's time. An output of the run: communication and
    pipeline bubbles lengthen the step and so lower it."""
    if not step_us > 0 or not peak_flops_per_gpu > 0 or gpus < 1:
        raise MetricError(f"mfu needs step_us > 0, a peak > 0 and gpus >= 1 (got {step_us}, {peak_flops_per_gpu}, "
                          f"{gpus})")
    return model_flops_per_step / (step_us * 1e-6 * peak_flops_per_gpu * gpus)


# --- tails --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Percentiles:
    p50: float
    p99: float
    p999: float
    n: int  # sample count
    mean: float
    max: float


def _nearest_rank(ordered: Sequence[float], num: int, den: int) -> float:
    """The (num/den)-quantile by nearest rank: the smallest value with at least num/den of the sample
    at or below it, i.e. ordered[ceil(n x num / den) - 1] (integer arithmetic: no rounding error)."""
    k = -(-len(ordered) * num // den)
    return ordered[max(k, 1) - 1]


def percentiles(values: Sequence[float]) -> Percentiles:
    """p50, p99, p999 by the nearest-rank method (each is a sample value; with fewer than 1000
    values p999 is the maximum), with the sample count, mean and maximum."""
    ordered = sorted(values)
    if not ordered:
        raise MetricError("percentiles of an empty sample")
    bad = [v for v in ordered if math.isnan(v)]
    if bad:
        raise MetricError(f"percentiles: the sample holds NaN ({len(bad)} of {len(ordered)} values)")
    return Percentiles(p50=_nearest_rank(ordered, 1, 2), p99=_nearest_rank(ordered, 99, 100),
                       p999=_nearest_rank(ordered, 999, 1000), n=len(ordered),
                       mean=math.fsum(ordered) / len(ordered), max=ordered[-1])


# --- step composition ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepTimeline:
    """A composed step: compute intervals in order, one (start_us, end_us) per collective in the
    step's order, and the step's end; times from the step start."""

    compute: tuple[Interval, ...]
    collectives: tuple[Interval, ...]
    end_us: float


@dataclass(frozen=True)
class StepTimes:
    step_us: float
    compute_us: float
    exposed_comm_us: float  # collective time not overlapped by compute
    idle_us: float  # neither computing nor in a collective, measured, not a remainder

    @property
    def utilisation(self) -> float:
        """compute / step."""
        return self.compute_us / self._nonzero_step()

    @property
    def comm_share(self) -> float:
        """exposed communication / step."""
        return self.exposed_comm_us / self._nonzero_step()

    @property
    def identity_residual_us(self) -> float:
        """step - (compute + exposed + idle): zero up to rounding on a sound timeline."""
        return self.step_us - (self.compute_us + self.exposed_comm_us + self.idle_us)

    def _nonzero_step(self) -> float:
        if not self.step_us > 0:
            raise MetricError(f"step time must be > 0 for a share of it, got {self.step_us} us")
        return self.step_us


class _ComputeClock:
    """The composed compute stream, filled in recorded order; maps recorded times onto it."""

    def __init__(self, recorded: tuple[Interval, ...]) -> None:
        self.recorded = recorded
        self.placed: list[Interval] = []

    def prev_ends(self) -> tuple[float, float]:
        """(recorded, composed) end of the last placed interval; the step start (0, 0) before any."""
        if not self.placed:
            return 0.0, 0.0
        return self.recorded[len(self.placed) - 1][1], self.placed[-1][1]

    def start_after_waits(self, start_rec: float, waited: Sequence[tuple[float, float]]) -> float:
        """Composed start of something recorded at `start_rec` on the compute stream, given the
        (recorded end, composed end) of the collectives it waited for."""
        prev_rec, prev_new = self.prev_ends()
        if not waited:
            return prev_new + (start_rec - prev_rec)
        last_rec = max(rec for rec, _ in waited)
        return max([prev_new + (start_rec - last_rec)] + [new + (start_rec - rec) for rec, new in waited])

    def map(self, t_rec: float) -> float:
        """A recorded time on the composed timeline: the same offset into the compute interval it
        falls in, or the same lag after the last compute interval that started at or before it."""
        if not self.placed:
            return t_rec
        (a, b), (a_new, b_new) = self.recorded[len(self.placed) - 1], self.placed[-1]
        return a_new + (t_rec - a) if t_rec <= b else b_new + (t_rec - b)


def compose_step(step: Step, durations_us: Sequence[float] | None = None) -> StepTimeline:
    """The step's timeline with the collectives taking `durations_us` (one per collective, in the
    step's order; None: the recorded durations). See the module docstring for the model."""
    colls = step.collectives
    durations = [c.duration_us for c in colls] if durations_us is None else list(durations_us)
    if len(durations) != len(colls):
        raise MetricError(f"step {step.number}: {len(durations)} durations for {len(colls)} collectives")
    starts: list[float] = []
    durs: list[float] = []
    for j, (c, d) in enumerate(zip(colls, durations)):
        if c.start_us is None or d is None:
            raise MetricError(f"step {step.number}: collective {j} ({c.kind} {c.name!r}) has no recorded "
                              f"{'start' if c.start_us is None else 'duration'}; composing needs a timed trace")
        if d < 0:
            raise MetricError(f"step {step.number}: collective {j} ({c.kind}): duration {d} us < 0")
        starts.append(c.start_us)
        durs.append(d)
    rec_end = [s + (c.duration_us or 0.0) for s, c in zip(starts, colls)]
    clock = _ComputeClock(merge_intervals(step.compute))
    new_span: dict[int, Interval] = {}
    stream_free: dict[str, float] = {}

    by_end: list[tuple[float, int]] = []  # the placed collectives by recorded end (for `waited_before`)

    def place(j: int) -> None:
        start = max(clock.map(starts[j]), stream_free.get(colls[j].stream, -math.inf))
        new_span[j] = (start, start + durs[j])
        stream_free[colls[j].stream] = start + durs[j]
        bisect.insort(by_end, (rec_end[j], j))

    def waited_before(t_rec: float) -> list[tuple[float, float]]:
        """(recorded end, composed end) of the collectives that ended in the compute stream's idle gap
        before `t_rec` and started before it."""
        prev_rec = clock.prev_ends()[0]
        lo = bisect.bisect_right(by_end, (prev_rec, math.inf))
        hi = bisect.bisect_right(by_end, (t_rec, math.inf))
        return [(e, new_span[j][1]) for e, j in by_end[lo:hi] if starts[j] < t_rec]

    order = sorted(range(len(colls)), key=lambda j: (starts[j], j))
    nxt = 0
    for a, b in clock.recorded:
        while nxt < len(order) and starts[order[nxt]] < a:  # collectives recorded before this interval
            place(order[nxt])
            nxt += 1
        start = clock.start_after_waits(a, waited_before(a))
        clock.placed.append((start, start + (b - a)))
    for j in order[nxt:]:
        place(j)
    end = max([e for _, e in clock.placed] + [e for _, e in new_span.values()] + [0.0])
    if step.duration_us is not None:
        end = max(end, clock.start_after_waits(step.duration_us, waited_before(step.duration_us)))
    return StepTimeline(tuple(clock.placed), tuple(new_span[j] for j in range(len(colls))), end)


def compose_program(step: Step, durations_us: Sequence[float]) -> StepTimeline:
    """A program-ordered step (`Workload.program`: no recorded communication times) composed with the
    collectives taking `durations_us`: its compute in order, each collective issued where it sits in the compute
    (`start_us`, on the layout where communication takes no time) once its stream is free; the compute after a
    blocking collective waits for its end, the compute after a non-blocking one does not. The step ends with the
    last compute or collective. SimAI's order (`Workload::iterate_hybrid_parallel_Transformer*`): forward
    compute, forward comm (blocking), input-gradient compute, its comm (blocking), weight-gradient compute, its
    comm (non-blocking)."""
    colls = step.collectives
    if len(durations_us) != len(colls):
        raise MetricError(f"step {step.number}: {len(durations_us)} durations for {len(colls)} collectives")
    cuts = sorted({c.start_us for c in colls if c.start_us is not None})
    events: list[tuple[float, int, int, float]] = []  # (layout position, 0 compute / 1 collective, index, end)
    for j, c in enumerate(colls):
        if c.start_us is None:
            raise MetricError(f"step {step.number}: collective {j} ({c.kind} {c.name!r}) has no place in the step")
        if durations_us[j] < 0:
            raise MetricError(f"step {step.number}: collective {j} ({c.kind}): duration {durations_us[j]} us < 0")
        events.append((c.start_us, 1, j, c.start_us))
    for a, b in merge_intervals(step.compute):  # cut where collectives sit: compute before one, compute after
        inner = cuts[bisect.bisect_right(cuts, a):bisect.bisect_left(cuts, b)]
        for x, y in zip([a, *inner], [*inner, b]):
            events.append((x, 2, 0, y))
    events.sort(key=lambda e: (e[0], e[1], e[2]))  # at one position: its collectives, then the compute after
    shift = 0.0  # how far the composed compute runs behind the layout
    stream_free: dict[str, float] = {}
    placed: list[Interval] = []
    spans: list[Interval] = [(0.0, 0.0)] * len(colls)
    for pos, what, j, end in events:
        if what == 2:
            placed.append((pos + shift, end + shift))
            continue
        c = colls[j]
        start = max(pos + shift, stream_free.get(c.stream, -math.inf))
        spans[j] = (start, start + durations_us[j])
        stream_free[c.stream] = spans[j][1]
        if c.blocking:
            shift = max(shift, spans[j][1] - pos)
    last = max([b for _, b in placed] + [b for _, b in spans] + [0.0])
    if step.duration_us is not None:
        last = max(last, step.duration_us + shift)
    return StepTimeline(tuple(placed), tuple(spans), last)


def step_times(timeline: StepTimeline) -> StepTimes:
    """Step, compute, exposed communication and idle time, each measured on the timeline."""
    compute = merge_intervals(timeline.compute)
    comm = merge_intervals(timeline.collectives)
    compute_us = sum(b - a for a, b in compute)
    exposed_us = sum(b - a for a, b in comm) - overlap_us(comm, compute)
    idle_us = 0.0
    cursor = 0.0  # walk the busy intervals over [0, end] and add up the gaps between them
    for a, b in merge_intervals(compute + comm):
        if a > cursor:
            idle_us += min(a, timeline.end_us) - cursor
        cursor = max(cursor, b)
        if cursor >= timeline.end_us:
            break
    if cursor < timeline.end_us:
        idle_us += timeline.end_us - cursor
    return StepTimes(step_us=timeline.end_us, compute_us=compute_us, exposed_comm_us=exposed_us, idle_us=idle_us)


def exposed_by_stream(timeline: StepTimeline, streams: Sequence[str]) -> dict[str, float]:
    """The step's exposed communication (`step_times`) split by the stream each collective ran on
    (`streams`, one per collective in the step's order: "dp", "pp", ... for generated LLM steps): an
    instant with no compute and k streams in a collective counts 1/k to each, so the values sum to
    the step's exposed communication."""
    if len(streams) != len(timeline.collectives):
        raise MetricError(f"{len(streams)} streams for {len(timeline.collectives)} collectives")
    compute = merge_intervals(timeline.compute)
    by_stream: dict[str, tuple[Interval, ...]] = {}
    for stream, span in zip(streams, timeline.collectives):
        by_stream[stream] = by_stream.get(stream, ()) + (span,)
    merged = {k: merge_intervals(v) for k, v in by_stream.items()}
    # the instants where anything begins or ends cut the step into pieces, each wholly inside or outside every
    # merged interval: a piece is computing, or in a stream's collective, as its midpoint is
    cuts = np.unique(np.fromiter((t for spans in [*merged.values(), compute] for span in spans for t in span),
                                 dtype=np.float64))
    a, b = cuts[:-1], cuts[1:]
    mid = (a + b) / 2

    def inside(spans: Sequence[Interval]) -> np.ndarray:
        if not spans:
            return np.zeros(mid.size, dtype=bool)
        iv = np.asarray(spans, dtype=np.float64)
        i = np.searchsorted(iv[:, 0], mid, side="right") - 1
        return (i >= 0) & (mid < iv[np.maximum(i, 0), 1])

    exposed = ~inside(compute)
    active = {k: inside(spans) & exposed for k, spans in merged.items()}
    count = np.sum([v for v in active.values()], axis=0) if active else np.zeros(mid.size)
    share = (b - a) / np.maximum(count, 1)
    # each stream's pieces added one by one in time order, as a loop over the pieces adds them
    return {k: sum(share[v].tolist(), 0.0) for k, v in active.items()}


def check_step_identity(times: StepTimes, tolerance_us: float = 1e-6) -> None:
    """Raise MetricError unless step = compute + exposed communication + idle within `tolerance_us`."""
    if abs(times.identity_residual_us) > tolerance_us:
        raise MetricError(f"step time {times.step_us} us != compute {times.compute_us} + exposed "
                          f"{times.exposed_comm_us} + idle {times.idle_us} us (off by "
                          f"{times.identity_residual_us} us, tolerance {tolerance_us} us)")


# --- scaling ------------------------------------------------------------------------------------------

def scaling_efficiency(throughput_per_gpu_at_n: float, throughput_per_gpu_at_base: float) -> float:
    """Throughput per GPU at N over throughput per GPU at the base size (1.0: perfect scaling)."""
    if not throughput_per_gpu_at_base > 0:
        raise MetricError(f"base throughput per GPU must be > 0, got {throughput_per_gpu_at_base}")
    if throughput_per_gpu_at_n < 0:
        raise MetricError(f"throughput per GPU must be >= 0, got {throughput_per_gpu_at_n}")
    return throughput_per_gpu_at_n / throughput_per_gpu_at_base
