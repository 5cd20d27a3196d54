"""Start and stop the controller as a child process (by PID, never by name)."""
from __future__ import annotations

import json
import os
import urllib.request
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fabric.errors import EmulationError


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ControllerProcess:
    """`python -m controller` for one topology file, logging to `log_path`."""

    def __init__(self, topology: Path, log_path: Path, port: int | None = None, mode: str = "adaptive",
                 rest_port: int | None = None, extra_args: list[str] | None = None) -> None:
        self.topology = topology
        self.log_path = log_path
        self.port = port or free_port()
        self.rest_port = rest_port or free_port()
        self.mode = mode
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = 20.0) -> "ControllerProcess":
        cmd = [
            sys.executable, "-m", "controller",
            "--topology", str(self.topology), "--mode", self.mode, "--port", str(self.port),
            "--rest-port", str(self.rest_port), *self.extra_args,
        ]
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while not (_listening(self.port) and _listening(self.rest_port)):
            if self.proc.poll() is not None:
                raise EmulationError(f"the controller exited with code {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise EmulationError(f"the controller did not listen on 127.0.0.1:{self.port} within {timeout_s:g} s")
            time.sleep(0.05)
        return self

    def get(self, path: str, timeout_s: float = 5.0) -> Any:
        """GET a JSON document from the controller's REST API."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}", timeout=timeout_s) as resp:
            return json.load(resp)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no controller log)"

    def stop(self, timeout_s: float = 5.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
