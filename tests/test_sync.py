"""The per-switch session (`controller.sync.DatapathSync`), driven on the fake flow table: the resync
protocol installs everything on an empty switch, sends nothing but a barrier to a switch that is
already right, mends what differs; the poll schedule asks for statistics when due and not again
while a request is unanswered."""
from __future__ import annotations

import dataclasses

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsg
from controller.core import ControllerCore
from controller.intents import COOKIE
from controller.gray import GrayConfig
from controller.sync import DatapathSync, PollConfig, outgoing
from fabric import topofile
from fabric.builders import dual_plane
from tests.fakeoftable import FakeFabric, apply_out, flow_stats, group_desc
from tests.test_controller_core import tcp


def connect(core, fake, switch, now=0.0):
    """Run the whole resync protocol for one switch against the fake (its ports as the fake has
    them: up, or down after `fake.set_link`); returns the session and the messages that changed the
    switch's tables."""
    dpid = core.fabric.switch_by_name[switch].dpid
    s = DatapathSync(core, dpid)
    (req,) = apply_out(fake, s.on_connect(now))
    assert isinstance(req[1], parser.OFPPortDescStatsRequest)
    ports = [(a.port, (switch, a.port) not in fake.down) for a in core.fabric.adjacency[switch]]
    reqs = apply_out(fake, s.on_port_desc(req[1].xid, ports, False, now))
    kinds = {type(m).__name__: m for _, m in reqs}
    assert set(kinds) == {"OFPGroupDescStatsRequest", "OFPFlowStatsRequest"}
    assert apply_out(fake, s.on_group_desc(kinds["OFPGroupDescStatsRequest"].xid, group_desc(fake, switch),
                                           False)) == []
    assert not s.synced
    flows = [f for f in (ofmsg.flow_from_stats(dpid, st) for st in flow_stats(fake, switch, COOKIE)) if f]
    out = s.on_our_flows(kinds["OFPFlowStatsRequest"].xid, flows, False)
    changed = [m for _, m in out if not isinstance(m, parser.OFPBarrierRequest)]
    (barrier,) = apply_out(fake, out)
    assert isinstance(barrier[1], parser.OFPBarrierRequest) and not s.synced
    assert s.on_barrier(barrier[1].xid, now + 0.01) and s.synced
    return s, changed


def test_resync_programs_an_empty_switch_then_leaves_a_correct_one_alone():
    fab = topofile.load("dual-plane-16")
    core = ControllerCore(fab, "adaptive")
    fake = FakeFabric(fab)
    first = {sw.name: connect(core, fake, sw.name)[1] for sw in fab.switches}
    assert all(first.values())  # every switch got groups/flows
    ip = str(fab.nic("h15", "A").ip)
    assert fake.trace("h0", 0, tcp(ip, 49152))[-1] == "h15"
    # a restarted controller (a new core, same model) finds every table right: nothing but barriers
    core2 = ControllerCore(fab, "adaptive")
    for sw in fab.switches:
        assert connect(core2, fake, sw.name)[1] == []
    assert fake.trace("h0", 0, tcp(ip, 49152))[-1] == "h15"


def test_resync_mends_a_flow_that_differs_and_deletes_a_stale_one():
    fab = topofile.load("leaf-spine-16")
    core = ControllerCore(fab, "ecmp")
    fake = FakeFabric(fab)
    for sw in fab.switches:
        connect(core, fake, sw.name)
    sw = fake.switches["leafA0"]
    entry = next(e for e in sw.entries if e.table == 1)
    entry.instructions = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(3, 0)])]
    stale = type(entry)(0, 1000, {"eth_type": 0x0800, "ipv4_dst": "198.18.9.9"}, entry.instructions, COOKIE)
    sw.entries.append(stale)
    _, changed = connect(ControllerCore(fab, "ecmp"), fake, "leafA0")
    commands = sorted((m.command, m.table_id) for m in changed)
    assert commands == sorted([(ofp.OFPFC_MODIFY_STRICT, 1), (ofp.OFPFC_DELETE_STRICT, 0)])
    assert stale not in sw.entries


def test_replies_with_unknown_transaction_ids_are_ignored():
    fab = topofile.load("leaf-spine-16")
    core = ControllerCore(fab, "adaptive")
    s = DatapathSync(core, fab.switch_by_name["leafA0"].dpid)
    (_, req), = s.on_connect(0.0)
    assert s.on_port_desc(req.xid + 999, [(1, True)], False, 0.0) == []
    assert s.state == "ports"
    assert s.on_barrier(req.xid, 0.0) is False


def test_poll_schedule_asks_when_due_and_not_while_a_request_is_unanswered():
    fab = topofile.load("leaf-spine-16")
    core = ControllerCore(fab, "adaptive", gray=GrayConfig(period_s=0))  # probing: tests/test_gray.py
    fake = FakeFabric(fab)
    cfg = PollConfig(poll_s=0.01, flow_poll_s=1.0, hot_flow_poll_s=0.25, reply_timeout_s=0.5)
    leaf, _ = connect(core, fake, "leafA0")
    spine, _ = connect(core, fake, "spineA0")
    leaf.config = spine.config = cfg

    def kinds(out):
        return sorted(type(m).__name__ for _, m in out)

    # a leaf has decision points and hosts: port and flow statistics; a spine has neither decisions nor
    # a link the leaves do not see: nothing (its egress rates come from the leaves' rx counters)
    first = leaf.due(1.0, hot=False)
    assert kinds(first) == ["OFPFlowStatsRequest", "OFPPortStatsRequest"]
    assert kinds(spine.due(1.0, hot=False)) == []
    # unanswered: nothing new 20 ms later; answered: the port request is due again
    assert leaf.due(1.02, hot=False) == []
    port_req = next(m for _, m in first if isinstance(m, parser.OFPPortStatsRequest))
    leaf.on_port_stats(port_req.xid, {1: (0, 0, 1.0)}, False, 1.02)
    assert kinds(leaf.due(1.03, hot=False)) == ["OFPPortStatsRequest"]
    # an unanswered request is repeated after the reply timeout
    assert kinds(leaf.due(1.6, hot=False)) == ["OFPPortStatsRequest"]
    # flow statistics: every 1 s in the background, every 0.25 s while hot (once answered)
    flow_req = next(m for _, m in first if isinstance(m, parser.OFPFlowStatsRequest))
    leaf.on_flow_stats(flow_req.xid, [], False, 1.1)
    assert "OFPFlowStatsRequest" not in kinds(leaf.due(1.2, hot=True))
    assert "OFPFlowStatsRequest" in kinds(leaf.due(1.26, hot=True))
    # not synced: nothing is polled
    fresh = DatapathSync(core, fab.switch_by_name["leafA1"].dpid, cfg)
    assert fresh.due(5.0, hot=True) == []


def test_a_move_triggered_by_one_switch_is_addressed_to_the_switch_it_changes():
    # congestion at leafA0 is noticed in spineA0's statistics reply: the flow-mods go to leafA0
    fab = topofile.load("leaf-spine-16")
    core = ControllerCore(fab, "adaptive", rate_scale=1e-4)
    fake = FakeFabric(fab)
    sessions = {sw.name: connect(core, fake, sw.name)[0] for sw in fab.switches}
    cap = 400e9 * 1e-4
    core.last_slot_rates_bps.update({("leafA0", "leafA3", s): 0.3 * cap for s in (0, 4, 8)})
    core.policy.on_loads({("leafA0", 1): 0.97 * cap}, {}, 1.0)  # leafA0's uplink 1 turns hot
    out = sessions["spineA0"].on_port_stats(-1, {1: (0, 0, 1.0)}, False, 2.0)
    assert out and {dpid for dpid, _ in out} == {fab.switch_by_name["leafA0"].dpid}


def test_the_polled_switches_see_every_link_and_give_the_unpolled_ends_rates():
    from fabric.analysis import cover_switches

    fab = topofile.load("pyramid-16")
    cover = set(cover_switches(fab))
    for link in fab.links:
        assert link.a.node in cover or link.b.node in cover, link.label()
    assert {"tor0", "tor1", "tor2", "tor3"} <= cover and len(cover) < len(fab.switches)
    # leaf-spine-16: leafA0 port 1 is its link to spineA0 (port 1). Counters of leafA0 alone give the
    # spine's egress on that link: what leafA0 received, 1000 bytes in 1 s = 8000 bits/s
    fab = topofile.load("leaf-spine-16")
    core = ControllerCore(fab, "adaptive")
    dpid = fab.switch_by_name["leafA0"].dpid
    assert fab.switch_by_name["spineA0"].dpid not in core.port_poll_dpids
    core.on_port_counters(dpid, {1: (0, 0, 1.0)})
    rates = core.on_port_counters(dpid, {1: (5000, 1000, 2.0)})
    assert rates == {("leafA0", 1): 40000.0, ("spineA0", 1): 8000.0}
    assert core.port_bytes[("spineA0", 1)] == (1000, 5000)


def test_a_link_turning_hot_asks_its_relievers_for_flow_statistics_at_once_and_the_reply_decides():
    # leaf-spine-16 at 1e-4: leafA0's uplinks are 40 Mbit/s; towards leafA3 slots 0, 4, 8, 12 use port 1
    fab = topofile.load("leaf-spine-16")
    core = ControllerCore(fab, "adaptive", rate_scale=1e-4, flow_window_s=1.0)
    fake = FakeFabric(fab)
    leaf, _ = connect(core, fake, "leafA0")
    leaf.config = PollConfig(poll_s=0.01, flow_poll_s=1.0, hot_flow_poll_s=0.25, urgent_flow_poll_s=0.05,
                             reply_timeout_s=0.5, nudge_lead_s=0.0)
    cap_bytes = 400e9 * 1e-4 / 8
    flows = [core.slot_flows("leafA0", "leafA3", s, 1)[0] for s in (0, 4)]
    # the background flow poll at 1.0 s: both slots idle
    req = next(m for _, m in leaf.due(1.0, hot=False) if isinstance(m, parser.OFPFlowStatsRequest))
    assert leaf.on_flow_stats(req.xid, [(f, 0, 10.0) for f in flows], False, 1.0) == []
    assert not any(isinstance(m, parser.OFPFlowStatsRequest) for _, m in leaf.due(1.12, hot=False))
    # uplink 1 runs full from 1.19 s (both slots start): the first rate (1.21 s, over the 20 ms
    # window from 1.19 s) is the link's capacity and, being its first, starts its EWMA there: hot
    port = {"n": 0}

    def sample(t):
        port["n"] += int(cap_bytes * 0.01)
        return leaf.on_port_stats(-1, {1: (port["n"], 0, 10.0 + t - 1.0)}, False, t)

    leaf.on_port_stats(-1, {1: (0, 0, 10.19)}, False, 1.19)
    assert sample(1.20) == [] and core.policy.hot_links() == ()
    assert sample(1.21) == [] and core.policy.hot_links() == (("leafA0", 1),)
    assert sample(1.22) == []
    assert fab.switch_by_name["leafA0"].dpid in core.urgent_flow_dpids
    # not 0.25 s later: the flow request goes out with the next poll, 10 ms after
    asked = [m for _, m in leaf.due(1.23, hot=True) if isinstance(m, parser.OFPFlowStatsRequest)]
    assert len(asked) == 1 and not core.urgent_flow_dpids
    # its reply: both slots sent 20 kB since 1.0 s (no rate over a 1 s window yet): newcomers,
    # presumed to share the link; one moves on this reply
    half = int(cap_bytes * 0.03 / 2)
    out = leaf.on_flow_stats(asked[0].xid, [(f, half, 10.23) for f in flows], False, 1.231)
    moves = [m for e in core.policy.events() for m in e.moves]
    assert [(m.switch, m.dest, m.old_port, m.cause) for m in moves] == [("leafA0", "leafA3", 1, "congestion")]
    assert moves[0].slot in (0, 4) and moves[0].new_port != 1
    assert {dpid for dpid, _ in out} == {fab.switch_by_name["leafA0"].dpid}
    # a link at the hysteresis' edge turning hot again 20 ms later: the next urgent request waits
    # until 50 ms (`urgent_flow_poll_s`) after the last one
    dpid = fab.switch_by_name["leafA0"].dpid
    core.urgent_flow_dpids.add(dpid)
    assert not any(isinstance(m, parser.OFPFlowStatsRequest) for _, m in leaf.due(1.25, hot=True))
    assert any(isinstance(m, parser.OFPFlowStatsRequest) for _, m in leaf.due(1.28, hot=True))
    assert not core.urgent_flow_dpids


def fast_polled_leaf(nudge_lead_s: float, warm_nudge: bool = True):
    """leaf-spine-16 at 1e-4 (leafA0's uplinks 40 Mbit/s), no gray probing, leafA0 connected and
    polled: ports every 10 ms, flows every 1 s, 0.25 s while hot, 50 ms for 1 s after a link turns hot."""
    fab = topofile.load("leaf-spine-16")
    core = ControllerCore(fab, "adaptive", rate_scale=1e-4, flow_window_s=1.0, gray=GrayConfig(period_s=0),
                          warm_nudge=warm_nudge)
    fake = FakeFabric(fab)
    leaf, _ = connect(core, fake, "leafA0")
    leaf.config = PollConfig(poll_s=0.01, flow_poll_s=1.0, hot_flow_poll_s=0.25, urgent_flow_poll_s=0.05,
                             fast_flow_s=1.0, reply_timeout_s=0.5, nudge_lead_s=nudge_lead_s)
    return fab, core, fake, leaf


def test_after_a_link_turns_hot_its_relievers_are_polled_fast_until_the_counters_show_the_newcomers():
    # OVS refreshes the flow counters of its userspace datapath every ~0.5 s: the reply asked at once
    # may still show the two slots that just started as idle. Then leafA0 is asked every 50 ms
    # (`urgent_flow_poll_s`) for 1 s (`fast_flow_s`), not every 0.25 s, and the first reply that
    # shows them decides; after that second, polls go back to every 0.25 s while the link stays hot.
    _, core, _, leaf = fast_polled_leaf(nudge_lead_s=0.0)
    cap_bytes = 400e9 * 1e-4 / 8
    flows = [core.slot_flows("leafA0", "leafA3", s, 1)[0] for s in (0, 4)]
    req = next(m for _, m in leaf.due(1.0, hot=False) if isinstance(m, parser.OFPFlowStatsRequest))
    leaf.on_flow_stats(req.xid, [(f, 0, 10.0) for f in flows], False, 1.0)
    port = {"n": 0}

    def sample(t):
        port["n"] += int(cap_bytes * 0.01)
        return leaf.on_port_stats(-1, {1: (port["n"], 0, 10.0 + t - 1.0)}, False, t)

    leaf.on_port_stats(-1, {1: (0, 0, 10.19)}, False, 1.19)
    for t in (1.20, 1.21, 1.22):
        sample(t)
    assert core.policy.hot_links() == (("leafA0", 1),)

    def asked(t):
        return [m for _, m in leaf.due(t, hot=True) if isinstance(m, parser.OFPFlowStatsRequest)]

    times, moved_at = [], None
    t = 1.23
    while t < 1.6 and moved_at is None:
        for m in asked(round(t, 3)):
            times.append(round(t, 3))
            stale = t < 1.45  # the counters refresh at 1.45 s
            n = 0 if stale else int(cap_bytes * (t - 1.19) / 2)
            leaf.on_flow_stats(m.xid, [(f, n, 10.0 + t - 1.0) for f in flows], False, t)
            if any(e.cause == "congestion" for e in core.policy.events()):
                moved_at = round(t, 3)
        t += 0.01
    # asked at once (1.23), then every 50 ms (the next 10 ms poll on or after it: floating-point
    # sums may put it one poll later): the first request after the refresh decides
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 1.23 and all(0.049 < g < 0.061 for g in gaps), times
    assert moved_at == times[-1] and times[-2] < 1.45 <= times[-1], times
    # a second after the link turned hot (1.21 s), back to every 0.25 s while it stays hot
    times = []
    for t in (round(2.25 + 0.01 * i, 3) for i in range(60)):
        for m in asked(t):
            times.append(t)
            leaf.on_flow_stats(m.xid, [], False, t)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 2.25 and len(gaps) >= 2 and all(0.249 < g < 0.261 for g in gaps), times


def test_fast_flow_requests_follow_a_nudge_that_changes_nothing_but_refreshes_the_counters():
    # OVS copies datapath flow counters into OpenFlow flows when its revalidators run: every 500 ms,
    # or at once after a flow-table change. So each urgent or fast flow request goes `nudge_lead_s`
    # after the decision point's nudge flow (table 2, which nothing reaches) is added again; the
    # background and hot polls carry none, and the nudge leaves the switch's tables as they were.
    _, core, fake, leaf = fast_polled_leaf(nudge_lead_s=0.02)
    sw = fake.switches["leafA0"]
    nudge = [e for e in sw.entries if e.table == 2]
    assert len(nudge) == 1 and nudge[0].priority == 0 and not nudge[0].match and not nudge[0].instructions

    def kinds(t, hot):
        out = leaf.due(t, hot)
        flows = [m for _, m in out if isinstance(m, parser.OFPFlowStatsRequest)]
        mods = [m for _, m in out if isinstance(m, parser.OFPFlowMod)]
        before = [(e.table, e.priority, e.match, e.instructions, e.cookie) for e in sw.entries]
        apply_out(fake, [(d, m) for d, m in out if isinstance(m, parser.OFPFlowMod)])
        assert [(e.table, e.priority, e.match, e.instructions, e.cookie) for e in sw.entries] == before
        for m in flows:
            leaf.on_flow_stats(m.xid, [], False, t)
        return len(mods), len(flows), mods

    assert kinds(1.0, hot=False)[:2] == (0, 1)  # the background poll: no nudge
    cap_bytes = 400e9 * 1e-4 / 8
    leaf.on_port_stats(-1, {1: (0, 0, 10.19)}, False, 1.19)
    for i, t in enumerate((1.20, 1.21, 1.22)):
        leaf.on_port_stats(-1, {1: (int(cap_bytes * 0.01) * (i + 1), 0, 10.0 + t - 1.0)}, False, t)
    assert core.policy.hot_links() == (("leafA0", 1),)
    n_mods, n_flows, mods = kinds(1.23, hot=True)
    assert (n_mods, n_flows) == (1, 0)
    (mod,) = mods
    assert (mod.command, mod.table_id, mod.priority, mod.instructions) == (ofp.OFPFC_ADD, 2, 0, [])
    assert kinds(1.24, hot=True)[:2] == (0, 0)  # 10 ms after the nudge: not yet
    assert kinds(1.255, hot=True)[:2] == (0, 1)  # 20 ms after it
    # the next fast requests every 50 ms after that one, each nudge sent its 20 ms lead ahead
    seen = [(round(t, 3), kinds(round(t, 3), hot=True)[:2]) for t in (1.265 + 0.01 * i for i in range(10))]
    assert [(t, k) for t, k in seen if k != (0, 0)] == [(1.285, (1, 0)), (1.305, (0, 1)),
                                                         (1.335, (1, 0)), (1.355, (0, 1))], seen
    # a second after the link turned hot: polls every 0.25 s, without nudges
    seen = [kinds(round(2.3 + 0.01 * i, 3), hot=True)[:2] for i in range(60)]
    assert seen.count((0, 1)) >= 2 and all(k in ((0, 0), (0, 1)) for k in seen), seen


def _drive(leaf, fake, shares, t0=1.19):
    """Port samples of leafA0's uplink 1 every 10 ms after `t0`, each carrying the given share of its
    40 Mbit/s (5 MB/s) over the switch's step between samples (1/64 s, exact in binary, so every port
    rate spans two steps: >= the 20 ms window), and after each what leafA0 sends then (nudges applied
    to the fake, flow requests answered empty): time -> (nudges, flow requests, uplink hot)."""
    step_s = 1 / 64
    leaf.on_port_stats(-1, {1: (0, 0, 10.0)}, False, t0)
    n, seen = 0, {}
    for i, share in enumerate(shares, start=1):
        t = round(t0 + 0.01 * i, 3)
        n += int(5e6 * step_s * share)
        leaf.on_port_stats(-1, {1: (n, 0, 10.0 + step_s * i)}, False, t)
        hot = leaf.core.policy.hot_links() == (("leafA0", 1),)
        out = leaf.due(t, hot=hot)
        mods = [m for _, m in out if isinstance(m, parser.OFPFlowMod)]
        flows = [m for _, m in out if isinstance(m, parser.OFPFlowStatsRequest)]
        assert all(m.table_id == 2 for m in mods)
        apply_out(fake, [(d, m) for d, m in out if isinstance(m, parser.OFPFlowMod)])
        for m in flows:
            leaf.on_flow_stats(m.xid, [], False, t)
        seen[t] = (len(mods), len(flows), hot)
    return seen


def test_a_link_turning_warm_nudges_its_relievers_so_the_urgent_request_goes_as_it_turns_hot():
    # The uplink carries 30% for 20 ms, then 100%. Port rates over 20 ms, smoothed with weight 0.5
    # (worked by hand): 0.30 at 1.21, 0.475 at 1.22 (window 30%+100%), 0.7375 at 1.23 (>= the cool
    # threshold 0.7: warm), 0.869 at 1.24, 0.934 at 1.25 (>= 0.9: hot). The warm link's reliever,
    # leafA0, is nudged at 1.23; at 1.25 that nudge is 20 ms old (the lead) and fresh (<= 50 ms), so
    # the urgent request goes at once, 20 ms before it would without the early nudge.
    shares = [0.3, 0.3] + [1.0] * 7
    # (Then the fast requests every 50 ms, each nudged 20 ms ahead: the next nudge at 1.28 with the
    # early nudge, at 1.30, past the samples, without.)
    for warm_nudge, expected in ((True, {1.23: (1, 0), 1.25: (0, 1), 1.28: (1, 0)}),
                                 (False, {1.25: (1, 0), 1.27: (0, 1)})):
        _, core, fake, leaf = fast_polled_leaf(nudge_lead_s=0.02, warm_nudge=warm_nudge)
        req = next(m for _, m in leaf.due(1.0, hot=False) if isinstance(m, parser.OFPFlowStatsRequest))
        leaf.on_flow_stats(req.xid, [], False, 1.0)  # the background poll; the next is due at 2.0
        seen = _drive(leaf, fake, shares)
        assert [t for t, (_, _, hot) in seen.items() if hot] == [1.25, 1.26, 1.27, 1.28], seen
        assert {t: k[:2] for t, k in seen.items() if k[:2] != (0, 0)} == expected, (warm_nudge, seen)
        # the controller's congestion timeline (`/api/congestion`) tells the same story, step by step
        steps = [(t, step, sw, port) for t, step, sw, port in core.congestion_log if t > 1.19]
        if warm_nudge:
            story = [(1.23, "warm", "leafA0", 1), (1.23, "nudge", "leafA0", None), (1.25, "hot", "leafA0", 1),
                     (1.25, "urgent_request", "leafA0", None), (1.25, "reply", "leafA0", None),
                     (1.28, "nudge", "leafA0", None)]
        else:
            story = [(1.25, "hot", "leafA0", 1), (1.25, "nudge", "leafA0", None),
                     (1.27, "urgent_request", "leafA0", None), (1.27, "reply", "leafA0", None)]
        assert steps == story, steps


def test_fast_requests_as_often_as_the_nudge_lead_carry_the_next_nudge_with_them():
    # `urgent_flow_poll_s` 20 ms, as long as the nudge's lead: each fast request goes with the nudge
    # for the next one (in that order: the reply reads the counters the last nudge refreshed), so
    # they keep a 20 ms pace, not 20 ms plus a poll.
    _, core, fake, leaf = fast_polled_leaf(nudge_lead_s=0.02)
    leaf.config = dataclasses.replace(leaf.config, urgent_flow_poll_s=0.02)
    req = next(m for _, m in leaf.due(1.0, hot=False) if isinstance(m, parser.OFPFlowStatsRequest))
    leaf.on_flow_stats(req.xid, [], False, 1.0)
    seen = _drive(leaf, fake, [0.3, 0.3] + [1.0] * 9)  # warm at 1.23, hot at 1.25 (worked out above)
    assert {t: k[:2] for t, k in seen.items() if k[:2] != (0, 0)} == {
        1.23: (1, 0), 1.25: (1, 1), 1.27: (1, 1), 1.29: (1, 1)}, seen
    # logged as sent (the request, then the nudge), then the reply (answered here after the tick)
    steps = [step for t, step, _, _ in core.congestion_log if t == 1.27]
    assert steps == ["urgent_request", "nudge", "reply"], steps


def test_a_link_that_stays_warm_nudges_once_and_again_only_after_it_cooled():
    # 80% for ten samples, 40% for six, 80% for six: the smoothed utilisation, worked out below from
    # the shares alone, rises through the cool threshold (0.7) twice and never reaches 0.9; the link
    # is nudged for at each rise, not at every sample while warm.
    _, core, fake, leaf = fast_polled_leaf(nudge_lead_s=0.02)
    shares = [0.8] * 10 + [0.4] * 6 + [0.8] * 6
    util, rates = None, {}
    for i in range(2, len(shares) + 1):  # the smoothed utilisation, by hand: 20 ms windows, weight 0.5
        window = (shares[i - 2] + shares[i - 1]) / 2
        util = window if util is None else util + 0.5 * (window - util)
        rates[round(1.19 + 0.01 * i, 3)] = util
    warm, rises = False, []
    for t, u in rates.items():
        if not warm and u >= 0.7:
            rises.append(t)
        warm = u >= 0.7
    assert len(rises) == 2 and max(rates.values()) < 0.9, rates  # two rises, never hot
    seen = _drive(leaf, fake, shares)
    assert not any(hot for _, _, hot in seen.values())
    assert [t for t, (nudges, _, _) in seen.items() if nudges] == rises, (rises, seen)


def test_switches_that_connect_while_a_mesh_link_is_down_forward_over_the_detours():
    # dual_plane mesh of 4 leaves per plane (ports by hand in tests/test_paths.py): leafA0 -- leafA1
    # (port 1 at both ends) is down when the switches connect, and their port descriptions say so.
    # h0 (leafA0) -> h2 (leafA1): slot s = (source port >> 1) & 15 goes via leafA2 if even, leafA3 if odd.
    fab = dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh")
    fake = FakeFabric(fab)
    fake.set_link("leafA0", 1, False)
    core = ControllerCore(fab, "adaptive")
    for sw in fab.switches:
        connect(core, fake, sw.name)
    ip = str(fab.nic("h2", "A").ip)
    sports = [49152 + 2 * s for s in range(16)]
    detours = [["leafA0", f"leafA{2 + s % 2}", "leafA1", "h2"] for s in range(16)]
    assert [fake.trace("h0", 0, tcp(ip, sp)) for sp in sports] == detours
    # a restarted controller learns the link is down from the port descriptions and finds every
    # table (slots on the detours, detour groups, transit flows) right: nothing but barriers
    core2 = ControllerCore(fab, "adaptive")
    assert [connect(core2, fake, sw.name)[1] for sw in fab.switches] == [[]] * len(fab.switches)
    assert [fake.trace("h0", 0, tcp(ip, sp)) for sp in sports] == detours
    # the link comes back (a port status at each end): direct again
    fake.set_link("leafA0", 1, True)
    for sw in ("leafA0", "leafA1"):
        apply_out(fake, outgoing(core2.on_port_status(fab.switch_by_name[sw].dpid, 1, True, 1.0)))
    assert {tuple(fake.trace("h0", 0, tcp(ip, sp))) for sp in sports} == {("leafA0", "leafA1", "h2")}
