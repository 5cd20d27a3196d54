"""`topo show` figures against hand calculations."""
from __future__ import annotations

from fabric import topofile
from fabric.analysis import bisection_gbps, oversubscription, summarize
from fabric.builders import pyramid


def test_dual_plane_16_summary():
    s = summarize(topofile.load("dual-plane-16"))
    # hosts 0-7 sit on leaves 0-1 of each plane; each leaf has 2 x 400G uplinks:
    # per plane 2 leaves x 800G = 1600G, two planes -> 3200G = 8 hosts x 400G (full bisection)
    assert s.bisection_bandwidth_gbps == 3200
    assert s.bisection_ratio == 1.0
    assert s.host_bandwidth_gbps == 400  # 2 x 200G
    assert s.switches_by_role == {"leaf": 8, "spine": 4}
    assert s.oversubscription == {"leaf": 1.0}
    assert (s.hops_min, s.hops_max, s.ecmp_paths_min, s.ecmp_paths_max) == (2, 4, 2, 4)


def test_pyramid_16_summary():
    s = summarize(topofile.load("pyramid-16"))
    # pod 0 (hosts 0-7) leaves through 2 aggs x 2 cores x 400G = 1600G: half of 8 x 400G
    assert s.bisection_bandwidth_gbps == 1600
    assert s.bisection_ratio == 0.5
    assert s.oversubscription == {"tor": 2.0, "agg": 1.0}
    assert s.host_bandwidth_gbps == 400


def test_core_oversubscription_shrinks_bisection():
    # ToR 1:1, aggregation 4:1: each pod's 4 x 400G of hosts leave through 400G of core links
    fab = pyramid(hosts=8, hosts_per_tor=2, tors_per_pod=2, aggs_per_pod=2, cores=2,
                  nic_rate_gbps=400, oversubscription=1.0, core_oversubscription=4.0)
    assert bisection_gbps(fab) == 400
    assert oversubscription(fab) == {"tor": 1.0, "agg": 4.0}
