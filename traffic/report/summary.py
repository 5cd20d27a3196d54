"""The numbers of a report and its checks: `summarize(result) -> RunSummary`, `compare(a, b) -> Comparison`,
`link_stats`, `slowest_steps`, and the records they return (`KindSummary`, `LinkStats`, `RunSummary`,
`ComparisonRow`, `Comparison`). Nothing here formats, writes or draws.

`summarize` gives step-time tails, per collective kind counts, bytes, latency tails and bandwidths,
utilisation and communication share, the hottest link, fidelity, and what the report found inconsistent in
the record (`checks`); `compare` puts run b against run a, metric by metric, with the ratio b / a.

The metrics themselves are `traffic.metrics`' (nearest-rank `percentiles`, `busbw_factor`, the step identity);
this module only chooses the samples:
- A step's time, where several ranks were composed, is the slowest rank's: per (step, repeat) the row with
  rank -1 where the record has one (the job's: the slowest rank's time, compute and exposed communication
  the ranks' mean, `traffic.replay.result.job_step`), else the row with the longest `step_us`
  (`slowest_steps`). Step tails, utilisation and communication share are over those rows; "pooled" is sum(compute) / sum(step) (and
  sum(exposed) / sum(step)), "mean" the mean of the per-step ratios.
- A collective's latency is its `duration_real_us`. Bandwidth means are over the collectives that moved
  data (a barrier has none). A size class is a power-of-two bucket [2^k, 2^(k+1)) bytes; the busbw of the
  largest size class is the mean busbw of the kind's collectives in its largest bucket (nccl-tests'
  headline figure is the bus bandwidth at large sizes).
- Link sample i covers `link_origin_emu_s` + [i, i + 1) x `link_interval_s` emulated seconds on the time
  axis of `CollectiveResult.start_emu_s` (0 = the run's first collective). A link's utilisation "while collectives ran" is the mean
  of its samples, each weighted by the emulated time in it during which at least one collective ran; the
  hottest link is the link with the highest such mean (ties: the first name).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from traffic.collectives import discarded
from traffic.metrics import (MetricError, Percentiles, StepTimes, algbw_bps, busbw_factor, check_step_identity, mfu,
                             percentiles)
from traffic.results import CollectiveResult, LinkSeries, RunMeta, RunResult, StepResult
from traffic.workload import KINDS, merge_intervals

#: A step row breaks step = compute + exposed + idle when off by more than this (1 ns).
IDENTITY_TOLERANCE_US = 1e-3
#: Recorded algbw/busbw agree with the definitions when within this relative tolerance.
BANDWIDTH_RTOL = 1e-6
#: Link tiers in report order (the hottest link per tier, the plots' link groups).
_TIER_ORDER = {"host": 0, "fabric": 1}


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
    # model FLOPs utilisation at the mean step time (generated training steps only: `RunMeta.training`)
    mfu: float | None = None

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


def mean_shares(rows: Sequence[StepResult]) -> dict[str, Any]:
    """The steps' shares, each averaged over `rows` (the job's steps, `slowest_steps`): utilisation (compute / step),
    communication share (exposed communication / step), idle share, and the exposed communication per stream
    (process group) as a share of the step; the one definition `summarize` and compare's rows use."""
    n = len(rows)
    exposed: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r.exposed_by_stream_us.items():
            exposed.setdefault(k, []).append(v / r.step_us)
    return {"utilisation": _mean([r.utilisation for r in rows]), "comm_share": _mean([r.comm_share for r in rows]),
            "idle_share": _mean([r.idle_us / r.step_us for r in rows]),
            "exposed_by_stream": {k: math.fsum(v) / n for k, v in exposed.items()}}


def pooled_busbw_bps(collectives: Sequence[CollectiveResult]) -> tuple[float, dict[str, float]]:
    """busbw pooled over the collectives that move data (sum of bytes x 8 x the nccl-tests factor over the sum of
    their durations), over all of them and per stream (process group)."""
    moving = [c for c in collectives if c.size_bytes > 0 and c.kind != "barrier"]
    bits: dict[str, float] = {}
    secs: dict[str, float] = {}
    for c in moving:
        bits[c.stream] = bits.get(c.stream, 0.0) + c.size_bytes * 8 * busbw_factor(c.kind, c.group_size)
        secs[c.stream] = secs.get(c.stream, 0.0) + c.duration_real_us / 1e6
    total_bits = sum(c.size_bytes * 8 * busbw_factor(c.kind, c.group_size) for c in moving)
    total_s = sum(c.duration_real_us for c in moving) / 1e6
    return (total_bits / total_s if total_s > 0 else 0.0, {k: bits[k] / secs[k] for k in bits if secs[k] > 0})


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
                       # a discarded empty collective (NCCL returns at once) is no latency sample
                       latency_us=percentiles([c.duration_real_us for c in
                                               ([c for c in colls if not discarded(c.kind, c.size_bytes)] or colls)]),
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
    shares = mean_shares(rows)
    return RunSummary(
        label=f"{meta.topology} / {meta.routing}", workload=meta.workload, trace=meta.trace, backend=meta.backend,
        topology=meta.topology, routing=meta.routing, ranks=meta.ranks, compute=meta.compute,
        dilation=meta.dilation, mbps_per_gbps=meta.mbps_per_gbps, bytes_scale=meta.bytes_scale,
        step_time_us=percentiles([r.step_us for r in rows]) if rows else None,
        utilisation_mean=shares["utilisation"],
        utilisation_pooled=_ratio(math.fsum(r.compute_us for r in rows), step_sum),
        comm_share_mean=shares["comm_share"],
        comm_share_pooled=_ratio(math.fsum(r.exposed_comm_us for r in rows), step_sum),
        identity_max_residual_us=residual, collectives=len(result.collectives),
        kinds=tuple(_kind_summary(k, cs) for k, cs in _by_kind(result.collectives).items()),
        hottest_link=_hottest(stats), hottest_by_tier=_hottest_by_tier(stats),
        faults=len(result.faults), controller_events=len(result.events),
        cpu_bound=fid.cpu_bound, cpu_idle_share=fid.cpu_idle_share, fidelity_warnings=fid.warnings,
        checks=tuple(identity + _bandwidth_checks(result.collectives) + _meta_checks(result)),
        mfu=_mfu(meta, step_sum / len(rows) if rows else None))


def _mfu(meta: RunMeta, mean_step_us: float | None) -> float | None:
    t = meta.training
    if not t or not mean_step_us:
        return None
    return mfu(t["model_flops_per_step"], mean_step_us, t["peak_flops_per_gpu"], t["world_size"])


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
            *([_row("MFU", "share", sa.mfu, sb.mfu)] if sa.mfu is not None or sb.mfu is not None else []),
            _row("hottest link utilisation", "share", _active_util(sa.hottest_link), _active_util(sb.hottest_link),
                 _link_note(sa.hottest_link), _link_note(sb.hottest_link)),
            *([_row("CPU idle", "share", sa.cpu_idle_share, sb.cpu_idle_share,
                    "CPU-bound" if sa.cpu_bound else "not CPU-bound", "CPU-bound" if sb.cpu_bound else "not CPU-bound")]
              if "emulation" in (sa.backend, sb.backend) else []),  # a simulation runs no datapath
            _row("fidelity warnings", "count", float(len(sa.fidelity_warnings)), float(len(sb.fidelity_warnings)))]
    return Comparison(a=sa, b=sb, rows=tuple(rows), warnings=tuple(_differences(a.meta, b.meta)))
