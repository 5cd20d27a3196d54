"""REST API and Prometheus metrics, through Flask's test client on a real controller core."""
from __future__ import annotations

import threading

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


def client(routing="adaptive", with_ctl=False):
    core = ControllerCore(topofile.load("dual-plane-16"), routing, rate_scale=1e-4)
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
