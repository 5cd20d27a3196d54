"""The controller's decisions applied to a fake OpenFlow pipeline: where do packets go?

Expected paths are worked out by hand from the topology files and the documented entropy rule
(slot = (source port >> 1) & 15 at the leaf tier; slot s -> the (s mod k)-th equal-cost port).
"""
from __future__ import annotations

import itertools
import random
import struct

import pytest
from os_ken.ofproto import ofproto_v1_3, ofproto_v1_3_parser

from controller import ofmsg
from controller.core import ControllerCore
from controller.intents import COOKIE, FlowIntent, Output, ToGroup
from fabric import topofile
from fabric.builders import dual_plane
from fabric.errors import FabriclabError
from tests.fakeoftable import FakeFabric

SPORTS = random.Random(7).sample(range(1024, 65536), 300)
TOPOS = ["dual-plane-16", "pyramid-16", "leaf-spine-16"]


def programmed(topo, mode, **kw):
    fab = topofile.load(topo)
    core = ControllerCore(fab, mode, **kw)
    fake = FakeFabric(fab)
    for sw in fab.switches:
        fake.apply(core.on_switch_connect(sw.dpid))
    return fab, core, fake


def tcp(ip, sport):
    return {"eth_type": 0x0800, "ipv4_dst": ip, "ip_proto": 6, "tcp_src": sport}


def udp(ip, sport):
    return {"eth_type": 0x0800, "ipv4_dst": ip, "ip_proto": 17, "udp_src": sport}


def all_packets(ip, sports):
    yield {"eth_type": 0x0800, "ipv4_dst": ip, "ip_proto": 1}
    yield {"eth_type": 0x0806, "arp_tpa": ip}
    for sp in sports:
        yield tcp(ip, sp)
        yield udp(ip, sp)


HOPS = {  # host-to-host links, by hand: same leaf 2, leaf-spine-leaf 4, pyramid across pods 6
    "dual-plane-16": {("h0", "h1"): 2, ("h0", "h4"): 4, ("h5", "h14"): 4},
    "pyramid-16": {("h0", "h1"): 2, ("h0", "h4"): 4, ("h0", "h8"): 6, ("h15", "h3"): 6},
    "leaf-spine-16": {("h0", "h3"): 2, ("h0", "h12"): 4},
}


@pytest.mark.parametrize("mode", ["static", "ecmp", "adaptive"])
@pytest.mark.parametrize("topo", TOPOS)
def test_every_packet_reaches_its_host_on_a_shortest_path(topo, mode):
    fab, _, fake = programmed(topo, mode)
    for (src, dst), i in zip(itertools.permutations([h.name for h in fab.hosts], 2), itertools.count()):
        for s_nic in fab.nics_of[src]:
            d_nic = fab.nic(dst, s_nic.plane)
            for pkt in all_packets(str(d_nic.ip), SPORTS[i % 290: i % 290 + 2]):
                path = fake.trace(src, s_nic.nic, pkt)
                assert path[-1] == dst, (src, dst, pkt, path)
                assert {fab.switch_by_name[n].plane for n in path[:-1]} == {s_nic.plane}
                if (src, dst) in HOPS[topo]:
                    assert len(path) == HOPS[topo][(src, dst)]


def test_unknown_destinations_and_other_traffic_are_dropped():
    fab, _, fake = programmed("dual-plane-16", "adaptive")
    assert fake.trace("h0", 0, tcp("198.18.9.9", 50000))[-1] == "DROP"  # no such host
    assert fake.trace("h0", 0, tcp("198.19.0.5", 50000))[-1] == "DROP"  # plane-B address into plane A
    assert fake.trace("h0", 0, {"eth_type": 0x86DD})[-1] == "DROP"  # IPv6


@pytest.mark.parametrize("topo, src, dst, n_paths", [
    ("dual-plane-16", "h0", "h15", 2),   # 2 spines in plane A
    ("leaf-spine-16", "h0", "h12", 4),   # 4 spines
    ("pyramid-16", "h0", "h8", 8),       # 2 aggs x 2 cores x 2 aggs
])
@pytest.mark.parametrize("proto", [tcp, udp], ids=["tcp", "udp"])
def test_ecmp_spreads_tcp_and_udp_over_every_equal_cost_path(topo, src, dst, n_paths, proto):
    fab, _, fake = programmed(topo, "ecmp")
    ip = str(fab.nic(dst, "A").ip)
    paths = [tuple(fake.trace(src, 0, proto(ip, sp))) for sp in SPORTS]
    counts = {p: paths.count(p) for p in set(paths)}
    assert len(counts) == n_paths
    # 300 random ports over n equal paths: each gets its share within a wide binomial band
    share = len(SPORTS) / n_paths
    assert all(0.5 * share <= c <= 1.6 * share for c in counts.values()), counts


def test_static_mode_uses_one_path_per_destination():
    fab, _, fake = programmed("dual-plane-16", "static")
    ip = str(fab.nic("h15", "A").ip)
    assert len({tuple(fake.trace("h0", 0, tcp(ip, sp))) for sp in SPORTS}) == 1


def test_source_port_picks_the_path():
    # leaf tier: slot = (sport >> 1) & 15; slot s -> uplink (s mod 2): port 1 = spineA0, port 2 = spineA1
    fab, _, fake = programmed("dual-plane-16", "adaptive")
    ip = str(fab.nic("h15", "A").ip)
    for slot in range(16):
        for sport in (49152 + 2 * slot, 49152 + 2 * slot + 1, 1024 + 32 + 2 * slot):
            for proto in (tcp, udp):
                assert fake.trace("h0", 0, proto(ip, sport))[1] == f"spineA{slot % 2}"


def test_local_link_failure_is_skipped_in_the_data_plane_without_the_controller():
    fab, core, fake = programmed("dual-plane-16", "ecmp")
    fake.set_link("leafA0", 1, up=False)  # leafA0 port 1 = uplink to spineA0
    assert core.on_port_status(fab.switch_by_name["leafA0"].dpid, 1, False, 1.0) == []  # ecmp: no reaction
    ip = str(fab.nic("h15", "A").ip)
    for sp in SPORTS:
        assert fake.trace("h0", 0, tcp(ip, sp)) == ["leafA0", "spineA1", "leafA3", "h15"]


def _fail(fab, core, fake, node, port, now, up=False):
    """A link changes: both ends report PortStatus; apply whatever the controller sends."""
    fake.set_link(node, port, up)
    peer, peer_port = fake.peer[(node, port)]
    for n, p in ((node, port), (peer, peer_port)):
        fake.apply(core.on_port_status(fab.switch_by_name[n].dpid, p, up, now))


def test_remote_failure_black_holes_under_ecmp_and_is_avoided_fabric_wide_under_adaptive():
    # spineA0 port 4 is its link to leafA3: every leaf must stop sending leafA3's traffic to spineA0
    for mode in ("ecmp", "adaptive"):
        fab, core, fake = programmed("dual-plane-16", mode)
        _fail(fab, core, fake, "spineA0", 4, 1.0)
        dead = frozenset({"spineA0", "leafA3"})
        drops = 0
        for src, dst in itertools.permutations([h.name for h in fab.hosts], 2):
            ip = str(fab.nic(dst, "A").ip)
            for pkt in all_packets(ip, SPORTS[:8]):
                path = fake.trace(src, 0, pkt)
                drops += path[-1] == "DROP"
                if mode == "adaptive":
                    assert path[-1] == dst and dead not in fake.links_of(src, 0, path), (src, dst, path)
        if mode == "ecmp":
            assert drops > 0
        else:
            assert core.policy.reroutes()["failure"] > 0 and drops == 0


def test_fabric_wide_failover_in_the_pyramid_steers_aggregation_away_from_a_cut_off_core():
    # core0 loses both its links to pod 1 (agg2, agg3): pod 0's aggregation switches must stop
    # using core0 for pod-1 destinations, and core0 itself can no longer reach pod 1
    fab, core, fake = programmed("pyramid-16", "adaptive")
    core0_ports = {fake.peer[("core0", p)][0]: p for p in range(1, 5)}
    _fail(fab, core, fake, "core0", core0_ports["agg2"], 1.0)
    _fail(fab, core, fake, "core0", core0_ports["agg3"], 1.1)
    for src, dst in itertools.permutations([h.name for h in fab.hosts], 2):
        ip = str(fab.nic(dst, "A").ip)
        for pkt in all_packets(ip, SPORTS[:6]):
            path = fake.trace(src, 0, pkt)
            assert path[-1] == dst, (src, dst, pkt, path)
            if int(src[1:]) < 8 <= int(dst[1:]):
                assert "core0" not in path


def test_recovery_restores_the_original_paths():
    fab, core, fake = programmed("dual-plane-16", "adaptive")
    probe = [(src, dst, sp) for src, dst in (("h0", "h15"), ("h5", "h14"), ("h9", "h2")) for sp in SPORTS[:40]]

    def paths():
        return [fake.trace(s, 0, tcp(str(fab.nic(d, "A").ip), sp)) for s, d, sp in probe]

    before = paths()
    _fail(fab, core, fake, "spineA0", 4, 1.0)
    _fail(fab, core, fake, "leafA0", 2, 1.1)
    during = paths()
    assert during != before
    _fail(fab, core, fake, "spineA0", 4, 2.0, up=True)
    _fail(fab, core, fake, "leafA0", 2, 2.1, up=True)
    assert paths() == before
    assert core.policy.reroutes()["recovery"] > 0


def test_hot_link_sheds_its_heaviest_slot_to_the_least_loaded_alternative():
    # leaf-spine-16 at 0.1 Mbit/s per Gbit/s: a 400G uplink is 40 Mbit/s (5e6 bytes/s).
    # leafA0's uplinks: port 1 -> spineA0 ... port 4 -> spineA3. Towards leafA3, slot s uses
    # port (s mod 4) + 1, so slots 0, 4, 8, 12 share port 1.
    fab, core, fake = programmed("leaf-spine-16", "adaptive", rate_scale=1e-4)
    cap = 400e9 * 1e-4  # bits/s
    cap_bytes = cap / 8
    dpid = fab.switch_by_name["leafA0"].dpid
    util = {1: 0.95, 2: 0.5, 3: 0.2, 4: 0.6}
    # counters as (tx bytes, rx bytes, the port's duration on the switch's clock)
    core.on_port_counters(dpid, {p: (0, 0, 5.0) for p in util})
    rates = core.on_port_counters(dpid, {p: (int(u * cap_bytes * 0.1), 0, 5.1) for p, u in util.items()})
    assert rates[("leafA0", 1)] == pytest.approx(0.95 * cap, rel=1e-6)
    slot_load = {0: 0.1, 4: 0.3, 8: 0.05}  # slot 4 is the heaviest on port 1
    flows = {s: core.slot_flows("leafA0", "leafA3", s, 1)[0] for s in slot_load}
    core.on_flow_counters(dpid, [(f, 0, 3.0) for f in flows.values()])
    slots = core.on_flow_counters(dpid, [(flows[s], int(u * cap_bytes * 0.1), 3.1) for s, u in slot_load.items()])
    assert slots[("leafA0", "leafA3", 4)] == pytest.approx(0.3 * cap, rel=1e-6)

    ip = str(fab.nic("h12", "A").ip)
    assert fake.trace("h0", 0, tcp(ip, 49152 + 2 * 4))[1] == "spineA0"
    changes = core.on_loads(rates, 0.1)
    fake.apply(changes)
    # port 3 (spineA2) had the most room: 0.2 + 0.3 = 0.5 of capacity afterwards
    assert fake.trace("h0", 0, tcp(ip, 49152 + 2 * 4))[1] == "spineA2"
    assert fake.trace("h0", 0, udp(ip, 49152 + 2 * 4))[1] == "spineA2"
    assert fake.trace("h0", 0, tcp(ip, 49152 + 2 * 0))[1] == "spineA0"  # the others stay
    assert [(m.cause, m.slot, m.old_port, m.new_port) for e in core.policy.events() for m in e.moves] == [
        ("congestion", 4, 1, 3)]
    # within the hold-down nothing more moves at that decision point, even if still hot
    assert core.on_loads(rates, 0.15) == []


def test_hysteresis_keeps_a_link_hot_until_it_cools_below_the_low_mark():
    fab, core, _ = programmed("leaf-spine-16", "adaptive", rate_scale=1e-4)
    cap = 400e9 * 1e-4
    link = ("leafA0", 1)
    r = core.policy
    r.on_loads({link: 0.95 * cap}, {}, 0.0)
    assert link in r.hot_links()
    r.on_loads({link: 0.65 * cap}, {}, 0.1)  # EWMA 0.5: (0.95 + 0.65) / 2 = 0.8 -> still hot
    assert link in r.hot_links() and r.utilisation(link) == pytest.approx(0.8)
    r.on_loads({link: 0.3 * cap}, {}, 0.2)  # (0.8 + 0.3) / 2 = 0.55 < 0.7 -> cool
    assert link not in r.hot_links()


@pytest.mark.parametrize("mode", ["static", "ecmp"])
def test_baseline_modes_do_not_react(mode):
    fab, core, _ = programmed("leaf-spine-16", mode, rate_scale=1e-4)
    cap = 400e9 * 1e-4
    assert core.on_port_status(fab.switch_by_name["spineA0"].dpid, 4, False, 1.0) == []
    core.last_slot_rates_bps[("leafA0", "leafA3", 0)] = cap
    core.last_slot_rates_bps[("leafA0", "leafA3", 4)] = cap
    assert core.on_loads({("leafA0", 1): cap}, 1.0) == []
    assert sum(core.policy.reroutes().values()) == 0 and core.policy.events() == ()


def test_resync_sends_only_the_difference():
    fab = topofile.load("dual-plane-16")
    core = ControllerCore(fab, "adaptive")
    dpid = fab.switch_by_name["leafA0"].dpid
    want = core.flows("leafA0")
    groups = {g.group_id: g.ports for g in core.groups("leafA0")}
    assert len(core.resync(dpid, groups, want)) == 0  # in sync: nothing at all is sent

    have = list(want)
    missing = have.pop(5)
    wrong = have[7]
    have[7] = FlowIntent(wrong.dpid, wrong.table, wrong.priority, wrong.match, Output(99))
    stale = FlowIntent(dpid, 0, 1000, (("eth_type", 0x0800), ("ipv4_dst", "198.18.3.3")), Output(1))
    have.append(stale)
    gid = min(groups)
    changes = core.resync(dpid, {g: p for g, p in groups.items() if g != gid}, have)
    assert changes.flows_add == (missing,)
    assert [f.key for f in changes.flows_modify] == [wrong.key]
    assert changes.flows_delete == (stale,)
    assert [g.group_id for g in changes.groups_add] == [gid] and changes.groups_modify == ()


def test_unsupported_mode_is_an_error():
    with pytest.raises(FabriclabError, match="routing 'magic' is not a built-in mode"):
        ControllerCore(topofile.load("leaf-spine-16"), "magic")


class _Datapath:
    ofproto = ofproto_v1_3
    ofproto_parser = ofproto_v1_3_parser
    id = 1


def _round_trip(msg):
    msg.datapath = _Datapath()
    msg.set_xid(7)
    msg.serialize()
    buf = bytes(msg.buf)
    version, msg_type, msg_len, xid = ofproto_v1_3_parser.ofproto_parser.header(buf)
    assert version == ofproto_v1_3.OFP_VERSION
    return msg_type, ofproto_v1_3_parser.ofproto_parser.msg(_Datapath(), version, msg_type, msg_len, xid, buf)


def test_messages_serialise_to_openflow13_and_parse_back():
    fab = topofile.load("dual-plane-16")
    core = ControllerCore(fab, "adaptive")
    slot_flow = core.slot_flows("leafA0", "leafA3", 5, 2)[0]
    msg_type, back = _round_trip(ofmsg.flow_mod(slot_flow))
    assert msg_type == ofproto_v1_3.OFPT_FLOW_MOD
    assert dict(back.match.items()) == dict(slot_flow.match)
    # masked source-port match for slot 5 at the leaf tier: value 5 << 1, mask 15 << 1
    assert dict(back.match.items())["tcp_src"] == (10, 30)
    assert back.table_id == 1 and back.cookie == COOKIE
    assert isinstance(slot_flow.action, ToGroup)
    assert back.instructions[0].actions[0].group_id == slot_flow.action.group_id
    # os-ken has no parser for GROUP_MOD (switch-bound only): read the wire format by hand
    # (OpenFlow 1.3 spec 7.3.4.2: command u16, type u8, pad, group_id u32; buckets: len u16,
    # weight u16, watch_port u32, watch_group u32, pad[4], actions)
    group = core.groups("leafA0")[0]
    msg = ofmsg.group_mod(group)
    msg.datapath = _Datapath()
    msg.set_xid(8)
    msg.serialize()
    buf = bytes(msg.buf)
    assert buf[1] == ofproto_v1_3.OFPT_GROUP_MOD
    command, gtype, gid = struct.unpack_from("!HBxI", buf, 8)
    assert (command, gtype, gid) == (ofproto_v1_3.OFPGC_ADD, ofproto_v1_3.OFPGT_FF, group.group_id)
    watched, off = [], 16
    while off < len(buf):
        blen, _, watch_port, _ = struct.unpack_from("!HHII", buf, off)
        watched.append(watch_port)
        off += blen
    assert watched == list(group.ports)


def test_congestion_moves_spread_elephants_and_leave_a_lone_elephant_alone():
    fab, core, _ = programmed("leaf-spine-16", "adaptive", rate_scale=1e-4)
    cap = 400e9 * 1e-4
    r = core.policy
    ports = {("leafA0", p): u * cap for p, u in {1: 1.0, 2: 0.9, 3: 0.2, 4: 0.9}.items()}
    # towards leafA3, port 1 carries slots 0, 4, 8, 12; port 2 slots 1, 5, 9, 13; port 4 slots 3, 7, ...
    # one elephant (slot 4) and a mouse (slot 8, 0.03 < 0.05) on port 1: nothing a move can fix
    slots = {("leafA0", "leafA3", 4): 0.9 * cap, ("leafA0", "leafA3", 8): 0.03 * cap,
             ("leafA0", "leafA3", 1): 0.9 * cap, ("leafA0", "leafA3", 3): 0.9 * cap}
    assert r.on_loads(ports, slots, 1.0) == []
    # a second elephant (slot 0) joins port 1: one of the two moves to port 3 (spineA2), the only
    # path without an elephant; ports 2 and 4 already have one each
    slots[("leafA0", "leafA3", 0)] = 0.5 * cap
    (move,) = r.on_loads(ports, slots, 2.0)
    assert (move.old_port, move.new_port) == (1, 3) and move.slot in (0, 4)
    # afterwards every uplink has one elephant: no further move, however hot port 1 stays
    assert r.on_loads(ports, slots, 5.0) == []


def two_elephants_on_port_1():
    """leaf-spine-16 at 1e-4 (leafA0's uplinks 40 Mbit/s): towards leafA3, elephants in slots 4 and 0
    on port 1 (hot), one each on ports 2 and 4, port 3 nearly idle. Returns (core, cap, ports, slots)."""
    _, core, _ = programmed("leaf-spine-16", "adaptive", rate_scale=1e-4)
    cap = 400e9 * 1e-4
    ports = {("leafA0", p): u * cap for p, u in {1: 1.0, 2: 0.9, 3: 0.2, 4: 0.9}.items()}
    slots = {("leafA0", "leafA3", 4): 0.9 * cap, ("leafA0", "leafA3", 0): 0.5 * cap,
             ("leafA0", "leafA3", 1): 0.9 * cap, ("leafA0", "leafA3", 3): 0.9 * cap}
    return core, cap, ports, slots


def test_a_slot_moved_off_a_hot_link_goes_home_once_it_is_idle_and_home_has_cooled():
    # the same start as above: of slots 0 and 4 on port 1 (towards leafA3) one moves to port 3
    core, cap, ports, slots = two_elephants_on_port_1()
    r = core.policy
    base = r.slots("leafA0", "leafA3")
    (move,) = r.on_loads(ports, slots, 2.0)
    assert (move.old_port, move.new_port) == (1, 3)
    moved = move.slot
    # still carrying its elephant: it stays on port 3, whatever port 1 does
    ports[("leafA0", 1)] = 0.1 * cap
    assert r.on_loads(ports, slots, 3.0) == []
    # idle, but its home port 1 is hot again: it stays
    ports[("leafA0", 1)] = 1.0 * cap
    for t in (3.5, 3.6, 3.7, 3.8, 3.9):  # the smoothed rate (weight 0.5 per sample) passes hot_util 0.9
        r.on_loads(ports, slots, t)
    assert ("leafA0", 1) in r.hot_links()
    slots[("leafA0", "leafA3", moved)] = 0.0
    assert r.on_loads(ports, slots, 4.0) == []
    # idle and port 1 cool (0.1 of its rate, twice: smoothed 0.52, then 0.31, below cool_util 0.7): home
    r.on_loads(ports | {("leafA0", 1): 0.1 * cap}, slots | {("leafA0", "leafA3", moved): 0.9 * cap}, 4.5)
    ports[("leafA0", 1)] = 0.1 * cap
    (back,) = r.on_loads(ports, slots, 5.0)
    assert (back.slot, back.old_port, back.new_port, back.cause) == (moved, 3, 1, "congestion")
    assert r.slots("leafA0", "leafA3") == base
    assert "idle slot(s) back on their all-links-up port" in r.events()[-1].trigger
    assert r.on_loads(ports, slots, 6.0) == []


def test_a_slot_moved_in_its_first_second_is_not_read_as_idle_while_its_rate_window_holds_its_start():
    # A flow moved off a hot link right after it started: its windowed rate (1 s) is still diluted by
    # the idle time before it, below the idle floor (5% of the link), while it is in fact an elephant.
    # The link it left cools (the flow that stayed there ramps up only over some round trips). Read
    # as idle, the slot went home onto that link, which turned hot again: a second move, a flap.
    core, cap, ports, slots = two_elephants_on_port_1()
    r = core.policy
    (move,) = r.on_loads(ports, slots, 2.0)
    moved = ("leafA0", "leafA3", move.slot)
    # port 1 cools below cool_util (smoothed: 0.55, then 0.325); the moved slot's last windowed rate
    # is 1% of the link, but it started sending 20 full frames ago: a newcomer
    ports[("leafA0", 1)] = 0.1 * cap
    slots[moved] = 0.01 * cap
    assert r.on_loads(ports, slots, 2.1, {moved: 30000}) == []
    assert r.on_loads(ports, slots, 2.3, {moved: 30000}) == []  # past the hold-down (0.2 s)
    assert ("leafA0", 1) not in r.hot_links()
    # a slot with fewer bytes than a newcomer needs (a handshake) is no elephant: it is idle and goes
    # home; so does this one once its window covers its activity and it really is idle
    (back,) = r.on_loads(ports, slots, 2.4, {moved: 3000})
    assert (back.slot, back.old_port, back.new_port) == (move.slot, 3, 1)


def test_counter_rates_respect_the_minimum_window():
    from controller.core import CounterRates

    r = CounterRates(min_window_s=1.0)
    assert r.update("k", 0, 10.0) is None
    assert r.update("k", 500, 10.5) is None  # only 0.5 s of history
    assert r.update("k", 1000, 11.0) == pytest.approx(1000.0)  # (1000 - 0) / 1 s
    # a counter that only moves in jumps (refreshed every 0.5 s) still gives the mean rate over >= 1 s
    assert r.update("k", 1000, 11.2) == pytest.approx(1000 / 1.2)
    assert r.update("k", 2000, 12.0) == pytest.approx((2000 - 1000) / 1.0)
    assert r.update("k", 2100, 12.0) is None  # same instant on the switch's clock: ignored
    assert r.update("k", 2500, 12.2) == pytest.approx((2500 - 1000) / 1.0)  # from the sample at 11.2
    assert r.update("k", 5, 12.3) is None  # counter reset


def test_slot_rates_of_different_switches_are_kept_apart():
    # leafA0 and leafA1 have table-1 flows with identical matches (same destination id and slot bits)
    fab, core, _ = programmed("dual-plane-16", "adaptive")
    f0 = core.slot_flows("leafA0", "leafA3", 0, 1)[0]
    f1 = core.slot_flows("leafA1", "leafA3", 0, 1)[0]
    assert f0.match == f1.match
    d0, d1 = fab.switch_by_name["leafA0"].dpid, fab.switch_by_name["leafA1"].dpid
    core.on_flow_counters(d0, [(f0, 0, 1.0)])
    core.on_flow_counters(d1, [(f1, 5_000_000, 1.0)])
    r0 = core.on_flow_counters(d0, [(f0, 1000, 2.0)])
    r1 = core.on_flow_counters(d1, [(f1, 5_004_000, 2.0)])
    # 1000 and 4000 bytes in one second: 8000 and 32000 bits/s
    assert r0 == {("leafA0", "leafA3", 0): 8000.0} and r1 == {("leafA1", "leafA3", 0): 32000.0}


# pyramid-16 by hand, from the builder's wiring order (cores first, then per pod: its aggs, each
# linked to every core, then its ToRs, each linked to every agg of the pod; hosts last):
#   tor0: port 1 -> agg0, 2 -> agg1, 3..6 -> h0..h3      tor2: port 1 -> agg2, 2 -> agg3, 3..6 -> h8..h11
#   tor1: port 1 -> agg0, 2 -> agg1, 3..6 -> h4..h7      tor3: port 1 -> agg2, 2 -> agg3, 3..6 -> h12..h15
#   agg0: 1 -> core0, 2 -> core1, 3 -> tor0, 4 -> tor1   agg2: 1 -> core0, 2 -> core1, 3 -> tor2, 4 -> tor3
#   core0: 1 -> agg0, 2 -> agg1, 3 -> agg2, 4 -> agg3
# Slot fields: ToR tier bits 1-4, agg tier bits 5-8, core tier bits 9-12 of the source port; slot s
# takes the (s mod 2)-th of the two equal-cost ports. Source port 49152 is slot 0 at every tier and
# 49152 + (2 << 1) + (2 << 5) + (2 << 9) = 50244 is slot 2 at every tier: both take the first port.
PYR_CAP_BPS = 400e9 * 1e-4  # every switch-to-switch link of pyramid-16 is 400G; at 0.1 Mbit/s per Gbit/s


def test_one_flow_counts_as_one_elephant_on_each_link_of_its_pyramid_path_and_nowhere_else():
    from tests.fluid import Flow, Fluid

    fab, core, fake = programmed("pyramid-16", "adaptive", rate_scale=1e-4)
    flow = Flow("h0", "h8", 49152)
    fluid = Fluid(core, fake, [flow], 1e-4)
    fluid.round()
    assert fake.trace("h0", 0, tcp(str(fab.nic("h8", "A").ip), 49152)) == ["tor0", "agg0", "core0", "agg2", "tor2", "h8"]
    # measured at its three decision points (tor0, agg0, core0), each at the flow's full rate
    assert {k: round(v / PYR_CAP_BPS, 3) for k, v in core.last_slot_rates_bps.items() if v} == {
        ("tor0", "tor2", 0): 1.0, ("agg0", "tor2", 0): 1.0, ("core0", "tor2", 0): 1.0}
    count = core.policy.elephants(core.last_slot_rates_bps, 0.05 * PYR_CAP_BPS)
    assert dict(+count) == {("tor0", 1): 1, ("agg0", 1): 1, ("core0", 3): 1, ("agg2", 3): 1}


def _shared_switch_links(fab, fluid):
    a, b = ([l for l in fluid.links(f) if l[0] in fab.switch_by_name] for f in fluid.flows)
    return set(a) & set(b)


@pytest.mark.parametrize("b_src, b_dst, shared", [
    # same ToRs: the whole path tor0 -> agg0 -> core0 -> agg2 -> tor2
    ("h1", "h9", {("tor0", 1), ("agg0", 1), ("core0", 3), ("agg2", 3)}),
    # other ToRs, other destination: they share agg0 -> core0 -> agg2 only
    ("h4", "h12", {("agg0", 1), ("core0", 3)}),
])
def test_two_elephants_sharing_a_pyramid_path_are_split_within_a_few_rounds(b_src, b_dst, shared):
    from tests.fluid import Flow, Fluid

    fab, core, fake = programmed("pyramid-16", "adaptive", rate_scale=1e-4)
    fluid = Fluid(core, fake, [Flow("h0", "h8", 49152), Flow(b_src, b_dst, 50244)], 1e-4)
    assert _shared_switch_links(fab, fluid) == shared
    rounds = 0
    while _shared_switch_links(fab, fluid) and rounds < 3:
        fluid.round()
        rounds += 1
    assert _shared_switch_links(fab, fluid) == set(), f"still shared after {rounds} rounds"
    # split for good: each flow at its NIC's full rate, and nothing moves any more
    assert sum(fluid.round() for _ in range(6)) == 0
    assert [round(r / PYR_CAP_BPS, 6) for r in fluid.rates_bps] == [1.0, 1.0]
    assert _shared_switch_links(fab, fluid) == set()


def test_a_hot_link_with_two_elephant_slots_moves_one_at_every_pyramid_decision_point():
    # the decision-latency benchmark's congestion event, everywhere: slots on one port at 10% each
    fab = topofile.load("pyramid-16")
    for sw, dest in ControllerCore(fab, "adaptive").policy.decision_points():
        core = ControllerCore(fab, "adaptive", rate_scale=1e-4)
        slots = core.policy.slots(sw, dest)
        port = slots[0]
        core.last_slot_rates_bps.update({(sw, dest, s): 0.1 * PYR_CAP_BPS for s, p in enumerate(slots) if p == port})
        core.on_loads({(sw, port): 0.97 * PYR_CAP_BPS}, 1.0)
        moves = [m for e in core.policy.events() for m in e.moves]
        assert [(m.switch, m.dest, m.old_port, m.cause) for m in moves] == [(sw, dest, port, "congestion")], (sw, dest)


def test_an_operators_drain_survives_recoveries_until_released():
    fab, core, fake = programmed("dual-plane-16", "adaptive")
    ip = str(fab.nic("h15", "A").ip)
    sports = [49152 + 2 * s for s in range(16)]  # slot s at the leaf tier

    def spine_of_slot():
        return [fake.trace("h0", 0, tcp(ip, sp)) for sp in sports]

    def spines():
        paths = spine_of_slot()
        assert all(p[-1] == "h15" for p in paths), paths
        return {p[1] for p in paths}

    assert spines() == {"spineA0", "spineA1"}
    # drain leafA0's uplink 1 (spineA0) for leafA3: its slots (the even ones) onto port 2 (spineA1)
    for slot in range(0, 16, 2):
        fake.apply(core.on_manual_move("leafA0", "leafA3", slot, 2, 1.0))
    assert spines() == {"spineA1"}
    # spineA0's link to leafA3 (spineA0 port 4), on the drained path, fails and recovers: still drained
    _fail(fab, core, fake, "spineA0", 4, 2.0)
    assert spines() == {"spineA1"}
    _fail(fab, core, fake, "spineA0", 4, 3.0, up=True)
    assert spines() == {"spineA1"}
    # the path it was drained to fails: traffic takes the only live way meanwhile, and comes back
    _fail(fab, core, fake, "spineA1", 4, 4.0)
    assert spines() == {"spineA0"}
    _fail(fab, core, fake, "spineA1", 4, 5.0, up=True)
    assert spines() == {"spineA1"}
    # congestion moves no pinned slot: the hot uplink to spineA1 (400G) carries elephants in
    # pinned slots 0 and 2 and in slot 1; only slot 1 may go (to spineA0, which has none)
    cap = 400e9
    core.last_slot_rates_bps.update({("leafA0", "leafA3", s): 0.3 * cap for s in (0, 1, 2)})
    fake.apply(core.on_loads({("leafA0", 2): cap}, 6.0))
    assert [(m.cause, m.slot, m.new_port) for m in core.policy.events()[-1].moves] == [("congestion", 1, 1)]
    # undone explicitly: the operator releases one slot, then all; they go back to slot s -> spine s mod 2
    fake.apply(core.on_release("leafA0", "leafA3", 4, 7.0))
    assert [p[1] for p in spine_of_slot()] == ["spineA1", "spineA0"] + ["spineA1"] * 2 + ["spineA0"] + ["spineA1"] * 11
    fake.apply(core.on_release("leafA0", "leafA3", None, 8.0))
    assert [p[1] for p in spine_of_slot()] == ["spineA0"] * 2 + ["spineA0", "spineA1"] * 7  # slot 1: congestion's
    with pytest.raises(FabriclabError, match="slot 0 at leafA0 towards leafA3 is not pinned"):
        core.on_release("leafA0", "leafA3", 0, 9.0)
    causes = [(e.cause, e.trigger) for e in core.policy.events()]
    assert ("manual", "operator release") in causes


# ---- two-hop detours in a mesh plane ------------------------------------------------------------
# dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh"), port numbers by hand in tests/test_paths.py:
# leafA0: 1 -> leafA1, 2 -> leafA2, 3 -> leafA3; leafA2: 2 -> leafA1; leafA3: 2 -> leafA1. Leaf tier:
# slot = (source port >> 1) & 15; 16 slots.
MESH = dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh")
MESH_SPORTS = [49152 + 2 * s for s in range(16)]


def programmed_mesh(mode):
    core = ControllerCore(MESH, mode)
    fake = FakeFabric(MESH)
    for sw in MESH.switches:
        fake.apply(core.on_switch_connect(sw.dpid))
    return core, fake


def _tables_forward_as_the_policy_says(core, fake):
    """Every host pair, plane and slot: the fake switches forward as `policy.path` (and so
    `/api/paths`) says, and never into a dead link."""
    for src, dst in itertools.permutations([h.name for h in MESH.hosts], 2):
        for s_nic in MESH.nics_of[src]:
            d_nic = MESH.nic(dst, s_nic.plane)
            for sp in MESH_SPORTS:
                want = core.policy.path(s_nic, d_nic, sp)
                got = fake.trace(src, s_nic.nic, tcp(str(d_nic.ip), sp))
                if want is None:
                    assert got[-1] == "DROP", (src, dst, sp, got)
                else:
                    assert got == list(want[1:]), (src, dst, sp, want, got)


@pytest.mark.parametrize("mode", ["ecmp", "adaptive"])
def test_a_failed_mesh_link_is_detoured_in_the_data_plane_and_restored(mode):
    core, fake = programmed_mesh(mode)
    ip = str(MESH.nic("h2", "A").ip)
    for pkt in all_packets(ip, MESH_SPORTS):
        assert fake.trace("h0", 0, pkt) == ["leafA0", "leafA1", "h2"]
    _fail(MESH, core, fake, "leafA0", 1, 1.0)  # leafA0 -- leafA1
    for s, sp in enumerate(MESH_SPORTS):  # even slots via leafA2, odd via leafA3
        for proto in (tcp, udp):
            assert fake.trace("h0", 0, proto(ip, sp)) == ["leafA0", f"leafA{2 + s % 2}", "leafA1", "h2"]
    for pkt in all_packets(ip, SPORTS[:40]):  # ICMP and ARP too (they follow slot 0)
        path = fake.trace("h0", 0, pkt)
        assert path[-1] == "h2" and len(path) == 4 and path[1] in ("leafA2", "leafA3"), (pkt, path)
    _tables_forward_as_the_policy_says(core, fake)
    assert core.paths("h0", "h2", None, 0, 10)[0]["paths"] == [["h0", "leafA0", "leafA2", "leafA1", "h2"],
                                                                ["h0", "leafA0", "leafA3", "leafA1", "h2"]]
    _fail(MESH, core, fake, "leafA0", 1, 2.0, up=True)
    for pkt in all_packets(ip, MESH_SPORTS):
        assert fake.trace("h0", 0, pkt) == ["leafA0", "leafA1", "h2"]
    # leafA0 -- leafA1 and leafA0 -- leafA2 down: only leafA3; then leafA3 -- leafA1 too: dropped
    _fail(MESH, core, fake, "leafA0", 1, 3.0)
    _fail(MESH, core, fake, "leafA0", 2, 3.1)
    assert {tuple(fake.trace("h0", 0, tcp(ip, sp))) for sp in MESH_SPORTS} == {("leafA0", "leafA3", "leafA1", "h2")}
    _tables_forward_as_the_policy_says(core, fake)
    _fail(MESH, core, fake, "leafA3", 2, 3.2)
    assert {tuple(fake.trace("h0", 0, tcp(ip, sp))) for sp in MESH_SPORTS} == {("leafA0", "leafA3", "DROP")}
    assert fake.trace("h0", 1, tcp(str(MESH.nic("h2", "B").ip), 49152)) == ["leafB0", "leafB1", "h2"]
    _tables_forward_as_the_policy_says(core, fake)
    assert core.paths("h0", "h2", None, 0, 10)[0]["total"] == 0


@pytest.mark.parametrize("mode", ["ecmp", "adaptive"])
def test_a_detoured_packet_leaves_the_detour_leaf_by_its_direct_link_and_never_loops(mode):
    # leafA0 -- leafA1 and leafA2 -- leafA1 down. leafA0 fails even slots over to leafA2 (ecmp: the
    # data plane alone); leafA2's own slots towards leafA1 fail over too, even ones back to leafA0.
    # A packet that came to leafA2 on a detour must not follow them: out by leafA2's direct link to
    # leafA1 (dead: dropped), never back to leafA0 (a loop). Under adaptive nothing is sent that way.
    core, fake = programmed_mesh(mode)
    _fail(MESH, core, fake, "leafA0", 1, 1.0)
    _fail(MESH, core, fake, "leafA2", 2, 1.1)
    ip = str(MESH.nic("h2", "A").ip)
    via_a3 = ["leafA0", "leafA3", "leafA1", "h2"]
    got = [fake.trace("h0", 0, tcp(ip, sp)) for sp in MESH_SPORTS]
    if mode == "ecmp":
        assert got == [["leafA0", "leafA2", "DROP"] if s % 2 == 0 else via_a3 for s in range(16)]
        # leafA2's own traffic: even slots to leafA0, which may not detour it again
        assert fake.trace("h4", 0, tcp(ip, 49152)) == ["leafA2", "leafA0", "DROP"]
        assert fake.trace("h4", 0, tcp(ip, 49154)) == ["leafA2", "leafA3", "leafA1", "h2"]
    else:
        assert got == [via_a3] * 16
        assert fake.trace("h4", 0, tcp(ip, 49152)) == ["leafA2", "leafA3", "leafA1", "h2"]
    _tables_forward_as_the_policy_says(core, fake)


@pytest.mark.parametrize("down_at, end", [(("spineA0", 1), "leafA0"), (("leafA0", 1), "leafA0"),
                                          (("spineA0", 4), "leafA3")])
def test_a_link_down_changes_the_switches_forwarding_into_it_first(down_at, end):
    # spineA0 -> leafA0 fails: leafA1..A3 send their slots for leafA0 over spineA0 into the dead link
    # until their changes arrive; leafA0's fast-failover buckets already skip its dead port, so its
    # own changes (towards leafA1..A3) come last (not first, as by name), whichever end reports it
    fab, core, fake = programmed("dual-plane-16", "adaptive")
    sw, port = down_at
    changes = core.on_port_status(fab.switch_by_name[sw].dpid, port, False, 1.0)
    names = [fab.switch_by_dpid[c.dpid].name for c in changes]
    assert sorted(names) == ["leafA0", "leafA1", "leafA2", "leafA3"]
    assert names[-1] == end
    fake.apply(changes)  # and they are still the whole reaction: every pair reaches across the plane
