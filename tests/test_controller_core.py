"""The controller's decisions, applied to a fake flow table: where do packets go?"""
from __future__ import annotations

import itertools

import pytest
from os_ken.ofproto import ofproto_v1_3, ofproto_v1_3_parser

from controller import ofmsg
from controller.core import COOKIE, ControllerCore
from fabric import topofile
from fabric.errors import FabriclabError
from tests.fakeoftable import FakeFabric


def programmed(fab, mode="static"):
    core = ControllerCore(fab, mode)
    fake = FakeFabric(fab)
    for sw in fab.switches:
        fake.apply(sw.dpid, [ofmsg.flow_mod(i) for i in core.on_switch_connect(sw.dpid)])
    return fake


@pytest.mark.parametrize("topo, hops_by_pair", [
    # expected host-to-host hop counts by hand: same leaf 2, leaf-spine-leaf 4, pyramid cross-pod 6
    ("dual-plane-16", {("h0", "h1"): 2, ("h0", "h4"): 4, ("h5", "h14"): 4}),
    ("pyramid-16", {("h0", "h1"): 2, ("h0", "h4"): 4, ("h0", "h8"): 6, ("h15", "h3"): 6}),
    ("leaf-spine-16", {("h0", "h3"): 2, ("h0", "h12"): 4}),
])
def test_every_packet_reaches_its_host_on_a_shortest_path(topo, hops_by_pair):
    fab = topofile.load(topo)
    fake = programmed(fab)
    for src, dst in itertools.permutations([h.name for h in fab.hosts], 2):
        for s_nic in fab.nics_of[src]:
            d_nic = fab.nic(dst, s_nic.plane)
            for pkt in ({"eth_type": 0x0800, "ipv4_dst": str(d_nic.ip)},
                        {"eth_type": 0x0806, "arp_tpa": str(d_nic.ip)}):
                path = fake.trace(src, s_nic.nic, pkt)
                assert path[-1] == dst, (src, dst, s_nic.plane, path)
                # every switch on the way is in the sender's plane
                assert {fab.switch_by_name[n].plane for n in path[:-1]} == {s_nic.plane}
                if (src, dst) in hops_by_pair:
                    assert len(path) == hops_by_pair[(src, dst)]


def test_unknown_destinations_and_other_traffic_are_dropped():
    fab = topofile.load("dual-plane-16")
    fake = programmed(fab)
    # an address no host has, a plane-B address sent into plane A, and IPv6
    assert fake.trace("h0", 0, {"eth_type": 0x0800, "ipv4_dst": "198.18.9.9"})[-1] == "DROP"
    assert fake.trace("h0", 0, {"eth_type": 0x0800, "ipv4_dst": "198.19.0.5"})[-1] == "DROP"
    assert fake.trace("h0", 0, {"eth_type": 0x86DD})[-1] == "DROP"


def test_static_mode_spreads_destinations_over_spines():
    fab = topofile.load("dual-plane-16")
    fake = programmed(fab)
    spines = {fake.trace("h0", 0, {"eth_type": 0x0800, "ipv4_dst": str(fab.nic(d, "A").ip)})[1]
              for d in ("h4", "h5", "h6", "h7")}
    assert spines == {"spineA0", "spineA1"}


def test_one_flow_per_destination_and_kind():
    fab = topofile.load("dual-plane-16")
    core = ControllerCore(fab)
    intents = core.on_switch_connect(fab.switch_by_name["spineB1"].dpid)
    assert len(intents) == 16 * 2  # 16 plane-B addresses, IPv4 + ARP
    assert {i.cookie for i in intents} == {COOKIE}
    assert core.on_switch_connect(999) == []


def test_unsupported_mode_is_an_error():
    with pytest.raises(FabriclabError, match="routing mode 'magic' is not supported"):
        ControllerCore(topofile.load("leaf-spine-16"), "magic")


class _Datapath:
    ofproto = ofproto_v1_3
    ofproto_parser = ofproto_v1_3_parser
    id = 1


def test_flow_mod_serialises_to_openflow13_and_parses_back():
    fab = topofile.load("leaf-spine-16")
    intent = ControllerCore(fab).on_switch_connect(1)[0]
    msg = ofmsg.flow_mod(intent)
    msg.datapath = _Datapath()
    msg.set_xid(7)
    msg.serialize()
    version, msg_type, msg_len, xid = ofproto_v1_3_parser.ofproto_parser.header(bytes(msg.buf))
    back = ofproto_v1_3_parser.ofproto_parser.msg(_Datapath(), version, msg_type, msg_len, xid, bytes(msg.buf))
    assert version == ofproto_v1_3.OFP_VERSION and msg_type == ofproto_v1_3.OFPT_FLOW_MOD
    assert dict(back.match.items()) == dict(intent.match)
    assert back.instructions[0].actions[0].port == intent.out_port
    assert back.priority == intent.priority and back.cookie == COOKIE
