"""`fabriclab compare`'s rows as Ray tasks (`fabriclab.sweep`), on a real Ray cluster of two nodes started here
(`tests.ray_cluster`: `ray start --head` and one more `ray start --address`, one CPU each) and on the local Ray
instance a command starts by default: the rows equal the single-process run's (each row computed in this
process by `run_row`, wall-clock fields excepted), a worker killed mid-row loses no row, a row that always
fails is reported failed after one retry (or none, for an exception) while the others complete, and nothing
the command started runs on after it, on SIGTERM too. Never skipped: if Ray cannot start, these fail."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fabriclab import compare as cmp
from fabriclab.rows import with_efficiency
from fabriclab.cli import main
from fabriclab.sweep import CLIENT_INIT_ATTEMPTS as SWEEP_ATTEMPTS, SweepError
from tests.ray_cluster import DRIVER_ENV, RayCluster, alive, descendants, wait_until
from tests.sweep_policies import TEST_DIR_ENV
from traffic.traces import BUILTIN_TRACE

TRACE = str(BUILTIN_TRACE)
SIZES = [8, 16]
BASE = [cmp.Series("pyramid-16", "ecmp"), cmp.Series("dual-plane-16", "adaptive"), cmp.Series("pyramid-16", "static"),
        cmp.Series("dual-plane-16", "ecmp")]
STALLS = cmp.Series("pyramid-16", "tests.sweep_policies:StallsOnce")
DIES = cmp.Series("pyramid-16", "tests.sweep_policies:DiesAlways")
RAISES = cmp.Series("dual-plane-16", "tests.sweep_policies:RaisesAlways")
WALL_CLOCK = ("sim_wall_s", "cached")


def same(row: cmp.Row | dict) -> str:
    """A row without its wall-clock fields, exactly (floats by repr, NaN included) for comparing."""
    doc = row if isinstance(row, dict) else row.__dict__
    return json.dumps({k: v for k, v in doc.items() if k not in WALL_CLOCK}, sort_keys=True)


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """Every row the tests run, computed in this process one after another (no Ray), with its series' scaling
    efficiency: row label -> `same`."""
    tasks, _ = cmp.plan_rows(TRACE, [*BASE, STALLS], SIZES)
    rows = with_efficiency([cmp.Row(**cmp.run_row(t)) for t in tasks])
    return {t["row"]: same(r) for t, r in zip(tasks, rows)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    marks = tmp_path_factory.mktemp("marks")
    c = RayCluster(nodes=2, cpus=1, env={TEST_DIR_ENV: str(marks)}).start()
    c.marks = marks
    try:
        yield c
    finally:
        left = c.stop()
    assert left == [], f"processes of the test's Ray nodes still alive: {left}"


@pytest.fixture
def driver(monkeypatch):
    """This process as a driver of the test's cluster (token authentication) and of nothing else."""
    for k, v in DRIVER_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


class Seen:
    """The Ray nodes the rows' progress came from."""

    def __init__(self) -> None:
        self.nodes: set[str] = set()

    def __call__(self, p: cmp.CompareProgress) -> None:
        self.nodes |= {r.node_id for r in p.running}


def test_eight_rows_over_a_two_node_cluster_equal_the_single_process_rows(cluster, reference, driver):
    seen = Seen()
    rows = cmp.compare(TRACE, BASE, SIZES, cluster=cluster.client_address, progress=seen)  # Ray Client
    labels = [t["row"] for t in cmp.plan_rows(TRACE, BASE, SIZES)[0]]
    assert len(rows) == 8
    assert [same(r) for r in rows] == [reference[label] for label in labels]
    assert len(seen.nodes) == 2  # both nodes ran rows


def test_a_client_server_that_dies_as_it_starts_is_retried_and_ray_stays_usable(cluster, reference, driver,
                                                                              monkeypatch):
    # ray-project/ray#63202: the per-client server the cluster starts for a Ray Client connection dies in a few
    # percent of connections, and ray.init gets "Initialization failure from server". Its answer, as Ray's
    # client receives it, stands in for the death (it cannot be caused at will).
    from ray.util.client import worker

    real_init = worker.Worker._server_init
    deaths = {"left": 1, "seen": 0}

    def dies(self, *args, **kwargs):
        if deaths["left"] != 0:
            deaths["left"] -= 1
            deaths["seen"] += 1
            raise ConnectionAbortedError("Initialization failure from server:\n(the specific server died)")
        return real_init(self, *args, **kwargs)

    monkeypatch.setattr(worker.Worker, "_server_init", dies)
    label = cmp.plan_rows(TRACE, BASE[:1], SIZES[:1])[0][0]["row"]
    rows = cmp.compare(TRACE, BASE[:1], SIZES[:1], cluster=cluster.client_address)  # dies once, then connects
    assert deaths["seen"] == 1 and [same(r) for r in rows] == [reference[label]]

    deaths.update(left=-1, seen=0)  # dies every time: given up after the stated attempts, named
    with pytest.raises(SweepError, match=rf"{SWEEP_ATTEMPTS} attempts.*Initialization failure from server"):
        cmp.compare(TRACE, BASE[:1], SIZES[:1], cluster=cluster.client_address)
    assert deaths["seen"] == SWEEP_ATTEMPTS
    # and the failed connections left nothing behind in this process: the cluster by its GCS address (not Ray
    # Client) works next (before the fix, Ray's client mode stayed on and this init failed an assertion)
    assert [same(r) for r in cmp.compare(TRACE, BASE[:1], SIZES[:1], cluster=cluster.address)] == [reference[label]]


def test_a_worker_killed_mid_row_loses_no_row(cluster, reference, driver, monkeypatch):
    # the cluster named by RAY_ADDRESS, as a driver on one of its nodes (its GCS address); only its nodes have
    # TEST_DIR_ENV, so a row that ran anywhere else would never stall, and this test would fail
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    series = [s if s.routing != "static" else STALLS for s in BASE]
    stalled = cluster.marks / "stalled"
    killed: list[int] = []

    def kill_the_stalled_worker() -> None:  # the row of the first StallsOnce worker waits in it to be killed
        pid = int(wait_until("a worker stalled in its row", lambda: stalled.is_file() and stalled.read_text(), 300))
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_the_stalled_worker, daemon=True)
    killer.start()
    rows = cmp.compare(TRACE, series, SIZES)
    killer.join(timeout=60)
    labels = [t["row"] for t in cmp.plan_rows(TRACE, series, SIZES)[0]]
    assert [same(r) for r in rows] == [reference[label] for label in labels]
    assert len(killed) == 1 and alive(killed) == []
    # the killed worker built the policy once (and stalled in it); its row was retried on another worker, which
    # built it after (a row builds it once for its run and once per NCCL-choice check, `traffic.replay.alone`)
    built = (cluster.marks / "built").read_text().split()
    at = built.index(str(killed[0]))
    assert built.count(str(killed[0])) == 1 and [b for b in built[at + 1:] if b != str(killed[0])]


def test_rows_that_always_fail_are_reported_and_the_others_complete(cluster, reference, driver, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["compare", TRACE, "--sizes", *map(str, SIZES), "--no-cache", "--out", str(out),
                 "--cluster", cluster.client_address, "--topology", "pyramid-16", "--routing", "ecmp",
                 "--topology", DIES.topology, "--routing", DIES.routing,
                 "--topology", RAISES.topology, "--routing", RAISES.routing]) == 1
    doc = json.loads((out / "compare.json").read_text())
    assert [same(r) for r in doc["rows"]] == [reference[f"pyramid-{n} ecmp ({n} GPUs)"] for n in SIZES]
    failed = {f["row"]: f for f in doc["meta"]["failed"]}
    assert sorted(failed) == sorted([f"pyramid-{n} {DIES.routing} ({n} GPUs)" for n in SIZES]
                                    + [f"dual-plane-{n} {RAISES.routing} ({n} GPUs)" for n in SIZES])
    assert {f["kind"] for r, f in failed.items() if "DiesAlways" in r} == {"worker died"}
    assert {f["error"] for r, f in failed.items() if "RaisesAlways" in r} == {
        "RuntimeError: this row's routing always raises"}
    assert doc["meta"]["complete"] is False
    # the dying rows' workers: two per row (retried once, not more); the raising rows': one each (not retried)
    assert len((cluster.marks / "died").read_text().split()) == 2 * len(SIZES)
    assert len((cluster.marks / "raised").read_text().split()) == len(SIZES)
    text = (out / "compare.txt").read_text()
    assert "failed rows (4; every other row finished):" in text and all(r in text for r in failed)
    assert "failed rows (4" in capsys.readouterr().out


# ---- the local default: a Ray instance of the command's own --------------------------------------------

def _local(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_the_local_default_starts_a_ray_instance_and_ends_it(monkeypatch, reference):
    _local(monkeypatch)
    before = set(descendants(os.getpid()))
    during: set[str] = set()

    def look(p: cmp.CompareProgress) -> None:
        for pid in set(descendants(os.getpid())) - before:
            try:
                during.add(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                pass

    from fabriclab import sweep

    made: list[str] = []  # the session directories this process's instance made (not another run's on the machine)
    mkdtemp = sweep.tempfile.mkdtemp

    def recorded(*args, **kwargs):
        d = mkdtemp(*args, **kwargs)
        if Path(d).name.startswith("fabriclab-ray-"):
            made.append(d)
        return d

    monkeypatch.setattr(sweep.tempfile, "mkdtemp", recorded)
    series = BASE[:2]
    rows = cmp.compare(TRACE, series, [8], progress=look, jobs=2)  # (--jobs 1 runs in this process, no Ray)
    assert [same(r) for r in rows] == [reference[t["row"]] for t in cmp.plan_rows(TRACE, series, [8])[0]]
    assert {"raylet", "gcs_server"} <= during  # the rows ran on a Ray instance this process started
    wait_until("the local Ray instance's processes gone", lambda: set(descendants(os.getpid())) <= before, 30)
    assert made and not [d for d in made if Path(d).exists()]  # its session files removed with it


def test_sigterm_ends_the_command_its_rows_and_its_ray_instance(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH"))
                                        if x)
    err = tmp_path / "stderr"
    ray_dirs = set(Path("/tmp").glob("fabriclab-ray-*"))
    with err.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "compare", TRACE, "--topology", "pyramid-16",
                                 "--routing", "ecmp", "--topology", "dual-plane-16", "--routing", "adaptive",
                                 "--sizes", "8", "16", "--no-cache", "--out", str(tmp_path / "o")],
                                env=env, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    try:
        # a row is running (its progress reached the command) on the command's Ray instance
        wait_until("a row's progress", lambda: "done; " in err.read_text(), 180)
        started = descendants(proc.pid)
        names = {Path(f"/proc/{p}/comm").read_text().strip() for p in started if Path(f"/proc/{p}/comm").exists()}
        assert "raylet" in names, names
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130, err.read_text()
        wait_until("every process the command started gone", lambda: not alive(started), 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "interrupted; torn down" in err.read_text()
    assert set(Path("/tmp").glob("fabriclab-ray-*")) <= ray_dirs  # its session files removed with it
