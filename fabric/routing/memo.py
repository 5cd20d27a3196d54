"""The memo of a routing policy's link reactions (`RoutingPolicy.link_memo`).

The outcome of a link event is a function of the set of down links (which decides liveness), the
link, and the slot maps and pins of the decision points whose liveness changes; so it is kept per
(link, up, down links) together with the slot maps it started from, and a repeated event whose
decision points still hold those maps is a lookup.

Whole states (down links, live ports, slot maps, pins) also get identities: a memoised event met
again in the very state it was computed from needs no check, and its result is applied lazily
(`pending`, applied by `flush` before anything reads the state; dropped when the events lead back to
the state the tables hold, as a failure and its recovery do).
"""
from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Any, Callable

from fabric.routing.liveness import Ends, Live, Liveness
from fabric.routing.records import DecisionPoint, SlotMove

#: memoised link events kept at most (oldest dropped first)
LINK_MEMO_ENTRIES = 1 << 14
MemoKey = tuple[str, int, bool, int]  # (switch, port, up, the down links' Zobrist hash before)
SlotMaps = dict[DecisionPoint, tuple[int, ...]]


def slots_getter(keys: tuple[DecisionPoint, ...]) -> Callable[[SlotMaps], Any]:
    """A function of the slot tables giving the slot maps at `keys` (fast: `operator.itemgetter`)."""
    if not keys:
        return lambda slots: ()
    return operator.itemgetter(*keys)


@dataclass(frozen=True, slots=True)
class LinkOutcome:
    """A memoised link event (see `RoutingPolicy._link_transition`)."""

    node_before: int  # the identity of the whole state it was computed from ...
    node_after: int  # ... and of the state it led to
    down_mask: int  # the down links before (the key holds only their hash)
    mask_after: int  # and after
    changed: tuple[DecisionPoint, ...]  # (switch, dest) pairs whose live ports changed, in update order
    alive_before: tuple[Live, ...]  # their live ports before
    alive: tuple[Live, ...]  # and after
    decided: tuple[DecisionPoint, ...]  # those of them with a slot table
    slots_of: Callable[[SlotMaps], Any]  # the slot maps of those with a table
    before: Any  # what `slots_of` gave before: the event's outcome holds for these slot maps only
    moved: tuple[DecisionPoint, ...]  # decision points whose slots moved
    after: tuple[tuple[int, ...], ...]  # their slot maps after
    moves: tuple[SlotMove, ...]


class LinkMemo:
    """The memoised link events and the identities of states, over `liveness` and the slot tables
    `slot_maps` (both the policy's, updated here when a memoised event is applied)."""

    def __init__(self, liveness: Liveness, slot_maps: SlotMaps) -> None:
        self.liveness = liveness
        self.slot_maps = slot_maps
        # (link, up, down links' hash before) -> the event's outcome
        self.entries: dict[MemoKey, LinkOutcome] = {}
        self.node_ids = itertools.count(1)
        self.node = 0  # the state now
        self.materialized = 0  # the state the tables hold
        self.pending: list[LinkOutcome] = []  # the memoised events not yet applied to the tables
        self.last: LinkOutcome | None = None  # the memoised event that led to the state now

    def flush(self) -> None:
        """Apply the memoised events not yet applied to the tables."""
        live, slot_maps = self.liveness.live, self.slot_maps
        for e in self.pending:
            live.update(zip(e.changed, e.alive))
            slot_maps.update(zip(e.moved, e.after))
        if self.pending:
            self.liveness.mask = self.pending[-1].mask_after
            self.pending.clear()
        self.materialized = self.node

    def new_state(self) -> None:
        """The state changed other than by a memoised link event: a new identity."""
        self.flush()
        self.node = self.materialized = next(self.node_ids)
        self.last = None

    def follow(self, hit: LinkOutcome, link: Ends, up: bool) -> None:
        """Take memoised event `hit`, met in the very state it was computed from: no check, and
        applied when someone looks (the mask with the rest; the down set and its hash now, as
        `Liveness.set_down` would)."""
        lv = self.liveness
        (lv.down.difference_update if up else lv.down.update)(link[0])
        lv.hash ^= link[2]
        self.node = hit.node_after
        self.last = hit
        if self.node == self.materialized:
            self.pending.clear()  # back where the tables are
        else:
            self.pending.append(hit)

    def apply(self, hit: LinkOutcome, link: Ends, up: bool) -> None:
        """Apply memoised event `hit`, met in another state where it holds, at once: a new state."""
        self.liveness.set_down(link, up)
        self.liveness.live.update(zip(hit.changed, hit.alive))
        self.slot_maps.update(zip(hit.moved, hit.after))
        self.new_state()

    def store(self, key: MemoKey, last: LinkOutcome | None, node_before: int, down_mask: int,
              changed: tuple[DecisionPoint, ...], decided: tuple[DecisionPoint, ...],
              slots_of: Callable[[SlotMaps], Any], before: Any, moves: tuple[SlotMove, ...]) -> None:
        """Keep the event just computed (in the new state, `new_state` called) from the state
        `node_before` (where `last` led), with the down links `down_mask` and, at its decision points
        with a table (`decided`), the slot maps `before`: unless its moves are at decision points
        the key does not hold. A recovery that undoes `last` takes back the identity of the state
        before it."""
        moved_set = {(m.switch, m.dest) for m in moves}
        moved = tuple(k for k in decided if k in moved_set)
        if len(moved) != len(moved_set):  # the outcome read slots the key does not hold
            return
        if last is not None and last.node_after == node_before and self._undoes(last, changed, moved):
            self.node = self.materialized = last.node_before
        if len(self.entries) >= LINK_MEMO_ENTRIES:
            del self.entries[next(iter(self.entries))]
        lv = self.liveness
        entry = self.entries[key] = LinkOutcome(
            node_before, self.node, down_mask, lv.mask, changed, lv.alive_before,
            tuple(lv.live[k] for k in changed), decided, slots_of, before, moved,
            tuple(self.slot_maps[k] for k in moved), moves)
        self.last = entry

    def _undoes(self, last: LinkOutcome, changed: tuple[DecisionPoint, ...], moved: tuple[DecisionPoint, ...]) -> bool:
        """Whether the event just computed (changing live ports at `changed` and slots at `moved`)
        took the state back to where the memoised event `last`, which led to the state before it,
        started: then that state's identity is the one to keep (a failure, then its recovery)."""
        live = self.liveness.live
        return (self.liveness.mask == last.down_mask and set(changed) <= set(last.changed)
                and set(moved) <= set(last.decided)
                and tuple(live[k] for k in last.changed) == last.alive_before
                and last.slots_of(self.slot_maps) == last.before)

    def restore(self, link: Ends, changed: tuple[DecisionPoint, ...], moves: tuple[SlotMove, ...],
                alive: dict[DecisionPoint, Live], slots: SlotMaps, node: int) -> None:
        """Put back the state `node` (its live ports `alive`, its slot maps `slots`) after the
        failure of `link` (which changed live ports at `changed` and made `moves`) was taken from it."""
        self.flush()
        self.liveness.set_down(link, True)
        live = self.liveness.live
        for k in changed:
            live[k] = alive[k]
        for k in {*changed, *((m.switch, m.dest) for m in moves)} & slots.keys():
            self.slot_maps[k] = slots[k]
        self.node = self.materialized = node  # exactly the state it was
        self.last = None
