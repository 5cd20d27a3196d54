"""Rings as NCCL maps them on servers of several GPUs (issue 43, part 1): one ring per NIC, each entering and leaving
a server through the same NIC (rail), the server's GPUs chained over NVLink. Every expected value is worked by hand.
"""
from __future__ import annotations

import numpy as np
import pytest

from fabric import topofile
from tests.conftest import simulated
from traffic.collectives import nic_rings, schedule_columns, server_blocks
from traffic.replay import ReplayOptions
from traffic.workload import Collective, RankTrace, Step, Workload

GIB = 1 << 30


def test_the_rings_of_four_gpus_on_three_servers_by_hand() -> None:
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # ring j enters each server at its j-th GPU and chains the others in order
    assert nic_rings(blocks) == [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
                                 [1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8],
                                 [2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9],
                                 [3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10]]
    servers = [tuple(b) for b in blocks]
    # a reduce-scatter of 48,000 bytes: 4 rings of 12,000, chunks of 1,000 over 12 positions, 11 steps each; a
    # step is 12 sends plus one NVLink hop per server exit (the last GPU to the entry GPU, whose NIC sends)
    d = schedule_columns("reduce_scatter", 48_000, range(12), "ring", servers=servers)
    assert len(d) == 4 * 11 * (12 + 3)
    # ring 1's first step, written out: 1 -> 2 -> 3 -> 0, 0 -> 1 (to NIC 1's GPU), 1 -> 5 across; the same in the
    # second server (4 -> 5, 5 -> 9) and the third (8 -> 9, 9 -> 1)
    first = 11 * 15  # after ring 0's 11 steps
    got = list(zip(d.src[first:first + 15].tolist(), d.dst[first:first + 15].tolist()))
    assert got == [(1, 2), (2, 3), (3, 0), (0, 1), (1, 5), (5, 6), (6, 7), (7, 4), (4, 5), (5, 9), (9, 10),
                   (10, 11), (11, 8), (8, 9), (9, 1)]
    assert set(d.size_bytes.tolist()) == {1000}
    # the network transfer waits for the NVLink hop before it (a first step: no receive to wait for)
    ptr = d.dep_ptr
    deps_of = {i: d.dep[ptr[i]:ptr[i + 1]].tolist() for i in range(first, first + 15)}
    assert deps_of[first + 4] == [first + 3]  # 1 -> 5 after 0 -> 1
    # across servers only GPU j to GPU j: the same rail
    across = (d.src // 4) != (d.dst // 4)
    assert np.array_equal(d.src[across] % 4, d.dst[across] % 4)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_each_nic_carries_its_share_and_no_rail_another_s(k: int) -> None:
    # 4 servers of 8 GPUs; the group has its first k GPUs in each. A ring all-reduce of S over n = 4k ranks: with
    # k > 1, k rings of S/k; each ring's 2(n - 1) steps send one chunk of S/(k n) out of every server through that
    # ring's NIC: each NIC sends 2(n - 1) x S/(k n), the server 2(n - 1)/n x S as one ring through one NIC does
    servers = [tuple(range(8 * s, 8 * s + 8)) for s in range(4)]
    group = [8 * s + i for s in range(4) for i in range(k)]
    size = GIB
    d = schedule_columns("all_reduce", size, group, "ring", servers=servers)
    across = (d.src // 8) != (d.dst // 8)
    sent: dict[int, int] = {}
    for src, b in zip(d.src[across].tolist(), d.size_bytes[across].tolist()):
        sent[src] = sent.get(src, 0) + b
    n = 4 * k
    assert sorted(sent) == group  # every GPU of the group sends through its own NIC
    assert set(sent.values()) == {2 * (n - 1) * size // (k * n)}
    assert np.array_equal(d.src[across] % 8, d.dst[across] % 8)  # rail j to rail j


def test_one_ring_where_nccl_needs_no_more() -> None:
    servers = [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert server_blocks([0, 4], servers) is None  # one GPU a server
    assert server_blocks([0, 1, 2, 3], servers) is None  # one server
    assert server_blocks([0, 1, 4], servers) is None  # uneven
    assert server_blocks([0, 1, 4, 5], None) is None  # no servers known
    assert server_blocks([4, 5, 0, 1], servers) == [[4, 5], [0, 1]]  # in the group's order, never re-sorted


@pytest.mark.parametrize("k", [1, 2, 4])
def test_ring_time_on_the_rail_fabric(k: int) -> None:
    # dual-plane-16-rail: 4 servers of 4 GPUs, each GPU's NIC 2 x 200G (one port per plane). A 1 GiB all-reduce
    # over the first k GPUs of each server (n = 4k): every step's slowest transfer is a chunk c = S/(k n) through a
    # NIC, c x 8 / 400 Gbit/s; 2(n - 1) of them, so 2(n - 1)/n x S / (k x NIC), plus (k > 1) the first server
    # exit's NVLink hop to the NIC's GPU, c x 8 / 3600 Gbit/s (the later ones run under the network step before).
    # The simulator's default costs no per-transfer latency here.
    fabric = topofile.load("dual-plane-16-rail")
    group = tuple(4 * s + i for s in range(4) for i in range(k))
    c = Collective("all_reduce", GIB, "bfloat16", group, "dp")
    w = Workload("t", "t", "kineto", 16, tuple(RankTrace(r, (Step(0, None, (), (c,)),)) for r in group), False)
    res = simulated(w, "t", fabric, "adaptive", ReplayOptions(ports="planned"))
    n = 4 * k
    chunk = GIB / (k * n)
    expected_us = (2 * (n - 1) * chunk * 8 / 400e9 + (chunk * 8 / 3600e9 if k > 1 else 0.0)) * 1e6
    if k == 1:
        assert res.collectives[0].duration_real_us == pytest.approx(expected_us, rel=1e-9)
    else:
        # a connection's steps are not ordered one after another (several steps in flight, as NCCL_STEPS), so
        # two steps of a NIC can share it (fair sharing, where the NIC would send them in order): at most 3% later
        assert expected_us * (1 - 1e-9) <= res.collectives[0].duration_real_us <= 1.03 * expected_us
    # busbw: S x 2(n - 1)/n over that time: near k x 400 Gbit/s
    assert res.collectives[0].busbw_bps == pytest.approx(k * 400e9, rel=0.01 if k == 1 else 0.031)


@pytest.mark.parametrize("nvlink_us", [0.0, 3.4])
@pytest.mark.parametrize("servers, k", [(1, 8), (3, 4), (4, 2), (4, 4), (16, 8)])
def test_ring_latency_is_paid_where_the_ring_leaves_a_server(servers: int, k: int, nvlink_us: float) -> None:
    # 8 KiB over k GPUs of each server, a = 10 us a network transfer, L a transfer over NVLink. A chunk on the
    # ring's data path takes one NVLink hop a step (to the next GPU, or at a server's exit to the GPU of the ring's
    # NIC, PXN), and at each exit the network: each pass (kN - 1 steps) pays L kN - 1 times and the network N times,
    # not kN - 1 times (the steps of one connection overlap, as in NCCL): 2N a + 2(kN - 1) L, plus the bytes' time
    # (8 KiB / kN at 400G and 3.6T: ~0.1 us). NCCL's own count (tuning.cc:412) is 2(N - 1) network steps and
    # 2(kN - 1) - 2(N - 1) NVLink ones: the relay hops are ours.
    fabric = topofile.load("dual-plane-1024-rail")
    group = tuple(8 * s + i for s in range(servers) for i in range(k))
    c = Collective("all_reduce", 8 << 10, "bfloat16", group, "dp")
    w = Workload("t", "t", "kineto", 8 * servers, tuple(RankTrace(r, (Step(0, None, (), (c,)),)) for r in group),
                 False)
    from fabric.flowsim import SimOptions
    res = simulated(w, "t", fabric, "adaptive", ReplayOptions(ports="planned"),
                    sim=SimOptions(per_transfer_s=10e-6, nvlink_latency_s=nvlink_us * 1e-6))
    n = k * servers
    hand_us = (2 * servers * 10.0 if servers > 1 else 0.0) + 2 * (n - 1) * nvlink_us
    # (the longest path may end on a network hop rather than an NVLink one: one L fewer, as at k = 2)
    assert hand_us - nvlink_us - 0.2 <= res.collectives[0].duration_real_us <= hand_us * 1.01 + 0.2


# --- all-to-all as one group, PXN ----------------------------------------------------------------------------------

def _a2a(group: tuple[int, ...], size: int, world: int) -> Workload:
    c = Collective("all_to_all", size, "bfloat16", group, "ep")
    return Workload("t", "t", "kineto", world, tuple(RankTrace(r, (Step(0, None, (), (c,)),)) for r in group), False)


def test_all_to_all_of_16_ranks_on_4_servers_at_the_nic_bound() -> None:
    # TP2 on servers of 8: the group is GPUs 0, 2, 4, 6 of 4 servers. 96 MiB each: a piece of 6 MiB to each of 16
    # ranks; 12 pieces (72 MiB) leave a server per GPU, through 400 Gbit/s NICs: at least 72 MiB x 8 / 400 Gbit/s =
    # 1,509.95 us, busbw (n - 1)/n x S / t = 500 Gbit/s. Posted as one group, network rounds are permutations (one
    # flow out of and into each NIC), 3 in flight: the bound exactly without per-transfer latency.
    fabric = topofile.load("dual-plane-1024-rail")
    group = tuple(8 * s + i for s in range(4) for i in range(0, 8, 2))
    size = 96 << 20
    bound_us = 72 * (1 << 20) * 8 / 400e9 * 1e6
    res = simulated(_a2a(group, size, 32), "t", fabric, "adaptive", ReplayOptions(ports="planned"))
    assert res.collectives[0].duration_real_us == pytest.approx(bound_us, rel=1e-9)
    assert res.collectives[0].busbw_bps == pytest.approx(500e9, rel=1e-9)
    # with `fabriclab sim`'s latencies (11.4 us a transfer, 0.65 a hop): within 10% of the bound (was 248 Gbit/s)
    from fabric.flowsim import SimOptions
    slow = simulated(_a2a(group, size, 32), "t", fabric, "adaptive", ReplayOptions(ports="planned"),
                     sim=SimOptions(per_transfer_s=11.4e-6, per_hop_s=0.65e-6))
    assert slow.collectives[0].busbw_bps >= 0.9 * 500e9


@pytest.mark.parametrize("pxn", [True, False])
def test_pxn_keeps_all_to_all_bytes_under_the_rail_switch(pxn: bool) -> None:
    # pyramid-16-rail: 4 servers of 4 GPUs, ToR j holds GPU j of every server, ToRs 2:1 to the aggregation. An
    # all-to-all of S over all 16 GPUs: a piece of S/16 to each. With PXN a piece for another server leaves through
    # the NIC of the peer's rail (after an NVLink hop): nothing goes above a ToR. Without it, the pieces for another
    # server and another rail go up: 16 senders x 3 servers x 3 rails x S/16 = 9 S out of the ToRs.
    fabric = topofile.load("pyramid-16-rail")
    size = 16 * 1_000_000
    res = simulated(_a2a(tuple(range(16)), size, 16), "t", fabric, "ecmp", ReplayOptions(pxn=pxn))
    up = sum(link.emu_bytes for link in res.links if link.tier == "fabric" and link.switch.startswith("tor"))
    assert up == (0 if pxn else 9 * size)


def test_a_grouped_all_to_all_of_more_ranks_than_the_exact_model_s_runs_exactly() -> None:
    # 32 GPUs, 2 on each of 16 servers (TP4's EP): above A2A_EXACT_MAX ranks the pairwise all-to-all is sampled in
    # lockstep, but a group of sends (network and NVLink rounds, not alike) is simulated exactly: it ends, at no
    # less than its bytes through each NIC, 30 pieces of S/32 out of 32 at 400 Gbit/s
    from traffic.replay.simulate import A2A_EXACT_MAX
    fabric = topofile.load("dual-plane-1024-rail")
    group = tuple(8 * s + i for s in range(16) for i in range(2))
    assert len(group) > A2A_EXACT_MAX
    size = 32 << 20
    res = simulated(_a2a(group, size, 128), "t", fabric, "adaptive", ReplayOptions(ports="planned"))
    c = res.collectives[0]
    assert c.algorithm == "grouped"
    bound_us = size * 30 / 32 * 8 / 400e9 * 1e6
    assert bound_us <= c.duration_real_us <= 1.5 * bound_us
