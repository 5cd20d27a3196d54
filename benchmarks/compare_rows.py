"""What one row of `fabriclab compare --model` costs at 1,024 GPUs, stragglers off and on, at the default time
resolution of generated LLM steps (5 us) against the exact one (1 ns), measured in the same run (no root).

    .venv/bin/python benchmarks/compare_rows.py [--model gpt3-175b] [--gpus 1024]
                                                [--series pyramid-1024-rail:ecmp dual-plane-1024-rail:adaptive]
                                                [--stragglers stragglers.jitter_cv=0.05] [--no-exact] [--json FILE]

Each row runs alone, as its own `fabriclab compare --model SPEC --topology T --routing R --sizes N --jobs 1
--no-cache` process (the straggler row with the overrides in the spec, as `compare --stragglers` makes it), so
its wall time is the row's whole cost: start-up, building the step, planning, simulating and the result. Per
row: the wall time and the CPU time of the process and its descendants, the local Ray instance's workers
included (`benchmarks/proctree.py`, sampled every 0.2 s: on a machine shared with other work the wall time
grows, the CPU time much less), the largest process's peak memory, the row's own `sim_wall_s`, the step, its p99
and the pipeline busbw; then, for each row, the same at the exact resolution (the baseline: `--resolution-us
0.001`), the speedup and the step's error. Target (issue 27): each row <= 60 s at 1,024 GPUs on this machine.
Partial results are kept: `--json FILE` is rewritten after every run.
"""
from __future__ import annotations

import argparse
import json
import os
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

TARGET_S = 60.0
EXACT_US = 0.001


def run_row(model: str, topology: str, routing: str, gpus: int, resolution_us: float | None,
            root: Path = ROOT) -> dict[str, Any]:
    """One row in a `fabriclab compare` process of its own (the checkout at `root`): its figures and what it cost."""
    with tempfile.TemporaryDirectory(prefix="fabriclab-rows-") as tmp:
        cmd = [sys.executable, "-m", "fabriclab.cli", "compare", "--model", model, "--topology", topology,
               "--routing", routing, "--sizes", str(gpus), "--jobs", "1", "--no-cache", "--out", tmp]
        if resolution_us is not None:
            cmd += ["--resolution-us", f"{resolution_us:g}"]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=os.environ | {"PYTHONPATH": str(root)})
        sampler = proctree.TreeSampler(proc.pid, every_s=0.2)
        sampler.start()
        _, err = proc.communicate()
        wall = time.monotonic() - t0
        sampler.stop.set()
        sampler.join()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
        doc = json.loads((Path(tmp) / "compare.json").read_text())
    row = doc["rows"][0]
    return {"model": model, "topology": topology, "routing": routing, "gpus": gpus,
            "resolution_us": doc["meta"]["sim"]["resolution_s"] * 1e6, "wall_s": wall,
            "cpu_s": sum(sampler.cpu_s.values()), "peak_mb": max(sampler.hwm_mb.values(), default=0.0),
            "sim_wall_s": row["sim_wall_s"], "step_mean_us": row["step_mean_us"], "step_p99_us": row["step_p99_us"],
            "pp_busbw_bps": row["busbw_by_group"].get("pp", 0.0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--series", nargs="+", default=["pyramid-1024-rail:ecmp", "dual-plane-1024-rail:adaptive"],
                    metavar="TOPOLOGY:ROUTING")
    ap.add_argument("--stragglers", default="stragglers.jitter_cv=0.05",
                    help="the straggler overrides of the second row per series ('' for none)")
    ap.add_argument("--no-exact", action="store_true", help="skip the exact-resolution baseline")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from fabriclab.study.spec import WorkloadSpec

    variants = [("", args.model)] + ([("stragglers", f"{args.model},{args.stragglers}")] if args.stragglers else [])
    out: list[dict[str, Any]] = []
    for item in args.series:
        topology, _, routing = item.partition(":")
        for variant, model in variants:
            WorkloadSpec.model(model).at(args.gpus)  # a bad spec fails here, before minutes of runs
            for res in (None, EXACT_US) if not args.no_exact else (None,):
                r = run_row(model, topology, routing, args.gpus, res) | {"variant": variant}
                out.append(r)
                print(f"{topology} {routing} {variant or 'base'} at {r['resolution_us']:g} us: wall {r['wall_s']:.1f} s, "
                      f"cpu {r['cpu_s']:.1f} s, step {r['step_mean_us'] / 1e6:.4f} s", file=sys.stderr, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(out, indent=2))
    print(f"| row ({args.model}, {args.gpus} GPUs) | resolution | wall | CPU | peak memory | <= {TARGET_S:g} s | step | "
          "p99 | PP busbw | exact: wall | speedup | step error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in out:
        if r["resolution_us"] == EXACT_US and not args.no_exact:
            continue
        exact = next((e for e in out if e["resolution_us"] == EXACT_US and e["topology"] == r["topology"]
                      and e["variant"] == r["variant"] and e is not r), None)
        ex = (f"{exact['wall_s']:.1f} s | {exact['wall_s'] / r['wall_s']:.2f}x | "
              f"{(r['step_mean_us'] / exact['step_mean_us'] - 1) * 100:+.3f}%") if exact else "- | - | -"
        print(f"| {r['topology']} ({r['routing']}){', ' + r['variant'] if r['variant'] else ''} | "
              f"{r['resolution_us']:g} us | {r['wall_s']:.1f} s | {r['cpu_s']:.1f} s | {r['peak_mb']:,.0f} MB | "
              f"{'yes' if r['wall_s'] <= TARGET_S else 'NO'} | {r['step_mean_us'] / 1e6:.4f} s | "
              f"{r['step_p99_us'] / 1e6:.4f} s | {r['pp_busbw_bps'] / 1e9:.0f} Gbit/s | {ex} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
