"""The os-ken shim: extract primitives from events, call the pure objects (with `now`), send what
they return.

Configured before os-ken instantiates it (`configure()`), because os-ken 4 creates apps itself.
Every handler and the poll loop end the whole controller process loudly (exit code 70) on an
unhandled exception: a controller running half-broken is worse than one that is visibly down.
The resync protocol and the poll schedule live in `controller.sync.DatapathSync` (one per switch),
the decisions in `controller.core`, the REST/metrics view in `controller.state`.
Times are monotonic (`time.monotonic()`).
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3 as ofp

from controller import ofmsg
from controller.core import ControllerCore
from controller.intents import Changes
from controller.state import ControllerState
from controller.sync import DatapathSync, Out, PollConfig, outgoing

LOG = logging.getLogger("fabriclab.controller")
EXIT_CRASH = 70


@dataclass(frozen=True)
class AppConfig:
    core: ControllerCore
    poll: PollConfig = field(default_factory=PollConfig)
    rest_host: str = "127.0.0.1"
    rest_port: int = 0  # 0: no REST/metrics server
    openflow_unix: str = ""  # also accept switches on this Unix socket ("": only os-ken's TCP listener)


_CONFIG: AppConfig | None = None


def configure(config: AppConfig) -> None:
    global _CONFIG
    _CONFIG = config


def kill_on_exception(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - deliberately fatal
            LOG.critical("unhandled exception in %s, stopping the controller:\n%s", fn.__name__, traceback.format_exc())
            logging.shutdown()
            os._exit(EXIT_CRASH)

    return wrapper


class _UnixConnection:
    """An accepted Unix-socket connection as os-ken's `Datapath` expects a TCP one: it sets
    TCP_NODELAY on its socket, which a Unix socket refuses (there is nothing to delay)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def setsockopt(self, level: int, option: int, value: int) -> None:
        if level != socket.IPPROTO_TCP:
            self._sock.setsockopt(level, option, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@kill_on_exception
def serve_unix(path: str) -> None:
    """Accept OpenFlow connections on Unix socket `path` (switches in other network namespaces, which
    cannot reach 127.0.0.1 of this one), each served by os-ken like a TCP connection."""
    from os_ken.controller.controller import datapath_connection_factory

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(128)
    while True:
        conn, _ = server.accept()
        hub.spawn(datapath_connection_factory, _UnixConnection(conn), path)


class FabricController(app_manager.OSKenApp):  # type: ignore[misc]
    OFP_VERSIONS = [ofp.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if _CONFIG is None:
            raise RuntimeError("controller.app.configure() was not called before starting os-ken")
        self.cfg = _CONFIG
        self.core = _CONFIG.core
        self.lock = threading.RLock()  # the core is shared with the REST thread
        self.dps: dict[int, Any] = {}
        self.sessions: dict[int, DatapathSync] = {}
        self.state = ControllerState(self.core, self.sessions, self.lock, self.send_changes)
        self.threads = [hub.spawn(self._poll_loop)]
        if self.cfg.openflow_unix:
            self.threads.append(hub.spawn(serve_unix, self.cfg.openflow_unix))
        if self.cfg.rest_port:
            from controller.api import serve

            self.api_server = serve(self.state, self.cfg.rest_host, self.cfg.rest_port)

    # ---- sending -------------------------------------------------------------------------------
    def _send(self, out: list[Out]) -> None:
        """Send (dpid, message) pairs; a switch that has gone away is skipped. A switch's consecutive
        messages are serialised as `Datapath.send_msg` does, then sent as one write (one item on its
        send thread's queue, one `sendall`), so OVS reads them together instead of one by one as the
        send threads get the interpreter."""
        for dpid, group in itertools.groupby(out, key=lambda o: o[0]):
            dp = self.dps.get(dpid)
            if dp is None:
                continue
            bufs = []
            for _, msg in group:
                msg.datapath = dp
                if msg.xid is None:
                    dp.set_xid(msg)
                msg.serialize()
                bufs.append(msg.buf)
            dp.send(bufs[0] if len(bufs) == 1 else b"".join(bufs))

    def send_changes(self, changes: list[Changes]) -> None:
        self._send(outgoing(changes))

    # ---- connect and resync --------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @kill_on_exception
    def switch_features_handler(self, ev: Any) -> None:
        dp = ev.msg.datapath
        name = self.core.switch_name(dp.id)
        if name is None:
            LOG.error("datapath %016x is not in fabric %r; leaving it alone", dp.id, self.core.fabric.name)
            return
        with self.lock:
            self.dps[dp.id] = dp
            session = self.sessions[dp.id] = DatapathSync(self.core, dp.id, self.cfg.poll)
            self._send(session.on_connect(time.monotonic()))
        LOG.info("switch %s (dpid %016x) connected; reading its ports", name, dp.id)

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    @kill_on_exception
    def port_desc_handler(self, ev: Any) -> None:
        msg = ev.msg
        ports = [(p.port_no, ofmsg.port_is_up(p)) for p in msg.body if p.port_no <= ofp.OFPP_MAX]
        more = bool(msg.flags & ofp.OFPMPF_REPLY_MORE)
        with self.lock:
            session = self.sessions.get(msg.datapath.id)
            if session is not None:
                self._send(session.on_port_desc(msg.xid, ports, more, time.monotonic()))

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, MAIN_DISPATCHER)
    @kill_on_exception
    def group_desc_handler(self, ev: Any) -> None:
        msg = ev.msg
        groups = [ofmsg.group_from_stats(s) for s in msg.body]
        with self.lock:
            session = self.sessions.get(msg.datapath.id)
            if session is not None:
                self._send(session.on_group_desc(msg.xid, groups, bool(msg.flags & ofp.OFPMPF_REPLY_MORE)))
                self._log_resync(session)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    @kill_on_exception
    def flow_stats_handler(self, ev: Any) -> None:
        msg = ev.msg
        dpid = msg.datapath.id
        more = bool(msg.flags & ofp.OFPMPF_REPLY_MORE)
        now = time.monotonic()
        with self.lock:
            session = self.sessions.get(dpid)
            if session is None:
                return
            if session.is_probe_reply(msg.xid):
                self._send(session.on_probe_counts(msg.xid, ofmsg.probe_counts_from_stats(msg.body), more, now))
                for verdict in session.last_gray:
                    LOG.warning("%s", verdict.describe())
                session.last_gray = []
                return
            if session.is_resync_reply(msg.xid):
                flows = [f for f in (ofmsg.flow_from_stats(dpid, s) for s in msg.body) if f is not None]
                self._send(session.on_our_flows(msg.xid, flows, more))
                self._log_resync(session)
                return
            counters = []
            for stat in msg.body:
                flow = ofmsg.flow_from_stats(dpid, stat)
                if flow is not None:
                    counters.append((flow, stat.byte_count, stat.duration_sec + stat.duration_nsec / 1e9))
            self._send(session.on_flow_stats(msg.xid, counters, more, now))

    def _log_resync(self, session: DatapathSync) -> None:
        if session.state == "barrier" and session.last_resync is not None:
            g, a, m, d = session.last_resync
            LOG.info("switch %s: resync sends %d groups, %d+%d flows, deletes %d stale",
                     self.core.switch_name(session.dpid), g, a, m, d)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @kill_on_exception
    def barrier_reply_handler(self, ev: Any) -> None:
        msg = ev.msg
        with self.lock:
            session = self.sessions.get(msg.datapath.id)
            done = session is not None and session.on_barrier(msg.xid, time.monotonic())
        if done:
            LOG.info("switch %s synced", self.core.switch_name(msg.datapath.id))

    @set_ev_cls(ofp_event.EventOFPErrorMsg, MAIN_DISPATCHER)
    @kill_on_exception
    def error_handler(self, ev: Any) -> None:
        msg = ev.msg
        LOG.error("switch %s reported error type %d code %d for xid %d", self.core.switch_name(msg.datapath.id),
                  msg.type, msg.code, msg.xid)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    @kill_on_exception
    def disconnect_handler(self, ev: Any) -> None:
        dp = ev.datapath
        dpid = getattr(dp, "id", None)
        if dpid is None:
            return
        with self.lock:
            if self.dps.get(dpid) is dp:
                del self.dps[dpid]
                self.sessions.pop(dpid, None)
        LOG.info("switch %s disconnected", self.core.switch_name(dpid))

    # ---- failures and load ---------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @kill_on_exception
    def port_status_handler(self, ev: Any) -> None:
        msg = ev.msg
        up = msg.reason != ofp.OFPPR_DELETE and ofmsg.port_is_up(msg.desc)
        with self.lock:
            self.send_changes(self.core.on_port_status(msg.datapath.id, msg.desc.port_no, up, time.monotonic()))

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @kill_on_exception
    def port_stats_handler(self, ev: Any) -> None:
        msg = ev.msg
        counters = {s.port_no: (s.tx_bytes, s.rx_bytes, s.duration_sec + s.duration_nsec / 1e9)
                    for s in msg.body if s.port_no <= ofp.OFPP_MAX}
        with self.lock:
            session = self.sessions.get(msg.datapath.id)
            if session is not None:
                self._send(session.on_port_stats(msg.xid, counters, bool(msg.flags & ofp.OFPMPF_REPLY_MORE),
                                                 time.monotonic()))

    @kill_on_exception
    def _poll_loop(self) -> None:
        while True:
            hub.sleep(self.cfg.poll.poll_s)
            now = time.monotonic()
            with self.lock:
                hot = self.core.flow_stats_wanted()
                for dpid, session in list(self.sessions.items()):
                    self._send(session.due(now, dpid in hot))
