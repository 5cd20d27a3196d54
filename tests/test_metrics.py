"""Metric definitions: busbw factors, bandwidth units, percentiles, step composition and its identity.

Every expected value is worked out by hand in the test."""
from __future__ import annotations

import pytest

from traffic.metrics import (MetricError, Percentiles, StepTimes, algbw_bps, busbw_bps, busbw_factor,
                             check_step_identity, compose_step, percentiles, scaling_efficiency, step_times)
from traffic.workload import Collective, Step


# --- bandwidth ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,n,factor", [
    # nccl-tests (doc/PERFORMANCE.md): all-reduce 2(n-1)/n; reduce-scatter, all-gather, all-to-all (n-1)/n;
    # broadcast, reduce 1
    ("all_reduce", 8, 14 / 8), ("all_reduce", 2, 1.0), ("all_reduce", 16, 30 / 16), ("all_reduce", 1, 0.0),
    ("reduce_scatter", 8, 7 / 8), ("all_gather", 8, 7 / 8), ("all_to_all", 4, 3 / 4),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
    ("gather", 4, 3 / 4), ("scatter", 4, 3 / 4), ("send_recv", 2, 1.0),
])
def test_busbw_factor_table(kind, n, factor):
    assert busbw_factor(kind, n) == pytest.approx(factor)


def test_busbw_factor_errors():
    with pytest.raises(MetricError, match="barrier moves no data"):
        busbw_factor("barrier", 4)
    with pytest.raises(MetricError, match="unknown collective kind 'allreduce'"):
        busbw_factor("allreduce", 4)
    with pytest.raises(MetricError, match="must be >= 1, got 0"):
        busbw_factor("all_reduce", 0)


def test_bandwidths_are_bits_per_second():
    # 1 MB in 1 ms: 1e6 B x 8 / 1e-3 s = 8e9 bit/s; all-reduce over 4 ranks: x 2 x 3 / 4 = 1.2e10
    assert algbw_bps(1_000_000, 0.001) == pytest.approx(8e9)
    assert busbw_bps("all_reduce", 1_000_000, 4, 0.001) == pytest.approx(1.2e10)
    with pytest.raises(MetricError, match="seconds must be > 0, got 0"):
        algbw_bps(100, 0)


# --- percentiles --------------------------------------------------------------------------------------

def test_percentiles_nearest_rank_small_sample():
    # sorted 1..5, n = 5: p50 is the ceil(2.5) = 3rd value, p99 the ceil(4.95) = 5th, p999 the 5th
    assert percentiles([5, 1, 4, 2, 3]) == Percentiles(p50=3, p99=5, p999=5, n=5, mean=3.0, max=5)
    # 10, 20, ..., 100: p50 is the 5th (50), p99 the ceil(9.9) = 10th (100)
    p = percentiles([10 * i for i in range(1, 11)])
    assert (p.p50, p.p99, p.p999, p.mean) == (50, 100, 100, 55.0)


def test_percentiles_exact_ranks():
    # 1..1000: p50 the 500th, p99 the 990th, p999 the 999th value
    p = percentiles(list(range(1000, 0, -1)))
    assert (p.p50, p.p99, p.p999, p.n, p.max) == (500, 990, 999, 1000, 1000)
    # 1..200: p99 is the 198th, p999 the ceil(199.8) = 200th
    p = percentiles(list(range(1, 201)))
    assert (p.p50, p.p99, p.p999) == (100, 198, 200)
    assert percentiles([7.5]) == Percentiles(7.5, 7.5, 7.5, 1, 7.5, 7.5)
    with pytest.raises(MetricError, match="empty"):
        percentiles([])


# --- step composition ---------------------------------------------------------------------------------

def coll(start_us: float, duration_us: float, stream: str = "0") -> Collective:
    return Collective("all_reduce", 1 << 20, "float32", (0, 1), stream=stream, start_us=start_us,
                      duration_us=duration_us)


# compute [0, 100] then [110, 150]; an all-reduce at [50, 110]: the second interval waited for it
# (the compute stream was idle from 100 and the collective ended at 110, in that gap)
WAITED = Step(number=1, duration_us=150.0, compute=((0.0, 100.0), (110.0, 150.0)), collectives=(coll(50, 60),))


def test_compose_waiting_compute_follows_a_slower_collective():
    tl = compose_step(WAITED, [120.0])
    # the collective keeps its start (50, inside the first interval) and ends at 170; the second
    # interval waited for it with no lag, so runs [170, 210]
    assert tl.collectives == ((50.0, 170.0),)
    assert tl.compute == ((0.0, 100.0), (170.0, 210.0))
    t = step_times(tl)
    # compute 100 + 40; communication [50, 170] minus the overlap [50, 100] = 70 exposed; no idle
    assert t == StepTimes(step_us=210.0, compute_us=140.0, exposed_comm_us=70.0, idle_us=0.0)
    check_step_identity(t)
    assert t.utilisation == pytest.approx(140 / 210)
    assert t.comm_share == pytest.approx(70 / 210)


def test_compose_waiting_compute_moves_up_with_a_faster_collective():
    tl = compose_step(WAITED, [10.0])
    # collective [50, 60] ends inside compute; the second interval starts right after the first: [100, 140]
    assert tl.compute == ((0.0, 100.0), (100.0, 140.0))
    assert step_times(tl) == StepTimes(step_us=140.0, compute_us=140.0, exposed_comm_us=0.0, idle_us=0.0)


def test_compose_collective_overlapping_compute_without_a_wait():
    # the design brief's case: compute [0, 100] and [100, 150] (one merged busy interval), a collective
    # recorded at [50, 80] now taking 120 us: [50, 170]; nothing waited for it, the step ends with it
    step = Step(number=2, duration_us=150.0, compute=((0.0, 150.0),), collectives=(coll(50, 30),))
    t = step_times(compose_step(step, [120.0]))
    # compute 150; communication [50, 170], overlapped on [50, 150]: 20 exposed; no idle
    assert t == StepTimes(step_us=170.0, compute_us=150.0, exposed_comm_us=20.0, idle_us=0.0)


# compute [0, 40], [60, 100]; stream 0: K1 [10, 30], then K2 [30, 45] (ended in the idle gap (40, 60]:
# the second interval waited for it, lag 15); stream 1: K3 [70, 90]; the step was recorded as 110 us
# long (a 10 us tail after the last compute)
TWO_STREAMS = Step(number=3, duration_us=110.0, compute=((0.0, 40.0), (60.0, 100.0)),
                   collectives=(coll(10, 20), coll(30, 15), coll(70, 20, stream="1")))


def test_compose_with_recorded_durations_is_the_recording():
    tl = compose_step(TWO_STREAMS)
    assert tl.compute == ((0.0, 40.0), (60.0, 100.0))
    assert tl.collectives == ((10.0, 30.0), (30.0, 45.0), (70.0, 90.0))
    t = step_times(tl)
    # communication [10, 45] + [70, 90] = 55, overlapped [10, 40] and [70, 90] = 50 -> exposed 5;
    # idle (45, 60) and (100, 110) = 25; 80 + 5 + 25 = 110
    assert t == StepTimes(step_us=110.0, compute_us=80.0, exposed_comm_us=5.0, idle_us=25.0)


def test_compose_two_streams_by_hand():
    tl = compose_step(TWO_STREAMS, [50.0, 30.0, 5.0])
    # K1 at 10 -> [10, 60]; K2 recorded at 30 (inside the first interval) but stream 0 is busy until 60:
    # [60, 90]; the second interval waited for K2 with a 15 us lag: max(40 + 15, 90 + 15) = 105 ->
    # [105, 145]; K3 was recorded 10 us into that interval -> 115, stream 1 free: [115, 120];
    # the recorded tail of 10 us after the last compute: the step ends at 155
    assert tl.collectives == ((10.0, 60.0), (60.0, 90.0), (115.0, 120.0))
    assert tl.compute == ((0.0, 40.0), (105.0, 145.0))
    assert tl.end_us == 155.0
    t = step_times(tl)
    # compute 40 + 40 = 80; communication [10, 90] + [115, 120] = 85, overlapped [10, 40] + [115, 120]
    # = 35 -> exposed 50; idle (90, 105) + (145, 155) = 25; 80 + 50 + 25 = 155
    assert t == StepTimes(step_us=155.0, compute_us=80.0, exposed_comm_us=50.0, idle_us=25.0)
    check_step_identity(t)


def test_idle_before_the_first_compute_and_a_gap_not_explained_by_communication():
    # compute [20, 50], [70, 80]; a collective [0, 10] ended in the compute stream's idle lead-in
    # (0, 20]: the first interval waited for it, with a lag of 10. The gap (50, 70) holds no
    # collective's end: it is kept as 20 us of idle.
    step = Step(number=4, duration_us=None, compute=((20.0, 50.0), (70.0, 80.0)), collectives=(coll(0, 10),))
    tl = compose_step(step, [30.0])
    # collective [0, 30]; first interval at max(0 + 10, 30 + 10) = 40 -> [40, 70]; second [90, 100]
    assert tl.compute == ((40.0, 70.0), (90.0, 100.0))
    t = step_times(tl)
    # compute 40; communication [0, 30] all exposed; idle (30, 40) + (70, 90) = 30; 40 + 30 + 30 = 100
    assert t == StepTimes(step_us=100.0, compute_us=40.0, exposed_comm_us=30.0, idle_us=30.0)


def test_identity_check_catches_a_mismatch():
    check_step_identity(StepTimes(step_us=100.0, compute_us=50.0, exposed_comm_us=30.0, idle_us=20.0))
    with pytest.raises(MetricError, match="off by 10.0 us"):
        check_step_identity(StepTimes(step_us=100.0, compute_us=50.0, exposed_comm_us=20.0, idle_us=20.0))


def test_compose_errors():
    with pytest.raises(MetricError, match="2 durations for 1 collectives"):
        compose_step(WAITED, [1.0, 2.0])
    untimed = Step(number=5, duration_us=None, compute=(),
                   collectives=(Collective("all_reduce", 8, "float32", (0, 1)),))
    with pytest.raises(MetricError, match="step 5: collective 0 .* no recorded start"):
        compose_step(untimed, [1.0])
    with pytest.raises(MetricError, match="duration -1.0 us < 0"):
        compose_step(WAITED, [-1.0])


# --- scaling ------------------------------------------------------------------------------------------

def test_scaling_efficiency():
    assert scaling_efficiency(90.0, 100.0) == pytest.approx(0.9)
    with pytest.raises(MetricError, match="must be > 0, got 0"):
        scaling_efficiency(90.0, 0.0)
