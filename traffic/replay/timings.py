"""What a backend gives back, in neither backend's terms: its progress while it runs (`RunProgress`) and,
once done, the calls' times and its own measurements (`BackendRun`), from which
`traffic.replay.result.build_result` makes the one `RunResult` of both backends.

Times are in the backend's own clock, seconds: the emulation's CLOCK_MONOTONIC (emulated time), the
simulator's simulated time (real time, from 0 at the first collective).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traffic.results import Fidelity, LinkSeries


@dataclass(frozen=True)
class RunProgress:
    """How far a run is: its stage ("plan", "connections", "simulate", "replay", ...), the calls completed,
    the share of the run's bytes they carry (what the time to go follows best: a call's cost grows with its
    transfers), the simulated time so far against the recorded durations of the calls (their sum, where
    the trace has timings; 0 where not; the simulator's), events and rate computations (the simulator's),
    and the wall time the stage has taken so far."""

    stage: str
    calls_done: int = 0
    calls: int = 0
    bytes_share: float = 0.0
    sim_s: float = 0.0
    recorded_s: float = 0.0
    events: int = 0
    rate_updates: int = 0
    wall_s: float = 0.0


@dataclass(frozen=True)
class CallTimes:
    """One call's start and end, in the backend's clock."""

    call: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class RunTimings:
    """Every call's times (in the plan's call order) and the run's wall clock: `started_s` and `ended_s`
    on the monotonic clock (the run's duration), `started_wall` from `time.time()`."""

    calls: tuple[CallTimes, ...]
    started_s: float
    ended_s: float
    started_wall: float


@dataclass(frozen=True)
class BackendRun:
    """What a backend measured beside the calls' times: per-link utilisation over intervals of
    `link_interval_s` from `link_origin_emu_s` (relative to the first call's start), how faithful the run
    was, the faults injected and the reroutes decided (their `at_emu_s` relative to the first call's start),
    its own notes, and whether it ran the plan scaled (the emulation: link scale and dilation; the plan's
    notes on them then apply)."""

    backend: str
    timings: RunTimings
    link_interval_s: float
    links: tuple[LinkSeries, ...]
    fidelity: Fidelity
    faults: tuple[dict[str, Any], ...] = ()
    events: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    scaled: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    link_origin_emu_s: float = 0.0
