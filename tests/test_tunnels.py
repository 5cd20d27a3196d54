"""Tunnelled links, planned without root (`fabric.emulation.tunnels`): the checks, which switch goes on
which stand-in server, the encapsulation's bytes and MTU (from the RFCs' header sizes, by hand), and
the commands that build them. The emulation test (tests/emulation/test_tunnel.py) runs them."""
from __future__ import annotations

import pytest

from fabric import builders, topofile
from fabric.emulation import plan, tunnels
from fabric.emulation.plan import EmulationOptions
from fabric.errors import TopologyError, UnsupportedError

LEAF_SPINE = topofile.load("leaf-spine-16")


def test_encapsulation_bytes_and_wire_mtu_from_the_header_sizes():
    # VXLAN (RFC 7348): outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8 on the wire per frame; a 1500-byte
    # inner packet is a 1514-byte frame, carried in 20 + 8 + 8 more bytes of IP packet
    assert tunnels.overhead_bytes("vxlan") == 50
    assert tunnels.underlay_mtu_bytes("vxlan") == 1500 + 14 + 36 == 1550
    # GRE with a key (RFC 2890): 4-byte header + 4-byte key
    assert tunnels.overhead_bytes("gre") == 14 + 20 + 8 == 42
    assert tunnels.underlay_mtu_bytes("gre") == 1542


def test_a_link_is_named_by_its_two_switches_even_when_names_contain_dashes():
    assert tunnels.parse_link(LEAF_SPINE, "leafA0-spineA2") == ("leafA0", "spineA2")
    fab = topofile.loads("""
name: dashes
planes: [{name: A, subnet: 198.18.0.0/16}]
switches:
- {name: leaf-0, role: leaf, plane: A, dpid: 1}
- {name: spine-0, role: spine, plane: A, dpid: 2}
hosts: [h0]
links:
- {a: leaf-0, a_port: 1, b: spine-0, b_port: 1, rate_gbps: 100}
- {a: h0, a_port: 0, b: leaf-0, b_port: 2, rate_gbps: 100}
""")
    assert tunnels.parse_link(fab, "leaf-0-spine-0") == ("leaf-0", "spine-0")
    with pytest.raises(TopologyError, match="'leafX-spineA0': name two switches"):
        tunnels.parse_link(LEAF_SPINE, "leafX-spineA0")
    with pytest.raises(UnsupportedError, match="h0 is a host"):
        tunnels.parse_link(LEAF_SPINE, "h0-leafA0")


def test_the_ends_of_every_tunnelled_link_go_on_different_servers():
    uplinks = [("leafA0", f"spineA{j}") for j in range(4)]
    assert tunnels.servers_of(LEAF_SPINE, uplinks) == {"leafA0": 0, "spineA0": 1, "spineA1": 1, "spineA2": 1,
                                                      "spineA3": 1}
    # a chain leafA0 - spineA0 - leafA1: the leaves on one server, the spine on the other
    assert tunnels.servers_of(LEAF_SPINE, [("leafA0", "spineA0"), ("spineA0", "leafA1")]) == \
        {"leafA0": 0, "spineA0": 1, "leafA1": 0}
    # named the other way round, the first-named switch is on server 0
    assert tunnels.servers_of(LEAF_SPINE, [("spineA0", "leafA0")]) == {"spineA0": 0, "leafA0": 1}


def test_links_that_cannot_be_split_over_two_servers_are_refused_naming_the_link():
    mesh = builders.dual_plane(hosts=6, hosts_per_leaf=2, plane_kind="mesh")
    ring = [("leafA0", "leafA1"), ("leafA1", "leafA2"), ("leafA2", "leafA0")]  # three leaves: an odd cycle
    with pytest.raises(UnsupportedError, match="tunnel link leafA2-leafA0: .* closes an odd cycle"):
        tunnels.servers_of(mesh, ring)
    tunnels.servers_of(mesh, ring[:2])  # a path is fine
    # two groups joined by a later link: the later group is flipped to fit
    assert tunnels.servers_of(LEAF_SPINE, [("leafA0", "spineA0"), ("leafA1", "spineA1"), ("spineA1", "leafA0")]) == \
        {"leafA0": 0, "spineA0": 1, "leafA1": 0, "spineA1": 1}
    assert tunnels.servers_of(LEAF_SPINE, [("leafA0", "spineA0"), ("spineA1", "leafA1"), ("spineA1", "leafA0")]) == \
        {"leafA0": 0, "spineA0": 1, "leafA1": 0, "spineA1": 1}
    assert tunnels.servers_of(LEAF_SPINE, [("leafA0", "spineA0"), ("spineA1", "leafA1"), ("leafA0", "spineA1")]) == \
        {"leafA0": 0, "spineA0": 1, "leafA1": 0, "spineA1": 1}


@pytest.mark.parametrize(("links", "error", "message"), [
    ([("leafA0", "leafA1")], TopologyError, "tunnel link leafA0-leafA1: no link between leafA0 and leafA1"),
    ([("leafA0", "spineA9")], TopologyError, "no switch 'spineA9'"),
    ([("h0", "leafA0")], UnsupportedError, "h0 is a host"),
    ([("leafA0", "spineA0"), ("spineA0", "leafA0")], UnsupportedError, "spineA0-leafA0 is named twice"),
])
def test_bad_links_are_refused_before_anything_is_built(links, error, message):
    with pytest.raises(error, match=message):
        plan.check_options(LEAF_SPINE, EmulationOptions(tunnel_links=tuple(links)), has_netem=False)


def test_a_tunnel_kind_the_kernel_lacks_is_refused_with_the_one_it_has():
    opts = EmulationOptions(tunnel_links=(("leafA0", "spineA0"),), tunnel_kind="gre")
    with pytest.raises(UnsupportedError, match=r"no gre tunnels \(module ip_gre\); use the tunnel kind vxlan"):
        plan.check_options(LEAF_SPINE, opts, has_netem=False, tunnel_kinds=frozenset({"vxlan"}))
    plan.check_options(LEAF_SPINE, opts, has_netem=False, tunnel_kinds=frozenset({"vxlan", "gre"}))
    with pytest.raises(UnsupportedError, match="tunnel kind must be one of vxlan, gre, got 'ipip'"):
        plan.check_options(LEAF_SPINE, EmulationOptions(tunnel_links=(("leafA0", "spineA0"),), tunnel_kind="ipip"),
                           has_netem=False)
    # no tunnels asked for: nothing to check, whatever the kernel has
    plan.check_options(LEAF_SPINE, EmulationOptions(tunnel_kind="gre"), has_netem=False, tunnel_kinds=frozenset())


def test_the_commands_make_the_wire_and_each_end_as_the_port_its_veth_would_have_been():
    fab = LEAF_SPINE
    links = [("leafA0", "spineA0"), ("leafA0", "spineA1")]
    tp = tunnels.plan_tunnels(fab, links, "vxlan", "123-0ab")
    assert tp.servers == ("flu-123-0ab-0", "flu-123-0ab-1")
    assert [(t.key, t.end0, t.end1) for t in tp.tunnels] == [
        (1, ("leafA0", fab.port_towards("leafA0", "spineA0")), ("spineA0", fab.port_towards("spineA0", "leafA0"))),
        (2, ("leafA0", fab.port_towards("leafA0", "spineA1")), ("spineA1", fab.port_towards("spineA1", "leafA0")))]
    assert tp.carries("spineA1", "leafA0") and not tp.carries("leafA1", "spineA0")
    index = {s.name: i for i, s in enumerate(fab.switches)}
    macs = {(e.node, e.port): plan.port_mac(index[e.node], e.port) for l in fab.links for e in (l.a, l.b)
            if e.node in index}
    netns = {s.name: f"fl-x-{s.name}" for s in fab.switches}
    cmds = tunnels.build_commands(tp, netns, macs)
    by_ns = {c.argv[2]: c.stdin.splitlines() for c in cmds if c.argv[:2] == ("ip", "-netns")}
    s0, s1 = by_ns["flu-123-0ab-0"], by_ns["flu-123-0ab-1"]
    leaf_port = fab.port_towards("leafA0", "spineA0")
    spine_port = fab.port_towards("spineA0", "leafA0")
    # the wire: made once, from server 0, its far end in server 1; MTU 1550; static neighbours both ways
    assert s0[0] == "link add ul0 type veth peer name ul1 netns flu-123-0ab-1"
    assert not any(line.startswith("link add ul") for line in s1)
    assert "link set ul0 address 0a:fb:ff:00:00:01 mtu 1550 up" in s0
    assert "addr add 198.51.100.1/24 dev ul0" in s0 and "addr add 198.51.100.2/24 dev ul1" in s1
    assert "neigh replace 198.51.100.2 lladdr 0a:fb:ff:00:00:02 dev ul0 nud permanent" in s0
    assert "neigh replace 198.51.100.1 lladdr 0a:fb:ff:00:00:01 dev ul1 nud permanent" in s1
    # leafA0's end of tunnel 1 on server 0, spineA0's on server 1, VNI 1, each moved into its switch's
    # namespace with the MAC Mininet would give its veth end
    assert (f"link add leafA0-eth{leaf_port} type vxlan id 1 local 198.51.100.1 remote 198.51.100.2 dstport 4789 "
            "nolearning") in s0
    assert (f"link add spineA0-eth{spine_port} type vxlan id 1 local 198.51.100.2 remote 198.51.100.1 "
            "dstport 4789 nolearning") in s1
    assert f"link set leafA0-eth{leaf_port} address {macs[('leafA0', leaf_port)]} mtu 1500" in s0
    assert f"link set leafA0-eth{leaf_port} netns fl-x-leafA0" in s0
    assert f"link set spineA0-eth{spine_port} netns fl-x-spineA0" in s1
    # in the switches' namespaces: the moved ends set up, leafA0's two in one batch
    assert by_ns["fl-x-leafA0"] == [f"link set leafA0-eth{leaf_port} up",
                                    f"link set leafA0-eth{fab.port_towards('leafA0', 'spineA1')} up"]
    assert by_ns["fl-x-spineA1"] == [f"link set spineA1-eth{fab.port_towards('spineA1', 'leafA0')} up"]
    # IPv6 off in the servers before anything is made there; the switches' batches after the servers'
    order = [c.argv[2] if c.argv[:2] == ("ip", "-netns") else c.what for c in cmds]
    assert order.index("disabling IPv6 in flu-123-0ab-0") < order.index("flu-123-0ab-0")
    assert order.index("flu-123-0ab-1") < order.index("fl-x-leafA0")
    gre = tunnels.build_commands(tunnels.plan_tunnels(fab, links[:1], "gre", "r"), netns, macs)
    assert any(f"link add leafA0-eth{leaf_port} type gretap local 198.51.100.1 remote 198.51.100.2 key 1" in c.stdin
               for c in gre)
