"""The simulator's default latency (`fabric.latency`): the alpha-beta curve of a ring all-reduce against
values worked out by hand, and the CLI's defaults carried into the simulator and stated in the reports.

The hand model (Hockney's alpha-beta, as NCCL's tuning model composes a ring): a ring all-reduce of S
bytes over n ranks is 2(n-1) steps one after another; a step moves S/n bytes over the sender's NIC at
B (D = S/n x 8 / B) and is delivered a + h x k later (a: per transfer, h: per link, k: links of the
path). Each host's step waits for its own previous step and its predecessor's, so the ring runs at the
pace of its slowest edge (the largest k; tests/test_flowsim.py works that chain out):
T = 2(n-1) (D + a + h k_max), and busbw = S x 8 x 2(n-1)/n / T (nccl-tests' factor for all-reduce)."""
from __future__ import annotations

import json

import pytest

from fabric import topofile
from fabric.flowsim import Job, SimOptions
from fabric.latency import (DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US, LEAF_SPINE_PATH_LINKS,
                            NCCL_NET_RING_STEP_US)
from tests.conftest import one_rank_per_host, run
from traffic.collectives import schedule

A_S, H_S = DEFAULT_PER_TRANSFER_US / 1e6, DEFAULT_PER_HOP_US / 1e6
SIZES = [2**10, 2**16, 2**20, 2**24, 2**28]  # 1 KiB .. 256 MiB


def hand_ring_s(n: int, size: int, nic_bps: float, links: int) -> float:
    return 2 * (n - 1) * (size / n * 8 / nic_bps + A_S + H_S * links)


def busbw_bps(n: int, size: int, seconds: float) -> float:
    return size * 8 * 2 * (n - 1) / n / seconds


def test_defaults_put_nccl_s_network_step_on_a_leaf_spine_path():
    # stated in fabric/latency.py and the CLI help: 4 links of a leaf-spine path cost one NCCL network step
    assert DEFAULT_PER_TRANSFER_US + LEAF_SPINE_PATH_LINKS * DEFAULT_PER_HOP_US == pytest.approx(NCCL_NET_RING_STEP_US)
    assert 0 < DEFAULT_PER_HOP_US < 2 and DEFAULT_PER_TRANSFER_US > 0


@pytest.mark.parametrize("topo, n, links", [
    # leaf-spine-16, 8 ranks on h0..h7: two leaves of 4; the slowest edges (h3->h4, h7->h0) cross a spine:
    # host-leaf-spine-leaf-host, 4 links
    ("leaf-spine-16", 8, 4),
    # pyramid-16, 16 ranks: 4 ToRs of 4 hosts in 2 pods of 2 ToRs; h7->h8 and h15->h0 cross pods through a
    # core: host-tor-agg-core-agg-tor-host, 6 links
    ("pyramid-16", 16, 6),
])
def test_ring_all_reduce_follows_the_alpha_beta_curve(topo, n, links):
    fab = topofile.load(topo)
    opts = SimOptions(per_transfer_s=A_S, per_hop_s=H_S)
    got = []
    for size in SIZES:
        dag = schedule("all_reduce", size, list(range(n)), "ring")
        _, res = run(topo, [Job(dag, one_rank_per_host(fab, n))], options=opts)
        expected = hand_ring_s(n, size, 400e9, links)  # both fabrics: one 400 G NIC per host
        assert res.job_time_s[0] == pytest.approx(expected, rel=1e-6), size
        got.append(busbw_bps(n, size, res.job_time_s[0]))
    # the curve: latency-bound at 1 KiB (under 1% of the NIC), bandwidth-bound (over 90% of it) at 256 MiB
    assert got[0] < 0.01 * 400e9 and got[-1] > 0.9 * 400e9
    assert got == sorted(got)


def test_a_1_mib_ring_over_1024_ranks_is_latency_bound_by_default():
    # 2 x 1023 steps of 1 KiB: D = 1024 x 8 / 400 G = 0.02 us against a + 4h = 14 us a step, so the
    # 1 MiB all-reduce takes ~29 ms and its busbw is ~0.15% of the NIC's 400 G (the simulator without
    # latency gave 100% of it). dual-plane-1024: 32 hosts per leaf, the ring crosses leaves (4 links).
    fab = topofile.load("dual-plane-1024")
    n, size = 1024, 2**20
    dag = schedule("all_reduce", size, list(range(n)), "ring")
    _, res = run("dual-plane-1024", [Job(dag, one_rank_per_host(fab, n))],
                 options=SimOptions(per_transfer_s=A_S, per_hop_s=H_S, lockstep=True, transfer_times=False))
    expected = hand_ring_s(n, size, 2 * 200e9, 4)
    assert res.job_time_s[0] == pytest.approx(expected, rel=1e-6)
    assert busbw_bps(n, size, res.job_time_s[0]) < 0.002 * 400e9


def test_the_resolution_is_exact_for_traces_and_coarse_for_generated_llm_steps_unless_given():
    from fabriclab.cli import build_parser
    from fabriclab.commands import _sim_model

    def res_us(argv, llm):
        return _sim_model(build_parser().parse_args(argv)).options(llm).resolution_s * 1e6

    for command in ("sim", "compare"):
        assert res_us([command], llm=False) == pytest.approx(0.001)  # 1 ns: exact to the model
        assert res_us([command], llm=True) == pytest.approx(5.0)  # MB-sized transfers: 5 us
        assert res_us([command, "--resolution-us", "0.5"], llm=True) == pytest.approx(0.5)  # asked: kept
        assert res_us([command, "--resolution-us", "2"], llm=False) == pytest.approx(2.0)


def test_sim_and_compare_default_to_the_stated_latency_and_say_so(tmp_path):
    from fabriclab.cli import build_parser, main
    from fabriclab.commands import _sim_model

    for command in ("sim", "compare"):
        opts = _sim_model(build_parser().parse_args([command])).options(False)
        assert (opts.per_transfer_s, opts.per_hop_s) == (A_S, H_S)
    zero = _sim_model(build_parser().parse_args(["sim", "--per-transfer-us", "0", "--per-hop-us", "0"])).options(False)
    assert (zero.per_transfer_s, zero.per_hop_s) == (0.0, 0.0)
    out = tmp_path / "sim"
    assert main(["sim", "builtin", "--topology", "dual-plane-16", "--out", str(out), "--json"]) == 0
    notes = " ".join(json.loads((out / "result.json").read_text())["meta"]["notes"])
    assert f"{DEFAULT_PER_TRANSFER_US:g} us per transfer, {DEFAULT_PER_HOP_US:g} us per hop" in notes
