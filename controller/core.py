"""The controller's pure core: model + routing state + `now` in, OpenFlow intents out.

Pipeline installed on every switch (proactive; no flooding, no MAC learning, no table-miss entry):

- table 0, one entry per destination NIC address in the switch's plane, for IPv4 (`ipv4_dst`) and
  ARP (`arp_tpa`):
  - the destination's own edge switch outputs to the host port;
  - where there is one shortest next hop (or in `static` mode: the one deterministic choice),
    output to it;
  - at an ECMP decision point (`ecmp`/`adaptive`), IPv4 writes the destination edge switch's id
    into `metadata` and continues in table 1 (ARP too).
- table 1 (decision points only): per destination edge switch and slot, TCP and UDP flows matching
  the slot's source-port bits (`fabric.routing.entropy`) go to a fast-failover group whose first
  bucket is the slot's next hop and whose other buckets are the remaining candidates (equal-cost
  ports, then two-hop detours; `RoutingPolicy.failover_order`), each bucket watching its port (a
  dead local port is skipped in the data plane). Everything else towards that destination (ICMP,
  ARP) follows slot 0. Above them, where a switch is a two-hop detour for others (a mesh plane's
  leaves, `PathTable.transit_ports`): packets towards the destination that come in from a switch
  whose detour it is leave by the direct link to the destination, whatever their slot, so a
  detoured packet is never detoured again (no loop, whatever the switch's own slots say).
- table 2 (decision points only): one flow no packet reaches (nothing goes to table 2), the *nudge*
  (`nudge_flow`). OVS copies its datapath's flow counters into the OpenFlow flows only when its
  revalidators run: every 500 ms (OVS 3.1 has this fixed; later versions read
  `other_config:max-revalidator`), or at once after any change to a flow table. Adding the nudge again
  is such a change, so a flow-statistics request sent shortly after it reads counters milliseconds old
  (`controller.sync.PollConfig.nudge_lead_s`).

Above everything in table 0, one flow per switch-to-switch in-port drops the gray-failure probes
(`controller.gray`) and counts them, when probing is on.

Moves from the routing policy (`fabric.routing.RoutingPolicy`) become changes to table-1 flows
(`modify`, which keeps the flow's counters and loses no packet). A link event the policy answers
from its memo returns the same tuple of moves each time, and its changes are built once for it
(`precompute_failures` prepares every single link failure at start). The core owns the counters and the
rates computed from them (bits per second), which it hands to the policy; decisions, link states
and the event log are the policy's. Congestion is decided at every port sample (port rates over
>= `port_window_s`), on the last known slot rates (over >= `flow_window_s`) and presumed rates for
slots that just started (`newcomers`); a link turning hot asks its relievers for flow statistics at
once (`urgent_flow_dpids`), and their reply is decided on at once (`on_slot_rates`).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable, NamedTuple, Sequence

from controller.flowtable import FlowTable
from controller.gray import GrayChange, GrayConfig, GrayWatch
from controller.intents import CHANGES_MEMO_ENTRIES, TABLE_ECMP, Changes, FlowIntent, GroupIntent
from fabric.analysis import cover_switches
from fabric.errors import RoutingError
from fabric.model import Fabric
from fabric.routing import PathTable, RouterConfig, RoutingPolicy, SlotMove, load_policy


class CounterRates:
    """Rates (per second) from monotonically increasing counters, per key, each over a window of at
    least `min_window_s` (OVS refreshes flow counters of its userspace datapath only every few
    hundred ms, so rates over shorter spans of flow counters are noise)."""

    def __init__(self, min_window_s: float = 0.0) -> None:
        self.min_window_s = min_window_s
        self._hist: dict[object, deque[tuple[float, float]]] = {}

    def update(self, key: object, value: float, now: float) -> float | None:
        hist = self._hist.setdefault(key, deque())
        if hist and value < hist[-1][0]:
            hist.clear()  # the counter was reset: start over
        if hist and now <= hist[-1][1]:
            return None  # no time has passed on the switch's clock (OVS caches its clock per loop)
        hist.append((value, now))
        # keep the newest sample that is at least min_window_s old, and everything after it
        while len(hist) > 2 and now - hist[1][1] >= self.min_window_s:
            hist.popleft()
        old_value, old_t = hist[0]
        if len(hist) < 2 or now - old_t < self.min_window_s or now <= old_t:
            return None
        return (value - old_value) / (now - old_t)


class _Newcomer(NamedTuple):
    """A slot that started sending while its windowed rate was 0 (`ControllerCore.newcomers`)."""
    first_s: float  # the reading that first showed it sending
    sent_bytes: int  # bytes since
    since_s: float  # the reading before that one: it started after this
    last_s: float  # the latest reading of its counters


class ControllerCore:
    """The desired switch state and the reactions to events, for one fabric and one routing policy.

    `routing` is a built-in mode name, a `package.module:Class` spec or a RoutingPolicy subclass."""

    def __init__(self, fabric: Fabric, routing: str | type[RoutingPolicy] = "adaptive",
                 config: RouterConfig | None = None, *, rate_scale: float = 1.0, flow_window_s: float = 0.0,
                 port_window_s: float = 0.02, event_log_size: int = 10000,
                 gray: GrayConfig | None = None, warm_nudge: bool = True) -> None:
        self.fabric = fabric
        self.table = PathTable(fabric)
        cls = load_policy(routing) if isinstance(routing, str) else routing
        self.policy: RoutingPolicy = cls(self.table, config, capacity_scale=rate_scale,
                                         event_log_size=event_log_size)
        self._peer_port = {(sw, port): self.table.peer(sw, port) for sw, port in self.policy.directed_links()}
        # gray failures: every switch-to-switch link probed (`controller.gray`); a link that is gray
        # in either direction is out of service for a policy that reacts to links, whatever its
        # carrier says, and back when both directions have healed and both ports are up
        self.gray = GrayWatch({l: p for l, p in self._peer_port.items() if p[0] in fabric.switch_by_name},
                              gray or GrayConfig())
        self.flowtable = FlowTable(fabric, self.table, self.policy, self.gray)
        self.dest_id, self.dest_by_id = self.flowtable.dest_id, self.flowtable.dest_by_id
        self._decision_dests = self.flowtable.decision_dests
        #: datapaths with decision points: the only ones whose flow statistics mean anything
        self.decision_dpids = frozenset(self.dpid(sw) for sw in self._decision_dests)
        #: datapaths whose port statistics are polled: a set of switches that sees every link at one
        #: end at least (a link's far direction is its near end's rx), so fewer requests load the
        #: userspace datapath and the controller (polling every switch every 10 ms cost both ~30% of a core)
        self.port_poll_dpids = frozenset(self.dpid(sw) for sw in cover_switches(fabric))
        self._relievers_of: dict[tuple[str, int], frozenset[int]] = {}
        # id of a memoised tuple of moves (the policy returns the same tuple for a repeated link
        # event) -> that tuple (kept, so the id stays its own) and its changes
        self._changes_of: dict[int, tuple[tuple[SlotMove, ...], tuple[Changes, ...]]] = {}
        # port counters are fresh at every poll: rates over >= 2 polls (10 ms each by default) ride
        # out a stall of the userspace datapath; flow counters need long windows (`CounterRates`)
        self.port_rates = CounterRates(min_window_s=port_window_s)
        self.slot_rates = CounterRates(min_window_s=flow_window_s)
        #: datapaths to ask for flow statistics at once (not at the next `hot_flow_poll_s`): the
        #: relievers of a link that has just turned hot, so slots that started too recently for a
        #: windowed rate are seen in the reply, and the decision is made on it
        self.urgent_flow_dpids: set[int] = set()
        #: datapath -> when a link it could relieve last turned hot: it is polled fast for a while
        #: (`PollConfig.fast_flow_s`), as OVS refreshes the flow counters of its userspace datapath
        #: only every ~0.5 s, so the reply at once may not show the slots that just started yet
        self.turned_hot_s: dict[int, float] = {}
        #: datapaths to nudge now (`nudge_flow`), ahead of an urgent request: the relievers of a link
        #: that has just turned *warm* (utilisation at or above the cool threshold, not hot yet), so
        #: the counters are fresh by the time it turns hot and the urgent request need not wait for
        #: its own nudge's lead (`warm_nudge`; `PollConfig.nudge_valid_s`)
        self.nudge_dpids: set[int] = set()
        self.warm_nudge = warm_nudge
        self._warm: set[tuple[str, int]] = set()
        # (switch, flow key) -> its last byte count and when it was read
        self._flow_seen: dict[tuple[str, object], tuple[int, float]] = {}
        # slots that started sending while their windowed rate was 0
        self._newcomers: dict[tuple[str, str, int], _Newcomer] = {}
        self.decision_observers: list[Callable[[float], None]] = []
        self.port_bytes: dict[tuple[str, int], tuple[int, int]] = {}  # (switch, port) -> (tx, rx) bytes
        self.gray_log: deque[GrayChange] = deque(maxlen=event_log_size)
        self._port_down: set[tuple[str, int]] = set()
        #: port state changes as they reached the controller: (time_s, switch, port, up)
        self.port_log: deque[tuple[float, str, int, bool]] = deque(maxlen=event_log_size)
        #: the congestion detector's steps, for a timeline: (time_s, step, switch, port or None), the
        #: steps being a link turning `warm` or `hot` (switch, port: its sending end), and per switch a
        #: `nudge` sent, a flow-statistics `request` (`urgent_request` when a hot link waits on it) and
        #: its `reply` complete; the moves themselves are in `events`
        self.congestion_log: deque[tuple[float, str, str, int | None]] = deque(maxlen=event_log_size)
        self.last_slot_rates_bps: dict[tuple[str, str, int], float] = {}

    @property
    def routing(self) -> str:
        return self.policy.name

    # ---- identity ------------------------------------------------------------------------------
    def switch_name(self, dpid: int) -> str | None:
        sw = self.fabric.switch_by_dpid.get(dpid)
        return sw.name if sw else None

    def dpid(self, switch: str) -> int:
        return self.fabric.switch_by_name[switch].dpid

    # ---- the desired state (`controller.flowtable`) ----------------------------------------------
    def groups(self, switch: str) -> list[GroupIntent]:
        return self.flowtable.groups(switch)

    def slot_flows(self, switch: str, dest: str, slot: int, port: int) -> tuple[FlowIntent, ...]:
        return self.flowtable.slot_flows(switch, dest, slot, port)

    def flows(self, switch: str) -> list[FlowIntent]:
        return self.flowtable.flows(switch)

    def nudge_flow(self, switch: str) -> FlowIntent:
        return self.flowtable.nudge_flow(switch)

    def transit_flows(self, switch: str, dest: str) -> list[FlowIntent]:
        return self.flowtable.transit_flows(switch, dest)

    def on_switch_connect(self, dpid: int) -> Changes:
        """Everything a switch with empty tables needs (nothing for a dpid not in the model)."""
        return self.resync(dpid, {}, [])

    def resync(self, dpid: int, groups: dict[int, tuple[int, ...]], flows: Iterable[FlowIntent]) -> Changes:
        """Bring a switch from what it has (groups: id -> watched ports; our flows) to what it should
        have, without wiping anything first: add what is missing, modify what differs, delete only
        stale flows of ours."""
        name = self.switch_name(dpid)
        if name is None:
            return Changes(dpid)
        want_groups = self.groups(name)
        g_add = tuple(g for g in want_groups if g.group_id not in groups)
        g_mod = tuple(g for g in want_groups if g.group_id in groups and groups[g.group_id] != g.ports)
        have = {f.key: f for f in flows}
        want = {f.key: f for f in self.flows(name)}
        f_add = tuple(f for k, f in want.items() if k not in have)
        f_mod = tuple(f for k, f in want.items() if k in have and have[k].action != f.action)
        f_del = tuple(f for k, f in have.items() if k not in want)
        return Changes(dpid, g_add, g_mod, f_add, f_mod, f_del)

    # ---- events --------------------------------------------------------------------------------
    def _changes(self, moves: Sequence[SlotMove]) -> tuple[Changes, ...]:
        """The table-1 flow changes for `moves`, one `Changes` per switch in name order. For a
        tuple of moves the policy memoised (a repeated link event), built once."""
        memo = self.policy.link_memo and isinstance(moves, tuple)
        if memo:
            hit = self._changes_of.get(id(moves))
            if hit is not None and hit[0] is moves:
                return hit[1]
        by_switch: dict[str, list[FlowIntent]] = {}
        for m in moves:
            by_switch.setdefault(m.switch, []).extend(self.slot_flows(m.switch, m.dest, m.slot, m.new_port))
        changes = tuple(Changes(self.dpid(sw), flows_modify=tuple(fl)) for sw, fl in sorted(by_switch.items()))
        if memo and moves:
            if len(self._changes_of) >= CHANGES_MEMO_ENTRIES:
                del self._changes_of[next(iter(self._changes_of))]
            self._changes_of[id(moves)] = (moves, changes)  # type: ignore[assignment]
        return changes

    def precompute_failures(self, links: Iterable[tuple[str, int]] | None = None,
                            budget_s: float | None = None) -> int:
        """Warm the policy's link memo and the messages' intents with every single switch-to-switch
        link failure (or those of `links`) from the current state
        (`RoutingPolicy.precompute_failures`), so that those decisions are lookups. Returns how
        many were prepared (fewer if `budget_s` ran out)."""
        n = 0
        for moves in self.policy.precompute_failures(links, budget_s):
            self._changes(moves)
            n += 1
        return n

    def _apply(self, moves: Sequence[SlotMove], started: float) -> list[Changes]:
        changes = list(self._changes(moves))
        if moves:
            took_us = (time.perf_counter() - started) * 1e6
            for observe in self.decision_observers:
                observe(took_us)
        return changes

    def on_port_status(self, dpid: int, port: int, up: bool, now: float) -> list[Changes]:
        """A port's config or link state changed. Returns the changes for every switch affected."""
        started = time.perf_counter()
        sw = self.fabric.switch_by_dpid.get(dpid)
        if sw is None or not self.policy.has_link((sw.name, port)):
            return []
        link = (sw.name, port)
        if (link in self._port_down) == up:  # a change (not a port-desc reply confirming a state)
            self.port_log.append((now, sw.name, port, up))
        self.gray.port_state(link, up)
        (self._port_down.discard if up else self._port_down.add)(link)
        if self._out_as_gray(link):
            return []  # the policy has it down already, and keeps it so until it heals
        return self._covered_last(self._apply(self.policy.on_link_change(sw.name, port, up, now), started), link)

    def _covered_last(self, changes: list[Changes], link: tuple[str, int]) -> list[Changes]:
        """`changes` with those of the link's two switches last: when it goes down their fast-failover
        buckets already skip its port, while every other switch forwards into it until its own
        changes arrive (when it comes up, nothing is lost either way)."""
        if len(changes) < 2:
            return changes
        ends = {self.dpid(link[0]), self.dpid(self.fabric.peer(*link).node)}
        return [c for c in changes if c.dpid not in ends] + [c for c in changes if c.dpid in ends]

    def _out_as_gray(self, link: tuple[str, int]) -> bool:
        """Whether the link at `link` is out of service because it is gray in either direction."""
        if not self.policy.reacts_to_links:
            return False
        peer = self._peer_port.get(link)
        return self.gray.is_gray(link) or (peer is not None and self.gray.is_gray(peer))

    def on_probe_counts(self, dpid: int, counts: dict[int, int], now: float) -> tuple[list[Changes], list[GrayChange]]:
        """A switch's probe counters (in-port -> probes arrived). Returns the changes for links that
        turned gray (taken out of service) or healed (back in service), and those verdicts."""
        name = self.switch_name(dpid)
        if name is None:
            return [], []
        verdicts = self.gray.on_counts(name, counts, now)
        out: list[Changes] = []
        for v in verdicts:
            self.gray_log.append(v)
            link, peer = v.link, self._peer_port[v.link]
            if not self.policy.reacts_to_links or self.gray.is_gray(peer):
                continue  # the link's state does not change (the other direction keeps it out)
            if link in self._port_down or peer in self._port_down:
                continue  # its carrier is down: the policy has it down and brings it back with the carrier
            started = time.perf_counter()
            out += self._apply(self.policy.on_link_change(link[0], link[1], not v.gray, now, v.describe()), started)
        return out, verdicts

    def on_port_counters(self, dpid: int, counters: dict[int, tuple[int, int, float]]) -> dict[tuple[str, int], float]:
        """Fold one switch's port counters in: port -> (tx bytes, rx bytes, the switch's own port
        duration in s). Rates use the switch's clock, so replies that reach a busy controller late
        or bunched up do not distort them. Returns the egress rates (bits/s) this reply gives."""
        name = self.switch_name(dpid)
        rates: dict[tuple[str, int], float] = {}
        if name is None:
            return rates
        for port, (tx, rx, duration_s) in counters.items():
            self.port_bytes[(name, port)] = (tx, rx)
            rate = self.port_rates.update((name, port), tx, duration_s)
            if rate is not None:
                rates[(name, port)] = rate * 8
            peer = self._peer_port.get((name, port))
            if peer is not None and peer[0] in self.fabric.switch_by_name and \
                    self.dpid(peer[0]) not in self.port_poll_dpids:
                # the far switch is not polled: its egress on this link is what this port received
                self.port_bytes[peer] = (rx, tx)
                rate = self.port_rates.update(peer, rx, duration_s)
                if rate is not None:
                    rates[peer] = rate * 8
        if self.gray.config.enabled:  # a full link's probe losses are its queue's: not judged (`controller.gray`)
            busy = self.gray.config.busy_util
            policy = self.policy
            self.gray.note_busy(l for l, r in rates.items() if policy.has_link(l) and r >= busy * policy.capacity_bps(l))
        return rates

    def slot_of(self, switch: str, flow: FlowIntent) -> tuple[str, str, int] | None:
        """(switch, dest, slot) of a table-1 TCP/UDP flow, else None."""
        match = dict(flow.match)
        meta = match.get("metadata")
        src = match.get("tcp_src", match.get("udp_src"))
        if flow.table != TABLE_ECMP or not isinstance(meta, int) or not isinstance(src, tuple):
            return None
        dest = self.dest_by_id.get(meta)
        if dest is None:
            return None
        return (switch, dest, self.policy.entropy.slot(self.policy.tier(switch), src[0]))

    def on_flow_counters(self, dpid: int, counters: list[tuple[FlowIntent, int, float]], now: float | None = None
                         ) -> dict[tuple[str, str, int], float]:
        """Fold one switch's table-1 flow counters in: (flow, bytes, the flow's own duration in s).
        Returns per-slot rates (bits/s) over windows of at least `flow_window_s` and remembers them
        as the last known slot rates. With `now`, a slot whose counters rose while its last known
        rate was 0 is a newcomer for `flow_window_s`: its windowed rates until then are diluted by
        the idle time before it started (they cover its activity only afterwards). `newcomers`
        gives the bytes it sent since, from which the policy presumes its rate."""
        name = self.switch_name(dpid)
        rates: dict[tuple[str, str, int], float] = {}
        if name is None:
            return rates
        for flow, n_bytes, duration_s in counters:
            slot = self.slot_of(name, flow)
            if slot is None:
                continue
            rate = self.slot_rates.update((name, flow.key), n_bytes, duration_s)
            if rate is not None:
                rates[slot] = rates.get(slot, 0.0) + rate * 8
            if now is not None:
                self._note_activity(slot, (name, flow.key), n_bytes, now)
        self.last_slot_rates_bps.update(rates)
        return rates

    def _note_activity(self, slot: tuple[str, str, int], flow: tuple[str, object], n_bytes: int, now: float) -> None:
        seen = self._flow_seen.get(flow)
        self._flow_seen[flow] = (n_bytes, now)
        if seen is None or n_bytes <= seen[0]:
            return
        before, read_s = seen
        got = self._newcomers.get(slot)
        if got is not None and now - got.first_s < self.slot_rates.min_window_s:
            self._newcomers[slot] = _Newcomer(got.first_s, got.sent_bytes + n_bytes - before, got.since_s, now)
        elif self.last_slot_rates_bps.get(slot, 0.0) == 0.0:
            # it started after the reading before this one
            self._newcomers[slot] = _Newcomer(now, n_bytes - before, read_s, now)

    def newcomers(self, now: float) -> dict[tuple[str, str, int], int]:
        """Slots that started sending less than `flow_window_s` ago -> bytes they sent since."""
        if not self._newcomers:
            return {}
        window_s = self.slot_rates.min_window_s
        for slot in [k for k, c in self._newcomers.items() if now - c.first_s >= window_s]:
            del self._newcomers[slot]
        return {k: c.sent_bytes for k, c in self._newcomers.items()}

    def newcomer_spans_s(self) -> dict[tuple[str, str, int], float]:
        """The time over which each newcomer sent its bytes (`newcomers`): from the last reading
        of its counters before it was first seen sending to the latest."""
        return {k: c.last_s - c.since_s for k, c in self._newcomers.items()}

    def on_loads(self, port_rates_bps: dict[tuple[str, int], float], now: float) -> list[Changes]:
        """New port rates: the policy decides at once, with the last known slot rates however old
        (elephants are long-lived) and presumed rates for newcomers (`RoutingPolicy.presume_newcomers`),
        whether to move slots off hot links. The relievers of a link that turns hot now are asked for
        flow statistics at once (`urgent_flow_dpids`)."""
        started = time.perf_counter()
        p = self.policy
        was_hot = set(p.hot_links())
        moves = p.on_loads(port_rates_bps, self.last_slot_rates_bps, now, self.newcomers(now), self.newcomer_spans_s())
        hot = p.hot_links()
        for link in hot:
            if link not in was_hot:
                relievers = self._relievers(link)
                self.urgent_flow_dpids |= relievers
                self.turned_hot_s.update(dict.fromkeys(relievers, now))
                self.congestion_log.append((now, "hot", link[0], link[1]))
        if self.warm_nudge:
            self._note_warm(port_rates_bps, hot, now)
        return self._apply(moves, started)

    def _note_warm(self, port_rates_bps: dict[tuple[str, int], float], hot: tuple[tuple[str, int], ...],
                   now: float) -> None:
        """Links of this sample that have just turned warm (smoothed utilisation at or above the
        policy's `cool_util`, not hot): their relievers go into `nudge_dpids`. Once per rise: a link
        stays warm until it cools below that or turns hot."""
        p = self.policy
        warm_util = p.config.cool_util
        for link in port_rates_bps:
            if not p.has_link(link):
                continue
            if link in hot or p.rate_bps(link) < warm_util * p.capacity_bps(link):
                self._warm.discard(link)
            elif link not in self._warm:
                self._warm.add(link)
                self.nudge_dpids |= self._relievers(link)
                self.congestion_log.append((now, "warm", link[0], link[1]))

    def on_slot_rates(self, now: float) -> list[Changes]:
        """New slot rates arrived (a flow-statistics reply): while a link is hot, decide on them now
        rather than at the next port sample."""
        if not self.policy.hot_links():
            return []
        started = time.perf_counter()
        return self._apply(self.policy.on_loads({}, self.last_slot_rates_bps, now, self.newcomers(now),
                                                self.newcomer_spans_s()), started)

    def on_manual_move(self, switch: str, dest: str, slot: int, port: int, now: float) -> list[Changes]:
        """An operator puts one slot on a chosen next hop (a planned, lossless move) and pins it there
        until `on_release`."""
        started = time.perf_counter()
        self._need_multipath()
        move = self.policy.move(switch, dest, slot, port, now)
        return self._apply([move] if move else [], started)

    def on_release(self, switch: str, dest: str, slot: int | None, now: float) -> list[Changes]:
        """An operator gives a pinned slot (None: every pinned slot there) back to the routing policy."""
        started = time.perf_counter()
        self._need_multipath()
        return self._apply(self.policy.release(switch, dest, slot, now), started)

    def _need_multipath(self) -> None:
        if not self.policy.multipath:
            raise RoutingError(f"slots can only be moved under a multipath routing, not {self.routing!r}")

    def flow_stats_wanted(self) -> set[int]:
        """Datapaths whose per-slot rates the policy needs now: the decision points that could move
        traffic off a hot link (their slots' segments cross it, and they have an equal-cost
        alternative whose segment avoids it). Flow statistics are costly for a userspace switch, so
        they are asked for on demand rather than polled fast everywhere; a hot link into a host,
        which every path to that host crosses, asks for none."""
        out: set[int] = set()
        for link in self.policy.hot_links():
            out |= self._relievers(link)
        return out

    def _relievers(self, link: tuple[str, int]) -> frozenset[int]:
        cached = self._relievers_of.get(link)
        if cached is None:
            p = self.policy
            found = set()
            for sw, dest, port in self.table.segments_through(*link):
                if p.is_decision(sw, dest) and any(link not in self.table.segment(sw, dest, alt)
                                                   for alt in p.candidates(sw, dest) if alt != port):
                    found.add(self.dpid(sw))
            cached = self._relievers_of[link] = frozenset(found)
        return cached

    # ---- queries -------------------------------------------------------------------------------
    def paths(self, src: str, dst: str, src_port: int | None, offset: int, limit: int) -> list[dict[str, object]]:
        """The paths from host `src` to host `dst` now, per shared plane, as the switches forward
        them (down links and the current slot choices included; paths through a dead link left
        out): for a given source port the one path it takes (none if it is dropped), otherwise every
        distinct path, sorted, paged by `offset`/`limit`. Each plane's row says how many there are
        in all (`total`) and where the next page starts (`next_offset`, None after the last), and
        gives for each path a source port that takes it (`src_ports`)."""
        out: list[dict[str, object]] = []
        for s_nic in self.fabric.nics_of[src]:
            d_nic = next((n for n in self.fabric.nics_of[dst] if n.plane == s_nic.plane), None)
            if d_nic is None:
                continue
            if src_port is None:
                every = self.policy.live_paths(s_nic, d_nic)
            else:
                one = self.policy.path(s_nic, d_nic, src_port)
                every = ((one, src_port),) if one is not None else ()
            page = every[offset:offset + limit]
            out.append({"plane": s_nic.plane, "src_ip": str(s_nic.ip), "dst_ip": str(d_nic.ip),
                        "total": len(every), "offset": offset,
                        "next_offset": offset + limit if offset + limit < len(every) else None,
                        "paths": [list(p) for p, _ in page], "src_ports": [sp for _, sp in page]})
        return out
