"""Trace ingestion throughput and memory on a large Kineto trace.

Builds a ~1 GB Chrome trace (`--size-mb`) in a temporary directory by repeating a real trace's events with
shifted timestamps, correlation ids and step numbers (`write_repeated_trace`, also used by the streaming test),
parses it with `traffic.traces.load`, prints MB/s (of uncompressed JSON), peak RSS and tracemalloc peak, and
removes the file.

    .venv/bin/python benchmarks/trace_ingest.py [--size-mb 1024] [--source FILE] [--gzip] [--no-tracemalloc]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = Path(os.environ.get("FABRICLAB_TRACES", ROOT.parent / "shared" / "traces")) / "kineto" / \
    "resnet50_ddp_2xA100_rank0.json.gz"


def write_repeated_trace(source: Path, out: Path, size_bytes: int, *, compress: bool = False) -> int:
    """Write `out`: `source`'s events repeated until the uncompressed JSON reaches `size_bytes`. Copy i has its
    timestamps shifted past copy i-1, its correlation and External ids offset, and ProfilerStep#N renumbered to
    N + i * (steps in source). Returns the number of copies."""
    with gzip.open(source, "rt") if source.read_bytes()[:2] == b"\x1f\x8b" else source.open() as f:
        trace = json.load(f)
    events: list[dict[str, Any]] = trace.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    span_us = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    corr = [e["args"]["correlation"] for e in events if isinstance(e.get("args", {}).get("correlation"), int)]
    corr_span = (max(corr) + 1) if corr else 0
    ext = [e["args"]["External id"] for e in events if isinstance(e.get("args", {}).get("External id"), int)]
    ext_span = (max(ext) + 1) if ext else 0
    steps = sorted({int(e["name"].split("#")[1]) for e in timed if str(e.get("name")).startswith("ProfilerStep#")})
    step_span = (max(steps) - min(steps) + 1) if steps else 0
    opener: Any = gzip.open if compress else open
    copies = written = 0
    with opener(out, "wt", **({"compresslevel": 1} if compress else {})) as f:
        sink: IO[str] = f
        head = json.dumps(trace)
        sink.write(head[:-1] + (', ' if trace else '') + '"traceEvents": [\n')
        first = True
        while written < size_bytes:
            chunk = []
            for e in events:
                if copies and e.get("ph") == "M":
                    continue  # metadata once
                e2 = dict(e)
                if copies and isinstance(e.get("ts"), (int, float)):
                    e2["ts"] = e["ts"] + copies * span_us
                args = e.get("args")
                if copies and isinstance(args, dict):
                    a2 = dict(args)
                    if isinstance(a2.get("correlation"), int):
                        a2["correlation"] += copies * corr_span
                    if isinstance(a2.get("External id"), int):
                        a2["External id"] += copies * ext_span
                    e2["args"] = a2
                name = e2.get("name")
                if copies and isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copies * step_span}"
                chunk.append(e2)
            text = json.dumps(chunk)[1:-1]
            sink.write(("" if first else ",\n") + text)
            written += len(text) + 2
            first = False
            copies += 1
        sink.write("\n]}\n")
    return copies


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM; ru_maxrss would include the parent's peak from before exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _parse_child(path: Path, raw_bytes: int, traced: bool) -> None:
    """Parse `path` in this (fresh) process and print throughput and peak memory."""
    sys.path.insert(0, str(ROOT))
    from traffic.traces import load
    from traffic.traces.kineto_events import BACKEND

    rss_before_mb = _peak_rss_mb()
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    w = load(path)
    t_parse = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    tracemalloc.stop()
    rss_mb = _peak_rss_mb()
    n_coll = sum(1 for _ in w.collectives())
    if traced:
        print(f"  with tracemalloc: peak {peak / 1e6:.1f} MB allocated while parsing "
              f"({100 * peak / raw_bytes:.2f}% of the JSON size); {raw_bytes / 1e6 / t_parse:.1f} MB/s under tracing")
    else:
        print(f"  ijson backend {BACKEND}: {w.steps} steps, {n_coll} collectives in {t_parse:.1f} s = "
              f"{raw_bytes / 1e6 / t_parse:.1f} MB/s of JSON (two passes over the file)")
        print(f"  peak RSS {rss_mb:.0f} MB (interpreter and imports before parsing: {rss_before_mb:.0f} MB)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=1024.0, help="uncompressed trace size to build (MB)")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real trace to repeat")
    ap.add_argument("--gzip", action="store_true", help="write the big trace gzipped (level 1)")
    ap.add_argument("--no-tracemalloc", action="store_true",
                    help="skip the second, traced parse (tracemalloc makes parsing several times slower)")
    ap.add_argument("--parse-child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--raw-bytes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.parse_child:
        _parse_child(args.parse_child, args.raw_bytes, args.traced)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="fabriclab-trace-bench-"))
    try:
        path = tmp / ("big.json.gz" if args.gzip else "big.json")
        t0 = time.perf_counter()
        copies = write_repeated_trace(args.source, path, int(args.size_mb * 1e6), compress=args.gzip)
        t_gen = time.perf_counter() - t0
        if args.gzip:
            with gzip.open(path, "rb") as f:
                raw_bytes = sum(len(b) for b in iter(lambda: f.read(1 << 20), b""))
        else:
            raw_bytes = path.stat().st_size
        print(f"generated {path.name}: {copies} copies of {args.source.name}, {raw_bytes / 1e6:.0f} MB of JSON "
              f"({path.stat().st_size / 1e6:.0f} MB on disk) in {t_gen:.1f} s")
        # Parse in fresh processes, so that peak RSS is the parser's and not the generator's.
        child = [sys.executable, str(Path(__file__).resolve()), "--parse-child", str(path),
                 "--raw-bytes", str(raw_bytes)]
        subprocess.run(child, check=True)
        if not args.no_tracemalloc:
            subprocess.run(child + ["--traced"], check=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
