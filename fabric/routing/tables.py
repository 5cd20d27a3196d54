"""Pure path tables over the model.

Tables are precomputed once per fabric, per plane, per destination edge switch (every switch that
has hosts): hop distance to it from every switch of the plane, the number of shortest paths, and the
set of next-hop ports that lie on a shortest path. Hosts never forward, so paths run between the
switches a host pair attaches to. A host pair's equal-cost paths are the sum over the planes both
hosts are in (a dual-plane host can use either plane).

Indexed for the decisions: `via(switch, dest, port)` is the set of directed links that paths leaving
`switch` by `port` towards `dest` may cross, and `crossing(link)` inverts it ("which choices send
traffic over this link" is a lookup). `segment(switch, dest, port)` is the part of those paths that
is certain: the links from `switch` by `port` up to the next decision point (a switch with more
than one equal-cost next hop, or with detours, below) or `dest`; beyond it, the next decision
point's own choice decides. Every link of a path belongs to exactly one segment of it, so a flow
measured at each decision point it crosses is counted once per link; `segments_through(link)`
inverts it.

Two-hop detours (backups, not equal-cost paths): where a switch's only shortest way to a destination
edge switch is their direct link, every switch linked to both is a detour (`detour_ports`): the
packet goes to it, and it forwards by its own direct link to the destination, nothing else
(`detour_hop`; the packets it receives from the switches whose detour it is are the ones it must
forward so: `transit_ports`). In the built-in fabrics that is a mesh plane (`plane_kind="mesh"`:
any two leaves and a third form a triangle); Clos and pyramid planes have no triangles, hence no
detours. A detour is one hop that keeps the distance to the destination at 1, then the detour
switch's direct link, and a detoured packet is never detoured again, so no path loops.
`route_ports` are the equal-cost ports, then the detours: a switch with more than one is a decision
point; `via`, `crossing`, `segment` and `segments_through` cover detours too (a detour's segment
is both its links).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Mapping

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from fabric.errors import TopologyError
from fabric.model import Fabric, NicPort

@dataclass(frozen=True)
class PairStats:
    """Shortest-path figures for one host pair."""

    hops: int  # links on a shortest path, host to host, in the best plane
    paths: int  # equal-cost shortest paths, summed over shared planes


class PathTable:
    """Precomputed shortest-path structure of a fabric (read-only after construction; what is not
    computed at construction is computed on first use and kept)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.edge_switches: tuple[str, ...] = tuple(sorted({p.switch for p in fabric.nic_ports}))
        # hop distances from every switch to every edge switch, by breadth-first search in C
        # (scipy.sparse.csgraph): one row per edge switch, -1 where unreachable
        names = [s.name for s in fabric.switches]
        self._sw_index = {name: i for i, name in enumerate(names)}
        self._dest_row = {d: i for i, d in enumerate(self.edge_switches)}
        a: list[int] = []
        b: list[int] = []
        for link in fabric.links:
            if link.a.node in self._sw_index and link.b.node in self._sw_index:
                a.append(self._sw_index[link.a.node])
                b.append(self._sw_index[link.b.node])
        n = len(names)
        graph = csr_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
        rows = [self._sw_index[d] for d in self.edge_switches]
        far = shortest_path(graph, method="D", directed=False, unweighted=True, indices=rows) if rows \
            else np.zeros((0, n))
        self._dist_matrix = np.where(np.isfinite(far), far, -1).astype(np.int32)
        # (switch, dest switch) -> next-hop ports on shortest paths, ascending (filled per destination
        # on first use, `_next_to`, from the directed switch-to-switch links sorted by switch and port)
        self._next: dict[tuple[str, str], tuple[int, ...]] = {}
        self._nexted: set[str] = set()
        self._sw_names = names
        edges = sorted((self._sw_index[adj_of], adj.port, self._sw_index[adj.peer])
                       for adj_of in names for adj in fabric.adjacency[adj_of] if adj.peer in self._sw_index)
        tails, ports_, heads = (np.asarray(col, dtype=np.intp) for col in zip(*edges)) if edges \
            else (np.zeros(0, dtype=np.intp),) * 3
        self._edges = (tails, heads, ports_)
        # per destination, filled together on first use (`_detours_to`): (switch, dest switch) -> its
        # direct port, then its detour ports ascending (detours only); (switch, dest switch, detour
        # port) -> the detour's second hop: (detour switch, its direct port); (switch, dest switch)
        # -> in-ports whose packets towards dest arrive on a detour, ascending
        self._routes: dict[tuple[str, str], tuple[int, ...]] = {}
        self._detour_hop: dict[tuple[str, str, int], tuple[str, int]] = {}
        self._transit: dict[tuple[str, str], tuple[int, ...]] = {}
        self._detoured: set[str] = set()
        self._links_of: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # per destination, on first use (`_links_to`): (switch, dest switch, port) -> directed links
        # (switch, port) that shortest paths from `switch` leaving by `port` towards `dest` may cross,
        # the first hop included; and the directed links from `switch` by `port` up to the next
        # decision point or `dest`, in path order
        self._via: dict[tuple[str, str, int], frozenset[tuple[str, int]]] = {}
        self._segment: dict[tuple[str, str, int], tuple[tuple[str, int], ...]] = {}
        self._linked: set[str] = set()
        # dest switch -> {switch: number of shortest paths to it} (`switch_paths`, on first use)
        self._count: dict[str, dict[str, int]] = {}

    # ---- what is computed on first use -----------------------------------------------------------
    def _dist(self, switch: str, dest: str) -> int:
        """Hops from `switch` to edge switch `dest`; -1 if unreachable or not a switch."""
        row = self._dest_row.get(dest)
        col = self._sw_index.get(switch)
        if row is None or col is None:
            return -1
        return int(self._dist_matrix[row, col])

    def _next_ports(self, switch: str, dest: str) -> tuple[int, ...]:
        found = self._next.get((switch, dest))
        if found is not None:
            return found
        if dest not in self._nexted:
            self._next_to(dest)
            found = self._next.get((switch, dest))
        return found if found is not None else ()

    def _next_to(self, dest: str) -> None:
        """Every switch's next-hop ports towards `dest`, at once (one pass over the links)."""
        self._nexted.add(dest)
        if dest not in self._dest_row:
            return
        row = self._dist_matrix[self._dest_row[dest]]
        tail, head, port = self._edges
        closer = (row[head] == row[tail] - 1) & (row[tail] > 0)
        t, p = tail[closer], port[closer]
        if not t.size:
            return
        bounds = [0, *(np.flatnonzero(np.diff(t)) + 1).tolist(), int(t.size)]
        names, ts, ps = self._sw_names, t.tolist(), p.tolist()
        for lo, hi in itertools.pairwise(bounds):
            self._next[(names[ts[lo]], dest)] = tuple(ps[lo:hi])
    def _by_distance(self, dest: str) -> list[str]:
        """The switches that reach `dest`, nearest first (ties by name)."""
        row = self._dist_matrix[self._dest_row[dest]]
        names = [s.name for s in self.fabric.switches]
        return sorted((names[i] for i in np.flatnonzero(row >= 0).tolist()), key=lambda s: (self._dist(s, dest), s))

    def _switch_links(self, switch: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`switch`'s links to switches, by port: (ports, peer switch indexes, peer ports)."""
        found = self._links_of.get(switch)
        if found is None:
            adj = [a for a in self.fabric.adjacency[switch] if a.peer in self._sw_index]
            found = (np.asarray([a.port for a in adj], dtype=np.intp),
                     np.asarray([self._sw_index[a.peer] for a in adj], dtype=np.intp),
                     np.asarray([a.peer_port for a in adj], dtype=np.intp))
            self._links_of[switch] = found
        return found

    def _detours_to(self, dest: str) -> None:
        """Two-hop detours towards `dest`: from each switch linked to it, via each switch linked to both."""
        if dest in self._detoured:
            return
        self._detoured.add(dest)
        if dest not in self._dest_row:
            return
        fab = self.fabric
        transit: dict[str, list[int]] = {}
        row = self._dist_matrix[self._dest_row[dest]]
        here = self._sw_index[dest]
        near = sorted({adj.peer for adj in fab.adjacency[dest]
                       if adj.peer in self._sw_index and self._dist(adj.peer, dest) == 1})
        for s in near:
            ports, peers, peer_ports = self._switch_links(s)
            hit = np.flatnonzero((row[peers] == 1) & (peers != here))
            if not hit.size:
                continue
            detours = []
            for k in hit.tolist():
                peer = self.fabric.switches[int(peers[k])].name
                port = int(ports[k])
                detours.append(port)
                self._detour_hop[(s, dest, port)] = (peer, self._next_ports(peer, dest)[0])
                transit.setdefault(peer, []).append(int(peer_ports[k]))
            self._routes[(s, dest)] = self._next_ports(s, dest) + tuple(detours)
        for c, in_ports in transit.items():
            self._transit[(c, dest)] = tuple(sorted(in_ports))

    def _links_to(self, dest: str) -> None:
        """`_via` and `_segment` for every choice towards `dest`."""
        if dest in self._linked:
            return
        self._linked.add(dest)
        if dest not in self._dest_row:
            return
        self._detours_to(dest)
        order = self._by_distance(dest)
        reach: dict[str, frozenset[tuple[str, int]]] = {dest: frozenset()}
        tail: dict[str, tuple[tuple[str, int], ...]] = {}  # one-way switch -> its links up to a decision
        for s in order:
            if s == dest:
                continue
            acc: set[tuple[str, int]] = set()
            ports = self.route_ports(s, dest)
            for port in ports:
                hop = self._detour_hop.get((s, dest, port))
                if hop is not None:  # the detour switch forwards by its direct link, nothing else
                    via = frozenset({(s, port), hop})
                    self._segment[(s, dest, port)] = ((s, port), hop)
                else:
                    peer = self.peer(s, port)[0]
                    via = frozenset({(s, port)}) | reach[peer]
                    rest = tail.get(peer, ()) if peer != dest else ()
                    self._segment[(s, dest, port)] = ((s, port),) + rest
                self._via[(s, dest, port)] = via
                acc |= via
            reach[s] = frozenset(acc)
            if len(ports) == 1:
                tail[s] = self._segment[(s, dest, ports[0])]

    def _all_links(self) -> None:
        for dest in self.edge_switches:
            self._links_to(dest)

    @cached_property
    def _crossing(self) -> dict[tuple[str, int], tuple[tuple[str, str, int], ...]]:
        self._all_links()
        return _inverse(self._via)

    @cached_property
    def _through(self) -> dict[tuple[str, int], tuple[tuple[str, str, int], ...]]:
        self._all_links()
        return _inverse(self._segment)

    def peer(self, node: str, port: int) -> tuple[str, int]:
        """The (node, port) at the other end of `node`'s `port`."""
        end = self.fabric.peer(node, port)
        return end.node, end.port

    # ---- queries -------------------------------------------------------------------------------
    def next_ports(self, switch: str, dest: NicPort) -> tuple[int, ...]:
        """Ports of `switch` that lie on a shortest path to NIC `dest` (empty if unreachable)."""
        if switch == dest.switch:
            return (dest.switch_port,)
        return self._next_ports(switch, dest.switch)

    def ecmp_ports(self, switch: str, dest_switch: str) -> tuple[int, ...]:
        """Equal-cost next-hop ports from `switch` towards edge switch `dest_switch` (empty at dest)."""
        return self._next_ports(switch, dest_switch)

    def route_ports(self, switch: str, dest_switch: str) -> tuple[int, ...]:
        """Every port a decision at `switch` towards `dest_switch` may choose: the equal-cost ports,
        then the two-hop detours (module docstring)."""
        if dest_switch not in self._detoured:
            self._detours_to(dest_switch)
        return self._routes.get((switch, dest_switch)) or self._next_ports(switch, dest_switch)

    def detour_ports(self, switch: str, dest_switch: str) -> tuple[int, ...]:
        """Ports of `switch` to the switches linked to both it and `dest_switch` (when its only
        shortest way there is the direct link), ascending; empty elsewhere."""
        self._detours_to(dest_switch)
        routes = self._routes.get((switch, dest_switch))
        return routes[1:] if routes else ()

    def detour_hop(self, switch: str, dest_switch: str, port: int) -> tuple[str, int] | None:
        """For a detour port: the directed link the detour switch forwards by (its direct link to
        `dest_switch`); None for any other port."""
        if dest_switch not in self._detoured:
            self._detours_to(dest_switch)
        return self._detour_hop.get((switch, dest_switch, port))

    def transit_ports(self, switch: str, dest_switch: str) -> tuple[int, ...]:
        """In-ports of `switch` by which packets towards `dest_switch` arrive on a detour (from the
        switches whose detour it is): they must leave by its direct link, never detour again."""
        self._detours_to(dest_switch)
        return self._transit.get((switch, dest_switch), ())

    def via(self, switch: str, dest_switch: str, port: int) -> frozenset[tuple[str, int]]:
        """Directed links that paths from `switch` by `port` towards `dest_switch` may cross."""
        self._links_to(dest_switch)
        return self._via[(switch, dest_switch, port)]

    def crossing(self, switch: str, port: int) -> tuple[tuple[str, str, int], ...]:
        """The (switch, dest switch, port) choices whose paths may cross directed link (switch, port)."""
        return self._crossing.get((switch, port), ())

    def segment(self, switch: str, dest_switch: str, port: int) -> tuple[tuple[str, int], ...]:
        """Directed links a packet leaving `switch` by `port` towards `dest_switch` crosses for sure:
        up to the next decision point (a switch with more than one `route_ports`), or to
        `dest_switch`; a detour's two links."""
        self._links_to(dest_switch)
        return self._segment[(switch, dest_switch, port)]

    def segments_through(self, switch: str, port: int) -> tuple[tuple[str, str, int], ...]:
        """The (switch, dest switch, port) choices whose `segment` holds directed link (switch, port)."""
        return self._through.get((switch, port), ())

    @cached_property
    def decisions(self) -> tuple[tuple[str, str], ...]:
        """(switch, dest switch) pairs with more than one equal-cost next hop, or with detours: the
        decision points."""
        return self._scan[0]

    @cached_property
    def widest_routes(self) -> dict[str, int]:
        """Switch -> the most `route_ports` it has towards any edge switch (0 at none)."""
        return self._scan[1]

    @cached_property
    def _scan(self) -> tuple[tuple[tuple[str, str], ...], dict[str, int]]:
        """The decision points and each switch's widest choice, counted on arrays: a directed link
        is a next hop towards a destination where it leads one hop nearer."""
        names = self._sw_names
        tail, head, _ = self._edges
        keys: set[tuple[str, str]] = set()
        widest = np.zeros(len(names), dtype=np.int64)
        step = max(1, 2_000_000 // max(1, tail.size))  # destinations per block: bounded memory
        for lo in range(0, len(self.edge_switches), step):
            dist = self._dist_matrix[lo:lo + step]
            closer = (dist[:, head] == dist[:, tail] - 1) & (dist[:, tail] > 0)
            for r in range(dist.shape[0]):
                counts = np.bincount(tail[closer[r]], minlength=len(names))
                widest = np.maximum(widest, counts)
                dest = self.edge_switches[lo + r]
                keys.update((names[c], dest) for c in np.flatnonzero(counts > 1).tolist())
        out = {name: int(w) for name, w in zip(names, widest.tolist())}
        for dest in self.edge_switches:
            self._detours_to(dest)
        for (sw, _), routes in self._routes.items():
            keys.add((sw, _))
            out[sw] = max(out[sw], len(routes))
        return tuple(sorted(keys)), out

    def switch_hops(self, src_switch: str, dst_switch: str) -> int | None:
        hops = self._dist(src_switch, dst_switch)
        return None if hops < 0 else hops

    def switch_paths(self, src_switch: str, dst_switch: str) -> int:
        count = self._count.get(dst_switch)
        if count is None:
            count = {dst_switch: 1} if dst_switch in self._dest_row else {}
            for s in self._by_distance(dst_switch)[1:] if count else ():
                count[s] = sum(count[self.peer(s, p)[0]] for p in self._next_ports(s, dst_switch))
            self._count[dst_switch] = count
        return count.get(src_switch, 0)

    def pair(self, src_host: str, dst_host: str) -> PairStats:
        """Hops and equal-cost path count between two hosts, over all planes they share."""
        if src_host == dst_host:
            raise TopologyError(f"no path from host {src_host!r} to itself")
        best: int | None = None
        paths = 0
        dst_nics = {p.plane: p for p in self.fabric.nics_of[dst_host]}
        for s in self.fabric.nics_of[src_host]:
            d = dst_nics.get(s.plane)
            if d is None:
                continue
            hops = self.switch_hops(s.switch, d.switch)
            if hops is None:
                continue
            hops += 2
            if best is None or hops < best:
                best = hops
            paths += self.switch_paths(s.switch, d.switch)
        if best is None:
            raise TopologyError(f"host {dst_host!r} is unreachable from host {src_host!r}")
        return PairStats(hops=best, paths=paths)

    @cached_property
    def attachment_groups(self) -> dict[tuple[str, ...], tuple[str, ...]]:
        """Hosts grouped by the switches they attach to (hosts in one group are equivalent)."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for h in self.fabric.hosts:
            key = tuple(sorted(p.switch for p in self.fabric.nics_of[h.name]))
            groups.setdefault(key, []).append(h.name)
        return {k: tuple(v) for k, v in groups.items()}

    def pair_range(self) -> tuple[PairStats, PairStats]:
        """(min, max) over all host pairs of hops and of equal-cost paths (each taken separately)."""
        reps = [hosts for hosts in self.attachment_groups.values()]
        stats: list[PairStats] = []
        for i, ga in enumerate(reps):
            for gb in reps[i:]:
                if ga is gb:
                    if len(ga) > 1:
                        stats.append(self.pair(ga[0], ga[1]))
                else:
                    stats.append(self.pair(ga[0], gb[0]))
        if not stats:
            raise TopologyError(f"fabric {self.fabric.name!r} has fewer than two hosts")
        lo = PairStats(min(s.hops for s in stats), min(s.paths for s in stats))
        hi = PairStats(max(s.hops for s in stats), max(s.paths for s in stats))
        return lo, hi


def _inverse(index: Mapping[tuple[str, str, int], Iterable[tuple[str, int]]]
             ) -> dict[tuple[str, int], tuple[tuple[str, str, int], ...]]:
    """Directed link -> the choices whose link set holds it, sorted."""
    out: dict[tuple[str, int], list[tuple[str, str, int]]] = {}
    for key, links in index.items():
        for link in links:
            out.setdefault(link, []).append(key)
    return {k: tuple(sorted(v)) for k, v in out.items()}
