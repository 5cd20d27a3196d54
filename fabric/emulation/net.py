"""The Mininet adapter: a `Fabric` as a real packet network of Open vSwitch switches.

This is the only module that imports Mininet. It runs what `fabric.emulation.plan` computes:

- switches: each in an Open vSwitch of its own (`fabric.emulation.ovs`: an ovsdb-server and an
  ovs-vswitchd in a network namespace holding only that switch's ports, so a link event costs only
  the switches at its ends), OpenFlow 1.3 (and 1.5), fail-mode secure, the model's dpid and port
  numbers, connected to the controller's Unix socket; kernel datapath where the `openvswitch` module
  is loaded, userspace (`netdev`) otherwise (probed);
- links: HTB-shaped at `rate_gbps x mbps_per_gbps` Mbit/s (one scale factor for the whole fabric);
  offloads and IPv6 off on the switch ends; a veth pair each, or, for the links `tunnel_links` names,
  a VXLAN or GRE tunnel between two namespaces standing for two servers (`fabric.emulation.tunnels`);
- hosts: one interface per NIC port (`h0-eth0` in plane A, `h0-eth1` in plane B), the model's
  address and MAC, offloads off, IPv6 off, static ARP for every NIC in the same plane, no default route;
- teardown that leaves no daemon, namespace, veth or process of the run behind, checked by `leftovers()`.

It implements `fabric.emulation.hosts.Hosts` (run a command in a host) for the traffic tools, and
sets interfaces up or down for `fabric.emulation.faults`.
"""
from __future__ import annotations

import functools
import itertools
import os
import secrets
import socket
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from fabric.emulation import claims, ovs, plan, system, tunnels
from fabric.emulation.plan import EmulationOptions
from fabric.emulation.system import Leftovers
from fabric.errors import EmulationError
from fabric.model import Fabric, intf_name


#: Receive and send buffers of each userspace-datapath port socket: ~1 s of a 4 kpps probe, ~1800
#: full-size frames, so that ovs-vswitchd stalling for tens of ms (docs/emulation.md) delays packets but loses
#: none, and a port can queue up to its qdisc's limit (see `system.raised_socket_buffers`).
SWITCH_PORT_SOCKET_BYTES = 4 << 20


class Emulation:
    """A running emulated fabric. Use as a context manager; `stop()` is idempotent.

    The controller must already listen at `controller_target` (an OVS controller target reachable
    from the switches' namespaces, e.g. `unix:/run/fabriclab/ctl-1-0.sock`; start it first: OVS backs
    off reconnecting to a controller that is not there yet).
    """

    def __init__(self, fabric: Fabric, controller_target: str, opts: EmulationOptions | None = None) -> None:
        self.fabric = fabric
        self.opts = opts or EmulationOptions()
        self.controller_target = controller_target
        self.net: Any = None
        self.datapath = ""
        self._pids: list[int] = []
        self._claim: claims.Claim | None = None
        self._instances: dict[str, ovs.OvsInstance] = {}  # switch -> its Open vSwitch
        self._rundir: Path | None = None
        self._sockets: dict[str, socket.socket] = {}  # node -> a socket in its namespace (`set_interfaces`)
        self._switch_index = {s.name: i for i, s in enumerate(fabric.switches)}
        self._lossy: set[tuple[str, int]] = set()  # interfaces with a loss filter (`set_gray`)
        self._sinks: set[str] = set()  # nodes whose namespace has the lossy links' sink
        self.tunnels: tunnels.TunnelPlan | None = None  # the tunnelled links, when `opts.tunnel_links` names any

    # -- lifecycle --
    def start(self) -> "Emulation":
        if os.geteuid() != 0:
            raise EmulationError("the emulation needs root (Mininet and Open vSwitch); run with sudo")
        plan.check_options(self.fabric, self.opts, has_netem=system.has_netem(),
                           tunnel_kinds=system.tunnel_kinds() if self.opts.tunnel_links else frozenset())
        if not self.controller_target.startswith("unix:"):
            raise EmulationError(f"the switches reach the controller on a Unix socket (unix:PATH), got "
                                 f"{self.controller_target!r}: 127.0.0.1 of this namespace is not theirs")
        self.datapath = system.probe_datapath() if self.opts.datapath == "auto" else self.opts.datapath
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet

        # Mininet logs HTB quantum warnings as errors; outcomes are checked by us instead.
        setLogLevel(os.environ.get("FABRICLAB_MININET_LOG", "critical"))
        system.check_ovs()
        claims.reclaim_stale()  # leftovers of killed runs (never of live ones)
        run = f"{os.getpid()}-{next(_runs)}{secrets.token_hex(2)}"  # unique even when a PID is reused
        base = claims.claim_dir() / f"ovs-{run}"
        self._instances = {
            s.name: ovs.OvsInstance(s.name, f"fl-{run}-{s.name}", base / s.name) for s in self.fabric.switches
        }
        if self.opts.tunnel_links:
            self.tunnels = tunnels.plan_tunnels(self.fabric, self.opts.tunnel_links, self.opts.tunnel_kind, run)
        self._claim = claims.claim("emulation", namespaces=[i.netns for i in self._instances.values()]
                                   + list(self._server_namespaces()), paths=[str(base)])
        self._rundir = base
        switch_cls = partial(_switch_class(), instances=self._instances)
        self.net = Mininet(topo=None, switch=switch_cls, controller=None, link=Link, ipBase="198.18.0.0/15",
                           autoSetMacs=False, autoStaticArp=False, build=False, waitConnected=False)
        try:
            ovs.start_all(list(self._instances.values()), self._add_pids)
            self._build()
            self.net.start()  # hosts only: the switches' bridges are made next
            self._make_tunnels()  # their ports must exist before the bridges
            with system.raised_socket_buffers(SWITCH_PORT_SOCKET_BYTES):
                self._make_bridges()  # ovs-vsctl waits until vswitchd has added every port
            self._configure_switch_ports()
            self._configure_hosts()
        except BaseException:
            self.stop()
            raise
        return self

    def _add_pids(self, pids: list[int]) -> None:
        self._pids += pids
        if self._claim is not None:
            self._claim.add_pids(pids)

    def _build(self) -> None:
        fab, net = self.fabric, self.net
        for sw in fab.switches:
            net.addSwitch(sw.name, dpid=f"{sw.dpid:016x}")
        for host in fab.hosts:
            net.addHost(host.name, ip=None)
        nic_at = {(p.host, p.nic): p for p in fab.nic_ports}
        for link in fab.links:
            if self.tunnels is not None and self.tunnels.carries(link.a.node, link.b.node):
                continue  # its ends are tunnel devices (`_make_tunnels`)
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
        self._add_pids([n.pid for n in net.hosts + net.switches if getattr(n, "pid", None)])

    def _server_namespaces(self) -> tuple[str, ...]:
        return self.tunnels.servers if self.tunnels is not None else ()

    def _make_tunnels(self) -> None:
        """The two stand-in servers' namespaces, their wire, and each tunnelled link's two ends, moved
        into their switches' namespaces (`tunnels.build_commands`)."""
        if self.tunnels is None:
            return
        system.run_batch(["ip"], "".join(f"netns add {ns}\n" for ns in self.tunnels.servers),
                         "creating the servers' network namespaces")
        macs = {(end.node, end.port): plan.port_mac(self._switch_index[end.node], end.port)
                for link in self.fabric.links for end in (link.a, link.b) if end.node in self._switch_index}
        netns = {name: inst.netns for name, inst in self._instances.items()}
        for cmd in tunnels.build_commands(self.tunnels, netns, macs):
            res = subprocess.run(list(cmd.argv), input=cmd.stdin, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise EmulationError(f"{cmd.what} failed: {(res.stderr or res.stdout).strip()[-300:]}")

    def _remove_servers(self) -> None:
        """Delete the stand-in servers' namespaces: their wire, and every tunnel device made in them
        (the kernel deletes those wherever they were moved). Best effort."""
        present = set(ovs.namespaces())
        gone = [ns for ns in self._server_namespaces() if ns in present]
        if gone:
            subprocess.run(["ip", "-force", "-batch", "-"], input="".join(f"netns del {n}\n" for n in gone),
                           capture_output=True, text=True, check=False)

    def _make_bridges(self) -> None:
        """Each switch's bridge in its own Open vSwitch, one transaction each, all side by side."""
        procs = []
        for name, inst in self._instances.items():
            # OVS connects only to Unix sockets inside its own run directory: a link to the controller's
            link = inst.rundir / "controller.sock"
            link.symlink_to(self.controller_target[len("unix:"):])
            args = plan.bridge_vsctl_args(self.fabric, name, self.datapath, self.opts.protocols, f"unix:{link}")
            procs.append((name, subprocess.Popen(inst.vsctl_cmd(args), stdin=subprocess.DEVNULL,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                                 env=inst.env())))
        failed = []
        for name, proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                failed.append(f"{name}: {err.strip()[-300:]} {self._instances[name].log_tail()}")
        if failed:
            raise EmulationError(f"Open vSwitch did not make {len(failed)} bridge(s), e.g. {failed[0]}")

    def _configure_switch_ports(self) -> None:
        """In each switch's namespace: HTB on every port (`tc -batch`), offloads off. IPv6 is off on
        every interface there already (`ovs.start_all`)."""
        with tempfile.TemporaryDirectory(prefix="fabriclab-switches-") as tmp:
            for sw in self.fabric.switches:
                shaping = Path(tmp) / f"{sw.name}.tc"
                shaping.write_text(plan.tc_batch(self.fabric, self.opts, sw.name))
                cmds = plan.switch_setup_commands(self.fabric, sw.name, str(shaping))
                out = self._node(sw.name).cmd("; ".join(cmds) + "; echo rc=$?")
                if "rc=0" not in out:
                    raise EmulationError(f"configuring switch {sw.name} failed: {out.strip()[-300:]}")

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
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        instances = list(self._instances.values())
        # The switches' daemons first (by PID), then Mininet's shells; deleting each switch's namespace
        # then removes its interfaces, and with them every veth pair of the run (Mininet would run
        # one shell command per interface, ~14 ms each).
        ovs.kill_daemons(instances)
        try:
            if net is not None:
                net.links = []
                net.stop()
        finally:
            # Mininet's stop is best effort; remove whatever of ours is still there.
            ovs.remove(instances)
            self._remove_servers()
            for pid in system.present(set(), set(), self._pids).pids:
                system.kill(pid)
            if self._claim is not None and self.leftovers().empty():
                self._claim.release()

    def __enter__(self) -> "Emulation":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state --
    def leftovers(self) -> Leftovers:
        """What of this run still exists (processes, the switches' and stand-in servers' namespaces,
        Open vSwitch's files)."""
        return system.present(set(), set(), self._pids,
                              {i.netns for i in self._instances.values()} | set(self._server_namespaces()),
                              {str(self._rundir)} if self._rundir is not None else set())

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
    def _socket(self, node: str) -> socket.socket:
        sock = self._sockets.get(node)
        if sock is None:
            inst = self._instances.get(node)
            path = f"/var/run/netns/{inst.netns}" if inst else f"/proc/{self._node(node).pid}/ns/net"
            sock = self._sockets[node] = system.netns_socket(path)
        return sock

    def set_interfaces(self, ends: list[tuple[str, int]], up: bool) -> tuple[float, float]:
        """Set the interfaces at these (node, port) ends up or down, in the given order, one ioctl each
        in the node's namespace (no process started between them). Returns monotonic times just
        before the first and just after the last change."""
        unknown = [e for e in ends if e[0] not in self.fabric.switch_by_name and e[0] not in self.fabric.host_by_name]
        if unknown:
            raise EmulationError(f"no such node in fabric {self.fabric.name!r}: {unknown[0][0]!r}")
        socks = [(self._socket(n), intf_name(n, p)) for n, p in ends]
        t0 = time.monotonic()
        for sock, intf in socks:
            system.set_link_up(sock, intf, up)
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
            if loss > 0 and node not in self._sinks:
                cmds += [(node, c) for c in plan.sink_commands(sink)]
                self._sinks.add(node)
            self.fabric.peer(node, port)  # raises TopologyError for a port with no link
            link = next(l for l in self.fabric.links if (node, port) in ((l.a.node, l.a.port), (l.b.node, l.b.port)))
            dev = intf_name(node, port)
            mbps = plan.link_mbps(link.rate_gbps, self.opts) * rate_fraction
            cmds += [(node, c) for c in plan.gray_commands(dev, mbps, loss, (node, port) in self._lossy, sink[0])]
        t0 = time.monotonic()
        for node, cmd in cmds:
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

    # -- Open vSwitch itself (independent of the controller) --
    def ovs(self, switch: str) -> ovs.OvsInstance:
        """The Open vSwitch instance that runs `switch`."""
        if switch not in self._instances:
            raise EmulationError(f"no switch {switch!r} in fabric {self.fabric.name!r}")
        return self._instances[switch]

    def ofctl(self, switch: str, *args: str, timeout_s: float = 10.0) -> str:
        """`ovs-ofctl -O OpenFlow13 CMD <switch> ARGS...` on `switch`'s bridge; its output."""
        inst = self.ovs(switch)
        cmd, rest = args[0], args[1:]
        res = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", f"--timeout={max(1, int(timeout_s))}", cmd,
                              inst.mgmt, *rest], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EmulationError(f"ovs-ofctl {cmd} {switch} failed: {res.stderr.strip()[-200:]}")
        return res.stdout

    def port_counters(self, switch: str) -> dict[int, tuple[int, int]]:
        """OpenFlow port -> (tx bytes, rx bytes) of `switch`, read with `ovs-ofctl dump-ports`."""
        return plan.parse_dump_ports(self.ofctl(switch, "dump-ports"))


_runs = itertools.count()


@functools.cache
def _switch_class() -> type:
    """Mininet's node class for a switch, made on first use (Mininet is imported only here)."""
    from mininet.node import Switch

    class NamespacedSwitch(Switch):  # type: ignore[misc, valid-type]
        """A switch node whose shell (and so every command Mininet runs for it, and every interface
        Mininet makes for it) is in the network namespace of its own Open vSwitch instance, made
        beforehand by `ovs.start_all`. Its bridge is made by `Emulation._make_bridges`; it goes away
        with the instance."""

        def __init__(self, name: str, instances: dict[str, ovs.OvsInstance], **params: Any) -> None:
            self.instance = instances[name]
            self._joining = False
            params["inNamespace"] = True
            super().__init__(name, **params)

        def startShell(self, mnopts: Any = None) -> None:
            # Mininet would make a new namespace (`mnexec -n`); join the instance's instead.
            self.inNamespace, self._joining = False, True
            try:
                super().startShell(mnopts)
            finally:
                self.inNamespace, self._joining = True, False

        def _popen(self, cmd: list[str], **params: Any) -> Any:
            if self._joining:
                # the shell's ovs-vsctl and ovs-ofctl find this switch's Open vSwitch (its run
                # directory): `leafA0 ovs-ofctl dump-flows leafA0` in the Mininet CLI
                cmd = ["ip", "netns", "exec", self.instance.netns, "env", f"OVS_RUNDIR={self.instance.rundir}", *cmd]
            return super()._popen(cmd, **params)

        def start(self, controllers: Any) -> None:
            pass

        def stop(self, deleteIntfs: bool = True) -> None:
            pass

        @classmethod
        def batchStartup(cls, switches: Any) -> Any:
            return switches

        @classmethod
        def batchShutdown(cls, switches: Any) -> Any:
            return switches

    return NamespacedSwitch
