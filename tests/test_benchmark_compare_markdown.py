"""`benchmarks/compare_markdown.py` renders a compare.json as RESULTS' table: checked on the golden comparison's
rows, each cell against the row's own JSON value converted by hand."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "compare-small-128-1024.json"


def test_the_golden_rows_render_one_line_each_with_their_figures():
    res = subprocess.run([sys.executable, "benchmarks/compare_markdown.py", str(GOLDEN)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(GOLDEN.read_text())
    lines = [line for line in res.stdout.splitlines() if line.startswith("| ") and not line.startswith("| fabric ")]
    assert len(lines) == len(doc["rows"])
    for line, r in zip(lines, doc["rows"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == f"{r['fabric']} ({r['routing']})" and cells[2] == str(r["gpus"])
        assert cells[3] == f"{round(r['step_mean_us'] / 1e6, 3):.3f} s"  # microseconds to seconds, 3 digits
        assert cells[5] == f"{round(r['utilisation'] * 100, 1):.1f}%" and cells[6] == "-"  # a trace has no MFU
    # one verdict line per seed figure
    assert sum(line.startswith("- ") for line in res.stdout.splitlines()) == len(doc["seed"])
