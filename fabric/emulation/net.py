"""The Mininet adapter: a `Fabric` as a real packet network of Open vSwitch switches.

This is the only module that imports Mininet. It runs what `fabric.emulation.plan` computes:

- switches: OVS, OpenFlow 1.3 (and 1.5), fail-mode secure, the model's dpid, the model's port numbers;
  kernel datapath where the `openvswitch` module is loaded, userspace (`netdev`) otherwise (probed);
- links: HTB-shaped at `rate_gbps x mbps_per_gbps` Mbit/s (one scale factor for the whole fabric);
  offloads and IPv6 off on the switch ends;
- hosts: one interface per NIC port (`h0-eth0` in plane A, `h0-eth1` in plane B), the model's
  address and MAC, offloads off, IPv6 off, static ARP for every NIC in the same plane, no default route;
- teardown that leaves no bridge, veth or process of the run behind, checked by `leftovers()`.

It implements `fabric.emulation.hosts.Hosts` (run a command in a host) for the traffic tools, and
sets interfaces up or down for `fabric.emulation.faults`.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from fabric.emulation import claims, plan, system
from fabric.emulation.plan import EmulationOptions
from fabric.emulation.system import Leftovers
from fabric.errors import EmulationError
from fabric.model import Fabric, intf_name


#: Receive and send buffers of each userspace-datapath port socket: ~1 s of a 4 kpps probe, ~1800
#: full-size frames, so that ovs-vswitchd stalling for tens of ms (PLATFORM.md) delays packets but loses
#: none, and a port can queue up to its qdisc's limit (see `system.raised_socket_buffers`).
SWITCH_PORT_SOCKET_BYTES = 4 << 20


class Emulation:
    """A running emulated fabric. Use as a context manager; `stop()` is idempotent.

    The controller must already listen on 127.0.0.1:`controller_port` (start it first: OVS backs
    off reconnecting to a controller that is not there yet).
    """

    def __init__(self, fabric: Fabric, controller_port: int, opts: EmulationOptions | None = None) -> None:
        self.fabric = fabric
        self.opts = opts or EmulationOptions()
        self.controller_port = controller_port
        self.net: Any = None
        self.datapath = ""
        self._pids: list[int] = []
        self._claim: claims.Claim | None = None
        self._switch_index = {s.name: i for i, s in enumerate(fabric.switches)}
        self._lossy: set[tuple[str, int]] = set()  # interfaces with a loss filter (`set_gray`)
        self._sinks: set[str] = set()  # namespaces with the lossy links' sink ("": the root one)

    # -- lifecycle --
    def start(self) -> "Emulation":
        if os.geteuid() != 0:
            raise EmulationError("the emulation needs root (Mininet and Open vSwitch); run with sudo")
        plan.check_options(self.fabric, self.opts, has_netem=system.has_netem())
        self.datapath = system.probe_datapath() if self.opts.datapath == "auto" else self.opts.datapath
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import OVSSwitch, RemoteController

        # Mininet logs HTB quantum warnings as errors; outcomes are checked by us instead.
        setLogLevel(os.environ.get("FABRICLAB_MININET_LOG", "critical"))
        system.check_ovs()
        claims.reclaim_stale()  # leftovers of killed runs (never of live ones)
        self._check_no_clash()
        self._claim = claims.claim("emulation", *plan.expected_names(self.fabric))
        switch_cls = partial(
            OVSSwitch,
            datapath=self.datapath,
            protocols=self.opts.protocols,
            failMode="secure",
            reconnectms=1000,  # OVS's minimum max_backoff
            batch=True,
        )

        class _Controller(RemoteController):  # type: ignore[misc, valid-type]
            def checkListening(self) -> None:
                """Mininet probes with `telnet`, whose output (the controller's binary OpenFlow
                hello) it then fails to decode; the session has already checked the controller."""

        ctrl = partial(_Controller, ip="127.0.0.1", port=self.controller_port)
        self.net = Mininet(topo=None, switch=switch_cls, controller=ctrl, link=Link, ipBase="198.18.0.0/15",
                           autoSetMacs=False, autoStaticArp=False, build=False, waitConnected=False)
        try:
            self._build()
            with system.raised_socket_buffers(SWITCH_PORT_SOCKET_BYTES):
                self.net.start()  # ovs-vsctl waits until vswitchd has added every port
            bridges = plan.expected_names(self.fabric)[0]
            missing = sorted(bridges - set(system.present(bridges, set(), []).bridges))
            if missing:
                raise EmulationError(f"Open vSwitch did not create bridges {missing[:5]} (see ovs-vswitchd.log)")
            self._configure_switch_ports()
            self._configure_hosts()
        except BaseException:
            self.stop()
            raise
        return self

    def _check_no_clash(self) -> None:
        bridges, intfs = plan.expected_names(self.fabric)
        clash = system.present(bridges, intfs, [])
        if not clash.empty():
            raise EmulationError(
                "names this fabric needs are already in use by a run that is still running (or by leftovers "
                "this version did not record; remove them with `ovs-vsctl del-br` and `ip link del`): "
                f"bridges {clash.bridges[:5]}, interfaces {clash.interfaces[:5]}"
            )

    def _build(self) -> None:
        fab, net = self.fabric, self.net
        net.addController("c0")
        for sw in fab.switches:
            net.addSwitch(sw.name, dpid=f"{sw.dpid:016x}")
        for host in fab.hosts:
            net.addHost(host.name, ip=None)
        nic_at = {(p.host, p.nic): p for p in fab.nic_ports}
        for link in fab.links:
            params: list[dict[str, str]] = []
            macs: list[str] = []
            for end in (link.a, link.b):
                if end.node in fab.host_by_name:
                    nic = nic_at[(end.node, end.port)]
                    prefix = fab.plane_by_name[nic.plane].subnet.prefixlen
                    params.append({"ip": f"{nic.ip}/{prefix}"})
                    macs.append(nic.mac)
                else:
                    # Mininet sets a veth address only when both ends get one: give the switch end
                    # a derived locally administered MAC (switch ports never source IP traffic).
                    params.append({})
                    macs.append(plan.port_mac(self._switch_index[end.node], end.port))
            net.addLink(link.a.node, link.b.node, port1=link.a.port, port2=link.b.port, addr1=macs[0],
                        addr2=macs[1], params1=params[0], params2=params[1])
        net.build()
        self._pids = [n.pid for n in net.hosts + net.switches if getattr(n, "pid", None)]
        if self._claim is not None:
            self._claim.add_pids(self._pids)

    def _configure_switch_ports(self) -> None:
        """Shape every switch-side interface (root namespace) with one `tc -batch`; offloads off;
        IPv6 off on them and on the bridges' own interfaces (`plan.disable_ipv6_path`): a port going
        down or up otherwise also adds or removes its link-local address, and ovs-vswitchd re-reads
        every interface's addresses and state on each such event, which delays its port-status
        message by ~0.2 ms per port it runs (`benchmarks/ovs_port_notice.py`)."""
        system.run_batch(["tc"], plan.tc_batch(self.fabric, self.opts, None), "shaping switch ports")
        bridges, intfs = plan.expected_names(self.fabric)
        for intf in sorted(intfs - bridges):
            subprocess.run(["ethtool", "-K", intf, *plan.OFFLOADS_OFF], capture_output=True, check=False)
        for intf in sorted(intfs):
            path = plan.disable_ipv6_path(intf)
            if path.exists():  # a bridge of the userspace datapath may have no kernel interface
                path.write_text("1\n")

    def _configure_hosts(self) -> None:
        with tempfile.TemporaryDirectory(prefix="fabriclab-hosts-") as tmp:
            for host in self.fabric.hosts:
                arp = Path(tmp) / f"{host.name}.arp"
                arp.write_text(plan.arp_batch(self.fabric, host.name))
                shaping = Path(tmp) / f"{host.name}.tc"
                shaping.write_text(plan.tc_batch(self.fabric, self.opts, host.name))
                cmds = plan.host_setup_commands(self.fabric, host.name, str(arp), str(shaping))
                out = self._node(host.name).cmd("; ".join(cmds) + "; echo rc=$?")
                if "rc=0" not in out:
                    raise EmulationError(f"configuring host {host.name} failed: {out.strip()[-300:]}")

    def stop(self) -> None:
        net, self.net = self.net, None
        if net is None:
            if self._claim is not None:
                self._claim.release()
            return
        bridges, intfs = plan.expected_names(self.fabric)
        try:
            # Every link has a switch end in the root namespace: deleting those ends removes each
            # veth pair, all in one `ip -batch` (Mininet would run one shell command per interface,
            # ~14 ms each). Mininet then only stops switches and hosts.
            gone = system.present(set(), intfs - bridges, []).interfaces
            if gone:
                subprocess.run(["ip", "-force", "-batch", "-"], input="".join(f"link del dev {i}\n" for i in gone),
                               capture_output=True, text=True, check=False)
                net.links = []
            net.stop()
        finally:
            # Mininet's stop is best effort; remove whatever of ours is still there.
            rest = system.present(bridges, intfs, self._pids)
            for br in rest.bridges:
                subprocess.run(["ovs-vsctl", "--if-exists", "del-br", br], capture_output=True, check=False)
            for intf in rest.interfaces:
                subprocess.run(["ip", "link", "del", intf], capture_output=True, check=False)
            for pid in rest.pids:
                system.kill(pid)
            if self._claim is not None and system.present(bridges, intfs, self._pids).empty():
                self._claim.release()

    def __enter__(self) -> "Emulation":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state --
    def leftovers(self) -> Leftovers:
        """What of this run still exists (bridges, root-namespace interfaces, host/switch processes)."""
        bridges, intfs = plan.expected_names(self.fabric)
        return system.present(bridges, intfs, self._pids)

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    @property
    def running(self) -> bool:
        return self.net is not None

    def _node(self, name: str) -> Any:
        if self.net is None:
            raise EmulationError("the emulation is not running")
        if name not in self.fabric.host_by_name and name not in self.fabric.switch_by_name:
            raise EmulationError(f"no node {name!r} in fabric {self.fabric.name!r}")
        return self.net.get(name)

    # -- Hosts: run this in host h --
    def popen(self, host: str, args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc: subprocess.Popen[Any] = self._node(host).popen(args, **kwargs)
        return proc

    def run(self, host: str, args: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        proc = self.popen(host, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise EmulationError(f"{host}: {' '.join(args)} did not finish within {timeout_s:g} s") from None
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    # -- links, for fault injection --
    def set_interfaces(self, ends: list[tuple[str, int]], up: bool) -> tuple[float, float]:
        """Set the interfaces at these (node, port) ends up or down: switch ends (root namespace)
        first, in one `ip -batch`, then host ends in their namespaces. Returns monotonic times just
        before the first and just after the last change."""
        state = "up" if up else "down"
        switch_ends = [e for e in ends if e[0] in self.fabric.switch_by_name]
        host_ends = [e for e in ends if e[0] in self.fabric.host_by_name]
        unknown = [e for e in ends if e not in switch_ends and e not in host_ends]
        if unknown:
            raise EmulationError(f"no such node in fabric {self.fabric.name!r}: {unknown[0][0]!r}")
        batch = "".join(f"link set dev {intf_name(n, p)} {state}\n" for n, p in switch_ends)
        t0 = time.monotonic()
        if batch:
            res = subprocess.run(["ip", "-batch", "-"], input=batch, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise EmulationError(f"setting {len(switch_ends)} switch ports {state} failed: {res.stderr[-300:]}")
        for n, p in host_ends:
            res = self.run(n, ["ip", "link", "set", "dev", intf_name(n, p), state])
            if res.returncode != 0:
                raise EmulationError(f"setting {intf_name(n, p)} {state} failed: {res.stderr[-300:]}")
        return t0, time.monotonic()

    def set_gray(self, ends: list[tuple[str, int]], rate_fraction: float, loss: float) -> tuple[float, float]:
        """Degrade the egress of these (node, port) interfaces to `rate_fraction` of their link's
        emulated rate and make it drop a random `loss` of its packets (1.0 and 0: healthy again).
        Returns monotonic times just before the first and just after the last change."""
        if not 0 < rate_fraction <= 1 or not 0 <= loss <= 1:
            raise EmulationError(f"need 0 < rate_fraction <= 1 and 0 <= loss <= 1, got {rate_fraction}, {loss}")
        cmds: list[tuple[str, list[str]]] = []
        sink = plan.gray_sink_names(self.fabric)
        for node, port in ends:
            ns = node if node in self.fabric.host_by_name else ""
            if loss > 0 and ns not in self._sinks:
                cmds += [(node, c) for c in plan.sink_commands(sink)]
                self._sinks.add(ns)
            self.fabric.peer(node, port)  # raises TopologyError for a port with no link
            link = next(l for l in self.fabric.links if (node, port) in ((l.a.node, l.a.port), (l.b.node, l.b.port)))
            dev = intf_name(node, port)
            mbps = plan.link_mbps(link.rate_gbps, self.opts) * rate_fraction
            cmds += [(node, c) for c in plan.gray_commands(dev, mbps, loss, (node, port) in self._lossy, sink[0])]
        t0 = time.monotonic()
        for node, cmd in cmds:
            if node in self.fabric.switch_by_name:
                res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            else:
                res = self.run(node, cmd)
            if res.returncode != 0:
                raise EmulationError(f"{' '.join(cmd)} failed: {res.stderr.strip()[-300:]}")
        t1 = time.monotonic()
        for end in ends:
            (self._lossy.add if loss > 0 else self._lossy.discard)(end)
        return t0, t1

    def interactive(self) -> None:
        """The Mininet CLI on the running fabric (returns when the user exits it)."""
        from mininet.cli import CLI

        if self.net is None:
            raise EmulationError("the emulation is not running")
        CLI(self.net)

    # -- counters, read from OVS itself (independent of the controller) --
    def port_counters(self, switch: str) -> dict[int, tuple[int, int]]:
        """OpenFlow port -> (tx bytes, rx bytes) of `switch`, read with `ovs-ofctl dump-ports`."""
        if switch not in self.fabric.switch_by_name:
            raise EmulationError(f"no switch {switch!r} in fabric {self.fabric.name!r}")
        res = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", switch], capture_output=True,
                             text=True, check=False)
        if res.returncode != 0:
            raise EmulationError(f"ovs-ofctl dump-ports {switch} failed: {res.stderr.strip()[-200:]}")
        return plan.parse_dump_ports(res.stdout)

