"""Fault injection on a running emulation: links, ports, switches and whole planes down and up.

Every injection is timestamped on the monotonic clock (CLOCK_MONOTONIC, shared by every process on
the machine, so a probe's send schedule and the controller's events can be compared with it) and
logged. What each fault does to the emulated network:

- `link(node, port)`: both interfaces of the link go down (or up): the switch end first.
- `port(switch, port)`: only the switch's interface; its veth peer loses carrier, so the far end sees
  the link down too (a port failure).
- `switch(name)`: every port of the switch (one batch): the switch is cut off, as if it died.
- `plane(name)`: every port of every switch of the plane: hosts keep only their other planes.

- gray failures, the link stays up (no port-status event, fast-failover buckets still use it):
  `degrade(node, port, rate_fraction)` lowers the link's HTB rate in both directions to a fraction of
  its emulated rate (it drops what it cannot carry); `lossy(node, port, loss)` drops a random share
  of the packets in both directions (a classic-BPF filter on the egress clsact hook: this kernel has
  no netem); `heal(node, port)` restores both.
- `flap(node, port, times, within_s)`: the link goes down and up `times` times in `within_s` seconds
  (down for the first half of each period, up for the second), on a schedule of monotonic deadlines
  so the injection's own latency does not stretch it; every transition is logged.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from fabric.errors import EmulationError
from fabric.model import Fabric


class LinkControl(Protocol):
    fabric: Fabric

    def set_interfaces(self, ends: list[tuple[str, int]], up: bool) -> tuple[float, float]: ...

    def set_gray(self, ends: list[tuple[str, int]], rate_fraction: float, loss: float) -> tuple[float, float]: ...


@dataclass(frozen=True)
class FaultEvent:
    kind: str  # "link", "port", "switch", "plane"; gray failures: "degrade", "lossy", "heal"
    target: str  # "spineA0:4", "spineA0", "A"
    up: bool
    at_s: float  # monotonic time just before the first interface changed
    done_s: float  # monotonic time just after the last one changed
    wall_time: float  # time.time() at `at_s`, for display
    ends: tuple[tuple[str, int], ...]  # the (node, port) interfaces changed
    detail: str = ""  # a gray failure's rate or loss

    def describe(self) -> str:
        if self.kind in GRAY_KINDS:
            return f"{self.kind} {self.target}{' ' + self.detail if self.detail else ''}"
        return f"{self.kind} {self.target} {'up' if self.up else 'down'}"


GRAY_KINDS = ("degrade", "lossy", "heal")


class Faults:
    """Injects faults into `net` (a running `fabric.emulation.net.Emulation`) and logs them."""

    def __init__(self, net: LinkControl) -> None:
        self.net = net
        self.fabric = net.fabric
        self.log: list[FaultEvent] = []

    def _inject(self, kind: str, target: str, ends: list[tuple[str, int]], up: bool) -> FaultEvent:
        wall = time.time()
        t0, t1 = self.net.set_interfaces(ends, up)
        event = FaultEvent(kind, target, up, t0, t1, wall, tuple(ends))
        self.log.append(event)
        return event

    def link(self, node: str, port: int, up: bool) -> FaultEvent:
        """The link at `node`'s `port`: both ends, switch end first."""
        return self._inject("link", f"{node}:{port}", self._link_ends(node, port), up)

    def _link_ends(self, node: str, port: int) -> list[tuple[str, int]]:
        peer = self.fabric.peer(node, port)  # raises TopologyError for a port with no link
        return sorted([(node, port), (peer.node, peer.port)], key=lambda e: e[0] in self.fabric.host_by_name)

    def _gray(self, kind: str, node: str, port: int, rate_fraction: float, loss: float, detail: str) -> FaultEvent:
        ends = self._link_ends(node, port)
        wall = time.time()
        t0, t1 = self.net.set_gray(ends, rate_fraction, loss)
        event = FaultEvent(kind, f"{node}:{port}", kind == "heal", t0, t1, wall, tuple(ends), detail)
        self.log.append(event)
        return event

    def degrade(self, node: str, port: int, rate_fraction: float) -> FaultEvent:
        """A gray failure: the link at `node`'s `port` carries only `rate_fraction` (0 < f < 1) of its
        rate, both ways, and drops what does not fit; it stays up."""
        if not 0 < rate_fraction < 1:
            raise EmulationError(f"a degraded link keeps a fraction in (0, 1) of its rate, got {rate_fraction!r}")
        return self._gray("degrade", node, port, rate_fraction, 0.0, f"to {rate_fraction:g} of its rate")

    def lossy(self, node: str, port: int, loss: float) -> FaultEvent:
        """A gray failure: the link at `node`'s `port` drops a random `loss` (0 < loss <= 1) of its
        packets, both ways; it stays up."""
        if not 0 < loss <= 1:
            raise EmulationError(f"a lossy link drops a share in (0, 1] of its packets, got {loss!r}")
        return self._gray("lossy", node, port, 1.0, loss, f"losing {loss:g} of its packets")

    def heal(self, node: str, port: int) -> FaultEvent:
        """The link at `node`'s `port` back to its full rate and no loss."""
        return self._gray("heal", node, port, 1.0, 0.0, "")

    def link_down(self, node: str, port: int) -> FaultEvent:
        return self.link(node, port, up=False)

    def link_up(self, node: str, port: int) -> FaultEvent:
        return self.link(node, port, up=True)

    def flap(self, node: str, port: int, times: int, within_s: float) -> list[FaultEvent]:
        """The link at `node`'s `port` down and up again, `times` times in `within_s` seconds; it ends up."""
        if times < 1 or not within_s > 0:
            raise EmulationError(f"a flap needs times >= 1 and within_s > 0, got {times} and {within_s}")
        period = within_s / times
        start = time.monotonic()
        events = []
        for i in range(times):
            for up, at in ((False, start + i * period), (True, start + (i + 0.5) * period)):
                time.sleep(max(0.0, at - time.monotonic()))
                events.append(self.link(node, port, up))
        return events

    def port(self, switch: str, port: int, up: bool) -> FaultEvent:
        """One switch port only."""
        self._switch(switch)
        self.fabric.peer(switch, port)  # raises TopologyError for a port with no link
        return self._inject("port", f"{switch}:{port}", [(switch, port)], up)

    def switch(self, name: str, up: bool) -> FaultEvent:
        """Every port of one switch."""
        ends = [(name, a.port) for a in self.fabric.adjacency[self._switch(name)]]
        return self._inject("switch", name, ends, up)

    def plane(self, name: str, up: bool) -> FaultEvent:
        """Every port of every switch of one plane."""
        if name not in self.fabric.plane_by_name:
            raise EmulationError(f"no plane {name!r} in fabric {self.fabric.name!r} "
                                 f"(planes: {', '.join(self.fabric.plane_by_name)})")
        ends = [(s.name, a.port) for s in self.fabric.switches_in(name) for a in self.fabric.adjacency[s.name]]
        return self._inject("plane", name, ends, up)

    def _switch(self, name: str) -> str:
        if name not in self.fabric.switch_by_name:
            raise EmulationError(f"no switch {name!r} in fabric {self.fabric.name!r}")
        return name
