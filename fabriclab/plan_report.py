"""The results of `fabriclab plan` (`fabriclab.planner`): per design its row, parts, cost, efficiency and
whether it is on the Pareto front of step time against cost; written as a table (plan.txt), CSV, JSON and
one plot (plan.png: step against cost, the front highlighted, every design labelled).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric import parts as parts_mod
from fabriclab.study.verdicts import TIE_TOLERANCE, Row
from fabriclab.planner import Planned


#: steps closer than this (relative) count as equal on the front: compare's tie, the ~1% a congested row is
#: determined to (a delivery shifted by a us moves it that much: docs/simulator.md#resolution)
STEP_REL_TOL = TIE_TOLERANCE


def pareto_front(points: Sequence[tuple[float, float]], rel_tol: float = STEP_REL_TOL) -> list[bool]:
    """Which (cost, step) points no other point dominates: none is at most as costly and at most as slow
    and better in one. Steps within `rel_tol` of each other count as equal, so a dearer design is not on
    the front for a step shorter by noise. NaN points (not run yet) are never on the front."""
    def ok(p: tuple[float, float]) -> bool:
        return not (math.isnan(p[0]) or math.isnan(p[1]))

    def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
        same_step = math.isclose(a[1], b[1], rel_tol=rel_tol)
        no_worse = a[0] <= b[0] and (a[1] <= b[1] or same_step)
        return no_worse and (a[0] < b[0] or (a[1] < b[1] and not same_step))

    return [ok(p) and not any(j != i and ok(q) and dominates(q, p) for j, q in enumerate(points))
            for i, p in enumerate(points)]


@dataclass(frozen=True)
class DesignResult:
    name: str
    choices: dict[str, Any]
    builder: str
    params: dict[str, Any]
    files: dict[str, str]
    bill: parts_mod.Bill
    cost_by_kind: dict[str, float]
    row: Row | None  # None until its simulation finished
    reference: Row | None
    pareto: bool = False

    @property
    def cost(self) -> float:
        return sum(self.cost_by_kind.values())

    @property
    def step_mean_us(self) -> float:
        return self.row.step_mean_us if self.row else math.nan

    @property
    def efficiency(self) -> float:
        if self.row is None or self.reference is None:
            return math.nan
        return self.reference.step_mean_us / self.row.step_mean_us


def results(planned: Sequence[Planned], files: Mapping[str, Mapping[str, str]],
            refs: Mapping[tuple[float, int, float], Path], rows: Sequence[Row],
            prices: parts_mod.Prices) -> list[DesignResult]:
    """Every design with its bill, cost, row (where finished), reference row and Pareto mark, in design order."""
    by_variant = {r.variant: r for r in rows}
    out = []
    for p in planned:
        b = parts_mod.bill(p.fabric, p.choices["port_gbps"])
        key = (p.gpu_gbps, p.fabric.gpus_per_server, p.fabric.nvlink_gbps)
        ref = by_variant.get(f"reference:{refs[key].stem}") if key in refs else None
        out.append(DesignResult(p.name, p.choices, p.builder, p.params, dict(files.get(p.name, {})), b,
                                parts_mod.cost(b, prices), by_variant.get(p.name), ref))
    front = pareto_front([(r.cost, r.step_mean_us) for r in out])
    return [dataclasses.replace(r, pareto=f) for r, f in zip(out, front)]


def _switches_text(b: parts_mod.Bill) -> str:
    return ", ".join(f"{p.count} {p.tier} x {p.size:g}p" for p in b.switches())


def _tiers_text(b: parts_mod.Bill, kind: str) -> str:
    return ", ".join(f"{t} {n:,}" for t, n in b.by_tier(kind).items())


def result_doc(r: DesignResult) -> dict[str, Any]:
    """A design's result as JSON."""
    row = dataclasses.asdict(r.row) if r.row else None
    return {"name": r.name, "choices": r.choices, "builder": r.builder, "params": r.params, "files": r.files,
            "step_mean_us": r.step_mean_us, "step_p99_us": r.row.step_p99_us if r.row else None,
            "comm_share": r.row.comm_share if r.row else None, "efficiency": r.efficiency,
            "reference": r.reference.fabric if r.reference else None,
            "reference_step_us": r.reference.step_mean_us if r.reference else None,
            "cost": r.cost, "cost_by_kind": r.cost_by_kind, "pareto": r.pareto,
            "parts": {"port_gbps": r.bill.port_gbps, "rounded_up_gbps": r.bill.rounded_up_gbps,
                      "lines": [dataclasses.asdict(p) for p in r.bill.parts],
                      "switches": r.bill.total("switch"), "switch_ports": r.bill.total("switch_port"),
                      "optics": r.bill.total("optic"), "links": r.bill.total("link"),
                      "nic_ports": r.bill.total("nic_port")},
            "row": row}


CSV_FIELDS = ("name", "fabric", "plane", "edge_oversubscription", "agg_oversubscription", "wiring", "routing",
              "nic_gbps", "spines", "hosts_per_edge", "gpus_per_server", "step_mean_us", "step_p99_us", "comm_share",
              "efficiency", "utilisation", "mfu", "cost", *(f"cost_{k}" for k in parts_mod.KINDS), "switches",
              "switch_ports", "optics", "links", "pareto", "topology", "sim_wall_s", "cached")


def csv_text(res: Sequence[DesignResult]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_FIELDS))
    w.writeheader()
    for r in res:
        c = r.choices
        w.writerow({**{k: c.get(k) for k in CSV_FIELDS if k in c}, "name": r.name,
                    "step_mean_us": r.row.step_mean_us if r.row else "",
                    "step_p99_us": r.row.step_p99_us if r.row else "", "comm_share": r.row.comm_share if r.row else "",
                    "efficiency": "" if math.isnan(r.efficiency) else r.efficiency,
                    "utilisation": r.row.utilisation if r.row else "", "mfu": r.row.mfu if r.row else "",
                    "cost": r.cost, **{f"cost_{k}": v for k, v in r.cost_by_kind.items()},
                    "switches": r.bill.total("switch"), "switch_ports": r.bill.total("switch_port"),
                    "optics": r.bill.total("optic"), "links": r.bill.total("link"), "pareto": r.pareto,
                    "topology": r.files.get("file", ""), "sim_wall_s": r.row.sim_wall_s if r.row else "",
                    "cached": r.row.cached if r.row else ""})
    return buf.getvalue()


def format_table(res: Sequence[DesignResult], prices: parts_mod.Prices, gpus: int, workload: str) -> str:
    """The designs by cost, the front marked, then each design's parts."""
    from traffic.formatting import format_share, format_us

    order = sorted(res, key=lambda r: (r.cost, r.step_mean_us if r.row else math.inf, r.name))
    head = ["", "design", "routing", "step", "p99", "comm", "eff", f"cost ({prices.unit})", "switches", "ports",
            "optics"]
    table = [head]
    for r in order:
        table.append(["*" if r.pareto else "", r.name, r.choices["routing"],
                      format_us(r.row.step_mean_us) if r.row else "-", format_us(r.row.step_p99_us) if r.row else "-",
                      format_share(r.row.comm_share) if r.row else "-",
                      "-" if math.isnan(r.efficiency) else f"{r.efficiency:.3f}", f"{r.cost:,.0f}",
                      f"{r.bill.total('switch'):,}", f"{r.bill.total('switch_port'):,}", f"{r.bill.total('optic'):,}"])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [(f"{workload} at {gpus} GPUs: {len(res)} designs ({sum(r.row is not None for r in res)} simulated), "
              "by cost; * on the Pareto front of step time against cost")]
    lines += ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
              for row in table]
    refs = sorted({(r.reference.fabric, r.reference.step_mean_us) for r in res if r.reference})
    lines.append("")
    lines.append("eff: the reference's step over the design's (throughput per GPU against one non-blocking switch "
                 "holding every GPU at the same NIC bandwidth" + (": " + ", ".join(f"{f} {format_us(s)}" for f, s in refs)
                                                                  if refs else "") + ")")
    lines.append(f"cost: {_price_text(prices)}; a link is {parts_mod.OPTICS_PER_LINK} optics (one at each end) and "
                 "a cable; switch-to-switch links at the port speed, as many as their rate needs (docs/planner.md)")
    lines.append("")
    lines.append("parts per design (switches by role x radix in ports; switch ports and optics by tier):")
    for r in order:
        b = r.bill
        extra = f"; rounded up {b.rounded_up_gbps:,.0f} Gbit/s above the model's links" if b.rounded_up_gbps > 1e-6 else ""
        lines.append(f"  {r.name}: {_switches_text(b)}; ports {_tiers_text(b, 'switch_port')}; optics "
                     f"{_tiers_text(b, 'optic')}; uplink ports {b.port_gbps:g}G{extra}")
    return "\n".join(lines)


def _price_text(prices: parts_mod.Prices) -> str:
    bits = []
    for k in parts_mod.KINDS:
        v = getattr(prices, k)
        if isinstance(v, dict):
            bits.append(f"{k} " + "/".join(f"{s}:{x:g}" for s, x in v.items()))
        elif v:
            bits.append(f"{k} {v:g}")
    return f"{', '.join(bits) or 'nothing priced'} {prices.unit}"


#: the plot shows steps up to this many times the fastest design's; slower ones are marked at its top edge
PLOT_STEP_SPAN = 1.35
#: label offsets tried in turn (points), the first that overlaps no label placed before is taken
_LABEL_OFFSETS = ((6, 5), (6, -11), (6, 14), (6, -20), (-6, 5), (-6, -11), (6, 23), (6, -29), (-6, 14), (-6, -20))


def plot_png(res: Sequence[DesignResult], title: str, unit: str) -> bytes:
    """Step time against cost, one point per simulated design, labelled; the Pareto front highlighted
    (joined as a staircase in cost order); each reference's step as a dashed line. Steps beyond
    PLOT_STEP_SPAN x the fastest are drawn as triangles at the top edge with their step in the label, so
    one very slow design does not flatten the others."""
    from traffic.report.plots import agg_renderer, figure_png, new_figure

    fig = new_figure(11.0, 7.0)
    renderer = agg_renderer(fig)
    ax = fig.add_subplot()
    done = sorted((r for r in res if r.row is not None), key=lambda r: (r.cost, r.step_mean_us))
    if not done:
        ax.text(0.5, 0.5, "no design simulated yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        refs = sorted({(r.reference.fabric, r.reference.step_mean_us) for r in done if r.reference})
        low = min([r.step_mean_us for r in done] + [s for _, s in refs]) / 1e6
        top = max(r.step_mean_us for r in done) / 1e6
        cap = min(top, low * PLOT_STEP_SPAN)
        y_max = cap + (cap - low) * 0.08 if cap > low else low * 1.01

        def y(r: DesignResult) -> float:
            return min(r.step_mean_us / 1e6, y_max)

        for pareto, colour, size, label in ((False, "#8c8c8c", 36, "dominated"), (True, "#c44e52", 64, "on the front")):
            pts = [r for r in done if r.pareto == pareto]
            inside = [r for r in pts if r.step_mean_us / 1e6 <= y_max]
            beyond = [r for r in pts if r.step_mean_us / 1e6 > y_max]
            ax.scatter([r.cost for r in inside], [y(r) for r in inside], color=colour, s=size, zorder=3, label=label)
            if beyond:
                ax.scatter([r.cost for r in beyond], [y(r) for r in beyond], color=colour, s=size, marker="^",
                           zorder=3, clip_on=False)
        on = [r for r in done if r.pareto]
        ax.plot([r.cost for r in on], [y(r) for r in on], "-", color="#c44e52", zorder=2, drawstyle="steps-post",
                label="Pareto front")
        for fab, step in refs:
            ax.axhline(step / 1e6, linestyle="--", color="#4c72b0", linewidth=1, label=f"{fab} (non-blocking reference)")
        ax.set_ylim(low - (y_max - low) * 0.06, y_max)
        ax.margins(x=0.15)
        ax.set_xlabel(f"cost ({unit})")
        ax.set_ylabel("step time, mean (s)")
        ax.grid(True, alpha=0.3)
        legend = ax.legend(loc="upper left", fontsize=8)
        placed = [legend.get_window_extent(renderer)]
        for r in done:
            text = r.name + (f" ({r.step_mean_us / 1e6:.3g} s)" if r.step_mean_us / 1e6 > y_max else "")
            colour = "#c44e52" if r.pareto else "#404040"
            for dx, dy in _LABEL_OFFSETS:
                ann = ax.annotate(text, (r.cost, y(r)), xytext=(dx, dy), textcoords="offset points", fontsize=7,
                                  color=colour, ha="left" if dx > 0 else "right", annotation_clip=False)
                box = ann.get_window_extent(renderer)
                if not any(box.overlaps(b) for b in placed):
                    break
                ann.remove()
            else:  # every offset overlaps: the first, overlapping
                ann = ax.annotate(text, (r.cost, y(r)), xytext=_LABEL_OFFSETS[0], textcoords="offset points",
                                  fontsize=7, color=colour, annotation_clip=False)
                box = ann.get_window_extent(renderer)
            placed.append(box)
    ax.set_title(textwrap.fill(title, 120), fontsize=10)
    return figure_png(fig)


@dataclass
class Outputs:
    """Where a plan writes: plan.json, plan.csv, plan.txt and plan.png in `out_dir`."""

    out_dir: Path
    paths: list[Path] = field(default_factory=list)

    def write(self, res: Sequence[DesignResult], prices: parts_mod.Prices, meta: dict[str, Any], gpus: int,
              workload: str) -> list[Path]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        paths = [self.out_dir / n for n in ("plan.json", "plan.csv", "plan.txt", "plan.png")]
        doc = {"meta": meta, "prices": prices.model_dump(), "designs": [result_doc(r) for r in res]}
        text = format_table(res, prices, gpus, workload)
        png = plot_png(res, f"{workload}, {gpus} GPUs: step time against cost", prices.unit)
        for path, data in zip(paths, (json.dumps(doc, indent=2, default=str), csv_text(res), text + "\n")):
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(data)
            tmp.replace(path)
        tmp = paths[3].with_suffix(".png.tmp")
        tmp.write_bytes(png)
        tmp.replace(paths[3])
        self.paths = paths
        return paths
