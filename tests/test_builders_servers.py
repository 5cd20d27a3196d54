"""Servers and rails in the builders, topology files and `topo show`: wiring worked out by hand."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fabric import topofile
from fabric.analysis import bisection_gbps, edge_order, rails, summarize
from fabric.builders import build, dual_plane, leaf_spine, pyramid
from fabric.errors import TopologyError

ROOT = Path(__file__).resolve().parent.parent

# 4 servers x 4 GPUs, 2 servers per rail group (hosts_per_leaf 2): 2 rail groups x 4 rails = 8 edge switches.
# GPU g of server s -> edge (s // 2) * 4 + g:
#   server 0 = h0..h3   -> 0, 1, 2, 3     server 1 = h4..h7   -> 0, 1, 2, 3
#   server 2 = h8..h11  -> 4, 5, 6, 7     server 3 = h12..h15 -> 4, 5, 6, 7
RAIL_EDGE = {"h0": 0, "h1": 1, "h2": 2, "h3": 3, "h4": 0, "h5": 1, "h6": 2, "h7": 3,
             "h8": 4, "h9": 5, "h10": 6, "h11": 7, "h12": 4, "h13": 5, "h14": 6, "h15": 7}
SMALL_RAIL = dict(hosts=16, gpus_per_server=4, nvlink_gbps=3600, wiring="rail")


def host_switches(fab):
    """host -> {plane: the switch its NIC in that plane links to}, read from the links."""
    out: dict[str, dict[str, str]] = {}
    for link in fab.links:
        for h, s in ((link.a.node, link.b.node), (link.b.node, link.a.node)):
            if h in fab.host_by_name:
                out.setdefault(h, {})[fab.switch_by_name[s].plane] = s
    return out


def test_dual_plane_rail_wiring_puts_gpu_g_on_rail_g_in_both_planes():
    fab = dual_plane(hosts_per_leaf=2, spines_per_plane=2, nic_rate_gbps=200, **SMALL_RAIL)
    assert fab.name == "dual-plane-16-rail"
    assert host_switches(fab) == {h: {"A": f"leafA{e}", "B": f"leafB{e}"} for h, e in RAIL_EDGE.items()}
    # every leaf still has hosts_per_leaf = 2 hosts; leaf uplinks as with server wiring: 2 x 200G / 2 spines
    assert sorted(a.peer for a in fab.adjacency["leafA5"] if a.peer.startswith("h")) == ["h13", "h9"]
    assert {a.rate_gbps for a in fab.adjacency["leafA5"] if a.peer.startswith("spine")} == {200.0}
    assert (fab.gpus_per_server, fab.servers, fab.nvlink_gbps, fab.nvlink_bps) == (4, 4, 3600.0, 3600e9)
    assert rails(fab) == 4


def test_pyramid_rail_wiring_on_tors_and_pods():
    fab = pyramid(hosts_per_tor=2, tors_per_pod=2, aggs_per_pod=2, cores=2, **SMALL_RAIL)
    assert host_switches(fab) == {h: {"A": f"tor{e}"} for h, e in RAIL_EDGE.items()}
    # 8 ToRs in 4 pods of 2: ToRs 0, 1 (rails 0, 1 of group 0) under agg0 and agg1
    assert sorted(a.peer for a in fab.adjacency["tor1"] if a.peer.startswith("agg")) == ["agg0", "agg1"]
    assert rails(fab) == 4


def test_leaf_spine_rail_wiring():
    fab = leaf_spine(hosts_per_leaf=2, spines=2, **SMALL_RAIL)
    assert host_switches(fab) == {h: {"A": f"leafA{e}"} for h, e in RAIL_EDGE.items()}


def test_same_server_pairs():
    fab = dual_plane(hosts_per_leaf=2, **SMALL_RAIL)
    assert fab.server_hosts(1) == ("h4", "h5", "h6", "h7")
    assert fab.same_server("h0", "h3") and fab.same_server("h12", "h15")
    assert not fab.same_server("h3", "h4")
    assert (fab.server_of("h6"), fab.gpu_of("h6")) == (1, 2)
    # same rail, different servers: one leaf hop apart, not NVLink
    assert fab.nic("h1", "A").switch == fab.nic("h5", "A").switch == "leafA1"


def test_server_wiring_is_the_wiring_without_servers():
    with_servers = dual_plane(hosts=16, hosts_per_leaf=4, gpus_per_server=4, nvlink_gbps=3600)
    without = dual_plane(hosts=16, hosts_per_leaf=4)
    assert with_servers.links == without.links and with_servers.switches == without.switches
    assert with_servers.name == without.name == "dual-plane-16"
    # host k on leaf k // 4: a server's 4 GPUs share a leaf
    assert {h: s["A"] for h, s in host_switches(with_servers).items()} == {f"h{k}": f"leafA{k // 4}" for k in range(16)}
    assert rails(with_servers) == 0 and rails(without) == 0
    p = pyramid(hosts=16, hosts_per_tor=4, gpus_per_server=2, nvlink_gbps=100)
    assert p.links == pyramid(hosts=16, hosts_per_tor=4).links


@pytest.mark.parametrize("builder, params, needle", [
    ("dual_plane", dict(hosts=16, hosts_per_leaf=2, wiring="rail"), r"wiring='rail' needs .*gpus_per_server > 1"),
    ("dual_plane", dict(hosts=18, hosts_per_leaf=2, gpus_per_server=4, nvlink_gbps=1, wiring="rail"),
     r"hosts \(18\) must be a multiple of gpus_per_server \(4\)"),
    ("dual_plane", dict(hosts=24, hosts_per_leaf=4, gpus_per_server=4, nvlink_gbps=1, wiring="rail"),
     r"hosts \(24\) must be a multiple of hosts_per_leaf x gpus_per_server \(4 x 4 = 16\)"),
    ("pyramid", dict(hosts=24, hosts_per_tor=4, tors_per_pod=2, gpus_per_server=4, nvlink_gbps=1, wiring="rail"),
     r"hosts_per_tor x gpus_per_server"),
    ("pyramid", dict(hosts=16, hosts_per_tor=2, tors_per_pod=3, gpus_per_server=4, nvlink_gbps=1, wiring="rail"),
     r"ToRs \(8\) must be a multiple of tors_per_pod \(3\)"),
    ("leaf_spine", dict(hosts=16, hosts_per_leaf=4, wiring="ring"), "wiring must be one of 'server', 'rail'"),
    ("dual_plane", dict(hosts=16, hosts_per_leaf=2, gpus_per_server=4, nvlink_gbps=1),
     r"wiring='server' .*hosts_per_leaf \(2\) must be a multiple of gpus_per_server \(4\)"),
    ("dual_plane", dict(hosts=16, hosts_per_leaf=4, gpus_per_server=0), "gpus_per_server must be an integer >= 1"),
    ("dual_plane", dict(hosts=16, hosts_per_leaf=4, gpus_per_server=4, wiring="rail"), r"nvlink_gbps > 0"),
])
def test_bad_server_parameters_are_named(builder, params, needle):
    with pytest.raises(TopologyError, match=needle):
        build(builder, params)


def test_rails_needs_one_gpu_index_per_switch():
    text = """
name: mixed
gpus_per_server: 2
nvlink_gbps: 100
planes: [A]
switches: [{name: l0, role: leaf, plane: A}, {name: l1, role: leaf, plane: A}, {name: s0, role: spine, plane: A}]
hosts: [h0, h1, h2, h3]
links:
  - {a: l0, b: s0, rate_gbps: 100}
  - {a: l1, b: s0, rate_gbps: 100}
  - {a: h0, b: l0, rate_gbps: 100}
  - {a: h1, b: l1, rate_gbps: 100}
  - {a: h2, b: l0, rate_gbps: 100}
  - {a: h3, b: l1, rate_gbps: 100}
"""
    fab = topofile.loads(text)
    # l0 holds h0 (GPU 0 of server 0) and h2 (GPU 0 of server 1): one rail per switch -> 2 rails
    assert (fab.servers, rails(fab)) == (2, 2)
    swapped = topofile.loads(text.replace("{a: h2, b: l0", "{a: h2, b: l1").replace("{a: h3, b: l1", "{a: h3, b: l0"))
    # now l0 holds h0 (GPU 0) and h3 (GPU 1): not rail-wired
    assert rails(swapped) == 0


def test_explicit_form_servers_round_trip():
    fab = dual_plane(hosts_per_leaf=2, **SMALL_RAIL)
    data = topofile.to_dict(fab)
    assert (data["gpus_per_server"], data["nvlink_gbps"]) == (4, 3600.0)
    again = topofile.loads(topofile.dumps(fab))
    assert again == fab and again.gpus_per_server == 4 and rails(again) == 4
    plain = topofile.to_dict(dual_plane())
    assert "gpus_per_server" not in plain and "nvlink_gbps" not in plain


def test_explicit_form_checks_servers():
    text = topofile.dumps(dual_plane(hosts=8, hosts_per_leaf=4)).replace("name: dual-plane-8",
                                                                           "name: x\ngpus_per_server: 3\nnvlink_gbps: 10")
    with pytest.raises(TopologyError, match="8 hosts are not a whole number of servers of 3 GPUs"):
        topofile.loads(text)


def test_shipped_rail_files():
    dp = topofile.load("dual-plane-1024-rail")
    # per plane 32 leaves + 32 spines; links per plane 32 x 32 + 1024 hosts
    assert (len(dp.hosts), len(dp.switches), len(dp.links)) == (1024, 2 * 64, 2 * (32 * 32 + 1024))
    assert (dp.servers, dp.gpus_per_server, dp.nvlink_gbps, rails(dp)) == (128, 8, 3600.0, 8)
    assert dp.host_bandwidth_gbps("h0") == 2 * 200
    # server 33 (rail group 1), GPU 5 -> leaf 1 * 8 + 5 = 13
    assert dp.nic(f"h{33 * 8 + 5}", "B").switch == "leafB13"
    py = topofile.load("pyramid-1024-rail")
    # 8 cores + 4 pods x 4 aggs + 32 ToRs; links 16 x 8 + 32 x 4 + 1024
    assert (len(py.switches), len(py.links)) == (8 + 16 + 32, 16 * 8 + 32 * 4 + 1024)
    assert (py.servers, rails(py), py.host_bandwidth_gbps("h0")) == (128, 8, 400)
    # the same switches and rates as pyramid-1024, only the host links rewired
    plain = topofile.load("pyramid-1024")
    assert py.switches == plain.switches
    assert sorted(l.rate_gbps for l in py.links) == sorted(l.rate_gbps for l in plain.links)
    for name, edge in (("dual-plane-16-rail", "leafA"), ("pyramid-16-rail", "tor")):
        fab = topofile.load(name)
        assert (fab.name, fab.servers, fab.gpus_per_server, fab.nvlink_gbps) == (name, 4, 4, 3600.0)
        # one rail group of 4 servers: GPU g on edge switch g
        assert {h: s["A"] for h, s in host_switches(fab).items()} == {f"h{k}": f"{edge}{k % 4}" for k in range(16)}


def test_pyramid_16_rail_bisection_separates_pods():
    fab = topofile.load("pyramid-16-rail")
    # edge order: ToR 0 (h0, h4, h8, h12), ToR 1 (h1, h5, ...), ...: the first half is pod 0 (rails 0, 1)
    assert edge_order(fab)[:8] == ["h0", "h4", "h8", "h12", "h1", "h5", "h9", "h13"]
    # pod 0 leaves through 2 aggs x 2 cores; agg uplink = 2 ToRs x (4 x 400G / 2:1 / 2 aggs) / 2 cores = 400G
    assert bisection_gbps(fab) == 2 * 2 * 400
    assert summarize(fab).bisection_ratio == 1600 / (8 * 400)


def test_scaled_rail_fabric():
    f = topofile.scaled("dual-plane-1024-rail", 128)
    assert f.name == "dual-plane-128-rail"
    # 16 servers, fewer than a rail group of 32: hosts_per_leaf becomes 16, 8 leaves per plane (one per rail)
    assert (f.servers, rails(f), len(f.switches_in("A"))) == (16, 8, 8 + 32)
    assert {h: s["A"] for h, s in host_switches(f).items()} == {f"h{k}": f"leafA{k % 8}" for k in range(128)}
    p = topofile.scaled("pyramid-1024-rail", 512)
    # 64 servers: 2 rail groups of 32 keep hosts_per_tor 32; 16 ToRs in 2 pods of 8
    assert p.name == "pyramid-512-rail" and sum(s.role == "tor" for s in p.switches) == 16
    assert sum(s.role == "agg" for s in p.switches) == 2 * 4
    assert p.nic(f"h{40 * 8 + 3}", "A").switch == "tor11"  # server 40 is in group 1: ToR 1 x 8 + 3
    small = topofile.scaled("pyramid-1024-rail", 16)  # 2 servers: 8 ToRs of 2, one pod
    assert (small.servers, rails(small), sum(s.role == "tor" for s in small.switches)) == (2, 8, 8)
    with pytest.raises(TopologyError, match="100 hosts are not a whole number of servers of 8 GPUs"):
        topofile.scaled("dual-plane-1024-rail", 100)
    with pytest.raises(TopologyError, match="hosts_per_leaf x gpus_per_server"):
        topofile.scaled("dual-plane-1024-rail", 384)  # 48 servers: not whole rail groups of 32
    assert topofile.scaled("dual-plane-1024", 128).name == "dual-plane-128"


def run_cli(*args):
    res = subprocess.run([sys.executable, "-m", "fabriclab.cli", *args], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


def rows_of(out):
    """label -> value of a one-fabric `topo show` (columns are separated by two spaces or more)."""
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines())


def test_topo_show_says_servers_and_rails(tmp_path: Path):
    out = run_cli("topo", "show", "dual-plane-16-rail")
    rows = rows_of(out)
    assert rows["servers"] == "4" and rows["GPUs per server"] == "4" and rows["rails"] == "4"
    assert rows["NVLink per GPU, each way (Gbit/s)"] == "3600"
    data = json.loads(run_cli("topo", "show", "pyramid-16-rail", "--json"))
    assert (data["servers"], data["gpus_per_server"], data["rails"], data["nvlink_gbps"]) == (4, 4, 4, 3600)
    server_wired = tmp_path / "sw.yaml"
    server_wired.write_text("name: sw\nbuilder: dual_plane\n"
                            "params: {hosts: 16, hosts_per_leaf: 4, gpus_per_server: 4, nvlink_gbps: 3600}\n")
    rows = rows_of(run_cli("topo", "show", str(server_wired)))
    assert rows["rails"] == "no rail wiring" and rows["servers"] == "4"
    assert "servers" not in run_cli("topo", "show", "dual-plane-16")  # no servers: the output as before
