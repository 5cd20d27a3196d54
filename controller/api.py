"""REST API and Prometheus metrics, served on 127.0.0.1 by default, from a background thread of the
controller process. It reads only `controller.state.ControllerState` (a narrow interface).

    GET /api/status                      switches connected and synced, routing
    GET /api/topology                    the model (explicit topology form)
    GET /api/links                       every directed link: up/down, capacity_bps, rate_bps, utilisation, hot,
                                         gray (losing probes; then not up), probes_lost/probes_sent
    GET /api/paths?src=h0&dst=h5[&sport=N][&offset=0&limit=128]   live paths between two hosts, per plane,
                                         paged (total, next_offset), each with a source port that takes it
    GET /api/events[?limit=N]            the reroute log (one row per slot moved), newest last
    GET /api/ports[?limit=N]             switch port state changes as the controller learnt them (time_s, up)
    GET /api/gray[?limit=N]              gray-failure verdicts: links that turned gray (lost probes) or healed
    GET /api/slots?switch=leafA0         its ECMP slots per destination: next hop, measured rate_bps, pinned
    GET /api/counters                    every switch port's byte counters as last polled (tx_bytes, rx_bytes)
    POST /api/move {switch, dest, slot, port}  put one ECMP slot on a chosen next hop and pin it there
    POST /api/release {switch, dest[, slot]}   give a pinned slot (without slot: all pinned there) back
    GET /metrics                         Prometheus text format
"""
from __future__ import annotations

import threading
from typing import Any, Iterator

from flask import Flask, abort, jsonify, request
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from werkzeug.serving import make_server

from controller.state import ControllerState
from fabric.errors import FabriclabError

#: decision latency buckets, seconds: 1 us .. 10 ms
DECISION_BUCKETS = (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2)
#: /api/paths paging: paths per page unless `limit` says otherwise (every shipped fabric's pairs fit
#: one page: at most 128 paths per plane, on pyramid-1024), and the largest `limit` accepted
PATHS_LIMIT = 128
PATHS_LIMIT_MAX = 1024


class _FabricCollector:
    """Reads the controller's state at scrape time."""

    def __init__(self, state: ControllerState) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        st = self.state
        tx = CounterMetricFamily("fabriclab_port_tx_bytes", "Bytes sent by a switch port", labels=["switch", "port"])
        rx = CounterMetricFamily("fabriclab_port_rx_bytes", "Bytes received by a switch port",
                                 labels=["switch", "port"])
        rate = GaugeMetricFamily("fabriclab_link_rate_bps", "Smoothed egress rate of a directed link, bits/s",
                                 labels=["switch", "port"])
        util = GaugeMetricFamily("fabriclab_link_utilisation", "Egress utilisation of a directed link (0..1)",
                                 labels=["switch", "port"])
        up = GaugeMetricFamily("fabriclab_link_up", "1 if the link is up", labels=["switch", "port"])
        gray = GaugeMetricFamily("fabriclab_link_gray", "1 if the link loses probes (a gray failure)",
                                 labels=["switch", "port"])
        rer = CounterMetricFamily("fabriclab_reroutes", "Slot moves by cause", labels=["cause"])
        synced = GaugeMetricFamily("fabriclab_switches_synced", "Switches connected and synchronised")
        for c in st.port_counters():
            tx.add_metric([c.switch, str(c.port)], c.tx_bytes)
            rx.add_metric([c.switch, str(c.port)], c.rx_bytes)
        for link in st.links():
            labels = [link["switch"], str(link["port"])]
            rate.add_metric(labels, link["rate_bps"])
            util.add_metric(labels, link["utilisation"])
            up.add_metric(labels, 1.0 if link["up"] else 0.0)
            gray.add_metric(labels, 1.0 if link["gray"] else 0.0)
        for cause, n in sorted(st.reroutes().items()):
            rer.add_metric([cause], n)
        synced.add_metric([], st.synced_count())
        yield from (tx, rx, rate, util, up, gray, rer, synced)


def create_app(state: ControllerState) -> tuple[Flask, CollectorRegistry]:
    registry = CollectorRegistry()
    registry.register(_FabricCollector(state))  # type: ignore[arg-type]
    decision = Histogram("fabriclab_decision_seconds", "Reroute decision latency, event in to intents out",
                         registry=registry, buckets=DECISION_BUCKETS)
    state.observe_decisions(lambda us: decision.observe(us / 1e6))
    api = Flask("fabriclab-controller")

    @api.get("/api/status")
    def status() -> Any:
        return jsonify(state.status())

    @api.get("/api/topology")
    def topology() -> Any:
        return jsonify(state.topology())

    @api.get("/api/links")
    def links() -> Any:
        return jsonify(state.links())

    @api.get("/api/paths")
    def paths() -> Any:
        src, dst = request.args.get("src", ""), request.args.get("dst", "")
        if not (state.is_host(src) and state.is_host(dst)) or src == dst:
            abort(400, description=f"give two different hosts of fabric {state.fabric_name!r} as src and dst")
        sport = request.args.get("sport", type=int)
        offset = request.args.get("offset", default=0, type=int)
        limit = request.args.get("limit", default=PATHS_LIMIT, type=int)
        if offset < 0 or not 0 < limit <= PATHS_LIMIT_MAX:
            abort(400, description=f"offset must be >= 0 and limit in 1..{PATHS_LIMIT_MAX}")
        return jsonify(state.paths(src, dst, sport, offset, limit))

    @api.get("/api/events")
    def events() -> Any:
        return jsonify(state.events(request.args.get("limit", default=1000, type=int)))

    @api.get("/api/ports")
    def port_events() -> Any:
        return jsonify(state.port_events(request.args.get("limit", default=1000, type=int)))

    @api.get("/api/congestion")
    def congestion_steps() -> Any:
        return jsonify(state.congestion_steps(request.args.get("limit", default=1000, type=int)))

    @api.get("/api/gray")
    def gray() -> Any:
        return jsonify(state.gray_events(request.args.get("limit", default=1000, type=int)))

    @api.get("/api/slots")
    def slots() -> Any:
        switch = request.args.get("switch", "")
        if not state.is_switch(switch):
            abort(400, description=f"no switch {switch!r} in fabric {state.fabric_name!r}")
        return jsonify(state.slots(switch))

    @api.get("/api/counters")
    def counters() -> Any:
        return jsonify({"ports": [[c.switch, c.port, c.tx_bytes, c.rx_bytes] for c in state.port_counters()]})

    @api.post("/api/move")
    def move() -> Any:
        body = request.get_json(silent=True) or {}
        try:
            switch, dest, slot, port = str(body["switch"]), str(body["dest"]), int(body["slot"]), int(body["port"])
        except (KeyError, TypeError, ValueError):
            abort(400, description="give switch, dest (an edge switch), slot and port")
        try:
            moved = state.move(switch, dest, slot, port)
        except FabriclabError as e:
            abort(400, description=str(e))
        return jsonify({"moved": moved})

    @api.post("/api/release")
    def release() -> Any:
        body = request.get_json(silent=True) or {}
        try:
            switch, dest = str(body["switch"]), str(body["dest"])
            slot = None if body.get("slot") is None else int(body["slot"])
        except (KeyError, TypeError, ValueError):
            abort(400, description="give switch, dest (an edge switch) and optionally slot")
        try:
            moved = state.release(switch, dest, slot)
        except FabriclabError as e:
            abort(400, description=str(e))
        return jsonify({"moved": moved})

    @api.get("/metrics")
    def metrics() -> Any:
        return generate_latest(registry), 200, {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    return api, registry


def serve(state: ControllerState, host: str, port: int) -> Any:
    """Start the HTTP server in a daemon thread; returns the server (call `.shutdown()` to stop)."""
    api, _ = create_app(state)
    server = make_server(host, port, api, threaded=True)
    threading.Thread(target=server.serve_forever, name="fabriclab-rest", daemon=True).start()
    return server
