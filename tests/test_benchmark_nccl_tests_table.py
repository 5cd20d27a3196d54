"""`benchmarks/nccl_tests_table.py --quick` runs 16 GPUs of 8 a server on both rail fabrics; its sendrecv follows
the hand value and every row's busbw is nccl-tests' factor of its algbw (the full table is in benchmarks/RESULTS.md,
from the same script)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.latency import DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US

ROOT = Path(__file__).resolve().parents[1]


def test_the_quick_table_runs_and_its_figures_follow_nccl_tests(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    res = subprocess.run([sys.executable, "benchmarks/nccl_tests_table.py", "--quick", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 5 * 2  # fabrics x collectives x sizes
    assert "| collective | GPUs (per server) |" in res.stdout and "Total wall time" in res.stdout
    n = 16
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_to_all": (n - 1) / n, "send_recv": 1.0}
    for r in rows:
        algbw = r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9
        assert r["algbw_GBps"] == pytest.approx(algbw)
        assert r["busbw_GBps"] == pytest.approx(algbw * factor[r["kind"]])
        if r["kind"] in ("all_reduce", "all_gather", "reduce_scatter"):
            assert r["nccl_model_us"] > 0 and "/" not in r["algorithm"] and r["proto"] in ("LL", "LL128", "Simple")
    # sendrecv on the dual-plane: each GPU sends 16 MiB to the same GPU of the other server, on its rail (one leaf a
    # rail at 2 servers: NIC, leaf, NIC = 2 links), over its two 200G ports at once, all 16 at once:
    # S x 8 / 400 Gbit/s + 11.4 us + 2 x 0.65 us
    sr = next(r for r in rows if r["kind"] == "send_recv" and r["size"] == "16M" and r["routing"] == "adaptive")
    hand_us = (16 << 20) * 8 / 400e9 * 1e6 + DEFAULT_PER_TRANSFER_US + 2 * DEFAULT_PER_HOP_US
    assert sr["time_us"] == pytest.approx(hand_us, rel=1e-6)
