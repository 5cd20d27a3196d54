"""The flow-level simulator: the scale backend (no root, no packets).

It executes the same transfer DAGs (`fabric.transfers`) over the same model (`fabric.model`) and
routing policy (`fabric.routing`) as the emulation replay, with every transfer a set of flows whose
rates are max-min fair shares of the link capacities, recomputed at events only.

- `maxmin`: max-min fair rates by progressive filling (compiled with numba; numpy-vectorised and plain
  Python versions as baselines and checks).
- `connections`: host pair -> connections (NIC ports, plane, source port), the replay's rule.
- `routes`: connections' paths as rows of link indexes, walked through the policy's data plane.
- `inputs`: what a run is given (`Job`, `LinkEvent`, `SimOptions`) and reports (`SimProgress`).
- `executor`: `simulate(fabric, policy, jobs, options=, link_events=)`, the event-driven run (its
  loop), composed of: `shapes` (what jobs of one DAG share), `clock` (time and timed events), `pool`
  (the running jobs' transfers), `flows` (the active flows and their max-min rates), `forwarding`
  (store and forward or cut-through), `phases` (lockstep and phase replays), `load_log` (per-link
  load over time) and `congestion` (the congestion feedback's polls).
- `result`: `FlowSimResult`, per-transfer and per-job times and per-link load over time, as arrays.
- `collisions`: ECMP collisions counted on the connections' paths.

The model in one line: fluid flows at fair shares on the policy's paths, forwarded store-and-forward or
cut-through (`SimOptions.cut_through`); no packets, queues, TCP dynamics or path latency, except as the
overhead parameters of `SimOptions` (0 by default here; `fabriclab sim` and `compare` default to
`fabric.latency`'s).
"""
from __future__ import annotations

from fabric.flowsim.connections import Connection, plan_connections
from fabric.flowsim.executor import simulate
from fabric.flowsim.inputs import Job, LinkEvent, SimOptions, SimProgress, directed_links
from fabric.flowsim.maxmin import (
    FlowSimError,
    incidence,
    max_min_rates,
    max_min_rates_on_paths,
    max_min_rates_reference,
    max_min_rates_vectorised,
)
from fabric.flowsim.result import FlowSimResult

__all__ = [
    "Connection",
    "FlowSimError",
    "FlowSimResult",
    "Job",
    "LinkEvent",
    "SimOptions",
    "SimProgress",
    "directed_links",
    "incidence",
    "max_min_rates",
    "max_min_rates_on_paths",
    "max_min_rates_reference",
    "max_min_rates_vectorised",
    "plan_connections",
    "simulate",
]
