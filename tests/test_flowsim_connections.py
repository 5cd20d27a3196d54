"""Connections in the flow-level simulator: the replay's own (host pairs, NICs, planes, source ports, lane
by lane), hashed source ports drawn one by one as the replay draws them and colliding as counted by
hand, and one DAG on two lanes."""
from __future__ import annotations

import random

import numpy as np
import pytest

from fabric import topofile
from fabric.flowsim import Job, SimOptions
from fabric.routing import EcmpPolicy, PathTable
from tests.conftest import leaf_to_leaf, one_rank_per_host, run
from traffic.collectives import schedule


def test_hashed_source_ports_collide_as_counted_by_hand():
    # leaf-spine-16, one connection per pair, ports drawn as the replay draws them: random.Random(seed),
    # randrange(32768, 61000), pairs in host order (h0->h4, h1->h5, h2->h6, h3->h7). The leaf tier's
    # slot is (port >> 1) & 15 and slot s leaves by spine s mod 4. k flows on one spine share its
    # 400 G uplink: 400 / k each (the NIC, 400 G, never binds), until they end together; flows on
    # other spines do not touch them. So transfer i takes size x 8 / (400 G / k_i).
    size = 2**24
    fab = topofile.load("leaf-spine-16")
    collided = 0
    for seed in range(8):
        rng = random.Random(seed)
        spine = [((rng.randrange(32768, 61000) >> 1) & 15) % 4 for _ in range(4)]
        k = [spine.count(s) for s in spine]
        collided += max(k) > 1
        _, res = run("leaf-spine-16", [leaf_to_leaf(fab, size)], options=SimOptions(channels=1, ports="hashed",
                                                                                    seed=seed))
        expected = [size * 8 / (400e9 / k[i]) for i in range(4)]
        assert list(res.transfer_end_s) == pytest.approx(expected, rel=1e-9), (seed, spine)
    assert collided >= 2  # the seeds do exercise collisions


@pytest.mark.parametrize("ports", ["planned", "hashed"])
def test_connections_are_the_replays_own(ports):
    # the plan's connections (one table, both backends) and `plan_connections'` objects: same host pairs,
    # NICs, planes and source ports as the replay's plan, for its ring on dual-plane-16
    from fabric.flowsim import plan_connections
    from tests.test_replay import DP16, coll, workload
    from traffic.replay import ReplayOptions, plan_replay

    plan = plan_replay(workload([coll(size=16_000_000, n=16)], n=16), DP16,
                       ReplayOptions(channels=2, dilation=1000, ports=ports, seed=3))
    replay = {(c.src_host, c.dst_host, c.src_ip, c.dst_ip, c.sport) for c in plan.connection_list()}
    ours = plan_connections(DP16, EcmpPolicy(PathTable(DP16)).entropy, {(c.src_host, c.dst_host)
                                                                        for c in plan.connection_list()},
                            channels=2, ports=ports, seed=3)
    assert {(a, b, str(c.src.ip), str(c.dst.ip), c.sport) for (a, b), cs in ours.items() for c in cs} == replay
    assert len(replay) == 16 * 2 * 2  # 16 ring pairs x 2 planes x 2 channels


@pytest.mark.parametrize("ports", ["planned", "hashed"])
def test_connections_are_the_replays_own_on_every_lane(ports):
    # a trace with two streams (a ring all-reduce on "0", an all-to-all on "1"): the replay gives each
    # stream its own connections (a lane), drawing hashed ports lane by lane; the simulator's, asked
    # for the same (pair, lane)s, must be the very same, lane for lane (else it models other ECMP
    # collisions than the emulator had: the all-to-all's ports would be lane 0's)
    from fabric.flowsim import plan_connections
    from tests.test_replay import DP16, coll, workload
    from traffic.replay import ReplayOptions, plan_replay

    w = workload([coll(size=16_000_000, n=16, stream="0"), coll("all_to_all", size=16_000_000, n=16, stream="1")],
                 n=16)
    plan = plan_replay(w, DP16, ReplayOptions(channels=2, dilation=1000, ports=ports, seed=3))
    replay = {(c.src_host, c.dst_host, c.lane, c.src_ip, c.dst_ip, c.sport) for c in plan.connection_list()}
    ours = plan_connections(DP16, EcmpPolicy(PathTable(DP16)).entropy, {(c.src_host, c.dst_host, c.lane)
                                                                        for c in plan.connection_list()},
                            channels=2, ports=ports, seed=3)
    assert {(a, b, lane, str(c.src.ip), str(c.dst.ip), c.sport) for (a, b, lane), cs in ours.items() for c in cs} \
        == replay
    assert len(replay) == (16 + 16 * 15) * 2 * 2  # lane 0: 16 ring pairs; lane 1: every pair
    if ports == "hashed":  # lane 1's ports are not lane 0's
        lane0 = {(a, b): [c.sport for c in cs] for (a, b, lane), cs in ours.items() if lane == 0}
        lane1 = {(a, b): [c.sport for c in cs] for (a, b, lane), cs in ours.items() if lane == 1}
        assert all(lane0[p] != lane1[p] for p in lane0)
    # and a job on lane L sends every transfer over the replay's lane-L connections of its pair
    from fabric.flowsim.executor import _Run

    jobs = [Job(plan.templates[c.template].dag, plan.placement, lane=plan.templates[c.template].lane)
            for c in plan.calls]
    assert sorted(j.lane for j in jobs) == [0, 1]
    state = _Run(DP16, EcmpPolicy(PathTable(DP16)), jobs, SimOptions(channels=2, ports=ports, seed=3), [])
    by_pair = {}
    for c in plan.connection_list():
        by_pair.setdefault((c.src_host, c.dst_host, c.lane), []).append(c.sport)
    for job, k in zip(jobs, state.job_tpl):
        tpl = state.templates[k]
        cols = job.columns
        for i in range(len(cols)):
            a, b = plan.placement.host(int(cols.src[i])), plan.placement.host(int(cols.dst[i]))
            got = [int(state.ct.sport[c]) for c in range(state.pair_ptr[tpl.pair[i]], state.pair_ptr[tpl.pair[i] + 1])]
            assert got == by_pair[(a, b, job.lane)], (a, b, job.lane)


def test_one_dag_on_two_lanes_shares_its_shape_and_keeps_its_own_connections():
    # a replay's collective on two streams: one shape (sizes, successors, phases held once), two sets
    # of host pairs (each lane its own connections)
    from fabric.flowsim.executor import _Run

    fab = topofile.load("dual-plane-16")
    dag = schedule("all_reduce", 1_000_000, list(range(8)), "ring")
    place = one_rank_per_host(fab, 8)
    run = _Run(fab, EcmpPolicy(PathTable(fab)), [Job(dag, place, lane=0), Job(dag, place, lane=1)], SimOptions(), [])
    a, b = run.templates
    assert a.shape is b.shape and a.succ is b.succ
    remote = a.pair >= 0
    assert remote.any() and (remote == (b.pair >= 0)).all()
    assert not set(a.pair[remote].tolist()) & set(b.pair[remote].tolist())
    # each pair's sender and receiver are the transfer's hosts, on its own lane
    hosts = [h.name for h in fab.hosts]
    for tpl, lane in ((a, 0), (b, 1)):
        for t in np.flatnonzero(remote)[:5]:
            key = int(run.pair_key[tpl.pair[t]])
            src, dst = key // len(hosts) % len(hosts), key % len(hosts)
            assert key // len(hosts) ** 2 == lane
            assert (hosts[src], hosts[dst]) == (place.host(int(dag.columns.src[t])), place.host(int(dag.columns.dst[t])))


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_hashed_ports_are_drawn_as_one_by_one_with_redraws(channels, monkeypatch):
    # the replay's rule, one connection at a time: draw from one Random(seed), again while (source NIC,
    # port, destination NIC, lane) is taken. A range of 3 ports forces redraws in most pairs (and pairs of
    # 3 channels take all three), and a block of 5 pairs makes the array check cross blocks
    import random

    import numpy as np

    import fabric.flowsim.connections as fc

    monkeypatch.setattr(fc, "HASHED_PORTS", (40000, 40003))
    monkeypatch.setattr(fc, "_HASHED_BLOCK", 5)
    pairs = 23
    rng = random.Random(9)
    want, used = [], set()
    for p in range(pairs):
        for _ in range(channels):
            sport = rng.randrange(40000, 40003)
            while (p, sport) in used:
                sport = rng.randrange(40000, 40003)
            used.add((p, sport))
            want.append(sport)
    got = fc._hashed_sports(pairs * channels, channels, 9)
    assert got.tolist() == want
    assert channels == 1 or any(len(set(want[i:i + channels])) == channels for i in range(0, len(want), channels))
    assert np.all((got >= 40000) & (got < 40003))


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_merge_nics_off_puts_whole_channels_on_one_plane_alternating(channels: int) -> None:
    # dual-plane-16: each host has one 200 G link into plane A and one into plane B (read from the fabric).
    # h0..h3 each send S to h4..h7 at once (different leaves, non-blocking). NCCL_IB_MERGE_NICS=1 (default):
    # `channels` connections per plane, S split evenly over 2 x channels, so each plane carries S/2: S / 400 G.
    # Merge off: `channels` connections in all, channel c on plane c mod 2, S split evenly over them: plane A
    # carries ceil(c/2)/c of S, so the pair takes ceil(c/2)/c x S / 200 G (c = 1: twice as long; c = 3: 4/3).
    from fabric.flowsim import plan_connections

    fab = topofile.load("dual-plane-16")
    plane_gbps = {link.rate_gbps for link in fab.links if link.a.node == "h0"}
    assert plane_gbps == {200.0}
    size = 2**26
    _, merged = run("dual-plane-16", [leaf_to_leaf(fab, size)], options=SimOptions(channels=channels))
    _, apart = run("dual-plane-16", [leaf_to_leaf(fab, size)], options=SimOptions(channels=channels, merge_nics=False))
    assert list(merged.transfer_end_s) == pytest.approx([size * 8 / 400e9] * 4, rel=1e-6)  # bytes split to the byte
    on_a = -(-channels // 2)
    assert list(apart.transfer_end_s) == pytest.approx([on_a / channels * size * 8 / 200e9] * 4, rel=1e-6)
    # the connections themselves: channel c of the pair on plane "AB"[c % 2], one QP each
    conns = plan_connections(fab, EcmpPolicy(PathTable(fab)).entropy, {("h0", "h4")}, channels=channels,
                             merge_nics=False)[("h0", "h4")]
    assert [(c.channel, c.src.plane, c.dst.plane) for c in conns] == [(c, "AB"[c % 2], "AB"[c % 2])
                                                                      for c in range(channels)]


def test_merge_nics_off_reaches_the_replays_plan_and_the_resolved_run() -> None:
    # the one connection table of both backends: with one channel and merge off, the emulated agents' every
    # connection is on plane A (NIC 0), and the resolved run and the CLI say "merge_nics off"
    from fabric.flowsim.connections import Connection
    from fabriclab.cli import build_parser
    from fabriclab.options import run_options
    from fabriclab.study.spec import RunSpec, SimModel, WorkloadSpec, resolve
    from tests.test_replay import DP16, coll, workload
    from traffic.replay import ReplayOptions, plan_replay

    plan = plan_replay(workload([coll(size=16_000_000, n=16)], n=16), DP16,
                       ReplayOptions(channels=1, merge_nics=False, dilation=1000))
    conns: list[Connection] = list(plan.connection_list())
    assert len(conns) == 16 and {c.plane for c in conns} == {"A"}
    args = build_parser().parse_args(["sim", "llm:gpt3-175b", "--merge-nics", "off", "--channels", "1"])
    spec = RunSpec(WorkloadSpec.parse("llm:gpt3-175b"), run_options(args), SimModel())
    resolved = resolve(spec, 1024, "dual-plane-1024-rail", "adaptive")
    assert resolved.merge_nics == "off" and resolved.replay_options().merge_nics is False
