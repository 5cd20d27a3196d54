"""What the structure opens up, on real switches: a researcher's own routing policy named on the
command line runs in the controller like a built-in mode, and a user's own pytest suite in another
folder gets the lab, probe and fault fixtures from the installed plugin."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from traffic.probe_run import ProbeRun

pytestmark = pytest.mark.emulation
ROOT = Path(__file__).resolve().parents[2]


def test_a_policy_named_on_the_command_line_routes_the_real_fabric(lab_factory, tmp_path, monkeypatch):
    # tests/policies.py:LastPortPolicy sends every flow by the highest-numbered equal-cost port:
    # on leaf-spine-16, leafA0 port 4 (spineA3), whatever the source port. The controller process
    # imports it by name, as it would a researcher's module on PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    lab = lab_factory("leaf-spine-16", routing="tests.policies:LastPortPolicy")
    assert lab.controller.get("/api/status")["routing"] == "last-port"
    before = {p: t for p, (t, _) in lab.emulation.port_counters("leafA0").items()}
    t_before = time.monotonic()
    rate, seconds = 500, 1.0
    runs = [ProbeRun(lab.emulation, "h0", "h12", plane="A", sport=49152 + 2 * slot, rate_pps=rate, seconds=seconds,
                     workdir=tmp_path, port=9000 + slot).start() for slot in range(4)]  # slots 0..3: 4 ports by ECMP
    reports = [r.result() for r in runs]
    after = {p: t for p, (t, _) in lab.emulation.port_counters("leafA0").items()}
    elapsed_s = time.monotonic() - t_before
    assert all(r.lost == 0 and r.expected == rate * seconds for r in reports)
    sent = {p: after[p] - before[p] for p in (1, 2, 3, 4)}
    probe_bytes = 4 * rate * seconds * 64  # payload bytes alone, a floor
    # the other uplinks carry only the controller's gray-failure probes: 20 frames of 60 bytes a second
    link_probe_bytes = 20 * 60 * (elapsed_s + 1)
    assert sent[4] >= probe_bytes and max(sent[1], sent[2], sent[3]) < probe_bytes / 20 + link_probe_bytes, sent


USER_SUITE = '''
import pytest

pytestmark = pytest.mark.emulation


@pytest.mark.fabric("leaf-spine-16", routing="adaptive")
def test_failover_is_short(lab, probe, faults):
    run = probe("h0", "h15", plane="A", sport=49152, rate_pps=2000, seconds=3)
    run.wait_sending()
    path = lab.controller.get("/api/paths?src=h0&dst=h15&sport=49152")[0]["paths"][0]
    down = faults.link_down(path[1], 1)  # leafA0 port 1: the slot-0 uplink
    report = run.result()
    assert report.lost_in(*report.window(down.at_s, 0.5)) < 0.25 * 2000
'''


def test_a_users_own_suite_in_another_folder_uses_the_plugins_fixtures(tmp_path):
    (tmp_path / "test_mine.py").write_text(textwrap.dedent(USER_SUITE))
    res = subprocess.run([sys.executable, "-m", "pytest", "-m", "emulation", "-q", "-p", "no:cacheprovider",
                          "test_mine.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "1 passed" in res.stdout
    # `-m unit` deselects it: the plugin marks every test that is not an emulation test as unit
    res = subprocess.run([sys.executable, "-m", "pytest", "-m", "unit", "-q", "-p", "no:cacheprovider",
                          "test_mine.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "1 deselected" in res.stdout, res.stdout[-2000:]
