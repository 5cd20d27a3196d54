"""`fabriclab plan` (`fabriclab.planner`): designs files and their errors, designs as builder parameters,
the parts of two designs by hand, the Pareto front of a hand-made set, and a small plan end to end on the
main job's 16-GPU slice, where the pipeline and data-parallel traffic crosses the ToRs."""
from __future__ import annotations

import csv
import json
import math

import pytest
import yaml

from fabric import topofile
from fabric.analysis import oversubscription
from fabric.parts import bill, cost, prices_from
from fabriclab import plan_report, planner
from fabriclab.cli import main
from fabriclab.study.main_job import MAIN_TRACE


def _designs(doc):
    return planner.designs_from(doc, "designs.yaml")


# ---- the designs file ---------------------------------------------------------------------------------

def test_a_sweep_is_the_cross_product_of_its_axes_and_designs_follow():
    ds = _designs({"defaults": {"gpus_per_server": 4, "agg_oversubscription": 2},
                   "sweep": [{"fabric": "pyramid", "edge_oversubscription": [1, 2, 4], "wiring": ["rail", "server"]}],
                   "designs": [{"fabric": "dual-plane", "plane": "mesh"}]})
    assert len(ds) == 3 * 2 + 1
    assert [(d.edge_oversubscription, d.wiring) for d in ds[:6]] == [
        (1, "rail"), (1, "server"), (2, "rail"), (2, "server"), (4, "rail"), (4, "server")]
    # a default applies where the fabric has the key: the pyramids' aggregation, not the dual-plane's
    assert {d.agg_oversubscription for d in ds[:6]} == {2}
    assert ds[6].fabric == "dual-plane" and "agg_oversubscription" not in ds[6].model_fields_set
    assert {d.gpus_per_server for d in ds} == {4}


@pytest.mark.parametrize("doc, needle", [
    ({"sweep": [{"fabric": "pyramid", "spine": 4}]}, r"sweep\[0\]\.spine: unknown key"),
    ({"sweep": [{"fabric": "pyramid", "edge_oversubscription": [1, -2]}]},
     r"sweep\[0\]\.edge_oversubscription\[1\]: Input should be greater than 0"),
    ({"sweep": [{"fabric": "pyramid", "wiring": []}]}, r"sweep\[0\]\.wiring: an empty list"),
    ({"designs": [{"fabric": "dual-plane", "agg_oversubscription": 2}]},
     r"designs\[0\]: agg_oversubscription: only a pyramid has it, not a dual-plane"),
    ({"designs": [{"fabric": "dual-plane", "plane": "mesh", "spines": 4}]}, r"designs\[0\]: spines: a mesh plane"),
    ({"designs": [{"fabric": "torus"}]}, r"designs\[0\]\.fabric: Input should be 'pyramid'"),
    ({"designs": [{"wiring": "rail"}]}, r"designs\[0\]\.fabric: Field required"),
    ({"designs": [{"fabric": "pyramid", "wiring": "diagonal"}]}, r"designs\[0\]\.wiring"),
    ({"designs": [{"fabric": "pyramid", "name": "a/b"}]}, r"designs\[0\]\.name"),
    ({"design": [{"fabric": "pyramid"}]}, r"design: unknown key \(keys: defaults, sweep, designs\)"),
    ({"defaults": {"spinez": 2}, "designs": [{"fabric": "pyramid"}]}, r"defaults\.spinez: unknown key"),
    ({"sweep": [{"fabric": "pyramid", "name": "x"}]}, r"sweep\[0\]\.name: a sweep's designs are named"),
    ({}, "no designs"),
    ([1], "expected a mapping"),
])
def test_bad_designs_are_refused_naming_the_key(doc, needle):
    with pytest.raises(planner.PlanError, match=needle) as e:
        _designs(doc)
    assert str(e.value).startswith("designs.yaml: ")


def test_designs_that_clash_are_refused_by_name():
    twice = _designs({"designs": [{"fabric": "pyramid", "name": "a"}, {"fabric": "pyramid", "name": "b"}]})
    with pytest.raises(planner.PlanError, match="designs 'a' and 'b' are the same design"):
        planner.resolve(twice, 16, 4)
    named = _designs({"designs": [{"fabric": "pyramid", "name": "a"},
                                  {"fabric": "pyramid", "name": "a", "edge_oversubscription": 2}]})
    with pytest.raises(planner.PlanError, match="two designs are named 'a'"):
        planner.resolve(named, 16, 4)
    with pytest.raises(planner.PlanError, match="design 1 \\(pyramid\\): 20 GPUs are not whole servers of 8"):
        planner.resolve(_designs({"designs": [{"fabric": "pyramid"}]}), 20, 8)
    # a design the builder cannot build is refused with its name and the builder's reason
    with pytest.raises(planner.PlanError, match="design 'odd' at 16 GPUs: .*multiple of hosts_per_tor"):
        planner.resolve(_designs({"designs": [{"fabric": "pyramid", "name": "odd", "hosts_per_edge": 3}]}), 16, 4)


def test_the_cli_refuses_a_bad_designs_file_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "d.yaml"
    bad.write_text(yaml.safe_dump({"sweep": [{"fabric": "pyramid", "edge_oversubcription": [1, 2]}]}))
    out = tmp_path / "out"
    assert main(["plan", "--model", "gpt3-175b", "--gpus", "1024", "--designs", str(bad), "--out", str(out)]) == 2
    assert "sweep[0].edge_oversubcription: unknown key" in capsys.readouterr().err
    assert not out.exists()  # nothing half-built
    prices = tmp_path / "p.yaml"
    prices.write_text("optic: {400: 1}\nswitchport: 2\n")
    assert main(["plan", "--model", "gpt3-175b", "--gpus", "1024", "--prices", str(prices), "--out", str(out)]) == 2
    assert "switchport: unknown part kind" in capsys.readouterr().err
    assert not out.exists()


def test_the_shipped_designs_resolve_at_1024_gpus_named_by_their_choices():
    planned = planner.resolve(planner.load_designs(planner.DEFAULT_DESIGNS_FILE), 1024, 8)
    assert len(planned) >= 12
    names = [p.name for p in planned]
    assert len(set(names)) == len(names)
    assert "pyramid-4to1-agg1to1-servers" in names and "dual-plane-mesh-1to1-rail-adaptive" in names
    by = {p.name: p for p in planned}
    # every GPU has 400 Gbit/s of NIC: one 400G port, or two 200G ports on the dual-plane
    assert {p.gpu_gbps for p in planned} == {400}
    # the pyramid's tiers: 4:1 at the ToR, 1:1 above it; 2:1 and 2:1
    assert oversubscription(by["pyramid-4to1-agg1to1-rail"].fabric) == {"tor": 4.0, "agg": 1.0}
    assert oversubscription(by["pyramid-2to1-agg2to1-servers"].fabric) == {"tor": 2.0, "agg": 2.0}
    # an oversubscribed dual-plane leaf has fewer spines (16 of 32 at 2:1), its uplinks at the NIC's rate
    dp2 = by["dual-plane-clos-2to1-rail-adaptive"]
    assert dp2.params["spines_per_plane"] == 16 and oversubscription(dp2.fabric) == {"leaf": 2.0}
    assert bill(dp2.fabric).rounded_up_gbps == 0


def test_the_sample_designs_file_parses():
    planned = planner.resolve(planner.load_designs(planner.PLANS_DIR / "example.yaml"), 1024, 8)
    assert len(planned) >= 2


# ---- two designs' parts, by hand, through the planner ---------------------------------------------------

def test_two_designs_parts_by_hand():
    ds = _designs({"defaults": {"gpus_per_server": 4, "hosts_per_edge": 4},
                   "designs": [
                       # 16 GPUs, 4 a ToR (4 ToRs), pods of 2 ToRs with 2 aggs each (4 aggs), 2 cores, 2:1 and 1:1
                       {"name": "pyr", "fabric": "pyramid", "wiring": "server", "edge_oversubscription": 2,
                        "tors_per_pod": 2, "aggs_per_pod": 2, "spines": 2},
                       # 16 GPUs of 2 x 200G, 4 a leaf: per plane 4 leaves, 4 spines (1:1), 200G uplinks
                       {"name": "dp", "fabric": "dual-plane", "wiring": "server", "spines": 4}]})
    pyr, dp = planner.resolve(ds, 16, 4)
    assert (pyr.builder, dp.builder) == ("pyramid", "dual_plane")
    bp, bd = bill(pyr.fabric), bill(dp.fabric)
    # pyramid: ToR uplinks 4 x 400 / 2 = 800 over 2 aggs: 400 each, one 400G port; agg uplinks 2 x 400 / 1
    # over 2 cores: 400, one port. ToR 4 + 2 ports, agg 2 + 2, core 4 (aggs)
    assert [(p.tier, p.size, p.count) for p in bp.switches()] == [("tor", 6, 4), ("agg", 4, 4), ("core", 4, 2)]
    assert bp.by_tier("switch_port") == {"host-tor": 16, "tor-agg": 16, "agg-core": 16}
    assert bp.by_tier("optic") == {"host-tor": 32, "tor-agg": 16, "agg-core": 16}
    assert sum(cost(bp).values()) == 48 + 64
    # dual-plane: per plane a leaf has 4 host ports + 4 uplinks (4 x 200 / 4 spines = 200G each: one port), a
    # spine 4 leaves; two planes of 4 leaves and 4 spines
    assert [(p.tier, p.size, p.count) for p in bd.switches()] == [("leaf", 8, 8), ("spine", 4, 8)]
    # links: 2 planes x (16 host + 16 leaf-spine); ports: host links one switch port, others two
    assert bd.by_tier("link") == {"host-leaf": 32, "leaf-spine": 32}
    assert bd.by_tier("switch_port") == {"host-leaf": 32, "leaf-spine": 64}
    assert bd.by_tier("optic") == {"host-leaf": 64, "leaf-spine": 64}
    assert sum(cost(bd).values()) == 96 + 128
    # custom prices: 200G optics half a 400G one; ports 1; switches 5 each whatever their radix
    prices = prices_from({"optic": {"400": 1, "200": 0.5}, "switch": 5})
    assert sum(cost(bp, prices).values()) == 48 + 64 + 10 * 5
    assert sum(cost(bd, prices).values()) == 96 + 128 * 0.5 + 16 * 5


# ---- the Pareto front ------------------------------------------------------------------------------------

def test_the_pareto_front_of_a_hand_made_set():
    pts = [(10, 5), (20, 3), (15, 6), (30, 3), (20, 3), (5, 10), (math.nan, 1), (40, 1)]
    # (15, 6) is beaten by (10, 5); (30, 3) by (20, 3); the two (20, 3) beat neither each other; the cheapest
    # and the fastest are always on it; a design not run yet is not
    assert plan_report.pareto_front(pts) == [True, True, False, False, True, True, False, True]
    assert plan_report.pareto_front([]) == []
    # steps within 1% are equal: a dearer design 0.5% faster is not on the front, one 2% faster is
    assert plan_report.pareto_front([(10, 9.0), (20, 8.955)]) == [True, False]
    assert plan_report.pareto_front([(10, 9.0), (20, 8.82)]) == [True, True]
    # equal cost, steps within the tolerance: neither is better, both stay
    assert plan_report.pareto_front([(10, 9.0), (10, 9.0005)]) == [True, True]


# ---- end to end -------------------------------------------------------------------------------------------

SMALL = {"defaults": {"gpus_per_server": 4, "hosts_per_edge": 4, "wiring": "server", "port_gbps": 200},
         "sweep": [{"fabric": "pyramid", "edge_oversubscription": [1, 4], "tors_per_pod": 2, "aggs_per_pod": 2,
                    "spines": 2}]}


def _plan(tmp_path, out, *extra):
    designs = tmp_path / "designs.yaml"
    designs.write_text(yaml.safe_dump(SMALL))
    return main(["plan", MAIN_TRACE, "--gpus", "16", "--designs", str(designs), "--out", str(out), "--jobs", "2",
                 "--cache", str(tmp_path / "cache"), *extra])


def test_a_small_plan_end_to_end(tmp_path, capsys):
    out = tmp_path / "plan"
    assert _plan(tmp_path, out) == 0
    text = capsys.readouterr().out
    doc = json.loads((out / "plan.json").read_text())
    assert doc["meta"]["complete"] and doc["meta"]["gpus"] == 16
    d = {x["name"]: x for x in doc["designs"]}
    assert set(d) == {"pyramid-1to1", "pyramid-4to1"}
    # by hand, 200G ports: at 1:1 a ToR's uplinks are 4 x 400 = 1600 over 2 aggs, 800 each: 4 ports; an agg's
    # 2 x 800 over 2 cores: 4 ports. Ports 16 (hosts) + 8 x 4 x 2 + 8 x 4 x 2 = 144, optics 32 + 64 + 64 = 160.
    # At 4:1 every uplink is 200: one port. Ports 16 + 16 + 16 = 48, optics 32 + 16 + 16 = 64.
    assert d["pyramid-1to1"]["cost"] == 144 + 160 and d["pyramid-4to1"]["cost"] == 48 + 64
    # every server is under its own ToR, so the pipeline and data-parallel transfers cross the ToR uplinks:
    # a quarter of the uplink bandwidth makes the step slower, and both designs are on the front
    assert d["pyramid-4to1"]["step_mean_us"] > d["pyramid-1to1"]["step_mean_us"]
    assert d["pyramid-4to1"]["pareto"] and d["pyramid-1to1"]["pareto"]
    # efficiency: the reference (one switch, 400G per GPU) over the design: at most 1, the 4:1 the lower
    ref = d["pyramid-1to1"]["reference_step_us"]
    assert ref == d["pyramid-4to1"]["reference_step_us"]
    for x in d.values():
        assert x["efficiency"] == pytest.approx(ref / x["step_mean_us"]) and x["efficiency"] <= 1.0 + 1e-9
    assert d["pyramid-4to1"]["efficiency"] < d["pyramid-1to1"]["efficiency"]
    # the table lists both, cheapest first, front marked
    lines = [l for l in text.splitlines() if "pyramid-" in l and l.startswith("*")]
    assert [l.split()[1] for l in lines][:2] == ["pyramid-4to1", "pyramid-1to1"]
    # the CSV has a line per design; the plot is a PNG
    rows = list(csv.DictReader((out / "plan.csv").open()))
    assert {r["name"]: float(r["cost"]) for r in rows} == {"pyramid-1to1": 304.0, "pyramid-4to1": 112.0}
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # each design is a topology file that `topo check` accepts and that builds the fabric the plan ran
    for x in d.values():
        assert main(["topo", "check", x["files"]["file"]]) == 0
        assert topofile.load(x["files"]["file"]).name == x["row"]["fabric"]
        assert x["files"]["emulated"] == x["files"]["file"]  # at 16 GPUs the design's file is the emulated one
    assert oversubscription(topofile.load(d["pyramid-4to1"]["files"]["file"])) == {"tor": 4.0, "agg": 1.0}
    # a second run computes nothing: every row comes from the cache
    capsys.readouterr()
    assert _plan(tmp_path, tmp_path / "again", "--json") == 0
    again = json.loads(capsys.readouterr().out)
    assert all(x["row"]["cached"] for x in again["designs"])
    assert [x["step_mean_us"] for x in again["designs"]] == [x["step_mean_us"] for x in doc["designs"]]


def test_designs_get_a_16_host_twin_for_the_emulator(tmp_path):
    planned = planner.resolve(planner.load_designs(planner.DEFAULT_DESIGNS_FILE), 1024, 8)
    files = planner.write_topologies(planned, 1024, tmp_path)
    for p in planned:
        twin = files[p.name]["emulated"]
        fab = topofile.load(twin)
        assert len(fab.hosts) == 16 and main(["topo", "check", twin]) == 0
        # the choices stay: the tiers' oversubscription and the wiring
        assert oversubscription(fab) == oversubscription(p.fabric)
        assert fab.gpus_per_server == p.fabric.gpus_per_server
