"""Max-min rates re-solved only in the connected components a change touched (`fabric.flowsim.flows.Flows._solve`):
the components by hand, and a simulation with churn (random sizes, dependencies and hashed ports) giving every
transfer the same times as solving every flow each time."""
from __future__ import annotations

import random

import numpy as np
import pytest

from fabric.flowsim import Job, SimOptions, flows as flows_mod, maxmin
from fabric.transfers import Transfer, TransferDag
from tests.conftest import one_rank_per_host, run


def test_the_components_of_changed_links_by_hand():
    # flows 0 (links 0, 1) and 1 (links 1, 2) share link 1: one component; flow 2 (link 3) alone; flow 3 (links 4,
    # 5) alone. A change on link 2 touches flows 0 and 1 only; on link 5 flow 3 only; on link 6 (no flow) none.
    from fabric.flowsim import _fill

    paths = np.array([[0, 1], [1, 2], [3, -1], [4, 5]], dtype=np.int64)
    assert _fill.touched_flows(paths, 7, np.array([2])).tolist() == [True, True, False, False]
    assert _fill.touched_flows(paths, 7, np.array([5, -1])).tolist() == [False, False, False, True]
    assert _fill.touched_flows(paths, 7, np.array([6])).tolist() == [False, False, False, False]
    # kept rates stay where nothing changed; the touched component is filled again: link 1 (cap 10) shared by
    # flows 0 and 1 gives 5 each; flow 3's old rate 7 is kept though its link could give more
    cap = np.full(7, 10.0)
    rates, load = maxmin.rates_on_routed_paths_again(paths, cap, np.array([2]), np.array([1.0, 1.0, 3.0, 7.0]))
    assert rates.tolist() == [5.0, 5.0, 3.0, 7.0]
    assert load.tolist() == [5.0, 10.0, 5.0, 3.0, 7.0, 7.0, 0.0]


def churn(seed: int, n: int = 120):
    """Transfers between random hosts of leaf-spine-16, random sizes, each waiting for up to two earlier ones."""
    rng = random.Random(seed)
    ts = []
    for i in range(n):
        a, b = rng.sample(range(16), 2)
        deps = tuple(sorted(rng.sample(range(i), min(i, rng.randint(0, 2)))))
        ts.append(Transfer(a, b, rng.choice([2**16, 2**20, 3 * 2**20, 2**23]), deps))
    return TransferDag(tuple(ts), tuple(range(16)))


@pytest.mark.parametrize("seed", range(4))
def test_a_simulation_with_churn_gives_the_times_of_solving_every_flow(seed, monkeypatch):
    from fabric import topofile

    fab = topofile.load("leaf-spine-16")
    opts = SimOptions(channels=1, ports="hashed", seed=seed)
    _, fast = run("leaf-spine-16", [Job(churn(seed), one_rank_per_host(fab, 16))], options=opts)
    calls = []

    def whole(paths, capacity_bps, dirty_links, rates):  # every flow solved again, as before
        calls.append(1)
        return maxmin.rates_on_routed_paths(paths, capacity_bps)

    monkeypatch.setattr(flows_mod, "rates_on_routed_paths_again", whole)
    _, slow = run("leaf-spine-16", [Job(churn(seed), one_rank_per_host(fab, 16))], options=opts)
    assert calls  # the incremental path was taken in the first run, at these solves
    assert np.allclose(fast.transfer_end_s, slow.transfer_end_s, rtol=1e-9, atol=0)
    assert fast.events == slow.events
