"""The os-ken shim: extract primitives from events, call the core (with `now`), send what it returns.

Configured before os-ken instantiates it (`configure()`), because os-ken 4 creates apps itself.
An unhandled exception in a handler ends the whole controller process loudly (exit code 70):
a controller running half-broken is worse than one that is visibly down.

On connect a switch is resynchronised, not wiped: the shim reads its port states, groups and our
flows, and the core sends only the difference. Port statistics are polled every `poll_s`, ECMP flow
statistics every `flow_poll_s`; both feed the router's congestion decisions.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3 as ofp

from controller import ofmsg
from controller.core import Changes, ControllerCore, FlowIntent

LOG = logging.getLogger("fabriclab.controller")


@dataclass(frozen=True)
class AppConfig:
    core: ControllerCore
    poll_s: float = 0.01  # port statistics, every switch
    flow_poll_s: float = 1.0  # ECMP flow statistics, every decision point (background)
    hot_flow_poll_s: float = 0.25  # ... and this often where a link is hot
    rest_host: str = "127.0.0.1"
    rest_port: int = 0  # 0: no REST/metrics server


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
            os._exit(70)

    return wrapper


class _Sync:
    """Per-switch resync progress: replies collected until each multipart reply is complete."""

    def __init__(self) -> None:
        self.groups: dict[int, tuple[int, ...]] = {}
        self.flows: list[FlowIntent] = []
        self.groups_done = False
        self.flows_done = False
        self.port_desc_xid = -1
        self.xids: set[int] = set()


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
        self.syncing: dict[int, _Sync] = {}
        self.synced: dict[int, float] = {}
        self.barriers: dict[int, int] = {}  # dpid -> xid of the barrier that ends its resync
        self.slot_rates: dict[tuple[str, str, int], float] = {}
        self.connects: dict[int, int] = {}
        self.last_flow_request: dict[int, float] = {}
        self.threads = [hub.spawn(self._poll_loop)]
        if self.cfg.rest_port:
            from controller.api import serve

            self.api_server = serve(self, self.cfg.rest_host, self.cfg.rest_port)

    # ---- sending -------------------------------------------------------------------------------
    def _send(self, dp: Any, msgs: list[Any]) -> list[int]:
        xids = []
        for msg in msgs:
            msg.datapath = dp
            dp.set_xid(msg)
            dp.send_msg(msg)
            xids.append(msg.xid)
        return xids

    def send_changes(self, changes: list[Changes]) -> None:
        for ch in changes:
            dp = self.dps.get(ch.dpid)
            if dp is not None and len(ch):
                self._send(dp, ofmsg.messages(ch))

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
            self.synced.pop(dp.id, None)
            self.connects[dp.id] = self.connects.get(dp.id, 0) + 1
            sync = self.syncing[dp.id] = _Sync()
        sync.port_desc_xid = self._send(dp, [ofmsg.parser.OFPPortDescStatsRequest(None, 0)])[0]
        LOG.info("switch %s (dpid %016x) connected; reading its ports", name, dp.id)

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    @kill_on_exception
    def port_desc_handler(self, ev: Any) -> None:
        dp = ev.msg.datapath
        now = time.time()
        sync = self.syncing.get(dp.id)
        if sync is None or ev.msg.xid != sync.port_desc_xid:
            return  # os-ken's own port-desc request at connect
        with self.lock:
            changes: list[Changes] = []
            for port in ev.msg.body:
                if port.port_no <= ofp.OFPP_MAX:
                    changes += self.core.on_port_status(dp.id, port.port_no, ofmsg.port_is_up(port), now)
            self.send_changes(changes)
            if ev.msg.flags & ofp.OFPMPF_REPLY_MORE:
                return
        sync.xids.update(self._send(dp, [ofmsg.groups_request(), ofmsg.our_flows_request()]))

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, MAIN_DISPATCHER)
    @kill_on_exception
    def group_desc_handler(self, ev: Any) -> None:
        dp = ev.msg.datapath
        sync = self.syncing.get(dp.id)
        if sync is None or ev.msg.xid not in sync.xids:
            return
        for stat in ev.msg.body:
            gid, ports = ofmsg.group_from_stats(stat)
            sync.groups[gid] = ports
        sync.groups_done = not ev.msg.flags & ofp.OFPMPF_REPLY_MORE
        self._maybe_resync(dp)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    @kill_on_exception
    def flow_stats_handler(self, ev: Any) -> None:
        dp = ev.msg.datapath
        sync = self.syncing.get(dp.id)
        if sync is not None and ev.msg.xid in sync.xids:
            sync.flows += [f for f in (ofmsg.flow_from_stats(dp.id, s) for s in ev.msg.body) if f is not None]
            sync.flows_done = not ev.msg.flags & ofp.OFPMPF_REPLY_MORE
            self._maybe_resync(dp)
            return
        counters = []
        for stat in ev.msg.body:
            flow = ofmsg.flow_from_stats(dp.id, stat)
            if flow is not None:
                counters.append((flow, stat.byte_count, stat.duration_sec + stat.duration_nsec / 1e9))
        with self.lock:
            self.slot_rates.update(self.core.on_flow_counters(dp.id, counters))
            self.send_changes(self.core.on_loads({}, self.slot_rates, time.time()))

    def _maybe_resync(self, dp: Any) -> None:
        sync = self.syncing[dp.id]
        if not (sync.groups_done and sync.flows_done):
            return
        with self.lock:
            del self.syncing[dp.id]
            changes = self.core.resync(dp.id, sync.groups, sync.flows)
        xids = self._send(dp, ofmsg.messages(changes) + [ofmsg.barrier()])
        self.barriers[dp.id] = xids[-1]
        LOG.info("switch %s: resync sends %d groups, %d+%d flows, deletes %d stale", self.core.switch_name(dp.id),
                 len(changes.groups_add) + len(changes.groups_modify), len(changes.flows_add),
                 len(changes.flows_modify), len(changes.flows_delete))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @kill_on_exception
    def barrier_reply_handler(self, ev: Any) -> None:
        dp = ev.msg.datapath
        if self.barriers.get(dp.id) == ev.msg.xid:
            with self.lock:
                self.synced[dp.id] = time.time()
            LOG.info("switch %s synced", self.core.switch_name(dp.id))

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
                self.synced.pop(dpid, None)
                self.syncing.pop(dpid, None)

    # ---- failures and load ---------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @kill_on_exception
    def port_status_handler(self, ev: Any) -> None:
        now = time.time()
        msg = ev.msg
        up = msg.reason != ofp.OFPPR_DELETE and ofmsg.port_is_up(msg.desc)
        with self.lock:
            self.send_changes(self.core.on_port_status(msg.datapath.id, msg.desc.port_no, up, now))

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @kill_on_exception
    def port_stats_handler(self, ev: Any) -> None:
        now = time.time()
        msg = ev.msg
        counters = {s.port_no: (s.tx_bytes, s.rx_bytes, s.duration_sec + s.duration_nsec / 1e9)
                    for s in msg.body if s.port_no <= ofp.OFPP_MAX}
        with self.lock:
            rates = self.core.on_port_counters(msg.datapath.id, counters)
            self.send_changes(self.core.on_loads(rates, self.slot_rates, now))
            wanted = [self.dps[d] for d in self.core.flow_stats_wanted() if d in self.dps]
        for dp in wanted:  # per-slot rates where a decision is due, at most every hot_flow_poll_s
            if now - self.last_flow_request.get(dp.id, 0.0) >= self.cfg.hot_flow_poll_s:
                self.last_flow_request[dp.id] = now
                self._send(dp, [ofmsg.ecmp_flows_request()])

    def _poll_loop(self) -> None:
        last_flow_poll = 0.0
        decide = {self.core.dpid(s) for s, _ in self.core.table.decisions} if self.core.multipath else set()
        while True:
            hub.sleep(self.cfg.poll_s)
            with self.lock:
                dps = [self.dps[d] for d in self.synced if d in self.dps]
            flows_now = time.monotonic() - last_flow_poll >= self.cfg.flow_poll_s
            if flows_now:
                last_flow_poll = time.monotonic()
            for dp in dps:
                try:
                    self._send(dp, [ofmsg.port_stats_request()])
                    if flows_now and dp.id in decide:
                        self.last_flow_request[dp.id] = time.time()
                        self._send(dp, [ofmsg.ecmp_flows_request()])
                except Exception:  # noqa: BLE001 - a switch going away mid-poll is not fatal
                    LOG.debug("poll of %016x failed", dp.id, exc_info=True)
