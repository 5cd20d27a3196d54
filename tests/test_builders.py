"""Builders give the node and link counts, degrees, rates and addresses worked out by hand."""
from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict

import pytest

from fabric.builders import build, dual_plane, leaf_spine, pyramid
from fabric import topofile
from fabric.analysis import oversubscription
from fabric.errors import TopologyError


def degrees(fab):
    deg = Counter()
    for link in fab.links:
        deg[link.a.node] += 1
        deg[link.b.node] += 1
    return deg


def test_dual_plane_clos_counts_and_degrees():
    # 4 hosts, 2 per leaf, 2 spines per plane: per plane 2 leaves + 2 spines;
    # links per plane: 2 leaves x 2 spines + 4 host links = 8; two planes -> 16.
    fab = dual_plane(hosts=4, hosts_per_leaf=2, spines_per_plane=2, nic_rate_gbps=100)
    assert len(fab.hosts) == 4
    assert Counter((s.role, s.plane) for s in fab.switches) == {
        ("leaf", "A"): 2, ("spine", "A"): 2, ("leaf", "B"): 2, ("spine", "B"): 2}
    assert len(fab.links) == 16
    deg = degrees(fab)
    assert {deg[h.name] for h in fab.hosts} == {2}  # one NIC per plane
    assert {deg[s.name] for s in fab.switches if s.role == "leaf"} == {4}  # 2 spines + 2 hosts
    assert {deg[s.name] for s in fab.switches if s.role == "spine"} == {2}  # 2 leaves


def test_dual_plane_every_host_has_one_port_per_plane_with_planned_addresses():
    fab = dual_plane(hosts=8, hosts_per_leaf=4, spines_per_plane=2)
    for h in fab.hosts:
        nics = fab.nics_of[h.name]
        assert [n.plane for n in nics] == ["A", "B"]
        assert nics[0].ip == ipaddress.IPv4Address(f"198.18.0.{h.index + 1}")
        assert nics[1].ip == ipaddress.IPv4Address(f"198.19.0.{h.index + 1}")
        assert nics[0].intf == f"{h.name}-eth0" and nics[1].intf == f"{h.name}-eth1"
        # the two NICs land on different, independent switches
        assert fab.switch_by_name[nics[0].switch].plane == "A"
        assert fab.switch_by_name[nics[1].switch].plane == "B"


def test_addresses_past_255_hosts_stay_in_the_plane_subnet():
    fab = dual_plane(hosts=512, hosts_per_leaf=32, spines_per_plane=4)
    assert fab.nic("h255", "A").ip == ipaddress.IPv4Address("198.18.1.0")
    assert fab.nic("h511", "B").ip == ipaddress.IPv4Address("198.19.2.0")
    assert len({n.ip for n in fab.nic_ports}) == 1024


def test_dual_plane_uplink_rate_is_non_blocking_by_default():
    # leaf: 4 hosts x 200G down = 800G; 2 spines -> 400G per uplink.
    fab = dual_plane(hosts=8, hosts_per_leaf=4, spines_per_plane=2, nic_rate_gbps=200)
    rates = {(l.a.node, l.b.node): l.rate_gbps for l in fab.links}
    assert rates[("leafA0", "spineA1")] == 400
    assert rates[("h0", "leafA0")] == 200


def test_dual_plane_mesh():
    # 6 hosts, 2 per leaf -> 3 leaves per plane in full mesh: 3 leaf links + 6 host links per plane.
    fab = dual_plane(hosts=6, hosts_per_leaf=2, plane_kind="mesh", nic_rate_gbps=100)
    assert not [s for s in fab.switches if s.role == "spine"]
    assert len(fab.links) == 2 * (3 + 6)
    deg = degrees(fab)
    assert {deg[s.name] for s in fab.switches} == {4}  # 2 other leaves + 2 hosts
    # 2 hosts x 100G down over 2 mesh links -> 100G each
    assert {l.rate_gbps for l in fab.links if l.a.node.startswith("leaf") and l.b.node.startswith("leaf")} == {100}


def test_pyramid_counts_and_rates():
    # 8 hosts, 2 per ToR -> 4 ToRs in 2 pods of 2; 2 aggs per pod -> 4 aggs; 2 cores.
    fab = pyramid(hosts=8, hosts_per_tor=2, tors_per_pod=2, aggs_per_pod=2, cores=2,
                  nic_rate_gbps=400, oversubscription=2.0)
    assert Counter(s.role for s in fab.switches) == {"tor": 4, "agg": 4, "core": 2}
    # agg-core 4 x 2 + tor-agg 4 x 2 + 8 host links
    assert len(fab.links) == 24
    deg = degrees(fab)
    assert {deg[h.name] for h in fab.hosts} == {1}
    assert {deg[s.name] for s in fab.switches if s.role == "tor"} == {4}  # 2 hosts + 2 aggs
    assert {deg[s.name] for s in fab.switches if s.role == "agg"} == {4}  # 2 ToRs + 2 cores
    assert {deg[s.name] for s in fab.switches if s.role == "core"} == {4}  # 4 aggs
    rates = {(l.a.node, l.b.node): l.rate_gbps for l in fab.links}
    # ToR: 2 x 400G down, 2:1 -> 400G up over 2 aggs = 200G per link; agg 1:1: 2 x 200G over 2 cores.
    assert rates[("tor0", "agg0")] == 200
    assert rates[("agg0", "core1")] == 200
    # ToRs of pod 1 connect only to pod 1's aggregation switches
    assert {b for a, b in rates if a == "tor2"} == {"agg2", "agg3"}


def test_pyramid_oversubscription_per_tier_separately():
    # 32 hosts of 100G, 4 per ToR: 8 ToRs in 2 pods of 4, 2 aggs per pod (4), 4 cores.
    # ToR at 4:1: 4 x 100 = 400 down, 100 up over 2 aggs = 50 per link.
    # Agg at 2:1: 4 ToRs x 50 = 200 down, 100 up over 4 cores = 25 per link.
    fab = pyramid(hosts=32, hosts_per_tor=4, tors_per_pod=4, aggs_per_pod=2, cores=4, nic_rate_gbps=100,
                  oversubscription=4.0, core_oversubscription=2.0)
    assert Counter(s.role for s in fab.switches) == {"tor": 8, "agg": 4, "core": 4}
    by_pair = Counter()
    rates = defaultdict(set)
    roles = {s.name: s.role for s in fab.switches}
    for l in fab.links:
        pair = tuple(sorted((roles.get(l.a.node, "host"), roles.get(l.b.node, "host"))))
        by_pair[pair] += 1
        rates[pair].add(l.rate_gbps)
    # 32 host links; 8 ToRs x 2 aggs of their pod; 4 aggs x 4 cores
    assert by_pair == {("host", "tor"): 32, ("agg", "tor"): 16, ("agg", "core"): 16}
    assert rates == {("host", "tor"): {100}, ("agg", "tor"): {50}, ("agg", "core"): {25}}
    # each tier's ratio as `topo show` reads it back: the ToR's and the aggregation's, independently
    assert oversubscription(fab) == {"tor": 4.0, "agg": 2.0}
    # the aggregation's ratio does not move with the ToR's, nor the ToR's with the aggregation's
    assert oversubscription(pyramid(hosts=32, hosts_per_tor=4, tors_per_pod=4, aggs_per_pod=2, cores=4,
                                    oversubscription=1.0, core_oversubscription=3.0)) == {"tor": 1.0, "agg": 3.0}


@pytest.mark.parametrize("build_it", [
    lambda o: dual_plane(hosts=16, hosts_per_leaf=4, spines_per_plane=2, nic_rate_gbps=200, oversubscription=o),
    lambda o: dual_plane(hosts=16, hosts_per_leaf=4, plane_kind="mesh", nic_rate_gbps=200, oversubscription=o),
    lambda o: leaf_spine(hosts=16, hosts_per_leaf=4, spines=2, nic_rate_gbps=400, oversubscription=o),
])
def test_two_tier_fabrics_have_their_one_tiers_oversubscription(build_it):
    # 4 hosts a leaf; at 2:1 the leaf's uplinks carry half of its hosts' bandwidth
    fab = build_it(2.0)
    leaf = next(s.name for s in fab.switches if s.role == "leaf")
    host_gbps = sum(a.rate_gbps for a in fab.adjacency[leaf] if a.peer.startswith("h"))
    up_gbps = sum(a.rate_gbps for a in fab.adjacency[leaf] if not a.peer.startswith("h"))
    assert up_gbps == pytest.approx(host_gbps / 2)
    assert oversubscription(fab) == {"leaf": 2.0}


def test_leaf_spine_counts():
    fab = leaf_spine(hosts=8, hosts_per_leaf=4, spines=2)
    assert Counter(s.role for s in fab.switches) == {"leaf": 2, "spine": 2}
    assert len(fab.links) == 2 * 2 + 8
    assert [p.name for p in fab.planes] == ["A"]


def test_fair_comparison_same_host_bandwidth():
    dp = dual_plane(hosts=16, nic_rate_gbps=200)
    py = pyramid(hosts=16, nic_rate_gbps=400)
    assert {dp.host_bandwidth_gbps(h.name) for h in dp.hosts} == {400}
    assert {py.host_bandwidth_gbps(h.name) for h in py.hosts} == {400}


def test_switch_ports_are_numbered_from_one_and_unique():
    fab = dual_plane()
    for sw in fab.switches:
        ports = [a.port for a in fab.adjacency[sw.name]]
        assert ports == list(range(1, len(ports) + 1))


@pytest.mark.parametrize("kwargs, needle", [
    ({"hosts": 10, "hosts_per_leaf": 4}, "multiple of hosts_per_leaf"),
    ({"nic_rate_gbps": 0}, "nic_rate_gbps must be > 0"),
    ({"plane_kind": "torus"}, "plane_kind"),
    ({"spines_per_plane": 0}, "spines_per_plane must be > 0"),
])
def test_bad_builder_parameters_are_named(kwargs, needle):
    with pytest.raises(TopologyError, match=needle):
        dual_plane(**kwargs)


def test_build_by_name_rejects_unknown_builder_and_parameter_and_type():
    with pytest.raises(TopologyError, match="unknown builder 'fat_tree'"):
        build("fat_tree", {})
    with pytest.raises(TopologyError, match="unknown parameter 'host'"):
        build("dual_plane", {"host": 16})
    with pytest.raises(TopologyError, match="hosts"):
        build("dual_plane", {"hosts": "sixteen"})


def test_port_towards_a_neighbour_and_a_non_neighbour():
    fab = topofile.load("dual-plane-16")
    # leafA0: ports 1-2 up to spineA0/spineA1, 3-6 down to h0..h3 (the order the tests of multipath rely on)
    assert fab.port_towards("leafA0", "spineA0") == 1 and fab.port_towards("leafA0", "h0") == 3
    assert fab.peer("leafA0", fab.port_towards("leafA0", "spineA1")).node == "spineA1"
    with pytest.raises(TopologyError, match="no link between leafA0 and leafA1"):
        fab.port_towards("leafA0", "leafA1")
