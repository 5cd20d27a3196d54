"""Trace replay on the emulation: a workload's collectives as real TCP bytes between emulated hosts.

- `plan`: the pure plan (calls, DAG templates placed on hosts, scaling, connections);
- `agent`: the per-host agent process (real TCP, cut-through forwarding);
- `driver`: starts the agents, issues the calls, gathers timings and link counters;
- `analyse`: raw timings -> `traffic.results.RunResult` (composed steps, links, fidelity).

`fabriclab.replay` composes these with a lab session into the `fabriclab replay` command.
"""
from __future__ import annotations

from traffic.replay.analyse import build_result
from traffic.replay.driver import Driver, RawRun
from traffic.replay.plan import ReplayError, ReplayOptions, ReplayPlan, default_ports, plan_replay

__all__ = ["Driver", "RawRun", "ReplayError", "ReplayOptions", "ReplayPlan", "build_result", "default_ports",
           "plan_replay"]
