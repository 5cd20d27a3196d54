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

from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Mapping

from fabric.errors import TopologyError
from fabric.model import Fabric, NicPort

@dataclass(frozen=True)
class PairStats:
    """Shortest-path figures for one host pair."""

    hops: int  # links on a shortest path, host to host, in the best plane
    paths: int  # equal-cost shortest paths, summed over shared planes


class PathTable:
    """Precomputed shortest-path structure of a fabric (read-only after construction)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        # dest switch -> {switch: hops to it}, and {switch: number of shortest paths to it}
        self._dist: dict[str, dict[str, int]] = {}
        self._count: dict[str, dict[str, int]] = {}
        # (switch, dest switch) -> next-hop ports on shortest paths, ascending
        self._next: dict[tuple[str, str], tuple[int, ...]] = {}
        # (switch, dest switch) -> its direct port, then its detour ports ascending (detours only)
        self._routes: dict[tuple[str, str], tuple[int, ...]] = {}
        # (switch, dest switch, detour port) -> the detour's second hop: (detour switch, its direct port)
        self._detour_hop: dict[tuple[str, str, int], tuple[str, int]] = {}
        # (switch, dest switch) -> in-ports whose packets towards dest arrive on a detour, ascending
        self._transit: dict[tuple[str, str], tuple[int, ...]] = {}
        self.edge_switches: tuple[str, ...] = tuple(sorted({p.switch for p in fabric.nic_ports}))
        # (switch, dest switch, port) -> directed links (switch, port) that shortest paths from
        # `switch` leaving by `port` towards `dest` may cross, the first hop included
        self._via: dict[tuple[str, str, int], frozenset[tuple[str, int]]] = {}
        # (switch, dest switch, port) -> directed links from `switch` by `port` up to the next
        # decision point or `dest`, in path order
        self._segment: dict[tuple[str, str, int], tuple[tuple[str, int], ...]] = {}
        for dest in self.edge_switches:
            self._bfs(dest)
            self._detours(dest)
            self._via_links(dest)
            self._segment_links(dest)
        # directed link -> the (switch, dest, port) choices whose paths may cross it / whose segment holds it
        self._crossing = _inverse(self._via)
        self._through = _inverse(self._segment)

    def _bfs(self, dest: str) -> None:
        fab = self.fabric
        dist = {dest: 0}
        order = [dest]
        queue = deque([dest])
        while queue:
            s = queue.popleft()
            for adj in fab.adjacency[s]:
                if adj.peer in fab.switch_by_name and adj.peer not in dist:
                    dist[adj.peer] = dist[s] + 1
                    order.append(adj.peer)
                    queue.append(adj.peer)
        count = {dest: 1}
        for s in order[1:]:
            ports = []
            total = 0
            for adj in fab.adjacency[s]:
                if dist.get(adj.peer, -1) == dist[s] - 1 and adj.peer in fab.switch_by_name:
                    ports.append(adj.port)
                    total += count[adj.peer]
            count[s] = total
            self._next[(s, dest)] = tuple(ports)
        self._dist[dest] = dist
        self._count[dest] = count

    def _detours(self, dest: str) -> None:
        """Two-hop detours towards `dest`: from each switch linked to it, via each switch linked to both."""
        fab = self.fabric
        dist = self._dist[dest]
        transit: dict[str, list[int]] = {}
        for s in sorted(dist):
            if dist[s] != 1:
                continue
            detours = []
            for adj in fab.adjacency[s]:
                if adj.peer != dest and dist.get(adj.peer) == 1 and adj.peer in fab.switch_by_name:
                    detours.append(adj.port)
                    self._detour_hop[(s, dest, adj.port)] = (adj.peer, self._next[(adj.peer, dest)][0])
                    transit.setdefault(adj.peer, []).append(adj.peer_port)
            if detours:
                self._routes[(s, dest)] = self._next[(s, dest)] + tuple(detours)
        for c, ports in transit.items():
            self._transit[(c, dest)] = tuple(sorted(ports))

    def _via_links(self, dest: str) -> None:
        dist = self._dist[dest]
        reach: dict[str, frozenset[tuple[str, int]]] = {dest: frozenset()}
        for s in sorted(dist, key=dist.__getitem__):
            if s == dest:
                continue
            acc: set[tuple[str, int]] = set()
            for port in self.route_ports(s, dest):
                hop = self._detour_hop.get((s, dest, port))
                if hop is not None:  # the detour switch forwards by its direct link, nothing else
                    via = frozenset({(s, port), hop})
                    self._via[(s, dest, port)] = via
                    acc |= via
                    continue
                peer = self.peer(s, port)[0]
                via = frozenset({(s, port)}) | reach[peer]
                self._via[(s, dest, port)] = via
                acc |= via
            reach[s] = frozenset(acc)

    def _segment_links(self, dest: str) -> None:
        dist = self._dist[dest]
        tail: dict[str, tuple[tuple[str, int], ...]] = {}  # one-way switch -> its links up to a decision
        for s in sorted(dist, key=dist.__getitem__):
            if s == dest:
                continue
            ports = self.route_ports(s, dest)
            for port in ports:
                hop = self._detour_hop.get((s, dest, port))
                if hop is not None:
                    self._segment[(s, dest, port)] = ((s, port), hop)
                    continue
                peer = self.peer(s, port)[0]
                rest = tail.get(peer, ()) if peer != dest else ()
                self._segment[(s, dest, port)] = ((s, port),) + rest
            if len(ports) == 1:
                tail[s] = self._segment[(s, dest, ports[0])]

    def peer(self, node: str, port: int) -> tuple[str, int]:
        """The (node, port) at the other end of `node`'s `port`."""
        end = self.fabric.peer(node, port)
        return end.node, end.port

    # ---- queries -------------------------------------------------------------------------------
    def next_ports(self, switch: str, dest: NicPort) -> tuple[int, ...]:
        """Ports of `switch` that lie on a shortest path to NIC `dest` (empty if unreachable)."""
        if switch == dest.switch:
            return (dest.switch_port,)
        return self._next.get((switch, dest.switch), ())

    def ecmp_ports(self, switch: str, dest_switch: str) -> tuple[int, ...]:
        """Equal-cost next-hop ports from `switch` towards edge switch `dest_switch` (empty at dest)."""
        return self._next.get((switch, dest_switch), ())

    def route_ports(self, switch: str, dest_switch: str) -> tuple[int, ...]:
        """Every port a decision at `switch` towards `dest_switch` may choose: the equal-cost ports,
        then the two-hop detours (module docstring)."""
        return self._routes.get((switch, dest_switch)) or self._next.get((switch, dest_switch), ())

    def detour_ports(self, switch: str, dest_switch: str) -> tuple[int, ...]:
        """Ports of `switch` to the switches linked to both it and `dest_switch` (when its only
        shortest way there is the direct link), ascending; empty elsewhere."""
        routes = self._routes.get((switch, dest_switch))
        return routes[1:] if routes else ()

    def detour_hop(self, switch: str, dest_switch: str, port: int) -> tuple[str, int] | None:
        """For a detour port: the directed link the detour switch forwards by (its direct link to
        `dest_switch`); None for any other port."""
        return self._detour_hop.get((switch, dest_switch, port))

    def transit_ports(self, switch: str, dest_switch: str) -> tuple[int, ...]:
        """In-ports of `switch` by which packets towards `dest_switch` arrive on a detour (from the
        switches whose detour it is): they must leave by its direct link, never detour again."""
        return self._transit.get((switch, dest_switch), ())

    def via(self, switch: str, dest_switch: str, port: int) -> frozenset[tuple[str, int]]:
        """Directed links that paths from `switch` by `port` towards `dest_switch` may cross."""
        return self._via[(switch, dest_switch, port)]

    def crossing(self, switch: str, port: int) -> tuple[tuple[str, str, int], ...]:
        """The (switch, dest switch, port) choices whose paths may cross directed link (switch, port)."""
        return self._crossing.get((switch, port), ())

    def segment(self, switch: str, dest_switch: str, port: int) -> tuple[tuple[str, int], ...]:
        """Directed links a packet leaving `switch` by `port` towards `dest_switch` crosses for sure:
        up to the next decision point (a switch with more than one `route_ports`), or to
        `dest_switch`; a detour's two links."""
        return self._segment[(switch, dest_switch, port)]

    def segments_through(self, switch: str, port: int) -> tuple[tuple[str, str, int], ...]:
        """The (switch, dest switch, port) choices whose `segment` holds directed link (switch, port)."""
        return self._through.get((switch, port), ())

    @cached_property
    def decisions(self) -> tuple[tuple[str, str], ...]:
        """(switch, dest switch) pairs with more than one equal-cost next hop, or with detours: the
        decision points."""
        return tuple(sorted(k for k, ports in self._next.items() if len(ports) > 1 or k in self._routes))

    def switch_hops(self, src_switch: str, dst_switch: str) -> int | None:
        return self._dist[dst_switch].get(src_switch)

    def switch_paths(self, src_switch: str, dst_switch: str) -> int:
        return self._count[dst_switch].get(src_switch, 0)

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
