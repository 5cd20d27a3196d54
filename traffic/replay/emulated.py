"""The emulation's measurements as a `BackendRun` (pure): its calls' times, per-link utilisation from the
switches' port counters sampled during the run, the fidelity statement, and the faults and controller
events of the run, relative to its first collective.

- Links: utilisation of every directed switch port per sample interval, from the counters sampled
  during the run, against its emulated capacity.
- Fidelity: how idle the CPU was (below 5% idle the emulator was CPU-bound: figures then understate the
  fabric), and for the busiest links the delivered rate while busy against the goodput bound.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from traffic.replay.driver import RawRun
from traffic.replay.plan import GOODPUT_SHARE, ReplayPlan
from traffic.replay.result import busiest_links
from traffic.replay.timings import BackendRun
from traffic.results import Fidelity, LinkSeries

CPU_BOUND_IDLE_SHARE = 0.05


def emulated_run(plan: ReplayPlan, raw: RawRun, *, faults: Sequence[dict[str, Any]] = (),
                 events: Sequence[dict[str, Any]] = (), notes: tuple[str, ...] = ()) -> BackendRun:
    """`raw` (the driver's) as the emulation's `BackendRun`; `faults` with their monotonic `at_s`, `events`
    (the controller's) with their monotonic `time_s`: those of the run's window kept."""
    timings = raw.run_timings()
    interval, links = link_series(plan, raw)
    t0 = min(t.start_s for t in timings.calls)
    fl = tuple(dict(f, at_emu_s=f["at_s"] - t0) for f in faults)
    ev = tuple(dict(e, at_emu_s=e["time_s"] - t0) for e in events if raw.started_s <= e["time_s"] <= raw.ended_s)
    first_sample = next((t for t, _ in raw.samples if raw.started_s - 1.0 <= t <= raw.ended_s + 1.0), t0)
    return BackendRun("emulation", timings, interval, tuple(links), fidelity(raw, links, interval), fl, ev, notes,
                      scaled=True, link_origin_emu_s=first_sample - t0)


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
