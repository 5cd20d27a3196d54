"""The pictures of `fabriclab compare`: compare.png and compare.html, drawn from the table's rows.

- `compare_png(rows, title)`: one figure, four panels: (a) step time (mean solid, p99 dashed) against GPUs
  and (b) scaling efficiency against GPUs, one line per series (topology, routing, variant); (c) each row's
  step split into compute, exposed communication per process group and idle, as stacked bars; (d) per row,
  the hottest link of each tier (its peak utilisation). `compare_figure` is that figure, before rendering.
- `compare_html(rows, title, meta)`: one self-contained page (the picture inlined as a data URI, no script,
  no link): the picture, how to read it, the rows as a table and the run's parameters.

Drawn with the run reports' helpers (`traffic.report.plots`: a matplotlib Figure on the Agg canvas, fixed
dpi, no software tag; `traffic.report.html`: the page, its tables and images), so every picture of the lab
looks and is made alike. Pure: rows in, bytes or text out; `fabriclab.compare_output.write` writes the files.

The rows are `fabriclab.rows.Row`s, read through `CompareRow` (the fields drawn), so anything with those fields
draws (`benchmarks/compare_picture.py` reads them back from a compare.json).
"""
from __future__ import annotations

import html
import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fabric.model import ROLE_TIER
from traffic.formatting import NA, format_bps, format_share, format_us
from traffic.report.html import html_page, html_table, png_img
from traffic.report.plots import COLOURS, figure_png, new_figure, no_data, time_unit

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: one colour per series (matplotlib's tab10), in the order the series first appear in the rows
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")
#: exposed communication per process group: shades of the run reports' "exposed" orange
GROUP_COLOURS = ("#dd8452", "#c44e52", "#e8b04b", "#a0522d", "#f4a582", "#8c2d04", "#fdd0a2")
#: one colour per link tier in panel (d)
TIER_COLOURS = ("#55a868", "#8172b2", "#64b5cd", "#937860", "#da8bc3", "#ccb974", "#4c4c4c")
#: process groups drawn in this order (tensor, context, expert, pipeline, data parallel), any other after
GROUP_ORDER = ("tp", "cp", "ep", "pp", "dp")
#: exposed communication no group accounts for (comm_share minus the groups' sum) is drawn above this share
OTHER_MIN_SHARE = 0.002
#: panels (c) and (d) are at least this many bars wide, so one or two rows do not draw slabs
MIN_BAR_SPAN = 6.0
#: figure size (inches; 100 px each)
WIDTH_IN, HEIGHT_IN = 13.0, 12.0

SeriesKey = tuple[str, str, str]


class CompareRow(Protocol):
    """What the pictures read of a row (`fabriclab.rows.Row`)."""

    @property
    def topology(self) -> str: ...
    @property
    def fabric(self) -> str: ...
    @property
    def routing(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def step_mean_us(self) -> float: ...
    @property
    def step_p99_us(self) -> float: ...
    @property
    def utilisation(self) -> float: ...
    @property
    def comm_share(self) -> float: ...
    @property
    def idle_share(self) -> float: ...
    @property
    def exposed_by_group(self) -> Mapping[str, float]: ...
    @property
    def hottest_by_tier(self) -> Mapping[str, float]: ...
    @property
    def busbw_bps(self) -> float: ...
    @property
    def efficiency(self) -> float: ...
    @property
    def mfu(self) -> float: ...


# ---- series, groups and tiers ----------------------------------------------------------------------

def series_key(r: CompareRow) -> SeriesKey:
    return (r.topology, r.routing, r.variant)


def series_label(key: SeriesKey) -> str:
    """"topology / routing[ / variant]", a topology file's name without its directory and suffix."""
    topology, routing, variant = key
    name = topology.rsplit("/", 1)[-1]
    for suffix in (".yaml", ".yml", ".json"):
        name = name.removesuffix(suffix)
    return " / ".join(x for x in (name, routing, variant) if x)


def by_series(rows: Sequence[CompareRow]) -> dict[SeriesKey, list[CompareRow]]:
    """The rows per series, series in first-seen order, each series' rows by GPUs."""
    out: dict[SeriesKey, list[CompareRow]] = {}
    for r in rows:
        out.setdefault(series_key(r), []).append(r)
    return {k: sorted(v, key=lambda r: r.gpus) for k, v in out.items()}


def groups_of(rows: Sequence[CompareRow]) -> list[str]:
    """The process groups with exposed communication in any row, in `GROUP_ORDER`, then by name."""
    found = {g for r in rows for g, v in r.exposed_by_group.items() if v > 0}
    return sorted(found, key=lambda g: (GROUP_ORDER.index(g) if g in GROUP_ORDER else len(GROUP_ORDER), g))


def _tier_key(tier: str) -> tuple[int, int, int, str]:
    """Lowest tier first ("host" below every switch), each link's uplink just before its downlink."""
    lo, _, hi = tier.partition("->")
    a, b = ROLE_TIER.get(lo, 0), ROLE_TIER.get(hi, 0)
    return (min(a, b), max(a, b), 0 if b > a else 1, tier)


def tiers_of(rows: Sequence[CompareRow]) -> list[str]:
    return sorted({t for r in rows for t in r.hottest_by_tier}, key=_tier_key)


def _other_exposed(r: CompareRow) -> float:
    """Exposed communication that no group accounts for (0 below `OTHER_MIN_SHARE`)."""
    rest = r.comm_share - sum(v for v in r.exposed_by_group.values() if v > 0)
    return rest if rest > OTHER_MIN_SHARE else 0.0


# ---- the figure ------------------------------------------------------------------------------------

def _gpu_axis(ax: Axes, sizes: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(sizes), [str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.grid(True, alpha=0.3)


def _draw_step_time(ax: Axes, series: dict[SeriesKey, list[CompareRow]], colours: dict[SeriesKey, str]) -> None:
    """(a) mean step (solid, the series legend's lines) and p99 (dashed) against GPUs."""
    from matplotlib.lines import Line2D

    top_us = max(max(r.step_mean_us, r.step_p99_us) for rows in series.values() for r in rows)
    scale, unit = time_unit(top_us)
    for key, rows in series.items():
        gpus = [r.gpus for r in rows]
        ax.plot(gpus, [r.step_mean_us / scale for r in rows], "o-", color=colours[key], label=series_label(key))
        ax.plot(gpus, [r.step_p99_us / scale for r in rows], "--", color=colours[key], linewidth=1, alpha=0.7)
    _gpu_axis(ax, sorted({r.gpus for rows in series.values() for r in rows}))
    ax.set_ylim(0.0, top_us / scale * 1.08)
    ax.set_ylabel(f"step time ({unit})")
    ax.set_title("(a) step time: mean (solid) and p99 (dashed)")
    ax.legend(handles=[Line2D([], [], color="black", marker="o", label="mean"),
                       Line2D([], [], color="black", linestyle="--", linewidth=1, label="p99")],
              fontsize="small", loc="lower right")


def _draw_efficiency(ax: Axes, series: dict[SeriesKey, list[CompareRow]], colours: dict[SeriesKey, str]) -> None:
    """(b) scaling efficiency against GPUs, 1 = ideal weak scaling."""
    for key, rows in series.items():
        ax.plot([r.gpus for r in rows], [r.efficiency for r in rows], "o-", color=colours[key])
    effs = [r.efficiency for rows in series.values() for r in rows if math.isfinite(r.efficiency)]
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    _gpu_axis(ax, sorted({r.gpus for rows in series.values() for r in rows}))
    ax.set_ylim(0.0, max([1.05, *(e * 1.05 for e in effs)]))
    ax.set_ylabel("scaling efficiency (1 = ideal)")
    ax.set_title("(b) scaling efficiency: throughput per GPU vs the series' smallest size")


def _bar_positions(series: dict[SeriesKey, list[CompareRow]]) -> list[tuple[float, CompareRow]]:
    """Each row's x in panels (c) and (d): the series side by side, a gap between them."""
    out: list[tuple[float, CompareRow]] = []
    x = 0.0
    for rows in series.values():
        out += [(x + i, r) for i, r in enumerate(rows)]
        x += len(rows) + 1
    return out


def _bar_axis(ax: Axes, series: dict[SeriesKey, list[CompareRow]], colours: dict[SeriesKey, str]) -> None:
    """GPUs under each bar, the series' name (in its colour) under its bars."""
    placed = _bar_positions(series)
    ax.set_xticks([x for x, _ in placed], [str(r.gpus) for _, r in placed], fontsize="small")
    centres, x = [], 0.0
    for rows in series.values():
        centres.append(x + (len(rows) - 1) / 2)
        x += len(rows) + 1
    ax.xaxis.remove_overlapping_locs = False  # a series of one row: its name's tick is at its bar's
    ax.set_xticks(centres, [series_label(k) for k in series], minor=True, fontsize="small")
    ax.tick_params(axis="x", which="minor", length=0, pad=16)
    for label, key in zip(ax.get_xticklabels(minor=True), series):
        label.set_color(colours[key])
    lo, hi = -0.7, x - 1.3
    pad = max(0.0, (MIN_BAR_SPAN - (hi - lo)) / 2)  # a few rows: narrow bars, centred
    ax.set_xlim(lo - pad, hi + pad)


def _draw_split(ax: Axes, series: dict[SeriesKey, list[CompareRow]]) -> None:
    """(c) each row's step: compute, exposed communication per group (and any no group holds), idle."""
    placed = _bar_positions(series)
    rows = [r for _, r in placed]
    xs = [x for x, _ in placed]
    bottom = [r.utilisation for r in rows]
    ax.bar(xs, bottom, color=COLOURS["compute"], label="compute")
    parts = [(f"exposed communication: {g}", [r.exposed_by_group.get(g, 0.0) for r in rows]) for g in groups_of(rows)]
    other = [_other_exposed(r) for r in rows]
    if any(other):
        name = "exposed communication" + (": no group" if parts else "")
        parts.append((name, other))
    for (name, values), colour in zip(parts, GROUP_COLOURS * (len(parts) // len(GROUP_COLOURS) + 1)):
        ax.bar(xs, values, bottom=bottom, color=colour, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.bar(xs, [r.idle_share for r in rows], bottom=bottom, color=COLOURS["idle"], label="idle")
    ax.set_ylim(0.0, max([1.0, *(b + r.idle_share for b, r in zip(bottom, rows))]) * 1.02)
    ax.set_ylabel("share of the step")
    ax.set_title("(c) where the step goes: compute, exposed communication by process group, idle")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _draw_hottest(ax: Axes, series: dict[SeriesKey, list[CompareRow]]) -> None:
    """(d) per row, each of its tiers' hottest link: its peak utilisation; a row's bars side by side (fabrics of
    other switch roles have other tiers), one colour per tier."""
    title = "(d) hottest link by tier: its peak utilisation"
    placed = _bar_positions(series)
    tiers = tiers_of([r for _, r in placed])
    if not tiers:
        no_data(ax, title, "no link utilisation by tier in these rows")
        return
    width = 0.8 / max(len(r.hottest_by_tier) for _, r in placed)
    at: dict[str, list[tuple[float, float]]] = {t: [] for t in tiers}  # tier -> (x, peak utilisation)
    for x, r in placed:
        own = sorted(r.hottest_by_tier, key=_tier_key)
        for k, t in enumerate(own):
            at[t].append((x + (k + 0.5 - len(own) / 2) * width, r.hottest_by_tier[t]))
    for tier, colour in zip(tiers, TIER_COLOURS * (len(tiers) // len(TIER_COLOURS) + 1)):
        ax.bar([x for x, _ in at[tier]], [u for _, u in at[tier]], width=width, color=colour, label=tier)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_ylim(0.0, 1.1)
    ax.set_ylabel("peak utilisation (0..1 of capacity)")
    ax.set_title(title)
    ax.legend(title="tier", fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def compare_figure(rows: Sequence[CompareRow], title: str) -> Figure:
    """The four panels (module docstring) under the title and one legend of the series."""
    if not rows:
        fig = new_figure(8.0, 3.0)
        no_data(fig.add_subplot(), title, "no row finished")
        return fig
    series = by_series(rows)
    colours = {k: SERIES_COLOURS[i % len(SERIES_COLOURS)] for i, k in enumerate(series)}
    fig = new_figure(WIDTH_IN, HEIGHT_IN)
    grid = fig.add_gridspec(3, 2, height_ratios=(1.15, 1.0, 1.0))
    step_ax, eff_ax = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    split_ax, hot_ax = fig.add_subplot(grid[1, :]), fig.add_subplot(grid[2, :])
    _draw_step_time(step_ax, series, colours)
    _draw_efficiency(eff_ax, series, colours)
    _draw_split(split_ax, series)
    _draw_hottest(hot_ax, series)
    for ax in (split_ax, hot_ax):
        _bar_axis(ax, series, colours)
    handles = [line for line in step_ax.get_lines() if not str(line.get_label()).startswith("_")]
    # the title heads the series legend: constrained layout would stack a suptitle over an outside legend
    fig.legend(handles=handles, loc="outside upper center", ncols=min(len(handles), 4), frameon=False,
               title=textwrap.fill(title, 110), title_fontproperties={"size": "large"})
    return fig


def compare_png(rows: Sequence[CompareRow], title: str) -> bytes:
    """`compare_figure` as PNG bytes (`traffic.report.plots.figure_png`)."""
    return figure_png(compare_figure(rows, title))


# ---- the page --------------------------------------------------------------------------------------

def _share(v: float) -> str:
    return format_share(v) if math.isfinite(v) else NA


def _keyed(values: Mapping[str, float], order: Sequence[str]) -> str:
    return ", ".join(f"{k} {_share(values[k])}" for k in order if k in values) or "-"


def rows_table(rows: Sequence[CompareRow]) -> str:
    """The rows, by series then GPUs: step time, scaling efficiency, the step's split, the hottest links."""
    ordered = [r for rs in by_series(rows).values() for r in rs]
    groups, tiers = groups_of(rows), tiers_of(rows)
    mfu = any(math.isfinite(r.mfu) for r in rows)
    head = ["series", "fabric", "GPUs", "step time mean", "step time p99", "scaling efficiency", "compute",
            *(["MFU"] if mfu else []), "exposed communication", "by group", "idle", "hottest link by tier", "busbw"]
    body = [[series_label(series_key(r)), r.fabric, str(r.gpus), format_us(r.step_mean_us), format_us(r.step_p99_us),
             f"{r.efficiency:.3f}" if math.isfinite(r.efficiency) else "-", _share(r.utilisation),
             *([_share(r.mfu)] if mfu else []), _share(r.comm_share), _keyed(r.exposed_by_group, groups),
             _share(r.idle_share), _keyed(r.hottest_by_tier, tiers), format_bps(r.busbw_bps)] for r in ordered]
    return html_table(head, body, left=2)


def _meta_value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 400 else text[:397] + "..."


def _status(rows: Sequence[CompareRow], meta: Mapping[str, Any]) -> str:
    """A warning banner when the comparison is not complete or rows failed; else nothing."""
    failed = meta.get("failed") or []
    expected = meta.get("rows_expected")
    notes = [f"{f.get('row', '?')}: {f.get('kind', 'error')}: {f.get('error', '')}" for f in failed
             if isinstance(f, Mapping)]
    if meta.get("complete") is False or notes:
        head = f"Incomplete: {len(rows)} of {expected if expected is not None else '?'} rows finished."
        items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        return f'<div class="banner warn">{html.escape(head)}' + (f"<ul>{items}</ul>" if items else "") + "</div>"
    return ""


#: how to read the picture, panel by panel
READING = (
    "(a) step time: the mean step (solid) and its p99 (dashed) of each series against the GPUs it ran on.",
    ("(b) scaling efficiency: 1 / mean step at N over the same at the series' smallest size (fixed batch per GPU, "
     "weak scaling); 1 is ideal."),
    ("(c) each row's step split into compute (utilisation), exposed communication per process group (the "
     "communication nothing overlapped) and idle (waiting for other ranks), as shares of the step."),
    ("(d) the hottest link of each tier: the peak utilisation (0..1 of its capacity) of the busiest link between "
     "those switch roles."),
)


def compare_html(rows: Sequence[CompareRow], title: str, meta: Mapping[str, Any], png: bytes | None = None) -> str:
    """The page (module docstring); `png`: `compare_png(rows, title)` when the caller has it already."""
    picture = png if png is not None else compare_png(rows, title)
    alt = "step time and scaling efficiency against GPUs per series; per row compute, exposed communication " \
          "and idle shares of the step, and the hottest link by tier"
    sizes = sorted({r.gpus for r in rows})
    body = "".join([
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(rows)} rows: {len(by_series(rows))} series at {', '.join(map(str, sizes)) or 'no'} GPUs.</p>",
        _status(rows, meta),
        "<h2>Step time, scaling efficiency, compute / exposed communication / idle, hottest link</h2>",
        png_img(picture, alt),
        "<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in READING) + "</ul>",
        "<h2>Rows</h2>", rows_table(rows) if rows else "<p>No row finished.</p>",
        "<h2>Run</h2>", html_table(["parameter", "value"],
                                   [[str(k), _meta_value(v)] for k, v in meta.items() if k != "failed"], left=2),
    ])
    return html_page(title, body)
