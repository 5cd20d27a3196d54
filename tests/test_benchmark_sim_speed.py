"""`benchmarks/sim_speed.py`'s table: each row's ratios against the baseline checkout's run of the same row."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import sim_speed  # noqa: E402


def test_ratios_are_the_baselines_over_this_checkouts_per_row():
    row = {"model": "m", "gpus": 1024, "topology": "t", "routing": "r", "peak_mb": 1000.0}
    results = [{**row, "checkout": "baseline", "wall_s": 30.0, "sim_wall_s": 24.0, "step_mean_us": 8e6},
               {**row, "checkout": "this", "wall_s": 20.0, "sim_wall_s": 16.0, "step_mean_us": 8.0008e6}]
    lines = sim_speed.table(results).splitlines()
    assert lines[2].startswith("| m 1024 t r | baseline | 30.0 | 24.0 | 1000 | 8.0000 |")
    # 30 / 20 = 1.50x whole, 24 / 16 = 1.50x own, the step 0.01% longer
    assert lines[3] == "| m 1024 t r | this | 20.0 | 16.0 | 1000 | 8.0008 | 1.50 | 1.50 | +0.0100% |"
