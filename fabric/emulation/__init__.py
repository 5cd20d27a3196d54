"""The emulation backend: the model as a real packet network (Mininet + Open vSwitch; root).

- `plan`: what to build, pure (names, addresses, MACs, tc and ARP batches, option checks);
- `net`: the Mininet adapter (`Emulation`), the only code that imports Mininet;
- `ovs`: each switch's own Open vSwitch (ovsdb-server and ovs-vswitchd in the switch's namespace);
- `tunnels`: switch-to-switch links carried by a VXLAN or GRE tunnel between two namespaces standing
  for two servers (pure; docs/cluster.md);
- `faults`: link, port, switch and plane faults, timestamped;
- `hosts`: the "run this in host h" interface the traffic tools use;
- `system`: probes of this machine (kernel modules, Open vSwitch) and of what a run left behind.
"""
from __future__ import annotations

from fabric.emulation.faults import FaultEvent, Faults
from fabric.emulation.hosts import Hosts
from fabric.emulation.net import Emulation
from fabric.emulation.plan import EmulationOptions, check_options
from fabric.emulation.system import Leftovers

__all__ = ["Emulation", "EmulationOptions", "FaultEvent", "Faults", "Hosts", "Leftovers", "check_options"]
