"""The controller's state as the REST API and the Prometheus metrics see it: a narrow interface.

`ControllerState` reads the core (model, policy snapshots, counters) and the switch sessions under
the app's lock and returns plain data; its one write is an operator's move, which it hands to the
core and sends through a callback. The REST layer (`controller.api`) knows only this class, so
there is no import circle between the os-ken shim and the API.

Units: rates and capacities in bits per second (`_bps`), counters in bytes (`_bytes`), times in
seconds; `time_s` is CLOCK_MONOTONIC (comparable with other processes' `time.monotonic()` on the
same machine), `wall_time` the matching wall-clock time.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from controller.core import ControllerCore
from controller.intents import Changes
from controller.sync import DatapathSync
from fabric import topofile


@dataclass(frozen=True)
class PortCounter:
    switch: str
    port: int
    tx_bytes: int
    rx_bytes: int


class ControllerState:
    def __init__(self, core: ControllerCore, sessions: Mapping[int, DatapathSync], lock: threading.RLock,
                 send: Callable[[list[Changes]], None]) -> None:
        self._core = core
        self._sessions = sessions
        self._lock = lock
        self._send = send
        self.started_s = time.monotonic()

    @property
    def fabric_name(self) -> str:
        return self._core.fabric.name

    def _wall(self, t_mono: float) -> float:
        return time.time() - (time.monotonic() - t_mono)

    def is_host(self, name: str) -> bool:
        return name in self._core.fabric.host_by_name

    def is_switch(self, name: str) -> bool:
        return name in self._core.fabric.switch_by_name

    def status(self) -> dict[str, Any]:
        core = self._core
        with self._lock:
            sessions = dict(self._sessions)
        name = core.switch_name
        return {
            "fabric": core.fabric.name,
            "routing": core.routing,
            "switches": len(core.fabric.switches),
            "connected": sorted(str(name(d)) for d in sessions),
            "synced": sorted(str(name(d)) for d, s in sessions.items() if s.synced),
            "uptime_s": round(time.monotonic() - self.started_s, 3),
        }

    def topology(self) -> dict[str, Any]:
        return topofile.to_dict(self._core.fabric)

    def links(self) -> list[dict[str, Any]]:
        """Every directed link; `up` is whether the routing uses it (a gray link is not up),
        `gray` whether its probes are being lost (`probes_lost` of `probes_sent` in its last reading)."""
        gray = self._core.gray
        with self._lock:
            states = self._core.policy.links()
            probed = {(l.switch, l.port): gray.last_reading((l.switch, l.port)) for l in states
                      if (l.switch, l.port) in gray.links}
            grays = set(gray.gray_links())
        return [{"switch": l.switch, "port": l.port, "peer": l.peer, "peer_port": l.peer_port, "up": l.up,
                 "capacity_bps": l.capacity_bps, "rate_bps": l.rate_bps, "utilisation": l.utilisation,
                 "hot": l.hot, "gray": (l.switch, l.port) in grays,
                 "probes_lost": probed.get((l.switch, l.port), (0, 0))[0],
                 "probes_sent": probed.get((l.switch, l.port), (0, 0))[1]} for l in states]

    def port_events(self, limit: int) -> list[dict[str, Any]]:
        """Switch port state changes as the controller learnt them (port-status messages), newest last."""
        with self._lock:
            log = list(self._core.port_log)
        rows = [{"time_s": t, "wall_time": self._wall(t), "switch": sw, "port": port, "up": up}
                for t, sw, port, up in log]
        return rows[-limit:] if limit > 0 else []

    def congestion_steps(self, limit: int) -> list[dict[str, Any]]:
        """The congestion detector's steps (links turning warm or hot, nudges, flow-statistics requests
        and replies), newest last: with the moves in `events`, a timeline of each reaction."""
        with self._lock:
            log = list(self._core.congestion_log)
        rows = [{"time_s": t, "wall_time": self._wall(t), "step": step, "switch": sw, "port": port}
                for t, step, sw, port in log]
        return rows[-limit:] if limit > 0 else []

    def gray_events(self, limit: int) -> list[dict[str, Any]]:
        """Gray-failure verdicts (a link turned gray or healed), newest last."""
        with self._lock:
            log = list(self._core.gray_log)
        rows = [{"time_s": v.time_s, "wall_time": self._wall(v.time_s), "switch": v.link[0], "port": v.link[1],
                 "gray": v.gray, "probes_lost": v.lost, "probes_sent": v.sent, "what": v.describe()} for v in log]
        return rows[-limit:] if limit > 0 else []

    def paths(self, src: str, dst: str, src_port: int | None, offset: int, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            return self._core.paths(src, dst, src_port, offset, limit)

    def events(self, limit: int) -> list[dict[str, Any]]:
        """The reroute log, one row per slot moved, newest last."""
        with self._lock:
            events = self._core.policy.events()
        rows = [{"time_s": e.time_s, "wall_time": self._wall(e.time_s), "cause": m.cause, "trigger": e.trigger,
                 "switch": m.switch, "dest": m.dest, "slot": m.slot, "old_port": m.old_port, "new_port": m.new_port,
                 "decision_us": e.decision_us} for e in events for m in e.moves]
        return rows[-limit:] if limit > 0 else []

    def slots(self, switch: str) -> dict[str, list[dict[str, Any]]]:
        core = self._core
        with self._lock:
            table = core.policy.slot_table(switch)
            pins = {dest: core.policy.pinned(switch, dest) for dest in table}
            rates = dict(core.last_slot_rates_bps)
        return {dest: [{"slot": i, "port": port, "rate_bps": rates.get((switch, dest, i), 0.0),
                        "pinned": i in pins[dest]} for i, port in enumerate(ports)] for dest, ports in table.items()}

    def move(self, switch: str, dest: str, slot: int, port: int) -> bool:
        """An operator's move (the slot stays pinned there until released); raises FabriclabError
        when it cannot be made. True if anything changed."""
        with self._lock:
            changes = self._core.on_manual_move(switch, dest, slot, port, time.monotonic())
            self._send(changes)
        return sum(len(c) for c in changes) > 0

    def release(self, switch: str, dest: str, slot: int | None) -> bool:
        """The operator gives a pinned slot (None: all pinned at that decision point) back to the
        routing policy; raises FabriclabError when it is not pinned. True if anything changed."""
        with self._lock:
            changes = self._core.on_release(switch, dest, slot, time.monotonic())
            self._send(changes)
        return sum(len(c) for c in changes) > 0

    def port_counters(self) -> list[PortCounter]:
        with self._lock:
            items = sorted(self._core.port_bytes.items())
        return [PortCounter(sw, port, tx, rx) for (sw, port), (tx, rx) in items]

    def reroutes(self) -> dict[str, int]:
        with self._lock:
            return self._core.policy.reroutes()

    def synced_count(self) -> int:
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.synced)

    def observe_decisions(self, observer: Callable[[float], None]) -> None:
        """`observer(us)` is called with each decision's latency (event in -> intents out)."""
        self._core.decision_observers.append(observer)
