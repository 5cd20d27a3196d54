"""What a fabric and a topology file may be: sizes, rates, YAML shape. Checked before anything is built.

One place for the limits the model (`fabric.model`), the builders (`fabric.builders`) and the file
reader (`fabric.topofile`) enforce, so that a hostile or mistyped input is refused at once with a
`TopologyError` that names the item, instead of running for minutes into a MemoryError.

- Host count: the address plan. Host i of a plane is `subnet + i + 1` and a plane's default subnet is
  a /16 (198.18.0.0/16, 198.19.0.0/16), so at most 2**16 - 2 hosts; a smaller declared subnet holds
  fewer (checked per plane in the model).
- Switch and link counts: stated maxima that admit the 16,384-host fabrics the flow-level simulator
  targets (128 to 16k GPUs, docs/architecture.md) with room to spare, and keep a fabric at the maxima cheap to
  build and validate (seconds, a few hundred MB). Note that path tables, which `topo show` and the
  routing build, cost much more than the model at these sizes; these maxima bound the model only.
- Rates: a band that the emulator and the simulator can both compute with (see the constants).
- The YAML file: bytes, nesting levels and nodes, checked by a streaming scan before the document is
  composed, since PyYAML's composer and constructor recurse and hold every node in memory.
"""
from __future__ import annotations

import math

from fabric.errors import TopologyError

#: Hosts a plane's /16 can number: 2**16 addresses less the network and broadcast addresses.
MAX_HOSTS = 2**16 - 2

#: Switches in a fabric. A dual-plane fabric of 16,384 hosts still fits with one leaf per host and
#: as many spines as leaves (2 x (16,384 + 16,384)); the usual 32 hosts per leaf needs 1,088.
MAX_SWITCHES = 2**16

#: Links in a fabric: twice the 65,536 of a non-blocking dual-plane Clos of 16,384 hosts (per host
#: and plane, one NIC link and, non-blocking, one leaf uplink). So 16,384-host designs fit with up to
#: twice the non-blocking uplinks (e.g. leaves in full mesh, 64 hosts per leaf: 98,048 links), and
#: a fabric at this maximum builds and validates in a few seconds and ~200 MB.
MAX_LINKS = 2**17

#: The slowest link rate, in Gbit/s: 1 Mbit/s, slower than any data-centre link. With the fastest
#: rate it bounds what max-flow (`topo show`) and max-min fair sharing (the simulator) add up in
#: double precision: the largest sum, MAX_LINKS x 100 Tbit/s = 1.3e10 Gbit/s, over the smallest
#: rate is 1.3e13 < 2**53, so the slowest link still counts in a sum of all of them. (The emulator
#: checks its own, narrower band when it runs: 0.1..1000 Mbit/s after its Mbit/s-per-Gbit/s scale.)
MIN_RATE_GBPS = 1e-3

#: The fastest link rate, in Gbit/s: 100 Tbit/s, two orders of magnitude above today's 800G-1.6T
#: ports (room for bundles), and far from float overflow (1e308 made networkx's max-flow crash).
MAX_RATE_GBPS = 1e5

#: Planes in a fabric. Every host has one NIC port in each; AI servers carry up to 8 NICs (rails),
#: each of which may be split over two planes. (Subnets are checked pairwise for overlaps.)
MAX_PLANES = 16

#: The largest switch port number: OpenFlow 1.3's OFPP_MAX (numbers above are reserved ports).
MAX_PORT = 0xFFFFFF00

#: A topology file's size. The explicit form of a fabric at the maxima, as `topofile.dumps` writes
#: it, is ~13 MB (a 16,384-host dual-plane fabric: 4.7 MB); block style with long names a few times
#: more. Reading stops here, so a device like /dev/zero cannot fill the memory.
MAX_TOPOLOGY_FILE_BYTES = 64 * 2**20

#: Nesting of collections (mappings and sequences) in a topology file. The schema needs 3 (the top
#: mapping, a list of links, a link); PyYAML recurses per level and overflows the stack near 1,000.
MAX_YAML_NESTING_LEVELS = 32

#: YAML nodes (scalars, mappings, sequences) in a topology file: the explicit form of a fabric at
#: the maxima in its most verbose form (a link: a mapping with 5 keys, 11 nodes; a switch: 4 keys, 9
#: nodes; a host as {name: h}: 3 nodes), plus the few top-level ones. Composing costs ~350 bytes per
#: node (~800 MB at this limit), so the count is checked first, by a scan that holds no nodes.
MAX_YAML_NODES = 11 * MAX_LINKS + 9 * MAX_SWITCHES + 3 * MAX_HOSTS + 64

#: Bits of an integer in a topology file: every integer is a count, a port or a 64-bit dpid.
#: (Python refuses to print an integer of more than 4,300 digits; a hex literal can be longer.)
MAX_YAML_INT_BITS = 64


def _count_text(n: int) -> str:
    # Python will not print an int of more than 4,300 digits; say how big it is instead.
    return f"{n:,}" if n.bit_length() <= 64 else f"~2**{n.bit_length() - 1}"


def check_count(what: str, count: int, maximum: int, unit: str, why: str) -> None:
    """Refuse `count` > `maximum`, e.g. check_count("dual_plane", 2**30, MAX_HOSTS, "hosts", "...")."""
    if count > maximum:
        raise TopologyError(f"{what}: {_count_text(count)} {unit} exceed the maximum of {maximum:,} {unit} ({why})")


def check_sizes(what: str, hosts: int, switches: int, links: int, planes: int = 1) -> None:
    """Refuse a fabric of these sizes before it is built."""
    check_count(what, planes, MAX_PLANES, "planes", "fabric.limits.MAX_PLANES")
    check_count(what, hosts, MAX_HOSTS, "hosts", "the address plan: a plane's /16 numbers 2**16 - 2 hosts")
    check_count(what, switches, MAX_SWITCHES, "switches", "fabric.limits.MAX_SWITCHES")
    check_count(what, links, MAX_LINKS, "links", "fabric.limits.MAX_LINKS")


def rate_problem(rate_gbps: float, name: str = "rate_gbps") -> str | None:
    """Why a link rate cannot be used, or None. NaN and infinities are out of range too."""
    try:
        rate = float(rate_gbps)
    except (OverflowError, TypeError, ValueError):
        rate = math.nan
    if not (math.isfinite(rate) and MIN_RATE_GBPS <= rate <= MAX_RATE_GBPS):
        return (f"{name} {rate:g} is outside {MIN_RATE_GBPS:g}..{MAX_RATE_GBPS:g} Gbit/s "
                "(1 Mbit/s to 100 Tbit/s, fabric.limits)")
    return None

#: Every shaped port's HTB burst in the emulation (`fabric.emulation.plan`): a transfer of about this size
#: leaves at the veth's speed, not at the shaped rate.
HTB_BURST_BYTES = 15 * 1024
