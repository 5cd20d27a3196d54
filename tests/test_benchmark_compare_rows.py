"""`benchmarks/compare_rows.py` at 128 GPUs (its figures at 1,024 are in benchmarks/RESULTS.md, from the same script):
each row runs in a process of its own at the LLM steps' default resolution and at the exact one, and the two
steps agree as docs/simulator.md#resolution says (MB-sized transfers: events taken up to 5 us early move a step of
seconds by far less than 0.5%)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_rows_run_alone_at_the_default_and_the_exact_resolution_and_agree(tmp_path):
    out = tmp_path / "rows.json"
    res = subprocess.run([sys.executable, "benchmarks/compare_rows.py", "--gpus", "128", "--series",
                          "pyramid-1024-rail:ecmp", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())
    assert [(r["variant"], r["resolution_us"]) for r in rows] == [("", 5.0), ("", 0.001), ("stragglers", 5.0),
                                                                   ("stragglers", 0.001)]
    for coarse, exact in (rows[0:2], rows[2:4]):
        assert abs(coarse["step_mean_us"] / exact["step_mean_us"] - 1) < 0.005
        assert coarse["cpu_s"] > 0 and coarse["wall_s"] >= coarse["sim_wall_s"] > 0
    # a straggler step is slower than the same step without: the slowest of 128 jittered GPUs sets its pace
    assert rows[2]["step_mean_us"] > rows[0]["step_mean_us"]
    table = res.stdout
    assert "| pyramid-1024-rail (ecmp) | 5 us |" in table and "| pyramid-1024-rail (ecmp), stragglers | 5 us |" in table
