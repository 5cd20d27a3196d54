"""Trace replay figures (needs root and Open vSwitch): busbw against the goodput bound, and fabric against fabric.

    sudo .venv/bin/python benchmarks/replay.py [--sizes-mb 1 4 16 64] [--reps 3] [--traces resnet dlrm]

1. Ring all-reduce over 16 ranks on an idle dual-plane-16 (adaptive), one size after another, all at
   one dilation (the default the replay chooses for the largest size): median real-unit busbw of
   `--reps` repetitions, and its ratio to the goodput bound computed from the emulated link rates
   (1448 payload bytes per 1514-byte frame, less ~2% for ACKs). Small sizes pay the per-step latency
   (as NCCL's small messages do), large ones approach the bound.
2. dual-plane-16 with adaptive routing against pyramid-16 with ECMP on real traces mapped onto 16
   ranks (the replay's defaults: planned source ports under adaptive, hashed under ECMP): step time
   mean and p99 and busbw per kind; the ratio pyramid / dual-plane, measured in the same run.
Traces are read from $FABRICLAB_TRACES (default ../shared/traces).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from pathlib import Path

from fabric import topofile
from fabriclab.backends import Emulated, run_workload
from traffic import report
from traffic.replay import ReplayOptions, plan_replay
from traffic.traces import load
from traffic.workload import Collective, RankTrace, Step, Workload

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(os.environ.get("FABRICLAB_TRACES", ROOT.parent / "shared" / "traces"))
TRACE_FILES = {"resnet": TRACES / "kineto" / "resnet50_ddp_2xA100_rank0.json.gz",
               "dlrm": TRACES / "kineto" / "dlrm_8xV100_step12",
               "builtin": ROOT / "traffic" / "data" / "builtin"}
GOODPUT = 1448 / 1514 * 0.98


def ring_workload(size_bytes: int, n: int = 16) -> Workload:
    c = Collective("all_reduce", size_bytes, "float32", tuple(range(n)), "0", 100.0, 1000.0)
    step = Step(0, 2000.0, ((0.0, 100.0),), (c,))
    return Workload("ring", "synthetic", "kineto", n, tuple(RankTrace(r, (step,)) for r in range(n)), True)


def first_steps(w: Workload, n: int) -> Workload:
    return dataclasses.replace(w, ranks=tuple(dataclasses.replace(r, steps=r.steps[:n]) for r in w.ranks))


def busbw_rows(sizes_mb: list[float], reps: int, out: Path) -> list[dict[str, float]]:
    fab = topofile.load("dual-plane-16")
    dilation = plan_replay(ring_workload(int(max(sizes_mb) * 1e6)), fab, ReplayOptions()).dilation
    rows = []
    for mb in sizes_mb:
        res = run_workload(ring_workload(int(mb * 1e6)), "synthetic", fab, "adaptive",
                           ReplayOptions(dilation=dilation, repeat=reps), Emulated(),
                           out_dir=out / f"ring-{mb:g}MB").result
        # the bound on real-unit busbw: each host's real NIC bandwidth (2 x 200G) less the overheads
        bound_bps = 400e9 * GOODPUT
        busbw = statistics.median(c.busbw_bps for c in res.collectives)
        rows.append({"size_mb": mb, "dilation": dilation, "busbw_gbps": busbw / 1e9, "bound_gbps": bound_bps / 1e9,
                     "ratio": busbw / bound_bps,
                     "time_us": statistics.median(c.duration_real_us for c in res.collectives)})
        print(f"measured ring all-reduce {mb:g} MB", file=sys.stderr)
    return rows


def fabric_rows(traces: list[str], steps: int, out: Path) -> list[dict[str, object]]:
    rows = []
    for name in traces:
        w = first_steps(load(TRACE_FILES[name]), steps)
        dual = run_workload(w, name, topofile.load("dual-plane-16"), "adaptive", ReplayOptions(ranks=16, ports="planned"),
                            Emulated(), out_dir=out / f"{name}-dual").result
        pyr = run_workload(w, name, topofile.load("pyramid-16"), "ecmp", ReplayOptions(ranks=16, ports="hashed"),
                           Emulated(), out_dir=out / f"{name}-pyramid").result
        report.write_comparison(dual, pyr, out / f"{name}-comparison")
        sd, sp = report.summarize(dual).step_time_us, report.summarize(pyr).step_time_us
        if sd is None or sp is None:
            raise RuntimeError(f"{name}: no steps were composed")
        rows.append({"trace": name, "dilation": dual.meta.dilation,
                     "dual_step_mean_us": sd.mean, "pyr_step_mean_us": sp.mean,
                     "dual_step_p99_us": sd.p99, "pyr_step_p99_us": sp.p99,
                     "ratio_mean": sp.mean / sd.mean,
                     "dual_comm_us": sum(c.duration_real_us for c in dual.collectives),
                     "pyr_comm_us": sum(c.duration_real_us for c in pyr.collectives),
                     "cpu_bound": dual.fidelity.cpu_bound or pyr.fidelity.cpu_bound})
        print(f"measured {name} on both fabrics", file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--traces", nargs="*", default=["resnet", "dlrm"], choices=sorted(TRACE_FILES))
    ap.add_argument("--steps", type=int, default=1, help="steps of each trace to replay (default 1)")
    ap.add_argument("--out", help="keep the reports here (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fabriclab-bench-") as tmp:
        out = Path(args.out or tmp)
        ring = busbw_rows(args.sizes_mb, args.reps, out) if args.sizes_mb else []
        fabrics = fabric_rows(args.traces, args.steps, out) if args.traces else []
    if ring:
        print(f"ring all-reduce, 16 ranks, dual-plane-16 adaptive, dilation {ring[0]['dilation']:.4g}, "
              f"median of {args.reps}")
        print(f"{'size MB':>8}{'time us':>10}{'busbw Gbit/s':>14}{'bound Gbit/s':>14}{'busbw/bound':>13}")
        for r in ring:
            print(f"{r['size_mb']:>8g}{r['time_us']:>10.1f}{r['busbw_gbps']:>14.1f}{r['bound_gbps']:>14.1f}"
                  f"{r['ratio']:>13.2f}")
    if fabrics:
        print(f"step time, dual-plane-16 adaptive vs pyramid-16 ecmp, 16 ranks, {args.steps} step(s) per trace")
        print(f"{'trace':<9}{'dilation':>10}{'dual mean us':>14}{'pyr mean us':>13}{'pyr/dual':>10}"
              f"{'dual comm us':>14}{'pyr comm us':>13}{'cpu-bound':>11}")
        for f in fabrics:
            print(f"{f['trace']:<9}{f['dilation']:>10.4g}{f['dual_step_mean_us']:>14.1f}{f['pyr_step_mean_us']:>13.1f}"
                  f"{f['ratio_mean']:>10.2f}{f['dual_comm_us']:>14.1f}{f['pyr_comm_us']:>13.1f}{str(f['cpu_bound']):>11}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
