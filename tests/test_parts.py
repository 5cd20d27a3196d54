"""The parts of a fabric (`fabric.parts`): switches by radix, switch ports, optics and links by tier, and
their cost, counted by hand in the comments for two small designs."""
from __future__ import annotations

import pytest

from fabric.builders import dual_plane, pyramid
from fabric.parts import DEFAULT_PRICES, PartsError, bill, cost, lanes, prices_from


def _lines(b):
    return {(p.kind, p.tier, p.size): p.count for p in b.parts}


def test_a_small_pyramids_parts_by_hand():
    # 16 hosts of 400G, 4 per ToR: 4 ToRs in 2 pods of 2, 2 aggregation switches per pod (4), 2 cores.
    # ToR uplinks: 4 x 400 / 2 (2:1) = 800 Gbit/s over 2 aggs = 400 per link: one 400G port.
    # Aggregation uplinks: 2 ToRs x 400 / 1 (1:1) = 800 over 2 cores = 400 per link: one port.
    fab = pyramid(hosts=16, hosts_per_tor=4, tors_per_pod=2, aggs_per_pod=2, cores=2, nic_rate_gbps=400,
                  oversubscription=2.0, core_oversubscription=1.0)
    b = bill(fab)
    assert b.port_gbps == 400  # the NIC's rate by default
    got = _lines(b)
    # radix: a ToR has 4 host ports + 2 uplinks; an agg 2 ToRs + 2 cores; a core 4 aggs
    assert {k: v for k, v in got.items() if k[0] == "switch"} == {
        ("switch", "tor", 6): 4, ("switch", "agg", 4): 4, ("switch", "core", 4): 2}
    # links: 16 host links, 4 ToRs x 2 aggs = 8, 4 aggs x 2 cores = 8; a switch port per switch end
    assert b.by_tier("link") == {"host-tor": 16, "tor-agg": 8, "agg-core": 8}
    assert b.by_tier("switch_port") == {"host-tor": 16, "tor-agg": 16, "agg-core": 16}
    # two optics a link, the NIC's end included
    assert b.by_tier("optic") == {"host-tor": 32, "tor-agg": 16, "agg-core": 16}
    assert b.total("nic_port") == 16 and b.rounded_up_gbps == 0
    # default prices: 1 a switch port (48) and 1 an optic (64)
    assert sum(cost(b).values()) == 48 + 64 == 112
    # custom: 6-port switches 10, others 8; ports 2; 400G optics 3; links 0.5; NIC ports 1
    prices = prices_from({"unit": "kUSD", "switch": {"6": 10, "default": 8}, "switch_port": 2, "optic": {"400": 3},
                          "link": 0.5, "nic_port": 1})
    c = cost(b, prices)
    assert c == {"switch": 4 * 10 + 4 * 8 + 2 * 8, "switch_port": 48 * 2, "optic": 64 * 3, "link": 32 * 0.5,
                 "nic_port": 16 * 1}
    assert sum(c.values()) == 88 + 96 + 192 + 16 + 16 == 408


def test_a_small_dual_planes_parts_by_hand():
    # 8 hosts with 2 x 200G, 4 per leaf: per plane 2 leaves and 2 spines. Leaf uplinks at 2:1:
    # 4 x 200 / 2 = 400 Gbit/s over 2 spines = 200 per link: at 100G ports, 2 physical links each.
    fab = dual_plane(hosts=8, hosts_per_leaf=4, spines_per_plane=2, nic_rate_gbps=200, oversubscription=2.0)
    b = bill(fab, port_gbps=100)
    got = _lines(b)
    # a leaf: 4 host ports (200G) + 2 spines x 2 = 4 uplink ports (100G) = 8; a spine: 2 leaves x 2 = 4
    assert {k: v for k, v in got.items() if k[0] == "switch"} == {("switch", "leaf", 8): 4, ("switch", "spine", 4): 4}
    # per plane: 8 host links at 200G and 2 x 2 model links x 2 = 8 physical links at 100G; two planes
    assert {k: v for k, v in got.items() if k[0] == "link"} == {("link", "host-leaf", 200): 16,
                                                                ("link", "leaf-spine", 100): 16}
    assert {k: v for k, v in got.items() if k[0] == "switch_port"} == {("switch_port", "host-leaf", 200): 16,
                                                                       ("switch_port", "leaf-spine", 100): 32}
    assert {k: v for k, v in got.items() if k[0] == "optic"} == {("optic", "host-leaf", 200): 32,
                                                                 ("optic", "leaf-spine", 100): 32}
    assert b.total("nic_port") == 16  # two NIC ports a GPU
    assert sum(cost(b).values()) == 48 + 64
    # optics priced by speed: 32 x 2 + 32 x 1; ports 1 each (48)
    assert sum(cost(b, prices_from({"optic": {"200": 2, "100": 1}})).values()) == 48 + 64 + 32
    # at 150G ports each 200G link takes 2 ports (300G): 100 Gbit/s more than the model, 8 model links
    assert bill(fab, port_gbps=150).rounded_up_gbps == pytest.approx(800)


def test_lanes_round_up_but_not_float_noise():
    assert lanes(800, 400) == 2
    assert lanes(800.0000000001, 400) == 2
    assert lanes(801, 400) == 3
    assert lanes(100, 400) == 1


@pytest.mark.parametrize("data, needle", [
    ({"optics": 1}, "optics"),
    ({"optic": -1}, "optic"),
    ({"switch": {"sixty-four": 3}}, "switch"),
    ([1, 2], "expected a mapping"),
])
def test_bad_prices_are_refused_naming_the_kind(data, needle):
    with pytest.raises(PartsError, match=needle):
        prices_from(data)


def test_a_size_without_a_price_is_named():
    fab = dual_plane(hosts=8, hosts_per_leaf=4, spines_per_plane=2, nic_rate_gbps=200)
    with pytest.raises(PartsError, match="optic has no price for 200 Gbit/s"):
        cost(bill(fab), prices_from({"optic": {"400": 1}}))
    assert DEFAULT_PRICES.unit == "units"
