"""Fault injection on a running emulation: links, ports, switches and whole planes down and up.

Every injection is timestamped on the monotonic clock (CLOCK_MONOTONIC, shared by every process on
the machine, so a probe's send schedule and the controller's events can be compared with it) and
logged. What each fault does to the emulated network:

- `link(node, port)`: both interfaces of the link go down (or up): the switch end first.
- `port(switch, port)`: only the switch's interface; its veth peer loses carrier, so the far end sees
  the link down too (a port failure).
- `switch(name)`: every port of the switch (one batch): the switch is cut off, as if it died.
- `plane(name)`: every port of every switch of the plane: hosts keep only their other planes.

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


@dataclass(frozen=True)
class FaultEvent:
    kind: str  # "link", "port", "switch" or "plane"
    target: str  # "spineA0:4", "spineA0", "A"
    up: bool
    at_s: float  # monotonic time just before the first interface changed
    done_s: float  # monotonic time just after the last one changed
    wall_time: float  # time.time() at `at_s`, for display
    ends: tuple[tuple[str, int], ...]  # the (node, port) interfaces changed

    def describe(self) -> str:
        return f"{self.kind} {self.target} {'up' if self.up else 'down'}"


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
        peer = self.fabric.peer(node, port)
        ends = sorted([(node, port), (peer.node, peer.port)], key=lambda e: e[0] in self.fabric.host_by_name)
        return self._inject("link", f"{node}:{port}", ends, up)

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
