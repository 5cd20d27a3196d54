"""A lab session: controller first, then the emulated fabric, then wait until it is routed.

    with Lab(fabric) as lab:          # controller listening, switches connected, flows installed
        lab.emulation.ping_all()
    # everything torn down: switches, links, host processes, controller, run directory

The controller reads the very same model: the fabric is written to the run directory in its
explicit YAML form and the controller loads that file.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from controller.process import ControllerProcess
from fabric import topofile
from fabric.emulation import Emulation, EmulationOptions, Leftovers, check_options
from fabric.errors import EmulationError
from fabric.model import Fabric
from fabric.routing import check_mode


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


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Lab:
    def __init__(
        self,
        fabric: Fabric,
        mode: str = "adaptive",
        opts: EmulationOptions | None = None,
        timeout_s: float = 60.0,
        keep_dir: bool = False,
        controller_args: list[str] | None = None,
    ) -> None:
        self.fabric = fabric
        self.mode = mode
        self.controller_args = list(controller_args or [])
        self.opts = opts or EmulationOptions()
        self.timeout_s = timeout_s
        self.keep_dir = keep_dir
        self.run_dir: Path | None = None
        self.controller: ControllerProcess | None = None
        self.emulation: Emulation | None = None
        self.bringup: BringUp | None = None
        self._old_sigterm: Any = None

    def start(self) -> "Lab":
        # Refuse bad input before anything is built: routing mode, emulation options, privileges.
        check_mode(self.mode)
        check_options(self.fabric, self.opts)
        if os.geteuid() != 0:
            raise EmulationError("the emulation needs root (Mininet and Open vSwitch); run with sudo")
        self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
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
        self.controller = ControllerProcess(topo, self.run_dir / "controller.log", mode=self.mode,
                                            extra_args=args).start()
        t1 = time.monotonic()
        self.emulation = Emulation(self.fabric, self.controller.port, self.opts).start()
        t2 = time.monotonic()
        em = self.emulation
        try:
            ctl = self.controller
            n = len(self.fabric.switches)
            # the controller's own view: OVSDB's is_connected is only refreshed every few seconds
            em.wait_until("all switches to connect to the controller",
                          lambda: len(ctl.get("/api/status")["connected"]) == n, self.timeout_s)
            t3 = time.monotonic()
            em.wait_until("the controller to synchronise every switch",
                          lambda: len(ctl.get("/api/status")["synced"]) == n, self.timeout_s)
            t4 = time.monotonic()
        except EmulationError as e:
            raise EmulationError(f"{e}\ncontroller log (tail):\n{self.controller.log_tail()}") from None
        if not self.controller.alive():
            raise EmulationError(f"the controller died during bring-up:\n{self.controller.log_tail()}")
        self.bringup = BringUp(t1 - t0, t2 - t1, t3 - t2, t4 - t3)

    def restart_controller(self, timeout_s: float = 30.0) -> float:
        """Stop the controller process and start a new one on the same ports; returns seconds until
        every switch is synchronised again. The switches keep forwarding meanwhile (fail-secure)."""
        assert self.controller is not None and self.emulation is not None
        self.controller.stop()
        t0 = time.monotonic()
        self.controller.start()
        ctl, n = self.controller, len(self.fabric.switches)
        self.emulation.wait_until("the restarted controller to synchronise every switch",
                                  lambda: len(ctl.get("/api/status")["synced"]) == n, timeout_s)
        return time.monotonic() - t0

    def stop(self) -> None:
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
