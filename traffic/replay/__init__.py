"""A workload run on a backend, the emulation's or the simulator's, by one pipeline:
plan -> backend -> timings -> result.

- `plan`: the pure plan both backends run (calls, DAG templates by rank, placement, scaling, every
  lane's connections);
- `place`: the plan put on the emulation's agents (transfers on hosts at emulated sizes, split over
  their connections);
- `timings`: what a backend gives back, in neither backend's terms (`RunProgress`, `RunTimings`,
  `BackendRun`);
- `result`: `build_result`, the one `RunResult` of both backends (per-collective bandwidths, composed
  steps, the run's description);
- the emulation's side: `agent` (the per-host agent process: real TCP, cut-through forwarding),
  `driver` (starts the agents, issues the calls, gathers timings and link counters), `emulated` (its
  measurements as a `BackendRun`);
- the simulator's side: `simulate` (a plan on `fabric.flowsim`, as a `BackendRun`).

`fabriclab.backends` composes these with a lab session (`Emulated`) or the simulator (`Simulated`) behind
one `Backend` protocol and one `run_workload`.
"""
from __future__ import annotations

from traffic.replay.place import PlacedPlan, place
from traffic.replay.plan import ReplayError, ReplayOptions, ReplayPlan, default_ports, plan_replay
from traffic.replay.result import build_result
from traffic.replay.timings import BackendRun, RunProgress, RunTimings

__all__ = ["BackendRun", "PlacedPlan", "ReplayError", "ReplayOptions", "ReplayPlan", "RunProgress", "RunTimings",
           "build_result", "default_ports", "place", "plan_replay"]
