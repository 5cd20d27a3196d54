"""In-server transfers (servers of 4 GPUs on dual-plane-16): never on the fabric, timed at the NVLink rate.

Hand values: a ring all-reduce of S bytes over n GPUs is 2(n - 1) steps of S/n bytes, each step waiting
for the one before, so at B bit/s it takes 2(n - 1) x (S/n) x 8 / B seconds; a count-c collective is
c of them back to back."""
from __future__ import annotations

import dataclasses

import pytest

from fabric import builders
from fabric.flowsim import Job, SimOptions, simulate
from fabric.routing import EcmpPolicy, PathTable
from fabric.transfers import Placement, Transfer, TransferDag
from tests.conftest import simulated
from traffic.replay import ReplayOptions
from traffic.replay.plan import plan_replay
from traffic.replay.simulate import plan_for_simulation
from traffic.workload import Collective, RankTrace, Step, Workload

NVLINK_GBPS = 3600.0
NVLINK_BPS = NVLINK_GBPS * 1e9
G = 4


def servers_fabric():
    return dataclasses.replace(builders.dual_plane(hosts=16, hosts_per_leaf=4), gpus_per_server=G,
                               nvlink_gbps=NVLINK_GBPS)


def one_step(*colls: Collective, n: int = 16) -> Workload:
    """16 ranks, one timed step; each rank has the collectives whose group it is in."""
    ranks = []
    for r in range(n):
        mine = tuple(c for c in colls if r in c.group_ranks)
        ranks.append(RankTrace(r, (Step(0, 10_000.0, ((0.0, 100.0),), mine),)))
    return Workload("servers", "servers", "kineto", n, tuple(ranks), True)


def coll(kind, size, ranks, *, count=1, stream="0", start=200.0, dur=500.0):
    return Collective(kind, size, "float32", tuple(ranks), stream, start, dur, count=count)


def ring_s(size, n, bps=NVLINK_BPS):
    return 2 * (n - 1) * (size / n) * 8 / bps


def host_bytes(result, host=None):
    """Bytes the switches delivered to hosts (to `host` only, if given)."""
    return sum(l.emu_bytes for l in result.links if l.tier == "host" and (host is None or l.peer == host))


def run(w):
    return simulated(w, "servers", servers_fabric(), "ecmp", ReplayOptions())


def test_local_tp_all_reduce_counted_once_at_the_nvlink_rate():
    size = 4_000_000
    w = one_step(coll("all_reduce", size, range(4), count=12))
    plan = plan_for_simulation(w, servers_fabric(), ReplayOptions())
    (tpl,) = plan.templates
    # 2 x 3 steps of 1 MB at 3600 Gbit/s: 6 x 8e6 / 3.6e12 s = 13.33 us
    assert tpl.local_us == pytest.approx(6 * 1_000_000 * 8 / 3.6e12 * 1e6)
    assert len(plan.calls) == 1 and plan.calls[0].count == 12
    assert len(plan.connections.pair_key) == 0  # no connection for in-server pairs
    res = run(w)
    (c,) = res.collectives
    assert c.duration_real_us == pytest.approx(12 * ring_s(size, 4) * 1e6, rel=1e-9)
    assert c.size_bytes == 12 * size
    # busbw = S x 2(n-1)/n x 8 / ring time = the NVLink rate (one collective's bytes over its time)
    assert c.busbw_bps == pytest.approx(NVLINK_BPS, rel=1e-9)
    assert sum(l.emu_bytes for l in res.links) == 0


def test_send_recv_between_servers_crosses_the_fabric():
    w = one_step(coll("send_recv", 1_000_000, (0, 4)))
    plan = plan_for_simulation(w, servers_fabric(), ReplayOptions())
    assert plan.templates[0].local_us is None
    res = run(w)
    assert host_bytes(res) == 1_000_000 and host_bytes(res, "h4") == 1_000_000


def test_send_recv_in_one_server_is_local():
    w = one_step(coll("send_recv", 1_000_000, (1, 2)))
    res = run(w)
    assert host_bytes(res) == 0
    assert res.collectives[0].duration_real_us == pytest.approx(1_000_000 * 8 / NVLINK_BPS * 1e6)


def test_counted_collective_across_the_fabric_is_replayed_count_times():
    w = one_step(coll("send_recv", 1_000_000, (0, 4), count=3))
    plan = plan_for_simulation(w, servers_fabric(), ReplayOptions())
    assert [c.deps for c in plan.calls] == [(), (0,), (1,)]
    res = run(w)
    assert len(res.collectives) == 3 and host_bytes(res, "h4") == 3 * 1_000_000
    # the step composes the three calls' durations as the one recorded collective's
    assert res.steps[0].step_us >= sum(c.duration_real_us for c in res.collectives)


def test_ring_over_two_servers_only_cross_server_bytes_on_the_fabric():
    size = 8_000_000  # 8 ranks, 4 on each of 2 servers: one ring per NIC (NCCL's rings), 4 rings of 2 MB
    w = one_step(coll("all_reduce", size, range(8)))
    res = run(w)
    # ring j: server 0's GPUs j, j+1, ..., j-1, then server 1's the same, leaving each server through NIC j
    # (j -> 4 + j and 4 + j -> j): 14 ring steps of 2 MB / 8 = 250 kB chunks, two of each step's 8 transfers
    # across: every host's NIC carries its own ring, 14 x 250 kB, and the fabric 4 x 14 x 2 x 250 kB = 28 MB (as
    # the single ring's 14 x 2 x 1 MB through two NICs)
    assert host_bytes(res) == 4 * 14 * 2 * 250_000
    for h in ("h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7"):
        assert host_bytes(res, h) == 14 * 250_000
    # time: a step's slowest transfer is the 250 kB across, over the host's two 200G NICs (5 us; NVLink 0.56 us):
    # 14 x 5 us = 2(kN - 1)/(kN) x S / (k x NIC) = 14/8 x 8 MB / (4 x 400 Gbit/s), plus the first exit's NVLink hop
    # to the NIC's GPU (PXN; the later ones run under the network step before)
    nic_bps = sum(n.rate_gbps for n in servers_fabric().nics_of["h3"]) * 1e9
    network_us = 14 / 8 * size * 8 / (4 * nic_bps) * 1e6
    assert network_us == pytest.approx(70.0)
    # (a connection's steps overlap, as NCCL keeps several in flight: two steps sharing a NIC can end up to 3% later)
    hand_us = network_us + 250_000 * 8 / NVLINK_BPS * 1e6
    assert hand_us * (1 - 1e-9) <= res.collectives[0].duration_real_us <= 1.03 * hand_us


def test_flowsim_delays_in_server_transfers_by_their_nvlink_time():
    fab = servers_fabric()
    # h0 -> h1 in server 0 (NVLink), then h1 -> h4 across the fabric, at the host NIC rate
    dag = TransferDag((Transfer(0, 1, 1_000_000), Transfer(1, 4, 1_000_000, deps=(0,))), (0, 1, 4))
    pl = Placement(tuple(h.name for h in fab.hosts[:5]))
    res = simulate(fab, EcmpPolicy(PathTable(fab)), [Job(dag, pl)], options=SimOptions(channels=1))
    nv_s = 1_000_000 * 8 / NVLINK_BPS
    assert res.transfer_end_s[0] == pytest.approx(nv_s)
    assert res.transfer_start_s[1] == pytest.approx(nv_s)
    # the second: 1 MB over h1's NICs (one per plane, 1 connection each: half on each)
    nic_bps = min(n.rate_gbps for n in fab.nics_of["h1"]) * 1e9
    assert res.transfer_end_s[1] == pytest.approx(nv_s + 500_000 * 8 / nic_bps)


def test_flowsim_cut_through_times_in_server_transfers_too():
    fab = servers_fabric()
    dag = TransferDag((Transfer(0, 1, 1_000_000), Transfer(1, 2, 2_000_000, deps=(0,))), (0, 1, 2))
    pl = Placement(tuple(h.name for h in fab.hosts[:4]))
    res = simulate(fab, EcmpPolicy(PathTable(fab)), [Job(dag, pl)], options=SimOptions(cut_through=True))
    assert res.job_end_s[0] == pytest.approx(3_000_000 * 8 / NVLINK_BPS)


def test_hold_only_for_jobs_without_transfers():
    from fabric.flowsim.maxmin import FlowSimError
    fab = servers_fabric()
    dag = TransferDag((Transfer(0, 1, 10),), (0, 1))
    with pytest.raises(FlowSimError, match="hold_s"):
        simulate(fab, EcmpPolicy(PathTable(fab)), [Job(dag, Placement(("h0", "h1")), hold_s=1.0)])


def test_one_gpu_per_server_keeps_every_pair_on_the_fabric():
    fab = builders.dual_plane(hosts=16, hosts_per_leaf=4)
    w = one_step(coll("all_reduce", 4_000_000, range(4), count=2))
    plan = plan_replay(w, fab, ReplayOptions(dilation=1000))
    assert all(t.local_us is None for t in plan.templates)
    assert len(plan.calls) == 2  # count 2 across the fabric: two calls
    assert len(plan.connections.pair_key) == 4  # the ring's 4 host pairs


# ---- the emulation's side, without root: placement, and the real agents and driver over loopback ----

def test_placed_in_server_transfers_have_no_parts_and_wait_their_scaled_nvlink_time():
    from traffic.replay import place
    w = one_step(coll("all_reduce", 800_000, range(8)), coll("all_reduce", 400_000, range(4), stream="1"))
    plan = plan_replay(w, servers_fabric(), ReplayOptions(dilation=2e5, mbps_per_gbps=0.01))
    placed = place(plan)
    ring8, tp = placed.placed
    assert tp.template.local_us is not None and ring8.template.local_us is None
    nv_emu_bps = 3600 * 0.01 * 1e6  # the emulated NVLink rate: 36 Mbit/s
    for x in ring8.transfers:
        crosses = (int(x.src_host[1:]) // 4) != (int(x.dst_host[1:]) // 4)
        assert bool(x.parts) == crosses
        # one ring per NIC: 4 rings of 200 kB, chunks of 25 kB real x bytes scale 2e5 x 0.01 / 1000 = 50 kB emulated
        assert x.size_bytes == 50_000
        assert x.nvlink_s == (0.0 if crosses else pytest.approx(50_000 * 8 / nv_emu_bps))
    # connections only between the servers' j-th GPUs (ring j leaves each server through NIC j), per plane and channel
    assert {(c.src_host, c.dst_host) for c in placed.connections} == (
        {(f"h{j}", f"h{4 + j}") for j in range(4)} | {(f"h{4 + j}", f"h{j}") for j in range(4)})
    # the all in-server template is the driver's: no agent gets it
    assert all(str(tp.template.id) not in placed.agent_plan(h)["templates"] and tp.template.id not in
               placed.agent_plan(h)["templates"] for h in plan.hosts())


def test_agents_time_in_server_transfers_and_the_driver_local_calls_over_loopback(tmp_path):
    from tests.localhosts import LocalHosts
    from tests.test_replay import loopback
    from traffic.replay.driver import Driver
    fab = servers_fabric()
    dilation, scale = 2e5, 0.01
    w = one_step(coll("all_reduce", 800_000, range(8), start=100.0),
                 coll("all_reduce", 400_000, range(4), count=3, stream="1", start=2000.0))
    placed = loopback(plan_replay(w, fab, ReplayOptions(dilation=dilation, mbps_per_gbps=scale, port=17800)))
    raw = Driver(placed, LocalHosts(fab), tmp_path, None, 0.5).run()
    ring, tp = raw.timings
    nv_s = 50_000 * 8 / (3600 * scale * 1e6)  # one 25 kB real chunk (4 rings of 200 kB) at the emulated NVLink rate
    # a ring step's send waits for the sender's own send of the step before (and its receive): h0's 14
    # sends to h1 (in-server, each its NVLink time once the one before is done) chain 14 NVLink hops;
    # the cross-server hops (over loopback here) add little. Tolerance: 15% + 50 ms for the agents
    assert 14 * nv_s <= ring.end_s - ring.start_s < 14 * nv_s * 1.15 + 0.05
    # every receive reported: per ring (4, one per NIC) and step (14), its 8 transfers and the 2 exits' NVLink hops
    # to the NIC's GPU
    assert len(ring.received_s) == 4 * 14 * (8 + 2)
    # the TP all-reduce: 3 x 6 steps of 100 kB real at 3600 Gbit/s, x the dilation, held by the driver
    local_s = 3 * 6 * 100_000 * 8 / 3.6e12
    assert tp.end_s - tp.start_s == pytest.approx(local_s * dilation, rel=1e-9)
