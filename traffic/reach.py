"""How far a job's process groups reach into a fabric under a placement (pure): the cause behind a
fabric's difference, before anything runs.

For every process group of the workload (grouped by the stream its collectives run on: "tp", "pp",
"dp", "ep" for generated LLM steps and AICB files), the highest switch tier its members' traffic must
climb to meet: `server` (every member in one server: NVLink, no fabric), the leaf/ToR they all hang
from, the aggregation or spine switch their leaves share (one pod of a pyramid, any two leaves of a
leaf-spine), or the core (pyramid pods that share no aggregation switch). On a pyramid, every tier above
the ToR is behind its oversubscribed uplinks. The planes of a dual-plane fabric are alike; the first
plane is read.

`host_pods`: the pod of every host, from the same tiers. Two edge switches (leaf/ToR) are in one pod
when they share a switch of a higher tier they both link to (a pyramid's ToRs share their pod's
aggregation switches, never another pod's) or link to each other (a mesh plane); pods are the closure
of that. So a pyramid has `tors_per_pod` ToRs per pod, and a 2-tier leaf-spine or dual-plane Clos (every
leaf under every spine) or mesh is one pod: what is left between pods is the core. On a rail-wired
pyramid a pod is the ToRs of `tors_per_pod` rails of a rail group (pyramid-1024-rail: one rail group of
32 servers per pod; pyramid-16-rail: rails 0-1 and rails 2-3 of every server).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from networkx.utils import UnionFind

from fabric.model import ROLE_TIER, Fabric
from fabric.transfers import Placement
from traffic.workload import Workload

#: The reach levels, nearest first ("server" below every switch).
LEVELS = ("server", "leaf", "tor", "agg", "spine", "core")


@dataclass(frozen=True)
class GroupReach:
    group: str  # the stream (process group's name)
    groups: int  # distinct groups of that stream in the job
    group_size: int  # ranks per group (the largest)
    reach: dict[str, int] = field(default_factory=dict)  # level -> groups that reach it (and no further)

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "groups": self.groups, "group_size": self.group_size, "reach": dict(self.reach)}

    def describe(self) -> str:
        parts = [f"{self.reach[level]} {level}" for level in LEVELS if level in self.reach]
        return f"{self.group}: {self.groups} group(s) of {self.group_size}; reach " + ", ".join(parts)


def group_reach(workload: Workload, fabric: Fabric, placement: Placement) -> list[GroupReach]:
    """Per stream, its groups and how far each reaches (module docstring), in order of first appearance."""
    leaf_of, up = _edges_and_uplinks(fabric)
    seen: dict[str, dict[tuple[int, ...], str]] = {}
    for rt in workload.ranks:
        for step in rt.steps:
            for c in step.collectives:
                groups = seen.setdefault(c.stream, {})
                if c.group_ranks not in groups:
                    groups[c.group_ranks] = _level(c.group_ranks, fabric, placement, leaf_of, up)
    out = []
    for stream, groups in seen.items():
        out.append(GroupReach(stream, len(groups), max(len(g) for g in groups), dict(Counter(groups.values()))))
    return out


def host_pods(fabric: Fabric) -> dict[str, int]:
    """Host name -> its pod (module docstring), pods numbered 0, 1, ... in order of their lowest host."""
    leaf_of, up = _edges_and_uplinks(fabric)
    edges = dict.fromkeys(leaf_of.values())  # the edge switches, in order of their first host
    pods = UnionFind(edges)
    below: dict[str, str] = {}  # upper switch -> the first edge switch seen under it
    for leaf in edges:
        for a in fabric.adjacency[leaf]:
            if a.peer in edges:  # edge to edge (a mesh plane)
                pods.union(a.peer, leaf)
        for sw in sorted(up[leaf]):
            pods.union(below.setdefault(sw, leaf), leaf)
    number: dict[str, int] = {}
    return {h.name: number.setdefault(pods[leaf_of[h.name]], len(number)) for h in fabric.hosts}


def _edges_and_uplinks(fabric: Fabric) -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    """In the first plane: host -> the edge switch its NIC links to, and switch -> the switches of a
    higher tier it links to."""
    plane = fabric.planes[0].name
    leaf_of = {h.name: fabric.nic(h.name, plane).switch for h in fabric.hosts}
    up: dict[str, frozenset[str]] = {}
    for sw in fabric.switches_in(plane):
        tier = ROLE_TIER[sw.role]
        up[sw.name] = frozenset(a.peer for a in fabric.adjacency[sw.name]
                                if a.peer in fabric.switch_by_name and ROLE_TIER[fabric.switch_by_name[a.peer].role] > tier)
    return leaf_of, up


def _level(ranks: tuple[int, ...], fabric: Fabric, placement: Placement, leaf_of: dict[str, str],
           up: dict[str, frozenset[str]]) -> str:
    hosts = {placement.host(r) for r in ranks}
    if len({fabric.server_of(h) for h in hosts}) == 1:
        return "server"
    leaves = {leaf_of[h] for h in hosts}
    if len(leaves) == 1:
        return fabric.switch_by_name[next(iter(leaves))].role
    shared = frozenset.intersection(*(up[leaf] for leaf in leaves))
    if shared:
        return fabric.switch_by_name[min(shared)].role
    # leaves that share no upper switch meet higher up: the top tier of the plane
    top = max((s for s in fabric.switches if s.plane == fabric.switch_by_name[next(iter(leaves))].plane),
              key=lambda s: ROLE_TIER[s.role])
    return top.role
