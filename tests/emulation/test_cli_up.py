"""`fabriclab up` as a user runs it (the README's main job), including interruption."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric import topofile
from tests.emulation.test_fabrics import netns, ovs_bridges, root_links

pytestmark = pytest.mark.emulation


def read_until(stream, needle: str, timeout_s: float) -> list[str]:
    """Lines from a pipe until one contains `needle`, EOF, or the deadline (never a bare readline):
    reads the raw descriptor with select, so nothing sits unseen in a Python buffer."""
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    while needle.encode() not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    lines = buf.decode(errors="replace").splitlines()
    hit = [i for i, line in enumerate(lines) if needle in line]
    return lines[: hit[0] + 1] if hit else lines or [""]
ROOT = Path(__file__).resolve().parents[2]
FABRICLAB = [sys.executable, "-m", "fabriclab.cli"]


def test_main_job_on_defaults():
    res = subprocess.run(FABRICLAB + ["up", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["topology"] == "dual-plane-16" and data["ok"] is True
    # 16 hosts -> 16 x 15 ordered pairs in each of the two planes, 3 pings each, none lost
    assert data["reachability"] == {
        p: {"pairs": 240, "pairs_ok": 240, "packets_lost": 0, "pings_per_pair": 3} for p in ("A", "B")}
    assert data["teardown_clean"] is True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_tears_everything_down(sig):
    fab = topofile.load("leaf-spine-16")
    before = netns()
    proc = subprocess.Popen(FABRICLAB + ["up", "leaf-spine-16", "--hold"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = read_until(proc.stderr, "fabric is up", timeout_s=120)
        assert "fabric is up" in lines[-1], "".join(lines)
        assert {s.name for s in fab.switches} <= ovs_bridges()
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "teardown     clean" in out, out + err
    names = {s.name for s in fab.switches}
    assert not ovs_bridges() & names
    assert not [l for l in root_links() if any(l.startswith(f"{n}-eth") for n in names)]
    assert netns() == before


def test_readme_main_command_as_written(tmp_path):
    # the README's first command, exactly: set-up (idempotent here) and the main job on its defaults,
    # the built-in trace replayed on dual-plane-16 (adaptive) and pyramid-16 (ecmp), side by side
    out = tmp_path / "replay"
    res = subprocess.run(["bash", "scripts/lab", "run", "--out", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=1500)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "a  dual-plane-16 / adaptive: builtin" in res.stdout and "b  pyramid-16 / ecmp: builtin" in res.stdout
    for row in ("step time mean", "step time p99", "busbw all_reduce", "communication share", "hottest link"):
        assert row in res.stdout, row
    for f in ("comparison.html", "dual-plane-16-adaptive/report.html", "pyramid-16-ecmp/report.html",
              "dual-plane-16-adaptive/result.json", "pyramid-16-ecmp/steps.csv"):
        assert (out / f).exists(), f
    # 16 ranks, 6 recorded steps, 2 all-reduces each, every one replayed on both fabrics
    for run in ("dual-plane-16-adaptive", "pyramid-16-ecmp"):
        data = json.loads((out / run / "result.json").read_text())
        assert data["meta"]["ranks"] == 16 and len(data["collectives"]) == 12
