"""`benchmarks/plan.py --quick` runs `fabriclab plan` on the main job's 16-GPU slice over three designs and
prints the RESULTS table: every design with its cost worked out by hand, the cheapest first (the 1,024-GPU
table in benchmarks/RESULTS.md comes from the same script)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_quick_plan_prints_its_designs_by_cost():
    res = subprocess.run([sys.executable, "benchmarks/plan.py", "--quick"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    rows = [l.split("|") for l in res.stdout.splitlines() if l.startswith("| ") and "design" not in l]
    # by hand (16 GPUs, 4 a ToR or leaf, 200G uplink ports; 1 unit a switch port and an optic):
    # pyramid 4:1: 16 host links + 8 + 8 single-port uplinks: 48 ports, 64 optics = 112
    # dual-plane, 4 spines a plane: per plane 16 host links + 16 leaf-spine links of 200G: 96 ports, 128 optics = 224
    # pyramid 1:1: every ToR and agg uplink 800 Gbit/s, 4 ports: 16 + 64 + 64 = 144 ports, 32 + 64 + 64 optics = 304
    assert [(r[2].strip(), r[8].strip()) for r in rows] == [("pyramid-4to1", "112"), ("dual-plane", "224"),
                                                             ("pyramid-1to1", "304")]
    assert "Command: `fabriclab plan" in res.stdout and "reference" in res.stdout
