"""`fabriclab sim`: a workload planned as the replay plans it, run on the flow-level simulator, and
reported as the replay reports. Figures are worked out by hand from the topology files' rates."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric import topofile
from fabric.flowsim import Job, SimOptions, simulate
from fabric.flowsim.maxmin import FlowSimError
from fabric.routing import EcmpPolicy, PathTable
from fabric.transfers import Placement, Transfer, TransferDag
from fabriclab.cli import main
from tests.test_replay import coll, workload
from traffic.replay import ReplayError, ReplayOptions
from traffic.replay.simulate import parse_link_event
from traffic.results import load_result
from tests.conftest import simulated

DP16 = topofile.load("dual-plane-16")  # 16 hosts, 2 x 200 G NIC ports each (one per plane), non-blocking
NIC_BPS = 200e9


def untimed(colls, n=16):
    return workload(colls, n=n, timed=False)


def test_a_ring_all_reduce_runs_at_the_hosts_bandwidth():
    # 16 ranks, one per host; a ring all-reduce of S sends 2(n-1) chunks of S/n from every host, one
    # after the other, each split over 2 connections per plane (planned: distinct paths): every NIC
    # runs full, so each step takes (S/n) x 8 / (2 x 200 G) and busbw (= algbw x 2(n-1)/n) is 400 G.
    n, size = 16, 16 * 4 * 250_000
    res = simulated(untimed([coll(size=size, n=n)]), "t", DP16, "adaptive", ReplayOptions())
    (c,) = res.collectives
    expected_s = 2 * (n - 1) * (size / n) * 8 / (2 * NIC_BPS)
    assert c.duration_real_us == pytest.approx(expected_s * 1e6, rel=1e-9)
    assert c.busbw_bps == pytest.approx(2 * NIC_BPS, rel=1e-9)
    assert res.meta.backend == "flowsim" and res.meta.dilation == 1 and res.meta.bytes_scale == 1
    # every host's NIC links carried its 2(n-1) chunks: the leaf -> host direction received them
    host_links = [l for l in res.links if l.tier == "host"]
    assert len(host_links) == 32
    for l in host_links:
        assert l.emu_bytes == pytest.approx(2 * (n - 1) * size / n / 2, rel=1e-6)  # half per plane
        assert max(l.util) <= 1 + 1e-9


def test_calls_run_one_after_another_and_steps_compose_from_them():
    # an untimed trace: collectives one after another; the step is their sum plus the compute gaps
    n = 16
    w = untimed([coll(size=1_600_000, n=n), coll(size=3_200_000, n=n), coll(kind="all_gather", size=1_600_000, n=n)])
    res = simulated(w, "t", DP16, "ecmp", ReplayOptions(compute_gap_us=50.0, ports="planned"))
    a, b, g = res.collectives
    assert b.start_emu_s == pytest.approx(a.start_emu_s + a.duration_emu_s, rel=1e-12)
    assert g.start_emu_s == pytest.approx(b.start_emu_s + b.duration_emu_s, rel=1e-12)
    assert b.duration_real_us == pytest.approx(2 * a.duration_real_us, rel=1e-9)  # twice the bytes, same rates
    # all-gather of S: n-1 steps of S/n at the host's 400 G
    assert g.duration_real_us == pytest.approx((n - 1) * 1_600_000 / n * 8 / (2 * NIC_BPS) * 1e6, rel=1e-9)
    (step,) = res.steps
    comm = a.duration_real_us + b.duration_real_us + g.duration_real_us
    assert step.step_us == pytest.approx(comm + 3 * 50.0, rel=1e-9)
    assert step.compute_us == pytest.approx(150.0)
    assert step.step_us == pytest.approx(step.compute_us + step.exposed_comm_us + step.idle_us, rel=1e-9)


def test_per_transfer_overhead_adds_once_per_ring_step():
    n, size, overhead_us = 16, 16 * 4 * 250_000, 3.0
    res = simulated(untimed([coll(size=size, n=n)]), "t", DP16, "adaptive", ReplayOptions(),
                          SimOptions(per_transfer_s=overhead_us / 1e6))
    step_us = (size / n) * 8 / (2 * NIC_BPS) * 1e6
    assert res.collectives[0].duration_real_us == pytest.approx(2 * (n - 1) * (step_us + overhead_us), rel=1e-9)


def test_a_failed_uplink_costs_a_non_blocking_leaf_nothing_and_is_reported():
    # leafA0's uplink to spineA0 fails before the collective; leafA0 still has a 400 G uplink, and
    # the ring sends one host's plane-A share (2 flows, 200 G) across it: the time is unchanged.
    n, size = 16, 16 * 4 * 250_000
    w = untimed([coll(size=size, n=n)])
    base = simulated(w, "t", DP16, "adaptive", ReplayOptions())
    port = DP16.port_towards("leafA0", "spineA0")
    down = parse_link_event(f"leafA0:{port}@0", DP16, up=False)
    res = simulated(w, "t", DP16, "adaptive", ReplayOptions(), link_events=[down])
    assert res.collectives[0].duration_real_us == pytest.approx(base.collectives[0].duration_real_us, rel=1e-9)
    assert res.faults == ({"kind": "link", "target": f"leafA0:{port}", "up": False, "at_emu_s": 0.0},)
    assert res.events and all(e["trigger"] == f"leafA0:{port} down" for e in res.events)
    assert all(e["new_port"] != port for e in res.events if e["switch"] == "leafA0")
    used = {l.name: l.emu_bytes for l in res.links}
    assert used[f"leafA0:{port}->spineA0"] == 0


def test_a_host_cut_off_stalls_with_a_named_error():
    port = DP16.port_towards("leafA0", "h0")
    down = parse_link_event(f"leafA0:{port}@0", DP16, up=False)
    with pytest.raises(ReplayError, match="stalled.*no live path"):
        simulated(untimed([coll(size=160_000, n=16)]), "t", DP16, "adaptive", ReplayOptions(), link_events=[down])


@pytest.mark.parametrize("text, match", [
    ("leafA0:1", "expected SWITCH:PORT@MICROSECONDS"),
    ("leafA0@5", "expected SWITCH:PORT@MICROSECONDS"),
    ("nowhere:1@5", "no switch 'nowhere'"),
    ("leafA0:99@5", "no link on port 99"),
    ("leafA0:x@5", "port must be an integer"),
    ("leafA0:1@-3", "finite and >= 0"),
    ("leafA0:1@inf", "finite and >= 0"),
])
def test_bad_link_events_are_named(text, match):
    with pytest.raises(ReplayError, match=match):
        parse_link_event(text, DP16, up=False)


def test_a_job_waits_for_the_jobs_it_lists():
    # three jobs on the same two hosts: job 2 waits for 0 and 1; 1 starts at 0.5 s (after job 0 ends)
    fab = DP16
    one = TransferDag((Transfer(0, 1, 25_000_000),), (0, 1))  # 25 MB over 2 x 200 G: 0.5 ms
    place = Placement(("h0", "h1"))
    res = simulate(fab, EcmpPolicy(PathTable(fab)), [Job(one, place), Job(one, place, start_s=0.5),
                                                     Job(one, place, after=(0, 1))])
    d = 25_000_000 * 8 / (2 * NIC_BPS)
    assert list(res.job_start_s) == pytest.approx([0.0, 0.5, 0.5 + d])
    assert list(res.job_end_s) == pytest.approx([d, 0.5 + d, 0.5 + 2 * d])
    with pytest.raises(FlowSimError, match="may wait only for earlier jobs"):
        simulate(fab, EcmpPolicy(PathTable(fab)), [Job(one, place, after=(1,)), Job(one, place)])


def test_the_main_job_on_the_simulator_loads_the_pyramid_s_tor_uplinks(tmp_path: Path, capsys):
    # no TRACE: the GPT-3 175B slice (TP4 in each of 4 servers, PP2, DP2) on the server-wired 16-GPU fabrics.
    # pyramid-16-servers: a server's 4 GPUs under one ToR with 2 x 400G uplinks, so when its 4 pipeline
    # sends leave at once they share 800G: at most 200 Gbit/s each, half the NIC. dual-plane-16-servers:
    # each GPU's 2 x 200G into non-blocking leaves, nothing shared beyond its own NIC ports
    out = tmp_path / "main"
    assert main(["sim", "--out", str(out), "--json"]) == 0
    runs = {Path(r["dir"]).name: r["summary"] for r in json.loads(capsys.readouterr().out)["runs"]}
    assert list(runs) == ["dual-plane-16-servers-adaptive", "pyramid-16-servers-ecmp"]
    dual = load_result(out / "dual-plane-16-servers-adaptive")
    pyr = load_result(out / "pyramid-16-servers-ecmp")
    assert dual.meta.workload == "gpt3-175b-slice16" and dual.meta.ranks == 16

    def pp_busbw(r):
        pp = [c for c in r.collectives if c.stream == "pp"]
        return sum(c.size_bytes * 8 for c in pp) / sum(c.duration_real_us / 1e6 for c in pp)

    assert pp_busbw(pyr) <= 200e9 * 1.001
    assert pp_busbw(dual) > 1.5 * 200e9  # no such cap: its NIC (shared with the DP buckets at times) is the bound
    step = {n: min(s.step_us for s in load_result(out / n).steps if s.rank == -1) for n in runs}
    assert step["pyramid-16-servers-ecmp"] > 1.2 * step["dual-plane-16-servers-adaptive"]


def test_sim_cli_default_compares_the_two_fabrics_and_writes_reports(tmp_path: Path, capsys):
    out = tmp_path / "sim"
    assert main(["sim", "builtin", "--out", str(out), "--json"]) == 0  # the built-in recording, by name
    summary = json.loads(capsys.readouterr().out)
    assert [Path(r["dir"]).name for r in summary["runs"]] == ["dual-plane-16-adaptive", "pyramid-16-ecmp"]
    assert (out / "comparison.html").is_file()
    for name in ("dual-plane-16-adaptive", "pyramid-16-ecmp"):
        run = load_result(out / name)
        assert run.meta.backend == "flowsim" and (out / name / "report.html").is_file()
        assert len(run.collectives) == 12  # the built-in recording: 6 steps x 2 all-reduces
        for s in run.steps:
            assert s.step_us == pytest.approx(s.compute_us + s.exposed_comm_us + s.idle_us, rel=1e-6)
    html = (out / "dual-plane-16-adaptive" / "report.html").read_text()
    assert "Simulated (flowsim)" in html and "CPU-bound" not in html
    assert main(["report", str(out / "pyramid-16-ecmp")]) == 0  # re-rendered from result.json


def test_sim_cli_forwarding_is_chosen_and_named_in_the_report(tmp_path: Path, capsys):
    # the built-in recording's all-reduces are rings: 2(n-1) steps each waiting on the one before, so
    # cut-through lets each step begin as the one before begins and the collectives end no later (rings with
    # Simple's latencies: NCCL's choice would give LL's, which cut-through does not scale)
    runs = {}
    for fwd in ("store-and-forward", "cut-through"):
        out = tmp_path / fwd
        assert main(["sim", "builtin", "--topology", "pyramid-16", "--routing", "ecmp", "--forwarding", fwd, "--out", str(out),
                     "--json", "--algorithm", "ring"]) == 0
        (summary,) = json.loads(capsys.readouterr().out)["runs"]
        runs[fwd] = load_result(Path(summary["dir"]))
    notes = {fwd: " ".join(r.meta.notes) for fwd, r in runs.items()}
    assert "store and forward:" in notes["store-and-forward"] and "cut-through, as the emulation replay" in notes[
        "cut-through"]
    sf, ct = ([c.duration_real_us for c in runs[f].collectives] for f in ("store-and-forward", "cut-through"))
    assert len(sf) == len(ct) == 12 and all(c <= s * (1 + 1e-9) for s, c in zip(sf, ct))


@pytest.mark.parametrize("args, match", [
    (["--topology", "no-such-fabric"], "no-such-fabric"),
    (["--topology", "dual-plane-16", "--link-down", "leafA0:99@5"], "no link on port 99"),
    (["--topology", "dual-plane-16", "--per-hop-us", "-1"], "must be >= 0"),
    (["--topology", "dual-plane-16", "--routing", "nonsense"], "nonsense"),
])
def test_sim_cli_bad_input_exits_2_with_a_named_error(tmp_path: Path, capsys, args, match):
    assert main(["sim", "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert "fabriclab: error:" in err and match in err
    assert not (tmp_path / "o").exists()  # nothing written for a run that could not start


@pytest.mark.parametrize("env, advised", [(None, False), ("1", True)])
def test_sim_cli_turns_numpys_huge_page_advice_off_unless_the_environment_sets_it(tmp_path: Path, env, advised):
    # numpy reads NUMPY_MADVISE_HUGEPAGE once, at its import (here, before the CLI runs): what the
    # process does afterwards is the CLI's choice, and the variable is left for processes it starts
    import os
    import subprocess
    import sys

    code = ("import numpy, os; from fabriclab.cli import main; "
            f"assert main(['sim', '--topology', 'pyramid-16', '--routing', 'ecmp', '--out', {str(tmp_path / 'o')!r},"
            " '--json']) == 0; core = getattr(numpy, '_core', None) or numpy.core; "
            "print('ADVICE', core.multiarray._get_madvise_hugepage(), os.environ['NUMPY_MADVISE_HUGEPAGE'])")
    child_env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if env is not None:
        child_env["NUMPY_MADVISE_HUGEPAGE"] = env
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env,
                         cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("ADVICE"))
    assert line == f"ADVICE {advised} {env or '0'}"
