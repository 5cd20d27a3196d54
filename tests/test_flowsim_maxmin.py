"""Max-min fair sharing in the flow-level simulator: the compiled, the vectorised and the reference rates.

Expected values are worked out by hand in the comments, or by an independent method: the bottleneck
characterisation of max-min fairness, and (where scipy is installed) a linear-programming
formulation."""
from __future__ import annotations

import random

import numpy as np
import pytest

from fabric.flowsim import (
    FlowSimError,
    incidence,
    max_min_rates,
    max_min_rates_on_paths,
    max_min_rates_reference,
    max_min_rates_vectorised,
)

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
