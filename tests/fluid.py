"""A fluid model of long TCP flows over the fake fabric, for congestion tests.

Each round, every flow sends for `dt_s` at its max-min fair share of the directed links it crosses
(as the fake switches forward it, host NICs included); the fake switches count the bytes; the
controller core reads every port and flow counter its polls would read, folds in the rates, decides,
and its changes go to the fake switches before the next round.

By default every round reads every port and flow counter, then decides. With `flow_poll_s`, rounds
follow the controller's schedule instead (`controller.sync`): port counters every round, decided on
at once; flow counters of every decision point every `flow_poll_s`, and of the datapaths the core
asks for at once (`urgent_flow_dpids`) in the round it asks, each reply decided on at once.
`apply=False` drops the controller's changes (a move whose effect never shows).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from controller import ofmsg
from controller.core import ControllerCore
from controller.intents import COOKIE
from tests.fakeoftable import FakeFabric, flow_stats

Link = tuple[str, int]  # (node, egress port)


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    src_port: int
    plane: str = "A"
    max_bps: float | None = None  # what the sender offers at most (None: as much as the network takes)


def max_min(paths: list[list[Link]], capacity_bps: dict[Link, float]) -> list[float]:
    """Max-min fair rates (progressive filling) of flows over the given directed links."""
    rates = [0.0] * len(paths)
    left = {link: capacity_bps[link] for p in paths for link in p}
    active = set(range(len(paths)))
    while active:
        users = Counter(link for f in active for link in paths[f])
        share = {link: left[link] / n for link, n in users.items()}
        tight = min(share, key=lambda link: (share[link], link))
        done = {f for f in active if tight in paths[f]}
        for f in done:
            rates[f] = share[tight]
            for link in paths[f]:
                left[link] -= share[tight]
        active -= done
    return rates


class Fluid:
    def __init__(self, core: ControllerCore, fake: FakeFabric, flows: list[Flow], rate_scale: float,
                 flow_poll_s: float | None = None) -> None:
        self.core, self.fake, self.flows = core, fake, flows
        self.flow_poll_s = flow_poll_s
        self.apply = True
        self.last_flow_poll_s = -float("inf")
        self.moves_on_port_samples = 0  # moves decided on port samples (schedule mode)
        self.moves_on_flow_replies = 0  # ... and on flow-statistics replies
        fab = core.fabric
        self.capacity_bps = {(end.node, end.port): link.rate_gbps * 1e9 * rate_scale
                             for link in fab.links for end in (link.a, link.b)}
        self.now = 0.0
        self.rates_bps: list[float] = []
        self.poll()  # the first samples: rates from the next round on

    def _send(self, flow: Flow, n_bytes: int) -> list[Link]:
        nic = self.core.fabric.nic(flow.src, flow.plane)
        ip = str(self.core.fabric.nic(flow.dst, flow.plane).ip)
        pkt = {"eth_type": 0x0800, "ipv4_dst": ip, "ip_proto": 6, "tcp_src": flow.src_port}
        return self.fake.send(flow.src, nic.nic, pkt, n_bytes)

    def links(self, flow: Flow) -> list[Link]:
        """Directed links the flow crosses now, its host's NIC first."""
        return self._send(flow, 0)

    def round(self, dt_s: float = 0.25) -> int:
        """One round; returns how many slots the controller moved."""
        paths = [self.links(f) for f in self.flows]
        capacity = dict(self.capacity_bps)
        for i, f in enumerate(self.flows):
            if f.max_bps is not None:  # the sender's own limit, as a link only this flow crosses
                capacity[("sender", i)] = f.max_bps
                paths[i] = paths[i] + [("sender", i)]
        self.rates_bps = max_min(paths, capacity)
        for flow, rate in zip(self.flows, self.rates_bps):
            self._send(flow, int(rate * dt_s / 8))
        self.now = round(self.now + dt_s, 9)  # no drift: 10 x 0.1 s make the 1 s window exactly
        return self.poll()

    def _moves(self) -> int:
        return sum(len(e.moves) for e in self.core.policy.events())

    def _apply(self, changes: list) -> None:
        if self.apply:
            self.fake.apply(changes)

    def _flow_poll(self, dpid: int) -> None:
        core = self.core
        stats = flow_stats(self.fake, str(core.switch_name(dpid)), COOKIE)
        flows = [(ofmsg.flow_from_stats(dpid, st), st.byte_count) for st in stats]
        core.on_flow_counters(dpid, [(f, n, self.now) for f, n in flows if f is not None], self.now)

    def poll(self) -> int:
        if self.flow_poll_s is not None:
            return self._scheduled_poll()
        core, fake = self.core, self.fake
        rates: dict[Link, float] = {}
        for dpid in sorted(core.port_poll_dpids):
            rates.update(core.on_port_counters(dpid, fake.port_counters(str(core.switch_name(dpid)), self.now)))
        for dpid in sorted(core.decision_dpids):
            stats = flow_stats(fake, str(core.switch_name(dpid)), COOKIE)
            flows = [(ofmsg.flow_from_stats(dpid, st), st.byte_count) for st in stats]
            core.on_flow_counters(dpid, [(f, n, self.now) for f, n in flows if f is not None])
        before = sum(len(e.moves) for e in core.policy.events())
        self._apply(core.on_loads(rates, self.now))
        return sum(len(e.moves) for e in core.policy.events()) - before

    def _scheduled_poll(self) -> int:
        core, fake = self.core, self.fake
        before = self._moves()
        rates: dict[Link, float] = {}
        for dpid in sorted(core.port_poll_dpids):
            rates.update(core.on_port_counters(dpid, fake.port_counters(str(core.switch_name(dpid)), self.now)))
        self._apply(core.on_loads(rates, self.now))
        after_ports = self._moves()
        self.moves_on_port_samples += after_ports - before
        assert self.flow_poll_s is not None
        if self.now - self.last_flow_poll_s >= self.flow_poll_s - 1e-9:
            asked = set(core.decision_dpids)
            self.last_flow_poll_s = self.now
        else:
            asked = core.urgent_flow_dpids & core.decision_dpids
        core.urgent_flow_dpids -= asked
        for dpid in sorted(asked):
            self._flow_poll(dpid)
            self._apply(core.on_slot_rates(self.now))
        self.moves_on_flow_replies += self._moves() - after_ports
        return self._moves() - before
