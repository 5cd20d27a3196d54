"""The plain-text renderings of a report, for the CLI: `format_summary`, `format_comparison`, and the
report's values in their units (a comparison value by its unit, a fault's or event's value by its key),
which the HTML pages use too. Single numbers are formatted by `traffic.formatting`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from traffic.formatting import NA, format_bps, format_bytes, format_ratio, format_share, format_us
from traffic.report.summary import Comparison, KindSummary, RunSummary, _link_note


# --- numbers with units -------------------------------------------------------------------------------

def _fmt_unit(unit: str, v: float | None) -> str:
    """A comparison value in its unit."""
    if unit == "count":
        return NA if v is None else f"{v:.0f}"
    return {"us": format_us, "bps": format_bps, "share": format_share}[unit](v)


def _fmt_keyed(key: str, v: Any, dilation: float) -> str:
    """A value of a fault or controller event, in the unit its key names (`_emu_s`, `_us`, `_bps`, ...)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if key.endswith("_emu_s"):
        real = f" = {format_us(v / dilation * 1e6)} real" if dilation > 0 else ""
        return f"{v:.3f} s emulated{real}"
    for suffix, fmt in (("_us", format_us), ("_bps", format_bps), ("_bytes", format_bytes)):
        if key.endswith(suffix):
            return fmt(v)
    return f"{v:.3f} s" if key.endswith("_s") else f"{v:g}"


# --- plain text (the CLI) -----------------------------------------------------------------------------

def _align(rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to a common width: the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def format_summary(s: RunSummary) -> str:
    """The summary as aligned plain text."""
    lines = [f"run          {s.label}: {s.workload} ({s.trace}), {s.ranks} ranks, {s.backend}",
             f"time         dilation {s.dilation:g} (emulated/real), link scale {s.mbps_per_gbps:g} Mbit/s per "
             f"Gbit/s, compute {s.compute}",
             f"fidelity     {'CPU-BOUND' if s.cpu_bound else 'not CPU-bound'} "
             f"(CPU idle {format_share(s.cpu_idle_share)})" if s.backend != "flowsim" else
             "fidelity     simulated: a fluid model, no datapath (the run's notes state what is modelled)"]
    p = s.step_time_us
    if p is None:
        lines.append("steps        none recorded")
    else:
        lines.append(f"steps        n={p.n}  mean {format_us(p.mean)}  p50 {format_us(p.p50)}  p99 {format_us(p.p99)}  "
                     f"p999 {format_us(p.p999)}  max {format_us(p.max)}")
        lines.append(f"             utilisation {format_share(s.utilisation_mean)} mean, "
                     f"{format_share(s.utilisation_pooled)} pooled; communication share "
                     f"{format_share(s.comm_share_mean)} mean, {format_share(s.comm_share_pooled)} pooled")
    if s.mfu is not None:
        lines.append(f"mfu          {format_share(s.mfu)} at the mean step (model FLOPs per step / (step time x peak x "
                     "GPUs); the compute model is in the run's notes)")
    if s.kinds:
        table = [["kind", "count", "bytes", "p50", "p99", "p999", "algbw", "busbw", "busbw largest class"]]
        table += [[k.kind, str(k.count), format_bytes(k.total_bytes), format_us(k.latency_us.p50),
                   format_us(k.latency_us.p99), format_us(k.latency_us.p999), format_bps(k.mean_algbw_bps),
                   format_bps(k.mean_busbw_bps), _largest_class_text(k)] for k in s.kinds]
        lines += ["", *_align(table), ""]
    for link in s.hottest_by_tier:
        label = f"hottest {link.tier}"
        lines.append(f"{label:<12} {_link_note(link)}: {format_share(link.active_util)} while collectives ran")
    if s.hottest_link is None:
        lines.append("hottest      no link sample overlapped a collective")
    if s.faults or s.controller_events:
        lines.append(f"faults       {s.faults} injected, {s.controller_events} controller events")
    lines += [f"warning      {w}" for w in s.fidelity_warnings]
    lines += [f"check        {c}" for c in s.checks]
    return "\n".join(lines)


def _largest_class_text(k: KindSummary) -> str:
    if k.largest_class_bytes is None:
        return NA
    return (f"{format_bps(k.largest_class_busbw_bps)} ({k.largest_class_count} x "
            f">= {format_bytes(k.largest_class_bytes)})")


def format_comparison(c: Comparison) -> str:
    """The comparison as aligned plain text: one row per metric, a, b and b / a."""
    head = [f"a  {c.a.label}: {c.a.workload}, {c.a.ranks} ranks, {c.a.backend}, dilation {c.a.dilation:g}",
            f"b  {c.b.label}: {c.b.workload}, {c.b.ranks} ranks, {c.b.backend}, dilation {c.b.dilation:g}", ""]
    table = [[r.metric, _fmt_unit(r.unit, r.a), _fmt_unit(r.unit, r.b), format_ratio(r.ratio)] for r in c.rows]
    notes = [f"{r.metric}: a {r.a_note or NA}; b {r.b_note or NA}" for r in c.rows if r.a_note or r.b_note]
    return "\n".join(head + _align([["metric", "a", "b", "b/a"], *table]) + [""] + notes
                     + [f"warning  {w}" for w in c.warnings])
