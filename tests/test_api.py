"""REST API and Prometheus metrics, through Flask's test client on a real controller core."""
from __future__ import annotations

import threading

import pytest

from controller.api import create_app
from controller.core import ControllerCore
from controller.state import ControllerState
from controller.sync import DatapathSync
from fabric import topofile


class _Ctl:
    """What the os-ken app gives the state view: switch sessions (all synced here), a lock, a sender."""

    def __init__(self, core):
        self.sessions = {s.dpid: DatapathSync(core, s.dpid, state="synced") for s in core.fabric.switches}
        self.lock = threading.RLock()
        self.sent = []

    def send_changes(self, changes):
        self.sent.extend(changes)


def client(routing="adaptive", with_ctl=False, topo="dual-plane-16"):
    core = ControllerCore(topofile.load(topo), routing, rate_scale=1e-4)
    ctl = _Ctl(core)
    api, _ = create_app(ControllerState(core, ctl.sessions, ctl.lock, ctl.send_changes))
    return (core, api.test_client(), ctl) if with_ctl else (core, api.test_client())


def test_paths_follow_the_documented_entropy_rule():
    _, c = client()
    # source port 49152 + 2 * 3: slot 3 -> uplink (3 mod 2) + 1 = port 2 -> spine 1, in both planes
    body = c.get("/api/paths?src=h0&dst=h15&sport=49158").get_json()
    assert [p["paths"] for p in body] == [[["h0", "leafA0", "spineA1", "leafA3", "h15"]],
                                          [["h0", "leafB0", "spineB1", "leafB3", "h15"]]]
    every = c.get("/api/paths?src=h0&dst=h15").get_json()
    assert sorted(p[2] for p in every[0]["paths"]) == ["spineA0", "spineA1"]
    assert c.get("/api/paths?src=h0&dst=h99").status_code == 400


def test_status_topology_links_and_events():
    core, c = client()
    status = c.get("/api/status").get_json()
    assert status["routing"] == "adaptive" and len(status["synced"]) == 12
    assert len(c.get("/api/topology").get_json()["hosts"]) == 16
    links = c.get("/api/links").get_json()
    # every switch port is a directed link: 8 leaves x (2 uplinks + 4 hosts) + 4 spines x 4 leaves = 64
    assert len(links) == 64 and all(l["up"] for l in links)
    core.on_port_status(core.fabric.switch_by_name["spineA0"].dpid, 4, False, 100.0)  # spineA0 -> leafA3 down
    links = {(l["switch"], l["port"]): l for l in c.get("/api/links").get_json()}
    assert not links[("spineA0", 4)]["up"] and not links[("leafA3", 1)]["up"]
    events = c.get("/api/events").get_json()
    assert {e["cause"] for e in events} == {"failure"}
    assert {(e["switch"], e["dest"]) for e in events} >= {("leafA0", "leafA3"), ("leafA3", "leafA0")}


def test_port_changes_and_gray_verdicts_are_listed_and_a_gray_link_is_not_up():
    core, c = client()
    spine = core.fabric.switch_by_name["spineA0"].dpid
    core.on_port_status(spine, 3, True, 99.0)  # as a port-desc reply says: no change, not listed
    core.on_port_status(spine, 4, False, 100.0)
    core.on_port_status(spine, 4, True, 101.0)
    assert [(e["switch"], e["port"], e["up"], e["time_s"]) for e in c.get("/api/ports").get_json()] == [
        ("spineA0", 4, False, 100.0), ("spineA0", 4, True, 101.0)]
    # leafA3 counts 6 of 20 probes missing from spineA0:4, twice: gray
    leaf = core.fabric.switch_by_name["leafA3"].dpid
    core.on_probe_counts(leaf, {1: 0}, 101.7)
    for k, arrived in ((1, 14), (2, 28)):
        core.gray.sent("spineA0", (4,), 20)
        core.on_probe_counts(leaf, {1: arrived}, 101.7 + k)
    (verdict,) = c.get("/api/gray").get_json()
    assert (verdict["switch"], verdict["port"], verdict["gray"], verdict["probes_lost"], verdict["probes_sent"]) == (
        "spineA0", 4, True, 6, 20)
    links = {(l["switch"], l["port"]): l for l in c.get("/api/links").get_json()}
    assert links[("spineA0", 4)]["gray"] and not links[("spineA0", 4)]["up"] and not links[("leafA3", 1)]["up"]
    assert (links[("spineA0", 4)]["probes_lost"], links[("spineA0", 4)]["probes_sent"]) == (6, 20)
    assert 'fabriclab_link_gray{port="4",switch="spineA0"} 1.0' in c.get("/metrics").get_data(as_text=True)


def test_congestion_steps_are_listed_newest_last():
    core, c = client()
    leaf = core.fabric.switch_by_name["leafA0"].dpid
    # leafA0's uplink 1 (40 Mbit/s, 5 MB/s at 1e-4) over 1/32 s steps at 80%, 95%, 100%: smoothed
    # (weight 0.5) 32, 35 and 37.5 Mbit/s, i.e. warm (>= 0.7) at the first, hot (>= 0.9) at the third
    step_s, n = 1 / 32, 0
    core.on_port_counters(leaf, {1: (0, 0, 1.0)})
    for i, share in enumerate((0.8, 0.95, 1.0), start=1):
        n += int(5e6 * step_s * share)
        core.on_loads(core.on_port_counters(leaf, {1: (n, 0, 1.0 + i * step_s)}), 1.0 + i * step_s)
    rows = c.get("/api/congestion").get_json()
    assert [(r["step"], r["switch"], r["port"], r["time_s"]) for r in rows] == [
        ("warm", "leafA0", 1, 1.03125), ("hot", "leafA0", 1, 1.09375)]
    assert [r["step"] for r in c.get("/api/congestion?limit=1").get_json()] == ["hot"]


def test_metrics_expose_ports_utilisation_reroutes_and_decision_latency():
    core, c = client()
    dpid = core.fabric.switch_by_name["leafA0"].dpid
    core.on_port_counters(dpid, {1: (1000, 500, 1.0)})
    core.on_port_status(core.fabric.switch_by_name["spineA0"].dpid, 4, False, 100.0)
    text = c.get("/metrics").get_data(as_text=True)
    assert 'fabriclab_port_tx_bytes_total{port="1",switch="leafA0"} 1000.0' in text
    assert 'fabriclab_link_up{port="4",switch="spineA0"} 0.0' in text
    n_failures = core.policy.reroutes()["failure"]
    assert n_failures > 0 and f'fabriclab_reroutes_total{{cause="failure"}} {float(n_failures)}' in text
    assert "fabriclab_decision_seconds_count 1.0" in text
    assert "fabriclab_link_utilisation{" in text


def test_manual_move_changes_the_slot_and_sends_flow_mods():
    core, c, ctl = client(with_ctl=True)
    r = c.post("/api/move", json={"switch": "leafA0", "dest": "leafA3", "slot": 0, "port": 2})
    assert r.status_code == 200 and r.get_json() == {"moved": True}
    # slot 0 = source port 49152: now via port 2 (spineA1)
    path = c.get("/api/paths?src=h0&dst=h15&sport=49152").get_json()[0]["paths"][0]
    assert path[2] == "spineA1"
    assert [f.match for ch in ctl.sent for f in ch.flows_modify][0][0] == ("metadata", core.dest_id["leafA3"])
    assert c.get("/api/events").get_json()[-1]["cause"] == "manual"
    bad = c.post("/api/move", json={"switch": "leafA0", "dest": "leafA3", "slot": 0, "port": 7})
    assert bad.status_code == 400 and b"port 7 of leafA0 is not a live next hop" in bad.data
    assert c.post("/api/move", json={"switch": "leafA0"}).status_code == 400


def _link_down(core, switch, port, now=100.0):
    """Both ends of the link at (switch, port) report it down."""
    peer, peer_port = core.table.peer(switch, port)
    for sw, p in ((switch, port), (peer, peer_port)):
        core.on_port_status(core.fabric.switch_by_name[sw].dpid, p, False, now)


def _pyramid_1024_path(sport):
    """h0 -> h1023 on pyramid-1024 by hand: h0 on tor0 (pod 0: agg0..3), h1023 on tor31 (pod 3:
    agg12..15), 8 cores. ToR ports 1..4 go to the pod's aggs, agg ports 1..8 to the cores, and core
    ports 1..16 to agg0..15 (ports 13..16 are pod 3's); each tier's 4-bit slot field (bits 1-4, 5-8,
    9-12) takes the (slot mod k)-th of its k equal-cost ports."""
    a = ((sport >> 1) & 15) % 4
    c = ((sport >> 5) & 15) % 8
    b = 12 + ((sport >> 9) & 15) % 4
    return ["h0", "tor0", f"agg{a}", f"core{c}", f"agg{b}", "tor31", "h1023"]


@pytest.mark.parametrize("routing", ["adaptive", "ecmp"])
def test_every_path_of_a_pyramid_1024_pair_is_reachable_through_pages_and_a_down_link_removes_its(routing):
    core, c = client(routing, topo="pyramid-1024")
    every = {("h0", "tor0", f"agg{a}", f"core{k}", f"agg{b}", "tor31", "h1023")
             for a in range(4) for k in range(8) for b in range(12, 16)}
    assert len(every) == 128

    def pages(limit):
        got, offset, n_pages = [], 0, 0
        while offset is not None:
            (plane,) = c.get(f"/api/paths?src=h0&dst=h1023&offset={offset}&limit={limit}").get_json()
            assert plane["offset"] == offset and len(plane["paths"]) <= limit
            got += list(zip(plane["paths"], plane["src_ports"]))
            offset, n_pages = plane["next_offset"], n_pages + 1
        return plane["total"], n_pages, got

    total, n_pages, got = pages(50)
    assert (total, n_pages, len(got)) == (128, 3, 128)
    assert {tuple(p) for p, _ in got} == every
    assert all(p == _pyramid_1024_path(sp) and 49152 <= sp < 65536 for p, sp in got)
    # the default page holds them all
    (plane,) = c.get("/api/paths?src=h0&dst=h1023").get_json()
    assert (plane["total"], plane["next_offset"], len(plane["paths"])) == (128, None, 128)
    # core3 -- agg13 goes down (core3's port 14 = agg13): the 4 paths through it are gone
    _link_down(core, "core3", 14)
    total, _, got = pages(50)
    assert total == 124 and {tuple(p) for p, _ in got} == {p for p in every if p[3:5] != ("core3", "agg13")}
    assert c.get("/api/paths?src=h0&dst=h1023&limit=2000").status_code == 400


def test_paths_show_what_the_switches_do_under_a_remote_failure():
    # ecmp does not react: with spineA0's link to leafA3 down, leafA0's slots on spineA0 black-hole,
    # so h0 -> h15 has one live path in plane A; a source port of a dead slot has none
    core, c = client("ecmp")
    _link_down(core, "spineA0", 4)
    body = c.get("/api/paths?src=h0&dst=h15").get_json()
    assert [(p["plane"], p["total"], p["paths"]) for p in body] == [
        ("A", 1, [["h0", "leafA0", "spineA1", "leafA3", "h15"]]),
        ("B", 2, [["h0", "leafB0", "spineB0", "leafB3", "h15"], ["h0", "leafB0", "spineB1", "leafB3", "h15"]])]
    assert c.get("/api/paths?src=h0&dst=h15&sport=49152").get_json()[0]["paths"] == []  # slot 0: spineA0
    # and a move shows: every slot of leafB0 towards leafB3 onto spineB1
    for slot in range(0, 16, 2):
        core.on_manual_move("leafB0", "leafB3", slot, 2, 101.0)
    assert c.get("/api/paths?src=h0&dst=h15").get_json()[1]["paths"] == [["h0", "leafB0", "spineB1", "leafB3", "h15"]]


def test_a_moved_slot_stays_pinned_until_released():
    core, c, ctl = client(with_ctl=True)
    assert c.post("/api/move", json={"switch": "leafA0", "dest": "leafA3", "slot": 0, "port": 2}).get_json() == {
        "moved": True}
    rows = c.get("/api/slots?switch=leafA0").get_json()["leafA3"]
    assert [(r["port"], r["pinned"]) for r in rows[:3]] == [(2, True), (2, False), (1, False)]
    core.on_port_status(core.fabric.switch_by_name["spineA0"].dpid, 4, False, 100.0)
    core.on_port_status(core.fabric.switch_by_name["spineA0"].dpid, 4, True, 101.0)
    assert c.get("/api/paths?src=h0&dst=h15&sport=49152").get_json()[0]["paths"][0][2] == "spineA1"
    r = c.post("/api/release", json={"switch": "leafA0", "dest": "leafA3", "slot": 0})
    assert r.status_code == 200 and r.get_json() == {"moved": True}
    assert c.get("/api/paths?src=h0&dst=h15&sport=49152").get_json()[0]["paths"][0][2] == "spineA0"
    assert not c.get("/api/slots?switch=leafA0").get_json()["leafA3"][0]["pinned"]
    bad = c.post("/api/release", json={"switch": "leafA0", "dest": "leafA3", "slot": 0})
    assert bad.status_code == 400 and b"not pinned" in bad.data
    assert c.post("/api/release", json={"switch": "leafA0"}).status_code == 400
    assert c.get("/api/events").get_json()[-1]["trigger"] == "operator release"
