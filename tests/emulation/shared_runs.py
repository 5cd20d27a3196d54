"""Emulated replays that more than one test reads, run once per session.

The trace replays are minutes of emulation each; the tests of the replay (tests/emulation/test_replay.py)
and of the calibrated simulator (tests/emulation/test_calibration.py) check different things on the
same runs (ResNet-50's first step on dual-plane-16; DLRM's large all-to-alls on both fabrics), so
whichever runs first emulates and the other reads the same result. A run that raised is not kept.
"""
from __future__ import annotations

from fabric.model import Fabric
from tests.conftest import replayed
from traffic.replay import ReplayOptions
from traffic.results import RunResult
from traffic.workload import Workload

_RUNS: dict[tuple[str, str, str, ReplayOptions], RunResult] = {}


def emulated(name: str, workload: Workload, label: str, fabric: Fabric, routing: str,
             options: ReplayOptions) -> RunResult:
    """The replay of `workload` (called `name`: the cache's key with the fabric, routing and options)."""
    key = (name, fabric.name, routing, options)
    if key not in _RUNS:
        _RUNS[key] = replayed(workload, label, fabric, routing, options)
    return _RUNS[key]
