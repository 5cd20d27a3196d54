"""Topology files: round trip, explicit form, and malformed files failing with errors that name the item."""
from __future__ import annotations

import textwrap

import pytest

from fabric import topofile
from fabric.builders import dual_plane, pyramid
from fabric.errors import TopologyError

TINY = """
name: tiny
planes: [A, B]
switches:
  - {name: la, role: leaf, plane: A}
  - {name: lb, role: leaf, plane: B}
hosts: [h0, h1]
links:
  - {a: h0, b: la, rate_gbps: 100}
  - {a: h1, b: la, rate_gbps: 100}
  - {a: h0, b: lb, rate_gbps: 100}
  - {a: h1, b: lb, rate_gbps: 100}
"""


@pytest.mark.parametrize("fab", [dual_plane(), pyramid(), dual_plane(hosts=6, hosts_per_leaf=2, plane_kind="mesh")],
                         ids=["dual-plane", "pyramid", "mesh"])
def test_yaml_round_trip(fab):
    again = topofile.loads(topofile.dumps(fab))
    assert again == fab
    assert again.nic_ports == fab.nic_ports


def test_shipped_files_load_and_match_their_builders():
    assert topofile.load("topologies/dual-plane-16.yaml") == dual_plane(
        hosts=16, hosts_per_leaf=4, spines_per_plane=2, nic_rate_gbps=200, name="dual-plane-16")
    for name in ("pyramid-16", "leaf-spine-16", "dual-plane-1024", "pyramid-1024"):
        assert len(topofile.load(name).hosts) == int(name.rsplit("-", 1)[1])


def test_explicit_form_numbers_ports_and_addresses():
    fab = topofile.loads(TINY)
    assert [(l.a.port, l.b.port) for l in fab.links] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert str(fab.nic("h1", "B").ip) == "198.19.0.2"
    assert fab.nic("h1", "B").switch == "lb"


def _mutate(old: str, new: str) -> str:
    assert old in TINY
    return TINY.replace(old, new)


@pytest.mark.parametrize("text, needle", [
    (_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: h1, b: lc, rate_gbps: 100}"), "unknown node 'lc'"),
    (_mutate("hosts: [h0, h1]", "hosts: [h0, h1, la]"), "duplicate node name 'la'"),
    (_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: h1, b: lb, rate_gbps: 0}"), r"link 3 \(h1 -- lb\): rate_gbps 0 is outside"),
    (_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: h1, b: lb, rate_gbps: -5}"), "rate_gbps -5 is outside"),
    (_mutate("hosts: [h0, h1]", "hosts: [h0, h1, h2]"), "host 'h2' has no link"),
    (_mutate("  - {a: h1, b: lb, rate_gbps: 100}\n", ""), "host 'h1' has no port in plane 'B'"),
    (_mutate("{name: lb, role: leaf, plane: B}", "{name: lb, role: leaf, plane: C}"), "switch 'lb': plane 'C' is not declared"),
    (_mutate("planes: [A, B]", "planes: [A]"), "switch 'lb': plane 'B' is not declared"),
    (_mutate("planes: [A, B]", "planes: [A, B, C]"), "plane 'C'"),
    (_mutate("role: leaf, plane: B", "role: router, plane: B"), "switch 'lb': role 'router'"),
    (_mutate("planes: [A, B]", "planes: [A, {name: B, subnet: 10.1.0.0/16}]"), "outside 198.18.0.0/15"),
    (_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: h1, b: lb}"), r"links\.3\.rate_gbps: Field required"),
    (_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: h1, b: lb, rate_gbps: 100, colour: red}"), r"links\.3\.colour"),
    (_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: h1, b: la, rate_gbps: 100}"), "parallel links|two ports in plane 'A'"),
    (_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: la, b: lb, rate_gbps: 100}"), "joins plane 'A' to plane 'B'"),
    (_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: h1, b: h0, rate_gbps: 100}"), "hosts cannot be linked directly"),
    ("name: x\nbuilder: dual_plane\nparams: {hosts: 16, spines: 2}\n", "unknown parameter 'spines'"),
    ("name: x\nbuilder: fat_tree\n", "unknown builder 'fat_tree'"),
    ("- just\n- a list\n", "expected a mapping"),
    ("name: [unclosed\n", "not valid YAML"),
])
def test_malformed_topology_is_named(text, needle):
    with pytest.raises(TopologyError, match=needle):
        topofile.loads(text, source="bad.yaml")


def test_error_names_the_file(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text(_mutate("{a: h1, b: lb, rate_gbps: 100}", "{a: h1, b: lc, rate_gbps: 100}"))
    with pytest.raises(TopologyError, match=r"broken\.yaml: link 3 \(h1 -- lc\): unknown node 'lc'"):
        topofile.load(p)
    with pytest.raises(TopologyError, match="cannot read topology file"):
        topofile.load(tmp_path / "missing.yaml")


def test_duplicate_port_is_named():
    text = textwrap.dedent("""
        name: ports
        planes: [A]
        switches: [{name: s, role: leaf, plane: A}]
        hosts: [h0, h1]
        links:
          - {a: h0, b: s, b_port: 3, rate_gbps: 10}
          - {a: h1, b: s, b_port: 3, rate_gbps: 10}
    """)
    with pytest.raises(TopologyError, match="port 3 on 's' is already used"):
        topofile.loads(text)
