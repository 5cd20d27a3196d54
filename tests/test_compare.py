"""`fabriclab compare` on the simulator: rows from runs, the definitions worked by hand, the cache,
reproducibility, and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric import topofile
from fabric.errors import TopologyError
from fabriclab import compare as cmp
from fabriclab import rows as rows_mod
from fabriclab.study import verdicts
from fabriclab.cli import main
from tests.test_replay import coll, workload
from traffic.replay import ReplayOptions
from tests.conftest import simulated

DP16 = topofile.load("dual-plane-16")


def test_scaled_templates_keep_the_shape_and_refuse_what_cannot_be_built():
    f = topofile.scaled("dual-plane-1024", 128)
    assert f.name == "dual-plane-128" and len(f.hosts) == 128
    assert {n.rate_gbps for n in f.nic_ports} == {200}
    p = topofile.scaled("pyramid-1024", 128)  # 4 ToRs of 32: one pod of 4 (the template's pods hold 8)
    assert p.name == "pyramid-128" and sum(s.role == "tor" for s in p.switches) == 4
    with pytest.raises(TopologyError, match="multiple of hosts_per_leaf"):
        topofile.scaled("dual-plane-1024", 48)


def test_a_row_from_a_run_follows_the_definitions():
    # untimed: one 1.6 MB ring all-reduce per step after 100 us of compute, on 16 hosts of 2 x 200 G
    n, size, gap_us = 16, 1_600_000, 100.0
    res = simulated(workload([coll(size=size, n=n)], n=n, timed=False, steps=3), "t", DP16, "adaptive",
                          ReplayOptions(compute_gap_us=gap_us))
    row = rows_mod.row_from_result(res, "dual-plane-16", "dual-plane-16", "adaptive", n)
    comm_us = 2 * (n - 1) * (size / n) * 8 / 400e9 * 1e6  # the ring bound at 400 G per host
    assert row.steps == 3
    assert row.step_mean_us == pytest.approx(gap_us + comm_us, rel=1e-9)
    assert row.utilisation == pytest.approx(gap_us / (gap_us + comm_us), rel=1e-9)
    assert row.comm_share == pytest.approx(comm_us / (gap_us + comm_us), rel=1e-9)
    assert row.busbw_bps == pytest.approx(400e9, rel=1e-9)
    assert row.hot_link_share == 0.0  # planned ports: no fabric link runs above 90%


def test_ecmp_collisions_counted_by_hand(tmp_path):
    # leaf-spine-16 (4 spines). Ranks 0..3 on h0, h4, h1, h5: the ring h0 -> h4 -> h1 -> h5 -> h0 sends
    # h0 -> h4 and h1 -> h5 out of leafA0, h4 -> h1 and h5 -> h0 out of leafA1. One channel, planned
    # (`pair_sport`): pair (a, b) leaves its leaf by uplink (a + b + t) mod 4 (16 slots, 4 spines), the
    # twist t = (a // 4) mod 2 (the uplink turns over every 4 of the count). leafA0: 0 + 4 + 0 -> uplink
    # 0, 1 + 5 + 0 -> uplink 2: no collision, 2 uplinks idle. leafA1: 4 + 1 + 1 and 5 + 0 + 1 both ->
    # uplink 2 while 3 carry none: 1 collision. 4 choices (one per connection, at its leaf).
    place = tmp_path / "place.yaml"
    place.write_text("{0: h0, 1: h4, 2: h1, 3: h5}\n")
    fab = topofile.load("leaf-spine-16")
    res = simulated(workload([coll(size=400_000, n=4)], n=4, timed=False), "t", fab, "ecmp",
                          ReplayOptions(channels=1, placement=str(place), ports="planned"))
    # the collision is at leafA1, a switch of role "leaf"
    assert res.extra["ecmp"] == {"collisions": 1, "choices": 4, "ports_idle": 5, "by_role": {"leaf": 1}}
    # with 4 channels, channel c of every pair takes uplink (4 (a + b + t) + c) mod 4 = c: each uplink
    # carries one connection of each of its leaf's 2 pairs; no collision, nothing idle
    res4 = simulated(workload([coll(size=400_000, n=4)], n=4, timed=False), "t", fab, "ecmp",
                           ReplayOptions(channels=4, placement=str(place), ports="planned"))
    assert res4.extra["ecmp"] == {"collisions": 0, "choices": 16, "ports_idle": 0, "by_role": {}}


def row(topology, routing, gpus, step_mean_us, **kw):
    base = dict(fabric=topology, steps=1, step_p99_us=step_mean_us, utilisation=0.5, comm_share=0.5, busbw_bps=1.0,
                hot_link_share=0.0, load_max_over_mean=1.0, ecmp_collisions=0, ecmp_choices=0)
    return cmp.Row(topology=topology, routing=routing, gpus=gpus, step_mean_us=step_mean_us, **(base | kw))


def test_scaling_efficiency_is_against_the_series_smallest_size():
    rows = rows_mod.with_efficiency([row("a", "ecmp", 256, 150.0), row("a", "ecmp", 128, 100.0),
                                row("b", "adaptive", 512, 120.0), row("b", "adaptive", 256, 110.0)])
    assert [r.efficiency for r in rows] == pytest.approx([100 / 150, 1.0, 110 / 120, 1.0])


def test_seed_figures_are_judged_by_direction_and_ratio():
    pyr = row("pyramid-1024", "ecmp", 1024, 2.8e6, step_p99_us=4.7e6, utilisation=0.68, comm_share=0.32,
              efficiency=0.62)
    # dual-plane: utilisation and efficiency as the seed, step mean better but by less, p99 worse,
    # communication share equal
    dual = row("dual-plane-1024", "adaptive", 1024, 2.5e6, step_p99_us=5.0e6, utilisation=0.92, comm_share=0.32,
               efficiency=0.87)
    got = {s["metric"]: s for s in verdicts.seed_check([pyr, dual])}
    assert got["utilisation"]["size_reproduced"] and got["efficiency"]["size_reproduced"]
    # 2.5 / 2.8 = 0.89 against the seed's 1.9 / 2.8 = 0.68: further than 1.25x apart
    assert got["step_mean_us"]["direction_reproduced"] and not got["step_mean_us"]["size_reproduced"]
    assert not got["step_p99_us"]["direction_reproduced"] and "opposite" in got["step_p99_us"]["differs"]
    assert not got["comm_share"]["direction_reproduced"] and "equal" in got["comm_share"]["differs"]


def test_steps_within_the_tie_band_are_a_tie_and_beyond_it_a_direction():
    # 9.018 / 8.999 s: 0.21% apart, inside the 1% the simulator resolves: no verdict either way
    pyr = row("pyramid-1024", "ecmp", 1024, 9.018e6, comm_share=0.19, hottest_by_tier={"tor->agg": 0.69})
    dual = row("dual-plane-1024", "adaptive", 1024, 8.999e6, comm_share=0.165)
    got = {s["metric"]: s for s in verdicts.seed_check([pyr, dual])}
    assert not got["step_mean_us"]["direction_reproduced"] and "+0.21%" in got["step_mean_us"]["differs"]
    # a comm share 15% lower (0.165 / 0.19) is a direction, not a tie
    assert got["comm_share"]["direction_reproduced"]
    # 9.2 / 8.999: 2.2% apart, beyond the band: the dual-plane is faster, by less than the seed says
    got = {s["metric"]: s for s in verdicts.seed_check([row("pyramid-1024", "ecmp", 1024, 9.2e6), dual])}
    assert got["step_mean_us"]["direction_reproduced"] and not got["step_mean_us"]["size_reproduced"]


def test_compare_cli_runs_caches_and_reproduces(tmp_path: Path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    base = ["compare", "builtin", "--topology", "pyramid-16", "--routing", "ecmp", "--topology", "dual-plane-16",
            "--routing", "adaptive", "--out", str(out), "--cache", str(cache), "--jobs", "2", "--json"]
    assert main([*base, "--sizes", "8", "16"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert [(r["fabric"], r["gpus"], r["cached"]) for r in first["rows"]] == [
        ("pyramid-8", 8, False), ("pyramid-16", 16, False), ("dual-plane-8", 8, False), ("dual-plane-16", 16, False)]
    for r in first["rows"]:
        assert r["efficiency"] == pytest.approx(
            next(b for b in first["rows"] if b["topology"] == r["topology"] and b["gpus"] == 8)["step_mean_us"]
            / r["step_mean_us"])
    assert {s["metric"] for s in first["seed"]} == set(verdicts.SEED)
    assert (out / "compare.csv").read_text().count("\n") == 5 and (out / "compare.txt").is_file()
    # one size changed: only it is computed; the rest come from the cache, equal
    assert main([*base, "--sizes", "16", "4"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert [(r["fabric"], r["cached"]) for r in second["rows"]] == [
        ("pyramid-4", False), ("pyramid-16", True), ("dual-plane-4", False), ("dual-plane-16", True)]
    strip = lambda r: {k: v for k, v in r.items() if k not in ("cached", "sim_wall_s", "efficiency")}
    assert strip(second["rows"][1]) == strip(first["rows"][1])
    # reproducible: without the cache, the same figures again
    assert main([*base, "--sizes", "8", "16", "--no-cache"]) == 0
    third = json.loads(capsys.readouterr().out)
    assert [strip(r) for r in third["rows"]] == [strip(r) for r in first["rows"]]


def test_lockstep_runs_above_the_flat_ring_size_and_agrees_with_the_exact_dag_below_it(tmp_path: Path, capsys,
                                                                                        monkeypatch):
    # auto: lockstep (and the hierarchical all-reduce) only above --hierarchical-above, here lowered to 8
    base = ["compare", "builtin", "--topology", "pyramid-16", "--routing", "ecmp", "--topology", "dual-plane-16",
            "--routing", "adaptive", "--out", str(tmp_path / "o"), "--no-cache", "--jobs", "2", "--json"]
    assert main([*base, "--sizes", "8", "16", "--hierarchical-above", "8"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["gpus"], r["algorithm"], r["lockstep"]) for r in rows] == [
        (8, "nccl", False), (16, "hierarchical", True)] * 2
    # at one size, exact and lockstep: the same step times within 2% (the ring's slowest hop sets both)
    exact, lock = [], []
    for mode, into in (("off", exact), ("on", lock)):
        assert main([*base, "--sizes", "16", "--lockstep", mode]) == 0
        into.extend(json.loads(capsys.readouterr().out)["rows"])
    assert [r["lockstep"] for r in exact + lock] == [False, False, True, True]
    for e, l in zip(exact, lock):
        assert l["step_mean_us"] == pytest.approx(e["step_mean_us"], rel=0.02), e["fabric"]
    with pytest.raises(SystemExit) as exited:
        main([*base, "--sizes", "16", "--lockstep", "maybe"])
    assert exited.value.code == 2 and "invalid choice: 'maybe'" in capsys.readouterr().err


@pytest.mark.parametrize("args, match", [
    (["--sizes", "1"], "sizes must be >= 2"),
    (["--topology", "dual-plane-16", "--sizes", "6"], "multiple of hosts_per_leaf"),
    (["--topology", "dual-plane-16", "--routing", "nope"], "nope"),
    (["--routing", "ecmp"], "--routing needs --topology"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--forwarding", "cut-through", "--lockstep", "on"], "cut-through forwarding and lockstep exclude each other"),
])
def test_compare_bad_input_exits_2_named(tmp_path: Path, capsys, args, match):
    assert main(["compare", "builtin", "--out", str(tmp_path / "o"), "--cache", str(tmp_path / "c"), *args]) == 2
    err = capsys.readouterr().err
    assert "fabriclab: error:" in err and match in err
    assert not (tmp_path / "o").exists()


def test_an_explicit_topology_cannot_be_scaled(tmp_path: Path):
    f = tmp_path / "tiny.yaml"
    f.write_text("name: tiny\nplanes: [{name: A, subnet: 198.18.0.0/16}]\nswitches: [{name: leaf0, role: leaf, "
                 "plane: A}]\nhosts: [h0, h1]\nlinks: [{a: h0, b: leaf0, rate_gbps: 100}, {a: h1, b: leaf0, "
                 "rate_gbps: 100}]\n")
    with pytest.raises(TopologyError, match="only a builder topology"):
        topofile.scaled(f, 2)
