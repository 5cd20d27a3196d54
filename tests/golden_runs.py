"""Fixed `sim` and `compare` runs whose JSON is kept in tests/golden/: a refactoring that changes no behaviour
gives the same bytes (wall-clock fields excepted). `tests/test_golden.py` compares; after a change that is
meant to change results, write them again and say why in the commit:

    .venv/bin/python -m tests.golden_runs --write

The runs: the built-in trace on dual-plane-16 (adaptive, planned ports) with a link going down and up, and on
pyramid-16 (ecmp, hashed ports); a small hand-made trace (an all-reduce on one stream, an all-to-all on
another) through `compare` at 128 and 1024 GPUs on the default series (hashed and planned ports).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "golden"
#: fields that hold wall-clock times (the policy's decision time too) or paths of the moment; the rest must be equal
WALL_FIELDS = frozenset({"started_wall", "duration_s", "sim_wall_s", "wall_s", "cached", "trace", "source",
                         "decision_us"})
#: the resolved run specification each result and row carries (issue 40): a description of the run, checked by
#: tests/test_spec.py; the golden files guard the figures
DESCRIPTIVE_FIELDS = frozenset({"spec"})


def strip(doc: Any) -> Any:
    """`doc` without wall-clock fields, at any depth."""
    if isinstance(doc, dict):
        return {k: strip(v) for k, v in doc.items() if k not in WALL_FIELDS | DESCRIPTIVE_FIELDS}
    if isinstance(doc, (list, tuple)):
        return [strip(v) for v in doc]
    return doc


def _small_trace(path: Path) -> Path:
    """An all-reduce of 64 MB on stream 7, then an all-to-all of 8 MB on stream 9 per step, 2 steps, one rank
    of a 16-rank job (Kineto, new style)."""
    events: list[dict[str, Any]] = []
    for s in range(2):
        t0 = 1000.0 + s * 50_000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                       "ts": t0, "dur": 40_000.0})
        events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 5, "ts": t0 + 100, "dur": 20_000.0,
                       "args": {"correlation": 10 * s + 1}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t0 + 50, "dur": 5, "args": {"correlation": 10 * s + 1}})
        for k, (op, n, stream) in enumerate((("allreduce", 16_000_000, 7), ("alltoall", 2_000_000, 9))):
            corr = 10 * s + 2 + k
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": t0 + 20_000 + k, "dur": 5, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_{op}", "pid": 0, "tid": stream,
                           "ts": t0 + 20_200 + 9_000 * k, "dur": 8_000.0,
                           "args": {"correlation": corr, "Collective name": op, "In msg nelems": n,
                                    "Out msg nelems": n, "dtype": "Float", "Group size": 16}})
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 16}, "traceEvents": events}))
    return path


def runs() -> dict[str, Any]:
    """name -> the run's JSON document, wall-clock fields stripped."""
    from fabric import topofile
    from fabriclab.cli import main
    from traffic.replay import ReplayOptions
    from traffic.replay.simulate import parse_link_event
    from tests.conftest import simulated
    from traffic.traces import BUILTIN_TRACE, load

    out: dict[str, Any] = {}
    workload = load(BUILTIN_TRACE)
    dp = topofile.load("dual-plane-16")
    events = [parse_link_event("leafA0:1@200", dp, False), parse_link_event("leafA0:1@2500", dp, True)]
    res = simulated(workload, "builtin", dp, "adaptive", ReplayOptions(ranks=16), link_events=events)
    out["sim-dual-plane-16-adaptive-link-event"] = strip(res.to_dict())
    py = topofile.load("pyramid-16")
    res = simulated(workload, "builtin", py, "ecmp", ReplayOptions(ranks=16, ports="hashed", seed=5))
    out["sim-pyramid-16-ecmp-hashed"] = strip(res.to_dict())
    with tempfile.TemporaryDirectory() as tmp:
        trace = _small_trace(Path(tmp) / "small.json")
        # the bandwidth model alone (no latency: the default latency has its own hand-worked tests,
        # tests/test_latency_model.py)
        code = main(["compare", str(trace), "--sizes", "128", "1024", "--jobs", "1", "--no-cache", "--json",
                     "--per-transfer-us", "0", "--per-hop-us", "0", "--out", str(Path(tmp) / "out")])
        if code != 0:
            raise RuntimeError(f"compare exited {code}")
        out["compare-small-128-1024"] = strip(json.loads((Path(tmp) / "out" / "compare.json").read_text()))
    return out


def main() -> int:
    if sys.argv[1:] != ["--write"]:
        print(__doc__)
        return 2
    GOLDEN.mkdir(exist_ok=True)
    for name, doc in runs().items():
        (GOLDEN / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN / name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
