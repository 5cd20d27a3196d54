"""The routing policy interface: one class per routing mode, the researcher's extension point.

A policy decides, for every switch, destination edge switch and entropy slot, which port a packet
leaves by (`port`), and so the whole path of a flow (`path`: source NIC, destination NIC, source
port). The controller turns its decisions into OpenFlow; the simulator applies them directly. Inputs
are the model (through the path table), link states, measured loads and `now`; outputs are slot
moves. A policy never does I/O.

The base class keeps what every policy needs and exposes it read-only: liveness of every directed
link and of every equal-cost choice (`fabric.routing.liveness`), smoothed loads with hot/cool
hysteresis (`fabric.routing.loads`), the slot tables at the decision points, the operator's pinned
slots (`fabric.routing.pins`), and the log of routing events (`fabric.routing.eventlog`); it holds
one of each and answers the queries. Subclasses react by overriding `react_to_link`,
`react_to_loads` and `react_to_release`, changing slots only through `_set_slot`. Built-in modes are
in `fabric.routing.modes`; `fabric.routing.registry.load_policy("mypkg.module:MyPolicy")` loads a
researcher's own.

Link reactions are memoised (`link_memo`; `fabric.routing.memo`): the outcome of a link event is a
function of the set of down links (which decides liveness), the link, and the slot maps and pins of
the decision points whose liveness changes; so it is kept per (link, up, down links) together with
the slot maps it started from, and a repeated event whose decision points still hold those maps is a
lookup. A subclass that overrides the reaction gets the reference computation unless it declares
`link_memo = True` itself (its reaction must then read nothing but liveness, slots, pins and the
all-up mapping of the decision points it is given). `precompute_failures` warms the memo with every
single-link failure from the current state.

Two-hop detours (`PathTable.detour_ports`; a mesh plane's other leaves) are backups: a decision
point's live ports (`alive`) are its live equal-cost ports, and only where none is left its live
detours (a detour is live when both its links are up), so slots go over a detour only while the
direct link is down, spread over the live detours by slot as ECMP spreads them over ports, and come
back when it recovers. The detour switch forwards a detoured packet by its direct link, never on
(`path`; the controller matches such packets by their in-port), so no path loops. The data plane's
fast-failover order (`failover_order`) rotates the detours by slot, so even before the policy
reacts (or under `ecmp`, which never does) a failed direct link's slots spread over the detours.

An operator's move (`move`) pins the slot: whatever a policy's reaction does, the base class puts a
pinned slot back on the operator's port whenever that port is alive (a failure may move it off for
as long as the port's paths are dead; the recovery brings it back), until the operator releases it
(`release`).
"""
from __future__ import annotations

import time
from typing import ClassVar, Iterable, Iterator

from fabric.errors import RoutingError
from fabric.model import ROLE_TIER
from fabric.routing.entropy import plan_entropy
from fabric.routing.eventlog import EventLog
from fabric.routing.liveness import Ends, Liveness
from fabric.routing.loads import LinkLoads
from fabric.routing.memo import LINK_MEMO_ENTRIES, LinkMemo, slots_getter
from fabric.routing.pins import Pins
from fabric.routing.queries import PolicyQueries
from fabric.routing.records import (
    CAUSES,
    DecisionPoint,
    DirectedLink,
    LinkState,
    RouteEvent,
    RouterConfig,
    SlotKey,
    SlotMove,
)
from fabric.routing.tables import PathTable

__all__ = ["CAUSES", "LINK_MEMO_ENTRIES", "DecisionPoint", "DirectedLink", "LinkState", "RouteEvent",
           "RouterConfig", "RoutingPolicy", "SlotKey", "SlotMove"]

#: methods whose override makes a subclass's link reaction its own (see `RoutingPolicy.link_memo`)
_REACTION_METHODS = ("on_link_change", "react_to_link", "initial_port", "_keep_pins", "_set_slot",
                     "_port_alive", "_live_tier", "_update_liveness", "_remap")


class RoutingPolicy(PolicyQueries):
    """Base of every routing mode. `capacity_scale` maps model rates onto the measured ones (the
    emulator's emulated/real ratio; 1.0 in the simulator). Rates are bits per second."""

    #: the name `--routing` knows it by (built-ins: static, ecmp, adaptive)
    name: ClassVar[str] = "policy"
    #: True: a flow's slot (source port) may choose among equal-cost ports at decision points, and
    #: the data plane keeps a slot table there; False: one port per (switch, destination).
    multipath: ClassVar[bool] = True
    #: True: link reactions are memoised (module docstring); False: always the reference computation
    link_memo: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "link_memo" not in cls.__dict__ and any(m in cls.__dict__ for m in _REACTION_METHODS):
            cls.link_memo = False  # its own reaction may read state the memo's key does not hold

    def __init__(self, table: PathTable, config: RouterConfig | None = None, *, capacity_scale: float = 1.0,
                 event_log_size: int = 10000) -> None:
        if not capacity_scale > 0:
            raise RoutingError(f"capacity_scale must be > 0, got {capacity_scale}")
        self.table = table
        self.config = config or RouterConfig()
        #: the slots of the last `on_loads` that just started sending (its `newcomers_bytes`, at least
        #: `min_newcomer_bytes` each): their measured rates are diluted by the idle time before them
        self.newcomers: frozenset[SlotKey] = frozenset()
        self.capacity_scale = capacity_scale
        self.entropy = plan_entropy(table)
        fab = table.fabric
        self._tier = {s.name: ROLE_TIER[s.role] for s in fab.switches}
        self._edge_index = {d: i for i, d in enumerate(table.edge_switches)}
        self._capacity_bps = {}
        for link in fab.links:
            for end in (link.a, link.b):
                if end.node in fab.switch_by_name:
                    self._capacity_bps[(end.node, end.port)] = link.rate_gbps * 1e9 * capacity_scale
        # The parts. Their containers that subclasses and the hot queries read are also held here,
        # as the same objects (never rebound): the down links, the live ports (read it as `_alive`),
        # the memo's pending events, the smoothed loads.
        self._liveness = lv = Liveness(table, self._capacity_bps)
        self._down = lv.down
        self._live = lv.live
        # decision point -> slot -> port; `_base` is the all-links-up mapping (slot maps are tuples,
        # replaced on change, and equal maps are one object: memo keys and memoised results share them)
        self._base = {}
        if self.multipath:
            _all_links_up(self, self._base)
        self._slot_maps = dict(self._base)  # read it as `_slots`
        self._pins = Pins()  # decision point -> slot -> the port an operator put it on (until released)
        self._load_state = LinkLoads(self._capacity_bps)
        self._loads = self._load_state.rates
        self._events = EventLog(maxlen=event_log_size)
        self._memo = LinkMemo(lv, self._slot_maps)
        self._pending = self._memo.pending

    def _new_state(self) -> None:
        """The state changed other than by a memoised link event: a new identity."""
        self._memo.new_state()

    # ---- hooks for subclasses ------------------------------------------------------------------
    def initial_port(self, switch: str, dest: str, slot: int, ports: tuple[int, ...]) -> int:
        """The port of `slot` at a decision point with all links up (default: the slot mod k-th)."""
        return ports[slot % len(ports)]

    def react_to_link(self, link: DirectedLink, up: bool, changed: tuple[DecisionPoint, ...],
                      now: float) -> list[SlotMove]:
        """Called after a link changed state and liveness was updated (`changed`: the decision
        points whose set of live ports changed). Default: no reaction."""
        return []

    @property
    def reacts_to_links(self) -> bool:
        """Whether this policy moves slots when links go down or up (it overrides `react_to_link`)."""
        return type(self).react_to_link is not RoutingPolicy.react_to_link

    def react_to_loads(self, slot_rates_bps: dict[SlotKey, float], now: float) -> list[SlotMove]:
        """Called after new loads were folded in (`hot_links()` says which are hot). Default: none."""
        return []

    def react_to_release(self, key: DecisionPoint, slots: tuple[int, ...], now: float) -> list[SlotMove]:
        """Called after the operator released pinned `slots` at decision point `key`: place them as
        the policy would. Default: back on their all-links-up port where it is alive."""
        alive = self._alive.get(key, ())
        return [self._set_slot(key, s, self._base[key][s], "manual") for s in slots
                if self._slots[key][s] != self._base[key][s] and self._base[key][s] in alive]

    # ---- inputs --------------------------------------------------------------------------------
    def on_link_change(self, switch: str, port: int, up: bool, now: float,
                       trigger: str | None = None) -> tuple[SlotMove, ...]:
        """A port went down or came up (both directions of its link change). Returns slot moves.
        `trigger` words the event in the log (default "switch:port down|up"; the controller's gray
        failure detection takes a link that loses packets out of service through here too)."""
        started = time.perf_counter()
        link = self._liveness.ends.get((switch, port)) or self._link_ends(switch, port)
        ends, down = link[0], self._down
        if (ends[0] in down) != up and (len(ends) == 1 or (ends[1] in down) != up):
            return ()  # already so at both ends
        moves = self._link_transition(switch, port, link, up, now)[1]
        if moves:
            self._events.append((now, "recovery" if up else "failure", trigger or (switch, port, up), moves,
                                 (time.perf_counter() - started) * 1e6))
        return moves

    def _link_ends(self, switch: str, port: int) -> Ends:
        """Both directed links of the link at `switch`'s `port` (one for a host link), their bits
        and the xor of their numbers."""
        return self._liveness.link_ends(switch, port)

    def _link_transition(self, switch: str, port: int, link: Ends, up: bool,
                         now: float) -> tuple[tuple[DecisionPoint, ...], tuple[SlotMove, ...]]:
        """Liveness and the reaction to a link event: the decision points whose liveness changed and
        the moves. From the memo where the event was seen before with the same slot maps there."""
        memo, lv = self._memo, self._liveness
        memo_key = (switch, port, up, lv.hash)
        if self.link_memo:
            hit = memo.entries.get(memo_key)
            if hit is not None and hit.node_before == memo.node:
                memo.follow(hit, link, up)  # the very state it was computed from: applied when someone looks
                return hit.changed, hit.moves
            slots = self._slots  # (applies what is pending)
            if hit is not None and hit.down_mask == lv.mask and hit.slots_of(slots) == hit.before and \
                    (not self._pins or self._pins.keys().isdisjoint(hit.changed)):
                memo.apply(hit, link, up)
                return hit.changed, hit.moves
        slots = self._slots
        node_before, down_mask = memo.node, lv.mask
        changed = self._update_liveness(switch, port, link, up)
        decided = tuple(k for k in changed if k in slots)
        slots_of = slots_getter(decided)
        before = slots_of(slots)
        cause = "recovery" if up else "failure"
        moves = tuple(self._keep_pins(self.react_to_link((switch, port), up, tuple(sorted(changed)), now),
                                      changed, cause))
        last = memo.last
        self._new_state()
        if self.link_memo and (not self._pins or self._pins.keys().isdisjoint(changed)):
            memo.store(memo_key, last, node_before, down_mask, changed, decided, slots_of, before, moves)
        return changed, moves

    def _update_liveness(self, switch: str, port: int, link: Ends, up: bool) -> tuple[DecisionPoint, ...]:
        """Mark the link's ends down or up and update the live ports of every choice whose paths
        may cross it. Returns the decision points whose set of live ports changed."""
        self._liveness.set_down(link, up)
        if self._pending:
            self._flush()
        return self._liveness.update(switch, port, link, self._port_alive, self._live_tier)

    def precompute_failures(self, links: Iterable[DirectedLink] | None = None,
                            budget_s: float | None = None) -> Iterator[tuple[SlotMove, ...]]:
        """Warm the link memo: the failure of every switch-to-switch link (or of `links`), each from
        the current state, which is put back after each; no event is recorded. Yields each
        failure's moves (the controller prepares its messages for them). Stops after `budget_s`
        seconds if given; does nothing unless `link_memo`."""
        if not self.link_memo:
            return
        deadline = None if budget_s is None else time.perf_counter() + budget_s
        fab = self.table.fabric
        todo = links if links is not None else [
            (l.a.node, l.a.port) for l in fab.links if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name]
        alive = dict(self._alive)
        slots = dict(self._slots)
        node = self._memo.node
        for switch, port in todo:
            if deadline is not None and time.perf_counter() > deadline:
                return
            link = self._link_ends(switch, port)
            if self._down_mask & link[1]:
                continue
            changed, moves = self._link_transition(switch, port, link, False, 0.0)
            self._memo.restore(link, changed, moves, alive, slots, node)
            yield moves

    def on_loads(self, port_rates_bps: dict[DirectedLink, float], slot_rates_bps: dict[SlotKey, float],
                 now: float, newcomers_bytes: dict[SlotKey, int] | None = None,
                 newcomers_span_s: dict[SlotKey, float] | None = None) -> list[SlotMove]:
        """Fold in measured egress rates per directed link (bits/s) and per slot; return moves.
        Slots that just started (`newcomers_bytes`, sent over `newcomers_span_s`) get presumed rates
        on the links hot after this sample (`presume_newcomers`)."""
        started = time.perf_counter()
        cfg = self.config
        self._load_state.fold(port_rates_bps, cfg)
        floor = max(1, cfg.min_newcomer_bytes)
        # slots whose windowed rate does not cover their activity yet: never read as idle
        self.newcomers = frozenset(k for k, n in (newcomers_bytes or {}).items() if n >= floor)
        if newcomers_bytes:
            slot_rates_bps = self.presume_newcomers(slot_rates_bps, newcomers_bytes, newcomers_span_s)
        moves = self._keep_pins(self.react_to_loads(slot_rates_bps, now), (), "congestion")
        if moves:
            self._new_state()
            hot = ", ".join(f"{s}:{p}" for s, p in self.hot_links())
            home = sum(1 for m in moves if self._base.get((m.switch, m.dest), ())[m.slot:m.slot + 1] == (m.new_port,))
            detail = "; ".join(([f"hot {hot}"] if hot else [])
                               + ([f"{home} idle slot(s) back on their all-links-up port"] if home else []))
            self._record(now, "congestion", detail, moves, started)
        return moves

    def presume_newcomers(self, slot_rates_bps: dict[SlotKey, float], newcomers_bytes: dict[SlotKey, int],
                          newcomers_span_s: dict[SlotKey, float] | None = None) -> dict[SlotKey, float]:
        """`slot_rates_bps` with a presumed rate for each slot that has just started sending
        (`newcomers_bytes`: slot -> bytes counted since it started, at least `min_newcomer_bytes`),
        whose rate over a full flow-counter window is not known yet, on the hot links it crosses:
        its fair share there next to the elephants already known (`LinkLoads.presume` says how)."""
        hot = set(self.hot_links())
        if not newcomers_bytes or not hot:
            return slot_rates_bps
        return self._load_state.presume(slot_rates_bps, newcomers_bytes, newcomers_span_s, hot, self._slots,
                                        self.slot_links, self.rate_bps, self.config)

    def forget_loads(self) -> None:
        """Drop the smoothed loads and hot flags (as a freshly started controller has none)."""
        self._loads.clear()

    def move(self, switch: str, dest: str, slot: int, port: int, now: float) -> SlotMove | None:
        """An operator puts one slot on a chosen live next hop (e.g. to drain a link) and pins it
        there: it stays, through other failures, recoveries and congestion, until `release`d; if
        the port's paths die, the policy moves it off, and back when they come back."""
        started = time.perf_counter()
        key = self._slot_key(switch, dest, slot)
        if port not in self._alive.get(key, ()):
            raise RoutingError(f"port {port} of {switch} is not a live next hop towards {dest} "
                               f"(live: {list(self._alive.get(key, ()))})")
        self._pins.pin(key, slot, port)
        self._new_state()
        if self._slots[key][slot] == port:
            return None
        move = self._set_slot(key, slot, port, "manual")
        self._record(now, "manual", "operator", [move], started)
        return move

    def release(self, switch: str, dest: str, slot: int | None, now: float) -> list[SlotMove]:
        """The operator gives pinned `slot` (None: every pinned slot) at `switch` towards `dest` back
        to the policy, which places it again (`react_to_release`). Returns the moves."""
        started = time.perf_counter()
        key = self._slot_key(switch, dest, 0 if slot is None else slot)
        released = self._pins.unpin(key, slot)
        moves = self._keep_pins(self.react_to_release(key, released, now), (key,), "manual")
        self._new_state()
        self._record(now, "manual", "operator release", moves, started)
        return moves

    def _slot_key(self, switch: str, dest: str, slot: int) -> DecisionPoint:
        key = (switch, dest)
        if key not in self._slots:
            raise RoutingError(f"{switch} has no ECMP choice towards {dest} under routing {self.name!r}")
        n = len(self._slots[key])
        if not 0 <= slot < n:
            raise RoutingError(f"slot {slot} out of range 0..{n - 1} at {switch}")
        return key

    # ---- for subclasses ------------------------------------------------------------------------
    def _set_slot(self, key: DecisionPoint, slot: int, port: int, cause: str) -> SlotMove:
        if cause not in CAUSES:
            raise RoutingError(f"cause {cause!r} is not one of {CAUSES}")
        if port not in self.table.route_ports(*key):
            raise RoutingError(f"port {port} of {key[0]} is not a next hop (equal-cost or detour) towards {key[1]}")
        slots = self._slots[key]
        move = SlotMove(key[0], key[1], slot, slots[slot], port, cause)
        self._slots[key] = slots[:slot] + (port,) + slots[slot + 1:]
        return move

    def _keep_pins(self, moves: list[SlotMove], keys: Iterable[DecisionPoint], cause: str) -> list[SlotMove]:
        """Put every pinned slot at `keys` and at the moves' decision points back on its operator's
        port where that port is alive; then one move per slot, none for a slot that ended where it
        began."""
        if not self._pins:
            return moves
        return self._pins.keep(moves, keys, cause, self._slots, self._alive, self._set_slot)

    def _port_alive(self, sw: str, dest: str, port: int) -> bool:
        """Whether equal-cost port `port` of `sw` still leads to `dest`."""
        if (sw, port) in self._down:
            return False
        nxt = self.table.peer(sw, port)[0]
        return nxt == dest or bool(self._alive.get((nxt, dest)))

    def _live_tier(self, sw: str, dest: str) -> tuple[int, ...]:
        """The live ports of a decision point with detours: its live equal-cost ports, or where none
        is left, its detours whose both links are up."""
        table = self.table
        live = tuple(p for p in table.ecmp_ports(sw, dest) if self._port_alive(sw, dest, p))
        if not live:
            down = self._down
            live = tuple(p for p in table.detour_ports(sw, dest)
                         if (sw, p) not in down and table.detour_hop(sw, dest, p) not in down)
        return self._liveness.same_alive.setdefault(live, live)

    def _record(self, now: float, cause: str, trigger: str, moves: Iterable[SlotMove], started: float) -> None:
        self._events.record(now, cause, trigger, moves, started)


def _all_links_up(policy: RoutingPolicy, out: dict[DecisionPoint, tuple[int, ...]]) -> None:
    """Fill `out` with the slot maps of `policy`'s decision points with all links up
    (`initial_port`), equal maps one object."""
    table = policy.table
    same: dict[tuple[int, ...], tuple[int, ...]] = {}
    # the default placement depends on the ports and the slot count only: one map per pair
    by_ports: dict[tuple[tuple[int, ...], int], tuple[int, ...]] | None = \
        {} if type(policy).initial_port is RoutingPolicy.initial_port else None
    for sw, dest in table.decisions:
        ports = table.ecmp_ports(sw, dest)
        n = policy.entropy.slots(policy._tier[sw])
        found = by_ports.get((ports, n)) if by_ports is not None else None
        if found is None:
            base = tuple(policy.initial_port(sw, dest, s, ports) for s in range(n))
            found = same.setdefault(base, base)
            if by_ports is not None:
                by_ports[(ports, n)] = found
        out[(sw, dest)] = found
