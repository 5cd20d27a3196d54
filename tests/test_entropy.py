"""The entropy plan: every combination of slots at every deciding tier has a source port in the
ephemeral range 49152..65535 that lands in exactly those slots (checked exhaustively), and the
smallest such port is found (checked against brute force)."""
from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from fabric import builders, topofile
from fabric.errors import RoutingError, TopologyError
from fabric.flowsim.connections import plan_connections
from fabric.routing import PathTable, load_policy, plan_entropy
from fabric.routing.entropy import pair_sport, smallest_port_at_least, twist_blocks
from fabric.flowsim.collisions import ecmp_collisions
from fabric.flowsim import directed_links
from fabric.flowsim.connections import pair_key, plan_connection_table, planned_sports
from fabric.flowsim.routes import LinkRoutes

FABRICS = {
    **{name: lambda name=name: topofile.load(name) for name in
       ("dual-plane-16", "pyramid-16", "leaf-spine-16", "dual-plane-1024", "pyramid-1024")},
    # three deciding tiers using bits 1..13 (4 + 5 + 4): the widest plan allowed
    "pyramid-13-bits": lambda: builders.pyramid(hosts=32, hosts_per_tor=4, tors_per_pod=4, aggs_per_pod=8, cores=16),
    "leaf-spine-64-spines": lambda: builders.leaf_spine(hosts=8, hosts_per_leaf=4, spines=64),
}


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_every_slot_combination_has_an_ephemeral_source_port(name):
    plan = plan_entropy(PathTable(FABRICS[name]()))
    tiers = sorted(plan.fields)
    top = max(1 + shift + bits for shift, bits in plan.fields.values())
    assert top <= 14  # bits 14 and 15 stay free
    checked = 0
    for combo in itertools.product(*(range(plan.slots(t)) for t in tiers)):
        want = dict(zip(tiers, combo))
        port = plan.src_port_for(want)
        assert 49152 <= port <= 65535, (want, port)
        assert {t: plan.slot(t, port) for t in tiers} == want
        checked += 1
    # and one tier at a time, the other tiers left free
    for t in tiers:
        for s in range(plan.slots(t)):
            port = plan.src_port_for({t: s})
            assert 49152 <= port <= 65535 and plan.slot(t, port) == s
    assert checked == math.prod(plan.slots(t) for t in tiers)


def test_smallest_port_matches_brute_force():
    rng = random.Random(3)
    for _ in range(300):
        mask = rng.getrandbits(16) & rng.getrandbits(16)
        value = rng.getrandbits(16) & mask
        base = rng.randrange(0, 65536)
        brute = next((p for p in range(base, 65536) if p & mask == value), None)
        assert smallest_port_at_least(base, value, mask) == brute, (base, value, mask)


def test_a_fan_out_too_wide_for_the_port_bits_is_refused():
    # ToR fan-out 16 (5 bits) + agg 16 cores (5) + core fan-out 16 (5) = 15 bits > 13
    fab = builders.pyramid(hosts=64, hosts_per_tor=4, tors_per_pod=8, aggs_per_pod=16, cores=16)
    with pytest.raises(TopologyError, match="source-port bits"):
        plan_entropy(PathTable(fab))


# ---- planned source ports (`pair_sport`) ----------------------------------------------------------
def switch_hops(fab, policy, conns):
    """(switch, next switch) -> connections crossing it, over each one's all-up path (the policy's)."""
    count = Counter()
    for c in conns:
        for u, v in itertools.pairwise(policy.path(c.src, c.dst, c.sport)):
            if u in fab.switch_by_name and v in fab.switch_by_name:
                count[(u, v)] += 1
    return count


def all_to_all(fab, policy, channels=2):
    pairs = [(a.name, b.name) for a in fab.hosts for b in fab.hosts if a != b]
    return [c for cs in plan_connections(fab, policy.entropy, pairs, channels=channels).values() for c in cs]


def test_planned_ports_spread_an_all_to_all_over_every_uplink_and_downlink():
    # dual-plane-128: per plane 4 leaves of 32 hosts and 32 spines. Out of each leaf, per plane,
    # 32 senders x 96 receivers on other leaves x 2 channels = 6144 connections; the same into each
    # leaf. Spread over its 32 uplinks (downlinks): 192 on each.
    fab = topofile.scaled("dual-plane-1024", 128)
    policy = load_policy("ecmp")(PathTable(fab))
    conns = all_to_all(fab, policy)
    role = {s.name: s.role for s in fab.switches}
    hops = switch_hops(fab, policy, conns)
    up = [n for (u, v), n in hops.items() if role[u] == "leaf"]
    down = [n for (u, v), n in hops.items() if role[u] == "spine"]
    assert len(up) == len(down) == 2 * 4 * 32
    assert set(up) == set(down) == {32 * 96 * 2 // 32}
    n = len(fab.hosts)
    every_pair = [pair_key(n, a, b) for a in range(n) for b in range(n) if a != b]
    table = plan_connection_table(fab, policy.entropy, every_pair)
    routes = LinkRoutes(fab, policy, directed_links(fab)[0])
    assert ecmp_collisions(policy, table, routes, routes.rows(table.src_nic, table.dst_nic, table.sport))[
        "collisions"] == 0
    # pyramid-16: 2 pods of 2 ToRs (4 hosts each) and 2 aggregation switches; 2 cores, each linked to
    # both aggregation switches of each pod. Out of each ToR: 4 x 12 x 2 = 96 over 2 uplinks (48 each);
    # out of each pod: 8 x 8 x 2 = 128 over its 2 aggregation switches' 2 core links each (32 each),
    # and into each pod the same from the cores (32 on each core -> agg link)
    fab = topofile.load("pyramid-16")
    policy = load_policy("ecmp")(PathTable(fab))
    role = {s.name: s.role for s in fab.switches}
    by_tier = {}
    for (u, v), n in switch_hops(fab, policy, all_to_all(fab, policy)).items():
        by_tier.setdefault((role[u], role[v]), []).append(n)
    assert {k: sorted(v) for k, v in by_tier.items() if k[0] != "agg" or k[1] != "tor"} == {
        ("tor", "agg"): [48] * 8, ("agg", "core"): [32] * 8, ("core", "agg"): [32] * 8}


def test_the_channels_of_a_pair_take_distinct_next_hops_and_ports_and_two_take_the_first_two():
    for name in ("dual-plane-16", "leaf-spine-16", "pyramid-16"):
        fab = topofile.load(name)
        policy = load_policy("ecmp")(PathTable(fab))
        hosts = fab.hosts
        for a, b in itertools.permutations(range(len(hosts)), 2):
            for channels in (1, 2, 4):
                ports = [pair_sport(policy.entropy, a, b, c, channels) for c in range(channels)]
                assert len(set(ports)) == channels and all(49152 <= p <= 65535 for p in ports)
                src, dst = fab.nics_of[hosts[a].name][0], fab.nics_of[hosts[b].name][0]
                if src.switch == dst.switch or channels > 2:
                    continue
                first = [policy.path(src, dst, p)[2] for p in ports]  # the switch after the edge switch
                assert len(set(first)) == channels, (name, a, b, first)
                if name == "dual-plane-16" and channels == 2:  # 2 spines: channel c by spine c, whatever the pair
                    assert first == [f"spine{src.plane}0", f"spine{src.plane}1"]
    entropy = plan_entropy(PathTable(topofile.load("leaf-spine-16")))
    with pytest.raises(RoutingError, match="at most 16"):
        pair_sport(entropy, 0, 1, 0, 17)
    with pytest.raises(RoutingError, match="channel 2"):
        pair_sport(entropy, 0, 1, 2, 2)


def test_twist_blocks_are_where_each_tiers_next_hop_turns_over():
    # w = channels x f + channel over fan-outs F1, F2, ...: tier i's digit turns over every
    # (F1 x ... x Fi) / channels of f (over their common factor where channels does not divide it)
    fan = {name: plan_entropy(PathTable(topofile.load(name))) for name in ("dual-plane-1024", "pyramid-1024",
                                                                           "pyramid-16", "dual-plane-16")}
    assert twist_blocks(fan["dual-plane-1024"], 2) == (16,)  # 32 spines / 2 channels
    assert twist_blocks(fan["dual-plane-1024"], 1) == (32,)
    assert twist_blocks(fan["pyramid-1024"], 2) == (2, 16, 64)  # ToR 4, agg 8, core 4: 4/2, 32/2, 128/2
    assert twist_blocks(fan["pyramid-16"], 4) == (2,)  # 2, 4, 8 over 4 channels: 1, 1, 2
    assert twist_blocks(fan["dual-plane-16"], 2) == ()  # 2 spines / 2 channels: no block above 1


def test_pair_sport_and_planned_sports_are_one_rule():
    import numpy as np

    rng = np.random.default_rng(7)
    for name in ("pyramid-16", "leaf-spine-16", "dual-plane-16", "pyramid-1024", "dual-plane-1024-servers"):
        entropy = plan_entropy(PathTable(topofile.load(name)))
        for channels in (1, 2, 3, 4):
            src, dst = rng.integers(0, 1024, 500), rng.integers(0, 1024, 500)
            channel = rng.integers(0, channels, 500)
            arrays = planned_sports(entropy, src, dst, channel, channels).tolist()
            assert arrays == [pair_sport(entropy, int(a), int(b), int(c), channels)
                              for a, b, c in zip(src, dst, channel)], (name, channels)


def shifted_hops(name, senders, shift, channels=2):
    """(switch, next switch) -> connections of the pairs (s, s + shift) for s in `senders` (host indexes),
    on the adaptive policy's paths under default weights."""
    fab = topofile.load(name)
    policy = load_policy("adaptive")(PathTable(fab))
    hosts = [h.name for h in fab.hosts]
    conns = plan_connections(fab, policy.entropy, [(hosts[s], hosts[s + shift]) for s in senders],
                             channels=channels)
    return fab, switch_hops(fab, policy, [c for cs in conns.values() for c in cs]), conns


def test_pipeline_pairs_of_a_leaf_use_every_uplink():
    # dual-plane-1024-servers: leaf 0 of each plane holds hosts 0..31 (servers 0-3); GPU g of server x
    # sends to GPU g of server x + 4 (host s -> s + 32, all on leaf 1). Per plane 32 senders x 2
    # channels = 64 connections over the leaf's 32 uplinks: 2 on each, and 2 on each of the 32
    # downlinks into leaf 1. (The rule before the twist stepped the count by 4 per sender: 16
    # uplinks, 4 on each.) By hand, 32 spines and 2 channels turn over every 16 of the count:
    # h0 -> h32: 0 + 32 + 0 = 32, w = 64 + c, spine c; h16 -> h48: 16 + 48 + 1 (16 // 16 is odd) = 65,
    # w = 130 + c, spine 2 + c (without the twist 128 + c: spine c, on h0's).
    fab, hops, conns = shifted_hops("dual-plane-1024-servers", range(32), 32)
    for plane in "AB":
        up = [n for (u, v), n in hops.items() if u == f"leaf{plane}0"]
        down = [n for (u, v), n in hops.items() if v == f"leaf{plane}1"]
        assert len(up) == len(down) == 32 and set(up) == set(down) == {2}, plane
    policy = load_policy("adaptive")(PathTable(fab))
    spine = {pair: [policy.path(c.src, c.dst, c.sport)[2] for c in cs if c.plane == "A"]
             for pair, cs in conns.items()}
    assert spine[("h0", "h32")] == ["spineA0", "spineA1"]
    assert spine[("h16", "h48")] == ["spineA2", "spineA3"]


def test_a_pods_pipeline_pairs_use_every_uplink_of_both_tiers():
    # pyramid-1024-servers: pod 0 holds hosts 0..255 (ToRs 0-7, 4 aggregation switches, each linked to
    # all 8 cores). Host s sends to s + 256 (pod 1): 256 x 2 = 512 connections. Out of each ToR 64
    # over its 4 uplinks: 16 each; out of the pod over its 4 x 8 = 32 aggregation-to-core links: 16
    # each. (The rule before the twist took 2 of a ToR's 4 uplinks, 32 on each, and 16 of the pod's 32
    # core links.)
    fab, hops, _ = shifted_hops("pyramid-1024-servers", range(256), 256)
    role = {s.name: s.role for s in fab.switches}
    tors = {p.switch for h in fab.hosts[:256] for p in fab.nics_of[h.name]}
    aggs = {adj.peer for t in tors for adj in fab.adjacency[t] if role.get(adj.peer) == "agg"}
    tor_up = [n for (u, v), n in hops.items() if u in tors]
    agg_up = [n for (u, v), n in hops.items() if u in aggs and role[v] == "core"]
    assert len(tors) == 8 and len(aggs) == 4
    assert len(tor_up) == 32 and set(tor_up) == {16}
    assert len(agg_up) == 32 and set(agg_up) == {16}
