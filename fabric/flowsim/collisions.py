"""ECMP collisions among a set of connections, counted on their paths (`fabriclab compare`'s evidence column).

At each switch, for each set of equal-cost ports the connections choose among there (e.g. a leaf's
uplinks towards one destination leaf), the connections that share a port while another port of the
set carries none: each of them could have had a port to itself. Static: the connections of one lane
(a stream's calls run one at a time) are taken as all running at once, on the paths the policy gives
them now. Counted on arrays, from the connections' link rows (`LinkRoutes.rows`): an all-to-all at
1024 hosts has millions of connections.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fabric.flowsim.connections import ConnectionTable, sorted_unique
from fabric.flowsim.maxmin import IntArray
from fabric.flowsim.routes import LinkRoutes
from fabric.routing.policy import RoutingPolicy


def ecmp_collisions(policy: RoutingPolicy, table: ConnectionTable, routes: LinkRoutes,
                    paths: tuple[IntArray, IntArray], ids: IntArray | None = None) -> dict[str, Any]:
    """{"collisions", "choices" (connections x switches where there was a choice), "ports_idle", "by_role"
    (the collisions by the role of the switch where they happen: "tor", "agg", "leaf", ...)} among the
    connections `ids` of `table` (default: all), whose link rows are `paths` (`routes.rows` of every
    connection of `table`); module docstring."""
    rows, n_links = paths
    c = np.arange(len(table), dtype=np.intp) if ids is None else np.asarray(ids, dtype=np.intp)
    none: dict[str, Any] = {"collisions": 0, "choices": 0, "ports_idle": 0, "by_role": {}}
    if not c.size:
        return none
    rows, n_links = rows[c], n_links[c]
    # the hops between switches: a row's links 1 .. n - 2 (its first leaves the host, its last enters it)
    col = np.arange(rows.shape[1])
    inner = (col[None, :] >= 1) & (col[None, :] <= n_links[:, None] - 2)
    link = rows[inner]
    walker = routes.walker
    n_sw = len(walker.switches)
    dest = np.broadcast_to(walker.nic_switch[table.dst_nic[c]][:, None], rows.shape)[inner].astype(np.int64)
    u = routes.link_switch[link].astype(np.int64)
    port = routes.link_port[link]
    # the equal-cost port set of each (switch, destination) met, numbered; -1 where there is no choice
    spot = u * n_sw + dest
    spots = sorted_unique(spot)
    sets: dict[tuple[int, tuple[int, ...]], int] = {}
    set_of_spot = np.full(spots.size, -1, dtype=np.int64)
    for i, s in enumerate(spots.tolist()):
        ports = tuple(sorted(policy.table.ecmp_ports(walker.switches[s // n_sw], walker.switches[s % n_sw])))
        if len(ports) >= 2:
            set_of_spot[i] = sets.setdefault((s // n_sw, ports), len(sets))
    which = set_of_spot[np.searchsorted(spots, spot)]
    chosen = which >= 0
    choices = int(chosen.sum())
    if not choices:
        return none
    width = int(port.max()) + 1
    used = np.bincount(which[chosen] * width + port[chosen], minlength=len(sets) * width).reshape(len(sets), width)
    size = np.asarray([len(ports) for _, ports in sets], dtype=np.int64)
    idle = size - (used > 0).sum(axis=1)
    shared = (used - 1).clip(min=0).sum(axis=1)
    per_set = np.minimum(shared, idle)
    by_role: dict[str, int] = {}
    roles = {sw.name: sw.role for sw in policy.table.fabric.switches}
    for (sw, _), k in zip(sets, per_set.tolist()):
        if k:
            role = roles[walker.switches[sw]]
            by_role[role] = by_role.get(role, 0) + int(k)
    return {"collisions": int(per_set.sum()), "choices": choices, "ports_idle": int(idle.sum()), "by_role": by_role}
