"""A job's step (rank -1) from its ranks' composed steps: the slowest rank's time, the ranks' mean split."""
from __future__ import annotations

import pytest

from traffic.replay.result import job_step
from traffic.results import StepResult


def rank_step(rank, step, compute, exposed, by_stream):
    return StepResult(step=0, repeat=0, rank=rank, step_us=step, compute_us=compute, exposed_comm_us=exposed,
                      idle_us=step - compute - exposed, recorded_step_us=None, exposed_by_stream_us=by_stream)


def test_the_job_lasts_as_its_slowest_rank_and_splits_as_the_ranks_mean():
    # rank 0 ends at 10 ms (6 compute, 3 exposed: 2 dp + 1 pp, 1 idle); rank 1 at 8 ms (4, 2 pp, 2 idle), then
    # waits 2 ms for rank 0. The job: 10 ms; compute (6 + 4) / 2 = 5; exposed (3 + 2) / 2 = 2.5 (dp 1, pp 1.5);
    # idle 10 - 5 - 2.5 = 2.5 = the ranks' idle (1 + 2) / 2 plus rank 1's 2 ms wait / 2
    job = job_step([rank_step(0, 10_000.0, 6_000.0, 3_000.0, {"dp": 2_000.0, "pp": 1_000.0}),
                    rank_step(1, 8_000.0, 4_000.0, 2_000.0, {"pp": 2_000.0})])
    assert job.rank == -1 and job.step_us == 10_000.0
    assert (job.compute_us, job.exposed_comm_us, job.idle_us) == pytest.approx((5_000.0, 2_500.0, 2_500.0))
    assert job.exposed_by_stream_us == pytest.approx({"dp": 1_000.0, "pp": 1_500.0})
    assert job.utilisation == pytest.approx(0.5) and job.comm_share == pytest.approx(0.25)


def test_ranks_that_tie_give_the_same_job_whichever_ends_last():
    # two orders of near-equal steps: the slowest rank's own split would differ (60% against 40% compute)
    a = rank_step(0, 10_000.0, 6_000.0, 1_000.0, {})
    b = rank_step(1, 9_999.0, 4_000.0, 3_000.0, {})
    b_last = rank_step(1, 10_001.0, 4_000.0, 3_000.0, {})
    assert job_step([a, b]).utilisation == pytest.approx(job_step([a, b_last]).utilisation, rel=1e-3)
