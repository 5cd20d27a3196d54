"""The entropy plan: every combination of slots at every deciding tier has a source port in the
ephemeral range 49152..65535 that lands in exactly those slots (checked exhaustively), and the
smallest such port is found (checked against brute force)."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from fabric import builders, topofile
from fabric.errors import TopologyError
from fabric.routing import PathTable, plan_entropy
from fabric.routing.entropy import smallest_port_at_least

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
