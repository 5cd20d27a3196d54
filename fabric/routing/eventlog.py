"""A routing policy's log of routing events, one plain record per event: `RouteEvent`s are made when
asked for, so a decision itself makes no object but its record (time, cause, trigger, moves,
decision time in us); a link event's trigger is kept as (switch, port, up) and worded when asked for."""
from __future__ import annotations

import time
from collections import deque
from typing import Iterable

from fabric.routing.records import CAUSES, RouteEvent, SlotMove

Trigger = str | tuple[str, int, bool]
Record = tuple[float, str, Trigger, tuple[SlotMove, ...], float]


class EventLog(deque[Record]):
    """The records, oldest first (the oldest dropped beyond `maxlen`)."""

    def record(self, now: float, cause: str, trigger: Trigger, moves: Iterable[SlotMove], started: float) -> None:
        """One event, if it moved anything (`started`: its `time.perf_counter()` at the start)."""
        if moves:
            self.append((now, cause, trigger, tuple(moves), (time.perf_counter() - started) * 1e6))

    def events(self, limit: int | None = None) -> tuple[RouteEvent, ...]:
        """The last `limit` events (None: all of them)."""
        evs = tuple(self)
        if limit is not None:
            evs = evs[-limit:] if limit > 0 else ()
        return tuple(RouteEvent(now, cause, trigger if isinstance(trigger, str) else
                                f"{trigger[0]}:{trigger[1]} {'up' if trigger[2] else 'down'}", moves, took_us)
                     for now, cause, trigger, moves, took_us in evs)

    def reroutes(self) -> dict[str, int]:
        """Slot moves by cause, over the events still in the log."""
        out = {c: 0 for c in CAUSES}
        for e in self:
            for m in e[3]:
                out[m.cause] += 1
        return out
