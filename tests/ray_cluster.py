"""A real Ray cluster on this machine for the sweep tests and the benchmark: a head node and more worker
nodes, each a `ray start --block` process of its own session (process group), its files in a directory of its
own, on free ports; the workers import this checkout (PYTHONPATH) and get `env`. Stopped by PID: SIGTERM to
each `ray start --block` (it ends its node's processes), then SIGKILL to whatever of its process group is left;
`ray stop` is never used (it would stop every Ray instance on the machine).

Ray's token authentication is on (its default): the nodes and the driver use the token in ~/.ray/auth_token,
which the head creates if there is none; the driver needs RAY_AUTH_MODE=token (`driver_env`).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
#: the driver's environment for a cluster with token authentication
DRIVER_ENV = {"RAY_AUTH_MODE": "token"}
START_DEADLINE_S = 180.0
STOP_DEADLINE_S = 60.0
#: each node's object store (Ray's default is 30% of the machine's memory, per node)
OBJECT_STORE_BYTES = 300_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _running(procs) -> list[int]:
    """The pids of `procs` (psutil processes) that still run: zombies and processes gone meanwhile left out."""
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def process_group(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                members.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return _running(members)


def descendants(pid: int) -> list[int]:
    """The live processes descended from `pid` (zombies not counted)."""
    try:
        return _running(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running (zombies not counted)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return _running(procs)


def wait_until(what: str, check, deadline_s: float, every_s: float = 0.2):
    """Poll `check()` until it returns something true; AssertionError naming `what` at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline_s:.0f} s")
        time.sleep(every_s)


class RayCluster:
    """`nodes` Ray nodes of `cpus` CPUs each (the first the head); `address` (GCS, for a driver on this machine)
    and `client_address` (ray://, Ray Client)."""

    def __init__(self, nodes: int = 2, cpus: int = 1, env: dict[str, str] | None = None) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray-test-"))  # short: Ray's socket paths have a length limit
        self.gcs_port, self.client_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.client_address = f"ray://127.0.0.1:{self.client_port}"
        path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
        self.env = os.environ | DRIVER_ENV | {"PYTHONPATH": path} | (env or {})
        self.env.pop("RAY_ADDRESS", None)
        self.nodes, self.cpus = nodes, cpus
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, i: int, args: list[str]) -> None:
        log = (self.temp_dir / f"node{i}.log").open("wb")
        cmd = [RAY, "start", "--block", "--num-cpus", str(self.cpus), "--node-ip-address", "127.0.0.1",
               "--dashboard-agent-listen-port", str(free_port()), "--object-store-memory", str(OBJECT_STORE_BYTES),
               "--disable-usage-stats", *args]
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.temp_dir))
        log.close()

        def started() -> bool:
            if self.procs[i].poll() is not None:
                raise AssertionError(f"ray start (node {i}) exited {self.procs[i].returncode}: "
                                     f"{(self.temp_dir / f'node{i}.log').read_text()[-3000:]}")
            return "Ray runtime started" in (self.temp_dir / f"node{i}.log").read_text(errors="replace")

        wait_until(f"Ray node {i} started", started, START_DEADLINE_S)

    def start(self) -> RayCluster:
        try:
            self._start(0, ["--head", "--port", str(self.gcs_port), "--ray-client-server-port", str(self.client_port),
                            "--include-dashboard", "false", "--temp-dir", str(self.temp_dir)])
            for i in range(1, self.nodes):
                self._start(i, ["--address", self.address])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> list[int]:
        """Stop every node (module docstring); returns the processes of their groups still alive after the
        deadline (none, unless a node would not end)."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + STOP_DEADLINE_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:  # what a node left (a worker of a killed raylet), by its group: ours alone
            if process_group(p.pid):
                os.killpg(p.pid, signal.SIGKILL)
        left: list[int] = []
        for p in self.procs:
            try:
                wait_until(f"process group {p.pid} gone", lambda: not process_group(p.pid), 10.0)
            except AssertionError:
                left += process_group(p.pid)
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
