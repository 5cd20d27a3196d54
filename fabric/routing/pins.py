"""An operator's pinned slots: decision point -> slot -> the port an operator put it on, kept until
released (`RoutingPolicy.move`, `RoutingPolicy.release`). Whatever a policy's reaction does, a
pinned slot goes back on its operator's port whenever that port is alive (`Pins.keep`)."""
from __future__ import annotations

from typing import Callable, Iterable

from fabric.errors import RoutingError
from fabric.routing.records import DecisionPoint, SlotKey, SlotMove

SetSlot = Callable[[DecisionPoint, int, int, str], SlotMove]  # `RoutingPolicy._set_slot`


class Pins(dict[DecisionPoint, dict[int, int]]):
    """Decision point -> slot -> port, for the decision points with a pinned slot."""

    def pin(self, key: DecisionPoint, slot: int, port: int) -> None:
        self.setdefault(key, {})[slot] = port

    def unpin(self, key: DecisionPoint, slot: int | None) -> tuple[int, ...]:
        """Release pinned `slot` (None: every pinned slot) at `key`; returns the released slots."""
        pins = self.get(key, {})
        if slot is not None and slot not in pins:
            raise RoutingError(f"slot {slot} at {key[0]} towards {key[1]} is not pinned (pinned: {sorted(pins)})")
        released = tuple(sorted(pins)) if slot is None else (slot,)
        for s in released:
            del pins[s]
        if not pins:
            self.pop(key, None)
        return released

    def keep(self, moves: list[SlotMove], keys: Iterable[DecisionPoint], cause: str,
             slots: dict[DecisionPoint, tuple[int, ...]], alive: dict[DecisionPoint, tuple[int, ...]],
             set_slot: SetSlot) -> list[SlotMove]:
        """Put every pinned slot at `keys` and at the moves' decision points back on its operator's
        port where that port is `alive`, by `set_slot` (which changes `slots`); then one move per
        slot, none for a slot that ended where it began."""
        for key in sorted(k for k in set(keys) | {(m.switch, m.dest) for m in moves} if k in self):
            live = alive.get(key, ())
            for slot, port in self.get(key, {}).items():
                if slots[key][slot] != port and port in live:
                    moves.append(set_slot(key, slot, port, cause))
        first: dict[SlotKey, SlotMove] = {}
        last: dict[SlotKey, SlotMove] = {}
        for m in moves:
            first.setdefault((m.switch, m.dest, m.slot), m)
            last[(m.switch, m.dest, m.slot)] = m
        return [SlotMove(m.switch, m.dest, m.slot, first[k].old_port, m.new_port, m.cause)
                for k, m in last.items() if first[k].old_port != m.new_port]
