"""REST API (Flask) and Prometheus metrics (prometheus_client) for the running controller.

Served on 127.0.0.1 by default, from a background thread of the controller process:

    GET /api/status                      switches connected and synced, mode
    GET /api/topology                    the model (explicit topology form)
    GET /api/links                       every directed link: up/down, egress rate, utilisation, hot
    GET /api/paths?src=h0&dst=h5[&sport=N]  current paths between two hosts, per plane
    GET /api/events[?limit=N]            the reroute event log, newest last
    GET /api/slots?switch=leafA0         its ECMP slots per destination: next hop and measured rate
    POST /api/move {switch, dest, slot, port}  put one ECMP slot on a chosen next hop (planned move)
    GET /metrics                         Prometheus text format
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

from flask import Flask, abort, jsonify, request
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from werkzeug.serving import make_server

from fabric import topofile
from fabric.errors import FabriclabError

if TYPE_CHECKING:
    from controller.app import FabricController

#: decision latency buckets, seconds: 1 us .. 10 ms
DECISION_BUCKETS = (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2)


class _FabricCollector:
    """Reads the controller's state at scrape time."""

    def __init__(self, app: FabricController) -> None:
        self.app = app

    def collect(self) -> Iterator[Any]:
        core = self.app.core
        tx = CounterMetricFamily("fabriclab_port_tx_bytes", "Bytes sent by a switch port", labels=["switch", "port"])
        rx = CounterMetricFamily("fabriclab_port_rx_bytes", "Bytes received by a switch port",
                                 labels=["switch", "port"])
        util = GaugeMetricFamily("fabriclab_link_utilisation", "Egress utilisation of a directed link (0..1)",
                                 labels=["switch", "port"])
        up = GaugeMetricFamily("fabriclab_link_up", "1 if the link is up", labels=["switch", "port"])
        rer = CounterMetricFamily("fabriclab_reroutes", "Slot moves by cause", labels=["cause"])
        synced = GaugeMetricFamily("fabriclab_switches_synced", "Switches connected and synchronised")
        with self.app.lock:
            for (sw, port), (t, r) in sorted(core.port_bytes.items()):
                tx.add_metric([sw, str(port)], t)
                rx.add_metric([sw, str(port)], r)
            for link in sorted(core.router.capacity_bps):
                util.add_metric([link[0], str(link[1])], core.router.utilisation(link))
                up.add_metric([link[0], str(link[1])], 0.0 if link in core.router.down else 1.0)
            for cause, n in sorted(core.reroutes.items()):
                rer.add_metric([cause], n)
            synced.add_metric([], len(self.app.synced))
        yield from (tx, rx, util, up, rer, synced)


def create_app(ctl: FabricController) -> tuple[Flask, CollectorRegistry]:
    registry = CollectorRegistry()
    registry.register(_FabricCollector(ctl))  # type: ignore[arg-type]
    decision = Histogram("fabriclab_decision_seconds", "Reroute decision latency, event in to messages out",
                         registry=registry, buckets=DECISION_BUCKETS)
    api = Flask("fabriclab-controller")
    core = ctl.core
    core.decision_observers.append(lambda us: decision.observe(us / 1e6))

    @api.get("/api/status")
    def status() -> Any:
        with ctl.lock:
            return jsonify({
                "fabric": core.fabric.name,
                "mode": core.mode,
                "switches": len(core.fabric.switches),
                "connected": sorted(core.switch_name(d) for d in ctl.dps),
                "synced": sorted(core.switch_name(d) for d in ctl.synced),
                "connects": {core.switch_name(d): n for d, n in ctl.connects.items()},
            })

    @api.get("/api/topology")
    def topology() -> Any:
        return jsonify(topofile.to_dict(core.fabric))

    @api.get("/api/links")
    def links() -> Any:
        r = core.router
        with ctl.lock:
            rows = [{
                "switch": sw, "port": port, "peer": r.table.peer(sw, port)[0], "peer_port": r.table.peer(sw, port)[1],
                "up": (sw, port) not in r.down, "capacity_bps": r.capacity_bps[(sw, port)],
                "rate_bps": r.loads[(sw, port)].rate_bps if (sw, port) in r.loads else 0.0,
                "utilisation": r.utilisation((sw, port)),
                "hot": bool((sw, port) in r.loads and r.loads[(sw, port)].hot),
            } for sw, port in sorted(r.capacity_bps)]
        return jsonify(rows)

    @api.get("/api/paths")
    def paths() -> Any:
        src, dst = request.args.get("src"), request.args.get("dst")
        if src not in core.fabric.host_by_name or dst not in core.fabric.host_by_name or src == dst:
            abort(400, description=f"give two different hosts of fabric {core.fabric.name!r} as src and dst")
        sport = request.args.get("sport", type=int)
        with ctl.lock:
            return jsonify(core.paths(src, dst, sport))

    @api.get("/api/events")
    def events() -> Any:
        limit = request.args.get("limit", default=1000, type=int)
        with ctl.lock:
            rows = [dataclasses.asdict(e) for e in list(core.events)[-limit:]]
        return jsonify(rows)

    @api.get("/api/slots")
    def slots() -> Any:
        switch = request.args.get("switch", "")
        if switch not in core.fabric.switch_by_name:
            abort(400, description=f"no switch {switch!r} in fabric {core.fabric.name!r}")
        with ctl.lock:
            out = {dest: [{"slot": i, "port": port, "rate_bps": ctl.slot_rates.get((switch, dest, i), 0.0)}
                          for i, port in enumerate(ports)]
                   for (sw, dest), ports in sorted(core.router.slots.items()) if sw == switch}
        return jsonify(out)

    @api.post("/api/move")
    def move() -> Any:
        body = request.get_json(silent=True) or {}
        try:
            switch, dest, slot, port = str(body["switch"]), str(body["dest"]), int(body["slot"]), int(body["port"])
        except (KeyError, TypeError, ValueError):
            abort(400, description="give switch, dest (an edge switch), slot and port")
        with ctl.lock:
            try:
                changes = core.on_manual_move(switch, dest, slot, port, time.time())
            except FabriclabError as e:
                abort(400, description=str(e))
            ctl.send_changes(changes)
        return jsonify({"moved": sum(len(c) for c in changes) > 0})

    @api.get("/metrics")
    def metrics() -> Any:
        return generate_latest(registry), 200, {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    return api, registry


def serve(ctl: FabricController, host: str, port: int) -> Any:
    """Start the HTTP server in a daemon thread; returns the server (call `.shutdown()` to stop)."""
    api, _ = create_app(ctl)
    server = make_server(host, port, api, threaded=True)
    threading.Thread(target=server.serve_forever, name="fabriclab-rest", daemon=True).start()
    return server
