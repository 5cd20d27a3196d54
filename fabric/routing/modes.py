"""The built-in routing modes, each a `RoutingPolicy`:

- `static`: one deterministic shortest path per (switch, destination edge switch): the destination's
  index modulo the equal-cost next hops at every hop; no reaction to anything.
- `ecmp`: every flow's source port picks a slot, every slot a next hop (`fabric.routing.entropy`);
  the data plane skips a dead local port (fast-failover buckets); the policy itself never reacts.
- `adaptive`: `ecmp`, plus fabric-wide failover (a link going down removes every choice, anywhere,
  whose paths all cross it; it coming back restores them; a mesh plane's direct link going down puts
  its slots on the live two-hop detours, spread evenly, and its recovery puts them back) and
  congestion-aware moves (a hot link
  moves one of the elephants sharing it to the alternative path with the fewest elephants; see
  `AdaptivePolicy._relieve`; then that decision point and that link are left alone for `hold_s`,
  while the samples that follow confirm the move). A slot a congestion move took off its all-links-up
  port goes back to it once it is idle (below `min_move_share` of its links) and that port's
  segment is not hot: a move answers the traffic of the moment, and the all-up mapping is what a
  replay's planned source ports are chosen for, so moves do not pile up from burst to burst
  (`AdaptivePolicy._go_home`). Slots an operator pinned keep their port whenever it is alive.

Both reactions are lookups in the path table's precomputed indexes (`crossing`/`via` for liveness,
`segment`/`segments_through` for the links a slot surely crosses), not graph searches. A move
changes one slot's next hop at one switch: a flow-mod in the controller, a re-route in the simulator.
"""
from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from fabric.routing.loads import _Load
from fabric.routing.policy import DecisionPoint, DirectedLink, RoutingPolicy, SlotKey, SlotMove


class StaticPolicy(RoutingPolicy):
    name = "static"
    multipath = False


class EcmpPolicy(RoutingPolicy):
    name = "ecmp"


class AdaptivePolicy(EcmpPolicy):
    name = "adaptive"
    link_memo = True  # `_remap` reads only the decision point's live ports, slots, pins and all-up map

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hold_until: dict[DecisionPoint, float] = {}
        # hot link -> until when it is left alone after a move relieved it: the port and flow samples
        # that follow confirm the move (the link cools) or not (it stays hot: one more move then)
        self._link_hold_until: dict[DirectedLink, float] = {}
        # decision points where a congestion move took a slot off its all-links-up port
        self._away: set[DecisionPoint] = set()

    # ---- failures ------------------------------------------------------------------------------
    def react_to_link(self, link: DirectedLink, up: bool, changed: tuple[DecisionPoint, ...],
                      now: float) -> list[SlotMove]:
        cause = "recovery" if up else "failure"
        moves: list[SlotMove] = []
        remap = self._remap_fast if self.link_memo else self._remap
        for key in changed:
            if key in self._base:
                moves.extend(remap(key, cause))
        return moves

    def _remap_fast(self, key: DecisionPoint, cause: str) -> list[SlotMove]:
        """`_remap` without per-slot bookkeeping (the same result): the new slot map is computed
        whole, set at once, and one move made per slot that changed. Pinned slots: `_remap`."""
        alive = self._alive[key]
        if not alive:
            return []
        if key in self._pins:
            return self._remap(key, cause)
        current = self._slots[key]
        if alive == self.table.ecmp_ports(*key):
            new = self._base[key]
        else:
            new = _rebalance(current, alive, _NO_PINS)
        if new == current:
            return []
        self._slots[key] = new
        sw, dest = key
        return [SlotMove(sw, dest, s, old, port, cause) for s, (old, port) in enumerate(zip(current, new))
                if old != port]

    def _remap(self, key: DecisionPoint, cause: str) -> list[SlotMove]:
        """All ports alive: the all-up mapping; else keep slots on live ports and spread the others
        evenly. Pinned slots stay on their operator's port wherever it is alive."""
        alive = self._alive[key]
        current = list(self._slots[key])
        if not alive:
            return []  # unreachable from here in this plane: nothing better to do
        pins = {s: p for s, p in self._pins.get(key, {}).items() if p in alive}
        if alive == self.table.ecmp_ports(*key):
            new = list(self._base[key])
            for s, p in pins.items():
                new[s] = p
        else:
            for s, p in pins.items():
                current[s] = p
            new = list(_rebalance(tuple(current), alive, frozenset(pins)))
        return [self._set_slot(key, s, new[s], cause) for s, old in enumerate(self._slots[key]) if old != new[s]]

    # ---- congestion ----------------------------------------------------------------------------
    def react_to_loads(self, slot_rates_bps: dict[SlotKey, float], now: float) -> list[SlotMove]:
        hot = sorted(self.hot_links(), key=lambda l: -self.utilisation(l))
        moves = []
        # `elephants` by floor, while no slot has moved: a poll of a large fabric has thousands of hot links
        # and slots, and the count over all slots is the same for every hot link of one capacity
        counted: dict[float, Counter[DirectedLink]] = {}
        for link in hot:
            if self._link_hold_until.get(link, -1.0) > now:
                continue
            move = self._relieve(link, slot_rates_bps, now, counted)
            if move is not None:
                counted.clear()
                self._link_hold_until[link] = now + self.config.hold_s
                moves.append(move)
        if self._away:
            moves.extend(self._go_home(slot_rates_bps, now))
        return moves

    def _go_home(self, slot_rates: dict[SlotKey, float], now: float) -> list[SlotMove]:
        """Slots a congestion move took off their all-links-up port, now idle (below `min_move_share`
        of their home segment's slowest link), back on that port where its segment has no hot link.
        Only where every port is alive (a failure's mapping is the failure logic's) and the decision
        point is not in its hold-down; pinned slots stay, and so do newcomers (`newcomers`): a flow
        moved in its first second, whose windowed rate still holds the idle time before it, is not
        idle (read as idle, it went home onto the link it had just left, and moved away again)."""
        cfg = self.config
        hot = set(self.hot_links())
        moves: list[SlotMove] = []
        for key in sorted(self._away):
            base, slots = self._base[key], self._slots[key]
            if slots == base or self._alive.get(key) != self.table.ecmp_ports(*key):
                self._away.discard(key)  # home, or remapped by a failure or recovery
                continue
            if self._hold_until.get(key, -1.0) > now:
                continue
            pins = self._pins.get(key, {})
            sw, dest = key
            for slot, (port, home) in enumerate(zip(slots, base)):
                if port == home or slot in pins or (sw, dest, slot) in self.newcomers:
                    continue  # a newcomer's low windowed rate is its idle time before it started
                seg = self.table.segment(sw, dest, home)
                if hot.intersection(seg):
                    continue
                floor = cfg.min_move_share * min(self._capacity_bps[l] for l in seg)
                if slot_rates.get((sw, dest, slot), 0.0) < floor:
                    moves.append(self._set_slot(key, slot, home, "congestion"))
            if self._slots[key] == base:
                self._away.discard(key)
        return moves

    def elephants(self, slot_rates_bps: dict[SlotKey, float], floor_bps: float) -> Counter[DirectedLink]:
        """Directed link -> how many slots carrying at least `floor_bps` cross it now.

        A slot is counted on the links it crosses up to the next decision point (`slot_links`);
        beyond it, that decision point's own slot carries the same packets and is counted there. So
        a flow measured at every decision point on its path counts once on each link of its path."""
        count: Counter[DirectedLink] = Counter()
        for (sw, dest, slot), rate in slot_rates_bps.items():
            slots = self._slots.get((sw, dest))
            if rate >= floor_bps and slots is not None and slot < len(slots):
                count.update(self.slot_links(sw, dest, slot))
        return count

    def _relieve(self, hot: DirectedLink, slot_rates: dict[SlotKey, float], now: float,
                 counted: dict[float, Counter[DirectedLink]] | None = None) -> SlotMove | None:
        """Move one of the elephants sharing `hot` to the alternative with the fewest elephants.

        Elephants are slots carrying at least `min_move_share` of the link, counted where they
        surely are (`elephants`). One elephant alone on a link (a TCP flow fills any link) is not
        congestion a move can fix; with n on the hot link, a move is made only to an alternative
        whose busiest link has at most n - 2, so the elephants spread out and never swap back and
        forth. The elephants counted on `hot` are slots of the decision points whose segment holds
        it (the nearest decision point upstream, for each destination), so those are the ones that
        move; an alternative's links are its segment (the next decision point balances its own).
        Pinned slots stay. Among the candidates: fewest elephants, then the heaviest slot, then the
        most room."""
        cfg = self.config
        cap = self._capacity_bps
        floor = cfg.min_move_share * cap[hot]
        elephants = counted.get(floor) if counted is not None else None
        if elephants is None:
            elephants = self.elephants(slot_rates, floor)
            if counted is not None:
                counted[floor] = elephants
        n_hot = elephants[hot]
        if n_hot < 2:
            return None
        best: tuple[tuple[int, float, float], tuple[DecisionPoint, int, int]] | None = None
        for sw, dest, port in self.table.segments_through(*hot):
            key = (sw, dest)
            if key not in self._base or self._hold_until.get(key, -1.0) > now:
                continue
            slots = self._slots[key]
            if any((sw, q) in self._down for q in self.candidates(sw, dest)):
                on_port = [s for s in range(len(slots)) if self.egress(sw, dest, s) == port]
            else:
                on_port = [s for s, p in enumerate(slots) if p == port]
            pins = self._pins.get(key, {})
            heavy = [(s, r) for s in on_port if s not in pins and (r := slot_rates.get((sw, dest, s), 0.0)) >= floor]
            if not heavy:
                continue
            for alt in self._alive.get(key, ()):
                seg = self.table.segment(sw, dest, alt)
                if alt == port or hot in seg:
                    continue
                n_alt = max(elephants[l] for l in seg)
                if n_alt + 2 > n_hot:
                    continue
                room = max(self.utilisation(l) for l in seg)
                for slot, rate in heavy:
                    after = room + rate / min(cap[l] for l in seg)
                    score = (-n_alt, rate, -after)
                    if best is None or score > best[0]:
                        best = (score, (key, slot, alt))
        if best is None:
            return None
        key, slot, alt = best[1]
        old = self.slot_links(key[0], key[1], slot)
        move = self._set_slot(key, slot, alt, "congestion")
        self._hold_until[key] = now + cfg.hold_s
        self._away.add(key)
        rate = slot_rates[(key[0], key[1], slot)]
        new = self.slot_links(key[0], key[1], slot)
        for l in set(old) - set(new):
            if l in self._loads:
                self._loads[l].rate_bps = max(0.0, self._loads[l].rate_bps - rate)
        for l in set(new) - set(old):
            self._loads.setdefault(l, _Load()).rate_bps += rate
        return move


_NO_PINS: frozenset[int] = frozenset()


@functools.lru_cache(maxsize=4096)
def _rebalance(current: tuple[int, ...], alive: tuple[int, ...], fixed: frozenset[int] = frozenset()
               ) -> tuple[int, ...]:
    """Keep slots on live ports; give slots of dead ports to the least-used live ports; then even out
    so no two live ports differ by more than one slot, moving only slots not in `fixed` (pinned
    ones, which are on live ports). Deterministic, so cached: a failure puts many decision points
    (every leaf, every destination) in the same situation."""
    new: list[int | None] = [p if p in alive else None for p in current]
    count = Counter({p: 0 for p in alive})
    count.update(p for p in new if p is not None)
    for s, p in enumerate(new):
        if p is None:
            target = min(alive, key=lambda q: (count[q], q))
            new[s] = target
            count[target] += 1
    while True:
        movable = {p for i, p in enumerate(new) if i not in fixed and p is not None}
        if not movable:
            break
        hi = max(movable, key=lambda q: (count[q], -q))
        lo = min(alive, key=lambda q: (count[q], q))
        if count[hi] - count[lo] <= 1:
            break
        s = max(i for i, p in enumerate(new) if p == hi and i not in fixed)
        new[s] = lo
        count[hi] -= 1
        count[lo] += 1
    return tuple(int(p) for p in new if p is not None)


BUILTIN: dict[str, type[RoutingPolicy]] = {p.name: p for p in (StaticPolicy, EcmpPolicy, AdaptivePolicy)}
