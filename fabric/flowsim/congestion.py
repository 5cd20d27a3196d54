"""Congestion polling (`SimOptions.poll_s` > 0, for a policy that reacts to loads): every `poll_s` of
simulated time while flows run, the policy's `on_loads` gets the current rate of every switch egress link
and of every slot (each flow's rate added at every decision point on its path, in the slot its source
port selects there), as the controller gets them from port and flow counters every poll; the slots it
moves re-route their flows at once. The rates are exact (no counter windows) and the move costs no time.
"""
from __future__ import annotations

import numpy as np

from fabric.flowsim.clock import POLL, Clock
from fabric.flowsim.flows import Flows
from fabric.flowsim.result import DirectedLinkName
from fabric.flowsim.routes import ConnectionPaths
from fabric.model import Fabric
from fabric.routing.policy import RoutingPolicy


class CongestionPoller:
    """The congestion feedback's polls: `poll_s` (0: never, as for a policy without a load reaction),
    whether one is due (`pending`), and the counts of polls and of slots moved."""

    def __init__(self, fabric: Fabric, policy: RoutingPolicy, links: tuple[DirectedLinkName, ...],
                 paths: ConnectionPaths, clock: Clock, poll_s: float) -> None:
        self.fabric, self.policy, self.paths, self.clock = fabric, policy, paths, clock
        self.n_links = len(links)
        # each directed link's first node (the switch it leaves; the congestion feedback's decision points)
        self.link_from = tuple(a for a, _ in links)
        # (switch, port) of each directed link leaving a switch
        self.egress_key: list[tuple[str, int] | None] = []
        for here, there in links:
            self.egress_key.append((here, fabric.port_towards(here, there)) if here in fabric.switch_by_name else None)
        reacts = type(policy).react_to_loads is not RoutingPolicy.react_to_loads
        self.poll_s = poll_s if reacts else 0.0
        self.pending = False
        self.polls = 0
        self.congestion_moves = 0

    def arm(self) -> None:
        """Flows started: the next poll is due `poll_s` from now, unless one is already."""
        if self.poll_s > 0 and not self.pending:
            self.pending = True
            self.clock.push(self.clock.now + self.poll_s, POLL, 0)

    def poll(self, flows: Flows) -> None:
        """A poll is due: link and slot rates to the policy (module docstring), its moves applied."""
        self.pending = False
        if not flows.conn.size:
            return
        if flows.dirty:
            flows.update_rates()
        self.polls += 1
        load = np.zeros(self.n_links)
        load[flows.load[0]] = flows.load[1]
        port_rates = {k: float(load[i]) for i, k in enumerate(self.egress_key) if k is not None}
        ct = self.paths.ct
        per_conn = np.bincount(flows.conn, weights=flows.rates, minlength=len(ct))
        slot_rates: dict[tuple[str, str, int], float] = {}
        pol = self.policy
        nics = self.fabric.nic_ports
        conn_path, conn_hops = self.paths.conn_path, self.paths.conn_hops
        for c in np.flatnonzero(per_conn > 0).tolist():
            rate, sport = float(per_conn[c]), int(ct.sport[c])
            dest = nics[int(ct.dst_nic[c])].switch
            # the switches before the destination's: where the path's links 1 .. hops - 2 leave
            for link in conn_path[c, 1:conn_hops[c] - 1].tolist():
                node = self.link_from[link]
                if pol.is_decision(node, dest):
                    key = (node, dest, pol.entropy.slot(pol.tier(node), sport))
                    slot_rates[key] = slot_rates.get(key, 0.0) + rate
        moves = pol.on_loads(port_rates, slot_rates, self.clock.now)
        if moves:
            self.congestion_moves += len(moves)
            flows.reroute()
        self.pending = True
        self.clock.push(self.clock.now + self.poll_s, POLL, 0)
