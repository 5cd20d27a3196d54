"""Memoised link reactions against the reference computation: the same slot tables, live ports,
OpenFlow changes and events, link by link (failure, then recovery) and along random walks of
failures, recoveries, operator moves and congestion moves. The reference is the same policy class
with `link_memo = False` (every event recomputed), so two code paths are compared; the test also
checks that the memoised side really answered from its memo."""
from __future__ import annotations

import random

import pytest

from controller.core import ControllerCore
from fabric import topofile
from fabric.builders import dual_plane
from fabric.routing import AdaptivePolicy, EcmpPolicy, RoutingPolicy
from tests.policies import LastPortPolicy


class ReferenceAdaptive(AdaptivePolicy):
    link_memo = False


class ReferenceEcmp(EcmpPolicy):
    link_memo = False


REFERENCE = {"adaptive": ReferenceAdaptive, "ecmp": ReferenceEcmp}


#: mesh planes of 5 leaves: every leaf pair has a direct link and 3 two-hop detours (backups)
BUILT = {"dual-mesh-10": lambda: dual_plane(hosts=10, hosts_per_leaf=2, plane_kind="mesh")}


def load(topo):
    return BUILT[topo]() if topo in BUILT else topofile.load(topo)


def switch_links(fab):
    return [(l.a.node, l.a.port) for l in fab.links
            if l.a.node in fab.switch_by_name and l.b.node in fab.switch_by_name]


def pair(fab, mode):
    fast = ControllerCore(fab, mode)
    ref = ControllerCore(fab, REFERENCE[mode])
    assert fast.policy.link_memo and not ref.policy.link_memo
    return fast, ref


def state(core, keys):
    p = core.policy
    return ({k: p.slots(*k) for k in p.decision_points()}, {k: p.alive(*k) for k in keys},
            {l for l in p.directed_links() if not p.is_up(l)})


def event_log(core):
    return [(e.time_s, e.cause, e.trigger, e.moves) for e in core.policy.events()]


def same_after(fast, ref, call, keys):
    """Run one event on both controllers; they must return the same changes and end in the same state."""
    got, want = call(fast), call(ref)
    assert got == want
    assert state(fast, keys) == state(ref, keys)
    return got


def link_event(switch, port, up, now):
    return lambda core: core.on_port_status(core.fabric.switch_by_name[switch].dpid, port, up, now)


def count_recomputes(core):
    calls = []
    inner = core.policy._update_liveness

    def counted(*args):
        calls.append(args[:2])
        return inner(*args)

    core.policy._update_liveness = counted
    return calls


def check_links(fab, mode, links):
    fast, ref = pair(fab, mode)
    keys = list(fast.policy._alive)
    assert fast.precompute_failures(links) == len(links)
    assert state(fast, keys) == state(ref, keys)  # precomputing leaves the state as it was
    recomputed = count_recomputes(fast)
    now = 1.0
    for _ in range(2):  # the second round finds the recoveries in the memo too
        for sw, port in links:
            same_after(fast, ref, link_event(sw, port, False, now), keys)
            same_after(fast, ref, link_event(sw, port, True, now + 0.5), keys)
            now += 1
    assert event_log(fast) == event_log(ref)
    assert sum(len(e.moves) for e in fast.policy.events()) > 0 or mode == "ecmp"
    # every failure was a lookup; only the first round's recoveries were computed
    assert len(recomputed) == len(links), recomputed[:5]


@pytest.mark.parametrize("mode", ["adaptive", "ecmp"])
@pytest.mark.parametrize("topo", ["dual-plane-16", "pyramid-16", "leaf-spine-16", "dual-mesh-10"])
def test_every_link_fails_and_recovers_as_the_reference_computes_it(topo, mode):
    fab = load(topo)
    check_links(fab, mode, switch_links(fab))


@pytest.mark.parametrize("topo", ["dual-plane-1024", "pyramid-1024"])
def test_a_sample_of_1024_host_links_fails_and_recovers_as_the_reference_computes_it(topo):
    fab = topofile.load(topo)
    check_links(fab, "adaptive", random.Random(3).sample(switch_links(fab), 12))


@pytest.mark.parametrize("topo", ["dual-plane-16", "pyramid-16", "leaf-spine-16", "dual-mesh-10"])
def test_random_walks_of_failures_moves_and_congestion_match_the_reference(topo):
    """Several links down at once, repeated states (memo hits), and slot maps changed by operators
    and congestion between link events (memo entries that no longer hold)."""
    fab = load(topo)
    fast, ref = pair(fab, "adaptive")
    keys = list(fast.policy._alive)
    fast.precompute_failures()
    recomputed = count_recomputes(fast)
    rng = random.Random(11)
    links = switch_links(fab)[:6]  # few links: states repeat
    points = fast.policy.decision_points()
    now = 1.0
    n_events = 0
    for _ in range(400):
        now += 1
        roll = rng.random()
        if roll < 0.75:
            sw, port = rng.choice(links)
            same_after(fast, ref, link_event(sw, port, rng.random() < 0.5, now), keys)
            n_events += 1
        elif roll < 0.85:
            sw, dest = rng.choice(points)
            slot = rng.randrange(len(fast.policy.slots(sw, dest)))
            alive = fast.policy.alive(sw, dest)
            if alive:
                port = rng.choice(alive)
                same_after(fast, ref, lambda c: c.on_manual_move(sw, dest, slot, port, now), keys)
        elif roll < 0.92:
            pinned = [k for k in points if fast.policy.pinned(*k)]
            if pinned:
                sw, dest = rng.choice(pinned)
                same_after(fast, ref, lambda c: c.on_release(sw, dest, None, now), keys)
        else:
            sw, dest = rng.choice(points)
            slots = fast.policy.slots(sw, dest)
            port = slots[0]
            cap = fast.policy.capacity_bps((sw, port))
            rates = {(sw, dest, s): 0.3 * cap for s, p in enumerate(slots) if p == port}
            for core in (fast, ref):
                core.last_slot_rates_bps.clear()
                core.last_slot_rates_bps.update(rates)
                core.policy.forget_loads()
            same_after(fast, ref, lambda c: c.on_loads({(sw, port): cap}, now), keys)
    assert event_log(fast) == event_log(ref)
    causes = {e.cause for e in ref.policy.events()}
    assert {"failure", "recovery", "manual", "congestion"} <= causes, causes
    assert 0 < len(recomputed) < n_events  # some events were lookups, some recomputed


def test_a_policy_with_its_own_reaction_is_never_memoised():
    assert AdaptivePolicy.link_memo and EcmpPolicy.link_memo and RoutingPolicy.link_memo
    assert not LastPortPolicy.link_memo  # overrides react_to_link

    class OwnRemap(AdaptivePolicy):
        def _remap(self, key, cause):
            return []

    class Declared(LastPortPolicy):
        link_memo = True

    assert not OwnRemap.link_memo and Declared.link_memo


def test_a_recovery_that_does_not_restore_the_state_before_the_failure_is_not_taken_for_it():
    # dual-plane-16: leafA0 reaches leafA3 by port 1 (spineA0) and port 2 (spineA1). A congestion
    # move takes one of slots 0 and 2 off port 1; spineA0's link to leafA3 fails and recovers,
    # which puts every slot back on its all-up port (not where congestion had it); the failure
    # again must start from there, not from the memo of the first failure.
    fab = topofile.load("dual-plane-16")
    fast, ref = pair(fab, "adaptive")
    keys = list(fast.policy._alive)
    for core in (fast, ref):
        cap = core.policy.capacity_bps(("leafA0", 1))
        core.last_slot_rates_bps.update({("leafA0", "leafA3", s): 0.3 * cap for s in (0, 2)})
    same_after(fast, ref, lambda c: c.on_loads({("leafA0", 1): cap}, 1.0), keys)
    assert fast.policy.slots("leafA0", "leafA3") != fast.policy.base_slots("leafA0", "leafA3")
    recomputed = count_recomputes(fast)
    for now in (2.0, 4.0):
        same_after(fast, ref, link_event("spineA0", 4, False, now), keys)
        same_after(fast, ref, link_event("spineA0", 4, True, now + 1), keys)
    assert fast.policy.slots("leafA0", "leafA3") == fast.policy.base_slots("leafA0", "leafA3")
    assert event_log(fast) == event_log(ref)
    assert len(recomputed) == 3  # the second recovery, from the same state as the first, is a lookup


def test_mesh_detours_are_the_same_from_the_memo_as_computed_by_hand():
    # dual-mesh-10, plane A: leafA0's ports 1..4 go to leafA1..leafA4, leafA1's ports 1..4 to leafA0,
    # leafA2..leafA4 (the builder's wiring order). leafA0 -- leafA1 fails: towards leafA1 the 16
    # slots of leafA0 go round the detours leafA2, leafA3, leafA4 (ports 2, 3, 4): slot s -> 2 + s mod 3.
    # Then leafA2 -- leafA1 (leafA2 port 2) fails too: the slots on port 2 (0, 3, ..., 15) go to the
    # least used of 3 and 4, alternately (3 first: equal use, lower port), the others stay.
    fab = load("dual-mesh-10")
    fast, ref = pair(fab, "adaptive")
    keys = list(fast.policy._alive)
    fast.precompute_failures()
    recomputed = count_recomputes(fast)
    same_after(fast, ref, link_event("leafA0", 1, False, 1.0), keys)
    assert recomputed == []  # the memo's answer
    round_robin = tuple(2 + s % 3 for s in range(16))
    assert fast.policy.slots("leafA0", "leafA1") == round_robin
    same_after(fast, ref, link_event("leafA2", 2, False, 2.0), keys)
    on_2 = [s for s in range(16) if round_robin[s] == 2]
    want = list(round_robin)
    for i, s in enumerate(on_2):
        want[s] = 3 if i % 2 == 0 else 4
    assert fast.policy.slots("leafA0", "leafA1") == tuple(want)
    for now, (sw, port) in enumerate([("leafA2", 2), ("leafA0", 1)], start=3):
        same_after(fast, ref, link_event(sw, port, True, float(now)), keys)
    assert fast.policy.slots("leafA0", "leafA1") == (1,) * 16
    assert event_log(fast) == event_log(ref)
