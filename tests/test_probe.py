"""The paced UDP probe: lost-span arithmetic and loss attribution by hand, and real runs over loopback
(the runner driven through a `Hosts` that starts local processes)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller.process import free_port
from fabric import topofile
from tests.localhosts import LocalHosts
from traffic.probe import summarise
from traffic.probe_run import ProbeReport, ProbeRun


def test_lost_spans_by_hand():
    seen = bytearray([1, 1, 1, 0, 0, 0, 1, 1, 1, 0])
    res = summarise(seen, expected=10, duplicates=0)
    assert res.lost_spans == ((3, 5), (9, 9))
    assert (res.received, res.lost, res.longest_span) == (6, 4, 3)
    # packets never seen at the end, when the sender said it sent 12
    assert summarise(seen, expected=12, duplicates=0).lost_spans == ((3, 5), (9, 11))


def report(spans, rate=1000.0, t0=100.0, expected=10_000):
    lost = sum(b - a + 1 for a, b in spans)
    return ProbeReport("h0", "h1", t0, rate, expected, expected - lost, 0, tuple(spans), (), 0.0, {})


def test_loss_is_attributed_to_the_window_its_packets_were_due_in():
    # 1000 pps from t0 = 100 s: packet n is due at 100 + n/1000 s
    r = report([(10, 19), (2000, 2049), (5000, 5000)])
    assert r.due_s(2000) == pytest.approx(102.0)
    assert r.lost == 10 + 50 + 1
    assert r.lost_in(101.995, 102.100) == 50  # the event at 102 s: packets 1995..2100
    assert r.lost_in(102.010, 102.020) == 11  # part of a span: packets 2010..2020 inclusive
    assert r.lost_outside([(101.995, 102.100)]) == 11  # 10 early + 1 late: the background
    assert r.lost_outside([(101.995, 102.100), (100.0, 100.5)]) == 1
    assert r.lost_outside([(0.0, 200.0)]) == 0
    assert r.spans_in(102.010, 102.020) == [(2010, 2020)]
    assert r.longest_span_ms == pytest.approx(50.0)
    assert r.first_loss_s() == pytest.approx(100.010)


def test_overlapping_windows_do_not_count_a_packet_twice():
    r = report([(100, 199)])
    assert r.lost_outside([(100.1, 100.15), (100.12, 100.2)]) == 0
    assert r.lost_outside([(100.1, 100.15)]) == 100 - 51


def test_probe_over_loopback_counts_every_packet(tmp_path):
    port = free_port()
    recv = subprocess.Popen([sys.executable, "-m", "traffic.probe", "recv", "--bind", "127.0.0.1", "--port",
                             str(port), "--idle-s", "2", "--ready-file", str(tmp_path / "ready")],
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = 20
        import time
        t_end = time.monotonic() + deadline
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < t_end and recv.poll() is None, "receiver did not bind"
            time.sleep(0.02)
        sent = subprocess.run([sys.executable, "-m", "traffic.probe", "send", "--dst", "127.0.0.1", "--port",
                               str(port), "--sport", str(free_port()), "--rate-pps", "2000", "--seconds", "1"],
                              capture_output=True, text=True, check=True, timeout=30)
        out, _ = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
    s = json.loads(sent.stdout)
    assert s["sent"] == 2000 and s["send_errors"] == []
    res = json.loads(out)
    assert res["expected"] == 2000 and res["received"] == 2000 and res["lost_spans"] == []
    assert 0 <= res["latency_ms"]["p50"] < 1000


def _loopback_run(tmp_path, routes, rate=2000):
    import time
    port = free_port()
    recv = subprocess.Popen([sys.executable, "-m", "traffic.probe", "recv", "--bind", "127.0.0.1", "--port",
                             str(port), "--idle-s", "2", "--ready-file", str(tmp_path / "ready")],
                            stdout=subprocess.PIPE, text=True)
    try:
        t_end = time.monotonic() + 20
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < t_end and recv.poll() is None, "receiver did not bind"
            time.sleep(0.02)
        args = [a for b, d in routes for a in ("--bind", b, "--dst", d)]
        sent = subprocess.run([sys.executable, "-m", "traffic.probe", "send", *args, "--port", str(port),
                               "--sport", str(free_port()), "--rate-pps", str(rate), "--seconds", "1"],
                              capture_output=True, text=True, check=True, timeout=30)
        out, _ = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
    return json.loads(sent.stdout), json.loads(out)


def test_a_probe_with_two_routes_alternates_between_them(tmp_path):
    # two source addresses on loopback, one destination: packet seq leaves by route seq mod 2
    s, r = _loopback_run(tmp_path, [("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.1")])
    assert s["sent_per_route"] == [1000, 1000] and s["rerouted"] == 0 and s["send_errors"] == []
    assert r["received"] == 2000 and r["lost_spans"] == []


def test_a_route_that_refuses_packets_sends_them_by_the_other_at_once(tmp_path):
    # 255.255.255.255 without SO_BROADCAST: the kernel refuses every packet (EACCES) before it leaves
    # the host, as it refuses a route over a NIC that lost carrier (ENETUNREACH): every odd packet
    # moves to the first route, none is lost, none counts as a send error
    s, r = _loopback_run(tmp_path, [("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "255.255.255.255")])
    assert s["sent_per_route"] == [2000, 0] and s["rerouted"] == 1000 and s["send_errors"] == []
    assert r["received"] == 2000 and r["lost_spans"] == []


def test_probe_runner_waits_for_readiness_and_reports_the_schedule(tmp_path: Path, monkeypatch):
    hosts = LocalHosts(topofile.load("leaf-spine-16"))
    run = ProbeRun(hosts, "h0", "h1", plane="A", sport=free_port(), rate_pps=1000, seconds=1.0,
                   workdir=tmp_path, port=free_port(), idle_s=1.0)
    # on loopback both ends use 127.0.0.1 (the model's addresses are not configured here)
    run.src_ip = run.dst_ip = "127.0.0.1"
    run.start()
    t0 = run.wait_sending()
    rep = run.result()
    assert rep.t0_s == pytest.approx(t0)
    assert rep.expected == 1000 and rep.lost == 0 and rep.send_errors == ()
    assert rep.lost_outside([]) == 0
