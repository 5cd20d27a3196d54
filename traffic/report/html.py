"""The HTML pages of a report: `report.html` (`_report_html`) and `comparison.html` (`_comparison_html`), each
one self-contained page: the plots inlined as data URIs, no external CSS, JS or links. Every text cell is
escaped here. The page parts (`html_page`, `html_table`, `png_img`) are also the pages' drawn above this
package (`fabriclab.render`'s compare.html), so every page looks alike.
"""
from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from traffic.formatting import NA, format_bps, format_bytes, format_ratio, format_share, format_us
from traffic.report.summary import Comparison, LinkStats, RunSummary
from traffic.report.text import _fmt_keyed, _fmt_unit, _largest_class_text
from traffic.results import Fidelity, RunMeta, RunResult

#: Links listed in report.html (all of them are in links.csv).
LINKS_SHOWN = 10


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


def html_table(header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1) -> str:
    """An HTML table of text cells (escaped here); the first `left` columns left-aligned."""
    def cells(tag: str, row: Sequence[str]) -> str:
        return "".join(f"<{tag}{' class=l' if i < left else ''}>{_e(v)}</{tag}>" for i, v in enumerate(row))
    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f"<table><tr>{cells('th', header)}</tr>{body}</table>"


def png_img(png: bytes, alt: str) -> str:
    """An <img> of the PNG inlined as a base64 data URI (no file, no link)."""
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def html_page(title: str, body: str) -> str:
    """A whole self-contained page: the title, this module's CSS inlined, `body` (HTML) as it is."""
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
            *((("resolved run", ", ".join(f"{k} {v}" for k, v in meta.spec.items() if k != "why")),
               *(("auto choice", w) for w in meta.spec.get("why", ()))) if meta.spec else ()),
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
    times = html_table(["step time (slowest rank)", "n", "mean", "p50", "p99", "p999", "max"],
                       [["real time", f"{p.n} steps", format_us(p.mean), format_us(p.p50), format_us(p.p99),
                         format_us(p.p999), format_us(p.max)]])
    shares = html_table(["share of step time", "mean of steps", "pooled (sums)"],
                        [["utilisation (compute)", format_share(s.utilisation_mean),
                          format_share(s.utilisation_pooled)],
                         ["communication share (exposed)", format_share(s.comm_share_mean),
                          format_share(s.comm_share_pooled)]])
    residual = _e(format_us(s.identity_max_residual_us))
    return f"{times}{shares}<p>Largest |step &minus; (compute + exposed + idle)| over all step rows: {residual}.</p>"


def _kinds_table(s: RunSummary) -> str:
    if not s.kinds:
        return "<p>No collectives recorded.</p>"
    return html_table(["kind", "count", "bytes (real)", "latency p50", "p99", "p999", "samples", "mean algbw",
                       "mean busbw", "busbw, largest size class"],
                      [[k.kind, str(k.count), format_bytes(k.total_bytes), format_us(k.latency_us.p50),
                        format_us(k.latency_us.p99), format_us(k.latency_us.p999), str(k.latency_us.n),
                        format_bps(k.mean_algbw_bps), format_bps(k.mean_busbw_bps), _largest_class_text(k)]
                       for k in s.kinds])


def _links_table(s: RunSummary, stats: Sequence[LinkStats]) -> str:
    hot = "".join(f"<p>Hottest {_e(h.tier)} link: <b>{_e(h.name)}</b> (plane {_e(h.plane)}), "
                  f"{_e(format_share(h.active_util))} utilised while collectives ran.</p>" for h in s.hottest_by_tier)
    if not stats:
        return "<p>No link utilisation recorded.</p>"
    top = sorted(stats, key=lambda x: (-(x.active_util if x.active_util is not None else -1.0), x.name))[:LINKS_SHOWN]
    table = html_table(["link", "tier", "plane", "bytes (emulated)", "mean util", "max util",
                        "util while collectives ran"],
                       [[x.name, x.tier, x.plane, format_bytes(x.bytes), format_share(x.mean_util),
                         format_share(x.max_util), format_share(x.active_util)] for x in top], left=3)
    return f"{hot}{table}<p>The {len(top)} hottest of {len(stats)} links (by utilisation while collectives ran); " \
           "all are in links.csv.</p>"


def _busiest_table(fid: Fidelity) -> str:
    if not fid.busiest_links:
        return ""
    def num(d: dict[str, Any], key: str) -> float | None:
        v = d.get(key)
        return float(v) if isinstance(v, (int, float)) else None
    return "<h3>Delivered vs bound on the busiest links</h3>" + html_table(
        ["link", "delivered (emulated)", "bound (emulated)", "delivered / bound"],
        [[str(d.get("link", NA)), format_bps(num(d, "delivered_bps")), format_bps(num(d, "bound_bps")),
          format_share(num(d, "ratio"))] for d in fid.busiest_links])


def _dicts_table(title: str, items: Sequence[dict[str, Any]], dilation: float) -> str:
    """Faults or controller events: one row each, columns in first-seen key order, values in their units."""
    if not items:
        return ""
    keys = list(dict.fromkeys(k for d in items for k in d))
    return f"<h2>{_e(title)}</h2>" + html_table(keys, [[_fmt_keyed(k, d[k], dilation) if k in d else "" for k in keys]
                                                        for d in items], left=len(keys))


def _report_html(result: RunResult, s: RunSummary, stats: Sequence[LinkStats], plots: dict[str, bytes]) -> str:
    meta = result.meta
    body = "".join([
        f"<h1>{_e(meta.workload)} on {_e(s.label)}</h1>",
        "<h2>Fidelity</h2>", _fidelity_banner(result.fidelity, s.checks, meta), _busiest_table(result.fidelity),
        "<h2>Run</h2>", html_table(["parameter", "value"], _meta_rows(meta)),
        f"<p>{_e(_dilation_sentence(meta))}</p><p>{_e(_compute_sentence(meta))}</p>",
        "<h2>Steps</h2>", _steps_table(s), png_img(plots["step_times.png"], "step times"),
        "<h2>Collectives</h2>", _kinds_table(s), png_img(plots["collective_latency_cdf.png"], "collective latency CDF"),
        "<h2>Links</h2>", _links_table(s, stats), png_img(plots["link_utilisation.png"], "link utilisation"),
        _dicts_table("Faults injected", result.faults, meta.dilation),
        _dicts_table("Controller events", result.events, meta.dilation),
    ])
    return html_page(f"fabriclab report: {meta.workload} on {s.label}", body)


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
    runs = html_table(["parameter", f"a: {c.a.label}", f"b: {c.b.label}"],
                      [[k, va, vb] for (k, va), (_, vb) in pairs_of_rows], left=3)
    warnings = "".join(f"<li>{_e(w)}</li>" for w in c.warnings)
    pairs = "".join(f'<h3>{_e(title)}</h3><div class="pair">{png_img(plots_a[name], "a: " + title)}'
                    f'{png_img(plots_b[name], "b: " + title)}</div>'
                    for name, title in (("step_times.png", "step time"),
                                        ("collective_latency_cdf.png", "collective latency CDF"),
                                        ("link_utilisation.png", "link utilisation")))
    body = "".join([
        f"<h1>{_e(c.a.label)} (a) vs {_e(c.b.label)} (b)</h1>",
        f'<div class="banner warn"><ul>{warnings}</ul></div>' if warnings else "",
        '<h2>Fidelity</h2><div class="pair">', f"<div><h3>a</h3>{_fidelity_banner(a.fidelity, c.a.checks)}</div>",
        f"<div><h3>b</h3>{_fidelity_banner(b.fidelity, c.b.checks)}</div></div>",
        "<h2>Side by side</h2>", html_table(["metric", "a", "b", "b / a"], _comparison_rows(c)),
        "<p>b / a below 1 means b is lower: faster for times, slower for bandwidths.</p>",
        "<h2>Runs</h2>", runs, _time_sentences(a.meta, b.meta),
        "<h2>Plots</h2>", pairs,
    ])
    return html_page(f"fabriclab comparison: {c.a.label} vs {c.b.label}", body)
