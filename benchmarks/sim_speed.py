"""The simulator's speed (issue 44): rows of `fabriclab compare --jobs 1 --no-cache`, each alone in a process of its
own, timed for this checkout and for a baseline checkout in the same run (the same machine, the same moment), with
the ratios and the step's difference. No root.

    git worktree add /tmp/base <rev>            # the baseline: "today", the commit before the change measured
    .venv/bin/python benchmarks/sim_speed.py --baseline /tmp/base [--rows gpt3-175b:1024:dual-plane-1024-rail:adaptive
                                                                          ...] [--json FILE]

Per row and checkout (`benchmarks/compare_rows.run_row`): the whole process's wall time (CLI start, Ray where the
checkout starts it, the row), the row's own time (its `sim_wall_s`: build, plan, simulate, result), the peak memory
of its largest process, and the step. The baseline runs first, then this checkout, row by row. Partial results are
kept: `--json FILE` is rewritten after every run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from compare_rows import run_row  # noqa: E402  (beside this script)

DEFAULT_ROWS = ("gpt3-175b:1024:dual-plane-1024-rail:adaptive", "gpt3-175b:1024:pyramid-1024-rail:ecmp")


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| row | checkout | whole s | own s | peak MB | step s | whole x | own x | step vs baseline |",
             "|---|---|---|---|---|---|---|---|---|"]
    base: dict[str, dict[str, Any]] = {}
    for r in results:
        key = f"{r['model']} {r['gpus']} {r['topology']} {r['routing']}"
        if r["checkout"] == "baseline":
            base[key] = r
        b = base.get(key) if r["checkout"] != "baseline" else None
        ratio = (f"{b['wall_s'] / r['wall_s']:.2f} | {b['sim_wall_s'] / r['sim_wall_s']:.2f} | "
                 f"{(r['step_mean_us'] / b['step_mean_us'] - 1) * 100:+.4f}%") if b else " | | "
        lines.append(f"| {key} | {r['checkout']} | {r['wall_s']:.1f} | {r['sim_wall_s']:.1f} | {r['peak_mb']:.0f} | "
                     f"{r['step_mean_us'] / 1e6:.4f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="a checkout of the baseline (e.g. a git worktree); none: this only")
    ap.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), metavar="MODEL:GPUS:TOPOLOGY:ROUTING")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    results: list[dict[str, Any]] = []
    checkouts = ([("baseline", a.baseline.resolve())] if a.baseline else []) + [("this", ROOT)]
    for spec in a.rows:
        model, gpus, topology, routing = spec.split(":")
        for name, root in checkouts:
            r = run_row(model, topology, routing, int(gpus), None, root=root)
            r["checkout"] = name
            results.append(r)
            print(f"{spec} {name}: whole {r['wall_s']:.1f} s, own {r['sim_wall_s']:.1f} s, peak {r['peak_mb']:.0f} MB,"
                  f" step {r['step_mean_us'] / 1e6:.6f} s", file=sys.stderr, flush=True)
            if a.json:
                a.json.write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
