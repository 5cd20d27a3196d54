"""Switch-to-switch links carried by a real tunnel (VXLAN between two namespaces standing for two servers,
`fabric.emulation.tunnels`): hosts on both sides reach each other through it with full-size frames, the
bytes they send cross the wire with the encapsulation's overhead and nothing else, and nothing is left
behind: after a teardown, a bring-up that failed, or a SIGKILLed run (removed by `fabriclab clean`).

Counters are the kernel's own (/sys/class/net/DEV/statistics in each namespace), read here, and the
expected overhead is the header sizes of RFC 7348 added by hand."""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

import pytest

from fabric import topofile
from fabric.emulation import EmulationOptions
from fabric.model import intf_name
from fabric.polling import wait_until
from fabriclab.session import Lab
from tests.emulation.test_cli_up import FABRICLAB, ROOT, held_up
from tests.emulation.test_fabrics import assert_nothing_left, netns, root_links
from traffic.iperf import iperf

pytestmark = pytest.mark.emulation

#: Every uplink of leafA0 (leaf-spine-16: 4 leaves, 4 spines): whatever spine a flow takes, what leafA0's
#: hosts send to another leaf crosses one of these tunnels. leafA0 is on one server, the spines on the other.
UPLINKS = tuple(("leafA0", f"spineA{j}") for j in range(4))
#: Outer Ethernet (14) + IPv4 (20) + UDP (8) + VXLAN (8) bytes per frame on the wire (RFC 7348).
VXLAN_WIRE_OVERHEAD = 14 + 20 + 8 + 8
#: The kernel's VXLAN device counts what it sends from the inner IP header on (`iptunnel_xmit`'s
#: pkt_len: skb->len less the inner network offset), so each inner frame is its count plus its Ethernet header.
INNER_ETHERNET = 14
#: TCP payload in a full-size segment: MTU 1500 - IPv4 20 - TCP 20 - timestamps 12.
MSS = 1500 - 20 - 20 - 12


def counter(ns: str, dev: str, what: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/{what}"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


@dataclass(frozen=True)
class Sent:
    """What server 0 sent: on leafA0's tunnel ends (inner frames) and on its wire (outer frames)."""

    tunnel_bytes: int
    tunnel_frames: int
    wire_bytes: int
    wire_frames: int


def sent_by_server0(lab: Lab, fab) -> Sent:
    em = lab.emulation
    leaf_ns, server0 = em.ovs("leafA0").netns, em.tunnels.servers[0]
    devs = [intf_name("leafA0", fab.port_towards("leafA0", spine)) for _, spine in UPLINKS]
    return Sent(sum(counter(leaf_ns, d, "tx_bytes") for d in devs), sum(counter(leaf_ns, d, "tx_packets") for d in devs),
                counter(server0, "ul0", "tx_bytes"), counter(server0, "ul0", "tx_packets"))


def settled(lab: Lab, fab) -> Sent:
    """The counters once nothing moves (two reads 0.2 s apart agree): the last segments and ACKs of a
    flow may still be on their way when it ends."""
    reads = [sent_by_server0(lab, fab)]

    def still() -> bool:
        reads.append(sent_by_server0(lab, fab))
        return reads[-1] == reads[-2]

    wait_until("the tunnel counters to settle", still, 20.0, 0.2)
    return reads[-1]


def test_traffic_between_the_two_servers_crosses_the_tunnels_with_the_vxlan_overhead_and_nothing_is_left():
    fab = topofile.load("leaf-spine-16")
    netns_before = netns()
    opts = EmulationOptions(mbps_per_gbps=0.1, tunnel_links=UPLINKS)
    # no gray-failure probes: then nothing but the hosts' packets crosses a link (static ARP, no IPv6,
    # the controller's port polling stays on its OpenFlow connections)
    with Lab(fab, opts=opts, controller_args=["--gray-period-ms", "0", "--poll-ms", "50"]) as lab:
        em = lab.emulation
        servers = em.tunnels.servers
        assert set(servers) <= set(netns().split())
        # the tunnel ends are the ports the veths would have been: in leafA0's namespace, on its bridge,
        # VXLAN devices keyed 1..4 whose underlay is server 0's namespace, IPv6 off
        leaf_ns = em.ovs("leafA0").netns
        for key, (_, spine) in enumerate(UPLINKS, start=1):
            dev = intf_name("leafA0", fab.port_towards("leafA0", spine))
            detail = subprocess.run(["ip", "-n", leaf_ns, "-d", "link", "show", "dev", dev], capture_output=True,
                                    text=True, check=True).stdout
            assert f"vxlan id {key} remote 198.51.100.2 local 198.51.100.1" in detail, detail
            assert f"link-netns {servers[0]}" in detail and "mtu 1500" in detail, detail
            v6 = subprocess.run(["ip", "netns", "exec", leaf_ns, "cat", f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"],
                                capture_output=True, text=True, check=True).stdout.strip()
            assert v6 == "1", dev

        # A full-size packet (1472 bytes of ICMP payload: a 1500-byte IP packet, DF set) from h0 (leafA0,
        # server 0) to h4 (leafA1) and back crosses the tunnels whole: the wire's MTU carries it.
        h4 = str(fab.nic("h4", "A").ip)
        ping = em.run("h0", ["ping", "-c", "3", "-M", "do", "-s", "1472", "-W", "5", h4])
        assert ping.returncode == 0 and " 0% packet loss" in ping.stdout, ping.stdout + ping.stderr

        # TCP h0 -> h4: every byte h4 receives crossed one of leafA0's tunnels
        before = settled(lab, fab)
        res = iperf(em, "h0", "h4", "A", seconds=3, write_bytes=16384)
        after = settled(lab, fab)
        tunnel_bytes = after.tunnel_bytes - before.tunnel_bytes
        tunnel_frames = after.tunnel_frames - before.tunnel_frames
        wire_bytes = after.wire_bytes - before.wire_bytes
        wire_frames = after.wire_frames - before.wire_frames
        print(f"iperf3 received {res.received_bytes} B; leafA0's tunnel ends sent {tunnel_frames} frames, "
              f"{tunnel_bytes} B; server 0's wire {wire_frames} frames, {wire_bytes} B")
        assert res.received_bytes > 1_000_000  # 3 s at 40 Mbit/s: the flow ran
        assert tunnel_bytes >= res.received_bytes
        assert tunnel_frames >= res.received_bytes / MSS
        # each inner frame is one outer frame (none fragmented, none merged, nothing else on the wire),
        # each VXLAN_WIRE_OVERHEAD bytes larger than the inner frame
        assert wire_frames == tunnel_frames
        assert wire_bytes == tunnel_bytes + (INNER_ETHERNET + VXLAN_WIRE_OVERHEAD) * tunnel_frames
        pids = em.pids + [lab.controller.pid]
    assert_nothing_left(fab, pids, netns_before)  # the servers' namespaces too: the list is as before
    assert not [i for i in root_links() if i.startswith("ul")]


def test_a_bring_up_that_fails_after_the_tunnels_were_made_leaves_nothing(monkeypatch):
    from fabric.emulation import net

    made: list[tuple[str, ...]] = []

    def broken(self):
        made.append(self.tunnels.servers)
        assert set(self.tunnels.servers) <= set(netns().split())  # the tunnels exist by now
        raise RuntimeError("injected failure while configuring switch ports")

    monkeypatch.setattr(net.Emulation, "_configure_switch_ports", broken)
    netns_before = netns()
    lab = Lab(topofile.load("leaf-spine-16"), opts=EmulationOptions(tunnel_links=UPLINKS[:1]))
    with pytest.raises(RuntimeError, match="injected failure"):
        lab.start()
    assert made and netns() == netns_before


def test_a_killed_runs_tunnels_are_removed_by_clean():
    netns_before = set(netns().split())
    with held_up("leaf-spine-16", args=("--tunnel-link", "leafA0-spineA0")) as proc:
        servers = {n for n in set(netns().split()) - netns_before if n.startswith("flu-")}
        assert len(servers) == 2, servers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert servers <= set(netns().split()), "SIGKILL gave the run no chance to remove its servers"
    res = subprocess.run(FABRICLAB + ["clean"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "stale run(s) removed" in res.stdout, res.stdout + res.stderr
    assert set(netns().split()) == netns_before
