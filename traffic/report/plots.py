"""The plots of a report, as PNG bytes: step times (stacked compute / exposed communication / idle), the
collective latency CDF per kind, and the link utilisation heat map; `_run_plots` draws a run's three.

Plots are drawn on `matplotlib.figure.Figure` objects rendered by the Agg canvas: no pyplot, no global
backend switch, no display; matplotlib is imported only when plotting. The public helpers (`new_figure`,
`figure_png`, `agg_renderer`, `no_data`, `time_unit`, `COLOURS`) are every picture's, the run reports' and those drawn
above this package (`fabriclab.render`'s comparison, `fabriclab.plan_report`'s plan), so all share one
size convention, dpi and PNG metadata.
"""
from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from fabric.errors import UnsupportedError
from traffic.formatting import TIME_UNITS
from traffic.report.summary import _TIER_ORDER, _by_kind, slowest_steps
from traffic.results import CollectiveResult, LinkSeries, RunResult, StepResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.figure import Figure

#: every PNG's resolution (dots per inch): a figure of w x h inches is 100 w x 100 h pixels
DPI = 100
#: the colours of a step's parts, the same in every picture
COLOURS = {"compute": "#4c72b0", "exposed": "#dd8452", "idle": "#c7c7c7"}


def new_figure(width_in: float, height_in: float) -> Figure:
    """An empty figure of that size (inches), constrained layout; `figure_png` renders it."""
    try:
        import matplotlib.figure as mfigure
    except ImportError as e:
        raise UnsupportedError(f"the report's plots need matplotlib (pip install matplotlib): {e}") from None
    return mfigure.Figure(figsize=(width_in, height_in), layout="constrained")


def figure_png(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg), without the software tag: the page must hold no links."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def agg_renderer(fig: Figure) -> RendererAgg:
    """The figure's Agg renderer (an Agg canvas attached), to measure text before `figure_png` renders."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return FigureCanvasAgg(fig).get_renderer()


def no_data(ax: Axes, title: str, message: str) -> None:
    """The axes replaced by a titled message (nothing to draw)."""
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def time_unit(max_us: float) -> tuple[float, str]:
    """(divisor, unit) for an axis of real times up to max_us."""
    return next(((f, u) for f, u in TIME_UNITS if max_us >= f), TIME_UNITS[-1])


def _step_top_us(r: StepResult) -> float:
    return max(r.step_us, r.compute_us + r.exposed_comm_us + r.idle_us, r.recorded_step_us or 0.0)


def _positive_range(values: Iterable[float]) -> tuple[float, float] | None:
    pos = [v for v in values if v > 0]
    return (min(pos), max(pos)) if pos else None


def _plot_step_times(rows: Sequence[StepResult], title: str, top_us: float | None = None) -> bytes:
    """Stacked bars per (step, repeat): compute, exposed communication, idle; the trace's own step time."""
    fig = new_figure(8.0, 3.8)
    ax = fig.add_subplot()
    if not rows:
        no_data(ax, title, "no steps recorded")
        return figure_png(fig)
    top = top_us or max(_step_top_us(r) for r in rows)
    scale, unit = time_unit(top)
    x = list(range(len(rows)))
    compute = [r.compute_us / scale for r in rows]
    exposed = [r.exposed_comm_us / scale for r in rows]
    idle = [r.idle_us / scale for r in rows]
    ax.bar(x, compute, color=COLOURS["compute"], label="compute")
    ax.bar(x, exposed, bottom=compute, color=COLOURS["exposed"], label="exposed communication")
    ax.bar(x, idle, bottom=[c + e for c, e in zip(compute, exposed)], color=COLOURS["idle"], label="idle")
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
    return figure_png(fig)


def _plot_latency_cdf(colls: Sequence[CollectiveResult], title: str,
                      x_range_us: tuple[float, float] | None = None) -> bytes:
    """The empirical CDF of duration_real_us per collective kind, log x."""
    fig = new_figure(8.0, 3.8)
    ax = fig.add_subplot()
    curves = {k: sorted(c.duration_real_us for c in cs if c.duration_real_us > 0) for k, cs in _by_kind(colls).items()}
    curves = {k: xs for k, xs in curves.items() if xs}
    if not curves:
        no_data(ax, title, "no collective with a positive duration")
        return figure_png(fig)
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
    return figure_png(fig)


def _link_group(link: LinkSeries) -> str:
    return f"{link.tier} {link.plane}"


def _link_order(link: LinkSeries) -> tuple[int, str, str, str, int, str]:
    return (_TIER_ORDER.get(link.tier, len(_TIER_ORDER)), link.tier, link.plane, link.switch, link.port, link.peer)


def _plot_link_utilisation(result: RunResult, title: str) -> bytes:
    """A heat map: links on y grouped by tier and plane, real time on x, utilisation 0..1 as colour; faults
    as dashed red lines."""
    links = sorted(result.links, key=_link_order)
    samples = max((len(link.util) for link in links), default=0)
    fig = new_figure(9.0, min(max(2.8, 0.16 * len(links) + 1.8), 16.0))
    ax = fig.add_subplot()
    if samples == 0:
        no_data(ax, title, "no link utilisation recorded")
        return figure_png(fig)
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
    return figure_png(fig)


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
