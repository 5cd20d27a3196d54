"""`benchmarks/flowsim.py` runs and reports what it simulated (small sizes; the figures at 1024 and
16,384 GPUs are in benchmarks/RESULTS.md, from the same script)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_the_flowsim_benchmark_runs_a_flat_ring_and_its_hierarchical_form(tmp_path):
    out = tmp_path / "rows.json"
    res = subprocess.run([sys.executable, "benchmarks/flowsim.py", "--hosts", "32", "64", "--topology",
                          "topologies/dual-plane-1024.yaml", "--flat-ring-max", "32", "--size-mb", "1",
                          "--ratio-samples", "1", "--lockstep", "off", "on", "--hugepages", "off",
                          "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())
    flat, flat_lock, hier, hier_lock = rows
    # numpy's huge-page advice off in every row's process, as asked, and the rows say so
    assert [(r["numpy_hugepages"], r["numpy_madvise_hugepage"]) for r in rows] == [("off", False)] * 4
    assert res.stdout.count("numpy hugepages off") == 4
    # in lockstep (planned ports: every step alike) the same transfers and simulated time
    for exact, lock in ((flat, flat_lock), (hier, hier_lock)):
        assert (exact["lockstep"], lock["lockstep"]) == (False, True)
        assert lock["transfers"] == exact["transfers"] and abs(lock["simulated_s"] / exact["simulated_s"] - 1) < 1e-9
    # 32 hosts: a flat ring, 2(n-1) steps of n transfers; on the non-blocking dual-plane fabric (two
    # 200 G NICs per host) it takes 2(n-1)/n x S / 400 G, less at most the 1 ns resolution per event
    # per step (a 31,250-byte transfer is four parts of 7812 or 7813 bytes, which end as one event)
    assert flat["algorithm"] == "ring" and flat["transfers"] == 2 * 31 * 32
    # the start, the first step's end (it is watched: all its flows end at one instant), and one event
    # for the other 61 steps, replayed from it
    assert flat["events"] == 3
    exact_s = 2 * 31 / 32 * 1e6 * 8 / 400e9
    assert exact_s - (2 * 31) * 1e-9 <= flat["simulated_s"] <= exact_s * (1 + 1e-9)
    # 64 hosts, 32 per leaf: 2 groups of 32; a reduce-scatter and an all-gather ring in each group
    # (2 x 31 x 32 transfers per group), and 32 two-rank all-reduce rings across (2 x 1 x 2 each)
    assert hier["algorithm"] == "hierarchical"
    assert hier["transfers"] == 2 * (2 * 31 * 32) + 32 * (2 * 1 * 2)
    assert hier["max_rel_diff"] < 1e-9  # the vectorised rates equal the pure-Python reference's
    assert "hierarchical" in res.stdout and "dual-plane-64" in res.stdout
