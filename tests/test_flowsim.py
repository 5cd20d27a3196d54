"""The flow-level simulator: max-min fair rates, and transfer DAGs executed over the topology files.

Expected values are worked out by hand in the comments (link rates from the topology files' numbers,
ECMP choices from the documented entropy rule), or by an independent method: the bottleneck
characterisation of max-min fairness, and (where scipy is installed) a linear-programming
formulation."""
from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from fabric import topofile
from fabric.builders import dual_plane
from fabric.flowsim import (
    FlowSimError,
    Job,
    LinkEvent,
    SimOptions,
    incidence,
    max_min_rates,
    max_min_rates_on_paths,
    max_min_rates_reference,
    max_min_rates_vectorised,
    simulate,
)
from fabric.routing import AdaptivePolicy, EcmpPolicy, PathTable
from fabric.transfers import Placement, Transfer, TransferDag
from traffic.collectives import schedule

G = 1e9


def both(paths, caps):
    """The compiled, the vectorised and the reference rates, each checked against the others."""
    flow, link = incidence(paths)
    fast = max_min_rates(len(paths), flow, link, np.asarray(caps, dtype=float))
    vec = max_min_rates_vectorised(len(paths), flow, link, np.asarray(caps, dtype=float))
    ref = max_min_rates_reference(paths, caps)
    assert fast == pytest.approx(ref, rel=1e-9)
    assert vec == pytest.approx(ref, rel=1e-9)
    return list(fast)


def is_max_min_fair(paths, caps, rates, rel=1e-7):
    """Feasible, and every flow has a bottleneck: a full link on which no flow gets more than it
    (the characterisation of the max-min fair allocation; independent of progressive filling)."""
    load = [0.0] * len(caps)
    for f, path in enumerate(paths):
        for l in path:
            load[l] += rates[f]
    if any(load[l] > caps[l] * (1 + rel) for l in range(len(caps))):
        return False
    for f, path in enumerate(paths):
        if not any(load[l] >= caps[l] * (1 - rel) and
                   all(rates[g] <= rates[f] * (1 + rel) for g, p in enumerate(paths) if l in p) for l in path):
            return False
    return True


# ---- max-min fair sharing --------------------------------------------------------------------------

def test_two_flows_on_one_bottleneck_get_half_each():
    # link 0: 10 Gbit/s, shared by both; link 1: 100 Gbit/s, only flow 1
    assert both([[0], [0, 1]], [10 * G, 100 * G]) == pytest.approx([5 * G, 5 * G])


def test_three_flows_over_two_bottlenecks():
    # L0 = 10 G carries A and B; L1 = 16 G carries B and C.
    # Level rises together: L0 fills at 10/2 = 5 (before L1 at 16/2 = 8), so A = B = 5 and freeze.
    # L1 has 16 - 5 = 11 left, all for C: C = 11.
    assert both([[0], [0, 1], [1]], [10 * G, 16 * G]) == pytest.approx([5 * G, 5 * G, 11 * G])


def test_four_flows_three_levels():
    # L0 = 3 carries a, b, c; L1 = 5 carries c, d; L2 = 12 carries d.
    # Shares: L0 3/3 = 1, L1 5/2 = 2.5, L2 12/1: L0 fills first, a = b = c = 1.
    # Then L1 has 5 - 1 = 4 for d alone, L2 has 12: d = 4.
    assert both([[0], [0], [0, 1], [1, 2]], [3 * G, 5 * G, 12 * G]) == pytest.approx([1 * G, 1 * G, 1 * G, 4 * G])


def random_case(rng: random.Random, n_flows: int, n_links: int) -> tuple[list[list[int]], list[float]]:
    caps = [rng.choice([1, 2, 3, 5, 8, 10, 40]) * G for _ in range(n_links)]
    paths = [sorted(rng.sample(range(n_links), rng.randint(1, min(4, n_links)))) for _ in range(n_flows)]
    return paths, caps


def test_compiled_vectorised_and_reference_agree_and_are_max_min_fair_on_random_cases():
    rng = random.Random(7)
    for _ in range(200):
        paths, caps = random_case(rng, rng.randint(1, 12), rng.randint(1, 8))
        rates = both(paths, caps)
        assert is_max_min_fair(paths, caps, rates), (paths, caps, rates)


def test_compiled_and_vectorised_agree_on_large_cases_with_many_levels():
    # hundreds of flows over random paths with capacities of many sizes: many distinct levels, and
    # links that fill at one level together; the reference would take too long at this size
    rng = np.random.default_rng(11)
    for n_flows, n_links in ((400, 60), (3000, 500)):
        caps = rng.choice([1, 2, 3, 5, 7, 10, 25, 40, 100], size=n_links).astype(float) * G
        paths = [rng.choice(n_links, size=int(rng.integers(1, 6)), replace=False).tolist() for _ in range(n_flows)]
        flow, link = incidence(paths)
        fast = max_min_rates(n_flows, flow, link, caps)
        vec = max_min_rates_vectorised(n_flows, flow, link, caps)
        assert len(np.unique(np.round(vec / G, 9))) > 20  # many levels: the case the heap is for
        assert fast == pytest.approx(vec, rel=1e-9)
        assert is_max_min_fair(paths, caps, list(fast))


def test_rates_on_padded_paths_are_those_of_the_incidence_with_each_links_load():
    rng = random.Random(5)
    for _ in range(50):
        paths, caps = random_case(rng, rng.randint(1, 12), rng.randint(1, 8))
        width = max(len(p) for p in paths) + 2
        # rows padded with -1, a link repeated in some rows (it counts once)
        padded = np.full((len(paths), width), -1)
        for f, p in enumerate(paths):
            row = p + p[:1] if rng.random() < 0.3 else p
            padded[f, :len(row)] = row
        rates, load = max_min_rates_on_paths(padded, np.asarray(caps, dtype=float))
        ref = max_min_rates_reference(paths, caps)
        assert list(rates) == pytest.approx(ref, rel=1e-9)
        by_hand = [sum(ref[f] for f, p in enumerate(paths) if l in p) for l in range(len(caps))]
        assert list(load) == pytest.approx(by_hand, rel=1e-9)
    with pytest.raises(FlowSimError, match="flow 1 crosses no link"):
        max_min_rates_on_paths(np.array([[0, -1], [-1, -1]]), np.array([1.0]))
    with pytest.raises(FlowSimError, match="outside"):
        max_min_rates_on_paths(np.array([[0, 3]]), np.array([1.0]))


def test_the_fairness_check_rejects_an_unfair_allocation():
    # the three-flow case with C given only 8: feasible but C has no bottleneck
    assert not is_max_min_fair([[0], [0, 1], [1]], [10 * G, 16 * G], [5 * G, 5 * G, 8 * G])
    assert is_max_min_fair([[0], [0, 1], [1]], [10 * G, 16 * G], [5 * G, 5 * G, 11 * G])


def lp_max_min(paths, caps):
    """Max-min fair rates by iterated LPs: maximise the least unfrozen rate t; then each unfrozen
    flow that cannot exceed t while the others keep t is frozen at t; repeat."""
    linprog = pytest.importorskip("scipy.optimize").linprog
    caps = np.asarray(caps) / G  # in Gbit/s: well scaled for the solver
    n, m = len(paths), len(caps)
    a_ub = np.zeros((m, n))
    for f, path in enumerate(paths):
        for l in path:
            a_ub[l, f] = 1
    fixed: dict[int, float] = {}
    while len(fixed) < n:
        free = [f for f in range(n) if f not in fixed]
        # variables: rates r_0..r_{n-1}, then t; maximise t; r_f >= t for free f; r_f = fixed
        a = np.hstack([a_ub, np.zeros((m, 1))])
        rows = [np.eye(1, n + 1, f)[0] * -1 + np.eye(1, n + 1, n)[0] for f in free]  # t - r_f <= 0
        # a frozen flow keeps its rate (less a hair, so rounding cannot make the rest infeasible)
        held = [(fixed[f] * (1 - 1e-9), fixed[f]) if f in fixed else (0, None) for f in range(n)]
        bounds = held + [(0, None)]
        res = linprog(-np.eye(1, n + 1, n)[0], A_ub=np.vstack([a, *rows]), b_ub=np.concatenate([caps, np.zeros(len(free))]),
                      bounds=bounds, method="highs")
        assert res.status == 0
        t = res.x[n]
        for f in free:
            # can f exceed t with every other free flow at >= t?
            rows_f = [np.eye(1, n, g)[0] * -1 for g in free if g != f]
            b_f = [-t * (1 - 1e-9)] * len(rows_f)
            res_f = linprog(-np.eye(1, n, f)[0], A_ub=np.vstack([a_ub, *rows_f]) if rows_f else a_ub,
                            b_ub=np.concatenate([caps, b_f]), bounds=held, method="highs")
            assert res_f.status == 0
            if res_f.x[f] <= t * (1 + 1e-7):
                fixed[f] = t
        assert len(fixed) > n - len(free)  # some flow froze this round
    return [fixed[f] * G for f in range(n)]


def test_progressive_filling_matches_iterated_linear_programs():
    rng = random.Random(11)
    for _ in range(25):
        paths, caps = random_case(rng, rng.randint(2, 7), rng.randint(2, 5))
        assert both(paths, caps) == pytest.approx(lp_max_min(paths, caps), rel=1e-6), (paths, caps)


def test_max_min_rejects_a_flow_on_no_link_and_a_bad_capacity():
    with pytest.raises(FlowSimError, match="flow 1 crosses no link"):
        max_min_rates(2, np.array([0]), np.array([0]), np.array([1.0]))
    with pytest.raises(FlowSimError, match="flow 0 crosses no link"):
        max_min_rates_reference([[]], [1.0])
    with pytest.raises(FlowSimError, match="capacity_bps must be > 0"):
        max_min_rates(1, np.array([0]), np.array([0]), np.array([0.0]))


# ---- executing DAGs over the topology files -------------------------------------------------------

def run(topo, jobs, **kw):
    fab = topofile.load(topo)
    options = kw.pop("options", SimOptions())
    return fab, simulate(fab, EcmpPolicy(PathTable(fab)), jobs, options=options, **kw)


def one_rank_per_host(fab, n):
    return Placement(tuple(h.name for h in fab.hosts[:n]))


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
    from fabric.flowsim import executor

    fab = topofile.load("dual-plane-16")
    small = schedule("all_reduce", 2**20, list(range(16)), "ring")
    large = schedule("all_reduce", 2**30, list(range(16)), "ring")
    for replay in (False, True):
        monkeypatch.setattr(executor, "PHASE_REPLAY", replay)
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


def leaf_to_leaf(fab, size):
    """h0..h3 (leafA0) each send `size` bytes to h4..h7 (leafA1) at once."""
    return Job(TransferDag(tuple(Transfer(i, 4 + i, size) for i in range(4)), tuple(range(8))),
               one_rank_per_host(fab, 8))


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
    from fabric.flowsim import executor

    fab = topofile.load("leaf-spine-16")
    events = [LinkEvent(1e-5, "leafA0", 1), LinkEvent(3e-5, "leafA0", 1, up=True)]
    jobs = [leaf_to_leaf(fab, 2**20), dataclasses.replace(leaf_to_leaf(fab, 2**21), start_s=2e-5)]
    _, fine = run("leaf-spine-16", jobs, link_events=events)
    monkeypatch.setattr(executor, "LOAD_LOG_ENTRIES", 20)
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
    from fabric.flowsim import executor
    from traffic.collectives import schedule_columns

    fab = topofile.load("pyramid-16")
    placement = one_rank_per_host(fab, 16)
    jobs = [Job(schedule_columns("all_to_all", 3_000_001 + k * 1000, list(range(16)), "pairwise"), placement,
                start_s=k * 0.01) for k in range(6)]
    opts = SimOptions(ports="hashed")
    _, fine = run("pyramid-16", jobs, options=opts)
    monkeypatch.setattr(executor, "LOAD_LOG_ENTRIES", 300)
    _, coarse = run("pyramid-16", jobs, options=opts)
    intervals = len(fine.edges_s) - 1
    assert fine.coarsened == 0 and intervals > 1000
    assert 1 <= coarse.coarsened <= 2 * math.log2(intervals)
    assert coarse.load_ptr[-1] <= 300 and bool(np.all(np.diff(coarse.edges_s) > 0))
    assert coarse.edges_s[0] == fine.edges_s[0] and coarse.edges_s[-1] == fine.edges_s[-1]
    assert coarse.link_bytes() == pytest.approx(fine.link_bytes(), rel=1e-9, abs=1e-3)
    assert np.array_equal(coarse.job_end_s, fine.job_end_s)


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


@pytest.mark.parametrize("ports", ["planned", "hashed"])
def test_connections_are_the_replays_own(ports):
    # the simulator re-implements the replay's rule (fabric may not import traffic): same host pairs,
    # NICs, planes and source ports as the replay's plan, for its ring on dual-plane-16
    from fabric.flowsim import plan_connections
    from tests.test_replay import DP16, coll, workload
    from traffic.replay import ReplayOptions, plan_replay

    plan = plan_replay(workload([coll(size=16_000_000, n=16)], n=16), DP16,
                       ReplayOptions(channels=2, dilation=1000, ports=ports, seed=3))
    replay = {(c.src_host, c.dst_host, c.src_ip, c.dst_ip, c.sport) for c in plan.connections}
    ours = plan_connections(DP16, EcmpPolicy(PathTable(DP16)).entropy, {(c.src_host, c.dst_host)
                                                                        for c in plan.connections},
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
    replay = {(c.src_host, c.dst_host, c.lane, c.src_ip, c.dst_ip, c.sport) for c in plan.connections}
    ours = plan_connections(DP16, EcmpPolicy(PathTable(DP16)).entropy, {(c.src_host, c.dst_host, c.lane)
                                                                        for c in plan.connections},
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
    for c in plan.connections:
        by_pair.setdefault((c.src_host, c.dst_host, c.lane), []).append(c.sport)
    for job, k in zip(jobs, state.job_tpl):
        tpl = state.templates[k]
        cols = job.columns
        for i in range(len(cols)):
            a, b = plan.placement.host(int(cols.src[i])), plan.placement.host(int(cols.dst[i]))
            got = [int(state.ct.sport[c]) for c in range(state.pair_ptr[tpl.pair[i]], state.pair_ptr[tpl.pair[i] + 1])]
            assert got == by_pair[(a, b, job.lane)], (a, b, job.lane)


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


def test_lockstep_phases_start_together_and_the_job_takes_the_slowest_of_each():
    # leaf-spine-16, ranks 0..3 on h0..h3 (all on leafA0: every transfer alone on its 400 G NIC links).
    # Phase 0: 0 -> 1 of S and 2 -> 3 of 3S; phase 1: 1 -> 0 of 2S after the first, 3 -> 2 of S after
    # the second. As a DAG the chains run apart: 1 -> 0 begins at S/B and the job ends at
    # max(S + 2S, 3S + S)/B = 4S/B. In lockstep phase 1 begins when phase 0 is all delivered, at
    # 3S/B, and the job ends at (3S + max(2S, S))/B = 5S/B.
    fab = topofile.load("leaf-spine-16")
    size = 4_000_000
    dag = TransferDag((Transfer(0, 1, size), Transfer(2, 3, 3 * size),
                       Transfer(1, 0, 2 * size, deps=(0,), phase=1), Transfer(3, 2, size, deps=(1,), phase=1)),
                      (0, 1, 2, 3))
    unit_s = size * 8 / 400e9
    place = one_rank_per_host(fab, 4)
    _, dag_run = run("leaf-spine-16", [Job(dag, place)])
    _, lock = run("leaf-spine-16", [Job(dag, place)], options=SimOptions(lockstep=True))
    assert dag_run.job_time_s[0] == pytest.approx(4 * unit_s, rel=1e-9)
    assert dag_run.transfer_start_s[2] == pytest.approx(unit_s, rel=1e-9)
    assert lock.job_time_s[0] == pytest.approx(5 * unit_s, rel=1e-9)
    assert lock.transfer_start_s[2] == lock.transfer_start_s[3] == pytest.approx(3 * unit_s, rel=1e-9)
    # two such jobs one after another on one pool: each keeps its own phases
    _, two = run("leaf-spine-16", [Job(dag, place), Job(dag, place, after=(0,))],
                 options=SimOptions(lockstep=True))
    assert two.job_time_s.tolist() == pytest.approx([5 * unit_s, 5 * unit_s], rel=1e-9)


def test_a_lockstep_ring_takes_as_long_as_its_dag_with_fewer_rate_computations_under_collisions():
    # a ring over 16 ranks ordered so that every hop leaves its leaf (0, 4, 8, 12, 1, 5, ...): with
    # planned source ports every step is alike and lockstep changes nothing; with hashed ones, ECMP
    # collisions slow some flows and the DAG's steps drift apart; a ring still runs at its slowest
    # hop's pace, so lockstep (each step waiting for the slowest) takes as long, within 1%, while the
    # steps, started together, repeat each other (fewer distinct flow sets to compute rates for)
    order = [q * 4 + r for r in range(4) for q in range(4)]
    dag = schedule("all_reduce", 8_000_000, order, "ring")
    fewer = 0
    for topo in ("pyramid-16", "dual-plane-16"):
        fab = topofile.load(topo)
        for ports, seed in (("planned", 0), ("hashed", 0), ("hashed", 1), ("hashed", 2)):
            runs = [run(topo, [Job(dag, one_rank_per_host(fab, 16))],
                        options=SimOptions(ports=ports, seed=seed, lockstep=lock))[1] for lock in (False, True)]
            exact, lock = (r.job_time_s[0] for r in runs)
            assert lock == pytest.approx(exact, rel=0.01), (topo, ports, seed)
            if ports == "planned":
                assert lock == pytest.approx(exact, rel=1e-12) and runs[1].rate_updates == runs[0].rate_updates == 1
            else:
                assert runs[1].rate_updates <= runs[0].rate_updates, (topo, seed)
                fewer += runs[1].rate_updates < runs[0].rate_updates
    assert fewer >= 3


def _inside_a_step(case, fab, jobs, switch):
    """What a replay case puts inside the ring's steps: for "link down and up" the link events
    (`switch`'s port 1 down at 0.2 ms, up at 0.5 ms), returned; for "second job" an all-to-all among
    the first 8 hosts from 0.3 ms, added to `jobs`; otherwise nothing."""
    if case == "second job":
        jobs.append(Job(schedule("all_to_all", 2_000_000, list(range(8)), "pairwise"), one_rank_per_host(fab, 8),
                        start_s=3e-4))
    if case == "link down and up":
        return [LinkEvent(2e-4, switch, 1), LinkEvent(5e-4, switch, 1, up=True)]
    return []


def _with_and_without_replays(monkeypatch, topo, jobs, opts, events):
    """The same run with every phase simulated and with phase replays: (every, replayed)."""
    from fabric.flowsim import executor

    results = {}
    for replay in (False, True):
        monkeypatch.setattr(executor, "PHASE_REPLAY", replay)
        results[replay] = run(topo, jobs, options=opts, link_events=events)[1]
    assert results[False].phases_replayed == 0
    return results[False], results[True]


def _assert_same_run(every, replayed, drift_s, drift_bytes):
    """Every transfer's start and end, every job's end, every link's bytes and the log's end alike."""
    assert replayed.transfer_start_s == pytest.approx(every.transfer_start_s, rel=1e-9, abs=drift_s)
    assert replayed.transfer_end_s == pytest.approx(every.transfer_end_s, rel=1e-9, abs=drift_s)
    assert replayed.job_end_s == pytest.approx(every.job_end_s, rel=1e-9, abs=drift_s)
    assert replayed.link_bytes() == pytest.approx(every.link_bytes(), rel=1e-9, abs=drift_bytes)
    assert replayed.edges_s[-1] == pytest.approx(every.edges_s[-1], rel=1e-9, abs=drift_s)


@pytest.mark.parametrize("case", ["alone", "uneven sizes", "overheads", "link down and up", "second job"])
def test_replayed_lockstep_phases_give_the_times_and_loads_of_simulating_every_phase(monkeypatch, case):
    # a ring all-reduce over 16 ranks ordered across leaves, on pyramid-16 with hashed ports (ECMP
    # collisions, so a step has flows of several rates and several events): in lockstep its 2 x 15
    # steps are alike (same pairs, same sizes: 8 MB / 16), so the first is simulated and watched and
    # the other 29 are replayed from it; with uneven chunks (8 MB + 1 over 16) a step matches only
    # the steps whose pairs carry the same sizes. Every transfer's start and end, every job's, and
    # every link's bytes must be those of simulating every phase, also when a link event, overheads
    # or a second job fall inside phases (those are simulated)
    fab = topofile.load("pyramid-16")
    order = [q * 4 + r for r in range(4) for q in range(4)]
    size = 7_999_999 if case == "uneven sizes" else 8_000_000
    jobs = [Job(schedule("all_reduce", size, order, "ring"), one_rank_per_host(fab, 16))]
    opts = SimOptions(ports="hashed", seed=1, lockstep=True)
    if case == "overheads":
        opts = dataclasses.replace(opts, per_transfer_s=20e-6, per_hop_s=1e-6)
    events = _inside_a_step(case, fab, jobs, "tor0")
    every, replayed = _with_and_without_replays(monkeypatch, "pyramid-16", jobs, opts, events)
    if case in ("alone", "uneven sizes"):
        assert replayed.phases_replayed == 2 * 15 - 1 and replayed.events < every.events / 2
    else:
        assert replayed.phases_replayed >= 1
    uneven = case == "uneven sizes"
    _assert_same_run(every, replayed, 30 * opts.resolution_s if uneven else 1e-15, 29 * 16 if uneven else 1e-3)


def _loose_ring(size):
    """Four alike phases of a 4-rank ring (0 -> 1, 1 -> 2, 2 -> 3, 3 -> 0, each transfer of phase q + 1
    after its left neighbour's of phase q), except that phase 3's first transfer depends on phase 1's
    last only: it may begin when phase 1 ends, beside phase 2 (the DAG is not tight from phase 3)."""
    transfers = []
    for q in range(4):
        for i in range(4):
            deps = () if q == 0 else ((q - 1) * 4 + (i - 1) % 4,)
            if (q, i) == (3, 0):
                deps = (1 * 4 + 3,)
            transfers.append(Transfer(i, (i + 1) % 4, size, deps=deps, phase=q))
    return TransferDag(tuple(transfers), (0, 1, 2, 3))


def _joined_steps(size):
    """On leaf-spine-16, ranks on h0..h4: phase 0 and phase 1 alike, 0 -> 1 and 0 -> 2 (sharing h0's
    NIC, 200 G each) and 3 -> 4 (400 G alone), so each delivers at two instants; every transfer of
    phase 1 waits for all of phase 0 (nothing begins while phase 0 runs); phase 2 (twice the size)
    follows phase 1 pair by pair: its 3 -> 4 may begin when phase 1's does, halfway through it."""
    pairs = ((0, 1), (0, 2), (3, 4))
    transfers = [Transfer(a, b, size) for a, b in pairs]
    transfers += [Transfer(a, b, size, deps=(0, 1, 2), phase=1) for a, b in pairs]
    transfers += [Transfer(a, b, 2 * size, deps=(3 + i,), phase=2) for i, (a, b) in enumerate(pairs)]
    return TransferDag(tuple(transfers), (0, 1, 2, 3, 4))


@pytest.mark.parametrize("case", ["planned ring", "hashed ring", "overheads", "per-hop overheads",
                                  "link down and up", "second job", "uneven sizes", "hierarchical",
                                  "not tight", "two instants"])
def test_replayed_phases_without_lockstep_give_the_times_and_loads_of_simulating_every_phase(monkeypatch, case):
    # Without lockstep a phase is replayed only where the DAG itself makes it run alone: its watched
    # twin delivered every transfer at one instant, and every later phase waits for the one before it
    # (`_Shape.tight_from`). A ring over 16 ranks ordered across leaves, on dual-plane-16 with
    # planned source ports (every flow of a step at one rate: all but the first step replayed), on
    # pyramid-16 with hashed ones (collisions: steps drift apart), with overheads, a link event or a
    # second job inside it, uneven chunks, the hierarchical form, and a DAG that is not tight (a
    # transfer that may begin a phase early). Every transfer's start and end, every job's end and
    # every link's bytes must be those of simulating every phase.
    topo = {"hashed ring": "pyramid-16", "two instants": "leaf-spine-16"}.get(case, "dual-plane-16")
    fab = topofile.load(topo)
    order = [q * 4 + r for r in range(4) for q in range(4)]
    size = 7_999_999 if case == "uneven sizes" else 8_000_000
    dag = schedule("all_reduce", size, order, "ring")
    if case == "hierarchical":
        dag = schedule("all_reduce", size, list(range(16)), "hierarchical",
                       groups=[list(range(g * 4, g * 4 + 4)) for g in range(4)])
    if case == "not tight":
        dag = _loose_ring(size)
    if case == "two instants":
        dag = _joined_steps(size)
    jobs = [Job(dag, one_rank_per_host(fab, len(dag.ranks)))]
    opts = SimOptions(ports="hashed" if case == "hashed ring" else "planned", seed=1)
    if case == "overheads":
        opts = dataclasses.replace(opts, per_transfer_s=20e-6)
    if case == "per-hop overheads":
        opts = dataclasses.replace(opts, per_transfer_s=20e-6, per_hop_s=1e-6)
    events = _inside_a_step(case, fab, jobs, "leafA0")
    every, replayed = _with_and_without_replays(monkeypatch, topo, jobs, opts, events)
    if case in ("planned ring", "overheads", "uneven sizes"):
        assert replayed.phases_replayed == 2 * 15 - 1 and replayed.events < every.events / 5
    elif case in ("link down and up", "second job", "hierarchical"):
        assert replayed.phases_replayed >= 1
    elif case == "not tight":
        # phase 0 is watched, phase 1 begins alone, but phase 3 is loose: from phase 1 on none replayed
        assert replayed.phases_replayed == 0
        assert every.transfer_start_s[12] == pytest.approx(every.transfer_end_s[7])  # 3/0 after 1/3
        assert every.transfer_start_s[12] < every.transfer_end_s[8]  # ... beside phase 2
    elif case == "two instants":
        # phase 0 ran alone but delivered at two instants: not replayed from, as phase 2's 3 -> 4
        # begins inside phase 1 (at its own dependency's delivery)
        assert replayed.phases_replayed == 0
        assert every.transfer_start_s[8] == pytest.approx(every.transfer_end_s[5])
        assert every.transfer_start_s[8] < every.transfer_end_s[3]
    uneven = case == "uneven sizes"
    _assert_same_run(every, replayed, 30 * opts.resolution_s if uneven else 1e-15, 29 * 16 if uneven else 1e-3)


def test_the_tight_phases_of_a_dag_are_worked_out_from_its_dependencies():
    from fabric.flowsim.executor import _Template

    fab = topofile.load("dual-plane-16")
    host_index = {h.name: i for i, h in enumerate(fab.hosts)}

    def tight_from(dag):
        return _Template.of(Job(dag, one_rank_per_host(fab, len(dag.ranks))), fab, host_index, {}).shape.tight_from

    assert tight_from(schedule("all_reduce", 1_000_000, list(range(8)), "ring")) == 0
    assert tight_from(_loose_ring(1000)) == 3
    # two independent chains: phase 1 of the second depends on nothing in phase 0
    two = TransferDag((Transfer(0, 1, 10), Transfer(1, 0, 10, deps=(0,), phase=1), Transfer(2, 3, 10, phase=1)),
                      (0, 1, 2, 3))
    assert tight_from(two) == 1
    # phases out of order along the transfers (the general path): phase 2 waits for phase 0 only
    mixed = TransferDag((Transfer(0, 1, 10), Transfer(1, 2, 10, deps=(0,), phase=2),
                         Transfer(1, 0, 10, deps=(0,), phase=1)), (0, 1, 2))
    assert tight_from(mixed) == 2
    # two chains, phases 0, 1, 0, 1 along the transfers: tight
    mixed = TransferDag((Transfer(0, 1, 10), Transfer(1, 0, 10, deps=(0,), phase=1), Transfer(2, 3, 10),
                         Transfer(3, 2, 10, deps=(2,), phase=1)), (0, 1, 2, 3))
    assert tight_from(mixed) == 0


def test_cut_through_begins_with_what_it_depends_on_queues_per_pair_and_delivers_after_it():
    # leaf-spine-16, ranks 0..3 on h0..h3 (one leaf, 400 G NICs, nothing shared but a NIC); unit = S / B.
    # Store and forward vs cut-through (SimOptions.cut_through), worked by hand:
    fab = topofile.load("leaf-spine-16")
    size = 4_000_000
    unit = size * 8 / 400e9
    o = 3e-6  # a per-transfer delay, for the last case
    place = one_rank_per_host(fab, 4)

    def times(transfers, **opts):
        dag = TransferDag(tuple(transfers), (0, 1, 2, 3))
        out = []
        for ct in (False, True):
            _, res = run("leaf-spine-16", [Job(dag, place)], options=SimOptions(cut_through=ct, **opts))
            out.append((res.transfer_start_s.tolist(), res.transfer_end_s.tolist()))
        return out

    # a chain over two pairs: forwarded as it arrives, the second runs beside the first
    (s0, e0), (s1, e1) = times([Transfer(0, 1, size), Transfer(1, 2, size, deps=(0,))])
    assert e0 == pytest.approx([unit, 2 * unit]) and s0[1] == pytest.approx(unit)
    assert e1 == pytest.approx([unit, unit]) and s1 == [0.0, 0.0]
    # the second is shorter: sent at S/B, delivered only with the first (2S/B), not before
    _, (_, e1) = times([Transfer(0, 1, 2 * size), Transfer(1, 2, size, deps=(0,))])
    assert e1 == pytest.approx([2 * unit, 2 * unit])
    # the second is longer: it ends on its own, at 2S/B (store and forward: 3S/B)
    (_, e0), (_, e1) = times([Transfer(0, 1, size), Transfer(1, 2, 2 * size, deps=(0,))])
    assert e0[1] == pytest.approx(3 * unit) and e1 == pytest.approx([unit, 2 * unit])
    # one pair, two transfers: shared (both end at 2S/B) vs in turn (S/B, then 2S/B)
    (s0, e0), (s1, e1) = times([Transfer(0, 1, size), Transfer(0, 1, size)])
    assert e0 == pytest.approx([2 * unit, 2 * unit])
    assert e1 == pytest.approx([unit, 2 * unit]) and s1 == pytest.approx([0.0, unit])
    # the same sender's earlier send: waited for until sent (S/B), not only begun
    _, (s1, e1) = times([Transfer(0, 1, size), Transfer(0, 2, size, deps=(0,))])
    assert s1 == pytest.approx([0.0, unit]) and e1 == pytest.approx([unit, 2 * unit])
    # with a delay o per transfer: the chain's second is sent at S/B, its dependency delivered at
    # S/B + o, so it is delivered at S/B + 2o (store and forward: 2S/B + 2o)
    (_, e0), (_, e1) = times([Transfer(0, 1, size), Transfer(1, 2, size, deps=(0,))], per_transfer_s=o)
    assert e0 == pytest.approx([unit + o, 2 * unit + 2 * o]) and e1 == pytest.approx([unit + o, unit + 2 * o])
    with pytest.raises(FlowSimError, match="cut_through and lockstep"):
        SimOptions(cut_through=True, lockstep=True).check()


@pytest.mark.parametrize("topo, ports", [("pyramid-16", "hashed"), ("dual-plane-16", "planned")])
def test_a_cut_through_pairwise_all_to_all_takes_as_long_as_sending_every_piece_at_once(topo, ports):
    # pairwise rounds (q -> q+k after q's receive of round k-1): each round's dependency has begun at
    # once, every round is on its own pair (no queueing), and every delivery waits only for ends that
    # come no later than the job's last; so the job takes what the direct all-to-all (no dependencies)
    # takes, where store and forward runs the 15 rounds one after another
    fab = topofile.load(topo)
    place = one_rank_per_host(fab, 16)
    pairwise = schedule("all_to_all", 16_000_000, list(range(16)), "pairwise")
    direct = schedule("all_to_all", 16_000_000, list(range(16)), "direct")
    opts = SimOptions(ports=ports)
    _, ct = run(topo, [Job(pairwise, place)], options=dataclasses.replace(opts, cut_through=True))
    _, saf = run(topo, [Job(pairwise, place)], options=opts)
    _, at_once = run(topo, [Job(direct, place)], options=opts)
    assert ct.job_time_s[0] == pytest.approx(at_once.job_time_s[0], rel=1e-9)
    if topo == "pyramid-16":  # rounds that cross its oversubscribed tiers in turn
        assert saf.job_time_s[0] > 1.2 * ct.job_time_s[0]


@pytest.mark.parametrize("numbers, dense", [
    ([0, 0, 1, 1, 2], [0, 0, 1, 1, 2]),  # a ring's steps
    ([5, 9, 5, 7, 9], [0, 2, 0, 1, 2]),  # gaps and any order: ranks of the numbers present
    ([3, 10 ** 12, 3, 0], [1, 2, 1, 0]),  # numbers too sparse for a table: sorted instead
])
def test_lockstep_phases_are_numbered_densely_in_the_order_of_their_step_numbers(numbers, dense):
    from fabric.flowsim.executor import _Shape

    n = len(numbers)
    cols = TransferDag(tuple(Transfer(0, 1, 10, (), phase=p) for p in numbers), (0, 1)).columns
    tpl = _Shape(cols, np.zeros(n, dtype=np.intp), np.ones(n, dtype=np.intp))
    assert tpl.phase_of.tolist() == dense
    assert tpl.phase_size.tolist() == [dense.count(k) for k in range(max(dense) + 1)]


@pytest.mark.parametrize("transfers, closed", [
    # phases in order, every dependency in an earlier phase (a ring's steps)
    ([(0, 1, 0, ()), (1, 2, 0, ()), (1, 2, 1, (0,)), (2, 0, 1, (1,)), (0, 1, 2, (2, 3))], True),
    # phases in order, transfer 3 waits on transfer 2 of its own phase
    ([(0, 1, 0, ()), (1, 2, 0, ()), (1, 2, 1, (0,)), (2, 0, 1, (1, 2)), (0, 1, 2, (3,))], False),
    # phases in order, the same-phase dependency listed first (every dependency counts, not the last listed)
    ([(0, 1, 0, ()), (1, 2, 1, ()), (2, 0, 1, (1, 0))], False),
    # phases out of transfer order, closed: transfer 2 (phase 1) after transfer 1 (phase 0)
    ([(0, 1, 2, ()), (1, 2, 0, ()), (2, 0, 1, (1,)), (0, 1, 3, (0, 2))], True),
    # phases out of transfer order: transfer 2 (phase 0) waits on transfer 0 of the later phase 2
    ([(0, 1, 2, ()), (1, 2, 1, ()), (2, 0, 0, (0,))], False),
])
def test_phases_are_closed_when_every_dependency_is_in_an_earlier_phase(transfers, closed):
    from fabric.flowsim.executor import _Shape

    dag = TransferDag(tuple(Transfer(s, d, 1000, deps, ph) for s, d, ph, deps in transfers), (0, 1, 2))
    ranks = np.arange(3)
    tpl = _Shape(dag.columns, ranks[dag.columns.src], ranks[dag.columns.dst])
    # by hand: each listed dependency's phase against its transfer's
    by_hand = all(transfers[d][2] < ph for _, _, ph, deps in transfers for d in deps)
    assert by_hand == closed
    assert tpl.phases_closed == closed


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
