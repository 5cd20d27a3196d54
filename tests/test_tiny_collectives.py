"""Empty and tiny collectives (issue 42, defect 7).

A collective of 0 bytes, but a send_recv or a barrier, is discarded as NCCL discards it (NVIDIA/nccl 2.30.7
src/enqueue.cc, `taskAppend`: `if (info->count == 0) return ncclSuccess;`): no transfer, 0 µs, algbw/busbw
0, in the simulator and in the emulated replay's plan and driver alike. A 0-byte send_recv keeps its latency
(NCCL still gives it a 0-byte proxy step). A tiny collective's printed duration carries enough figures
(ns below 1 µs) that its printed busbw can be recomputed from it.

Hand values on dual-plane-16 (16 hosts, 4 per leaf, 2 x 200G NIC ports each, non-blocking) at the default
delays: 11.4 µs per transfer and 0.65 µs per link, so a transfer between two leaves (4 links) costs
11.4 + 4 x 0.65 = 14.0 µs beyond its bytes, and one inside a leaf (2 links) 11.4 + 2 x 0.65 = 12.7 µs.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from fabric import builders, topofile
from fabric.flowsim import SimOptions
from fabric.latency import DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US
from tests.conftest import simulated
from tests.localhosts import LocalHosts
from tests.test_replay import coll, loopback, workload
from traffic import collectives, report
from traffic.formatting import format_us
from traffic.replay import ReplayOptions, build_result, place, plan_replay
from traffic.replay.driver import Driver
from traffic.replay.emulated import emulated_run
from traffic.workload import KINDS, Collective

DP16 = topofile.load("dual-plane-16")
NIC_BPS = 200e9
LATENCY = SimOptions(per_transfer_s=DEFAULT_PER_TRANSFER_US / 1e6, per_hop_s=DEFAULT_PER_HOP_US / 1e6)
NOTE = "of 0 bytes discarded, as NCCL does"


def untimed(colls, n=16):
    return workload(colls, n=n, timed=False)


def test_the_delays_are_the_hand_values():
    assert DEFAULT_PER_TRANSFER_US + 4 * DEFAULT_PER_HOP_US == pytest.approx(14.0)
    assert DEFAULT_PER_TRANSFER_US + 2 * DEFAULT_PER_HOP_US == pytest.approx(12.7)


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in ("send_recv", "barrier")])
def test_an_empty_collective_of_any_kind_has_no_transfer(kind):
    assert len(collectives.schedule_columns(kind, 0, list(range(16)))) == 0
    assert len(collectives.schedule_columns(kind, 1, list(range(16)))) > 0  # one byte is a collective


def test_an_empty_send_recv_and_barrier_keep_their_messages():
    (t,) = collectives.schedule("send_recv", 0, [0, 15]).transfers
    assert (t.src, t.dst, t.size_bytes) == (0, 15, 0)
    assert len(collectives.schedule("barrier", 0, list(range(16))).transfers) == 16 * 4  # log2 16 rounds


def test_an_empty_all_reduce_takes_no_time_and_leaves_the_other_calls_as_they_were():
    # one after the other: a 1.6 MB ring all-reduce, a 0-byte one, a 3.2 MB all-gather; against the same
    # without the empty one. By hand: the all-reduce is 2 x 15 steps of 100 kB at the host's 400G (2 us)
    # plus 14 us each = 480 us; the all-gather 15 steps of 200 kB (4 us) plus 14 us = 270 us.
    a, empty, g = coll(size=1_600_000, n=16), coll(size=0, n=16), coll(kind="all_gather", size=3_200_000, n=16)
    res = simulated(untimed([a, empty, g]), "t", DP16, "adaptive", ReplayOptions(), LATENCY)
    without = simulated(untimed([a, g]), "t", DP16, "adaptive", ReplayOptions(), LATENCY)
    ra, rz, rg = res.collectives
    assert (rz.duration_real_us, rz.duration_emu_s, rz.algbw_bps, rz.busbw_bps, rz.transfers) == (0.0, 0.0, 0.0, 0.0, 0)
    assert ra.duration_real_us == pytest.approx(2 * 15 * (100_000 * 8 / (2 * NIC_BPS) * 1e6 + 14.0), rel=1e-9)
    assert rg.duration_real_us == pytest.approx(15 * (200_000 * 8 / (2 * NIC_BPS) * 1e6 + 14.0), rel=1e-9)
    wa, wg = without.collectives
    assert (ra.duration_real_us, rg.duration_real_us, rg.start_emu_s) == (wa.duration_real_us, wg.duration_real_us,
                                                                          wg.start_emu_s)
    assert rz.start_emu_s == rg.start_emu_s  # it ends as it starts, and the all-gather starts then
    (step,), (step_without,) = res.steps, without.steps
    assert step.step_us == step_without.step_us == pytest.approx(480.0 + 270.0, rel=1e-9)
    # said once, in the run's notes, with NCCL's source
    notes = [n for n in res.meta.notes if NOTE in n]
    assert len(notes) == 1 and notes[0].startswith("1 collective(s) of 0 bytes discarded")
    assert "src/enqueue.cc" in notes[0]
    assert not [n for n in without.meta.notes if NOTE in n]


def test_the_note_counts_the_discarded_calls_once():
    # a 0-byte all-reduce and all-gather are discarded; a 0-byte send_recv and a barrier are not
    w = untimed([coll(size=0, n=16), coll(kind="all_gather", size=0, n=16),
                 Collective("send_recv", 0, "float32", (0, 15)), coll(kind="barrier", size=0, n=16)])
    res = simulated(w, "t", DP16, "adaptive", ReplayOptions(repeat=2), LATENCY)
    notes = [n for n in res.meta.notes if NOTE in n]
    assert len(notes) == 1 and notes[0].startswith("4 collective(s) of 0 bytes discarded")  # 2 a repetition
    assert "src/enqueue.cc" in notes[0] and "taskAppend" in notes[0]
    by_kind = {c.kind: c for c in res.collectives}
    assert by_kind["all_reduce"].duration_real_us == by_kind["all_gather"].duration_real_us == 0.0
    assert by_kind["send_recv"].duration_real_us == pytest.approx(14.0, rel=1e-9)
    # the barrier: 4 rounds of 0-byte messages, q -> q + 1, 2, 4, 8, each after the one received before; rounds
    # 2 and 3 always cross leaves (14 us), and no chain crosses in both rounds 0 and 1 (a rank q = 3 mod 4 that
    # receives in round 0 from the leaf before is 0 mod 4, whose round-1 message stays in its leaf): 3 x 14 + 12.7
    assert by_kind["barrier"].duration_real_us == pytest.approx(3 * 14.0 + 12.7, rel=1e-9)


def test_an_empty_send_recv_keeps_its_per_transfer_latency():
    # h0 -> h15 crosses leaves (4 links): 11.4 + 4 x 0.65 = 14.0 us; h0 -> h1 shares leaf 0 (2 links): 12.7 us
    w = untimed([Collective("send_recv", 0, "float32", (0, 15)), Collective("send_recv", 0, "float32", (0, 1))])
    res = simulated(w, "t", DP16, "adaptive", ReplayOptions(), LATENCY)
    far, near = res.collectives
    assert far.duration_real_us == pytest.approx(14.0, rel=1e-9)
    assert near.duration_real_us == pytest.approx(12.7, rel=1e-9)
    assert (far.transfers, far.algbw_bps, far.busbw_bps) == (1, 0.0, 0.0)
    assert not [n for n in res.meta.notes if NOTE in n]


def test_the_plan_gives_an_empty_collective_no_transfer_and_no_agent():
    w = untimed([coll(size=1_600_000, n=16), coll(size=0, n=16)])
    plan = plan_replay(w, DP16, ReplayOptions(dilation=1000))
    full, empty = plan.templates
    assert (empty.transfer_count, empty.local_us, empty.discarded) == (0, 0.0, True)
    assert (full.local_us, full.discarded) == (None, False)
    assert sum(NOTE in n for n in plan.notes) == 1
    placed = place(plan)
    for host in plan.hosts():
        assert empty.id not in placed.agent_plan(host)["templates"]


def test_the_emulated_replay_ends_an_empty_collective_as_it_starts(tmp_path: Path):
    # the real driver and agents over loopback: the 0-byte all-reduce is held for 0 s by the driver (no agent
    # takes part), between two 200 kB ones; its result is 0 us, busbw 0
    fab = builders.dual_plane(hosts=4, hosts_per_leaf=2, spines_per_plane=2)
    w = workload([coll(size=200_000, n=4, start=0, dur=100), coll(size=0, n=4, start=100, dur=10),
                  coll(size=200_000, n=4, start=110, dur=100)], n=4)
    placed = loopback(plan_replay(w, fab, ReplayOptions(dilation=1000, mbps_per_gbps=1.0, port=17640)))
    raw = Driver(placed, LocalHosts(fab), tmp_path, None, 0.5).run()
    first, empty, last = raw.timings
    assert empty.end_s == empty.start_s and not empty.received_s
    assert first.end_s <= empty.start_s <= last.start_s
    run = emulated_run(placed.plan, raw)
    res = build_result(placed.plan, run, trace="t", routing="adaptive")
    assert (res.collectives[1].duration_real_us, res.collectives[1].busbw_bps) == (0.0, 0.0)
    assert res.collectives[0].duration_real_us > 0 and res.collectives[2].duration_real_us > 0


def _value(text: str, units: dict[str, float]) -> tuple[float, float]:
    """A printed "number unit" -> (its value, half a unit of its last printed digit), in the base unit."""
    number, unit = text.split()
    decimals = len(number.partition(".")[2])
    return float(number) * units[unit], 0.5 * 10.0 ** -decimals * units[unit]


TIME_S = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}
RATE_BPS = {"Tbit/s": 1e12, "Gbit/s": 1e9, "Mbit/s": 1e6, "kbit/s": 1e3, "bit/s": 1.0}


@pytest.mark.parametrize("sim, duration, busbw", [
    # bandwidth only: a 1-byte chunk (4 of the 16 carry one byte) goes round the ring in 2 x 15 transfers, one
    # after the other, each 8 bits on one 200G NIC port: 30 x 8 / 200e9 = 1.2 ns;
    # busbw = 4 x 8 x 2 x 15/16 / 1.2 ns = 50 Gbit/s
    (SimOptions(), "1.200 ns", "50.0 Gbit/s"),
    # the default delays: 30 steps of 14 us (the ring's slowest edge crosses leaves) = 420 us;
    # busbw = 60 bits / 420 us = 143 kbit/s
    (LATENCY, "420.0 µs", "143 kbit/s"),
], ids=["bandwidth-only", "default-latency"])
def test_a_printed_4_byte_all_reduce_row_gives_back_its_busbw(sim, duration, busbw):
    res = simulated(untimed([coll(size=4, n=16)]), "t", DP16, "adaptive", ReplayOptions(), sim)
    text = report.format_summary(report.summarize(res))
    (row,) = [line for line in text.splitlines() if line.startswith("all_reduce ")]
    cells = re.split(r"\s{2,}", row)
    assert cells[:3] == ["all_reduce", "1", "4 B"]
    p50, bus = cells[3], cells[7]
    assert (p50, bus) == (duration, busbw)
    # recompute busbw from the printed duration: bytes x 8 x 2(n-1)/n / duration, within the printed rounding
    d, d_half = _value(p50, TIME_S)
    b, b_half = _value(bus, RATE_BPS)
    assert d > 0 and d_half / d <= 5e-4  # four significant figures
    recomputed = 4 * 8 * 2 * 15 / 16 / d
    assert abs(recomputed - b) <= b_half + recomputed * d_half / d


def test_durations_print_in_ns_below_1_us_to_four_figures():
    assert format_us(0.0012) == "1.200 ns"
    assert format_us(0.0012346) == "1.235 ns"
    assert format_us(0.0006) == "0.6000 ns"
    assert format_us(0.5) == "500.0 ns"
    assert format_us(0.99996) == "1.000 µs"  # rounded first, then the unit
    assert format_us(123.456) == "123.5 µs"
    assert format_us(999.96) == "1.000 ms"
    assert format_us(1780.0) == "1.780 ms"
    assert format_us(1234567890.0) == "1235 s"
    assert format_us(0.0) == "0 µs"
    assert format_us(None) == "n/a"
