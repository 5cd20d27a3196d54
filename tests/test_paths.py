"""Hop counts and equal-cost path counts: hand counts, and an independent networkx count."""
from __future__ import annotations

import itertools

import networkx as nx
import pytest

from fabric import topofile
from fabric.builders import dual_plane, leaf_spine, pyramid
from fabric.routing import PairStats, PathTable


@pytest.mark.parametrize("topo, src, dst, hops, paths", [
    # dual-plane-16: 4 hosts per leaf, 2 spines per plane, 2 planes
    ("dual-plane-16", "h0", "h1", 2, 2),    # same leaf: 1 path in each plane
    ("dual-plane-16", "h0", "h4", 4, 4),    # other leaf: 2 spines x 2 planes
    ("dual-plane-16", "h3", "h15", 4, 4),
    # pyramid-16: ToR pairs per pod, 2 aggs per pod, 2 cores
    ("pyramid-16", "h0", "h1", 2, 1),       # same ToR
    ("pyramid-16", "h0", "h4", 4, 2),       # same pod: via agg0 or agg1
    ("pyramid-16", "h0", "h8", 6, 8),       # other pod: 2 aggs x 2 cores x 2 aggs
    # leaf-spine-16: 4 spines
    ("leaf-spine-16", "h0", "h4", 4, 4),
    ("leaf-spine-16", "h0", "h2", 2, 1),
])
def test_hand_counted_pairs(topo, src, dst, hops, paths):
    stats = PathTable(topofile.load(topo)).pair(src, dst)
    assert (stats.hops, stats.paths) == (hops, paths)


def test_mesh_plane_has_one_direct_path_per_plane():
    fab = dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh")
    stats = PathTable(fab).pair("h0", "h7")
    assert (stats.hops, stats.paths) == (3, 2)


def _nx_count(fab, src, dst):
    """Independent count: networkx shortest paths per plane on a graph where hosts don't transit."""
    total, best = 0, None
    for plane in fab.planes:
        g = nx.Graph()
        for link in fab.links:
            nodes = (link.a.node, link.b.node)
            planes = {fab.switch_by_name[n].plane for n in nodes if n in fab.switch_by_name}
            if planes == {plane.name}:
                g.add_edge(*nodes)
        for h in fab.hosts:  # a host may only be an end point
            if h.name not in (src, dst) and h.name in g:
                g.remove_node(h.name)
        if src in g and dst in g and nx.has_path(g, src, dst):
            ps = list(nx.all_shortest_paths(g, src, dst))
            total += len(ps)
            best = len(ps[0]) - 1 if best is None else min(best, len(ps[0]) - 1)
    return best, total


@pytest.mark.parametrize("fab", [
    dual_plane(hosts=8, hosts_per_leaf=2, spines_per_plane=3),
    dual_plane(hosts=6, hosts_per_leaf=2, plane_kind="mesh"),
    pyramid(hosts=8, hosts_per_tor=2, tors_per_pod=2, aggs_per_pod=2, cores=3),
    leaf_spine(hosts=6, hosts_per_leaf=2, spines=3),
], ids=["dual-clos", "dual-mesh", "pyramid", "leaf-spine"])
def test_all_pairs_match_networkx(fab):
    table = PathTable(fab)
    for a, b in itertools.permutations([h.name for h in fab.hosts], 2):
        s = table.pair(a, b)
        assert (s.hops, s.paths) == _nx_count(fab, a, b), (a, b)


def test_pair_range_over_all_pairs():
    lo, hi = PathTable(topofile.load("pyramid-16")).pair_range()
    assert (lo.hops, hi.hops, lo.paths, hi.paths) == (2, 6, 1, 8)


def test_next_ports_lead_only_along_shortest_paths():
    fab = topofile.load("dual-plane-16")
    table = PathTable(fab)
    dest = fab.nic("h15", "A")  # on leafA3, port 6
    assert table.next_ports("leafA3", dest) == (dest.switch_port,)
    # from another leaf: both uplinks (ports 1, 2 go to spineA0, spineA1)
    assert table.next_ports("leafA0", dest) == (1, 2)
    # from a spine: exactly the one port towards leafA3 (spine port 4 = 4th leaf)
    assert table.next_ports("spineA0", dest) == (4,)


def test_segments_by_hand():
    # pyramid-16 (port numbering in tests/test_controller_core.py): towards tor2, tor0 and agg0 and
    # core0 all decide, agg2 does not; leaf-spine-16: spines do not decide
    table = PathTable(topofile.load("pyramid-16"))
    assert table.segment("tor0", "tor2", 1) == (("tor0", 1),)
    assert table.segment("agg0", "tor2", 2) == (("agg0", 2),)
    assert table.segment("core0", "tor2", 3) == (("core0", 3), ("agg2", 3))
    # agg2 -> tor2: from agg2 itself, from either core (down through agg2), from tor3 (up to agg2, down to tor2)
    assert table.segments_through("agg2", 3) == (("agg2", "tor2", 3), ("core0", "tor2", 3), ("core1", "tor2", 3),
                                                 ("tor3", "tor2", 1))
    assert table.segments_through("tor0", 3) == ()  # into host h0: no switch-to-switch choice
    ls = PathTable(topofile.load("leaf-spine-16"))
    assert ls.segment("leafA0", "leafA3", 1) == (("leafA0", 1), ("spineA0", 4))


@pytest.mark.parametrize("topo", ["pyramid-16", "dual-plane-16"])
def test_segments_cut_every_shortest_path_into_consecutive_pieces(topo):
    # each shortest path (networkx, independently) is its segments end to end: from its first
    # switch, then from wherever the previous segment ended
    fab = topofile.load(topo)
    table = PathTable(fab)
    for plane in fab.planes:
        g = nx.Graph()
        for link in fab.links:
            if {link.a.node, link.b.node} <= {s.name for s in fab.switches_in(plane.name)}:
                g.add_edge(link.a.node, link.b.node, ports={link.a.node: link.a.port, link.b.node: link.b.port})
        edges = sorted({p.switch for p in fab.nic_ports if p.plane == plane.name})
        for src, dst in itertools.permutations(edges, 2):
            for nodes in nx.all_shortest_paths(g, src, dst):
                links = [(a, g.edges[a, b]["ports"][a]) for a, b in zip(nodes, nodes[1:])]
                pieces, at = [], 0
                while at < len(links):
                    seg = table.segment(links[at][0], dst, links[at][1])
                    pieces.extend(seg)
                    at += len(seg)
                assert pieces == links, (src, dst, nodes)


# dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh") by hand, from the builder's wiring order
# (per plane: leaf pairs i < j in order, then the hosts, two per leaf):
#   leafA0: 1 -> leafA1, 2 -> leafA2, 3 -> leafA3, 4 -> h0, 5 -> h1
#   leafA1: 1 -> leafA0, 2 -> leafA2, 3 -> leafA3, 4 -> h2, 5 -> h3
#   leafA2: 1 -> leafA0, 2 -> leafA1, 3 -> leafA3, 4 -> h4, 5 -> h5
#   leafA3: 1 -> leafA0, 2 -> leafA1, 3 -> leafA2, 4 -> h6, 5 -> h7
def test_mesh_leaves_have_two_hop_detours_by_hand():
    t = PathTable(dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh"))
    assert t.ecmp_ports("leafA0", "leafA1") == (1,)  # the direct link is the only shortest path
    assert t.detour_ports("leafA0", "leafA1") == (2, 3)  # via leafA2, via leafA3
    assert t.route_ports("leafA0", "leafA1") == (1, 2, 3)
    # the detour switch forwards by its own direct link: leafA2 port 2, leafA3 port 2
    assert t.detour_hop("leafA0", "leafA1", 2) == ("leafA2", 2)
    assert t.detour_hop("leafA0", "leafA1", 3) == ("leafA3", 2)
    assert t.detour_hop("leafA0", "leafA1", 1) is None
    # leafA2 is a detour towards leafA1 for leafA0 (arriving by its port 1) and leafA3 (port 3)
    assert t.transit_ports("leafA2", "leafA1") == (1, 3)
    assert t.segment("leafA0", "leafA1", 3) == (("leafA0", 3), ("leafA3", 2))
    assert t.via("leafA0", "leafA1", 2) == {("leafA0", 2), ("leafA2", 2)}
    # leafA2 -> leafA1 is crossed by leafA2's direct choice, by leafA0's and leafA3's detours to
    # leafA1 via leafA2, and by leafA2's own detours via leafA1 (to leafA0 and to leafA3)
    assert t.crossing("leafA2", 2) == (("leafA0", "leafA1", 2), ("leafA2", "leafA0", 2), ("leafA2", "leafA1", 2),
                                       ("leafA2", "leafA3", 2), ("leafA3", "leafA1", 3))
    # every ordered pair of leaves, in each plane, decides: 2 planes x 4 x 3
    assert len(t.decisions) == 24
    assert t.pair("h0", "h2") == PairStats(hops=3, paths=2)  # detours are backups, not equal-cost paths


@pytest.mark.parametrize("topo", ["dual-plane-16", "pyramid-16", "leaf-spine-16"])
def test_clos_and_pyramid_planes_have_no_detours(topo):
    # no triangles: the decisions are the ECMP ones (more than one equal-cost next hop) only
    fab = topofile.load(topo)
    t = PathTable(fab)
    for sw in fab.switches:
        for dest in t.edge_switches:
            assert t.detour_ports(sw.name, dest) == () and t.transit_ports(sw.name, dest) == ()
            assert t.route_ports(sw.name, dest) == t.ecmp_ports(sw.name, dest)
    assert all(len(t.ecmp_ports(*k)) > 1 for k in t.decisions)


@pytest.mark.parametrize("topo, hosts", [("dual-plane-1024", 128), ("pyramid-1024", 128)])
def test_next_hops_and_decision_points_match_networkx_at_scale(topo, hosts):
    # the table computes distances on arrays and next hops per destination on first use; networkx's
    # distances on the same fabric's switch graph say which ports lead one hop nearer
    fab = topofile.scaled(topo, hosts)
    table = PathTable(fab)
    graph = nx.Graph()
    graph.add_edges_from((l.a.node, l.b.node) for l in fab.links
                         if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name)
    deciding = set()
    for dest in table.edge_switches:
        dist = nx.single_source_shortest_path_length(graph, dest)
        for sw in fab.switches:
            want = tuple(adj.port for adj in fab.adjacency[sw.name] if adj.peer in dist and sw.name in dist
                         and dist[sw.name] > 0 and dist[adj.peer] == dist[sw.name] - 1)
            assert table.ecmp_ports(sw.name, dest) == want, (sw.name, dest)
            assert table.switch_hops(sw.name, dest) == dist.get(sw.name)
            if len(want) > 1:
                deciding.add((sw.name, dest))
    assert set(table.decisions) == deciding  # Clos and pyramid planes: no detours
    widest = {s: 0 for s in fab.switch_by_name}
    for sw, dest in deciding:
        widest[sw] = max(widest[sw], len(table.ecmp_ports(sw, dest)))
    assert {s: w for s, w in table.widest_routes.items() if w > 1} == {s: w for s, w in widest.items() if w > 1}
