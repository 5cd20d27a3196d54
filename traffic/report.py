"""The report of a run: its summary, its files, and two runs side by side.

- `summarize(result) -> RunSummary`: step-time tails, per collective kind counts, bytes, latency tails and
  bandwidths, utilisation and communication share, the hottest link, fidelity, and what the report found
  inconsistent in the record (`checks`).
- `write_report(result, out_dir)`: `summary.json`, `collectives.csv`, `steps.csv`, `links.csv`, three PNG
  plots and one self-contained `report.html` (images inlined as data URIs, no external CSS, JS or links).
- `compare(a, b) -> Comparison`, `write_comparison(a, b, out_dir)`: `comparison.json`, `comparison.html`.
- `format_summary`, `format_comparison`: plain-text renderings for the CLI (the only CLI formatting here).

The metrics themselves are `traffic.metrics`' (nearest-rank `percentiles`, `busbw_factor`, the step identity);
this module only chooses the samples:
- A step's time, where several ranks were composed, is the slowest rank's: per (step, repeat) the row with
  rank -1 where the record has one, else the row with the longest `step_us` (`slowest_steps`). Step tails,
  utilisation and communication share are over those rows; "pooled" is sum(compute) / sum(step) (and
  sum(exposed) / sum(step)), "mean" the mean of the per-step ratios.
- A collective's latency is its `duration_real_us`. Bandwidth means are over the collectives that moved
  data (a barrier has none). A size class is a power-of-two bucket [2^k, 2^(k+1)) bytes; the busbw of the
  largest size class is the mean busbw of the kind's collectives in its largest bucket (nccl-tests'
  headline figure is the bus bandwidth at large sizes).
- Link sample i covers `link_origin_emu_s` + [i, i + 1) x `link_interval_s` emulated seconds on the time
  axis of `CollectiveResult.start_emu_s` (0 = the run's first collective). A link's utilisation "while collectives ran" is the mean
  of its samples, each weighted by the emulated time in it during which at least one collective ran; the
  hottest link is the link with the highest such mean (ties: the first name).

Plots are drawn on `matplotlib.figure.Figure` objects rendered by the Agg canvas: no pyplot, no global
backend switch, no display; matplotlib is imported only when plotting.
"""
from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fabric.errors import UnsupportedError
from traffic.metrics import (MetricError, Percentiles, StepTimes, algbw_bps, busbw_factor, check_step_identity,
                             percentiles)
from traffic.results import CollectiveResult, Fidelity, LinkSeries, RunMeta, RunResult, StepResult
from traffic.formatting import NA, TIME_UNITS, format_bps, format_bytes, format_ratio, format_share, format_us
from traffic.workload import KINDS, merge_intervals

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: A step row breaks step = compute + exposed + idle when off by more than this (1 ns).
IDENTITY_TOLERANCE_US = 1e-3
#: Recorded algbw/busbw agree with the definitions when within this relative tolerance.
BANDWIDTH_RTOL = 1e-6
#: Links listed in report.html (all of them are in links.csv).
LINKS_SHOWN = 10
_DPI = 100
_TIER_ORDER = {"host": 0, "fabric": 1}
_COLOURS = {"compute": "#4c72b0", "exposed": "#dd8452", "idle": "#c7c7c7"}


# --- records ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KindSummary:
    """One collective kind over the whole run (real units)."""

    kind: str
    count: int
    total_bytes: int
    latency_us: Percentiles  # of duration_real_us, with the sample count
    mean_algbw_bps: float | None  # over the collectives that moved data; None if none did (barrier)
    mean_busbw_bps: float | None
    largest_class_bytes: int | None  # lower bound of the largest power-of-two size class: [b, 2b)
    largest_class_count: int
    largest_class_busbw_bps: float | None  # mean busbw of the collectives in that class


@dataclass(frozen=True)
class LinkStats:
    """One directed link over the replay; utilisations are 0..1 of its emulated capacity."""

    name: str
    switch: str
    port: int
    peer: str
    tier: str  # "host" or "fabric"
    plane: str
    capacity_bps: float  # emulated
    bytes: int
    samples: int
    mean_util: float | None  # over all samples; None without samples
    max_util: float | None
    active_util: float | None  # while any collective ran (time-weighted); None if no sample overlapped one


@dataclass(frozen=True)
class RunSummary:
    label: str  # "topology / routing"
    workload: str
    trace: str
    backend: str
    topology: str
    routing: str
    ranks: int
    compute: str  # "composed" or "slept"
    dilation: float  # emulated time / real time
    mbps_per_gbps: float  # link scale
    bytes_scale: float
    step_time_us: Percentiles | None  # over `slowest_steps`; None without steps
    utilisation_mean: float | None  # mean of compute / step
    utilisation_pooled: float | None  # sum(compute) / sum(step)
    comm_share_mean: float | None  # mean of exposed communication / step
    comm_share_pooled: float | None  # sum(exposed) / sum(step)
    identity_max_residual_us: float | None  # max |step - (compute + exposed + idle)| over all step rows
    collectives: int
    kinds: tuple[KindSummary, ...]  # in `traffic.workload.KINDS` order
    hottest_link: LinkStats | None
    hottest_by_tier: tuple[LinkStats, ...]  # the hottest host link, the hottest fabric link, ...
    faults: int  # injected during the run
    controller_events: int
    cpu_bound: bool
    cpu_idle_share: float
    fidelity_warnings: tuple[str, ...]
    checks: tuple[str, ...]  # what the report found inconsistent in the record

    def kind(self, kind: str) -> KindSummary | None:
        return next((k for k in self.kinds if k.kind == kind), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ComparisonRow:
    metric: str
    unit: str  # "us", "bps", "share" (0..1) or "count"
    a: float | None
    b: float | None
    ratio: float | None  # b / a; None where either is missing or a is 0
    a_note: str = ""  # e.g. the hottest link's name
    b_note: str = ""


@dataclass(frozen=True)
class Comparison:
    a: RunSummary
    b: RunSummary
    rows: tuple[ComparisonRow, ...]
    warnings: tuple[str, ...]  # where the two runs replayed different things

    def row(self, metric: str) -> ComparisonRow:
        for r in self.rows:
            if r.metric == metric:
                return r
        raise KeyError(f"no comparison row {metric!r}; rows: {', '.join(r.metric for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- summary ------------------------------------------------------------------------------------------

def slowest_steps(steps: Sequence[StepResult]) -> tuple[StepResult, ...]:
    """One row per (repeat, step), in replay order: the rank -1 row where there is one, else the slowest."""
    groups: dict[tuple[int, int], list[StepResult]] = {}
    for s in steps:
        groups.setdefault((s.repeat, s.step), []).append(s)
    chosen = []
    for key in sorted(groups):
        rows = groups[key]
        composed = [r for r in rows if r.rank == -1]
        chosen.append(max(composed or rows, key=lambda r: r.step_us))
    return tuple(chosen)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _size_class(size_bytes: int) -> int:
    """The lower bound of the power-of-two class [2^k, 2^(k+1)) holding size_bytes (> 0)."""
    return 1 << (size_bytes.bit_length() - 1)


def _kind_summary(kind: str, colls: Sequence[CollectiveResult]) -> KindSummary:
    moved = [c for c in colls if c.size_bytes > 0]
    top = max((_size_class(c.size_bytes) for c in moved), default=None)
    largest = [c for c in moved if top is not None and _size_class(c.size_bytes) == top]
    return KindSummary(kind=kind, count=len(colls), total_bytes=sum(c.size_bytes for c in colls),
                       latency_us=percentiles([c.duration_real_us for c in colls]),
                       mean_algbw_bps=_mean([c.algbw_bps for c in moved]),
                       mean_busbw_bps=_mean([c.busbw_bps for c in moved]),
                       largest_class_bytes=top, largest_class_count=len(largest),
                       largest_class_busbw_bps=_mean([c.busbw_bps for c in largest]))


def _kind_order(kind: str) -> tuple[int, str]:
    return (KINDS.index(kind) if kind in KINDS else len(KINDS), kind)


def _by_kind(colls: Iterable[CollectiveResult]) -> dict[str, list[CollectiveResult]]:
    out: dict[str, list[CollectiveResult]] = {}
    for c in colls:
        out.setdefault(c.kind, []).append(c)
    return {k: out[k] for k in sorted(out, key=_kind_order)}


def _active_weights_s(colls: Sequence[CollectiveResult], interval_s: float, samples: int,
                      origin_s: float = 0.0) -> list[float]:
    """Per link sample, the emulated seconds of it during which at least one collective was running
    (sample i covers origin_s + [i, i + 1) x interval_s, on the collectives' time axis)."""
    weights = [0.0] * samples
    if interval_s <= 0:
        return weights
    for a, b in merge_intervals((c.start_emu_s - origin_s, c.start_emu_s + c.duration_emu_s - origin_s)
                                for c in colls):
        for i in range(max(int(a // interval_s), 0), min(math.ceil(b / interval_s), samples)):
            weights[i] += max(0.0, min(b, (i + 1) * interval_s) - max(a, i * interval_s))
    return weights


def _link_stats(link: LinkSeries, weights: Sequence[float]) -> LinkStats:
    w = weights[:len(link.util)]
    active = _ratio(math.fsum(u * x for u, x in zip(link.util, w)), math.fsum(w))
    return LinkStats(name=link.name, switch=link.switch, port=link.port, peer=link.peer, tier=link.tier,
                     plane=link.plane, capacity_bps=link.capacity_bps, bytes=link.emu_bytes, samples=len(link.util),
                     mean_util=_mean(link.util), max_util=max(link.util, default=None), active_util=active)


def link_stats(result: RunResult) -> tuple[LinkStats, ...]:
    """Every link's bytes and utilisation (mean, max, while collectives ran), in the record's order."""
    samples = max((len(link.util) for link in result.links), default=0)
    weights = _active_weights_s(result.collectives, result.link_interval_s, samples, result.link_origin_emu_s)
    return tuple(_link_stats(link, weights) for link in result.links)


def _hottest(stats: Iterable[LinkStats]) -> LinkStats | None:
    ranked = sorted((s for s in stats if s.active_util is not None), key=lambda s: (-(s.active_util or 0.0), s.name))
    return ranked[0] if ranked else None


def _hottest_by_tier(stats: Sequence[LinkStats]) -> tuple[LinkStats, ...]:
    tiers = sorted({s.tier for s in stats}, key=lambda t: (_TIER_ORDER.get(t, len(_TIER_ORDER)), t))
    hot = (_hottest(s for s in stats if s.tier == t) for t in tiers)
    return tuple(h for h in hot if h is not None)


def _identity_checks(steps: Sequence[StepResult]) -> tuple[float | None, list[str]]:
    """The largest step-identity residual over all step rows, and a finding if any row breaks it."""
    broken: list[str] = []
    worst: float | None = None
    for s in steps:
        times = StepTimes(step_us=s.step_us, compute_us=s.compute_us, exposed_comm_us=s.exposed_comm_us,
                          idle_us=s.idle_us)
        worst = max(worst or 0.0, abs(times.identity_residual_us))
        try:
            check_step_identity(times, IDENTITY_TOLERANCE_US)
        except MetricError as e:
            broken.append(f"step {s.step} repeat {s.repeat} rank {s.rank}: {e}")
    if not broken:
        return worst, []
    return worst, [f"step = compute + exposed communication + idle fails in {len(broken)} of {len(steps)} "
                   f"step rows; first: {broken[0]}"]


def _close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=BANDWIDTH_RTOL, abs_tol=1e-9)


def _bandwidth_checks(colls: Sequence[CollectiveResult]) -> list[str]:
    """Kinds whose recorded algbw/busbw differ from `traffic.metrics`' definitions (real size and time)."""
    findings: list[str] = []
    for kind, cs in _by_kind(colls).items():
        checked = [c for c in cs if c.size_bytes > 0 and c.duration_real_us > 0]
        try:
            off = [c for c in checked
                   if not (_close(c.algbw_bps, alg := algbw_bps(c.size_bytes, c.duration_real_us / 1e6))
                           and _close(c.busbw_bps, alg * busbw_factor(kind, c.group_size)))]
        except MetricError as e:
            findings.append(f"{kind}: bandwidth not checked: {e}")
            continue
        if off:
            c = off[0]
            findings.append(f"{kind}: {len(off)} of {len(checked)} collectives record algbw/busbw that differ from "
                            f"size x 8 / duration_real_us x busbw_factor; first: index {c.index}, "
                            f"{c.algbw_bps:g} / {c.busbw_bps:g} bit/s")
    return findings


def _meta_checks(result: RunResult) -> list[str]:
    """Run parameters the report cannot use as given."""
    findings = []
    if not result.meta.dilation > 0:
        findings.append(f"dilation is {result.meta.dilation:g}, not > 0: link times are shown as emulated")
    if result.links and not result.link_interval_s > 0:
        findings.append(f"link_interval_s is {result.link_interval_s:g}, not > 0: no link is rated while "
                        "collectives ran")
    return findings


def summarize(result: RunResult) -> RunSummary:
    """The run's summary (see the module docstring for which samples each figure is over)."""
    meta, fid = result.meta, result.fidelity
    rows = slowest_steps(result.steps)
    step_sum = math.fsum(r.step_us for r in rows)
    residual, identity = _identity_checks(result.steps)
    stats = link_stats(result)
    return RunSummary(
        label=f"{meta.topology} / {meta.routing}", workload=meta.workload, trace=meta.trace, backend=meta.backend,
        topology=meta.topology, routing=meta.routing, ranks=meta.ranks, compute=meta.compute,
        dilation=meta.dilation, mbps_per_gbps=meta.mbps_per_gbps, bytes_scale=meta.bytes_scale,
        step_time_us=percentiles([r.step_us for r in rows]) if rows else None,
        utilisation_mean=_mean([r.utilisation for r in rows]),
        utilisation_pooled=_ratio(math.fsum(r.compute_us for r in rows), step_sum),
        comm_share_mean=_mean([r.comm_share for r in rows]),
        comm_share_pooled=_ratio(math.fsum(r.exposed_comm_us for r in rows), step_sum),
        identity_max_residual_us=residual, collectives=len(result.collectives),
        kinds=tuple(_kind_summary(k, cs) for k, cs in _by_kind(result.collectives).items()),
        hottest_link=_hottest(stats), hottest_by_tier=_hottest_by_tier(stats),
        faults=len(result.faults), controller_events=len(result.events),
        cpu_bound=fid.cpu_bound, cpu_idle_share=fid.cpu_idle_share, fidelity_warnings=fid.warnings,
        checks=tuple(identity + _bandwidth_checks(result.collectives) + _meta_checks(result)))


# --- comparison ---------------------------------------------------------------------------------------

def _row(metric: str, unit: str, a: float | None, b: float | None, a_note: str = "", b_note: str = "") -> ComparisonRow:
    ratio = b / a if a is not None and b is not None and a != 0 else None
    return ComparisonRow(metric, unit, a, b, ratio, a_note, b_note)


def _pct(p: Percentiles | None, name: str) -> float | None:
    return None if p is None else float(getattr(p, name))


def _kind_rows(sa: RunSummary, sb: RunSummary) -> list[ComparisonRow]:
    kinds = sorted({k.kind for k in sa.kinds} | {k.kind for k in sb.kinds}, key=_kind_order)
    rows = []
    for kind in kinds:
        ka, kb = sa.kind(kind), sb.kind(kind)
        for metric, attr in ((f"busbw {kind}", "mean_busbw_bps"),
                             (f"busbw {kind}, largest size class", "largest_class_busbw_bps")):
            va = getattr(ka, attr) if ka else None
            vb = getattr(kb, attr) if kb else None
            if va is not None or vb is not None:
                rows.append(_row(metric, "bps", va, vb))
    return rows


def _active_util(link: LinkStats | None) -> float | None:
    return None if link is None else link.active_util


def _link_note(link: LinkStats | None) -> str:
    return "" if link is None else f"{link.name} ({link.tier}, plane {link.plane})"


def _differences(a: RunMeta, b: RunMeta) -> list[str]:
    """What the two runs replayed differently (worth a warning: the numbers may not be comparable)."""
    out = []
    for name in ("trace", "workload", "ranks", "compute", "repeat", "steps_recorded", "backend"):
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            out.append(f"the runs differ in {name}: {va!r} (a) vs {vb!r} (b)")
    return out


def compare(a: RunResult, b: RunResult) -> Comparison:
    """Run b against run a, metric by metric, with the ratio b / a."""
    sa, sb = summarize(a), summarize(b)
    rows = [_row("step time mean", "us", _pct(sa.step_time_us, "mean"), _pct(sb.step_time_us, "mean")),
            _row("step time p99", "us", _pct(sa.step_time_us, "p99"), _pct(sb.step_time_us, "p99")),
            *_kind_rows(sa, sb),
            _row("communication share", "share", sa.comm_share_mean, sb.comm_share_mean),
            _row("hottest link utilisation", "share", _active_util(sa.hottest_link), _active_util(sb.hottest_link),
                 _link_note(sa.hottest_link), _link_note(sb.hottest_link)),
            *([_row("CPU idle", "share", sa.cpu_idle_share, sb.cpu_idle_share,
                    "CPU-bound" if sa.cpu_bound else "not CPU-bound", "CPU-bound" if sb.cpu_bound else "not CPU-bound")]
              if "emulation" in (sa.backend, sb.backend) else []),  # a simulation runs no datapath
            _row("fidelity warnings", "count", float(len(sa.fidelity_warnings)), float(len(sb.fidelity_warnings)))]
    return Comparison(a=sa, b=sb, rows=tuple(rows), warnings=tuple(_differences(a.meta, b.meta)))


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


# --- files --------------------------------------------------------------------------------------------

def _cell(v: Any) -> str:
    return "" if v is None else str(int(v)) if isinstance(v, bool) else str(v)


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows([_cell(v) for v in row] for row in rows)
    return path


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    return path


def _collectives_csv(path: Path, colls: Sequence[CollectiveResult]) -> Path:
    names = [f.name for f in fields(CollectiveResult)]
    return _write_csv(path, names, ([getattr(c, n) for n in names] for c in sorted(colls, key=lambda c: c.index)))


def _steps_csv(path: Path, steps: Sequence[StepResult]) -> Path:
    """Every step row, with its utilisation and communication share, and `slowest` = 1 on the rows the
    summary is over."""
    names = [f.name for f in fields(StepResult)]
    used = {id(s) for s in slowest_steps(steps)}
    ordered = sorted(steps, key=lambda s: (s.repeat, s.step, s.rank))
    return _write_csv(path, names + ["utilisation", "comm_share", "slowest"],
                      ([getattr(s, n) for n in names] + [s.utilisation, s.comm_share, id(s) in used] for s in ordered))


def _links_csv(path: Path, stats: Sequence[LinkStats]) -> Path:
    names = [f.name for f in fields(LinkStats)]
    return _write_csv(path, names, ([getattr(s, n) for n in names] for s in stats))


def write_report(result: RunResult, out_dir: Path) -> list[Path]:
    """Write the run's report into out_dir (created if missing); return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(result)
    stats = link_stats(result)
    plots = _run_plots(result)
    paths = [_write_json(out_dir / "summary.json", summary.to_dict()),
             _collectives_csv(out_dir / "collectives.csv", result.collectives),
             _steps_csv(out_dir / "steps.csv", result.steps),
             _links_csv(out_dir / "links.csv", stats)]
    for name, png in plots.items():
        (out_dir / name).write_bytes(png)
        paths.append(out_dir / name)
    page = out_dir / "report.html"
    page.write_text(_report_html(result, summary, stats, plots), encoding="utf-8")
    return paths + [page]


def write_comparison(a: RunResult, b: RunResult, out_dir: Path) -> list[Path]:
    """Write `comparison.json` and `comparison.html` (both runs' plots side by side) into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    c = compare(a, b)
    rows_a, rows_b = slowest_steps(a.steps), slowest_steps(b.steps)
    step_max = max([_step_top_us(r) for r in rows_a + rows_b], default=None)
    lat_range = _positive_range([x.duration_real_us for x in a.collectives + b.collectives])
    plots_a = _run_plots(a, step_max, lat_range, title_prefix="a: ")
    plots_b = _run_plots(b, step_max, lat_range, title_prefix="b: ")
    json_path = _write_json(out_dir / "comparison.json", c.to_dict())
    page = out_dir / "comparison.html"
    page.write_text(_comparison_html(a, b, c, plots_a, plots_b), encoding="utf-8")
    return [json_path, page]


# --- plots --------------------------------------------------------------------------------------------

def _new_figure(width_in: float, height_in: float) -> Figure:
    try:
        import matplotlib.figure as mfigure
    except ImportError as e:
        raise UnsupportedError(f"the report's plots need matplotlib (pip install matplotlib): {e}") from None
    return mfigure.Figure(figsize=(width_in, height_in), layout="constrained")


def _png(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg), without the software tag: the page must hold no links."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def _no_data(ax: Axes, title: str, message: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _time_unit(max_us: float) -> tuple[float, str]:
    """(divisor, unit) for an axis of real times up to max_us."""
    return next(((f, u) for f, u in TIME_UNITS if max_us >= f), TIME_UNITS[-1])


def _step_top_us(r: StepResult) -> float:
    return max(r.step_us, r.compute_us + r.exposed_comm_us + r.idle_us, r.recorded_step_us or 0.0)


def _positive_range(values: Iterable[float]) -> tuple[float, float] | None:
    pos = [v for v in values if v > 0]
    return (min(pos), max(pos)) if pos else None


def _plot_step_times(rows: Sequence[StepResult], title: str, top_us: float | None = None) -> bytes:
    """Stacked bars per (step, repeat): compute, exposed communication, idle; the trace's own step time."""
    fig = _new_figure(8.0, 3.8)
    ax = fig.add_subplot()
    if not rows:
        _no_data(ax, title, "no steps recorded")
        return _png(fig)
    top = top_us or max(_step_top_us(r) for r in rows)
    scale, unit = _time_unit(top)
    x = list(range(len(rows)))
    compute = [r.compute_us / scale for r in rows]
    exposed = [r.exposed_comm_us / scale for r in rows]
    idle = [r.idle_us / scale for r in rows]
    ax.bar(x, compute, color=_COLOURS["compute"], label="compute")
    ax.bar(x, exposed, bottom=compute, color=_COLOURS["exposed"], label="exposed communication")
    ax.bar(x, idle, bottom=[c + e for c, e in zip(compute, exposed)], color=_COLOURS["idle"], label="idle")
    recorded = [(i, r.recorded_step_us / scale) for i, r in enumerate(rows) if r.recorded_step_us is not None]
    if recorded:
        ax.scatter([i for i, _ in recorded], [v for _, v in recorded], marker="_", s=300, color="black",
                   label="trace's own step time")
    if len(rows) <= 30:
        ax.set_xticks(x, [f"{r.step}/{r.repeat}" for r in rows], fontsize="small")
    ax.set_ylim(0, top / scale * 1.25)
    ax.set_xlabel("step / repeat, in replay order (slowest rank)")
    ax.set_ylabel(f"real time ({unit})")
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper right", ncols=2)
    return _png(fig)


def _plot_latency_cdf(colls: Sequence[CollectiveResult], title: str,
                      x_range_us: tuple[float, float] | None = None) -> bytes:
    """The empirical CDF of duration_real_us per collective kind, log x."""
    fig = _new_figure(8.0, 3.8)
    ax = fig.add_subplot()
    curves = {k: sorted(c.duration_real_us for c in cs if c.duration_real_us > 0) for k, cs in _by_kind(colls).items()}
    curves = {k: xs for k, xs in curves.items() if xs}
    if not curves:
        _no_data(ax, title, "no collective with a positive duration")
        return _png(fig)
    for kind, xs in curves.items():
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step([xs[0], *xs], [0.0, *ys], where="post", label=f"{kind} (n = {len(xs)})")
    ax.set_xscale("log")
    lo, hi = x_range_us or _positive_range(x for xs in curves.values() for x in xs) or (1.0, 10.0)
    ax.set_xlim(lo / 1.5, hi * 1.5)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("collective latency, real µs (log scale)")
    ax.set_ylabel("fraction of collectives ≤ x")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize="small", loc="lower right")
    return _png(fig)


def _link_group(link: LinkSeries) -> str:
    return f"{link.tier} {link.plane}"


def _link_order(link: LinkSeries) -> tuple[int, str, str, str, int, str]:
    return (_TIER_ORDER.get(link.tier, len(_TIER_ORDER)), link.tier, link.plane, link.switch, link.port, link.peer)


def _plot_link_utilisation(result: RunResult, title: str) -> bytes:
    """A heat map: links on y grouped by tier and plane, real time on x, utilisation 0..1 as colour; faults
    as dashed red lines."""
    links = sorted(result.links, key=_link_order)
    samples = max((len(link.util) for link in links), default=0)
    fig = _new_figure(9.0, min(max(2.8, 0.16 * len(links) + 1.8), 16.0))
    ax = fig.add_subplot()
    if samples == 0:
        _no_data(ax, title, "no link utilisation recorded")
        return _png(fig)
    dilation = result.meta.dilation if result.meta.dilation > 0 else 1.0
    ms_per_emu_s = 1e3 / dilation
    width_ms = samples * result.link_interval_s * ms_per_emu_s
    grid = [list(link.util) + [math.nan] * (samples - len(link.util)) for link in links]
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=1.0,
                   extent=(0.0, width_ms if width_ms > 0 else float(samples), len(links), 0.0))
    fig.colorbar(im, ax=ax, label="utilisation (0..1 of capacity)")
    _label_link_groups(ax, links)
    faults = [f for f in result.faults if isinstance(f.get("at_emu_s"), (int, float))]
    for i, f in enumerate(faults):
        ax.axvline(float(f["at_emu_s"]) * ms_per_emu_s, color="red", linestyle="--", linewidth=1.2,
                   label="fault" if i == 0 else None)
    if faults:
        ax.legend(fontsize="small", loc="upper right")
    ax.set_xlabel(f"real time since the first collective (ms) = emulated s / dilation {dilation:g}")
    ax.set_title(title)
    return _png(fig)


def _label_link_groups(ax: Axes, links: Sequence[LinkSeries]) -> None:
    """Separators between tier/plane groups; link names on y when few enough, else group names."""
    bounds = [i for i in range(1, len(links)) if _link_group(links[i]) != _link_group(links[i - 1])]
    for i in bounds:
        ax.axhline(i, color="white", linewidth=1.5)
    if len(links) <= 48:
        ax.set_yticks([i + 0.5 for i in range(len(links))],
                      [f"[{_link_group(link)}] {link.name}" for link in links], fontsize=8 if len(links) <= 16 else 6)
    else:
        starts = [0, *bounds]
        ends = [*bounds, len(links)]
        ax.set_yticks([(s + e) / 2 for s, e in zip(starts, ends)], [_link_group(links[s]) for s in starts])
    ax.set_ylabel("link (tier, plane)")


def _run_plots(result: RunResult, step_top_us: float | None = None, latency_range_us: tuple[float, float] | None = None,
               title_prefix: str = "") -> dict[str, bytes]:
    """The three plots of a run, by file name."""
    label = f"{title_prefix}{result.meta.topology} / {result.meta.routing}"
    return {"step_times.png": _plot_step_times(slowest_steps(result.steps), f"{label}: step time", step_top_us),
            "collective_latency_cdf.png": _plot_latency_cdf(result.collectives, f"{label}: collective latency CDF",
                                                            latency_range_us),
            "link_utilisation.png": _plot_link_utilisation(result, f"{label}: link utilisation")}


# --- html ---------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.4em 0 1.4em; }
th, td { border: 1px solid #ccc; padding: 3px 9px; text-align: right; vertical-align: top; }
th { background: #f2f2f2; }
td.l, th.l { text-align: left; }
.banner { padding: 0.8em 1em; border-radius: 4px; margin: 1em 0; font-weight: 600; }
.ok { background: #e6f4ea; border: 1px solid #5a5; }
.bad { background: #fdecea; border: 1px solid #c44; }
.warn { background: #fff4e5; border: 1px solid #e9a23b; font-weight: normal; }
img { max-width: 100%; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
"""

_e = html.escape


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1) -> str:
    """An HTML table of text cells (escaped here); the first `left` columns left-aligned."""
    def cells(tag: str, row: Sequence[str]) -> str:
        return "".join(f"<{tag}{' class=l' if i < left else ''}>{_e(v)}</{tag}>" for i, v in enumerate(row))
    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f"<table><tr>{cells('th', header)}</tr>{body}</table>"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def _started(meta: RunMeta) -> str:
    return datetime.fromtimestamp(meta.started_wall, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _meta_rows(meta: RunMeta, notes: bool = True) -> list[tuple[str, str]]:
    """The run's parameters as (name, value with unit) rows; the notes last unless notes=False."""
    return [("trace", f"{meta.trace} ({meta.trace_format})"), ("workload", meta.workload),
            ("backend", meta.backend), ("topology", meta.topology), ("routing", meta.routing),
            ("ranks / hosts", f"{meta.ranks} ranks on {meta.hosts} hosts"), ("placement", meta.placement),
            ("algorithm asked for", meta.algorithm),
            ("channels", f"{meta.channels} connections per plane per host pair"),
            ("link scale", f"{meta.mbps_per_gbps:g} Mbit/s emulated per Gbit/s real"),
            ("time dilation", f"{meta.dilation:g} (emulated time / real time)"),
            ("bytes scale", f"{meta.bytes_scale:g} (emulated bytes / real bytes)"), ("compute", meta.compute),
            ("repeats x steps", f"{meta.repeat} x {meta.steps_recorded} steps"),
            ("started", _started(meta)), ("wall time", f"{meta.duration_s:.1f} s"),
            *(("note", n) for n in (meta.notes if notes else ()))]


def _dilation_sentence(meta: RunMeta) -> str:
    if meta.backend == "flowsim" and meta.dilation == 1:
        return "Simulated at the real rates (flowsim): no time dilation; all times are real."
    return (f"Time dilation: the emulated links ran at {meta.mbps_per_gbps:g} Mbit/s for each real Gbit/s and the "
            f"bytes were scaled by {meta.bytes_scale:g}, so the emulation ran {meta.dilation:g} times slower than "
            f"the real fabric would; every time in this report is the emulated time divided by {meta.dilation:g}, "
            "i.e. real time (time-dilated network emulation).")


def _compute_sentence(meta: RunMeta) -> str:
    if meta.compute == "composed":
        return ("Compute mode \u201ccomposed\u201d: compute was not slept; the collectives were replayed for real "
                "and timed, and each step's timeline was composed from the trace's compute intervals with those "
                "measured durations.")
    if meta.compute == "slept":
        return (f"Compute mode \u201cslept\u201d: the trace's compute gaps were slept on the emulator at the "
                f"dilation ({meta.dilation:g}x), between the replayed collectives.")
    return f"Compute mode \u201c{meta.compute}\u201d."


def _fidelity_banner(fid: Fidelity, checks: Sequence[str], meta: RunMeta | None = None) -> str:
    if meta is not None and meta.backend == "flowsim":
        cls, text = "ok", ("Simulated (flowsim): fluid flows at max-min fair shares of the link capacities; no "
                           "packets, queues or datapath, so no CPU limit applies. The notes under Run state what "
                           "is modelled and what is not.")
    elif fid.cpu_bound:
        cls, text = "bad", (f"CPU-bound: the CPU was idle only {format_share(fid.cpu_idle_share)} of the replay, so the "
                            "datapath, not the emulated links, may have limited the transfers: bandwidths are lower "
                            "bounds and latency tails may be inflated.")
    else:
        cls, text = "ok", (f"Not CPU-bound: the CPU was idle {format_share(fid.cpu_idle_share)} of the replay; the "
                           "emulated links, not the datapath, bounded the transfers.")
    notes = [("fidelity warning", w) for w in fid.warnings] + [("report check", c) for c in checks]
    if notes:
        text += f" {len(notes)} warning(s) below."
    items = "".join(f"<li><b>{_e(k)}:</b> {_e(v)}</li>" for k, v in notes)
    return f'<div class="banner {cls}">{_e(text)}</div>' + (f'<div class="banner warn"><ul>{items}</ul></div>'
                                                               if notes else "")


def _steps_table(s: RunSummary) -> str:
    p = s.step_time_us
    if p is None:
        return "<p>No steps recorded.</p>"
    times = _table(["step time (slowest rank)", "n", "mean", "p50", "p99", "p999", "max"],
                   [["real time", f"{p.n} steps", format_us(p.mean), format_us(p.p50), format_us(p.p99), format_us(p.p999),
                     format_us(p.max)]])
    shares = _table(["share of step time", "mean of steps", "pooled (sums)"],
                    [["utilisation (compute)", format_share(s.utilisation_mean), format_share(s.utilisation_pooled)],
                     ["communication share (exposed)", format_share(s.comm_share_mean), format_share(s.comm_share_pooled)]])
    residual = _e(format_us(s.identity_max_residual_us))
    return f"{times}{shares}<p>Largest |step &minus; (compute + exposed + idle)| over all step rows: {residual}.</p>"


def _kinds_table(s: RunSummary) -> str:
    if not s.kinds:
        return "<p>No collectives recorded.</p>"
    return _table(["kind", "count", "bytes (real)", "latency p50", "p99", "p999", "samples", "mean algbw", "mean busbw",
                   "busbw, largest size class"],
                  [[k.kind, str(k.count), format_bytes(k.total_bytes), format_us(k.latency_us.p50),
                    format_us(k.latency_us.p99), format_us(k.latency_us.p999), str(k.latency_us.n),
                    format_bps(k.mean_algbw_bps), format_bps(k.mean_busbw_bps), _largest_class_text(k)] for k in s.kinds])


def _links_table(s: RunSummary, stats: Sequence[LinkStats]) -> str:
    hot = "".join(f"<p>Hottest {_e(h.tier)} link: <b>{_e(h.name)}</b> (plane {_e(h.plane)}), "
                  f"{_e(format_share(h.active_util))} utilised while collectives ran.</p>" for h in s.hottest_by_tier)
    if not stats:
        return "<p>No link utilisation recorded.</p>"
    top = sorted(stats, key=lambda x: (-(x.active_util if x.active_util is not None else -1.0), x.name))[:LINKS_SHOWN]
    table = _table(["link", "tier", "plane", "bytes (emulated)", "mean util", "max util", "util while collectives ran"],
                   [[x.name, x.tier, x.plane, format_bytes(x.bytes), format_share(x.mean_util), format_share(x.max_util),
                     format_share(x.active_util)] for x in top], left=3)
    return f"{hot}{table}<p>The {len(top)} hottest of {len(stats)} links (by utilisation while collectives ran); " \
           "all are in links.csv.</p>"


def _busiest_table(fid: Fidelity) -> str:
    if not fid.busiest_links:
        return ""
    def num(d: dict[str, Any], key: str) -> float | None:
        v = d.get(key)
        return float(v) if isinstance(v, (int, float)) else None
    return "<h3>Delivered vs bound on the busiest links</h3>" + _table(
        ["link", "delivered (emulated)", "bound (emulated)", "delivered / bound"],
        [[str(d.get("link", NA)), format_bps(num(d, "delivered_bps")), format_bps(num(d, "bound_bps")),
          format_share(num(d, "ratio"))] for d in fid.busiest_links])


def _dicts_table(title: str, items: Sequence[dict[str, Any]], dilation: float) -> str:
    """Faults or controller events: one row each, columns in first-seen key order, values in their units."""
    if not items:
        return ""
    keys = list(dict.fromkeys(k for d in items for k in d))
    return f"<h2>{_e(title)}</h2>" + _table(keys, [[_fmt_keyed(k, d[k], dilation) if k in d else "" for k in keys]
                                                    for d in items], left=len(keys))


def _report_html(result: RunResult, s: RunSummary, stats: Sequence[LinkStats], plots: dict[str, bytes]) -> str:
    meta = result.meta
    body = "".join([
        f"<h1>{_e(meta.workload)} on {_e(s.label)}</h1>",
        "<h2>Fidelity</h2>", _fidelity_banner(result.fidelity, s.checks, meta), _busiest_table(result.fidelity),
        "<h2>Run</h2>", _table(["parameter", "value"], _meta_rows(meta)),
        f"<p>{_e(_dilation_sentence(meta))}</p><p>{_e(_compute_sentence(meta))}</p>",
        "<h2>Steps</h2>", _steps_table(s), _img(plots["step_times.png"], "step times"),
        "<h2>Collectives</h2>", _kinds_table(s), _img(plots["collective_latency_cdf.png"], "collective latency CDF"),
        "<h2>Links</h2>", _links_table(s, stats), _img(plots["link_utilisation.png"], "link utilisation"),
        _dicts_table("Faults injected", result.faults, meta.dilation),
        _dicts_table("Controller events", result.events, meta.dilation),
    ])
    return _page(f"fabriclab report: {meta.workload} on {s.label}", body)


def _with_note(value: str, note: str) -> str:
    return f"{value} [{note}]" if note else value


def _comparison_rows(c: Comparison) -> list[list[str]]:
    return [[r.metric, _with_note(_fmt_unit(r.unit, r.a), r.a_note), _with_note(_fmt_unit(r.unit, r.b), r.b_note),
             format_ratio(r.ratio)] for r in c.rows]


def _time_sentences(a: RunMeta, b: RunMeta) -> str:
    """The dilation and compute-mode sentences of both runs, once where they are the same."""
    out = []
    for say in (_dilation_sentence, _compute_sentence):
        sa, sb = say(a), say(b)
        out += [f"<p>Both runs: {_e(sa)}</p>"] if sa == sb else [f"<p>a: {_e(sa)}</p>", f"<p>b: {_e(sb)}</p>"]
    return "".join(out)


def _comparison_html(a: RunResult, b: RunResult, c: Comparison, plots_a: dict[str, bytes],
                     plots_b: dict[str, bytes]) -> str:
    pairs_of_rows = zip(_meta_rows(a.meta, notes=False), _meta_rows(b.meta, notes=False))
    runs = _table(["parameter", f"a: {c.a.label}", f"b: {c.b.label}"],
                  [[k, va, vb] for (k, va), (_, vb) in pairs_of_rows], left=3)
    warnings = "".join(f"<li>{_e(w)}</li>" for w in c.warnings)
    pairs = "".join(f'<h3>{_e(title)}</h3><div class="pair">{_img(plots_a[name], "a: " + title)}'
                    f'{_img(plots_b[name], "b: " + title)}</div>'
                    for name, title in (("step_times.png", "step time"),
                                        ("collective_latency_cdf.png", "collective latency CDF"),
                                        ("link_utilisation.png", "link utilisation")))
    body = "".join([
        f"<h1>{_e(c.a.label)} (a) vs {_e(c.b.label)} (b)</h1>",
        f'<div class="banner warn"><ul>{warnings}</ul></div>' if warnings else "",
        '<h2>Fidelity</h2><div class="pair">', f"<div><h3>a</h3>{_fidelity_banner(a.fidelity, c.a.checks)}</div>",
        f"<div><h3>b</h3>{_fidelity_banner(b.fidelity, c.b.checks)}</div></div>",
        "<h2>Side by side</h2>", _table(["metric", "a", "b", "b / a"], _comparison_rows(c)),
        "<p>b / a below 1 means b is lower: faster for times, slower for bandwidths.</p>",
        "<h2>Runs</h2>", runs, _time_sentences(a.meta, b.meta),
        "<h2>Plots</h2>", pairs,
    ])
    return _page(f"fabriclab comparison: {c.a.label} vs {c.b.label}", body)


__all__ = ["Comparison", "ComparisonRow", "KindSummary", "LinkStats", "RunSummary", "compare", "format_comparison",
           "format_summary", "link_stats", "slowest_steps", "summarize", "write_comparison", "write_report"]
