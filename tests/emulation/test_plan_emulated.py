"""A planned design emulated: `fabriclab plan` writes each design at 16 hosts too, and `fabriclab up` brings
that file up, routes it and reaches every host pair on every plane (docs/planner.md#topology-files-and-the-emulator)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fabric import topofile
from fabric.analysis import oversubscription
from fabriclab import planner

pytestmark = pytest.mark.emulation

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("design", ["pyramid-4to1-agg1to1-servers", "dual-plane-mesh-1to1-rail-adaptive"])
def test_a_planned_designs_16_host_file_comes_up_and_reaches_every_pair(tmp_path, design):
    planned = planner.resolve(planner.load_designs(planner.DEFAULT_DESIGNS_FILE), 1024, 8)
    files = planner.write_topologies(planned, 1024, tmp_path)
    twin = files[design]["emulated"]
    fab = topofile.load(twin)
    at_scale = next(p for p in planned if p.name == design).fabric
    assert len(fab.hosts) == 16 and oversubscription(fab) == oversubscription(at_scale)
    routing = next(p for p in planned if p.name == design).routing
    res = subprocess.run([sys.executable, "-m", "fabriclab.cli", "up", twin, "--routing", routing, "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)
    assert data["ok"] is True and data["teardown_clean"] is True
    # 16 hosts: 16 x 15 ordered pairs in each of the fabric's planes, none lost
    planes = [p.name for p in fab.planes]
    assert sorted(data["reachability"]) == sorted(planes)
    for p in planes:
        assert data["reachability"][p]["pairs"] == 240 and data["reachability"][p]["pairs_ok"] == 240
        assert data["reachability"][p]["packets_lost"] == 0
