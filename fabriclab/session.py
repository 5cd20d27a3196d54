"""A lab session: controller first, then the emulated fabric, then wait until it is routed.

    with Lab(fabric) as lab:          # controller listening, switches connected, flows installed
        ping_all(lab.emulation)
        lab.faults.link_down("spineA0", 4)
    # everything torn down: switches, links, host processes, controller, run directory

The controller reads the very same model: the fabric is written to the run directory in its
explicit YAML form and the controller loads that file. While the session runs it supervises the
controller: if the process dies unexpectedly, the session notices within `supervise_s`, says so,
starts a new one on the same ports (it resynchronises the switches without wiping them; they keep
forwarding meanwhile, fail-secure) and records the gap (`controller_gaps`).
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Callable

from controller.process import ControllerProcess
from fabric import topofile
from fabric.emulation import Emulation, EmulationOptions, Faults, Leftovers, check_options
from fabric.emulation.system import has_netem, tunnel_kinds
from fabric.errors import DeadlineError, EmulationError
from fabric.model import Fabric
from fabric.polling import waited_s
from fabric.routing import load_policy


@dataclass(frozen=True)
class BringUp:
    """Seconds spent in each bring-up phase."""

    controller_s: float
    build_s: float
    connect_s: float
    flows_s: float

    @property
    def total_s(self) -> float:
        return self.controller_s + self.build_s + self.connect_s + self.flows_s


@dataclass(frozen=True)
class ControllerGap:
    """An unexpected controller death and what the session did about it (monotonic seconds)."""

    exit_code: int | None
    noticed_s: float
    restarted_s: float | None  # listening again
    synced_s: float | None  # every switch resynchronised
    error: str = ""

    @property
    def gap_s(self) -> float | None:
        return None if self.synced_s is None else self.synced_s - self.noticed_s


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Lab:
    def __init__(
        self,
        fabric: Fabric,
        routing: str = "adaptive",
        opts: EmulationOptions | None = None,
        timeout_s: float = 60.0,
        keep_dir: bool = False,
        controller_args: list[str] | None = None,
        supervise_s: float = 0.1,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.fabric = fabric
        self.routing = routing
        self.controller_args = list(controller_args or [])
        self.opts = opts or EmulationOptions()
        self.timeout_s = timeout_s
        self.keep_dir = keep_dir
        self.supervise_s = supervise_s
        self.log = log or (lambda msg: print(f"[fabriclab] {msg}", file=sys.stderr))
        self.run_dir: Path | None = None
        self.controller: ControllerProcess | None = None
        self.emulation: Emulation | None = None
        self.faults: Faults | None = None
        self.bringup: BringUp | None = None
        self.controller_gaps: list[ControllerGap] = []
        self._old_sigterm: Any = None
        self._old_sigint: Any = None
        self._ctl_lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "Lab":
        # Refuse bad input before anything is built: routing, emulation options, privileges.
        load_policy(self.routing)
        check_options(self.fabric, self.opts, has_netem=has_netem(),
                      tunnel_kinds=tunnel_kinds() if self.opts.tunnel_links else frozenset())
        if os.geteuid() != 0:
            raise EmulationError("the emulation needs root (Mininet and Open vSwitch); run with sudo")
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
            # A process started in the background by a non-interactive shell (`fabriclab up --hold &`
            # in a script, nohup) begins with SIGINT ignored, and Python then never raises
            # KeyboardInterrupt: `kill -INT` must tear the lab down all the same.
            if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
                self._old_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix="fabriclab-run-"))
        topo = self.run_dir / "topology.yaml"
        topo.write_text(topofile.dumps(self.fabric))
        t0 = time.monotonic()
        args = ["--mbps-per-gbps", repr(self.opts.mbps_per_gbps), *self.controller_args]
        self.controller = ControllerProcess(topo, self.run_dir / "controller.log", routing=self.routing,
                                            extra_args=args).start()
        t1 = time.monotonic()
        self.emulation = Emulation(self.fabric, self.controller.openflow_target, self.opts).start()
        self.faults = Faults(self.emulation)
        t2 = time.monotonic()
        try:
            connect_s = self._wait_status("connected", "all switches to connect to the controller", self.timeout_s)
            flows_s = self._wait_status("synced", "the controller to synchronise every switch", self.timeout_s)
        except DeadlineError as e:
            raise EmulationError(f"{e}\ncontroller log (tail):\n{self.controller.log_tail()}") from None
        if not self.controller.alive():
            raise EmulationError(f"the controller died during bring-up:\n{self.controller.log_tail()}")
        self.bringup = BringUp(t1 - t0, t2 - t1, connect_s, flows_s)
        self._supervisor = threading.Thread(target=self._supervise, name="fabriclab-supervisor", daemon=True)
        self._supervisor.start()

    def _wait_status(self, key: str, what: str, timeout_s: float) -> float:
        # the controller's own view: OVSDB's is_connected is only refreshed every few seconds
        ctl, n = self.controller, len(self.fabric.switches)
        if ctl is None:
            raise EmulationError("no controller")

        def ready() -> bool:
            if not ctl.alive():
                raise EmulationError(f"the controller exited ({ctl.returncode}) while waiting for {what}:\n"
                                     f"{ctl.log_tail()}")
            return len(ctl.get("/api/status")[key]) == n

        return waited_s(what, ready, timeout_s)

    def wait_synced(self, timeout_s: float = 30.0) -> float:
        """Seconds until every switch is connected and synchronised with the controller."""
        return self._wait_status("synced", "every switch to be synchronised", timeout_s)

    # ---- controller supervision ----------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._stopping.wait(self.supervise_s):
            with self._ctl_lock:
                ctl = self.controller
                if ctl is None or ctl.alive() or self._stopping.is_set():
                    continue
                code = ctl.returncode
                noticed = time.monotonic()
                self.log(f"the controller exited unexpectedly (code {code}); restarting it (the switches "
                         "keep forwarding, fail-secure)")
                try:
                    ctl.start()
                    restarted = time.monotonic()
                    synced_after = self._wait_status("synced", "the restarted controller to resync", self.timeout_s)
                    gap = ControllerGap(code, noticed, restarted, restarted + synced_after)
                    self.log(f"controller back: every switch resynchronised {gap.gap_s:.2f} s after the exit "
                             "was noticed")
                except Exception as e:  # noqa: BLE001 - reported in the gap and the summary
                    gap = ControllerGap(code, noticed, None, None, str(e))
                    self.log(f"restarting the controller failed: {e}")
                self.controller_gaps.append(gap)

    def restart_controller(self, timeout_s: float = 30.0) -> float:
        """Stop the controller process and start a new one on the same ports; returns seconds until
        every switch is synchronised again. The switches keep forwarding meanwhile (fail-secure)."""
        if self.controller is None or self.emulation is None:
            raise EmulationError("the lab is not running")
        with self._ctl_lock:
            self.controller.stop()
            t0 = time.monotonic()
            self.controller.start()
            self._wait_status("synced", "the restarted controller to synchronise every switch", timeout_s)
            return time.monotonic() - t0

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=self.timeout_s + 10)
        try:
            if self.emulation is not None:
                self.emulation.stop()
        finally:
            try:
                if self.controller is not None:
                    self.controller.stop()
            finally:
                if self.run_dir is not None and not self.keep_dir:
                    shutil.rmtree(self.run_dir, ignore_errors=True)
                if self._old_sigterm is not None:
                    signal.signal(signal.SIGTERM, self._old_sigterm)
                    self._old_sigterm = None
                if self._old_sigint is not None:
                    signal.signal(signal.SIGINT, self._old_sigint)
                    self._old_sigint = None

    def leftovers(self) -> Leftovers:
        """What of this run still exists, controller process included."""
        if self.emulation is None:
            return Leftovers()
        left = self.emulation.leftovers()
        if self.controller is not None and self.controller.alive() and self.controller.pid is not None:
            left.pids.append(self.controller.pid)
        return left

    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
