"""The routing core: pure path tables over the model, and the routing modes' choices.

Tables are precomputed once per fabric, per plane, per destination edge switch (every switch that
has hosts): hop distance to it from every switch of the plane, the number of shortest paths, and the
set of next-hop ports that lie on a shortest path. Hosts never forward, so paths run between the
switches a host pair attaches to. A host pair's equal-cost paths are the sum over the planes both
hosts are in (a dual-plane host can use either plane).

Modes: `static` picks one deterministic shortest path per destination (destination index modulo the
equal-cost next hops at every hop).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property

from fabric.errors import TopologyError
from fabric.model import Fabric, NicPort

MODES = ("static",)


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
        edge = sorted({p.switch for p in fabric.nic_ports})
        for dest in edge:
            self._bfs(dest)

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

    # ---- queries -------------------------------------------------------------------------------
    def next_ports(self, switch: str, dest: NicPort) -> tuple[int, ...]:
        """Ports of `switch` that lie on a shortest path to NIC `dest` (empty if unreachable)."""
        if switch == dest.switch:
            return (dest.switch_port,)
        return self._next.get((switch, dest.switch), ())

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


def static_port(ports: tuple[int, ...], dest_index: int) -> int:
    """The `static` mode's choice among equal-cost next-hop ports: deterministic per destination."""
    if not ports:
        raise ValueError("no next-hop port to choose from")
    return ports[dest_index % len(ports)]
