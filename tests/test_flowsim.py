"""The flow-level simulator: transfer DAGs executed over the topology files (rings, overheads, link
failures, jobs, the load log, congestion feedback).

Expected values are worked out by hand in the comments (link rates from the topology files' numbers,
ECMP choices from the documented entropy rule). Max-min fair sharing is in tests/test_flowsim_maxmin.py;
lockstep, phase replays and cut-through in tests/test_flowsim_phases.py; the connections (the replay's
own, hashed source ports, lanes) in tests/test_flowsim_connections.py; phase sampling in
tests/test_flowsim_sampling.py."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fabric import topofile
from fabric.builders import dual_plane
from fabric.flowsim import FlowSimError, Job, LinkEvent, SimOptions, simulate
from fabric.routing import AdaptivePolicy, EcmpPolicy, PathTable
from fabric.transfers import Placement, Transfer, TransferDag
from tests.conftest import leaf_to_leaf, one_rank_per_host, run
from traffic.collectives import schedule


@pytest.mark.parametrize("topo, host_gbps", [
    ("dual-plane-16", 2 * 200),  # two NIC ports of 200 G (one per plane); leaves non-blocking
    ("leaf-spine-16", 400),  # one 400 G NIC; 4 x 400 G down, 4 x 400 G up per leaf
])
def test_ring_all_reduce_on_a_non_blocking_fabric_takes_2_n_minus_1_over_n_s_over_b(topo, host_gbps):
    fab = topofile.load(topo)
    n, size = 16, 64 * 2**20
    dag = schedule("all_reduce", size, list(range(n)), "ring")
    _, res = run(topo, [Job(dag, one_rank_per_host(fab, n))])
    expected_s = 2 * (n - 1) / n * size * 8 / (host_gbps * 1e9)
    assert res.job_time_s[0] == pytest.approx(expected_s, rel=1e-9)
    assert res.stalled == ()
    # every byte of every transfer crosses the sender's NIC link once
    nic_bytes = sum(res.link_bytes()[res.link_index(nic.host, nic.switch)] for h in fab.hosts
                    for nic in fab.nics_of[h.name])
    assert nic_bytes == pytest.approx(dag.total_bytes, rel=1e-9)
    assert res.link_utilisation().max() <= 1 + 1e-9


def test_per_transfer_overhead_adds_once_per_ring_step():
    fab = topofile.load("leaf-spine-16")
    n, size, overhead_s = 8, 8 * 2**20, 5e-6
    dag = schedule("all_reduce", size, list(range(n)), "ring")
    _, res = run("leaf-spine-16", [Job(dag, one_rank_per_host(fab, n))],
                 options=SimOptions(per_transfer_s=overhead_s))
    # 2(n-1) steps one after another, each S/n at 400 G then the overhead
    assert res.job_time_s[0] == pytest.approx(2 * (n - 1) * (size / n * 8 / 400e9 + overhead_s), rel=1e-9)


def test_per_hop_latency_follows_the_slowest_link_of_the_ring():
    # leaf-spine-16, 8 ranks on h0..h7: leafA0 holds h0..h3, leafA1 h4..h7. A ring transfer drains in
    # D = (S/n) x 8 / 400 G on every pair (each host sends one transfer at a time over its own NIC, 2
    # flows of 200 G; the two cross-leaf pairs have 2 x 400 G uplinks for 2 flows each). It is then
    # delivered h x hops later: 2 hops inside a leaf (host-leaf, leaf-host), 4 across (+ up, + down).
    # Host i's step k waits for its own step k-1 delivered (same connection) and for i-1's, so with
    # e(i, k) its step-k delivery: e(3, k) = e(3, k-1) + D + 4h, and no host is slower than that
    # chain: the collective takes 2(n-1) (D + 4h).
    fab = topofile.load("leaf-spine-16")
    n, size, per_hop_s = 8, 8 * 2**20, 1e-6
    dag = schedule("all_reduce", size, list(range(n)), "ring")
    _, res = run("leaf-spine-16", [Job(dag, one_rank_per_host(fab, n))], options=SimOptions(per_hop_s=per_hop_s))
    drain_s = size / n * 8 / 400e9
    assert res.job_time_s[0] == pytest.approx(2 * (n - 1) * (drain_s + 4 * per_hop_s), rel=1e-9)


def test_cost_grows_with_events_not_simulated_time(monkeypatch):
    from fabric.flowsim import phases

    fab = topofile.load("dual-plane-16")
    small = schedule("all_reduce", 2**20, list(range(16)), "ring")
    large = schedule("all_reduce", 2**30, list(range(16)), "ring")
    for replay in (False, True):
        monkeypatch.setattr(phases, "PHASE_REPLAY", replay)
        _, a = run("dual-plane-16", [Job(small, one_rank_per_host(fab, 16))])
        _, b = run("dual-plane-16", [Job(large, one_rank_per_host(fab, 16))])
        assert b.job_time_s[0] == pytest.approx(a.job_time_s[0] * 1024, rel=1e-6)
        # every ring step has the same connections active (all flows of a step end together): the
        # max-min rates are computed once and looked up for the other 29 steps
        assert a.rate_updates == b.rate_updates == 1
        # every step simulated: 31 events (the start, 30 step ends); with phase replays (the DAG's own
        # dependencies, no lockstep): the start, the first step's end (it delivers all at one instant,
        # and every step waits for the one before), and one event for the 29 steps replayed from it.
        # The load log is one interval either way: no step changed the allocation.
        assert a.events == b.events == (3 if replay else 2 * 15 + 1)
        assert a.phases_replayed == b.phases_replayed == (29 if replay else 0)
        assert len(a.edges_s) == 2 and a.edges_s[-1] == pytest.approx(a.job_end_s[0])


@pytest.mark.parametrize("share", [1.0, 0.9, 0.5])
def test_the_goodput_share_scales_every_link_and_the_ring_time_with_it(share):
    # the ring of the non-blocking test: 2(n-1)/n x S / (share x B), B = 2 x 200 G per host
    fab = topofile.load("dual-plane-16")
    n, size = 16, 16 * 2**20
    dag = schedule("all_reduce", size, list(range(n)), "ring")
    _, res = run("dual-plane-16", [Job(dag, one_rank_per_host(fab, n))], options=SimOptions(goodput_share=share))
    assert res.job_time_s[0] == pytest.approx(2 * (n - 1) / n * size * 8 / (share * 400e9), rel=1e-9)
    assert res.link_utilisation().max() == pytest.approx(share, rel=1e-9)  # of the links' wire rate
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(FlowSimError, match="goodput_share"):
            SimOptions(goodput_share=bad).check()


def test_a_failed_uplink_moves_its_flows_and_lengthens_completion():
    # leaf-spine-16, 4 channels per pair, planned ports: channel c is slot c, and slot c leaves leafA0
    # by port c + 1 (spineA<c>). Per flow: the sender's 400 G NIC / 4 flows = 100 G; each 400 G uplink
    # carries one flow per host: 4 x 100 G = 400 G, full but not over.
    # At t_f leafA0's port 1 (to spineA0) fails; fast failover sends slot 0 to the first live port,
    # spineA1: its uplink then carries 8 flows (channels 0 and 1 of each host): 400 / 8 = 50 G each.
    # Channels 2 and 3: min(uplink 400 / 4 = 100, NIC (400 - 2 x 50) / 2 = 150) = 100 G.
    size = 2**30
    bits_per_flow = size / 4 * 8
    t_f = 0.25 * bits_per_flow / 100e9  # a quarter of the way through
    left = bits_per_flow - 100e9 * t_f
    fab, healthy = run("leaf-spine-16", [leaf_to_leaf(topofile.load("leaf-spine-16"), size)],
                       options=SimOptions(channels=4))
    assert healthy.job_time_s[0] == pytest.approx(bits_per_flow / 100e9, rel=1e-9)
    _, res = run("leaf-spine-16", [leaf_to_leaf(fab, size)], options=SimOptions(channels=4),
                 link_events=[LinkEvent(t_f, "leafA0", 1)])
    # channels 2, 3 end at t_f + left / 100 G; channels 0, 1 (still 50 G: the uplink binds) at t_f + left / 50 G
    assert res.job_time_s[0] == pytest.approx(t_f + left / 50e9, rel=1e-9)
    assert res.route_changes == 1
    rates = res.link_rate_bps()
    after = int(np.searchsorted(res.edges_s, t_f))  # the interval starting at t_f
    assert res.edges_s[after] == pytest.approx(t_f)
    up0, up1, up2 = (res.link_index("leafA0", f"spineA{k}") for k in (0, 1, 2))
    assert rates[after - 1, [up0, up1, up2]] == pytest.approx([400e9, 400e9, 400e9])
    assert rates[after, [up0, up1, up2]] == pytest.approx([0, 400e9, 400e9])
    assert rates[after, res.link_index("h0", "leafA0")] == pytest.approx(300e9)  # 50 + 50 + 100 + 100


def test_a_host_link_down_for_good_stalls_its_transfer():
    fab = topofile.load("leaf-spine-16")
    _, res = run("leaf-spine-16", [leaf_to_leaf(fab, 2**20)], link_events=[LinkEvent(0.0, "leafA0", 5)])
    assert res.stalled == (0,)  # h0 (leafA0 port 5) -> h4 has no way out; the others finish
    assert np.isnan(res.job_end_s[0])
    assert not np.isnan(res.transfer_end_s[1:]).any()


def test_a_job_waiting_for_a_stalled_one_never_starts_and_all_its_transfers_are_stalled():
    fab = topofile.load("leaf-spine-16")
    jobs = [leaf_to_leaf(fab, 2**20), dataclasses.replace(leaf_to_leaf(fab, 2**20), after=(0,))]
    _, res = run("leaf-spine-16", jobs, link_events=[LinkEvent(0.0, "leafA0", 5)])
    assert res.stalled == (0, 4, 5, 6, 7)  # job 0's h0 -> h4, and every transfer of job 1 (offset 4)
    assert np.isnan(res.job_start_s[1]) and np.isnan(res.transfer_start_s[4:]).all()


def test_jobs_one_after_another_share_one_pool_and_keep_their_transfer_times():
    # five ring all-reduces over 8 hosts of leaf-spine-16, each after the one before: each takes
    # 2(n-1) x (S/n) x 8 / 400 G (the non-blocking case above); job k's transfers end as job 0's, k
    # all-reduces later. Only one job runs at a time, so the simulator's per-transfer state (its pool)
    # never holds more than one job's transfers.
    from fabric.flowsim.executor import _Run

    fab = topofile.load("leaf-spine-16")
    n, size = 8, 8 * 2**20
    dag = schedule("all_reduce", size, list(range(n)), "ring")
    jobs = [Job(dag, one_rank_per_host(fab, n), after=(k - 1,) if k else ()) for k in range(5)]
    one_s = 2 * (n - 1) * size / n * 8 / 400e9
    _, res = run("leaf-spine-16", jobs)
    assert res.job_end_s == pytest.approx([one_s * (k + 1) for k in range(5)], rel=1e-9)
    t = len(dag)
    assert res.transfer_end_s[4 * t:] == pytest.approx(res.transfer_end_s[:t] + 4 * one_s, rel=1e-9)
    policy = EcmpPolicy(PathTable(fab))
    state = _Run(fab, policy, jobs, SimOptions(), [])
    state.run()
    assert state.cap == t
    # without per-transfer times: the same job times, no per-transfer arrays
    _, lean = run("leaf-spine-16", jobs, options=SimOptions(transfer_times=False))
    assert np.array_equal(lean.job_end_s, res.job_end_s) and lean.transfer_end_s.size == 0


def test_a_load_log_over_its_budget_keeps_every_links_bytes_at_a_coarser_resolution(monkeypatch):
    # two flows of different lengths over the failed-uplink case give intervals of different loads;
    # with a budget of a few entries the log is coarsened, and each link's bytes stay as they were
    from fabric.flowsim import load_log

    fab = topofile.load("leaf-spine-16")
    events = [LinkEvent(1e-5, "leafA0", 1), LinkEvent(3e-5, "leafA0", 1, up=True)]
    jobs = [leaf_to_leaf(fab, 2**20), dataclasses.replace(leaf_to_leaf(fab, 2**21), start_s=2e-5)]
    _, fine = run("leaf-spine-16", jobs, link_events=events)
    monkeypatch.setattr(load_log, "LOAD_LOG_ENTRIES", 20)
    _, coarse = run("leaf-spine-16", jobs, link_events=events)
    assert fine.coarsened == 0 and coarse.coarsened >= 1
    assert len(coarse.edges_s) < len(fine.edges_s)
    assert coarse.edges_s[0] == fine.edges_s[0] and coarse.edges_s[-1] == fine.edges_s[-1]
    assert coarse.link_bytes() == pytest.approx(fine.link_bytes(), rel=1e-9, abs=1e-3)
    assert np.array_equal(coarse.job_end_s, fine.job_end_s)


def test_a_long_load_log_is_coarsened_a_few_times_not_at_every_event(monkeypatch):
    # six pairwise all-to-alls on pyramid-16, hashed ports: ~1,700 intervals of different loads. Over a
    # budget of 300 entries, the log is halved and later intervals are at least as long as its mean
    # one: a handful of halvings (each halving at least halves the intervals' count: a log that
    # coarsened at every new interval past the budget would do it hundreds of times), bytes kept
    from fabric.flowsim import load_log
    from traffic.collectives import schedule_columns

    fab = topofile.load("pyramid-16")
    placement = one_rank_per_host(fab, 16)
    jobs = [Job(schedule_columns("all_to_all", 3_000_001 + k * 1000, list(range(16)), "pairwise"), placement,
                start_s=k * 0.01) for k in range(6)]
    opts = SimOptions(ports="hashed")
    _, fine = run("pyramid-16", jobs, options=opts)
    monkeypatch.setattr(load_log, "LOAD_LOG_ENTRIES", 300)
    _, coarse = run("pyramid-16", jobs, options=opts)
    intervals = len(fine.edges_s) - 1
    assert fine.coarsened == 0 and intervals > 1000
    assert 1 <= coarse.coarsened <= 2 * math.log2(intervals)
    assert coarse.load_ptr[-1] <= 300 and bool(np.all(np.diff(coarse.edges_s) > 0))
    assert coarse.edges_s[0] == fine.edges_s[0] and coarse.edges_s[-1] == fine.edges_s[-1]
    assert coarse.link_bytes() == pytest.approx(fine.link_bytes(), rel=1e-9, abs=1e-3)
    assert np.array_equal(coarse.job_end_s, fine.job_end_s)


def test_jobs_start_at_their_time_and_local_transfers_take_no_time():
    # ranks 0 and 1 on h0, rank 2 on h4: 0 -> 1 local, then 1 -> 2 over the network (400 G / 2 flows)
    dag = TransferDag((Transfer(0, 1, 10**6), Transfer(1, 2, 10**6, deps=(0,))), (0, 1, 2))
    _, res = run("leaf-spine-16", [Job(dag, Placement(("h0", "h0", "h4")), start_s=1.0)])
    assert list(res.transfer_start_s) == [1.0, 1.0]
    assert res.transfer_end_s[1] == pytest.approx(1.0 + 10**6 * 8 / 400e9, rel=1e-12)
    assert res.job_time_s[0] == pytest.approx(10**6 * 8 / 400e9, rel=1e-9)


@pytest.mark.parametrize("opts", [SimOptions(), SimOptions(lockstep=True), SimOptions(cut_through=True),
                                  SimOptions(per_transfer_s=1e-6)], ids=["exact", "lockstep", "cut-through", "overhead"])
def test_a_long_chain_of_empty_transfers_then_one_with_bytes(opts):
    # A trace's empty collectives one after another (a DLRM trace at 1024 ranks made such chains,
    # and `fabriclab compare` died of a RecursionError after 8 minutes): 5000 zero-byte transfers, each
    # after the one before, alternately between two hosts and on one host, then 1 MB between two
    # hosts. The chain takes no time but its overheads; the last transfer its own time after it.
    n = 5000
    ts = [Transfer(i % 2, 1 - i % 2 if i % 3 else 2, 0, deps=(i - 1,) if i else (), phase=i) for i in range(n)]
    ts.append(Transfer(0, 1, 10**6, deps=(n - 1,), phase=n))
    dag = TransferDag(tuple(ts), (0, 1, 2))
    _, res = run("leaf-spine-16", [Job(dag, Placement(("h0", "h4", "h0")))], options=opts)
    remote = sum(1 for t in ts[:n] if t.src != t.dst and {t.src, t.dst} != {0, 2})
    chain_s = remote * opts.per_transfer_s
    assert res.transfer_end_s[n - 1] == pytest.approx(chain_s, abs=1e-12)
    assert res.job_time_s[0] == pytest.approx(chain_s + opts.per_transfer_s + 10**6 * 8 / 400e9, rel=1e-9)


def test_bad_inputs_are_errors_naming_the_item():
    fab = topofile.load("leaf-spine-16")
    dag = TransferDag((Transfer(0, 1, 1),), (0, 1))
    with pytest.raises(FlowSimError, match="'nowhere', not a host"):
        run("leaf-spine-16", [Job(dag, Placement(("h0", "nowhere")))])
    with pytest.raises(FlowSimError, match="overheads must be >= 0"):
        run("leaf-spine-16", [Job(dag, one_rank_per_host(fab, 2))], options=SimOptions(per_hop_s=-1))
    other = topofile.load("dual-plane-16")
    with pytest.raises(FlowSimError, match="policy routes fabric 'dual-plane-16'"):
        simulate(fab, EcmpPolicy(PathTable(other)), [Job(dag, one_rank_per_host(fab, 2))])


def test_two_jobs_share_a_receiver_and_each_completes_on_its_own():
    # leaf-spine-16: job A h0 -> h4 from 0 s, job B h1 -> h4 from t_b; both end on h4's 400 G NIC link.
    # Until t_b A alone gets 400 G; then 200 G each (max-min on leafA1 -> h4) until A ends, then B 400 G.
    size = 10**8
    bits = size * 8
    t_b = 0.5 * bits / 400e9
    a = Job(TransferDag((Transfer(0, 1, size),), (0, 1)), Placement(("h0", "h4")))
    b = Job(TransferDag((Transfer(0, 1, size),), (0, 1)), Placement(("h1", "h4")), start_s=t_b)
    _, res = run("leaf-spine-16", [a, b])
    a_left = bits - 400e9 * t_b  # A's bits at t_b
    a_end = t_b + a_left / 200e9
    b_end = a_end + (bits - 200e9 * (a_end - t_b)) / 400e9
    assert list(res.job_end_s) == pytest.approx([a_end, b_end], rel=1e-9)
    assert list(res.job_time_s) == pytest.approx([a_end, b_end - t_b], rel=1e-9)
    assert res.transfer_index(1, 0) == 1


def test_a_link_that_comes_back_takes_its_flows_back():
    # as in the failure test, with the link back at t_r: from then on every flow is at 100 G again
    size = 2**30
    bits_per_flow = size / 4 * 8
    t_f = 0.25 * bits_per_flow / 100e9
    t_r = 2 * t_f
    fab = topofile.load("leaf-spine-16")
    _, res = run("leaf-spine-16", [leaf_to_leaf(fab, size)], options=SimOptions(channels=4),
                 link_events=[LinkEvent(t_f, "leafA0", 1), LinkEvent(t_r, "leafA0", 1, up=True)])
    # channels 0, 1 sent 100 G x t_f + 50 G x (t_r - t_f); channels 2, 3 sent 100 G x t_r: all at 100 G after
    slow_end = t_r + (bits_per_flow - 100e9 * t_f - 50e9 * (t_r - t_f)) / 100e9
    assert res.job_time_s[0] == pytest.approx(slow_end, rel=1e-9)
    assert res.route_changes == 2


@pytest.mark.parametrize("policy_cls", [EcmpPolicy, AdaptivePolicy], ids=["ecmp", "adaptive"])
def test_a_transfer_between_mesh_leaves_completes_over_the_detours_after_its_direct_links_fail(policy_cls):
    # dual_plane mesh of 4 leaves per plane, 300 G NICs, oversubscription 2: each leaf's 2 x 300 G
    # down / 2 over 3 mesh links = 100 G per mesh link. h0 (leaf 0) sends S bytes to h2 (leaf 1)
    # over 2 channels per plane, 4 flows of B = S/4 x 8 bits; channel c is slot c. Port numbers
    # (tests/test_paths.py): leaf 0's port 1 is its link to leaf 1, in either plane.
    #   [0, t_f): 2 flows share each plane's direct 100 G link: 50 G each.
    #   t_f: both direct links fail. Slot 0 detours via leaf 2, slot 1 via leaf 3 (ecmp: the data
    #     plane's fail-over order; adaptive: the policy's move): each flow alone on both links of
    #     its detour, 100 G each (the 300 G NIC carries 200 G).
    #   t_r: plane A's direct link recovers: its 2 flows share it again, 50 G each; plane B's stay at 100 G.
    fab = dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh", nic_rate_gbps=300, oversubscription=2)
    size = 2**30
    bits = size / 4 * 8
    t_f = 0.25 * bits / 50e9  # a quarter sent
    t_r = t_f + 0.25 * bits / 100e9  # half sent
    dag = TransferDag((Transfer(0, 1, size),), (0, 1))
    events = [LinkEvent(t_f, "leafA0", 1), LinkEvent(t_f, "leafB0", 1), LinkEvent(t_r, "leafA0", 1, up=True)]
    res = simulate(fab, policy_cls(PathTable(fab)), [Job(dag, Placement(("h0", "h2")))], link_events=events)
    assert res.stalled == () and res.route_changes == 3
    # plane A's flows end last: the half left at 50 G after t_r (plane B's at 100 G end before)
    assert res.job_time_s[0] == pytest.approx(t_r + 0.5 * bits / 50e9, rel=1e-9)
    rates = res.link_rate_bps()
    detoured = int(np.searchsorted(res.edges_s, t_f))  # the interval starting at t_f
    assert res.edges_s[detoured] == pytest.approx(t_f) and res.edges_s[detoured + 1] == pytest.approx(t_r)
    for plane in "AB":
        direct = res.link_index(f"leaf{plane}0", f"leaf{plane}1")
        legs = [res.link_index(f"leaf{plane}0", f"leaf{plane}{c}") for c in (2, 3)] + \
               [res.link_index(f"leaf{plane}{c}", f"leaf{plane}1") for c in (2, 3)]
        assert rates[detoured - 1, direct] == pytest.approx(100e9) and rates[detoured - 1, legs] == pytest.approx(0)
        assert rates[detoured, direct] == 0 and rates[detoured, legs] == pytest.approx([100e9] * 4)
    after = detoured + 1
    assert rates[after, res.link_index("leafA0", "leafA1")] == pytest.approx(100e9)
    assert rates[after, [res.link_index("leafA0", "leafA2"), res.link_index("leafA3", "leafA1")]] == pytest.approx(0)
    assert rates[after, [res.link_index("leafB0", "leafB2"), res.link_index("leafB3", "leafB1")]] == pytest.approx(
        [100e9, 100e9])


def test_congestion_feedback_moves_one_of_two_colliding_flows_and_both_finish_sooner():
    # 2 hosts per leaf at 200 G per NIC, leaf uplinks 2:1 oversubscribed: 2 x 100 G per plane. h0 -> h6
    # and h1 -> h7 (leafA0 -> leafA3), one connection per plane each (channels=1), hashed source
    # ports of a seed that puts the two plane-A connections in different slots on the same uplink.
    # 200 MB per transfer, 100 MB (0.8 Gbit) per connection. Sharing the uplink: 50 G each. The
    # adaptive policy, polled every 10 ms, sees it hot (100% > 90%) with two elephant slots and the
    # other uplink with none, and moves one: from then on each has 100 G. So 10 ms at 50 G (0.5
    # Gbit), then 0.3 Gbit at 100 G: 13 ms. Without polling: 0.8 Gbit at 50 G, 16 ms. (The seed also
    # gives plane B's two connections an uplink each: 8 ms there.)
    from fabric.builders import dual_plane
    from fabric.flowsim import plan_connections
    from fabric.routing import AdaptivePolicy

    fab = dual_plane(hosts=8, hosts_per_leaf=2, spines_per_plane=2, nic_rate_gbps=200, oversubscription=2.0)
    probe = AdaptivePolicy(PathTable(fab))
    tier = probe.tier("leafA0")

    def colliding(seed):
        conns = plan_connections(fab, probe.entropy, {("h0", "h6"), ("h1", "h7")}, channels=1, ports="hashed",
                                 seed=seed)
        a = [probe.entropy.slot(tier, cs[0].sport) for cs in conns.values()]  # the plane-A connections
        b = [probe.entropy.slot(tier, cs[1].sport) for cs in conns.values()]
        port_a = {probe.port("leafA0", "leafA3", s) for s in a}
        port_b = {probe.port("leafB0", "leafB3", s) for s in b}
        return a[0] != a[1] and len(port_a) == 1 and len(port_b) == 2

    seed = next(s for s in range(1000) if colliding(s))
    size = 200_000_000
    job = Job(TransferDag((Transfer(0, 2, size), Transfer(1, 3, size)), (0, 1, 2, 3)), Placement(("h0", "h1", "h6", "h7")))

    def run_with(poll_s):
        pol = AdaptivePolicy(PathTable(fab))
        return pol, simulate(fab, pol, [job], options=SimOptions(channels=1, ports="hashed", seed=seed, poll_s=poll_s))

    pol, res = run_with(0.010)
    _, base = run_with(0.0)
    assert res.job_time_s[0] == pytest.approx(0.013, rel=1e-9)
    assert base.job_time_s[0] == pytest.approx(0.016, rel=1e-9)
    moves = [m for e in pol.events() for m in e.moves if e.cause == "congestion" and m.switch == "leafA0"]
    assert len(moves) == 1 and {moves[0].old_port, moves[0].new_port} == {1, 2}
    assert res.congestion_moves >= 1 and base.congestion_moves == 0 and base.polls == 0
    up = [res.link_index("leafA0", sw) for sw in ("spineA0", "spineA1")]
    rates = res.link_rate_bps()
    assert sorted(rates[0, up]) == pytest.approx([0.0, 100e9])  # before the move: one uplink for both
    assert max(rates[:, up].sum(axis=1)) == pytest.approx(200e9)  # after it: both uplinks full


def test_the_array_form_of_a_dag_runs_as_the_object_form():
    # the same ring, given as objects and as columns: the same times for every transfer
    from traffic.collectives import schedule_columns
    fab = topofile.load("pyramid-16")
    ranks = list(range(16))[::-1]
    jobs_obj = [Job(schedule("all_reduce", 3_000_001, ranks, "ring"), one_rank_per_host(fab, 16))]
    jobs_col = [Job(schedule_columns("all_reduce", 3_000_001, ranks, "ring"), one_rank_per_host(fab, 16))]
    _, a = run("pyramid-16", jobs_obj)
    _, b = run("pyramid-16", jobs_col)
    assert np.array_equal(a.transfer_end_s, b.transfer_end_s)
    assert np.array_equal(a.transfer_start_s, b.transfer_start_s)


def test_flows_ending_within_the_resolution_end_as_one_event():
    # leaf-spine-16: h0 -> h1 and h2 -> h3 (all on leafA0), disjoint 400 G NIC links, each transfer two
    # flows of 200 G (channels=2). Sizes S and S + 1 bytes: parts of S/2 bytes, and S/2 + 1 and S/2.
    # When the S/2-byte flows end, the extra byte's flow has its NIC link to itself: 8 / 400e9 more.
    fab = topofile.load("leaf-spine-16")
    size = 10_000_000
    dag = TransferDag((Transfer(0, 1, size), Transfer(2, 3, size + 1)), (0, 1, 2, 3))
    place = one_rank_per_host(fab, 4)
    exact_s = size // 2 * 8 / 200e9 + 8 / 400e9
    _, fine = run("leaf-spine-16", [Job(dag, place)], options=SimOptions(resolution_s=0.0))
    assert fine.job_time_s[0] == pytest.approx(exact_s, rel=1e-12)
    assert len(fine.edges_s) == 3  # start, the S-byte transfer's end, the (S+1)-byte one's
    _, coarse = run("leaf-spine-16", [Job(dag, place)])  # default: 1 ns
    assert len(coarse.edges_s) == 2  # one end for both
    assert coarse.job_time_s[0] == pytest.approx(size / 2 * 8 / 200e9, rel=1e-12)
    assert abs(coarse.job_time_s[0] - exact_s) <= 1e-9
    with pytest.raises(FlowSimError, match="resolution_s"):
        SimOptions(resolution_s=-1.0).check()


def test_events_due_within_the_resolution_are_taken_with_the_first():
    # leaf-spine-16: h0 -> h1 and h2 -> h3, disjoint 400 G NIC links (2 flows of 200 G each), so a transfer
    # of S bytes takes S x 8 / 400e9 alone whenever it starts. Jobs start at 0, 2 us and 8 us: exactly, at
    # those times; at a 5 us resolution the 2 us start is taken with the one at 0 (2 us early), the 8 us one
    # is not (it falls due 3 us past the window), and one rate computation serves both first jobs.
    fab = topofile.load("leaf-spine-16")
    size = 4_000_000
    alone_s = size * 8 / 400e9
    place = one_rank_per_host(fab, 6)
    jobs = [Job(TransferDag((Transfer(0, 1, size),), (0, 1, 2, 3, 4, 5)), place, start_s=0.0),
            Job(TransferDag((Transfer(2, 3, size),), (0, 1, 2, 3, 4, 5)), place, start_s=2e-6),
            Job(TransferDag((Transfer(4, 5, size),), (0, 1, 2, 3, 4, 5)), place, start_s=8e-6)]
    _, fine = run("leaf-spine-16", jobs, options=SimOptions(resolution_s=0.0))
    assert fine.job_start_s == pytest.approx([0.0, 2e-6, 8e-6], abs=1e-15)
    assert fine.job_end_s == pytest.approx([alone_s, 2e-6 + alone_s, 8e-6 + alone_s], rel=1e-12)
    _, coarse = run("leaf-spine-16", jobs, options=SimOptions(resolution_s=5e-6))
    assert coarse.job_start_s == pytest.approx([0.0, 0.0, 8e-6], abs=1e-15)
    assert coarse.job_end_s == pytest.approx([alone_s, alone_s, 8e-6 + alone_s], rel=1e-12)
    assert coarse.rate_updates < fine.rate_updates
