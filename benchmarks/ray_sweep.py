"""The same 8-row `fabriclab compare` sweep run four ways, in one run: today's local process pool (before Ray:
a fork pool of J processes running `compare.run_row`), `compare()`'s default (a local Ray instance of J CPUs
that it starts and ends), and a real Ray cluster of J worker node processes (`ray start`, one CPU each, as
tests/test_compare_ray.py starts them), for J = 1 and 2. Per run: wall time, time to the first row's first
progress (start-up), peak resident memory per worker process (the most any one reached: VmHWM of the pool's
workers, of the Ray workers that ran rows), and the resident memory of Ray's own processes (GCS, raylet,
agents: the sum of their RSS, the largest sample). The rows of every run must equal the pool's exactly
(wall-clock fields excepted), or the script exits 1.

    .venv/bin/python benchmarks/ray_sweep.py [--sizes 32 64] [--quick] [--json FILE]

The rows: the built-in trace on pyramid-1024 (ecmp, static) and dual-plane-1024 (adaptive, ecmp) scaled to
each size (default 32 and 64 GPUs: 8 rows of seconds each); `--quick`: the 16-host templates at 8 and 16
GPUs (rows of a fraction of a second: start-up dominates). Memory is sampled from /proc every 0.1 s.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fabriclab import compare as cmp  # noqa: E402
from fabriclab.rows import with_efficiency  # noqa: E402
from tests.ray_cluster import DRIVER_ENV, RayCluster, descendants, process_group  # noqa: E402
from traffic.traces import BUILTIN_TRACE  # noqa: E402

FULL = [cmp.Series("pyramid-1024", "ecmp"), cmp.Series("dual-plane-1024", "adaptive"),
        cmp.Series("pyramid-1024", "static"), cmp.Series("dual-plane-1024", "ecmp")]
QUICK = [cmp.Series("pyramid-16", "ecmp"), cmp.Series("dual-plane-16", "adaptive"),
         cmp.Series("pyramid-16", "static"), cmp.Series("dual-plane-16", "ecmp")]
WALL_CLOCK = ("sim_wall_s", "cached")
SAMPLE_S = 0.1


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Sampler:
    """Every SAMPLE_S: the peak RSS (VmHWM) of each worker PID in `workers`, and the sum of the RSS of the
    other processes `others()` lists (Ray's own), keeping the largest sum."""

    def __init__(self, others: Any) -> None:
        self.workers: set[int] = set()
        self.worker_peak_kb: dict[int, int] = {}
        self.others = others
        self.infra_peak_kb = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        for pid in list(self.workers):
            self.worker_peak_kb[pid] = max(self.worker_peak_kb.get(pid, 0), _status_kb(pid, "VmHWM"))
        infra = [p for p in self.others() if p not in self.workers and not _comm(p).startswith("ray::IDLE")]
        self.infra_peak_kb = max(self.infra_peak_kb, sum(_status_kb(p, "VmRSS") for p in infra))

    def _loop(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self.sample()

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.sample()


def same(doc: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in doc.items() if k not in WALL_CLOCK}, sort_keys=True)


# ---- today's pool (before Ray) ------------------------------------------------------------------------

def _pool_row(task: dict[str, Any]) -> tuple[dict[str, Any], int, int, float]:
    t0 = time.monotonic()
    row = cmp.run_row(task)
    return row, os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, t0


def run_pool(tasks: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    t0 = time.monotonic()
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        out = pool.map(_pool_row, tasks, chunksize=1)
    wall = time.monotonic() - t0
    rows = with_efficiency([cmp.Row(**r) for r, _, _, _ in out])
    peak: dict[int, int] = {}
    for _, pid, kb, _ in out:
        peak[pid] = max(peak.get(pid, 0), kb)
    return {"wall_s": wall, "first_row_s": min(s for _, _, _, s in out) - t0, "rows": rows,
            "worker_peak_mb": [v / 1024 for v in peak.values()], "ray_processes_mb": 0.0}


# ---- compare() on Ray ---------------------------------------------------------------------------------

def run_ray(trace: str, series: list[cmp.Series], sizes: list[int], jobs: int | None, cluster: str | None,
            others: Any) -> dict[str, Any]:
    first: list[float] = []
    t0 = time.monotonic()
    with Sampler(others) as s:
        def seen(p: cmp.CompareProgress) -> None:
            for r in p.running:
                if r.pid:
                    s.workers.add(r.pid)
                    if not first:
                        first.append(time.monotonic() - t0)

        rows = cmp.compare(trace, series, sizes, jobs=jobs, cluster=cluster, progress=seen)
        wall = time.monotonic() - t0
    return {"wall_s": wall, "first_row_s": first[0] if first else float("nan"), "rows": rows,
            "worker_peak_mb": [v / 1024 for v in s.worker_peak_kb.values()], "ray_processes_mb": s.infra_peak_kb / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs=2, default=[32, 64])
    ap.add_argument("--quick", action="store_true", help="the 16-host templates at 8 and 16 GPUs")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    series, sizes = (QUICK, [8, 16]) if args.quick else (FULL, args.sizes)
    trace = str(BUILTIN_TRACE)
    tasks, _ = cmp.plan_rows(trace, series, sizes)
    os.environ.pop("RAY_ADDRESS", None)
    runs: list[dict[str, Any]] = []
    me = os.getpid()
    for jobs in (1, 2):
        print(f"[ray_sweep] pool of {jobs}", file=sys.stderr, flush=True)
        runs.append({"how": f"local pool, {jobs} process{'es' if jobs > 1 else ''} (before Ray)", "workers": jobs,
                     **run_pool(tasks, jobs)})
        print(f"[ray_sweep] compare() default, a local Ray instance of {jobs} CPU(s)", file=sys.stderr, flush=True)
        runs.append({"how": f"local Ray instance, {jobs} CPU{'s' if jobs > 1 else ''} (compare's default)",
                     "workers": jobs, **run_ray(trace, series, sizes, jobs, None, lambda: descendants(me))})
        print(f"[ray_sweep] a Ray cluster of {jobs} worker node(s)", file=sys.stderr, flush=True)
        os.environ.update(DRIVER_ENV)
        t0 = time.monotonic()
        with RayCluster(nodes=jobs, cpus=1) as c:
            start = time.monotonic() - t0
            run = run_ray(trace, series, sizes, None, c.address,
                          lambda: [p for q in c.procs for p in process_group(q.pid)])
        runs.append({"how": f"Ray cluster, {jobs} worker node process{'es' if jobs > 1 else ''} of 1 CPU",
                     "workers": jobs, "cluster_start_s": start, **run})
    base = [same(r.__dict__) for r in runs[0]["rows"]]
    equal = all([same(r.__dict__) for r in run["rows"]] == base for run in runs)
    load = os.getloadavg()
    doc = {"date": datetime.date.today().isoformat(), "sizes": sizes, "rows": len(tasks), "quick": args.quick,
           "loadavg_at_end": load, "cpus": os.cpu_count(), "rows_equal": equal,
           "runs": [{k: v for k, v in r.items() if k != "rows"} | {"row_sim_wall_s": [x.sim_wall_s for x in r["rows"]]}
                    for r in runs]}
    print(markdown(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0 if equal else 1


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"8 rows ({doc['sizes'][0]} and {doc['sizes'][1]} GPUs), {doc['date']}, {doc['cpus']} cores, load average "
             f"at the end {doc['loadavg_at_end'][0]:.1f}; rows equal across runs: {'yes' if doc['rows_equal'] else 'NO'}",
             "",
             "| how the rows ran | wall | first row started | rows' own time | peak RSS per worker | Ray's processes |",
             "|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        peak = ", ".join(f"{v:.0f}" for v in sorted(r["worker_peak_mb"], reverse=True)) or "-"
        start = f" (+ {r['cluster_start_s']:.1f} s to start it)" if "cluster_start_s" in r else ""
        lines.append(f"| {r['how']} | {r['wall_s']:.1f} s{start} | {r['first_row_s']:.1f} s | "
                     f"{sum(r['row_sim_wall_s']):.1f} s | {peak} MB | {r['ray_processes_mb']:.0f} MB |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
