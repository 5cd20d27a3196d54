"""NCCL's algorithm for a workload's collectives (issue 43 part 4): the tuning inputs a group gives, worked by hand,
and the plan running the choice, its protocol's bytes and latency, and NCCL_ALGO's override."""
from __future__ import annotations

import math

import pytest

from fabric import topofile
from fabric.flowsim import SimOptions
from tests.conftest import simulated
from traffic.nccl_choice import group_table, nccl_choice
from traffic.replay import ReplayOptions
from traffic.replay.simulate import plan_for_simulation
from traffic.workload import Collective, RankTrace, Step, Workload

MIB = 1 << 20


def test_the_inputs_of_16_servers_of_8_gpus_by_hand() -> None:
    # 128 GPUs on 16 servers, 400G NICs, 2 channels a NIC: nChannels 16 at 25 GB/s. Ring all-reduce, Simple:
    # latency 8.4 + (nsteps - nInter) x max(3.4, 1 x 3) + nInter x 14 with nsteps 254, nInter 2 x 15 = 30:
    # 8.4 + 224 x 3.4 + 420 = 1,190.0 us; bandwidth 16 x 25 = 400 GB/s bus, x 128/254 algorithm = 201.57 GB/s
    table = group_table(128, 16, 400.0, 3600.0, 2)
    e = table.entries[("all_reduce", "ring", "Simple")]
    assert e.latency_us == pytest.approx(8.4 + 224 * 3.4 + 30 * 14.0)
    assert e.bw_GBps == pytest.approx(400 * 128 / 254)
    # the tree, Simple: 8.4 + 2 x ((8 - 1) x 4.0 + log2(16) x 14) = 176.4 us; bandwidth min(400 x 0.92, 16 x 36.0) =
    # 368 GB/s bus, x 0.5 = 184 GB/s
    t = table.entries[("all_reduce", "tree", "Simple")]
    assert t.latency_us == pytest.approx(8.4 + 2 * (7 * 4.0 + 4 * 14.0))
    assert t.bw_GBps == pytest.approx(368 * 0.5)


@pytest.mark.parametrize("size, nodes, want", [(4096 * MIB, 16, "ring"), (16 * MIB, 16, "tree"),
                                                (700 * MIB, 256, "tree")])
def test_ring_or_tree_at_three_points_worked_by_hand(size: int, nodes: int, want: str) -> None:
    # one GPU a server (a TP8 job's DP), Simple against Simple (LL/LL128 lose at these sizes), from the table's
    # latencies and bandwidths by hand: ring = 1.4 x lat_r + S / bw_r (plateau), tree = lat_t + S / (bw_t x corr)
    # 16 nodes: ring lat 8.4 + 30 x 14 = 428.4, bw 50 x 16/30 = 26.67; tree lat 8.4 + 2 x 4 x 14 = 120.4,
    # bw 0.5 x min(46, 2 x 36) = 23 GB/s. 4 GiB: ring 1.4 x 428.4 + 4295e6 / 26,667 = 161,660 us, tree (no
    # correction at 2^26 x 64 B and above 2^22) 120.4 + 4295e6 / 23,000 = 186,860: the ring.
    # 16 MiB: ring 599.8 + 629 = 1,229; tree (Simple's correction .7 at 2^18 x 64 B) 120.4 + 16.78e6 / 16,100 =
    # 1,162: the tree. 256 nodes, 700 MiB (2^23.5 x 64 B: no correction): ring lat 8.4 + 510 x 14 = 7,148 (x 1.4 =
    # 10,008), bw 50 x 256/510 = 25.1: 39,250 us; tree 8.4 + 2 x 8 x 14 = 232.4 + 734e6 / 23,000 = 32,150: the tree.
    assert nccl_choice("all_reduce", size, nodes, nodes, 400.0, 3600.0, 2).algo == want
    assert nccl_choice("all_reduce", size, nodes, nodes, 400.0, 3600.0, 2, asked="ring").algo == "ring"


def test_one_server_or_an_uneven_group_runs_the_ring_and_pat_only_at_one_gpu_a_server() -> None:
    assert nccl_choice("all_reduce", MIB, 8, 1, 400.0, 3600.0, 2).why == "one server: the ring"
    assert nccl_choice("all_reduce", MIB, 12, 8, 400.0, 3600.0, 2).algo == "ring"  # 12 ranks on 8 servers
    assert nccl_choice("all_gather", MIB, 128, 128, 400.0, 3600.0, 2, asked="pat").algo == "pat"
    fallback = nccl_choice("all_gather", MIB, 128, 16, 400.0, 3600.0, 2, asked="pat")
    assert fallback.algo == "ring" and "does not run all_gather" in fallback.why


def _one(kind: str, size: int, group: tuple[int, ...], world: int) -> Workload:
    c = Collective(kind, size, "bfloat16", group, "dp")
    return Workload("t", "t", "kineto", world, tuple(RankTrace(r, (Step(0, None, (), (c,)),)) for r in group), False)


def test_the_plan_runs_nccl_s_choice_with_its_protocol_and_nccl_algo_overrides_it() -> None:
    # 16 MiB over 16 servers of 8 GPUs (dual-plane-1024-rail's first 128 GPUs): NCCL picks the tree with LL128
    # (its latency 14 + 2 x (7 x 1.25 + 4 x 8.5) = 99.5 us against the ring's 1,666): the DAG moves S / 0.92
    fabric = topofile.load("dual-plane-1024-rail")
    w = _one("all_reduce", 16 * MIB, tuple(range(128)), 128)
    plan = plan_for_simulation(w, fabric, ReplayOptions(algorithm="nccl"))
    tpl = plan.templates[0]
    assert (tpl.algorithm, tpl.proto) == ("tree", "LL128")
    parts = 2 * 8  # per NIC two trees: each edge's flows carry ceil(S/0.92) / 16 bytes
    assert int(tpl.dag.size_bytes.max()) == math.ceil(math.ceil(16 * MIB / 0.92) / parts)
    assert any("all_reduce tree/LL128 x1" in n for n in plan.notes)
    forced = plan_for_simulation(w, fabric, ReplayOptions(algorithm="nccl", nccl_algo="ring"))
    assert (forced.templates[0].algorithm, forced.templates[0].proto) == ("ring", "LL128")
    # simulated: LL128's latencies (NET 8.5 of 14, NVLink 1.25 of 4.0 for the tree) make it faster than the same
    # tree timed with Simple's, and the bytes / 0.92 slower than Simple's bytes without latency
    sim = SimOptions(per_transfer_s=11.4e-6, per_hop_s=0.65e-6, nvlink_latency_s=3.4e-6)
    chosen = simulated(w, "t", fabric, "adaptive", ReplayOptions(algorithm="nccl"), sim=sim).collectives[0]
    simple = simulated(w, "t", fabric, "adaptive", ReplayOptions(algorithm="tree"), sim=sim).collectives[0]
    assert chosen.duration_real_us < simple.duration_real_us
    bw_only = simulated(w, "t", fabric, "adaptive", ReplayOptions(algorithm="tree")).collectives[0]
    assert chosen.duration_real_us > bw_only.duration_real_us / 0.92


def test_channels_per_nic_and_nccl_algo_are_options_of_every_run() -> None:
    from fabriclab.cli import build_parser
    from fabriclab.options import run_options

    args = build_parser().parse_args(["sim", "builtin", "--channels-per-nic", "4", "--nccl-algo", "tree"])
    opts = run_options(args)
    assert (opts.channels, opts.nccl_algo, opts.algorithm) == (4, "tree", "nccl")
    assert opts.replay_options("ecmp").nccl_algo == "tree"
