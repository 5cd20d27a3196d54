"""`benchmarks/latency_curve.py --quick` runs at 8 GPUs, its ring follows the hand alpha-beta value, and its
markdown carries the NCCL model and the published figures with their sources (the full curve at 8, 128
and 1,024 GPUs is in benchmarks/RESULTS.md, from the same script)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.latency import DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US

ROOT = Path(__file__).resolve().parents[1]
A_US, H_US = DEFAULT_PER_TRANSFER_US, DEFAULT_PER_HOP_US


def bench():
    spec = importlib.util.spec_from_file_location("latency_curve_bench", ROOT / "benchmarks" / "latency_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_quick_curve_runs_and_its_ring_is_the_alpha_beta_value(tmp_path):
    out = tmp_path / "curve.json"
    res = subprocess.run([sys.executable, "benchmarks/latency_curve.py", "--quick", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"]
    rows = doc["rows"]
    assert [(r["algorithm"], r["size_bytes"]) for r in rows] == [(a, s) for a in ("ring", "tree")
                                                                 for s in (8, 2**16, 2**20)]
    n = 8
    for r in rows:
        # dual-plane at 8 hosts: one leaf (k = 2), 2 x 200G ports per GPU, nothing in lockstep, nothing stopped
        assert (r["gpus"], r["k_max"], r["nic_gbps"], r["lockstep"]) == (n, 2, 400.0, False)
        for model in ("latency", "bandwidth"):
            p = r[model]
            assert "skipped" not in p and p["time_us"] > 0
            assert p["busbw_gbs"] == pytest.approx(r["size_bytes"] / (p["time_us"] * 1e-6) / 1e9 * 2 * (n - 1) / n)
        if r["algorithm"] != "ring":
            assert "hand_us" not in r["latency"]
            continue
        size, sim = r["size_bytes"], r["latency"]["time_us"]
        if size % (2 * n) == 0:  # whole bytes on both NIC ports every step: the hand value as it is
            assert sim == pytest.approx(2 * (n - 1) * (size / n * 8 / 400e3 + A_US + 2 * H_US), rel=1e-6)
            assert abs(r["latency"]["sim_vs_hand"]) < 1e-6
            assert r["bandwidth"]["time_us"] == pytest.approx(2 * (n - 1) * size / n * 8 / 400e3, rel=1e-6)
        else:  # 8 B over 8 ranks: a step's 1-byte piece crosses one 200G port, not both
            assert sim == pytest.approx(2 * (n - 1) * (8 / 200e3 + A_US + 2 * H_US), rel=1e-6)
            assert 0 < r["latency"]["sim_vs_hand"] < 1e-5
    # latency-bound at 8 B, climbing towards the NIC's 50 GB/s; the bandwidth-only model at the NIC's bound
    ring = [r for r in rows if r["algorithm"] == "ring"]
    assert [r["latency"]["busbw_gbs"] for r in ring] == sorted(r["latency"]["busbw_gbs"] for r in ring)
    assert ring[0]["latency"]["busbw_gbs"] < 1e-3 and ring[-1]["bandwidth"]["busbw_gbs"] == pytest.approx(50.0)
    # NCCL's model beside the ring: one server, 14 NVLink steps of 3.4 us after the 8.4 us base
    assert ring[0]["nccl_model_us"] == pytest.approx(8.4 + 14 * 3.4 + 8 / (1000 * 48 * 8 / 14))
    md = res.stdout
    assert md.startswith("### All-reduce busbw vs size") and "| dual-plane-8 (adaptive) | 8 | 2 | ring | 8 B |" in md
    for source in ("NVIDIA/nccl src/graph/tuning.cc, v2.30.7", "NVIDIA/nccl-tests#212", "NVIDIA/nccl#1469",
                   "coreweave/nccl-tests README @fb4787c", "Azure/azurehpc-health-checks"):
        assert source in md


def test_nccl_s_ring_model_at_128_and_1024_gpus():
    m = bench()
    # 16 servers: 30 network steps of 14 us, 224 NVLink steps of 3.4 us (max(3.4, 3 x 1.0) on > 1 node)
    small = m.nccl_ring_simple(128, 8)
    assert small["nccl_model_latency_us"] == pytest.approx(8.4 + 224 * 3.4 + 30 * 14)
    assert not small["nccl_model_plateau"]
    # past S / (32 channels x n) >= 64 B the plateau factor 1.4; the bandwidth term at 48 GB/s busbw
    big = m.nccl_ring_simple(1024, 2**30)
    lat = (8.4 + (2046 - 254) * 3.4 + 254 * 14) * 1.4
    assert big["nccl_model_plateau"] and big["nccl_model_latency_us"] == pytest.approx(lat)
    assert big["nccl_model_us"] == pytest.approx(lat + 2**30 / (1000 * 48 * 1024 / 2046))
    assert not m.nccl_ring_simple(1024, 2**20)["nccl_model_plateau"]  # 1 MiB / (32 x 1024) = 32 B
