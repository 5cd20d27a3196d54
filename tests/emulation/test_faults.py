"""Faults beyond one link, on real switches with the paced probe: a whole switch down and up, and the
controller killed under traffic (the session notices, restarts it, and the data plane keeps every
packet). Loss is attributed to each event's window; the background outside is bounded separately."""
from __future__ import annotations

import time

import pytest

from fabric.polling import wait_until
from tests.emulation.test_multipath import assert_background, events_matching, wait_carrying

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
