"""`fabriclab compare` of a real-shaped 128-rank trace at 128 and 1024 GPUs: wall time, memory, progress; and
what the simulator's all-to-all models cost in accuracy (no root).

    .venv/bin/python benchmarks/compare.py [--shape llm moe] [--sizes 128 1024] [--jobs 1] [--timeout 900]
                                           [--source DIR] [--accuracy] [--accuracy-sizes 128 256 512 1024]
                                           [--json FILE]

Stand-in traces (written to a temporary directory, removed after): one Kineto file (new style: NCCL kernels
with `Collective name`, `In/Out msg nelems`, `dtype`, `Group size` 128, no `Process Group Ranks`), rank 0 of
a 128-rank job, so `compare` maps its collectives over all N ranks as `--ranks N` does:
- `llm`: the shape of a real 128-rank A100 trace (a 100B-class model's data-parallel steps): 2 steps of
  610 ms; per step one 2 GiB all-gather, two all-reduces of 90 and 92 MB, two 419 MB all-to-alls, each after
  89 ms of compute and overlapping it by 7 ms, so 27% of the step is exposed communication as recorded;
- `moe`: all-to-all heavy (expert parallel): 2 steps of 1.26 s; per step 32 all-to-alls of 128 MiB (16 layers,
  dispatch and combine), two all-reduces of 128 MB and a 512 MiB all-gather; 40% exposed as recorded.
For each shape, `fabriclab compare TRACE --sizes ... --jobs J --no-cache` runs as a subprocess (stderr
piped, so its progress is plain lines), timed; its memory is the peak over the run of the resident memory
of its whole process tree (the command and its workers, read from /proc every 0.2 s). `--source DIR` runs
the fabriclab package found in DIR instead (e.g. a checkout of an older commit, for a before/after).

`--accuracy`: one 419 MB all-to-all over N ranks (one per host) on pyramid-1024 (ecmp, hashed ports) and
dual-plane-1024 (adaptive, planned ports) scaled to N, each model (`--all-to-all`: exact, lockstep,
sampled) in a fresh process: wall time, simulated time, the fabric links' max/mean load; errors against the
exact DAG where it ran (it is skipped above 256 ranks: minutes to hours) and against lockstep.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORLD = 128
SHAPES = ("llm", "moe")
MODELS = ("exact", "lockstep", "sampled")
EXACT_MAX = 256  # ranks above which --accuracy does not run the exact DAG


# ---- the stand-in traces ---------------------------------------------------------------------------------

def _collectives(shape: str) -> tuple[float, list[tuple[str, int, str, float]], float, float]:
    """(step_us, [(NCCL op, bytes, dtype, recorded duration_us)], compute_us before each, overlap_us)."""
    if shape == "llm":
        colls = [("AllGather", 2 * 2**30, "BFloat16", 60_000.0), ("AllReduce", 90_000_000, "Float", 40_000.0),
                 ("AllToAll", 419_000_000, "BFloat16", 30_000.0), ("AllReduce", 92_000_000, "Float", 40_000.0),
                 ("AllToAll", 419_000_000, "BFloat16", 30_000.0)]
        return 610_000.0, colls, 89_000.0, 7_000.0
    colls = [("AllGather", 512 * 2**20, "BFloat16", 30_000.0)]
    colls += [("AllToAll", 128 * 2**20, "BFloat16", 12_000.0)] * 32
    colls += [("AllReduce", 128_000_000, "Float", 45_000.0)] * 2
    return 1_260_000.0, colls, 21_500.0, 0.0


_DTYPE_BYTES = {"BFloat16": 2, "Float": 4}


def write_stand_in(path: Path, shape: str, steps: int = 2) -> dict[str, float]:
    """Write the `shape` stand-in (module docstring) to `path`; returns its recorded figures per step."""
    step_us, colls, compute_us, overlap_us = _collectives(shape)
    events: list[dict[str, Any]] = []
    corr = 0

    def kernel(name: str, ts: float, dur: float, stream: int, args: dict[str, Any]) -> None:
        nonlocal corr
        corr += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": ts - 20.0, "dur": 5.0, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                       "args": {"correlation": corr, **args}})

    t = 1000.0
    exposed = 0.0
    for s in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                       "ts": t, "dur": step_us})
        at = t + 100.0
        for op, size, dtype, dur in colls:
            kernel("sm90_gemm_bf16", at, compute_us, 7, {})
            start = at + compute_us - overlap_us
            count = size // _DTYPE_BYTES[dtype]
            kernel(f"ncclDevKernel_{op}_RING_LL", start, dur, 20,
                   {"Collective name": op.lower(), "In msg nelems": count // WORLD if op == "AllGather" else count,
                    "Out msg nelems": count, "dtype": dtype, "Group size": WORLD})
            at = start + dur
            if s == 0:
                exposed += dur - overlap_us
        t += step_us + 100.0
    doc = {"distributedInfo": {"rank": 0, "world_size": WORLD, "backend": "nccl"}, "traceEvents": events}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return {"step_us": step_us, "exposed_share": exposed / step_us, "collectives": len(colls)}


# ---- measuring a command ----------------------------------------------------------------------------------

def _tree_rss_kb(pid: int) -> int:
    """Resident memory of `pid` and all its descendants, kB (from /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return total


def run_measured(cmd: list[str], env: dict[str, str], timeout_s: float, cwd: Path) -> dict[str, Any]:
    """Run `cmd` in `cwd`: wall time, peak resident memory of its process tree, exit code, stdout, stderr lines."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_kb(proc.pid))
            done.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.terminate()  # the command ends its workers on SIGTERM
        out, err = proc.communicate()
        code = None
    done.set()
    watcher.join()
    return {"wall_s": time.monotonic() - t0, "peak_mb": peak / 1024, "exit": code, "stdout": out,
            "stderr_lines": err.splitlines()}


def fabriclab_cmd(source: Path | None) -> tuple[list[str], dict[str, str]]:
    """The command running fabriclab's CLI from `source` (default: this checkout). The venv's editable
    install maps the package names to this checkout ahead of sys.path, so its finder is taken out."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(source or ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
            "from fabriclab.cli import main; sys.exit(main())")
    return [sys.executable, "-c", code], env


def bench_compare(shape: str, sizes: list[int], jobs: int, timeout_s: float, source: Path | None,
                  work: Path) -> dict[str, Any]:
    trace = work / f"{shape}-128ranks.json.gz"
    recorded = write_stand_in(trace, shape)
    base, env = fabriclab_cmd(source)
    # bandwidth only, as the figures in RESULTS were measured (and as a baseline source without the default
    # latency runs)
    cmd = [*base, "compare", str(trace), "--sizes", *map(str, sizes), "--jobs", str(jobs), "--no-cache",
           "--per-transfer-us", "0", "--per-hop-us", "0", "--out", str(work / f"out-{shape}")]
    r = run_measured(cmd, env, timeout_s, work)  # (not in a checkout: `python -c` puts the cwd first on the path)
    rows: list[dict[str, Any]] = []
    result = work / f"out-{shape}" / "compare.json"
    if result.is_file():
        rows = json.loads(result.read_text())["rows"]
    progress = [l for l in r["stderr_lines"] if l.startswith("[compare]")]
    return {"shape": shape, "sizes": sizes, "jobs": jobs, "recorded": recorded, "wall_s": r["wall_s"],
            "peak_mb": r["peak_mb"], "exit": r["exit"], "timed_out": r["exit"] is None,
            "progress_lines": len(progress),
            "rows": [{k: row[k] for k in ("fabric", "routing", "gpus", "step_mean_us", "comm_share", "busbw_bps",
                                          "sim_wall_s", "load_max_over_mean")} for row in rows],
            "stderr_tail": r["stderr_lines"][-3:] if r["exit"] else []}


# ---- the all-to-all models ----------------------------------------------------------------------------------

def one_all_to_all(topology: str, routing: str, n: int, size_bytes: int, model: str) -> dict[str, Any]:
    """In this process: one all-to-all over n ranks under `model`."""
    import resource

    from fabric import topofile
    from fabric.flowsim import SimOptions
    from traffic.replay import ReplayOptions
    from fabriclab.backends import Simulated, run_workload
    from traffic.workload import Collective, RankTrace, Step, Workload

    coll = Collective("all_to_all", size_bytes, "bfloat16", (0,), "20", 0.0, 1000.0, "a2a")
    w = Workload("a2a", "a2a", "kineto", 1, (RankTrace(0, (Step(0, 1e6, (), (coll,)),)),), True)
    fab = topofile.scaled(topology, n)
    ports = "planned" if routing == "adaptive" else "hashed"
    t0 = time.perf_counter()
    res = run_workload(w, "a2a", fab, routing, ReplayOptions(ranks=n, ports=ports),
                       Simulated(SimOptions(), all_to_all=model)).result
    wall = time.perf_counter() - t0
    loads = [l.emu_bytes for l in res.links if l.tier == "fabric"]
    return {"topology": fab.name, "routing": routing, "ranks": n, "model": model, "wall_s": wall,
            "simulated_us": res.collectives[0].duration_real_us,
            "load_max_over_mean": max(loads) / (sum(loads) / len(loads)) if loads and sum(loads) else 0.0,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def bench_accuracy(sizes: list[int], size_bytes: int, timeout_s: float) -> list[dict[str, Any]]:
    out = []
    for topology, routing in (("pyramid-1024", "ecmp"), ("dual-plane-1024", "adaptive")):
        for n in sizes:
            for model in MODELS:
                if model == "exact" and n > EXACT_MAX:
                    continue
                cmd = [sys.executable, __file__, "--one", topology, routing, str(n), str(size_bytes), model]
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
                    row = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else \
                        {"topology": topology, "ranks": n, "model": model, "error": p.stderr[-300:]}
                except subprocess.TimeoutExpired:
                    row = {"topology": topology, "ranks": n, "model": model, "error": f"timeout {timeout_s:g} s"}
                out.append(row)
                print(json.dumps(row), flush=True)
    return out


def accuracy_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| fabric | ranks | model | wall s | simulated ms | vs exact | vs lockstep | max/mean load |",
             "|---|---|---|---|---|---|---|---|"]
    by = {(r["topology"].rsplit("-", 1)[0], r["ranks"], r["model"]): r for r in rows if "error" not in r}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['topology']} | {r['ranks']} | {r['model']} | {r['error']} | | | | |")
            continue
        key = r["topology"].rsplit("-", 1)[0]
        rel = []
        for ref in ("exact", "lockstep"):
            base = by.get((key, r["ranks"], ref))
            rel.append(f"{r['simulated_us'] / base['simulated_us'] - 1:+.1%}" if base and ref != r["model"] else "")
        lines.append(f"| {r['topology']} | {r['ranks']} | {r['model']} | {r['wall_s']:.1f} | "
                     f"{r['simulated_us'] / 1e3:.3f} | {rel[0]} | {rel[1]} | {r['load_max_over_mean']:.3f} |")
    return lines


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        topology, routing, n, size, model = sys.argv[2:7]
        print(json.dumps(one_all_to_all(topology, routing, int(n), int(size), model)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0, help="per command, seconds (default 900)")
    ap.add_argument("--source", type=Path, help="run the fabriclab package in this directory (default: this one)")
    ap.add_argument("--accuracy", action="store_true", help="also measure the all-to-all models")
    ap.add_argument("--accuracy-sizes", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--accuracy-bytes", type=int, default=419_000_000)
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "source": str(args.source or ROOT), "compare": []}
    with tempfile.TemporaryDirectory(prefix="fabriclab-bench-compare-") as tmp:
        for shape in args.shape:
            r = bench_compare(shape, args.sizes, args.jobs, args.timeout, args.source, Path(tmp))
            doc["compare"].append(r)
            status = "timed out" if r["timed_out"] else f"exit {r['exit']}"
            print(f"compare {shape} (recorded: {r['recorded']['collectives']} collectives a step, "
                  f"{r['recorded']['exposed_share']:.0%} exposed) at {' '.join(map(str, args.sizes))} GPUs, "
                  f"--jobs {args.jobs}: {r['wall_s']:.1f} s wall, peak {r['peak_mb']:.0f} MB, {status}, "
                  f"{r['progress_lines']} progress lines", flush=True)
            for row in r["rows"]:
                print(f"  {row['fabric']:<16} {row['routing']:<9} step {row['step_mean_us'] / 1e3:8.1f} ms  comm "
                      f"{row['comm_share']:6.1%}  busbw {row['busbw_bps'] / 1e9:6.1f} Gbit/s  max/mean load "
                      f"{row['load_max_over_mean']:.3f}  row {row['sim_wall_s']:.1f} s", flush=True)
            for line in r["stderr_tail"]:
                print(f"  stderr: {line}")
    if args.accuracy:
        doc["accuracy"] = bench_accuracy(args.accuracy_sizes, args.accuracy_bytes, args.timeout)
        print("\n".join(accuracy_table(doc["accuracy"])))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
