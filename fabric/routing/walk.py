"""Many flows' paths at once: `RoutingPolicy.path` walked for arrays of flows, hop by hop.

A flow's path through the switches depends on its source and destination edge switches and on its
source port only through the slot it selects at each decision point (`EntropyPlan.slot`), and the
data plane's choice at a switch (`RoutingPolicy.egress`) depends only on the switch, the destination
edge switch and that slot. So millions of flows (an all-to-all at 1024 hosts) need only the few
thousand distinct (switch, destination, slot) choices, each asked of the policy once per routing
state; the walk advances every flow one hop per round on arrays. Two-hop detours are followed as
`path` follows them (the detour switch forwards by its direct link, whatever the slot).

`PathWalker` keeps those choices until `reset` (call it whenever the policy's state changes: a link
event, a slot move). A policy that overrides `path` itself is walked flow by flow through its own
`path`, since its paths may depend on more than the above.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from fabric.errors import RoutingError
from fabric.model import NicPort
from fabric.routing.policy import RoutingPolicy

IntArray = npt.NDArray[np.intp]
BoolArray = npt.NDArray[np.bool_]
#: choice tables up to this many entries are dense arrays (8 bytes each, two of them); larger fabrics use dicts
DENSE_ENTRIES = 1 << 22
UNKNOWN = -3  # a dense table's entry not yet asked of the policy
NO_DECISION = -1  # a (switch, destination) without a slot table: slot 0


class PathWalker:
    """Paths of flows given as arrays of NIC indexes (into `fabric.nic_ports`) and source ports, as
    switch sequences: row i holds flow i's switches from its source edge switch to its destination edge
    switch (indexes into `fabric.switches`), padded with -1; `hops` counts them; a dropped flow (a
    dead link on its way, as `path` gives None) has `alive` False."""

    def __init__(self, policy: RoutingPolicy) -> None:
        self.policy = policy
        fab = policy.table.fabric
        self.switches = tuple(s.name for s in fab.switches)
        self.switch_index = {name: i for i, name in enumerate(self.switches)}
        self.nics: tuple[NicPort, ...] = fab.nic_ports
        self.nic_switch = np.asarray([self.switch_index[p.switch] for p in self.nics], dtype=np.intp)
        self.nic_link = tuple((p.switch, p.switch_port) for p in self.nics)  # the switch's port to the host
        self.nic_plane = np.asarray([p.plane for p in self.nics])
        self.generic = type(policy).path is not RoutingPolicy.path
        self.reset()

    def reset(self) -> None:
        """Forget the choices: the policy's state changed."""
        self._nic_up = np.asarray([self.policy.is_up(link) for link in self.nic_link], dtype=np.bool_)
        n_spots = len(self.switches) ** 2
        widths = [bits for _, bits in self.policy.entropy.fields.values()]
        self.width = 1 << max(widths, default=0)  # slots a choice key leaves room for
        # dense tables where they are small (every fabric up to a few thousand hosts), else dicts
        self.dense = n_spots * self.width <= DENSE_ENTRIES
        if self.dense:
            self._spot_dense = np.full(n_spots, UNKNOWN, dtype=np.int64)
            self._next_dense = np.full(n_spots * self.width, UNKNOWN, dtype=np.int64)
            self._after_dense = np.full(n_spots * self.width, UNKNOWN, dtype=np.int64)
        self._decides: dict[int, int] = {}  # switch x N + dest -> shift x 64 + bits, or NO_DECISION
        self._choice: dict[int, tuple[int, int]] = {}  # (switch x N + dest) x width + slot -> (next, transit)

    def walk(self, src_nic: IntArray, dst_nic: IntArray, sport: npt.NDArray[np.int64]
             ) -> tuple[IntArray, IntArray, BoolArray]:
        """(switches, hops, alive) of the flows (class docstring)."""
        n = src_nic.size
        if self.generic:
            return self._each(src_nic, dst_nic, sport)
        pol = self.policy
        src_sw, dst_sw = self.nic_switch[src_nic], self.nic_switch[dst_nic]
        crossed = np.flatnonzero(self.nic_plane[src_nic] != self.nic_plane[dst_nic])
        if crossed.size:
            a, b = self.nics[int(src_nic[crossed[0]])], self.nics[int(dst_nic[crossed[0]])]
            raise RoutingError(f"{a.host} ({a.plane}) and {b.host} ({b.plane}) are in different planes")
        alive = self._nic_up[src_nic] & self._nic_up[dst_nic]
        limit = pol._loop_limit() - 1  # `path`'s limit counts the source host too
        rows = [src_sw.copy()]
        cur = src_sw.copy()
        # after a detour port: the switch the detour switch must forward to (-2: its direct link is down)
        transit = np.full(n, -1, dtype=np.intp)
        moving = np.flatnonzero(alive & (cur != dst_sw))
        while moving.size:
            if len(rows) + 1 > limit:
                f = int(moving[0])
                raise RoutingError(f"path {self.nics[int(src_nic[f])].host} -> {self.nics[int(dst_nic[f])].host} "
                                   f"(source port {int(sport[f])}) loops")
            nxt = np.full(n, -1, dtype=np.intp)
            detoured = transit[moving] != -1
            forced = moving[detoured]
            nxt[forced] = np.maximum(transit[forced], -1)  # (-2: dropped)
            transit[forced] = -1
            free = moving[~detoured]
            if free.size:
                step, detour = self._choose(cur[free], dst_sw[free], sport[free])
                nxt[free] = step
                transit[free] = detour
            dropped = moving[nxt[moving] < 0]
            alive[dropped] = False
            moving = moving[nxt[moving] >= 0]
            cur[moving] = nxt[moving]
            row = np.full(n, -1, dtype=np.intp)
            row[moving] = nxt[moving]
            rows.append(row)
            moving = moving[cur[moving] != dst_sw[moving]]
        switches = np.stack(rows, axis=1)
        switches[~alive] = -1
        hops = np.where(alive, (switches >= 0).sum(axis=1), 0).astype(np.intp)
        return switches, hops, alive

    def _choose(self, node: IntArray, dest: IntArray, sport: npt.NDArray[np.int64]) -> tuple[IntArray, IntArray]:
        """For flows at switches `node` towards edge switches `dest`: the next switch (-1: dropped) and,
        after a detour port, the switch the detour switch must forward to (-1: none, -2: its link is down)."""
        spot = node.astype(np.int64) * len(self.switches) + dest
        code = self._lookup(spot, self._spot_dense if self.dense else None, self._decides, self._field)
        decides = code != NO_DECISION
        shift, bits = np.where(decides, code >> 6, 0), np.where(decides, code & 63, 0)
        slot = np.where(decides, (sport >> (1 + shift)) & ((1 << bits) - 1), 0)
        key = spot * self.width + slot
        if self.dense:
            step = self._lookup(key, self._next_dense, None, self._choice_of)
            return step.astype(np.intp), self._after_dense[key].astype(np.intp)
        pairs = [self._choice_of(int(k)) for k in key.tolist()]
        return (np.asarray([a for a, _ in pairs], dtype=np.intp).reshape(-1),
                np.asarray([b for _, b in pairs], dtype=np.intp).reshape(-1))

    @staticmethod
    def _lookup(keys: npt.NDArray[np.int64], dense: npt.NDArray[np.int64] | None, cache: dict[int, int] | None,
                fill: Callable[[int], object]) -> npt.NDArray[np.int64]:
        """`keys` looked up in a dense table (its unknown entries filled first, each distinct key once by
        `fill`, which writes the tables) or, without one, in `cache` (filled the same way)."""
        if dense is not None:
            got = dense[keys]
            unknown = got == UNKNOWN
            if unknown.any():
                for k in np.unique(keys[unknown]).tolist():
                    fill(k)
                got = dense[keys]
            return got
        assert cache is not None
        distinct, inverse = np.unique(keys, return_inverse=True)
        for k in distinct.tolist():
            if k not in cache:
                fill(k)
        return np.asarray([cache[k] for k in distinct.tolist()], dtype=np.int64)[inverse.reshape(-1)]

    def _field(self, spot: int) -> int:
        pol = self.policy
        node, dest = self.switches[spot // len(self.switches)], self.switches[spot % len(self.switches)]
        code = NO_DECISION
        if (node, dest) in pol._slots:
            shift, bits = pol.entropy.field(pol.tier(node))
            code = shift * 64 + bits
        self._decides[spot] = code
        if self.dense:
            self._spot_dense[spot] = code
        return code

    def _choice_of(self, key: int) -> tuple[int, int]:
        found = self._choice.get(key)
        if found is not None:
            return found
        n_sw = len(self.switches)
        spot, slot = divmod(key, self.width)
        node, dest = self.switches[spot // n_sw], self.switches[spot % n_sw]
        pol = self.policy
        port = pol.egress(node, dest, slot)
        if port is None:
            found = (-1, -1)
        else:
            nxt = self.switch_index[pol.table.peer(node, port)[0]]
            hop = pol.table.detour_hop(node, dest, port)
            after = -1
            if hop is not None:
                # `path`: the detour switch forwards by its direct link, unless that link is down
                after = -2 if not pol.is_up(hop) else self.switch_index[pol.table.peer(*hop)[0]]
            found = (nxt, after)
        self._choice[key] = found
        if self.dense:
            self._next_dense[key], self._after_dense[key] = found
        return found

    def _each(self, src_nic: IntArray, dst_nic: IntArray, sport: npt.NDArray[np.int64]
              ) -> tuple[IntArray, IntArray, BoolArray]:
        """Flow by flow, through the policy's own `path`."""
        paths = [self.policy.path(self.nics[int(a)], self.nics[int(b)], int(s))
                 for a, b, s in zip(src_nic.tolist(), dst_nic.tolist(), sport.tolist())]
        width = max((len(p) - 2 for p in paths if p is not None), default=1)
        switches = np.full((len(paths), width), -1, dtype=np.intp)
        alive = np.zeros(len(paths), dtype=np.bool_)
        for i, p in enumerate(paths):
            if p is not None:
                switches[i, :len(p) - 2] = [self.switch_index[v] for v in p[1:-1]]
                alive[i] = True
        hops = (switches >= 0).sum(axis=1).astype(np.intp)
        return switches, hops, alive
