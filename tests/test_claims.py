"""Claims (fabric.emulation.claims): a killed run's leftovers are removed, a live run's never, and a
reused PID (same number, another start time) is never killed. Runs without root: processes only."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fabric.emulation import claims

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FABRICLAB_RUN_DIR", str(tmp_path / "run"))
    return tmp_path / "run"


def running(pid: int) -> bool:
    """From /proc directly: the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_by(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not running(pid)


def claim_in_a_process_that_exits(run_dir) -> int:
    """A run that starts a long-lived process, claims it, and dies without cleaning up: the PID of
    the orphaned process."""
    code = ("import subprocess, sys; from fabric.emulation import claims; "
            "p = subprocess.Popen(['sleep', '300'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "claims.claim('test', pids=[p.pid]); print(p.pid)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"FABRICLAB_RUN_DIR": str(run_dir), "PATH": "/usr/bin:/bin",
                              "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[1])})
    return int(out.stdout)


def test_a_dead_runs_process_is_killed_and_its_claim_forgotten(run_dir):
    orphan = claim_in_a_process_that_exits(run_dir)
    try:
        assert running(orphan)
        assert len(list(run_dir.glob("*.json"))) == 1
        removed = claims.reclaim_stale()
        assert [left.pids for _, left in removed] == [[orphan]]
        assert gone_by(orphan)
        assert list(run_dir.glob("*.json")) == []
    finally:
        if running(orphan):
            subprocess.run(["kill", "-9", str(orphan)], check=False)


def test_a_reused_pid_is_not_killed(run_dir):
    orphan = claim_in_a_process_that_exits(run_dir)
    try:
        (path,) = run_dir.glob("*.json")
        doc = json.loads(path.read_text())
        doc["pids"] = [[orphan, doc["pids"][0][1] - 1]]  # same PID, another start time: another process
        path.write_text(json.dumps(doc))
        removed = claims.reclaim_stale()
        assert [left.pids for _, left in removed] == [[]]
        time.sleep(0.2)
        assert running(orphan)
    finally:
        subprocess.run(["kill", "-9", str(orphan)], check=False)


def test_a_live_runs_claim_is_left_alone(run_dir):
    child = subprocess.Popen(["sleep", "300"])
    try:
        mine = claims.claim("live", pids=[child.pid])
        assert not mine.stale
        assert claims.reclaim_stale() == []
        assert child.poll() is None and mine.path.exists()
        mine.release()
        assert not mine.path.exists()
    finally:
        child.kill()
        child.wait()


def test_an_unreadable_claim_is_ignored(run_dir):
    run_dir.mkdir(parents=True)
    (run_dir / "emulation-1-0.json").write_text('{"owner_pid": 1, "bri')
    assert claims.claims() == [] and claims.reclaim_stale() == []


def test_a_dead_runs_directories_are_removed_and_an_older_claim_still_reads(run_dir, tmp_path):
    # a run's private Open vSwitch files (one directory per switch under the run's directory)
    left = tmp_path / "ovs-1-0"
    (left / "leafA0").mkdir(parents=True)
    (left / "leafA0" / "conf.db").write_text("{}")
    orphan = claim_in_a_process_that_exits(run_dir)
    try:
        (path,) = run_dir.glob("*.json")
        doc = json.loads(path.read_text())
        assert doc["namespaces"] == [] and doc["paths"] == []
        doc["paths"] = [str(left)]
        path.write_text(json.dumps(doc))
        removed = claims.reclaim_stale()
        assert [(r.pids, r.paths) for _, r in removed] == [([orphan], [str(left)])]
        assert not left.exists() and gone_by(orphan)
    finally:
        subprocess.run(["kill", "-9", str(orphan)], check=False)
    # a claim written before namespaces and directories were recorded
    run_dir.joinpath("emulation-1-0.json").write_text(json.dumps(
        {"owner_pid": 1, "owner_ticks": 0, "bridges": [], "interfaces": [], "pids": []}))
    (old,) = claims.claims()
    assert old.namespaces == [] and old.paths == []
