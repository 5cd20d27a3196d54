"""Faults beyond one link, on real switches with the paced probe: a whole switch down and up, and the
controller killed under traffic (the session notices, restarts it, and the data plane keeps every
packet). Loss is attributed to each event's window; the background outside is bounded separately."""
from __future__ import annotations

import time

import pytest

from fabric.errors import DeadlineError
from fabric.polling import wait_until
from tests.emulation.test_multipath import assert_background, events_matching, tx, wait_carrying

pytestmark = pytest.mark.emulation


@pytest.mark.fabric("dual-plane-16", routing="adaptive")
def test_a_spine_switch_down_and_up(lab, probe, faults):
    # slot 0 from h0 to h15 goes leafA0 -> spineA0 -> leafA3; spineA0 dies as a whole (all 4 ports)
    rate = 4000
    run = probe("h0", "h15", plane="A", sport=49152, rate_pps=rate, seconds=6)
    run.wait_sending()
    wait_carrying(lab, "spineA0", 4, rate // 4 * 64)
    down = faults.switch("spineA0", up=False)
    wait_until("failure reroutes away from spineA0", lambda: events_matching(
        lab, cause="failure", switch="leafA0", dest="leafA3"), 10)
    time.sleep(max(0.0, down.at_s + 1.5 - time.monotonic()))
    up = faults.switch("spineA0", up=True)
    wait_until("recovery back onto spineA0", lambda: events_matching(
        lab, cause="recovery", switch="leafA0", dest="leafA3"), 10)
    report = run.result()
    failure, recovery = report.window(down.at_s, 0.5), report.window(up.at_s, 0.5)
    print(f"switch down: lost {report.lost_in(*failure)} at the failure, {report.lost_in(*recovery)} at the "
          f"recovery; in flight {report.inflight_s * 1000:.0f} ms")
    assert report.lost_in(*failure) <= 0.25 * rate
    assert report.lost_in(*recovery) <= 0.25 * rate
    assert_background(report, [failure, recovery])
    # both of spineA0's leaves' links were reported: every leaf stopped using spineA0 for leafA3
    failed_at = {e["switch"] for e in events_matching(lab, cause="failure", dest="leafA3")}
    assert {"leafA0", "leafA1", "leafA2"} <= failed_at


@pytest.mark.fabric("dual-plane-16", routing="adaptive")
def test_controller_killed_under_traffic_is_noticed_restarted_and_loses_nothing(lab, probe):
    rate = 2000
    run = probe("h0", "h15", plane="A", sport=49152, rate_pps=rate, seconds=6)
    run.wait_sending()
    wait_carrying(lab, "leafA0", 1, rate // 4 * 64)
    old_pid = lab.controller.pid
    t_kill = time.monotonic()
    lab.controller.kill()  # SIGKILL, as a crash would
    gaps = wait_until("the session to restart the controller and resync", lambda: [
        g for g in lab.controller_gaps if g.synced_s is not None], 30, 0.05)
    report = run.result()
    assert lab.controller.pid != old_pid and lab.controller.alive()
    (gap,) = gaps
    assert gap.exit_code == -9 and t_kill <= gap.noticed_s <= t_kill + 1.0  # noticed within a second
    window = (t_kill - 0.005, gap.synced_s + 0.1)
    assert report.lost_in(*window) == 0, report.spans_in(*window)
    assert_background(report, [window])
    assert len(lab.controller.get("/api/status")["synced"]) == len(lab.fabric.switches)


@pytest.mark.fabric("dual-plane-16", routing="adaptive")
def test_a_flapping_link_costs_a_bounded_outage_per_flap_and_everything_returns(lab, probe, faults):
    # slot 0 from h0 to h15 crosses spineA0 -> leafA3 (spineA0 port 4); that link flaps 4 times in 4 s
    # (down 0.5 s, up 0.5 s). Each down costs the probe at most 0.25 s of packets (without a reaction
    # it would lose the 0.45 s of each window: 1800), each up likewise, nothing is lost outside the
    # windows beyond the background bound, and afterwards leafA0's slot table is what it was.
    rate, flaps = 4000, 4
    def slot_ports():
        return {dest: [s["port"] for s in rows] for dest, rows in lab.controller.get("/api/slots?switch=leafA0").items()}

    slots_before = slot_ports()
    run = probe("h0", "h15", plane="A", sport=49152, rate_pps=rate, seconds=8)
    run.wait_sending()
    wait_carrying(lab, "spineA0", 4, rate // 4 * 64)
    events = faults.flap("spineA0", 4, times=flaps, within_s=4.0)
    wait_until("leafA0's slots back as they were", lambda: slot_ports() == slots_before, 10, 0.1)
    report = run.result()
    assert report.expected == rate * 8 and report.duplicates == 0 and report.send_errors == ()
    windows = [report.window(e.at_s, 0.45) for e in events]
    lost = [report.lost_in(*w) for w in windows]
    print(f"flap: lost per transition (down, up, ...) {lost}; spans {report.lost_spans}")
    for e, w, n in zip(events, windows, lost):
        assert n <= 0.25 * rate, (e.describe(), n, report.spans_in(*w))
    assert_background(report, windows)
    # the controller saw every down and every up: a failure and a recovery decision each time

    def decisions(cause):
        return {e["time_s"] for e in events_matching(lab, cause=cause, switch="leafA0", dest="leafA3")}
    assert len(decisions("failure")) >= flaps and len(decisions("recovery")) >= flaps


@pytest.mark.fabric("dual-plane-16", routing="adaptive")
def test_a_whole_plane_down_and_up_the_hosts_carry_on_over_the_other(lab, probe, faults):
    # The probe sends on both of h0's NICs, packet seq on plane seq mod 2, as a collective library
    # spreads over its NICs. Plane A dies as a whole for 2 s: h0's plane-A NIC loses carrier, its
    # sends there fail at once, and they leave by plane B instead. Without that, plane A's half of
    # the 2 s (4000 packets) would be lost; the bound is 0.1 s of packets at the failure, 0.25 s
    # at the recovery (OVS takes a few ms to use a port that came back).
    rate = 4000
    fab = lab.fabric
    run = probe("h0", "h15", plane="both", sport=49152, rate_pps=rate, seconds=7)
    run.wait_sending()
    into = {p: ("leaf" + p + "3", fab.port_towards("leaf" + p + "3", "h15")) for p in ("A", "B")}
    for sw, port in into.values():
        wait_carrying(lab, sw, port, rate // 8 * 64)  # both planes carry their half
    a_links = lambda: [l for l in lab.controller.get("/api/links") if fab.switch_by_name[l["switch"]].plane == "A"]
    down = faults.plane("A", up=False)
    wait_until("the controller to see every plane-A link down", lambda: not any(l["up"] for l in a_links()), 10)
    wait_carrying(lab, *into["B"], rate // 2 * 64)  # plane B carries it all
    time.sleep(max(0.0, down.at_s + 2.0 - time.monotonic()))
    up = faults.plane("A", up=True)
    wait_until("the controller to see every plane-A link up", lambda: all(l["up"] for l in a_links()), 10)
    wait_carrying(lab, *into["A"], rate // 8 * 64)  # plane A carries its half again
    report = run.result()
    assert report.expected == rate * 7 and report.duplicates == 0 and report.send_errors == ()
    assert sum(report.sent_per_route) == report.expected
    # at least 90% of plane A's share of the 2 s left by plane B instead
    assert report.rerouted >= 0.9 * rate * 2.0 / 2, report.rerouted
    failure, recovery = report.window(down.at_s, 0.5), report.window(up.at_s, 0.5)
    lost_failure, lost_recovery = report.lost_in(*failure), report.lost_in(*recovery)
    print(f"plane A down: lost {lost_failure} at the failure, {lost_recovery} at the recovery; rerouted "
          f"{report.rerouted}, per plane {report.sent_per_route}; spans {report.lost_spans}")
    assert lost_failure <= 0.1 * rate, report.spans_in(*failure)
    assert lost_recovery <= 0.25 * rate, report.spans_in(*recovery)
    assert_background(report, [failure, recovery])


def gray_verdicts(lab, link_ends, gray):
    return [v for v in lab.controller.get("/api/gray") if (v["switch"], v["port"]) in link_ends and v["gray"] == gray]


@pytest.mark.fabric("dual-plane-16", routing="adaptive")
def test_a_lossy_link_is_found_by_its_probes_avoided_and_brought_back_once_healed(lab, probe, faults):
    # slot 0 from h0 to h15 crosses spineA0 -> leafA3 (spineA0 port 4). The link stays up (no port
    # event, the fast-failover buckets keep using it) but drops 30% of its packets both ways. The
    # controller's probes (20 per link every second, counted at the far end) find it in two readings
    # and take it out of service; the probe then loses nothing until the link is healed, and the link
    # comes back after three clean readings. Loss while it is gray is bounded by what the link itself
    # drops over the detection time. (A link degraded in rate is not tested here: its tail-drop queue
    # lets the sparse probes through while it drops the bulk traffic, so the probes do not find it;
    # docs/controller.md, "Gray failures".)
    rate, period_s = 4000, 1.0
    ends = {("spineA0", 4), ("leafA3", 1)}
    run = probe("h0", "h15", plane="A", sport=49152, rate_pps=rate, seconds=14)
    run.wait_sending()
    wait_carrying(lab, "spineA0", 4, rate // 4 * 64)
    tx_before, t_before = tx(lab, "spineA0")[4], time.monotonic()
    sick = faults.lossy("spineA0", 4, 0.3)
    try:
        (verdict, *_) = wait_until("the controller to find the link gray", lambda: gray_verdicts(lab, ends, True),
                                   4 * period_s + 2)
    except DeadlineError as e:
        readings = [(l["switch"], l["port"], l["probes_lost"], l["probes_sent"]) for l in
                    lab.controller.get("/api/links") if (l["switch"], l["port"]) in ends]
        mbps = (tx(lab, "spineA0")[4] - tx_before) * 8 / (time.monotonic() - t_before) / 1e6
        raise AssertionError(f"{e}; last readings (switch, port, lost, sent) {readings}; spineA0:4 sent "
                             f"{mbps:.2f} Mbit/s since the fault") from None
    (moved, *_) = wait_until("the gray link's slots moved away", lambda: events_matching(
        lab, cause="failure", switch="leafA0", dest="leafA3"), 5)
    assert " gray: " in moved["trigger"], moved
    assert not any(l["up"] for l in lab.controller.get("/api/links") if (l["switch"], l["port"]) in ends)
    out_s = moved["time_s"]
    time.sleep(max(0.0, out_s + 2.0 - time.monotonic()))
    heal = faults.heal("spineA0", 4)
    wait_until("the controller to see the link healed", lambda: gray_verdicts(lab, ends, False), 6 * period_s)
    wait_until("recovery back onto spineA0", lambda: events_matching(
        lab, cause="recovery", switch="leafA0", dest="leafA3"), 5)
    report = run.result()
    detect_s = verdict["time_s"] - sick.at_s
    gray_window, recovery = (sick.at_s - report.inflight_s, out_s + 0.1), report.window(heal.at_s, 0.5)
    lost_gray, lost_after = report.lost_in(*gray_window), report.lost_in(out_s + 0.1, heal.at_s)
    print(f"gray ({sick.describe()}): found in {detect_s:.2f} s ({verdict['what']}), out of service "
          f"{out_s - sick.at_s:.2f} s after the fault; lost {lost_gray} until then, {lost_after} while it was "
          f"out, {report.lost_in(*recovery)} at the recovery; spans {report.lost_spans[:8]}")
    # two lossy readings: the first burst after the fault (<= 1 period), the next; each read 0.95 s in
    assert detect_s <= 2 * period_s + 0.95 + 0.5, detect_s
    assert out_s - verdict["time_s"] <= 0.1
    assert 0 < lost_gray <= 0.45 * rate * (gray_window[1] - gray_window[0])
    assert lost_after == 0, report.spans_in(out_s + 0.1, heal.at_s)
    assert report.lost_in(*recovery) <= 0.05 * rate
    assert_background(report, [gray_window, recovery])
