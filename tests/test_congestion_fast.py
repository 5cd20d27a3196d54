"""Congestion in milliseconds: hot links found on port counters polled every 10 ms, the slot to move
chosen from the last known slot rates (or presumed ones for slots that just started), confirmed by
the samples that follow. Driven by the fluid model on the congestion benchmark's fabric, polled on
the controller's schedule (`tests.fluid`, `flow_poll_s`).

The fabric, by hand (`dual_plane(hosts=8, hosts_per_leaf=2, spines_per_plane=2, nic_rate_gbps=200,
oversubscription=2.0)`): per plane 4 leaves with 2 hosts each; leaf uplinks 2 x 100G (2:1), host NICs
200G; at 1e-4 a 100G uplink is 10 Mbit/s. leafA0's port 1 goes to spineA0, port 2 to spineA1. h0, h1
are on leafA0, h6, h7 on leafA3. Source port 49152 is slot 0 at the leaf tier, 49156 slot 2
((port >> 1) & 15); with two uplinks slot s takes port (s mod 2) + 1: both on port 1.
Port rates are over >= 20 ms (two polls, `port_window_s`), smoothed by the policy's EWMA (0.5);
a link turns hot at 0.9 of capacity and cools below 0.7.
"""
from __future__ import annotations

import pytest

from controller.core import ControllerCore
from fabric.builders import dual_plane
from tests.fakeoftable import FakeFabric
from tests.fluid import Flow, Fluid

SCALE = 1e-4
UPLINK_BPS = 100e9 * SCALE
POLL_S = 0.01
UP1, UP2 = ("leafA0", 1), ("leafA0", 2)


def bench(fabric_kw=None, **core_kw):
    fab = dual_plane(**(fabric_kw or dict(hosts=8, hosts_per_leaf=2, spines_per_plane=2, nic_rate_gbps=200,
                                          oversubscription=2.0)))
    core = ControllerCore(fab, "adaptive", rate_scale=SCALE, flow_window_s=1.0, **core_kw)
    fake = FakeFabric(fab)
    for sw in fab.switches:
        fake.apply(core.on_switch_connect(sw.dpid))
    return fab, core, fake


def uplink(fluid, flow):
    return next(l for l in fluid.links(flow) if l in (UP1, UP2))


def congestion_moves(core):
    return [m for e in core.policy.events() for m in e.moves if m.cause == "congestion"]


def polls_until_a_move(fluid, limit):
    for n in range(1, limit + 1):
        if fluid.round(POLL_S):
            return n
    return None


def test_long_lived_elephants_colliding_are_split_within_five_port_polls_on_old_slot_rates():
    fab, core, fake = bench()
    # two senders that offer 4 Mbit/s each share uplink 1 (0.8 of it: not hot) for 2.5 s; the flow
    # polls at 1 s and 2 s give their slot rates (4 Mbit/s over 1 s windows); they are long-lived,
    # no longer newcomers (a slot is one for a flow window after it was first seen sending)
    capped = [Flow("h0", "h6", 49152, max_bps=0.4 * UPLINK_BPS), Flow("h1", "h7", 49156, max_bps=0.4 * UPLINK_BPS)]
    fluid = Fluid(core, fake, capped, SCALE, flow_poll_s=1.0)
    assert [uplink(fluid, f) for f in capped] == [UP1, UP1]
    for _ in range(25):
        fluid.round(0.1)
    assert congestion_moves(core) == [] and UP1 not in core.policy.hot_links()
    assert core.newcomers(fluid.now) == {}
    assert core.last_slot_rates_bps[("leafA0", "leafA3", 0)] == pytest.approx(0.4 * UPLINK_BPS)
    assert core.last_slot_rates_bps[("leafA0", "leafA3", 2)] == pytest.approx(0.4 * UPLINK_BPS)
    # onset at 2.5 s: both send as fast as they can; uplink 1 runs full (5 Mbit/s each). By hand:
    # poll 1 (window 2.4-2.51 s): (0.8 * 0.1 + 1.0 * 0.01) / 0.11 = 0.818, EWMA 0.809;
    # poll 2 (window 2.5-2.52 s): 1.0, EWMA 0.905 >= 0.9: hot, and a move at once. Bound: 5 polls.
    fluid.flows = [Flow(f.src, f.dst, f.src_port) for f in capped]
    n = polls_until_a_move(fluid, 10)
    assert n is not None and n <= 5, n
    assert n == 2  # by hand, above
    # decided on the port sample, with the slot rates of the flow poll 0.5 s before
    assert fluid.moves_on_port_samples == 1 and fluid.moves_on_flow_replies == 0
    assert fluid.last_flow_poll_s == pytest.approx(2.0)
    (move,) = congestion_moves(core)
    assert (move.switch, move.dest, move.old_port, move.new_port) == ("leafA0", "leafA3", 1, 2)
    assert move.slot in (0, 2)
    assert sorted(uplink(fluid, f) for f in fluid.flows) == [UP1, UP2]
    # no flapping: 3 s more of 10 ms polls (three background flow polls among them): nothing moves,
    # each flow has an uplink of its own (10 Mbit/s each, its NIC has 20)
    moved = next(f for f in fluid.flows if uplink(fluid, f) == UP2)
    assert sum(fluid.round(POLL_S) for _ in range(300)) == 0
    assert uplink(fluid, moved) == UP2
    assert [r / UPLINK_BPS for r in fluid.rates_bps] == pytest.approx([1.0, 1.0])


def test_brand_new_elephants_are_split_on_the_urgent_flow_poll_within_five_port_polls():
    fab, core, fake = bench()
    fluid = Fluid(core, fake, [], SCALE, flow_poll_s=1.0)
    for _ in range(50):  # 0.5 s idle (a background flow poll at 0 s)
        fluid.round(POLL_S)
    # both start at 0.5 s at full speed: no slot rate can be known (the flow window is 1 s). By hand:
    # windowed port rate 0.5, 1, 1, 1 at polls 1-4; EWMA 0.25, 0.625, 0.8125, 0.906: hot at poll 4;
    # leafA0 (the reliever) is asked for flow statistics at once: both slots rose since 0 s with no
    # windowed rate, so they are newcomers presumed to share the link's 0.906 x 10 Mbit/s evenly
    # (4.5 Mbit/s each, elephants): one moves on that reply. Bound: 5 polls.
    fluid.flows = [Flow("h0", "h6", 49152), Flow("h1", "h7", 49156)]
    assert [uplink(fluid, f) for f in fluid.flows] == [UP1, UP1]
    n = polls_until_a_move(fluid, 10)
    assert n is not None and n <= 5, n
    assert n == 4  # by hand, above
    assert fluid.moves_on_flow_replies == 1 and fluid.moves_on_port_samples == 0
    (move,) = congestion_moves(core)
    assert (move.switch, move.dest, move.old_port, move.new_port, move.slot) == ("leafA0", "leafA3", 1, 2, 0)
    assert sorted(uplink(fluid, f) for f in fluid.flows) == [UP1, UP2]
    assert sum(fluid.round(POLL_S) for _ in range(300)) == 0
    assert [r / UPLINK_BPS for r in fluid.rates_bps] == pytest.approx([1.0, 1.0])


def _known_pair_at(share):
    """Two senders offering `share` of the uplink each, sharing it, with their slot rates known."""
    fab, core, fake = bench()
    flows = [Flow("h0", "h6", 49152, max_bps=share * UPLINK_BPS), Flow("h1", "h7", 49156, max_bps=share * UPLINK_BPS)]
    fluid = Fluid(core, fake, flows, SCALE, flow_poll_s=1.0)
    for _ in range(12):
        fluid.round(0.1)
    for _ in range(5):
        fluid.round(POLL_S)
    assert core.policy.utilisation(UP1) == pytest.approx(2 * share)
    return core, fluid, flows


@pytest.mark.parametrize("burst_polls, moves", [(2, 0), (3, 1)])
def test_a_short_burst_stays_below_the_hysteresis_and_moves_nothing(burst_polls, moves):
    # 0.6 of the uplink, then both send flat out for `burst_polls` polls (the link full), then 0.6 again.
    # By hand, windowed rates (20 ms) and EWMA from 0.6:
    #   2 polls (20 ms): 0.8, 1.0, 0.8, 0.6 -> 0.7, 0.85, 0.825, 0.71: never 0.9, nothing moves;
    #   3 polls (30 ms): 0.8, 1.0, 1.0 -> 0.7, 0.85, 0.925: hot, and the known elephants split.
    core, fluid, capped = _known_pair_at(0.3)
    for _ in range(burst_polls):
        fluid.flows = [Flow(f.src, f.dst, f.src_port) for f in capped]
        fluid.round(POLL_S)
    fluid.flows = capped
    for _ in range(100):
        fluid.round(POLL_S)
    assert len(congestion_moves(core)) == moves


def test_a_move_whose_effect_does_not_show_is_not_repeated_within_the_hold():
    # 16 hosts, 4 per leaf, 4 spines per plane, NICs 200G, 2:1: leafA0 has 4 uplinks of 100G (10 Mbit/s),
    # port p to spineA(p-1). Three flows from leafA0 (h0, h1, h2) to three other leaves (h4 on
    # leafA1, h8 on leafA2, h12 on leafA3), each in slot 0, all take uplink 1: three decision points
    # (one per destination), so each one's own hold does not stop the others.
    kw = dict(hosts=16, hosts_per_leaf=4, spines_per_plane=4, nic_rate_gbps=200, oversubscription=2.0)
    fab, core, fake = bench(kw)
    assert core.policy._capacity_bps[UP1] == pytest.approx(UPLINK_BPS)
    capped = [Flow(s, d, 49152, max_bps=0.25 * UPLINK_BPS) for s, d in (("h0", "h4"), ("h1", "h8"), ("h2", "h12"))]
    fluid = Fluid(core, fake, capped, SCALE, flow_poll_s=1.0)
    assert {fluid.links(f)[1] for f in capped} == {UP1}
    for _ in range(15):
        fluid.round(0.1)  # 0.75 of the uplink, not hot; slot rates known (a quarter of it each)
    assert congestion_moves(core) == []
    fluid.apply = False  # from now on the controller's changes never reach the switches
    fluid.flows = [Flow(f.src, f.dst, f.src_port) for f in capped]  # flat out: the uplink full
    n = polls_until_a_move(fluid, 10)
    assert n is not None and n <= 5, n
    assert len(congestion_moves(core)) == 1
    t_move = fluid.now
    # in fact 3 elephants still on uplink 1 and it stays hot; in the policy's view 2, with two empty
    # uplinks left, so another destination's slot would move at once: the hold (0.2 s) waits for
    # the samples to confirm the first move
    hold_s = core.policy.config.hold_s
    while round(fluid.now + POLL_S, 9) < t_move + hold_s - 1e-9:  # every poll within the hold
        fluid.round(POLL_S)
        assert UP1 in core.policy.hot_links()
    assert len(congestion_moves(core)) == 1
    # the hold over and the link still hot: the next move comes, from another decision point
    for _ in range(3):
        fluid.round(POLL_S)
    moves = congestion_moves(core)
    assert len(moves) == 2 and moves[0].dest != moves[1].dest


def test_a_newcomer_is_presumed_an_elephant_only_after_ten_full_size_packets():
    fab, core, fake = bench()
    p = core.policy
    p.on_loads({UP1: UPLINK_BPS}, {}, 1.0)
    assert p.hot_links() == (UP1,)
    known = {("leafA0", "leafA3", 4): 0.5 * UPLINK_BPS}  # one known elephant on uplink 1 (slot 4: port 1)
    # slot 0 sent 14,999 bytes since it started (a handshake and a little more): nothing presumed
    assert p.presume_newcomers(known, {("leafA0", "leafA3", 0): 14_999}) == known
    # newcomers slot 0 (30 kB) and slot 2 (10 kB: too little) and one known elephant share the
    # full link: newcomers' pool 1/2 of it, all to slot 0; slot 1 (30 kB) crosses uplink 2, not hot
    got = p.presume_newcomers(known, {("leafA0", "leafA3", 0): 30_000, ("leafA0", "leafA3", 2): 10_000,
                                      ("leafA0", "leafA3", 1): 30_000})
    assert got == {**known, ("leafA0", "leafA3", 0): pytest.approx(0.5 * UPLINK_BPS)}
    # two qualifying newcomers, 30 kB and 15 kB, next to the known one: their pool is 2/3 of the
    # link, split 2:1 -> 4/9 and 2/9 of it
    got = p.presume_newcomers(known, {("leafA0", "leafA3", 0): 30_000, ("leafA0", "leafA3", 2): 15_000})
    assert got[("leafA0", "leafA3", 0)] == pytest.approx(4 / 9 * UPLINK_BPS)
    assert got[("leafA0", "leafA3", 2)] == pytest.approx(2 / 9 * UPLINK_BPS)


def test_newcomers_share_their_pool_by_their_pace_not_by_their_bytes_alone():
    # Slot 0 started 0.5 s ago and sent 500 kB (8 Mbit/s); slot 2 started within the last 20 ms
    # (between two fast readings) and sent 17 kB (6.8 Mbit/s). No elephant is known on the full
    # hot uplink, so the newcomers' pool is all of it, split 8 : 6.8 by their rates. By bytes alone
    # slot 2 would get 17/517 of it, 3.3%: below the 5% of an elephant, so not moved while the link
    # it just joined is overloaded.
    fab, core, fake = bench()
    p = core.policy
    p.on_loads({UP1: UPLINK_BPS}, {}, 1.0)
    s0, s2 = ("leafA0", "leafA3", 0), ("leafA0", "leafA3", 2)
    rate = p.rate_bps(UP1)
    got = p.presume_newcomers({}, {s0: 500_000, s2: 17_000}, {s0: 0.5, s2: 0.02})
    assert got[s0] == pytest.approx(rate * 8 / 14.8) and got[s2] == pytest.approx(rate * 6.8 / 14.8)
    by_bytes = p.presume_newcomers({}, {s0: 500_000, s2: 17_000})
    assert by_bytes[s2] == pytest.approx(rate * 17 / 517) and by_bytes[s2] < p.config.min_move_share * UPLINK_BPS


def slots_0_and_2():
    """The bench's core, leafA0's dpid, and its ECMP flows and slot keys towards leafA3 for slots 0
    and 2 (both on uplink 1)."""
    fab, core, _ = bench()
    flows = tuple(core.slot_flows("leafA0", "leafA3", s, 1)[0] for s in (0, 2))
    return core, fab.switch_by_name["leafA0"].dpid, flows, (("leafA0", "leafA3", 0), ("leafA0", "leafA3", 2))


def test_a_newcomers_span_runs_from_the_reading_before_it_was_first_seen_sending():
    core, dpid, (f0, f2), (s0, s2) = slots_0_and_2()
    core.on_flow_counters(dpid, [(f0, 0, 10.0), (f2, 0, 10.0)], 1.0)
    core.on_flow_counters(dpid, [(f0, 400_000, 10.5), (f2, 0, 10.5)], 1.5)  # slot 0 started in (1.0, 1.5]
    core.on_flow_counters(dpid, [(f0, 420_000, 10.52), (f2, 17_000, 10.52)], 1.52)  # slot 2 in (1.5, 1.52]
    assert core.newcomers(1.52) == {s0: 420_000, s2: 17_000}
    assert core.newcomer_spans_s() == {s0: pytest.approx(0.52), s2: pytest.approx(0.02)}
    core.on_flow_counters(dpid, [(f0, 440_000, 10.55), (f2, 30_000, 10.55)], 1.55)
    assert core.newcomers(1.55) == {s0: 440_000, s2: 30_000}
    assert core.newcomer_spans_s() == {s0: pytest.approx(0.55), s2: pytest.approx(0.05)}


def test_a_slot_is_a_newcomer_from_when_it_is_first_seen_sending_for_one_flow_window():
    core, dpid, (f0, f2), (s0, s2) = slots_0_and_2()
    core.on_flow_counters(dpid, [(f0, 0, 10.0), (f2, 0, 10.0)], 1.0)
    core.on_flow_counters(dpid, [(f0, 0, 11.0), (f2, 100_000, 11.0)], 2.0)  # slot 2 sent 100 kB: 0.8 Mbit/s
    assert core.last_slot_rates_bps == {s0: 0.0, s2: pytest.approx(800_000.0)}
    assert core.newcomers(2.0) == {s2: 100_000}  # its rate was 0 before: the 1 s window is diluted
    core.on_flow_counters(dpid, [(f0, 20_000, 11.3), (f2, 150_000, 11.3)], 2.3)
    assert core.newcomers(2.3) == {s2: 150_000, s0: 20_000}
    assert core.newcomers(2.999) == {s2: 150_000, s0: 20_000}
    assert core.newcomers(3.0) == {s0: 20_000}  # slot 2's window now covers its activity only
    # slot 2 sending on with a known rate is no newcomer; idle for a window, then sending, it is again
    core.on_flow_counters(dpid, [(f0, 20_000, 12.3), (f2, 250_000, 12.3)], 3.3)
    core.on_flow_counters(dpid, [(f0, 20_000, 13.3), (f2, 250_000, 13.3)], 4.3)
    assert core.newcomers(4.3) == {} and core.last_slot_rates_bps[s2] == 0.0
    core.on_flow_counters(dpid, [(f0, 20_000, 13.4), (f2, 260_000, 13.4)], 4.4)
    assert core.newcomers(4.4) == {s2: 10_000}
