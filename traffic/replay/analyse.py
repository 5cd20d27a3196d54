"""From a replay's raw timings to its `RunResult` (pure): real-unit durations and bandwidths per
collective, composed step timelines, per-link utilisation over time, and the fidelity statement.

- A collective's real duration is its emulated duration divided by the dilation; algbw = real bytes x
  8 / real seconds, busbw = algbw x the nccl-tests factor (`traffic.metrics`).
- Steps are composed, not slept (docs/architecture.md): each rank's recorded step is rebuilt by
  `traffic.metrics.compose_step` with the measured durations of its collectives; step, compute,
  exposed communication and idle time are measured on that timeline. A data-parallel trace mapped onto
  N ranks has N identical ranks: one timeline stands for all (rank -1). A multi-rank trace gets one row
  per rank plus the slowest rank's as rank -1. A trace without timings composes compute gaps of
  `compute_gap_us` before each collective, one after the other.
- Links: utilisation of every directed switch port per sample interval, from the counters sampled
  during the run, against its emulated capacity.
- Fidelity: how idle the CPU was (below 5% idle the emulator was CPU-bound: figures then understate the
  fabric), and for the busiest links the delivered rate while busy against the goodput bound.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from traffic import metrics
from traffic.replay.driver import RawRun
from traffic.replay.plan import GOODPUT_SHARE, ReplayPlan
from traffic.results import CollectiveResult, Fidelity, LinkSeries, RunMeta, RunResult, StepResult
from traffic.workload import Step

CPU_BOUND_IDLE_SHARE = 0.05
BUSY_UTIL = 0.05  # a link is busy in an interval above this utilisation


def collective_results(plan: ReplayPlan, raw: RawRun) -> list[CollectiveResult]:
    t_first = min(t.start_s for t in raw.timings)
    out = []
    for call, tm in zip(plan.calls, raw.timings):
        t = plan.templates[call.template]
        emu_s = max(tm.end_s - tm.start_s, 1e-9)
        real_us = emu_s / plan.dilation * 1e6
        n = len(t.ranks)
        if t.kind == "barrier" or t.size_bytes == 0:
            alg = bus = 0.0
        else:
            alg = metrics.algbw_bps(t.size_bytes, real_us / 1e6)
            bus = alg * metrics.busbw_factor(t.kind, n)
        out.append(CollectiveResult(call.id, call.step, call.repeat, t.kind, t.algorithm, t.size_bytes, t.emu_bytes, n,
                                    call.stream, t.transfer_count, tm.start_s - t_first, emu_s, real_us, alg, bus))
    return out


def _compose(step: Step, durations_us: list[float], timed: bool, gap_us: float) -> metrics.StepTimes:
    if timed and step.duration_us is not None:
        return metrics.step_times(metrics.compose_step(step, durations_us))
    comm = sum(durations_us)
    compute = gap_us * len(durations_us)
    return metrics.StepTimes(compute + comm, compute, comm, 0.0)


def step_results(plan: ReplayPlan, colls: list[CollectiveResult]) -> list[StepResult]:
    wl = plan.workload
    mapped = len({tuple(r.steps) for r in wl.ranks}) == 1  # identical ranks: one timeline for all
    # (repeat, step index, rank) -> {index in the rank's step: measured real duration}
    measured: dict[tuple[int, int, int], dict[int, float]] = defaultdict(dict)
    for call, res in zip(plan.calls, colls):
        for rank, i in call.rank_index:
            measured[(call.repeat, call.step_index, rank)][i] = res.duration_real_us
    out = []
    for rep in range(plan.options.repeat):
        for s in range(wl.steps):
            rows = []
            for rt in (wl.ranks[:1] if mapped else wl.ranks):
                if s >= len(rt.steps):
                    continue
                step = rt.steps[s]
                got = measured[(rep, s, rt.rank)]
                durations = [got.get(i, c.duration_us or 0.0) for i, c in enumerate(step.collectives)]
                times = _compose(step, durations, wl.timed, plan.options.compute_gap_us)
                metrics.check_step_identity(times, tolerance_us=1e-3 * max(1.0, times.step_us))
                rows.append(StepResult(step.number, rep, -1 if mapped else rt.rank, times.step_us, times.compute_us,
                                       times.exposed_comm_us, times.idle_us, step.duration_us))
            out.extend(rows)
            if not mapped and rows:
                slow = max(rows, key=lambda r: r.step_us)
                out.append(StepResult(slow.step, rep, -1, slow.step_us, slow.compute_us, slow.exposed_comm_us,
                                      slow.idle_us, slow.recorded_step_us))
    return out


def link_series(plan: ReplayPlan, raw: RawRun) -> tuple[float, list[LinkSeries]]:
    samples = [(t, c) for t, c in raw.samples if raw.started_s - 1.0 <= t <= raw.ended_s + 1.0]
    fab = plan.fabric
    if len(samples) < 2:
        return 0.0, []
    interval = (samples[-1][0] - samples[0][0]) / (len(samples) - 1)
    out = []
    for link in fab.links:
        for end, other in ((link.a, link.b), (link.b, link.a)):
            if end.node not in fab.switch_by_name:
                continue
            key = (end.node, end.port)
            cap = link.rate_gbps * plan.mbps_per_gbps * 1e6
            got = [c.get(key) for _, c in samples]
            values = [v for v in got if v is not None]
            if len(values) != len(got):
                continue
            util = tuple(max(0.0, (b - a) * 8 / (t1 - t0) / cap) if t1 > t0 else 0.0
                         for (t0, _), (t1, _), a, b in zip(samples, samples[1:], values, values[1:]))
            tier = "host" if other.node in fab.host_by_name else "fabric"
            out.append(LinkSeries(end.node, end.port, other.node, cap, tier, fab.switch_by_name[end.node].plane,
                                  int(values[-1] - values[0]), util))
    return interval, out


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


def fidelity(raw: RawRun, links: list[LinkSeries], interval_s: float) -> Fidelity:
    warnings = []
    cpu_bound = raw.cpu_idle_share < CPU_BOUND_IDLE_SHARE
    rows = busiest_links(links, interval_s, GOODPUT_SHARE)
    if cpu_bound:
        warnings.append(f"CPU-bound: the machine was {raw.cpu_idle_share:.1%} idle during the replay; the emulated "
                        "datapath may have lagged its link rates, so times are upper bounds")
    if rows and max(r["ratio"] for r in rows) < 0.5:
        warnings.append("no link came within half of its goodput bound while busy: the collectives were "
                        "latency-bound at this dilation (raise --dilation)")
    return Fidelity(raw.cpu_idle_share, cpu_bound, tuple(rows), tuple(warnings))


def build_result(plan: ReplayPlan, raw: RawRun, *, trace: str, topology: str, routing: str,
                 faults: list[dict[str, Any]] | None = None, events: list[dict[str, Any]] | None = None,
                 extra_notes: tuple[str, ...] = ()) -> RunResult:
    colls = collective_results(plan, raw)
    steps = step_results(plan, colls)
    interval, links = link_series(plan, raw)
    opts = plan.options
    meta = RunMeta(
        trace=trace, trace_format=plan.workload.format, workload=plan.workload.name, backend="emulation",
        topology=topology, routing=routing, ranks=plan.workload.world_size, hosts=len(plan.hosts()),
        placement=opts.placement, algorithm=opts.algorithm, channels=opts.channels,
        mbps_per_gbps=plan.mbps_per_gbps, dilation=plan.dilation, bytes_scale=plan.bytes_scale,
        compute=opts.compute, repeat=opts.repeat, steps_recorded=plan.workload.steps,
        started_wall=raw.started_wall, duration_s=raw.ended_s - raw.started_s,
        notes=tuple(plan.workload.notes) + tuple(plan.notes) + extra_notes, ports=opts.ports,
    )
    t0 = min(t.start_s for t in raw.timings)
    fl = [dict(f, at_emu_s=f["at_s"] - t0) for f in (faults or [])]
    ev = [dict(e, at_emu_s=e["time_s"] - t0) for e in (events or []) if raw.started_s <= e["time_s"] <= raw.ended_s]
    t_first = min(t.start_s for t in raw.timings)
    first_sample = next((t for t, _ in raw.samples if raw.started_s - 1.0 <= t <= raw.ended_s + 1.0), t_first)
    return RunResult(meta, tuple(colls), tuple(steps), interval, tuple(links), fidelity(raw, links, interval),
                     tuple(fl), tuple(ev), link_origin_emu_s=first_sample - t_first)
