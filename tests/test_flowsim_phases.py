"""Phases in the flow-level simulator: lockstep, phase replays (with and without lockstep, and the tight
phases of a DAG they need), the numbering and closure of phases, and cut-through.

Expected values are worked out by hand in the comments; a replayed run is checked against the same run
with every phase simulated."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fabric import topofile
from fabric.flowsim import FlowSimError, Job, LinkEvent, SimOptions
from fabric.transfers import Transfer, TransferDag
from tests.conftest import one_rank_per_host, run
from traffic.collectives import schedule


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
    from fabric.flowsim import phases

    results = {}
    for replay in (False, True):
        monkeypatch.setattr(phases, "PHASE_REPLAY", replay)
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
    from fabric.flowsim.shapes import _Template

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
    from fabric.flowsim.shapes import _Shape

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
    from fabric.flowsim.shapes import _Shape

    dag = TransferDag(tuple(Transfer(s, d, 1000, deps, ph) for s, d, ph, deps in transfers), (0, 1, 2))
    ranks = np.arange(3)
    tpl = _Shape(dag.columns, ranks[dag.columns.src], ranks[dag.columns.dst])
    # by hand: each listed dependency's phase against its transfer's
    by_hand = all(transfers[d][2] < ph for _, _, ph, deps in transfers for d in deps)
    assert by_hand == closed
    assert tpl.phases_closed == closed
