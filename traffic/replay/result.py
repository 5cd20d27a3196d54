"""From a run's timings to its `RunResult` (pure), for both backends: real-unit durations and bandwidths
per collective, composed step timelines, and the run's description.

- A collective's real duration is its duration in the backend's clock divided by the dilation (the
  simulator's is 1); algbw = real bytes x 8 / real seconds, busbw = algbw x the nccl-tests factor
  (`traffic.metrics`). A call standing for `count` back-to-back collectives (`Call.count`: an
  in-server one) counts their bytes together: its bandwidths are those of one of them.
- Steps are composed, not slept (docs/architecture.md): each rank's recorded step is rebuilt by
  `traffic.metrics.compose_step` with the measured durations of its collectives; step, compute,
  exposed communication and idle time are measured on that timeline. A data-parallel trace mapped onto
  N ranks has N identical ranks: one timeline stands for all (rank -1). A multi-rank trace gets one row
  per rank plus the job's as rank -1 (`job_step`: the slowest rank's step time, the ranks' mean split). A
  program-ordered file (`Workload.program`: SimAI, a generated AICB workload) is composed in its own order
  (`traffic.metrics.compose_program`); another trace without timings composes compute gaps of `compute_gap_us`
  before each collective, one after the other.
- What only a backend can measure (its links over time, its fidelity, faults and reroutes) comes in its
  `traffic.replay.timings.BackendRun`: the emulation's from port counters and the CPU
  (`traffic.replay.emulated`), the simulator's from its load log (`traffic.replay.simulate`).
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any

from traffic import metrics
from traffic.replay.plan import SCALING_NOTES, ReplayPlan
from traffic.replay.timings import BackendRun, RunTimings
from traffic.results import CollectiveResult, LinkSeries, RunMeta, RunResult, StepResult
from traffic.workload import Step

BUSY_UTIL = 0.05  # a link is busy in an interval above this utilisation


def collective_results(plan: ReplayPlan, timings: RunTimings) -> list[CollectiveResult]:
    t_first = min(t.start_s for t in timings.calls)
    out = []
    for call, tm in zip(plan.calls, timings.calls):
        t = plan.templates[call.template]
        # a discarded (empty) collective takes no time (`Template.discarded`); any other at least 1 ns
        emu_s = 0.0 if t.discarded else max(tm.end_s - tm.start_s, 1e-9)
        real_us = emu_s / plan.dilation * 1e6
        n = len(t.ranks)
        size = t.size_bytes * call.count
        if t.kind == "barrier" or t.size_bytes == 0:
            alg = bus = 0.0
        else:
            alg = metrics.algbw_bps(size, real_us / 1e6)
            bus = alg * metrics.busbw_factor(t.kind, n)
        out.append(CollectiveResult(call.id, call.step, call.repeat, t.kind, t.algorithm, size, t.emu_bytes * call.count, n,
                                    call.stream, t.transfer_count, tm.start_s - t_first, emu_s, real_us, alg, bus))
    return out


def _compose(step: Step, durations_us: list[float], timed: bool,
             gap_us: float, program: bool = False) -> tuple[metrics.StepTimes, dict[str, float]]:
    """The step's times and its exposed communication by stream."""
    streams = [c.stream for c in step.collectives]
    if timed and step.duration_us is not None or program:
        timeline = (metrics.compose_program(step, durations_us) if program and not timed
                    else metrics.compose_step(step, durations_us))
        return metrics.step_times(timeline), metrics.exposed_by_stream(timeline, streams)
    comm = sum(durations_us)
    compute = gap_us * len(durations_us)
    by_stream: dict[str, float] = {}
    for stream, d in zip(streams, durations_us):  # one after the other: every collective exposed
        by_stream[stream] = by_stream.get(stream, 0.0) + d
    return metrics.StepTimes(compute + comm, compute, comm, 0.0), by_stream


def step_results(plan: ReplayPlan, colls: list[CollectiveResult]) -> list[StepResult]:
    wl = plan.workload
    mapped = len({tuple(r.steps) for r in wl.ranks}) == 1  # identical ranks: one timeline for all
    # (repeat, step index, rank) -> {index in the rank's step: measured real duration}; a count > 1
    # collective replayed as several calls: their durations summed
    measured: dict[tuple[int, int, int], dict[int, float]] = defaultdict(dict)
    for call, res in zip(plan.calls, colls):
        for rank, i in call.rank_index:
            got = measured[(call.repeat, call.step_index, rank)]
            got[i] = got.get(i, 0.0) + res.duration_real_us
    out = []
    # ranks whose steps compose alike (the same compute, collectives' places, streams and measured durations: a
    # generated step's TP ranks on symmetric paths) are composed once
    composed: dict[tuple[Any, ...], tuple[metrics.StepTimes, dict[str, float]]] = {}
    for rep in range(plan.options.repeat):
        for s in range(wl.steps):
            rows = []
            for rt in (wl.ranks[:1] if mapped else wl.ranks):
                if s >= len(rt.steps):
                    continue
                step = rt.steps[s]
                got = measured[(rep, s, rt.rank)]
                durations = [got.get(i, c.duration_us or 0.0) for i, c in enumerate(step.collectives)]
                key = (step.number, step.duration_us, step.compute, tuple(durations),
                       tuple((c.start_us, c.duration_us, c.stream, c.blocking) for c in step.collectives))
                found = composed.get(key)
                if found is None:
                    found = composed[key] = _compose(step, durations, wl.timed, plan.options.compute_gap_us,
                                                     wl.program)
                    metrics.check_step_identity(found[0], tolerance_us=1e-3 * max(1.0, found[0].step_us))
                times, by_stream = found[0], dict(found[1])
                rows.append(StepResult(step.number, rep, -1 if mapped else rt.rank, times.step_us, times.compute_us,
                                       times.exposed_comm_us, times.idle_us, step.duration_us, by_stream))
            out.extend(rows)
            if not mapped and rows:
                out.append(job_step(rows))
    return out


def job_step(rows: list[StepResult]) -> StepResult:
    """The job's step (rank -1) from its ranks' composed steps: it lasts as long as the slowest rank's; its
    compute, exposed communication (and per stream) are the mean over the ranks, and its idle the rest, so a
    rank that ends early counts the wait for the slowest as idle (the step identity holds: compute + exposed +
    idle = step). Taking the slowest rank's own split instead would let whichever rank ends last by a few µs
    decide the job's utilisation."""
    slow = max(rows, key=lambda r: r.step_us)
    n = len(rows)
    compute = math.fsum(r.compute_us for r in rows) / n
    exposed = math.fsum(r.exposed_comm_us for r in rows) / n
    streams: dict[str, float] = {}
    for r in rows:
        for k, v in r.exposed_by_stream_us.items():
            streams[k] = streams.get(k, 0.0) + v / n
    return dataclasses.replace(slow, rank=-1, compute_us=compute, exposed_comm_us=exposed,
                               idle_us=slow.step_us - compute - exposed, exposed_by_stream_us=streams)


def busiest_links(links: list[LinkSeries], interval_s: float, bound_share: float) -> list[dict[str, Any]]:
    """The 8 links that carried the most: their delivered rate while busy (> BUSY_UTIL) against
    `bound_share` x capacity."""
    rows: list[dict[str, Any]] = []
    for l in sorted(links, key=lambda x: -x.emu_bytes)[:8]:
        busy = [u for u in l.util if u > BUSY_UTIL]
        if not busy:
            continue
        delivered = l.emu_bytes * 8 / (len(busy) * interval_s) if interval_s > 0 else 0.0
        bound = l.capacity_bps * bound_share
        rows.append({"link": l.name, "tier": l.tier, "delivered_bps": delivered, "bound_bps": bound,
                     "ratio": delivered / bound if bound else 0.0})
    return rows


def _training(workload: Any) -> dict[str, Any] | None:
    info = getattr(workload, "training", None)
    return None if info is None else dataclasses.asdict(info)


def build_result(plan: ReplayPlan, run: BackendRun, *, trace: str, routing: str) -> RunResult:
    """The one `RunResult` of both backends: per-collective times and bandwidths and composed steps from
    the calls' times, the run's description (`RunMeta`) from the plan, the rest as the backend measured it."""
    colls = collective_results(plan, run.timings)
    steps = step_results(plan, colls)
    opts = plan.options
    plan_notes = plan.notes if run.scaled else tuple(n for n in plan.notes if not n.startswith(SCALING_NOTES))
    meta = RunMeta(
        trace=trace, trace_format=plan.workload.format, workload=plan.workload.name, backend=run.backend,
        topology=plan.fabric.name, routing=routing, ranks=plan.workload.world_size, hosts=len(plan.hosts()),
        placement=opts.placement, algorithm=opts.algorithm, channels=opts.channels,
        mbps_per_gbps=plan.mbps_per_gbps, dilation=plan.dilation, bytes_scale=plan.bytes_scale,
        compute=opts.compute, repeat=opts.repeat, steps_recorded=plan.workload.steps,
        started_wall=run.timings.started_wall, duration_s=run.timings.ended_s - run.timings.started_s,
        notes=(*plan.workload.notes, *plan_notes, *run.notes), ports=opts.ports,
        training=_training(plan.workload),
    )
    return RunResult(meta, tuple(colls), tuple(steps), run.link_interval_s, run.links, run.fidelity, run.faults,
                     run.events, extra=run.extra, link_origin_emu_s=run.link_origin_emu_s)
