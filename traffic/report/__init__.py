"""The report of a run: its summary, its files, and two runs side by side.

- `summarize(result) -> RunSummary`: step-time tails, per collective kind counts, bytes, latency tails and
  bandwidths, utilisation and communication share, the hottest link, fidelity, and what the report found
  inconsistent in the record (`checks`).
- `write_report(result, out_dir)`: `summary.json`, `collectives.csv`, `steps.csv`, `links.csv`, three PNG
  plots and one self-contained `report.html` (images inlined as data URIs, no external CSS, JS or links).
- `compare(a, b) -> Comparison`, `write_comparison(a, b, out_dir)`: `comparison.json`, `comparison.html`.
- `format_summary`, `format_comparison`: plain-text renderings for the CLI (the only CLI formatting here).

One concept a module:
- `summary`: the numbers and the checks (`summarize`, `compare`, `link_stats`, `slowest_steps`, their records);
  which samples each figure is over is in its docstring;
- `text`: the plain-text renderings;
- `files`: the CSV and JSON files, and `write_report` / `write_comparison`, which write all of a report's files;
- `plots`: the PNG plots (matplotlib, imported only when plotting);
- `html`: the self-contained pages.
Single numbers are formatted by `traffic.formatting`.
"""
from __future__ import annotations

from traffic.report.files import write_comparison, write_report
from traffic.report.html import LINKS_SHOWN as LINKS_SHOWN
from traffic.report.summary import BANDWIDTH_RTOL as BANDWIDTH_RTOL
from traffic.report.summary import IDENTITY_TOLERANCE_US as IDENTITY_TOLERANCE_US
from traffic.report.summary import (Comparison, ComparisonRow, KindSummary, LinkStats, RunSummary, compare, link_stats,
                                    slowest_steps, summarize)
from traffic.report.text import format_comparison, format_summary

__all__ = ["Comparison", "ComparisonRow", "KindSummary", "LinkStats", "RunSummary", "compare", "format_comparison",
           "format_summary", "link_stats", "slowest_steps", "summarize", "write_comparison", "write_report"]
