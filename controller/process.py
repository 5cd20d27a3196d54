"""Start, supervise and stop the controller as a child process (by PID, never by name)."""
from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from fabric.emulation import claims
from fabric.errors import DeadlineError, EmulationError
from fabric.polling import wait_until


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(where: int | Path) -> bool:
    """Whether something accepts connections on TCP port `where` of 127.0.0.1, or on Unix socket `where`."""
    family, address = ((socket.AF_INET, ("127.0.0.1", where)) if isinstance(where, int)
                       else (socket.AF_UNIX, str(where)))
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(address) == 0


_sockets = itertools.count()


class ControllerProcess:
    """`python -m controller` for one topology file, logging to `log_path`."""

    def __init__(self, topology: Path, log_path: Path, port: int | None = None, routing: str = "adaptive",
                 rest_port: int | None = None, extra_args: list[str] | None = None) -> None:
        self.topology = topology
        self.log_path = log_path
        self.port = port or free_port()
        self.rest_port = rest_port or free_port()
        self.routing = routing
        # switches in other network namespaces (the emulation's) connect here: `openflow_target`
        self.unix_path = claims.claim_dir() / f"ctl-{os.getpid()}-{next(_sockets)}.sock"
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None  # monotonic time of the last start
        self._claim: claims.Claim | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = 20.0) -> "ControllerProcess":
        cmd = [
            sys.executable, "-m", "controller",
            "--topology", str(self.topology), "--routing", self.routing, "--port", str(self.port),
            "--rest-port", str(self.rest_port), "--unix", str(self.unix_path), *self.extra_args,
        ]
        self.unix_path.parent.mkdir(parents=True, exist_ok=True)
        self._release()  # a previous (dead) process of ours
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.started_s = time.monotonic()
        proc = self.proc
        # removed by the next run if we are killed, its socket file too
        self._claim = claims.claim("controller", pids=[proc.pid], paths=[str(self.unix_path)])

        def ready() -> bool:
            if proc.poll() is not None:
                raise EmulationError(f"the controller exited with code {proc.returncode}:\n{self.log_tail()}")
            return listening(self.port) and listening(self.rest_port) and listening(self.unix_path)

        try:
            wait_until(f"the controller to listen on 127.0.0.1:{self.port}", ready, timeout_s)
        except DeadlineError:
            self.stop()
            raise
        return self

    @property
    def openflow_target(self) -> str:
        """Where switches connect (OVS controller target): the Unix socket, reachable from any namespace."""
        return f"unix:{self.unix_path}"

    def get(self, path: str, timeout_s: float = 5.0) -> Any:
        """GET a JSON document from the controller's REST API."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}", timeout=timeout_s) as resp:
            return json.load(resp)

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 5.0) -> Any:
        """POST JSON to the REST API; a 4xx answer raises EmulationError with its message."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.rest_port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            raise EmulationError(f"POST {path}: {e.code} {e.read().decode(errors='replace')[-300:]}") from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no controller log)"

    def kill(self) -> None:
        """SIGKILL the controller (for fault tests: the data plane must keep forwarding). A session's
        supervisor may notice the death and start a new process at once: this waits for the process
        it killed, never for that one, and leaves the new one's claim alone."""
        proc, claim = self.proc, self._claim
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if claim is not None and self._claim is claim:
            self._release()

    def _release(self) -> None:
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def stop(self, timeout_s: float = 5.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self._release()
            self.unix_path.unlink(missing_ok=True)
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
        self._release()
        self.unix_path.unlink(missing_ok=True)
