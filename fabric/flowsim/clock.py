"""A run's clock: the simulated time, the timed events due (a heap, in time and then in the order they
were scheduled), the transfer batches they carry, and the count of instants at which something happened.
"""
from __future__ import annotations

import heapq
import math

from fabric.flowsim.maxmin import IntArray

# the kinds of timed event (a heap entry: time, order, kind, payload)
LINK_EVENT = 0  # payload: index into the run's link events
JOB_START = 1  # payload: the job
DELIVERY = 2  # a batch of transfers delivered (payload: key into `Clock.batches`)
POLL = 3  # the congestion feedback's poll
REPLAY_END = 4  # replayed phases end (payload: key into `PhaseReplays.replays`)
SETUP_DONE = 5  # transfers done with their per-transfer delay (cut-through; payload: key into `Clock.batches`)
#: (cut-through also uses it for in-server transfers: sent once their NVLink time has passed)
JOB_END = 6  # a job without transfers ends its `hold_s` (payload: the job)
#: the kinds a run may handle early, within its resolution (`SimOptions.resolution_s`): they start or end
#: transfers and jobs at the moment they are handled. Not a replay's end (its load intervals are logged up to
#: its own time), a link event (given at a time by the user) nor a poll
EARLY_KINDS = frozenset({JOB_START, DELIVERY, SETUP_DONE, JOB_END})


class Clock:
    """The simulated time (`now`), the timed events due, and `events`: the instants at which something
    happened (flows ended, timed events), as the result counts them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.heap: list[tuple[float, int, int, int]] = []
        self.batches: dict[int, IntArray] = {}
        self.seq = 0
        self.events = 0

    def push(self, time_s: float, kind: int, payload: int) -> None:
        heapq.heappush(self.heap, (time_s, self.seq, kind, payload))
        self.seq += 1

    def push_batch(self, time_s: float, kind: int, g: IntArray) -> None:
        """An event of `kind` at `time_s` for transfers `g` (kept in `batches` under the event's order)."""
        self.batches[self.seq] = g
        self.push(time_s, kind, self.seq)

    def pop(self) -> tuple[int, int]:
        """The next timed event, taken off the heap: (kind, payload)."""
        _, _, kind, payload = heapq.heappop(self.heap)
        return kind, payload

    def next_s(self) -> float:
        """When the next timed event is due (inf: none)."""
        return self.heap[0][0] if self.heap else math.inf

    def only_polls(self) -> bool:
        """Nothing but polls is pending."""
        return all(kind == POLL for _, _, kind, _ in self.heap)
