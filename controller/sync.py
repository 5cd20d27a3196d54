"""One switch's session with the controller, pure: the resync protocol and the poll schedule.

On (re)connect a switch is resynchronised, not wiped:

    connect -> port-desc request -> (ports folded into the core) -> group-desc + our-flows requests
            -> (both replies complete) -> the core's difference + a barrier -> (barrier reply) -> synced

Then statistics are polled: port statistics every `poll_s`; ECMP flow statistics every
`flow_poll_s`, and every `hot_flow_poll_s` while the core wants this switch's per-slot rates (a hot
link downstream), and at once when a link downstream has just turned hot (the core's
`urgent_flow_dpids`, at most every `urgent_flow_poll_s`; the reply is decided on at once), and
every `urgent_flow_poll_s` for `fast_flow_s` after that (OVS refreshes its userspace datapath's flow
counters only every ~0.5 s: the first reply may not show the slots that just started). Each of these
urgent and fast requests follows `nudge_lead_s` after a nudge (`ControllerCore.nudge_flow`: the flow
table changes, so OVS refreshes the counters at once), so it reads counters milliseconds old. The
nudge for the next fast request goes `nudge_lead_s` ahead of its turn (with the request before it,
when the interval is as long as the lead), so the fast requests keep their pace. A switch
that could relieve a link that has just turned warm is nudged at once (`ControllerCore.nudge_dpids`),
so when that link turns hot its urgent request waits only for what is left of that nudge's lead. A request
still unanswered is not repeated until `reply_timeout_s` has passed, so a slow switch is not buried
under requests. Gray-failure probing (`controller.gray`): early in each period a probe out of each
of the switch's live switch-to-switch ports at every poll until `probes` have gone, and `settle_s`
into it a request for its probe counters.

Every method takes the event's primitives and `now` (monotonic seconds) and returns the OpenFlow
messages to send as (dpid, message) pairs (built without a datapath, each request with its
transaction id already set; a reaction to this switch's event may change other switches too), so
the os-ken shim only extracts, calls and sends, and this is tested on a fake flow table without a
switch. Transaction ids are this object's own (matched together with the reply's type).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from controller import ofmsg
from controller.core import ControllerCore
from controller.intents import Changes, FlowIntent
from controller.gray import GrayChange

Out = tuple[int, Any]  # (dpid, OpenFlow message)


def outgoing(changes: list[Changes]) -> list[Out]:
    """Each switch's changes as messages addressed to it."""
    return [(ch.dpid, m) for ch in changes for m in ofmsg.messages(ch)]


@dataclass(frozen=True)
class PollConfig:
    poll_s: float = 0.01  # port statistics, every switch
    flow_poll_s: float = 1.0  # ECMP flow statistics, every decision point (background)
    hot_flow_poll_s: float = 0.25  # ... and this often where a link is hot
    urgent_flow_poll_s: float = 0.02  # ... and at once where one turns hot, if none was asked this recently,
    fast_flow_s: float = 1.0  # ... then this often for this long (a flow counter refresh, ~0.5 s in OVS)
    reply_timeout_s: float = 1.0  # re-ask after this long without a reply
    #: an urgent or fast flow request goes this long after a nudge (0: no nudge, asked at once): the
    #: time OVS's revalidators take to bring the flow counters up to date after the flow table changed
    nudge_lead_s: float = 0.02
    #: ... or sooner, if a nudge went at most this long ago (the early nudge at a link that turned warm,
    #: `ControllerCore.nudge_dpids`): then the request waits only for the rest of that nudge's lead
    nudge_valid_s: float = 0.05

    def __post_init__(self) -> None:
        if self.nudge_lead_s < 0:
            raise ValueError(f"nudge_lead_s must be >= 0, got {self.nudge_lead_s}")
        if self.nudge_valid_s < self.nudge_lead_s:
            raise ValueError(f"nudge_valid_s ({self.nudge_valid_s}) must be >= nudge_lead_s ({self.nudge_lead_s})")


@dataclass
class _Pending:
    xid: int = -1
    sent_s: float = float("-inf")
    answered: bool = True


@dataclass
class DatapathSync:
    core: ControllerCore
    dpid: int
    config: PollConfig = field(default_factory=PollConfig)
    xids: Iterator[int] = field(default_factory=lambda: itertools.count(0x7A000000))
    connected_s: float | None = None
    synced_s: float | None = None  # when the resync's barrier came back
    state: str = "new"  # new -> ports -> tables -> barrier -> synced
    _port_desc_xid: int = -1
    _groups_xid: int = -1
    _flows_xid: int = -1
    _barrier_xid: int = -1
    _groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    _flows: list[FlowIntent] = field(default_factory=list)
    _groups_done: bool = False
    _flows_done: bool = False
    _port_poll: _Pending = field(default_factory=_Pending)
    _flow_poll: _Pending = field(default_factory=_Pending)
    _probe_poll: _Pending = field(default_factory=_Pending)
    _nudged_s: float | None = None  # when the last nudge went, if no flow request has gone since
    _probe_counts: dict[int, int] = field(default_factory=dict)
    last_gray: list[GrayChange] = field(default_factory=list)  # verdicts of the last probe reading
    last_resync: tuple[int, int, int, int] | None = None  # groups sent, flows added, modified, deleted

    def _stamp(self, msg: Any) -> Any:
        msg.xid = next(self.xids) & 0xFFFFFFFF
        return msg

    @property
    def synced(self) -> bool:
        return self.state == "synced"

    # ---- the resync protocol -------------------------------------------------------------------
    def on_connect(self, now: float) -> list[Out]:
        """The switch's features arrived: start by reading its ports."""
        self.connected_s, self.synced_s, self.state = now, None, "ports"
        self._groups, self._flows = {}, []
        self._groups_done = self._flows_done = False
        msg = self._stamp(ofmsg.port_desc_request())
        self._port_desc_xid = msg.xid
        return [(self.dpid, msg)]

    def on_port_desc(self, xid: int, ports: list[tuple[int, bool]], more: bool, now: float) -> list[Out]:
        """A port-desc reply (port number, up) part: port states go to the core; once complete,
        ask for the switch's groups and our flows."""
        if xid != self._port_desc_xid or self.state != "ports":
            return []
        out: list[Out] = []
        for port, up in ports:
            out += outgoing(self.core.on_port_status(self.dpid, port, up, now))
        if not more:
            self.state = "tables"
            groups, flows = self._stamp(ofmsg.groups_request()), self._stamp(ofmsg.our_flows_request())
            self._groups_xid, self._flows_xid = groups.xid, flows.xid
            out += [(self.dpid, groups), (self.dpid, flows)]
        return out

    def on_group_desc(self, xid: int, groups: list[tuple[int, tuple[int, ...]]], more: bool) -> list[Out]:
        if xid != self._groups_xid or self.state != "tables":
            return []
        self._groups.update(groups)
        self._groups_done = not more
        return self._maybe_resync()

    def is_resync_reply(self, xid: int) -> bool:
        """Whether a flow-stats reply belongs to the resync (else it is a poll)."""
        return xid == self._flows_xid and self.state == "tables"

    def on_our_flows(self, xid: int, flows: list[FlowIntent], more: bool) -> list[Out]:
        if not self.is_resync_reply(xid):
            return []
        self._flows += flows
        self._flows_done = not more
        return self._maybe_resync()

    def _maybe_resync(self) -> list[Out]:
        if not (self._groups_done and self._flows_done):
            return []
        changes = self.core.resync(self.dpid, self._groups, self._flows)
        self._groups, self._flows = {}, []
        self.last_resync = (len(changes.groups_add) + len(changes.groups_modify), len(changes.flows_add),
                            len(changes.flows_modify), len(changes.flows_delete))
        barrier = self._stamp(ofmsg.barrier())
        self._barrier_xid = barrier.xid
        self.state = "barrier"
        return [(self.dpid, m) for m in ofmsg.messages(changes) + [barrier]]

    def on_barrier(self, xid: int, now: float) -> bool:
        """True when this barrier reply completes the resync."""
        if xid != self._barrier_xid or self.state != "barrier":
            return False
        self.state, self.synced_s = "synced", now
        return True

    # ---- polling -------------------------------------------------------------------------------
    def due(self, now: float, hot: bool) -> list[Out]:
        """Statistics requests due now (only once synced)."""
        if not self.synced:
            return []
        cfg = self.config
        out: list[Out] = []
        if self.dpid in self.core.port_poll_dpids and self._ready(self._port_poll, cfg.poll_s, now):
            out.append((self.dpid, self._ask(self._port_poll, ofmsg.port_stats_request(), now)))
        urgent = (self.dpid in self.core.urgent_flow_dpids
                  or now - self.core.turned_hot_s.get(self.dpid, float("-inf")) < cfg.fast_flow_s)
        # a link at the hysteresis' edge may turn hot again and again: at most one urgent request per
        # `urgent_flow_poll_s`
        flow_every_s = cfg.urgent_flow_poll_s if urgent else cfg.hot_flow_poll_s if hot else cfg.flow_poll_s
        gray, name = self.core.gray, self.core.switch_name(self.dpid)
        # how long ago the last nudge went (if no flow request has gone since); fresh: a request may use it
        nudge_age_s = math.inf if self._nudged_s is None else now - self._nudged_s
        if self.dpid in self.core.nudge_dpids:
            # an early nudge (a link this switch could relieve turned warm), unless one is fresh already
            self.core.nudge_dpids.discard(self.dpid)
            if cfg.nudge_lead_s and name is not None and nudge_age_s > cfg.nudge_valid_s:
                nudge_age_s = 0.0
                out.append(self._nudge(name, now))
        if self.dpid in self.core.decision_dpids:
            lead_s = cfg.nudge_lead_s if urgent and name is not None else 0.0
            fresh = nudge_age_s <= cfg.nudge_valid_s
            if (not lead_s or (fresh and nudge_age_s >= lead_s)) and self._ready(self._flow_poll, flow_every_s, now):
                self._nudged_s = None
                self.core.urgent_flow_dpids.discard(self.dpid)
                out.append((self.dpid, self._ask(self._flow_poll, ofmsg.ecmp_flows_request(), now)))
                if name is not None:
                    self.core.congestion_log.append((now, "urgent_request" if urgent else "request", name, None))
                # still urgent (the fast requests after a link turned hot): the next one's nudge may be due now
                fresh, urgent = False, now - self.core.turned_hot_s.get(self.dpid, float("-inf")) < cfg.fast_flow_s
            if urgent and name is not None and cfg.nudge_lead_s and not fresh \
                    and now - self._flow_poll.sent_s >= flow_every_s - cfg.nudge_lead_s:
                # the nudge goes its lead ahead of the request's turn (with a request, if the lead is as
                # long as the interval), so the fast requests keep their pace
                out.append(self._nudge(name, now))
        if gray.config.enabled and name is not None:
            ports = gray.burst_due(name, now)
            if ports:
                gray.sent(name, ports, 1)
                out.append((self.dpid, ofmsg.probe_burst(ports, 1)))
            if self._ready(self._probe_poll, 0.0, now) and gray.read_due(name, now):
                self._probe_counts = {}
                out.append((self.dpid, self._ask(self._probe_poll, ofmsg.probe_counts_request(), now)))
        return out

    def _nudge(self, name: str, now: float) -> Out:
        """The nudge (`ControllerCore.nudge_flow`) to send now, noted as sent."""
        self._nudged_s = now
        self.core.congestion_log.append((now, "nudge", name, None))
        return (self.dpid, ofmsg.flow_mod(self.core.nudge_flow(name)))

    def is_probe_reply(self, xid: int) -> bool:
        """Whether a flow-stats reply answers the probe-counter request."""
        return xid == self._probe_poll.xid and not self._probe_poll.answered

    def on_probe_counts(self, xid: int, counts: dict[int, int], more: bool, now: float) -> list[Out]:
        """A probe-counter reply (in-port -> probes counted): once complete, to the core, whose
        verdicts (kept in `last_gray`) may take links out of service or bring them back."""
        if not self.is_probe_reply(xid):
            return []
        self._probe_counts.update(counts)
        if more:
            return []
        self._probe_poll.answered = True
        changes, self.last_gray = self.core.on_probe_counts(self.dpid, self._probe_counts, now)
        return outgoing(changes)

    def _ready(self, p: _Pending, interval_s: float, now: float) -> bool:
        if now - p.sent_s < interval_s:
            return False
        return p.answered or now - p.sent_s >= self.config.reply_timeout_s

    def _ask(self, p: _Pending, msg: Any, now: float) -> Any:
        self._stamp(msg)
        p.xid, p.sent_s, p.answered = msg.xid, now, False
        return msg

    def on_port_stats(self, xid: int, counters: dict[int, tuple[int, int, float]], more: bool,
                      now: float) -> list[Out]:
        """A port-stats reply: counters to the core, the new rates to the policy (whose moves may
        change any switch)."""
        if not more and xid == self._port_poll.xid:
            self._port_poll.answered = True
        rates = self.core.on_port_counters(self.dpid, counters)
        return outgoing(self.core.on_loads(rates, now))

    def on_flow_stats(self, xid: int, counters: list[tuple[FlowIntent, int, float]], more: bool,
                      now: float) -> list[Out]:
        """A polled flow-stats reply: per-slot rates to the core; once complete, while a link is hot,
        the policy decides on them at once (whose moves may change any switch)."""
        if not more and xid == self._flow_poll.xid:
            self._flow_poll.answered = True
        self.core.on_flow_counters(self.dpid, counters, now)
        if more:
            return []
        name = self.core.switch_name(self.dpid)
        if name is not None:
            self.core.congestion_log.append((now, "reply", name, None))
        return outgoing(self.core.on_slot_rates(now))
