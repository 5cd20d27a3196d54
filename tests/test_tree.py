"""NCCL's tree all-reduce as steady-state flows (issue 43 part 3): its time by hand, and its large-message busbw
at 0.9 x the per-server NIC bandwidth or more on 16 and 128 servers."""
from __future__ import annotations

import pytest

from fabric import topofile
from fabric.flowsim import SimOptions
from tests.conftest import simulated
from traffic.replay import ReplayOptions
from traffic.workload import Collective, RankTrace, Step, Workload

MIB = 1 << 20
NIC_BPS = 400e9  # dual-plane-1024-rail: 2 x 200G ports a GPU


def _all_reduce(group: tuple[int, ...], size: int, world: int) -> Workload:
    c = Collective("all_reduce", size, "bfloat16", group, "dp")
    return Workload("t", "t", "kineto", world, tuple(RankTrace(r, (Step(0, None, (), (c,)),)) for r in group), False)


@pytest.mark.parametrize("servers, k", [(16, 1), (16, 8), (128, 1), (128, 8)])
def test_tree_busbw_on_the_rail_fabric(servers: int, k: int) -> None:
    # dual-plane-1024-rail: servers of 8 GPUs, 400 Gbit/s a GPU. A 256 MiB all-reduce over the first k GPUs of each
    # of `servers` servers, as NCCL's tree: per NIC two trees over the servers, each with S/(2k). A server inner in
    # tree A (two children) sends its part up once and down twice, and in tree B (a leaf) up once: 4 parts of
    # S/(2k) out of its NIC j, 2S/k, and as many in. Bandwidth only, every flow of a NIC at NIC/4 for the whole
    # time: T = 2S / (k x NIC) exactly (NVLink hops, 3.6 Tbit/s, run alongside).
    fabric = topofile.load("dual-plane-1024-rail")
    size = 256 * MIB
    group = tuple(8 * s + i for s in range(servers) for i in range(k))
    n = len(group)
    res = simulated(_all_reduce(group, size, 8 * servers), "t", fabric, "adaptive",
                    ReplayOptions(ports="planned", algorithm="tree"), sim=SimOptions())
    expected_us = 2 * size * 8 / (k * NIC_BPS) * 1e6
    assert res.collectives[0].duration_real_us == pytest.approx(expected_us, rel=1e-9)
    # with `fabriclab sim`'s latencies (11.4 us a transfer, 0.65 a hop, 3.4 an NVLink transfer): the fill and drain
    # cost 2 x (depth network steps of ~14 us + k - 1 NVLink ones), and busbw = S/T x 2(n-1)/n stays at 0.9 x the
    # server's NIC bandwidth (k x 400G) or more
    slow = simulated(_all_reduce(group, size, 8 * servers), "t", fabric, "adaptive",
                     ReplayOptions(ports="planned", algorithm="tree"),
                     sim=SimOptions(per_transfer_s=11.4e-6, per_hop_s=0.65e-6, nvlink_latency_s=3.4e-6))
    busbw = size * 8 / (slow.collectives[0].duration_real_us * 1e-6) * 2 * (n - 1) / n
    assert slow.collectives[0].busbw_bps == pytest.approx(busbw, rel=1e-9)
    assert busbw >= 0.9 * k * NIC_BPS
    assert slow.collectives[0].duration_real_us > expected_us  # the latency is there
