"""The emulation's pure plan (no root): option checks, names, MACs, tc and ARP batches, the parsers of
OVS and tool output; and the fault module's choice of interfaces, on a fake link control."""
from __future__ import annotations

import time

import pytest

from fabric import builders, topofile
from fabric.emulation import plan
from fabric.emulation.faults import Faults
from fabric.emulation.plan import EmulationOptions
from fabric.errors import EmulationError, UnsupportedError
from traffic.iperf import parse_iperf_json
from traffic.ping import parse_fping


def test_rates_outside_what_htb_emulates_are_refused_naming_the_link():
    fab = topofile.load("dual-plane-16")
    plan.check_options(fab, EmulationOptions(mbps_per_gbps=0.1), has_netem=False)
    with pytest.raises(UnsupportedError, match=r"leafA0:1 -- spineA0:1: 400 Gbit/s x 10 = 4000 Mbit/s"):
        plan.check_options(fab, EmulationOptions(mbps_per_gbps=10), has_netem=False)
    with pytest.raises(UnsupportedError, match="sch_netem"):
        plan.check_options(fab, EmulationOptions(delay_us=100), has_netem=False)
    plan.check_options(fab, EmulationOptions(delay_us=100), has_netem=True)
    with pytest.raises(UnsupportedError, match="datapath must be auto, kernel or user"):
        plan.check_options(fab, EmulationOptions(datapath="dpdk"), has_netem=True)


def test_tc_batch_shapes_each_interface_at_its_emulated_rate():
    fab = builders.leaf_spine(hosts=2, hosts_per_leaf=2, spines=1, nic_rate_gbps=100)
    # one leaf, one spine: leaf port 1 -> spine (200G: 2 hosts x 100G / 1 spine), hosts on leaf ports 2, 3
    lines = plan.tc_batch(fab, EmulationOptions(mbps_per_gbps=0.1), None).splitlines()
    assert "class add dev leafA0-eth1 parent 5: classid 5:1 htb rate 20mbit burst 15k quantum 1514" in lines
    assert "class add dev spineA0-eth1 parent 5: classid 5:1 htb rate 20mbit burst 15k quantum 1514" in lines
    assert "class add dev leafA0-eth2 parent 5: classid 5:1 htb rate 10mbit burst 15k quantum 1514" in lines
    assert len(lines) == 2 * 4  # 4 switch ports, qdisc + class each
    host = plan.tc_batch(fab, EmulationOptions(mbps_per_gbps=0.1), "h1").splitlines()
    assert host == ["qdisc replace dev h1-eth0 root handle 5: htb default 1",
                    "class add dev h1-eth0 parent 5: classid 5:1 htb rate 10mbit burst 15k quantum 1514"]


def test_arp_batch_lists_every_other_nic_of_the_same_plane():
    fab = topofile.load("dual-plane-16")
    lines = plan.arp_batch(fab, "h0").splitlines()
    assert len(lines) == 2 * 15  # 15 other hosts in each of 2 planes
    h5a = fab.nic("h5", "A")
    assert f"neigh replace {h5a.ip} lladdr {h5a.mac} dev h0-eth0 nud permanent" in lines
    assert all("198.19." not in l or "dev h0-eth1" in l for l in lines)


def test_switch_port_macs_are_unique_beyond_65536_switches():
    macs = {plan.port_mac(i, p) for i in (0, 1, 255, 256, 65535, 65536, 65537, 1 << 20) for p in (1, 2, 300)}
    assert len(macs) == 8 * 3
    assert plan.port_mac(65536, 1) != plan.port_mac(0, 1)
    assert plan.port_mac(0x123456, 0x789A) == "06:12:34:56:78:9a"
    with pytest.raises(UnsupportedError):
        plan.port_mac(1 << 24, 1)


def test_bridge_is_made_in_one_transaction_with_the_models_dpid_ports_and_controller():
    fab = builders.leaf_spine(hosts=2, hosts_per_leaf=2, spines=1)
    args = plan.bridge_vsctl_args(fab, "leafA0", "user", "OpenFlow13", "unix:/run/x/controller.sock")
    commands = " ".join(args).split(" -- ")
    leaf = fab.switch_by_name["leafA0"]
    # by hand: leafA0 has h0 on port 1, h1 on port 2 and spineA0 on port 3
    assert sorted(c for c in commands if c.startswith("add-port")) == [
        "add-port leafA0 leafA0-eth1", "add-port leafA0 leafA0-eth2", "add-port leafA0 leafA0-eth3"]
    assert {c for c in commands if c.startswith("set Interface")} == {
        "set Interface leafA0-eth1 ofport_request=1", "set Interface leafA0-eth2 ofport_request=2",
        "set Interface leafA0-eth3 ofport_request=3"}
    bridge = next(c for c in commands if c.startswith("set Bridge leafA0"))
    assert f"other_config:datapath-id={leaf.dpid:016x}" in bridge and "datapath_type=netdev" in bridge
    assert "fail_mode=secure" in bridge and "protocols=OpenFlow13" in bridge and "controller=[@c]" in bridge
    assert 'create Controller target="unix:/run/x/controller.sock" max_backoff=1000' in " ".join(args)
    assert "datapath_type=system" in " ".join(plan.bridge_vsctl_args(fab, "spineA0", "kernel", "OpenFlow13", "unix:/c"))


def test_switch_setup_shapes_and_turns_offloads_off_on_its_own_ports_only():
    fab = builders.leaf_spine(hosts=2, hosts_per_leaf=2, spines=1)
    cmds = plan.switch_setup_commands(fab, "spineA0", "/tmp/spineA0.tc")
    assert cmds == [f"ethtool -K spineA0-eth1 {' '.join(plan.OFFLOADS_OFF)} 2>/dev/null", "tc -batch /tmp/spineA0.tc"]
    lines = plan.tc_batch(fab, plan.EmulationOptions(), "spineA0").split("\n")
    assert {l.split(" dev ")[1].split()[0] for l in lines if l} == {"spineA0-eth1"}


def test_parse_dump_ports():
    text = """OFPST_PORT reply (OF1.3) (xid=0x2): 3 ports
  port  1: rx pkts=10, bytes=1000, drop=0, errs=0, frame=0, over=0, crc=0
           tx pkts=20, bytes=2000, drop=0, errs=0, coll=0
           duration=3.5s
  port LOCAL: rx pkts=0, bytes=0, drop=0, errs=0, frame=0, over=0, crc=0
           tx pkts=0, bytes=0, drop=0, errs=0, coll=0
  port  12: rx pkts=1, bytes=64, drop=0, errs=0, frame=0, over=0, crc=0
           tx pkts=3, bytes=192, drop=0, errs=0, coll=0
"""
    assert plan.parse_dump_ports(text) == {1: (2000, 1000), 12: (192, 64)}


def test_parse_fping_and_iperf():
    out = "198.18.0.2 : xmt/rcv/%loss = 3/3/0%, min/avg/max = 0.1/0.2/0.3\n198.18.0.3 : xmt/rcv/%loss = 3/1/66%\n"
    assert [(p.dst_ip, p.sent, p.received) for p in parse_fping("h0", out)] == [("198.18.0.2", 3, 3),
                                                                               ("198.18.0.3", 3, 1)]
    doc = ('{"intervals": [' + ",".join(
        f'{{"sum": {{"end": {e}, "bits_per_second": {b}}}}}' for e, b in
        ((0.5, 1e6), (1.0, 9e6), (1.5, 10e6), (2.0, 20e6), (2.5, 11e6))) +
           '], "end": {"sum_received": {"bits_per_second": 10.2e6, "bytes": 3187500}}}')
    res = parse_iperf_json("noise before " + doc, "h0 -> h1", warmup_s=1.0)
    assert res.mbps == pytest.approx(10.2)
    assert res.received_bytes == 3187500
    # intervals ending after 1 s: 10, 20, 11 Mbit/s -> median 11
    assert res.steady_mbps == pytest.approx(11.0)
    assert res.best_mbps == pytest.approx(20.0)  # not the 9 Mbit/s interval of the warm-up
    with pytest.raises(EmulationError, match="h0 -> h1 gave no result"):
        parse_iperf_json("iperf3: error - unable to connect", "h0 -> h1", 1.0)


class FakeLinks:
    def __init__(self, fabric):
        self.fabric = fabric
        self.calls = []

    def set_interfaces(self, ends, up):
        self.calls.append((list(ends), up))
        return 10.0, 10.001


def test_faults_pick_the_interfaces_of_a_link_port_switch_and_plane():
    fab = topofile.load("dual-plane-16")
    net = FakeLinks(fab)
    f = Faults(net)
    ev = f.link_down("spineA0", 4)
    assert net.calls[-1] == ([("spineA0", 4), ("leafA3", 1)], False)
    assert (ev.kind, ev.target, ev.up, ev.at_s, ev.done_s) == ("link", "spineA0:4", False, 10.0, 10.001)
    f.link_down("h0", 0)  # a host link: the switch end first
    assert net.calls[-1] == ([("leafA0", 3), ("h0", 0)], False)
    f.port("leafA0", 1, up=False)
    assert net.calls[-1] == ([("leafA0", 1)], False)
    f.switch("spineA1", up=False)
    assert net.calls[-1] == ([("spineA1", p) for p in (1, 2, 3, 4)], False)
    f.plane("B", up=True)
    ends, up = net.calls[-1]
    # plane B: 4 leaves x (2 uplinks + 4 hosts) + 2 spines x 4 leaves = 32 switch ports
    assert up and len(ends) == 32 and {n for n, _ in ends} == {s.name for s in fab.switches_in("B")}
    assert [e.describe() for e in f.log] == ["link spineA0:4 down", "link h0:0 down", "port leafA0:1 down",
                                             "switch spineA1 down", "plane B up"]
    with pytest.raises(EmulationError, match="no plane 'C'"):
        f.plane("C", up=False)
    with pytest.raises(EmulationError, match="no switch 'h0'"):
        f.switch("h0", up=False)


def test_a_flap_goes_down_and_up_n_times_on_schedule_and_ends_up():
    fab = topofile.load("dual-plane-16")

    class Timed(FakeLinks):
        def set_interfaces(self, ends, up):
            t = time.monotonic()
            self.calls.append((list(ends), up, t))
            return t, t

    net = Timed(fab)
    t0 = time.monotonic()
    events = Faults(net).flap("spineA0", 4, times=3, within_s=0.3)
    assert [c[1] for c in net.calls] == [False, True] * 3
    assert all(c[0] == [("spineA0", 4), ("leafA3", 1)] for c in net.calls)
    # down at 0, 0.1, 0.2 s and up at 0.05, 0.15, 0.25 s: never early, and late by less than a period
    for k, c in enumerate(net.calls):
        assert t0 + k * 0.05 - 1e-3 <= c[2] <= t0 + k * 0.05 + 0.1
    assert [e.describe() for e in events] == ["link spineA0:4 down", "link spineA0:4 up"] * 3
    with pytest.raises(EmulationError, match="times >= 1"):
        Faults(net).flap("spineA0", 4, times=0, within_s=1)


def test_iperf_intervals_are_the_receivers_when_the_server_output_is_there():
    # with --get-server-output the client's JSON holds the server's own intervals: bytes delivered,
    # which the sender's (writes into its buffer) can overstate
    def intervals(rates):
        return "[" + ",".join(f'{{"sum": {{"end": {0.5 * (i + 1)}, "bits_per_second": {b}}}}}'
                              for i, b in enumerate(rates)) + "]"
    doc = ('{"intervals": ' + intervals([1e6, 2e6, 21e6, 21e6, 21e6]) + ', "end": {"sum_received": '
           '{"bits_per_second": 18e6}}, "server_output_json": {"intervals": '
           + intervals([1e6, 2e6, 18e6, 19e6, 17e6]) + "}}")
    res = parse_iperf_json(doc, "h0 -> h1", warmup_s=1.0)
    assert res.steady == [18.0, 19.0, 17.0]
    assert res.steady_mbps == pytest.approx(18.0) and res.best_mbps == pytest.approx(19.0)
