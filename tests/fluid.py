"""A fluid model of long TCP flows over the fake fabric, for congestion tests.

Each round, every flow sends for `dt_s` at its max-min fair share of the directed links it crosses
(as the fake switches forward it, host NICs included); the fake switches count the bytes; the
controller core reads every port and flow counter its polls would read, folds in the rates, decides,
and its changes go to the fake switches before the next round.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from controller import ofmsg
from controller.core import COOKIE, ControllerCore
from tests.fakeoftable import FakeFabric, flow_stats

Link = tuple[str, int]  # (node, egress port)


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    src_port: int
    plane: str = "A"


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
    def __init__(self, core: ControllerCore, fake: FakeFabric, flows: list[Flow], rate_scale: float) -> None:
        self.core, self.fake, self.flows = core, fake, flows
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
        self.rates_bps = max_min(paths, self.capacity_bps)
        for flow, rate in zip(self.flows, self.rates_bps):
            self._send(flow, int(rate * dt_s / 8))
        self.now += dt_s
        return self.poll()

    def poll(self) -> int:
        core, fake = self.core, self.fake
        rates: dict[Link, float] = {}
        for dpid in sorted(core.port_poll_dpids):
            rates.update(core.on_port_counters(dpid, fake.port_counters(str(core.switch_name(dpid)), self.now)))
        for dpid in sorted(core.decision_dpids):
            stats = flow_stats(fake, str(core.switch_name(dpid)), COOKIE)
            flows = [(ofmsg.flow_from_stats(dpid, st), st.byte_count) for st in stats]
            core.on_flow_counters(dpid, [(f, n, self.now) for f, n in flows if f is not None])
        before = sum(len(e.moves) for e in core.policy.events())
        fake.apply(core.on_loads(rates, self.now))
        return sum(len(e.moves) for e in core.policy.events()) - before
