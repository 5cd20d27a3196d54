"""The routing modes' decisions, pure: model + link states + loads + `now` in, slot moves out.

Modes:
- `static`: one deterministic shortest path per destination (destination index modulo the
  equal-cost next hops at every hop); no reaction to anything.
- `ecmp`: every flow's source port picks a slot, every slot a next hop (`fabric.routing.entropy`);
  the data plane skips a dead local port (fast-failover buckets), the router itself never reacts.
- `adaptive`: `ecmp`, plus fabric-wide failover (a link going down removes every choice, anywhere,
  whose paths all cross it; it coming back restores them) and congestion-aware moves (a hot link
  moves one of the elephants sharing it to the alternative path with the fewest elephants; see
  `_relieve`).

Both reactions are lookups in the path table's precomputed `crossing`/`via` index, not graph
searches. A move changes one slot's next hop at one switch: a flow-mod in the controller, a
re-route in the simulator.
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

from fabric.errors import FabriclabError
from fabric.model import ROLE_TIER
from fabric.routing.entropy import EntropyPlan, plan_entropy
from fabric.routing.tables import PathTable

MODES = ("static", "ecmp", "adaptive")
Link = tuple[str, int]  # directed: (switch, egress port)


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise FabriclabError(f"routing mode {mode!r} is not supported (supported: {', '.join(MODES)})")


def static_port(ports: tuple[int, ...], dest_index: int) -> int:
    """The `static` mode's choice among equal-cost next-hop ports: deterministic per destination."""
    if not ports:
        raise ValueError("no next-hop port to choose from")
    return ports[dest_index % len(ports)]


@dataclass(frozen=True)
class RouterConfig:
    hot_util: float = 0.9  # a link becomes hot at this utilisation ...
    cool_util: float = 0.7  # ... and stops being hot below this (hysteresis)
    hold_s: float = 0.2  # after a congestion move, leave that decision point alone this long
    ewma_alpha: float = 0.5  # weight of the newest rate sample
    min_move_share: float = 0.05  # slots below this share of a link are mice: not counted, not moved

    def __post_init__(self) -> None:
        if not 0 < self.cool_util < self.hot_util:
            raise FabriclabError(f"need 0 < cool_util < hot_util, got {self.cool_util}, {self.hot_util}")
        if not 0 < self.ewma_alpha <= 1 or self.hold_s < 0:
            raise FabriclabError(f"bad ewma_alpha {self.ewma_alpha} or hold_s {self.hold_s}")


@dataclass(frozen=True)
class SlotMove:
    switch: str
    dest: str  # destination edge switch
    slot: int
    old_port: int
    new_port: int
    cause: str  # "failure", "recovery", "congestion" or "manual"


@dataclass
class _Load:
    rate_bps: float = 0.0  # bytes/s, smoothed
    hot: bool = False


@dataclass
class Router:
    """Decision state for one fabric. Rates are bytes/s; capacities are scaled by `rate_scale`
    (the emulator's emulated/real ratio, 1.0 in the simulator)."""

    table: PathTable
    mode: str = "adaptive"
    config: RouterConfig = field(default_factory=RouterConfig)
    rate_scale: float = 1.0

    def __post_init__(self) -> None:
        check_mode(self.mode)
        fab = self.table.fabric
        self.entropy: EntropyPlan = plan_entropy(self.table)
        self.down: set[Link] = set()
        # (switch, dest) -> next-hop ports currently usable, for every switch with a path to dest
        self.alive: dict[tuple[str, str], tuple[int, ...]] = {}
        for dest in self.table.edge_switches:
            for switch in fab.switches_in(fab.switch_by_name[dest].plane):
                ports = self.table.ecmp_ports(switch.name, dest)
                if ports:
                    self.alive[(switch.name, dest)] = ports
        # decision point -> slot -> port; base = the default (all links up) mapping
        self.base: dict[tuple[str, str], tuple[int, ...]] = {}
        for sw, dest in self.table.decisions:
            ports = self.table.ecmp_ports(sw, dest)
            n = self.entropy.slots(self.tier(sw))
            self.base[(sw, dest)] = tuple(ports[s % len(ports)] for s in range(n))
        self.slots: dict[tuple[str, str], list[int]] = {k: list(v) for k, v in self.base.items()}
        self.loads: dict[Link, _Load] = {}
        self.hold_until: dict[tuple[str, str], float] = {}
        self.capacity_bps: dict[Link, float] = {}
        for link in fab.links:
            for end in (link.a, link.b):
                if end.node in fab.switch_by_name:
                    self.capacity_bps[(end.node, end.port)] = link.rate_gbps * 1e9 / 8 * self.rate_scale

    # ---- lookups -------------------------------------------------------------------------------
    def tier(self, switch: str) -> int:
        return ROLE_TIER[self.table.fabric.switch_by_name[switch].role]

    def is_decision(self, switch: str, dest: str) -> bool:
        return (switch, dest) in self.base

    def port_for(self, switch: str, dest: str, src_port: int) -> int:
        """The next-hop port a flow with this source port takes at `switch` towards `dest`."""
        slots = self.slots.get((switch, dest))
        if slots is None:
            ports = self.alive.get((switch, dest)) or self.table.ecmp_ports(switch, dest)
            return ports[0]
        return slots[self.entropy.slot(self.tier(switch), src_port)]

    def _rate(self, link: Link) -> float:
        load = self.loads.get(link)
        return load.rate_bps if load else 0.0

    def utilisation(self, link: Link) -> float:
        load = self.loads.get(link)
        return load.rate_bps / self.capacity_bps[link] if load else 0.0

    # ---- failures ------------------------------------------------------------------------------
    def on_link_change(self, switch: str, port: int, up: bool, now: float) -> list[SlotMove]:
        """A port went down or came up (both directions of its link change). Returns slot moves
        (`adaptive` only; `static` and `ecmp` keep their mappings)."""
        peer = self.table.peer(switch, port)
        ends = [(switch, port)]
        if peer[0] in self.table.fabric.switch_by_name:
            ends.append(peer)
        changed = [e for e in ends if (e in self.down) == up]
        if not changed:
            return []
        for e in ends:
            (self.down.discard if up else self.down.add)(e)
        # Every choice whose paths may cross the link, nearest the destination first, so that a
        # switch sees its downstream neighbours' new liveness.
        keys = {k for e in ends for k in self.table.crossing(*e)}
        dist = self.table.switch_hops
        affected: set[tuple[str, str]] = set()
        for sw, dest, port in sorted(keys, key=lambda k: (dist(k[0], k[1]) or 0, k)):
            alive = self.alive[(sw, dest)]
            now_alive = self._port_alive(sw, dest, port)
            if now_alive != (port in alive):
                ports = set(alive) ^ {port}
                self.alive[(sw, dest)] = tuple(p for p in self.table.ecmp_ports(sw, dest) if p in ports)
                affected.add((sw, dest))
        # Liveness can also change upstream of a switch that lost all its ports: those upstream
        # choices are in `crossing` too (their `via` contains the link), so one pass suffices.
        if self.mode != "adaptive":
            return []
        moves: list[SlotMove] = []
        cause = "recovery" if up else "failure"
        for key in sorted(affected):
            if key in self.base:
                moves.extend(self._remap(key, cause))
        return moves

    def _port_alive(self, sw: str, dest: str, port: int) -> bool:
        if (sw, port) in self.down:
            return False
        nxt = self.table.peer(sw, port)[0]
        return nxt == dest or bool(self.alive.get((nxt, dest)))

    def _remap(self, key: tuple[str, str], cause: str) -> list[SlotMove]:
        alive = self.alive[key]
        current = self.slots[key]
        if not alive:
            return []  # unreachable from here in this plane: nothing better to do
        if len(alive) == len(self.table.ecmp_ports(*key)):
            new = list(self.base[key])
        else:
            new = list(_rebalance(tuple(current), alive))
        moves = [SlotMove(key[0], key[1], s, old, new[s], cause) for s, old in enumerate(current) if old != new[s]]
        self.slots[key] = new
        return moves

    # ---- operator moves ------------------------------------------------------------------------
    def move(self, switch: str, dest: str, slot: int, port: int) -> SlotMove | None:
        """Put one slot on a chosen live next hop (e.g. to drain a link before maintenance). Any mode
        but `static`; a later failure, recovery or congestion decision may move it again."""
        key = (switch, dest)
        if key not in self.base:
            raise FabriclabError(f"{switch} has no ECMP choice towards {dest} in mode {self.mode!r}")
        slots = self.slots[key]
        if not 0 <= slot < len(slots):
            raise FabriclabError(f"slot {slot} out of range 0..{len(slots) - 1} at {switch}")
        if port not in self.alive.get(key, ()):
            raise FabriclabError(f"port {port} of {switch} is not a live next hop towards {dest} "
                                 f"(live: {list(self.alive.get(key, ()))})")
        if slots[slot] == port:
            return None
        move = SlotMove(switch, dest, slot, slots[slot], port, "manual")
        slots[slot] = port
        return move

    # ---- congestion ----------------------------------------------------------------------------
    def observe(
        self,
        port_rates_bps: dict[Link, float],
        slot_rates_bps: dict[tuple[str, str, int], float],
        now: float,
    ) -> list[SlotMove]:
        """Fold in measured egress rates per directed link and per slot; return congestion moves
        (`adaptive` only)."""
        cfg = self.config
        for link, rate in port_rates_bps.items():
            if link not in self.capacity_bps:
                continue
            load = self.loads.setdefault(link, _Load(rate))
            load.rate_bps += cfg.ewma_alpha * (rate - load.rate_bps)
            util = load.rate_bps / self.capacity_bps[link]
            if load.hot and util < cfg.cool_util:
                load.hot = False
            elif not load.hot and util >= cfg.hot_util:
                load.hot = True
        if self.mode != "adaptive":
            return []
        hot = sorted((l for l, ld in self.loads.items() if ld.hot), key=lambda l: -self.utilisation(l))
        moves = []
        for link in hot:
            move = self._relieve(link, slot_rates_bps, now)
            if move is not None:
                moves.append(move)
        return moves

    def _elephants(self, slot_rates: dict[tuple[str, str, int], float], floor_bps: float) -> Counter[Link]:
        """Directed link -> how many slots carrying at least `floor_bps` may send over it."""
        count: Counter[Link] = Counter()
        for (sw, dest, slot), rate in slot_rates.items():
            slots = self.slots.get((sw, dest))
            if rate >= floor_bps and slots is not None and slot < len(slots):
                count.update(self.table.via(sw, dest, slots[slot]))
        return count

    def _relieve(self, hot: Link, slot_rates: dict[tuple[str, str, int], float], now: float) -> SlotMove | None:
        """Move one of the elephants sharing `hot` to the alternative with the fewest elephants.

        Elephants are slots carrying at least `min_move_share` of the link. One elephant alone on a
        link (a TCP flow fills any link) is not congestion a move can fix; with n on the hot link, a
        move is made only to an alternative path whose busiest link has at most n - 2, so the
        elephants spread out and never swap back and forth. Among those: fewest elephants, then the
        heaviest slot, then the most room."""
        cfg = self.config
        floor = cfg.min_move_share * self.capacity_bps[hot]
        elephants = self._elephants(slot_rates, floor)
        n_hot = elephants[hot]
        if n_hot < 2:
            return None
        best: tuple[tuple[int, float, float], SlotMove] | None = None
        for sw, dest, port in self.table.crossing(*hot):
            key = (sw, dest)
            if key not in self.base or self.hold_until.get(key, -1.0) > now:
                continue
            heavy = [(slot, slot_rates.get((sw, dest, slot), 0.0)) for slot, p in enumerate(self.slots[key])
                     if p == port and slot_rates.get((sw, dest, slot), 0.0) >= floor]
            if not heavy:
                continue
            for alt in self.alive.get(key, ()):
                via = self.table.via(sw, dest, alt)
                if alt == port or hot in via:
                    continue
                n_alt = max(elephants[l] for l in via)
                if n_alt + 2 > n_hot:
                    continue
                room = max(self._rate(l) / self.capacity_bps[l] for l in via)
                for slot, rate in heavy:
                    after = room + rate / min(self.capacity_bps[l] for l in via)
                    score = (-n_alt, rate, -after)
                    if best is None or score > best[0]:
                        best = (score, SlotMove(sw, dest, slot, port, alt, "congestion"))
        if best is None:
            return None
        move = best[1]
        self.slots[(move.switch, move.dest)][move.slot] = move.new_port
        self.hold_until[(move.switch, move.dest)] = now + cfg.hold_s
        rate = slot_rates[(move.switch, move.dest, move.slot)]
        old_via = self.table.via(move.switch, move.dest, move.old_port)
        new_via = self.table.via(move.switch, move.dest, move.new_port)
        for l in old_via - new_via:
            if l in self.loads:
                self.loads[l].rate_bps = max(0.0, self.loads[l].rate_bps - rate)
        for l in new_via - old_via:
            self.loads.setdefault(l, _Load()).rate_bps += rate
        return move


@functools.lru_cache(maxsize=4096)
def _rebalance(current: tuple[int, ...], alive: tuple[int, ...]) -> tuple[int, ...]:
    """Keep slots on live ports; give slots of dead ports to the least-used live ports; then even out
    so no two live ports differ by more than one slot. Deterministic, so cached: a failure puts many
    decision points (every leaf, every destination) in the same situation."""
    new: list[int | None] = [p if p in alive else None for p in current]
    count = Counter({p: 0 for p in alive})
    count.update(p for p in new if p is not None)
    for s, p in enumerate(new):
        if p is None:
            target = min(alive, key=lambda q: (count[q], q))
            new[s] = target
            count[target] += 1
    while True:
        hi = max(alive, key=lambda q: (count[q], -q))
        lo = min(alive, key=lambda q: (count[q], q))
        if count[hi] - count[lo] <= 1:
            break
        s = max(i for i, p in enumerate(new) if p == hi)
        new[s] = lo
        count[hi] -= 1
        count[lo] += 1
    return tuple(int(p) for p in new if p is not None)
