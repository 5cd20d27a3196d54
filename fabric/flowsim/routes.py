"""Connections' paths as rows of directed-link indexes, the form the rate computation takes.

A connection from NIC a to NIC b crosses a's link up to its edge switch, the links between the switches
the routing policy forwards it through (`fabric.routing.walk.PathWalker`, many at once), and the
destination switch's link down to b. Row i of `LinkRoutes.rows` lists those links (indexes into
`inputs.directed_links(fabric)`), padded with -1; a connection the data plane drops (a dead link on
its way) has an empty row. `ConnectionPaths` keeps every connection's row for a run, walked when first
used and again after every routing change.
"""
from __future__ import annotations

import numpy as np

from fabric.flowsim.connections import ConnectionTable, sorted_unique
from fabric.flowsim.maxmin import FlowSimError, IntArray
from fabric.flowsim.result import DirectedLinkName
from fabric.model import Fabric
from fabric.routing.policy import RoutingPolicy
from fabric.routing.walk import PathWalker


class LinkRoutes:
    """Routes on `links` (the fabric's directed links, in `directed_links`'s order) by `policy` as it is now;
    `reset` after the policy's state changes."""

    def __init__(self, fabric: Fabric, policy: RoutingPolicy, links: tuple[DirectedLinkName, ...]) -> None:
        self.walker = PathWalker(policy)
        link_id = {l: i for i, l in enumerate(links)}
        sw = self.walker.switch_index
        self.n_switches = len(sw)
        self.nic_up = np.asarray([link_id[(p.host, p.switch)] for p in fabric.nic_ports], dtype=np.intp)
        self.nic_down = np.asarray([link_id[(p.switch, p.host)] for p in fabric.nic_ports], dtype=np.intp)
        # switch-to-switch links by (from x switches + to): dense where small, else sorted for a lookup
        inner = sorted((sw[a] * len(sw) + sw[b], i) for i, (a, b) in enumerate(links) if a in sw and b in sw)
        self.inner_key = np.asarray([k for k, _ in inner], dtype=np.int64)
        self.inner_link = np.asarray([i for _, i in inner], dtype=np.intp)
        # per directed link: the switch it leaves (index; -1 for a host's) and that switch's port
        self.link_switch = np.asarray([sw.get(a, -1) for a, _ in links], dtype=np.intp)
        self.link_port = np.asarray([fabric.port_towards(a, b) if a in sw else -1 for a, b in links], dtype=np.int64)

    def reset(self) -> None:
        self.walker.reset()

    def rows(self, src_nic: IntArray, dst_nic: IntArray, sport: IntArray, width: int = 1) -> tuple[IntArray, IntArray]:
        """(rows, links per row) of the connections from `src_nic` to `dst_nic` with source ports `sport`;
        rows at least `width` wide."""
        switches, hops, alive = self.walker.walk(src_nic, dst_nic, sport)
        # one more link than switches crossed: up from the NIC, between the switches, down to the NIC
        n_links = np.where(alive, hops + 1, 0).astype(np.intp)
        rows = np.full((src_nic.size, max(width, int(n_links.max(initial=0)))), -1, dtype=np.intp)
        rows[alive, 0] = self.nic_up[src_nic[alive]]
        for j in range(1, switches.shape[1]):
            inner = np.flatnonzero(switches[:, j] >= 0)
            key = switches[inner, j - 1].astype(np.int64) * self.n_switches + switches[inner, j]
            rows[inner, j] = self.inner_link[np.searchsorted(self.inner_key, key)]
        last = np.flatnonzero(alive)
        rows[last, hops[last]] = self.nic_down[dst_nic[last]]
        return rows, n_links


class ConnectionPaths:
    """Every connection's path (`ct`'s connections, by id): a row of link indexes padded with -1 (all
    -1: dropped) in `conn_path`, its links in `conn_hops`, walked on arrays (`LinkRoutes`) when first
    used and after every routing change (`invalidate`); `routes`, if given, are every connection's with
    the policy as it is now (fresh until the first routing change). `version` counts the changes."""

    def __init__(self, fabric: Fabric, policy: RoutingPolicy, links: tuple[DirectedLinkName, ...],
                 ct: ConnectionTable, routes: tuple[IntArray, IntArray] | None = None) -> None:
        self.ct = ct
        self.pair_ptr = ct.pair_ptr  # host pair i's connections: ids pair_ptr[i] .. pair_ptr[i + 1] - 1
        self.walk = LinkRoutes(fabric, policy, links)
        n_conns = len(ct)
        if routes is not None:
            if routes[0].shape[0] != n_conns or routes[1].shape != (n_conns,):
                raise FlowSimError(f"routes for {routes[0].shape[0]} connections given, {n_conns} planned")
            self.conn_path, self.conn_hops = routes[0], routes[1].astype(np.int64)
            self.conn_fresh = np.ones(n_conns, dtype=bool)
        else:
            self.conn_path = np.full((n_conns, 1), -1, dtype=np.intp)
            self.conn_hops = np.zeros(n_conns, dtype=np.int64)
            self.conn_fresh = np.zeros(n_conns, dtype=bool)
        self.width = self.conn_path.shape[1]
        self.version = 0

    def route(self, ids: IntArray) -> None:
        """(Re)compute the paths of connections `ids` that are not fresh for the current routing."""
        stale = ids[~self.conn_fresh[ids]]
        if not stale.size:
            return
        c = sorted_unique(stale)
        rows, n_links = self.walk.rows(self.ct.src_nic[c], self.ct.dst_nic[c], self.ct.sport[c], self.width)
        if rows.shape[1] > self.width:
            pad = np.full((self.conn_path.shape[0], rows.shape[1] - self.width), -1, dtype=np.intp)
            self.conn_path = np.hstack([self.conn_path, pad])
            self.width = rows.shape[1]
        self.conn_path[c] = rows
        self.conn_hops[c] = n_links
        self.conn_fresh[c] = True

    def invalidate(self) -> None:
        """The routing changed: every path is stale (walked again as it is used)."""
        self.conn_fresh[:] = False
        self.walk.reset()
        self.version += 1
