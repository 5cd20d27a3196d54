"""Recording a real CPU data-parallel job (traffic.record) and reading it back; the built-in recording.

Expected sizes come from the model definition, by hand: the MLP is Linear 512->1024, 1024->1024, 1024->128,
128->10 (weights a*b, biases b), fp32. Parameters: 524288+1024 + 1048576+1024 + 131072+128 + 1280+10 = 1,707,402,
i.e. 6,829,608 bytes of gradients all-reduced per step. DDP fills its buckets with the gradients in reverse
order (10, 1280, 128, 131072, 1024, 1048576 | 1024, 524288) and closes a bucket once it holds at least
bucket_cap_mb = 1 MiB (262,144 floats): buckets of 1,182,090 and 525,312 floats = 4,728,360 and 2,101,248 bytes.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from traffic.record import RecordError, record
from traffic.traces import BUILTIN_TRACE, load
from traffic.workload import Workload

GRADIENT_BYTES = 4 * (512 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 128 + 128 + 128 * 10 + 10)
BUCKET_BYTES = [2_101_248, 4_728_360]


def _check_data_parallel(w: Workload, ranks: int) -> None:
    assert w.format == "kineto" and w.world_size == ranks
    assert [r.rank for r in w.ranks] == list(range(ranks))
    for r in w.ranks:
        assert r.steps
        for s in r.steps:
            assert set(s.bytes_by_kind()) == {"all_reduce"}
            assert sorted(c.size_bytes for c in s.collectives) == BUCKET_BYTES
            assert sum(c.size_bytes for c in s.collectives) == GRADIENT_BYTES
            assert all(c.dtype == "float32" and c.group_ranks == tuple(range(ranks)) for c in s.collectives)
            assert all(c.start_us is not None and c.duration_us is not None and c.duration_us > 0
                       for c in s.collectives)
            assert s.duration_us is not None and 0 < s.compute_us <= s.duration_us * 1.5


@pytest.mark.timeout(300)
def test_record_two_ranks_and_read_back(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    paths = record(tmp_path / "job", ranks=2, steps=2)
    assert [p.name for p in paths] == ["rank0.json.gz", "rank1.json.gz"]
    w = load(tmp_path / "job")
    _check_data_parallel(w, 2)
    assert [s.number for s in w.ranks[0].steps] == [2, 3]  # iterations 0 and 1 are not recorded
    assert any("CPU-only trace" in n for n in w.notes)


def test_record_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="ranks=0"):
        record(tmp_path, ranks=0)


def test_builtin_trace_parses() -> None:
    assert sorted(p.name for p in BUILTIN_TRACE.iterdir()) == [f"rank{r}.json.gz" for r in range(4)]
    assert sum(p.stat().st_size for p in BUILTIN_TRACE.iterdir()) < 1_000_000
    w = load(BUILTIN_TRACE)
    _check_data_parallel(w, 4)
    assert w.steps >= 3
