"""Input hardening: hostile topology files and builder parameters are refused at once with a named
error (exit code 2, the file and the item named, no traceback), and the limits still admit the
16,384-host fabrics the simulator needs. Expected figures are worked out by hand in the comments."""
from __future__ import annotations

import ipaddress
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from fabric import topofile
from fabric.analysis import summarize
from fabric.builders import dual_plane, leaf_spine, pyramid
from fabric.errors import TopologyError

ROOT = Path(__file__).resolve().parent.parent

TWO_SWITCHES = """
name: two
planes: [A]
switches:
  - {name: s1, role: leaf, plane: A}
  - {name: s2, role: leaf, plane: A}
hosts: [h0, h1]
links:
  - {a: h0, b: s1, rate_gbps: 100}
  - {a: h1, b: s2, rate_gbps: 100}
  - {a: s1, b: s2, rate_gbps: 100}
"""


def limited(*args: str) -> subprocess.CompletedProcess[str]:
    """`fabriclab ARGS` in its own process under a 1 GB address-space limit (tests/limited_cli.py).

    The timeout is the subprocess's own: an input that is built before it is refused (1e9 hosts ran
    35 s into a MemoryError) fails the test by TimeoutExpired or by its exit code and traceback."""
    return subprocess.run([sys.executable, "-m", "tests.limited_cli", *args], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=120)


def refused(path: Path, *needles: str, command: str = "check") -> str:
    res = limited("topo", command, str(path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"fabriclab: error: {path}: "), res.stderr
    for needle in needles:
        assert needle in res.stderr, res.stderr
    return res.stderr


# ---- the review's hostile files, through the CLI ------------------------------------------------------


def test_a_billion_hosts_is_refused_before_anything_is_built(tmp_path):
    p = tmp_path / "huge.yaml"
    p.write_text("name: huge\nbuilder: dual_plane\nparams: {hosts: 1000000000, hosts_per_leaf: 4}\n")
    # a plane's /16 holds 65,536 addresses less network and broadcast
    refused(p, "1,000,000,000 hosts", f"maximum of {2**16 - 2:,} hosts")


def test_65k_by_65k_switches_are_refused_before_anything_is_built(tmp_path):
    p = tmp_path / "wide.yaml"
    p.write_text("name: wide\nbuilder: leaf_spine\nparams: {hosts: 65532, hosts_per_leaf: 1, spines: 65532}\n")
    # 65,532 leaves + 65,532 spines; (and 65,532^2 + 65,532 links: 4.3e9)
    refused(p, "leaf_spine", "131,064 switches")


def test_a_quadratic_mesh_is_refused_by_its_link_count(tmp_path):
    p = tmp_path / "mesh.yaml"
    p.write_text("name: mesh\nbuilder: dual_plane\nparams: {hosts: 16384, hosts_per_leaf: 1, plane_kind: mesh}\n")
    # per plane 16,384 leaves in full mesh: 16,384 x 16,383 / 2 = 134,209,536 links, + 16,384 host links;
    # two planes: 268,451,840
    refused(p, "268,451,840 links")


def test_pyramid_counts_are_checked_before_building():
    # 16 hosts, 4 per ToR: 4 ToRs in 2 pods of 2, 2 aggregation switches per pod: 4 + 4 + a million cores
    with pytest.raises(TopologyError, match="pyramid: 1,000,008 switches exceed the maximum"):
        pyramid(hosts=16, cores=10**6)
    # 40,000 cores fit the switch maximum, but 4 aggs x 40,000 cores + 4 x 2 + 16 = 160,024 links do not
    with pytest.raises(TopologyError, match="pyramid: 160,024 links exceed the maximum"):
        pyramid(hosts=16, cores=40_000)


def test_50k_nested_brackets_are_refused_without_recursion(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("name: " + "[" * 50_000 + "]" * 50_000 + "\n")
    refused(p, "nested more than", "line 1")


def test_bytes_that_are_not_utf8_are_refused_naming_the_offset(tmp_path):
    p = tmp_path / "binary.yaml"
    p.write_bytes(b"name: x\nbuilder: dual_plane\n# caf\xe9\n")
    # "name: x\n" is 8 bytes, "builder: dual_plane\n" 20, "# caf" 5: the 0xe9 is at offset 33, line 3
    refused(p, "not UTF-8", "0xe9 at offset 33 (line 3)")


def test_a_disconnected_plane_fails_check_and_show_alike(tmp_path):
    p = tmp_path / "split.yaml"
    p.write_text(TWO_SWITCHES.replace("  - {a: s1, b: s2, rate_gbps: 100}\n", ""))
    for command in ("check", "show"):
        refused(p, "plane 'A' is disconnected", "'s1'", "'s2'", "'h0' and 'h1'", command=command)


@pytest.mark.parametrize("rate, shown", [("1e308", "1e+308"), ("1e-300", "1e-300")])
def test_a_link_rate_out_of_range_fails_check_and_show(tmp_path, rate, shown):
    # 1e308 made `topo show` crash in networkx's max-flow; 1e-300 was accepted
    p = tmp_path / "rate.yaml"
    p.write_text(TWO_SWITCHES.replace("{a: h1, b: s2, rate_gbps: 100}", f"{{a: h1, b: s2, rate_gbps: {rate}}}"))
    for command in ("check", "show"):
        refused(p, f"link 1 (h1 -- s2): rate_gbps {shown} is outside", command=command)


@pytest.mark.parametrize("rate, shown", [(".inf", "inf"), (".nan", "nan"), ("0.0009", "0.0009"),
                                         ("100001", "100001"), ("0", "0"), ("-5", "-5")])
def test_link_rates_outside_1_mbps_to_100_tbps_are_named(rate, shown):
    text = TWO_SWITCHES.replace("{a: h1, b: s2, rate_gbps: 100}", f"{{a: h1, b: s2, rate_gbps: {rate}}}")
    with pytest.raises(TopologyError, match=rf"r\.yaml: link 1 \(h1 -- s2\): rate_gbps {shown} is outside"):
        topofile.loads(text, "r.yaml")


@pytest.mark.parametrize("rate", ["1e308", "1e-300"])
def test_a_builder_nic_rate_out_of_range_is_named(tmp_path, rate):
    p = tmp_path / "nic.yaml"
    p.write_text(f"name: x\nbuilder: dual_plane\nparams: {{nic_rate_gbps: {rate}}}\n")
    refused(p, "nic_rate_gbps", "outside")


def test_dev_zero_is_refused_by_size(tmp_path):
    refused(Path("/dev/zero"), "larger than")


# ---- what the limits still admit ---------------------------------------------------------------------


def test_a_16384_host_dual_plane_fabric_loads():
    # per plane 16,384 / 32 = 512 leaves and 32 spines: 544 switches, 512 x 32 + 16,384 = 32,768 links
    fab = topofile.loads("name: dp16k\nbuilder: dual_plane\n"
                         "params: {hosts: 16384, hosts_per_leaf: 32, spines_per_plane: 32, nic_rate_gbps: 200}\n")
    assert (len(fab.hosts), len(fab.switches), len(fab.links)) == (16384, 1088, 65536)
    assert str(fab.nic("h16383", "B").ip) == "198.19.64.0"  # 198.19.0.0 + 16,384


def test_the_last_address_of_a_slash16_is_a_host_and_one_more_host_is_refused():
    # 65,534 = 151 x 434: 434 leaves, one spine: 435 switches, 434 + 65,534 links
    fab = leaf_spine(hosts=65534, hosts_per_leaf=151, spines=1)
    assert fab.nic("h65533", "A").ip == ipaddress.IPv4Address("198.18.255.254")  # broadcast is .255.255
    with pytest.raises(TopologyError, match="65,535 hosts exceed"):
        leaf_spine(hosts=65535, hosts_per_leaf=257, spines=1)  # 65,535 = 257 x 255


def test_rates_at_both_bounds_are_shown():
    # h0 - s1 and s2 - h1 at 100 Tbit/s, s1 - s2 at 1 Mbit/s: the cut between h0 and h1 is the 1 Mbit/s link
    text = (TWO_SWITCHES.replace("rate_gbps: 100}", "rate_gbps: 100000}")
            .replace("{a: s1, b: s2, rate_gbps: 100000}", "{a: s1, b: s2, rate_gbps: 0.001}"))
    summary = summarize(topofile.loads(text))
    assert summary.bisection_bandwidth_gbps == 0.001
    assert summary.host_bandwidth_gbps == 100000


def test_derived_uplink_rates_out_of_range_name_a_link():
    # leaf: 4 hosts x 200G down over 2 spines, oversubscription 1e-300: 400 / 1e-300 = 4e302 Gbit/s per uplink
    with pytest.raises(TopologyError, match=r"link 0 \(leafA0 -- spineA0\): rate_gbps 4e\+302 is outside"):
        dual_plane(oversubscription=1e-300)


# ---- the YAML layer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("loader", [yaml.SafeLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader)],
                         ids=["python", "libyaml"])
def test_nesting_is_counted_exactly_in_both_parsers(loader):
    # the top mapping is one level, each bracket one more: 31 brackets make 32 levels, the limit
    topofile._scan("a: " + "[" * 31 + "]" * 31, "ok.yaml", loader)
    with pytest.raises(TopologyError, match=r"deep\.yaml: line 1, column 35: collections nested more than 32"):
        topofile._scan("a: " + "[" * 32 + "]" * 32, "deep.yaml", loader)  # the 33rd level opens at column 35
    block = "".join("  " * i + "- \n" for i in range(40))  # block sequences nest by indentation
    with pytest.raises(TopologyError, match="line 33"):
        topofile._scan(block, "block.yaml", loader)


def test_node_count_is_limited_before_composing(monkeypatch):
    # {a: [0] * n} is a mapping, its key, a sequence and n scalars: n + 3 nodes
    monkeypatch.setattr(topofile, "MAX_YAML_NODES", 10)
    topofile._scan("a: [" + ", ".join(["0"] * 7) + "]", "ok.yaml")
    with pytest.raises(TopologyError, match="many.yaml: more than 10 YAML nodes"):
        topofile.loads("a: [" + ", ".join(["0"] * 8) + "]", "many.yaml")


def test_file_size_is_limited_before_reading_it_all(monkeypatch, tmp_path):
    text = "name: x\nbuilder: dual_plane\n"  # 28 bytes
    p = tmp_path / "t.yaml"
    p.write_text(text)
    monkeypatch.setattr(topofile, "MAX_TOPOLOGY_FILE_BYTES", 28)
    assert topofile.load(p).name == "x"
    monkeypatch.setattr(topofile, "MAX_TOPOLOGY_FILE_BYTES", 27)
    with pytest.raises(TopologyError, match="larger than 27 bytes"):
        topofile.load(p)
    with pytest.raises(TopologyError, match="28 bytes; a topology file may have at most 27"):
        topofile.loads(text, "t.yaml")


def test_merge_keys_cannot_grow_exponentially():
    # each level merges the previous one 9 times: level k holds 9^k entries; 9^7 > 4 million
    lines = ["a0: &a0 {k: v}"] + [f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 9)}]}}" for i in range(1, 12)]
    with pytest.raises(TopologyError, match="bomb.yaml: not valid YAML: mappings .* hold more than"):
        topofile.loads("\n".join(lines), "bomb.yaml")
    # an ordinary merge still works
    fab = topofile.loads(TWO_SWITCHES.replace("- {a: h1, b: s2, rate_gbps: 100}", "- {<<: *up, a: h1, b: s2}")
                         .replace("- {a: h0, b: s1, rate_gbps: 100}", "- &up {a: h0, b: s1, rate_gbps: 100}"))
    assert [l.rate_gbps for l in fab.links] == [100, 100, 100]


@pytest.mark.parametrize("value, needle", [
    ("9" * 5000, "an integer of 5,000 characters is beyond 64 bits"),  # Python refuses 4,300+ digits
    ("0x" + "f" * 17, "an integer of 19 characters is beyond 64 bits"),  # 68 bits
    ("2001-13-45", "cannot read '2001-13-45': month must be in 1..12"),  # a date Python cannot make
])
def test_values_python_cannot_convert_are_named_with_their_line(value, needle):
    with pytest.raises(TopologyError, match=f"(?s)v.yaml: not valid YAML: {needle}.*line 3"):
        topofile.loads(f"name: x\nbuilder: dual_plane\nparams: {{hosts: {value}}}\n", "v.yaml")


def test_a_64_bit_dpid_still_loads():
    text = TWO_SWITCHES.replace("{name: s2, role: leaf, plane: A}", "{name: s2, role: leaf, plane: A, dpid: "
                                "18446744073709551615}")  # 2^64 - 1
    assert topofile.loads(text).switch_by_name["s2"].dpid == 2**64 - 1


def test_explicit_counts_are_refused_before_the_schema():
    hosts = ", ".join(f"h{i}" for i in range(65535))
    with pytest.raises(TopologyError, match="big.yaml: explicit form: 65,535 hosts exceed"):
        topofile.loads(f"name: x\nplanes: [A]\nswitches: []\nlinks: []\nhosts: [{hosts}]\n", "big.yaml")
    planes = ", ".join(f"p{i}" for i in range(17))
    with pytest.raises(TopologyError, match="explicit form: 17 planes exceed the maximum of 16"):
        topofile.loads(f"name: x\nplanes: [{planes}]\nswitches: []\nlinks: []\nhosts: []\n")


def test_port_numbers_past_openflow_max_are_refused():
    # OFPP_MAX = 0xffffff00 = 4,294,967,040
    ok = TWO_SWITCHES.replace("{a: h0, b: s1, rate_gbps: 100}", "{a: h0, b: s1, b_port: 0xffffff00, rate_gbps: 100}")
    assert topofile.loads(ok).links[0].b.port == 4294967040
    with pytest.raises(TopologyError, match="port 4294967041 on 's1' must be in 1..4294967040"):
        topofile.loads(ok.replace("0xffffff00", "0xffffff01"))


def test_auto_ports_fill_the_gaps_between_explicit_ones():
    text = textwrap.dedent("""
        name: gaps
        planes: [A]
        switches: [{name: s, role: leaf, plane: A}]
        hosts: [h0, h1, h2, h3, h4, h5]
        links:
          - {a: h0, b: s, b_port: 1, rate_gbps: 1}
          - {a: h1, b: s, rate_gbps: 1}
          - {a: h2, b: s, b_port: 2, rate_gbps: 1}
          - {a: h3, b: s, rate_gbps: 1}
          - {a: h4, b: s, b_port: 4, rate_gbps: 1}
          - {a: h5, b: s, rate_gbps: 1}
    """)
    # explicit 1, 2, 4 are taken up front; the others get the lowest free ones in link order: 3, 5, 6
    assert [l.b.port for l in topofile.loads(text).links] == [1, 3, 2, 5, 4, 6]


def test_an_isolated_switch_splits_its_plane():
    text = TWO_SWITCHES.replace("  - {name: s2, role: leaf, plane: A}\n",
                                "  - {name: s2, role: leaf, plane: A}\n  - {name: s3, role: spine, plane: A}\n")
    with pytest.raises(TopologyError, match="plane 'A' is disconnected: switch 's3' has no path to switch 's1'$"):
        topofile.loads(text)
