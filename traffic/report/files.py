"""The files of a report: `write_report(result, out_dir)` writes `summary.json`, `collectives.csv`,
`steps.csv`, `links.csv`, the three PNG plots and `report.html`; `write_comparison(a, b, out_dir)` writes
`comparison.json` and `comparison.html`. The CSV and JSON writers live here; the figures come from
`traffic.report.summary`, the plots from `traffic.report.plots`, the pages from `traffic.report.html`.
"""
from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from traffic.report.html import _comparison_html, _report_html
from traffic.report.plots import _positive_range, _run_plots, _step_top_us
from traffic.report.summary import LinkStats, compare, link_stats, slowest_steps, summarize
from traffic.results import CollectiveResult, RunResult, StepResult


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
    names = [f.name for f in fields(StepResult) if f.name != "exposed_by_stream_us"]
    streams = sorted({k for s in steps for k in s.exposed_by_stream_us})  # one column each: exposed_<stream>_us
    used = {id(s) for s in slowest_steps(steps)}
    ordered = sorted(steps, key=lambda s: (s.repeat, s.step, s.rank))
    return _write_csv(path, names + [f"exposed_{k}_us" for k in streams] + ["utilisation", "comm_share", "slowest"],
                      ([getattr(s, n) for n in names] + [s.exposed_by_stream_us.get(k, 0.0) for k in streams]
                       + [s.utilisation, s.comm_share, id(s) in used] for s in ordered))


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
