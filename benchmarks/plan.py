"""`fabriclab plan` on a 1,024-GPU LLM preset over the shipped designs (plans/designs.yaml), timed: the wall
time of the whole plan, each row's simulation time, peak memory, and the table for benchmarks/RESULTS.md
(issue 28 §2: at least 12 designs in at most 20 minutes on the 2-core machine; no root).

    .venv/bin/python benchmarks/plan.py [--model gpt3-175b] [--gpus 1024] [--designs FILE] [--jobs 2]
                                        [--out DIR] [--png FILE] [--cache DIR | --no-cache] [--quick]

Runs `fabriclab plan` as a user does, in a child process: its wall time from outside, the CPU time and
the largest peak memory of the child and every process under it (its local Ray instance and workers),
sampled from /proc each second, and the machine's 5-minute load average before and after (on a shared
machine the wall time depends on the others); with no cache by default so that every row is
computed; then reads plan.json and prints markdown: the command, the date, the wall time, and per design
(cheapest first) its step, p99, communication share, efficiency, cost, parts and row time, the Pareto
front marked. `--png FILE` copies the plot there (the figure in RESULTS). `--quick`: the main job's 16-GPU
slice over three designs, for a test of the script.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import proctree  # noqa: E402  (benchmarks/proctree.py, beside this script)

QUICK_DESIGNS = """\
defaults: {gpus_per_server: 4, hosts_per_edge: 4, wiring: server, port_gbps: 200}
sweep:
  - {fabric: pyramid, edge_oversubscription: [1, 4], tors_per_pod: 2, aggs_per_pod: 2, spines: 2}
designs:
  - {fabric: dual-plane, spines: 4}
"""


def run(args: argparse.Namespace, out: Path, designs: str | None) -> tuple[int, float, float, float, str]:
    """`fabriclab plan` in a child; (exit code, wall s, CPU s of the child and its descendants, peak RSS of
    the largest of them in MB, stderr tail)."""
    cmd = [sys.executable, "-m", "fabriclab.cli", "plan", "--model", args.model, "--gpus", str(args.gpus),
           "--out", str(out), "--jobs", str(args.jobs)]
    if designs:
        cmd += ["--designs", designs]
    cmd += ["--no-cache"] if args.cache is None else ["--cache", args.cache]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = proctree.TreeSampler(proc.pid)
    sampler.start()
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    return proc.returncode, wall, sum(sampler.cpu_s.values()), max(sampler.hwm_mb.values(), default=0.0), err[-3000:]


def _s(us: float | None) -> str:
    return "-" if us is None or (isinstance(us, float) and math.isnan(us)) else f"{us / 1e6:.3f} s"


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec:02d} s"


def markdown(doc: dict[str, Any], cmd: str, wall_s: float, cpu_s: float, peak_mb: float,
             load: tuple[float, float]) -> str:
    designs = sorted(doc["designs"], key=lambda d: (d["cost"], d["step_mean_us"] or math.inf))
    rows = [d for d in designs if d["row"]]
    sim = doc["meta"]["sim"]
    lines = [f"Command: `{cmd}` ({datetime.date.today().isoformat()}; {len(designs)} designs and "
             f"{doc['meta']['rows_expected'] - len(designs)} reference row(s) in {_dur(wall_s)} wall and "
             f"{_dur(cpu_s)} of CPU (the plan, its Ray instance and workers, sampled), --jobs {doc['meta'].get('jobs', '?')}, "
             f"resolution {sim['resolution_s'] * 1e6:g} us; the largest process peaked at {peak_mb:,.0f} MB; load "
             f"average {load[0]:.1f} at the start and {load[1]:.1f} at the end on {os.cpu_count()} cores)", "",
             "| | design | routing | step | p99 | comm | eff | cost (units) | switches (role x radix) | switch ports "
             "| optics | row wall |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in designs:
        r = d["row"]
        sw = ", ".join(f"{p['count']} {p['tier']} x {p['size']:g}" for p in d["parts"]["lines"] if p["kind"] == "switch")
        eff = d["efficiency"]
        comm = "-" if r is None else f"{d['comm_share']:.1%}"
        eff_text = "-" if eff is None or (isinstance(eff, float) and math.isnan(eff)) else f"{eff:.3f}"
        row_wall = "-" if r is None else f"{r['sim_wall_s']:.0f} s"
        lines.append(f"| {'*' if d['pareto'] else ''} | {d['name']} | {d['choices']['routing']} | {_s(d['step_mean_us'])} "
                     f"| {_s(d['step_p99_us'])} | {comm} | {eff_text} | {d['cost']:,.0f} | {sw} "
                     f"| {d['parts']['switch_ports']:,} | {d['parts']['optics']:,} | {row_wall} |")
    refs = sorted({(d["reference"], d["reference_step_us"]) for d in rows if d["reference"]})
    lines += ["", "* on the Pareto front of step against cost. eff: the reference's step over the design's ("
              + ", ".join(f"{f}: {_s(s)}" for f, s in refs) + ")."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--designs", help="designs file (default: the shipped plans/designs.yaml)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", help="plan output directory (default: a temporary one)")
    ap.add_argument("--png", help="copy plan.png here")
    ap.add_argument("--cache", default=None, help="row cache (default: none, every row computed); an empty one "
                    "times every row too and keeps them, so the outputs can be rendered again in seconds")
    ap.add_argument("--quick", action="store_true", help="the main job's 16-GPU slice, three designs (for the test)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="plan-bench-"))
    designs = args.designs
    if args.quick:
        from fabriclab.study.main_job import MAIN_TRACE

        args.model, args.gpus = MAIN_TRACE, 16
        designs = str(tmp / "designs.yaml")
        Path(designs).write_text(QUICK_DESIGNS)
    out = Path(args.out) if args.out else tmp / "plan"
    fresh = args.cache is None or not Path(args.cache).exists() or not any(Path(args.cache).iterdir())
    load0 = os.getloadavg()[1]
    code, wall, cpu, peak, err = run(args, out, designs)
    load1 = os.getloadavg()[1]
    if code != 0:
        print(f"fabriclab plan exited {code}:\n{err}", file=sys.stderr)
        return code
    doc = json.loads((out / "plan.json").read_text())
    doc["meta"]["jobs"] = args.jobs
    cmd = (f"fabriclab plan --model {args.model} --gpus {args.gpus} --jobs {args.jobs}"
           + (f" --designs {args.designs}" if args.designs else "")
           + (" --no-cache" if args.cache is None else f" --cache {args.cache}"
              + (" (empty at the start: every row computed)" if fresh else " (rows read from it are not timed)")))
    print(markdown(doc, cmd, wall, cpu, peak, (load0, load1)))
    if args.png:
        shutil.copyfile(out / "plan.png", args.png)
        print(f"\nplot: {args.png}")
    if not args.out:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
