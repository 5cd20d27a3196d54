"""The flow-level simulator's cost: one training step's all-reduce at 1024 and 16,384 GPUs (no root).

    .venv/bin/python benchmarks/flowsim.py [--hosts 1024 16384] [--topology dual-plane-1024 pyramid-1024]
                                           [--algorithm ring] [--size-mb 100] [--lockstep off on]
                                           [--json FILE]

Each (topology, hosts) runs in a fresh process, so its peak memory is its own. There:
- set-up, timed apart: the fabric built at that size (`fabric.topofile.scaled`), its path table and
  routing policy (ecmp; planned source ports, or `--ports hashed`: random ones, as the OS picks
  them, so ECMP collisions give the flows many different rates), with the process's peak resident
  memory after it;
- one step: an all-reduce of `--size-mb` MB over every GPU (one per host; `--algorithm`, as the
  replay's collectives schedule it, built as arrays by `traffic.collectives.schedule_columns` and
  timed apart), run by `fabric.flowsim.simulate` as `fabriclab sim` and `compare` run it (the
  collectives' times kept, not every transfer's: `SimOptions.transfer_times=False`): wall time,
  peak memory, the number of transfers
  and of max-min rate computations, the events, and the simulated time. Above `--flat-ring-max`
  hosts a flat ring is not run (16,384 ranks: 5.4e8 transfers, 2(n-1) = 32,766 steps of 6 kB for
  100 MB, latency-bound, which NCCL does not run either): the ring's hierarchical form is, rings
  inside each leaf's hosts and rings across leaves (`hierarchical`), and the row says so;
- the rate computation alone, on the flow sets of the step's first `--ratio-samples` rate
  computations: the compiled progressive filling the simulator uses (`max_min_rates`, numba; its
  compilation or cache load timed apart, before the step) against the same algorithm vectorised
  with numpy (`max_min_rates_vectorised`, the simulator's solver before: the fair baseline) and in
  plain Python (`max_min_rates_reference`: a correct, straightforward implementation, lists and
  loops, no numpy; labelled as what it is), all timed on the same inputs, their rates checked
  equal, and the samples on which the vectorised one was faster counted.
`--lockstep off on` runs every configuration both ways: the exact DAG, and with the collective's steps
in lockstep (`SimOptions.lockstep`, what `fabriclab compare` uses above 1024 GPUs), each row labelled.
`--hugepages default off` runs every configuration with numpy's default (on Linux it advises the
kernel to back arrays of 4 MB and more with huge pages) and with that advice off
(`NUMPY_MADVISE_HUGEPAGE=0`, numpy's documented switch; how `fabriclab sim` and `compare` run unless
that variable is set), each row labelled: where transparent huge pages are `madvise` with `defrag`
`madvise` (this VM), the kernel compacts memory synchronously on the first touch of such an array,
which on a fresh process can cost as much as the step itself.
Targets (issue "The scale backend"): one step <= 1 s at 1024 GPUs and <= 30 s at 16,384 here.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(topology: str, hosts: int, algorithm: str, size_bytes: int, ratio_samples: int,
        flat_ring_max: int, lockstep: bool = False, ports: str = "planned") -> dict[str, Any]:
    import numpy as np

    from fabric import topofile
    from fabric.flowsim import (
        Job,
        SimOptions,
        max_min_rates,
        max_min_rates_reference,
        max_min_rates_vectorised,
        simulate,
    )
    from fabric.flowsim import flows
    from fabric.routing import EcmpPolicy, PathTable
    from fabric.transfers import Placement
    from traffic import collectives
    from traffic.placement import groups_by

    t0 = time.perf_counter()
    max_min_rates(1, np.zeros(1, dtype=np.intp), np.zeros(1, dtype=np.intp), np.ones(1))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fab = topofile.scaled(topology, hosts)
    policy = EcmpPolicy(PathTable(fab))
    setup_s = time.perf_counter() - t0
    setup_mb = peak_rss_mb()
    ranks = list(range(hosts))
    hosts_of = [h.name for h in fab.hosts]
    leaf_of = {h.name: min(n.switch for n in fab.nics_of[h.name]) for h in fab.hosts}
    placement = Placement(tuple(hosts_of))
    groups = groups_by(placement, lambda h: leaf_of[h])
    if algorithm == "ring" and hosts > flat_ring_max:
        algorithm = "hierarchical"
    t1 = time.perf_counter()
    dag = collectives.schedule_columns("all_reduce", size_bytes, ranks, algorithm, groups=groups)
    build_s = time.perf_counter() - t1

    samples: list[tuple[int, Any, Any, Any]] = []
    real, again = flows.rates_on_routed_paths, flows.rates_on_routed_paths_again

    def keep(paths: Any, cap: Any) -> None:  # the first inputs, for the speed ratio (not timed in the step)
        if len(samples) < ratio_samples:
            flow, link = np.nonzero(paths >= 0)
            samples.append((paths.shape[0], flow.astype(np.intp), paths[flow, link].astype(np.intp), cap))

    def recording(paths: Any, cap: Any) -> Any:  # a whole solve
        keep(paths, cap)
        return real(paths, cap)

    def recording_again(paths: Any, cap: Any, dirty: Any, rates: Any) -> Any:  # the touched components only
        keep(paths, cap)
        return again(paths, cap, dirty, rates)

    flows.rates_on_routed_paths, flows.rates_on_routed_paths_again = recording, recording_again
    try:
        t1 = time.perf_counter()
        res = simulate(fab, policy, [Job(dag, placement)],
                       options=SimOptions(ports=ports, lockstep=lockstep, transfer_times=False))
        step_s = time.perf_counter() - t1
    finally:
        flows.rates_on_routed_paths, flows.rates_on_routed_paths_again = real, again
    fast_s = vec_s = ref_s = 0.0
    worst = 0.0
    vec_wins = 0
    for n, flow, link, cap in samples:
        a = time.perf_counter()
        fast = max_min_rates(n, flow, link, cap)
        b = time.perf_counter()
        vec = max_min_rates_vectorised(n, flow, link, cap)
        c = time.perf_counter()
        fast_s += b - a
        vec_s += c - b
        vec_wins += c - b < b - a
        worst = max(worst, float(np.max(np.abs(fast - vec) / np.maximum(1.0, vec))))
        paths: list[list[int]] = [[] for _ in range(n)]
        for f, l in zip(flow.tolist(), link.tolist()):
            paths[f].append(l)
        a = time.perf_counter()
        slow = max_min_rates_reference(paths, cap.tolist())
        ref_s += time.perf_counter() - a
        worst = max(worst, float(np.max(np.abs(fast - np.asarray(slow)) / np.maximum(1.0, np.asarray(slow)))))
    return {"topology": topology, "fabric": fab.name, "hosts": hosts, "algorithm": algorithm, "lockstep": lockstep,
            "ports": ports,
            "size_bytes": size_bytes, "transfers": len(dag), "dag_build_s": build_s, "events": res.events,
            "setup_s": setup_s, "setup_peak_mb": setup_mb,
            "step_s": step_s, "peak_mb": peak_rss_mb(), "rate_updates": res.rate_updates,
            "simulated_s": float(res.job_time_s[0]), "ratio_samples": len(samples),
            "flows_per_sample": sum(s[0] for s in samples) / max(1, len(samples)),
            "compile_s": compile_s, "compiled_s": fast_s, "vectorised_s": vec_s, "reference_s": ref_s,
            "speed_ratio": ref_s / fast_s if fast_s > 0 else None,
            "ratio_vs_vectorised": vec_s / fast_s if fast_s > 0 else None, "vectorised_faster_samples": vec_wins,
            "max_rel_diff": worst,
            # what numpy did in this process (NUMPY_MADVISE_HUGEPAGE, read at its import)
            "numpy_madvise_hugepage": bool(np._core.multiarray._get_madvise_hugepage())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--topology", nargs="+", default=["dual-plane-1024", "pyramid-1024"],
                    help="builder topology files, built at each --hosts")
    ap.add_argument("--algorithm", default="ring")
    ap.add_argument("--size-mb", type=float, default=100.0, help="the all-reduce's size (default 100 MB)")
    ap.add_argument("--ratio-samples", type=int, default=20)
    ap.add_argument("--ports", choices=["planned", "hashed"], default="planned",
                    help="the connections' source ports (default planned: every flow of a ring step alike)")
    ap.add_argument("--flat-ring-max", type=int, default=4096,
                    help="above this many hosts --algorithm ring runs as hierarchical (default 4096)")
    ap.add_argument("--lockstep", nargs="+", choices=["off", "on"], default=["off"],
                    help="run each configuration exactly (off), in lockstep (on), or both (default off)")
    ap.add_argument("--hugepages", nargs="+", choices=["default", "off"], default=["default", "off"],
                    help="numpy's huge-page advice as it is (default) and off (NUMPY_MADVISE_HUGEPAGE=0); "
                         "rows for each given (default: both)")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per configuration")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--one", nargs=3, metavar=("TOPOLOGY", "HOSTS", "LOCKSTEP"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    size = int(args.size_mb * 1e6)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.algorithm, size, args.ratio_samples,
                             args.flat_ring_max, args.one[2] == "on", args.ports)))
        return 0
    rows = []
    for topology, hosts, lock, pages in ((t, h, m, p) for t in args.topology for h in args.hosts
                                         for m in args.lockstep for p in args.hugepages):
        env = dict(os.environ)
        if pages == "off":
            env["NUMPY_MADVISE_HUGEPAGE"] = "0"
        else:
            env.pop("NUMPY_MADVISE_HUGEPAGE", None)
        cmd = [sys.executable, __file__, "--one", topology, str(hosts), lock, "--algorithm", args.algorithm,
               "--size-mb", str(args.size_mb), "--ratio-samples", str(args.ratio_samples),
               "--flat-ring-max", str(args.flat_ring_max), "--ports", args.ports]
        what = f"{topology} at {hosts} (lockstep {lock}, numpy hugepages {pages})"
        failed = {"topology": topology, "hosts": hosts, "lockstep": lock == "on", "numpy_hugepages": pages}
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s, cwd=ROOT,
                                 env=env)
        except subprocess.TimeoutExpired:
            print(f"{what}: over {args.timeout_s:g} s, stopped", flush=True)
            rows.append({**failed, "error": f"timeout {args.timeout_s:g} s"})
            continue
        if out.returncode != 0:
            err = (out.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{what}: failed: {err}", flush=True)
            rows.append({**failed, "error": err})
            continue
        r = json.loads(out.stdout)
        r["numpy_hugepages"] = pages
        rows.append(r)
        kind = (r["algorithm"] + (" lockstep" if r["lockstep"] else "") + f", {r['ports']} ports"
                + f", numpy hugepages {pages}")
        print(f"{r['fabric']:>18} {kind}: set-up {r['setup_s']:.1f} s ({r['setup_peak_mb']:.0f} MB; "
              f"the compiled solver loaded in {r['compile_s']:.1f} s); "
              f"DAG built in {r['dag_build_s']:.1f} s; one step {r['step_s']:.2f} s, peak {r['peak_mb']:.0f} MB, "
              f"{r['transfers']} transfers, {r['events']} events, "
              f"{r['rate_updates']} rate computations, simulated {r['simulated_s'] * 1e3:.2f} ms" + (
                  f"; rate computation on {r['ratio_samples']} samples of {r['flows_per_sample']:.0f} flows: "
                  f"compiled {r['compiled_s'] * 1e3:.1f} ms, numpy-vectorised {r['vectorised_s'] * 1e3:.1f} ms "
                  f"({r['ratio_vs_vectorised']:.1f}x; faster on {r['vectorised_faster_samples']} of the samples), "
                  f"pure-Python reference {r['reference_s'] * 1e3:.1f} ms ({r['speed_ratio']:.1f}x); largest "
                  f"relative difference {r['max_rel_diff']:.1e}" if r["speed_ratio"] is not None
                  else "; no speed ratio (0 samples)"),
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
