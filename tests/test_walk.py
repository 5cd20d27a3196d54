"""`PathWalker` (many flows' paths on arrays) against `RoutingPolicy.path` flow by flow: the same
switches for every flow, on every routing mode and fabric kind (detours included), after link failures
at the fabric's core and at its edge, and through a user's policy."""
from __future__ import annotations

import random

import numpy as np
import pytest

from fabric import topofile
from fabric.builders import dual_plane, pyramid
from fabric.routing import PathTable, RoutingPolicy, load_policy
from fabric.routing.walk import PathWalker
from tests.policies import LastPortPolicy

FABRICS = {
    "dual-plane-16": lambda: topofile.load("dual-plane-16"),
    "pyramid-16": lambda: topofile.load("pyramid-16"),
    "mesh": lambda: dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh"),
    "mesh-12": lambda: dual_plane(hosts=12, hosts_per_leaf=2, plane_kind="mesh"),
    "pyramid-64": lambda: pyramid(hosts=64, hosts_per_tor=8, tors_per_pod=4, aggs_per_pod=2, cores=4),
}


def _flows(fab, n, seed):
    nics = fab.nic_ports
    rng = np.random.default_rng(seed)
    src, dst = [], []
    while len(src) < n:
        a, b = (int(x) for x in rng.integers(len(nics), size=2))
        if nics[a].plane == nics[b].plane and nics[a].host != nics[b].host:
            src.append(a)
            dst.append(b)
    return np.asarray(src), np.asarray(dst), rng.integers(32768, 65536, size=n)


def _check(pol, walker, src, dst, sport):
    fab = pol.table.fabric
    nics = fab.nic_ports
    index = {s.name: i for i, s in enumerate(fab.switches)}
    switches, hops, alive = walker.walk(src, dst, sport)
    dropped = 0
    for i in range(src.size):
        want = pol.path(nics[int(src[i])], nics[int(dst[i])], int(sport[i]))
        if want is None:
            assert not alive[i] and hops[i] == 0, i
            dropped += 1
        else:
            assert alive[i], i
            assert switches[i, :hops[i]].tolist() == [index[v] for v in want[1:-1]], i
            assert (switches[i, hops[i]:] == -1).all()
    return dropped


@pytest.mark.parametrize("routing", ["static", "ecmp", "adaptive", "last-port"])
@pytest.mark.parametrize("name", sorted(FABRICS))
def test_walked_paths_are_the_policys_own(name, routing):
    fab = FABRICS[name]()
    cls = LastPortPolicy if routing == "last-port" else load_policy(routing)
    pol = cls(PathTable(fab))
    walker = PathWalker(pol)
    src, dst, sport = _flows(fab, 1500, 7)
    rng = random.Random(name + routing)
    core = [l for l in fab.links if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name]
    edge = [l for l in fab.links if l.a.node in fab.host_by_name or l.b.node in fab.host_by_name]
    dropped = [_check(pol, walker, src, dst, sport)]
    for k in range(4):
        link = rng.choice(core)
        pol.on_link_change(link.a.node, link.a.port, False, float(k))
        if k == 2:  # a host's link: its flows are dropped at the edge
            e = next(x for x in (rng.choice(edge).a, rng.choice(edge).b) if x.node in fab.switch_by_name)
            pol.on_link_change(e.node, e.port, False, 2.5)
        walker.reset()
        dropped.append(_check(pol, walker, src, dst, sport))
    assert dropped[0] == 0
    if routing == "static":  # no failover: some flows must have met a dead link (the check saw both kinds)
        assert dropped[-1] > 0


def test_a_policy_with_its_own_path_is_walked_through_it():
    fab = topofile.load("leaf-spine-16")

    class Detached(RoutingPolicy):
        name = "detached"

        def path(self, src, dst, src_port):
            return None if src.host == "h0" else super().path(src, dst, src_port)

    pol = Detached(PathTable(fab))
    walker = PathWalker(pol)
    assert walker.generic
    src, dst, sport = _flows(fab, 300, 3)
    _check(pol, walker, src, dst, sport)
    assert not walker.walk(src, dst, sport)[2][[fab.nic_ports[int(a)].host == "h0" for a in src]].any()


@pytest.mark.parametrize("routing", ["ecmp", "adaptive"])
def test_the_dict_tables_of_large_fabrics_walk_the_same_paths(routing, monkeypatch):
    # fabrics whose choice tables would be too large for dense arrays keep them in dicts
    import fabric.routing.walk as walk

    monkeypatch.setattr(walk, "DENSE_ENTRIES", 0)
    fab = FABRICS["mesh-12"]()
    pol = load_policy(routing)(PathTable(fab))
    walker = PathWalker(pol)
    assert not walker.dense
    src, dst, sport = _flows(fab, 800, 11)
    _check(pol, walker, src, dst, sport)
    link = next(l for l in fab.links if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name)
    pol.on_link_change(link.a.node, link.a.port, False, 1.0)
    walker.reset()
    _check(pol, walker, src, dst, sport)
