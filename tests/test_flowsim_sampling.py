"""Phase sampling (`Job.sample_phases`) and per-job lockstep in the flow-level simulator: an all-to-all's
rounds simulated one per block, the block's others run as it ran; checked against hand-worked times, against
every round simulated, and against the bytes each link must carry by the routing policy's own paths."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from fabric import topofile
from fabric.builders import leaf_spine
from fabric.flowsim import FlowSimError, Job, SimOptions, simulate
from fabric.flowsim.connections import plan_connections
from fabric.routing import EcmpPolicy, PathTable
from fabric.transfers import Placement, split_bytes
from traffic.collectives import schedule_columns


def placement(fab, n):
    return Placement(tuple(h.name for h in fab.hosts[:n]))


def a2a(n, size):
    return schedule_columns("all_to_all", size, list(range(n)), "pairwise")


def test_one_switch_every_round_at_the_nic_rate_whatever_is_sampled():
    # 8 hosts on one 100 G leaf, nothing shared but the NICs: round k is a permutation, each flow alone on
    # its NIC's links, so each of the 7 rounds takes piece x 8 / 100e9 s; lockstep or sampled alike
    fab = leaf_spine(hosts=8, hosts_per_leaf=8, spines=1, nic_rate_gbps=100)
    size = 8_000_000  # pieces of 1 MB
    want = 7 * 1_000_000 * 8 / 100e9
    for every in (1, 3, 7):
        res = simulate(fab, EcmpPolicy(PathTable(fab)), [Job(a2a(8, size), placement(fab, 8), lockstep=True,
                                                             sample_phases=every)], options=SimOptions(channels=1))
        assert res.job_time_s[0] == pytest.approx(want, rel=1e-9)
        assert res.phases_sampled == (0 if every == 1 else 7 - len(range(0, 7, every)))


def _bits_per_link(res):
    """Bits each directed link carried, from the run's load log."""
    bits = np.zeros(len(res.links))
    for k in range(len(res.edges_s) - 1):
        lo, hi = res.load_ptr[k], res.load_ptr[k + 1]
        np.add.at(bits, res.load_link[lo:hi], res.load_bps[lo:hi] * (res.edges_s[k + 1] - res.edges_s[k]))
    return bits


@pytest.mark.parametrize("topo", ["pyramid-16", "dual-plane-16"])
def test_sampled_rounds_log_every_byte_on_its_own_path(topo):
    # the links' loads of a sampled run: every transfer's bytes split over its pair's connections, each part
    # on the path the policy gives its connection (worked out here from `RoutingPolicy.path`, not the run)
    fab = topofile.load(topo)
    n, size, channels = 16, 16_000_016, 2
    cols = a2a(n, size)
    policy = EcmpPolicy(PathTable(fab))
    pl = placement(fab, n)
    res = simulate(fab, policy, [Job(cols, pl, lockstep=True, sample_phases=5)],
                   options=SimOptions(channels=channels, ports="hashed", seed=4))
    assert res.phases_sampled > 0
    conns = plan_connections(fab, policy.entropy, {(pl.host(int(a)), pl.host(int(b))) for a, b in zip(cols.src, cols.dst)},
                             channels=channels, ports="hashed", seed=4)
    want = Counter()
    for a, b, nbytes in zip(cols.src.tolist(), cols.dst.tolist(), cols.size_bytes.tolist()):
        mine = conns[(pl.host(a), pl.host(b))]
        for c, part in zip(mine, split_bytes(nbytes, len(mine))):
            for u, v in itertools.pairwise(policy.path(c.src, c.dst, c.sport)):
                want[(u, v)] += part * 8
    got = _bits_per_link(res)
    # (within a millionth: the simulated rounds drop the last bits of flows ending within the resolution of
    # each other, a few bytes; one piece on a wrong path would be 500,000 bits)
    for i, link in enumerate(res.links):
        assert got[i] == pytest.approx(want.get(link, 0), rel=1e-6, abs=1e-3), link


def test_a_later_call_runs_all_its_blocks_from_the_first_calls():
    # two calls of one all-to-all, one after the other: the first simulates a round per block, the second
    # none (the same template: the same pairs, connections and paths) and takes exactly as long
    fab = topofile.load("pyramid-16")
    cols, pl = a2a(16, 3_200_000), placement(fab, 16)
    jobs = [Job(cols, pl, lockstep=True, sample_phases=4), Job(cols, pl, after=(0,), lockstep=True, sample_phases=4)]
    res = simulate(fab, EcmpPolicy(PathTable(fab)), jobs, options=SimOptions(ports="hashed", seed=1))
    blocks = len(range(0, 15, 4))
    assert res.phases_sampled == (15 - blocks) + 15
    assert res.job_time_s[1] == pytest.approx(res.job_time_s[0], rel=1e-12)


def test_rounds_alongside_another_job_are_all_simulated():
    # a long transfer on another lane keeps the fabric busy the whole time: no round runs alone, so none is
    # sampled, and the run is the lockstep run, event for event
    fab = topofile.load("pyramid-16")
    cols, pl = a2a(16, 3_200_000), placement(fab, 16)
    from fabric.transfers import Transfer, TransferDag

    other = Job(TransferDag((Transfer(0, 1, 10**10),), (0, 1)), placement(fab, 2), lane=1)
    sampled = simulate(fab, EcmpPolicy(PathTable(fab)), [Job(cols, pl, lockstep=True, sample_phases=4), other],
                       options=SimOptions(ports="hashed", seed=1))
    plain = simulate(fab, EcmpPolicy(PathTable(fab)), [Job(cols, pl, lockstep=True), other],
                     options=SimOptions(ports="hashed", seed=1))
    assert sampled.phases_sampled == 0
    assert sampled.job_end_s.tolist() == plain.job_end_s.tolist()


def test_per_job_lockstep_and_its_checks():
    fab = topofile.load("pyramid-16")
    cols, pl = a2a(16, 3_200_000), placement(fab, 16)
    policy = EcmpPolicy(PathTable(fab))
    both = simulate(fab, policy, [Job(cols, pl, lockstep=True)], options=SimOptions(ports="hashed"))
    everywhere = simulate(fab, EcmpPolicy(PathTable(fab)), [Job(cols, pl)], options=SimOptions(ports="hashed",
                                                                                                lockstep=True))
    assert both.job_end_s.tolist() == everywhere.job_end_s.tolist()
    with pytest.raises(FlowSimError, match="phase sampling needs lockstep"):
        simulate(fab, EcmpPolicy(PathTable(fab)), [Job(cols, pl, lockstep=False, sample_phases=2)])
    with pytest.raises(FlowSimError, match="sample_phases must be >= 1"):
        simulate(fab, EcmpPolicy(PathTable(fab)), [Job(cols, pl, lockstep=True, sample_phases=0)])
    with pytest.raises(FlowSimError, match="cut_through and lockstep"):
        simulate(fab, EcmpPolicy(PathTable(fab)), [Job(cols, pl, lockstep=True)], options=SimOptions(cut_through=True))
