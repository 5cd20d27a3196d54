"""One generated LLM training step on the simulator at 1,024 GPUs: what it costs to build, plan and
simulate, and what it gives (no root).

    .venv/bin/python benchmarks/llm_step.py [--spec gpt3-175b gpt3-175b,parallel.pp=16,parallel.dp=8]
                                            [--topology dual-plane-1024-rail pyramid-1024-rail]
                                            [--routing adaptive] [--json FILE]

For every (spec, topology) pair, in this process, one after the other:
- build: `traffic.llm.build_workload` (the config's collectives on every rank, the 1F1B schedule and its
  nominal timeline);
- plan: `traffic.replay.simulate.plan_for_simulation` (calls matched across ranks, transfer DAGs, the
  placement, the connections);
- simulate: `traffic.replay.simulate.simulate_plan` under `--routing`, as `fabriclab sim` runs it, with
  the simulator's events (rate computations) and the calls (jobs) it ran;
- result: `traffic.replay.result.build_result` (every rank's step composed with the measured durations).
Each row prints the wall times, the calls, events per step, and the step: time (slowest rank), exposed
communication share and MFU. Target (issue 26): one step of the 175B preset at 1,024 GPUs simulates in
<= 60 s on this machine (the simulate column; the others are printed beside it).
Partial results are kept: `--json FILE` is rewritten after every row.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_S = 60.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(spec: str, topology: str, routing: str) -> dict[str, Any]:
    from fabric import topofile
    from traffic import report
    from traffic.llm import build_workload, load_config
    from traffic.replay import ReplayOptions
    from traffic.replay.result import build_result
    from traffic.replay.simulate import plan_for_simulation, simulate_plan

    t0 = time.monotonic()
    workload = build_workload(load_config(spec))
    t1 = time.monotonic()
    fabric = topofile.load(topology)
    plan = plan_for_simulation(workload, fabric, ReplayOptions(ports="planned" if routing == "adaptive" else "hashed"))
    t2 = time.monotonic()
    run = simulate_plan(plan, routing)
    t3 = time.monotonic()
    result = build_result(plan, run, trace=f"llm:{spec}", routing=routing)
    t4 = time.monotonic()
    summary = report.summarize(result)
    cost = next((n for n in run.notes if n.startswith("simulator cost")), "")
    steps = max(1, workload.steps)
    p = summary.step_time_us
    return {"spec": spec, "topology": fabric.name, "routing": routing, "ranks": workload.world_size,
            "collectives": sum(1 for _ in workload.collectives()), "calls": len(plan.calls), "steps": steps,
            "build_s": t1 - t0, "plan_s": t2 - t1, "simulate_s": t3 - t2, "result_s": t4 - t3,
            "simulator_cost": cost, "step_mean_us": p.mean if p else None, "step_p99_us": p.p99 if p else None,
            "comm_share": summary.comm_share_mean, "mfu": summary.mfu, "peak_rss_mb": peak_rss_mb(),
            "target": "met" if t3 - t2 <= TARGET_S else "missed"}


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", nargs="+", default=["gpt3-175b", "gpt3-175b,parallel.pp=16,parallel.dp=8"])
    ap.add_argument("--topology", nargs="+", default=["dual-plane-1024-rail", "pyramid-1024-rail"])
    ap.add_argument("--routing", default="adaptive")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    console = Console(stderr=True)
    rows: list[dict[str, Any]] = []
    for spec in args.spec:
        for topo in args.topology:
            with console.status(f"{spec} on {topo} ({args.routing})"):
                rows.append(one(spec, topo, args.routing))
            r = rows[-1]
            console.print(f"{spec} on {r['topology']}: build {r['build_s']:.1f} s, plan {r['plan_s']:.1f} s, "
                          f"simulate {r['simulate_s']:.1f} s, result {r['result_s']:.1f} s; {r['calls']} calls")
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    table = Table(title=f"one generated step at 1,024 GPUs ({args.routing}); target simulate <= {TARGET_S:g} s")
    for col in ("spec", "fabric", "build", "plan", "simulate", "result", "calls", "simulator cost", "step",
                "exposed comm", "MFU", "peak", "target"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["spec"], r["topology"], f"{r['build_s']:.1f} s", f"{r['plan_s']:.1f} s",
                      f"{r['simulate_s']:.1f} s", f"{r['result_s']:.1f} s", f"{r['calls']:,}",
                      r["simulator_cost"].removeprefix("simulator cost: "),
                      f"{r['step_mean_us'] / 1e3:.1f} ms" if r["step_mean_us"] else "-",
                      f"{r['comm_share']:.1%}" if r["comm_share"] is not None else "-",
                      f"{r['mfu']:.1%}" if r["mfu"] is not None else "-", f"{r['peak_rss_mb']:.0f} MB", r["target"])
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
