"""One way to run a workload, whatever the backend: plan -> backend -> timings -> result.

    run = run_workload(workload, "trace.json.gz", topofile.load("dual-plane-16"), "adaptive",
                       ReplayOptions(), Simulated(SimOptions(per_hop_s=1e-6)))
    run.plan, run.result     # the plan both backends run; the one RunResult of both

A `Backend` plans the workload as it runs it (`plan`: the emulation at a link scale and dilation, the
simulator at the real rates) and runs the plan (`run`), giving back the calls' times and what only it
measures (`traffic.replay.BackendRun`); `run_workload` builds the `RunResult` from them
(`traffic.replay.build_result`), the same way for both. `fabriclab replay`, `sim`, `compare`, `calibrate`
and `crosscheck` all run through it.

- `Emulated`: brings up the lab (controller first, then the fabric, its `tunnel_links` carried by a
  tunnel: docs/cluster.md) at the plan's link scale, places the plan on one agent per host
  (`traffic.replay.place`), runs them (`traffic.replay.Driver`), samples the switches' port counters
  from the controller's REST API, and keeps the controller's reroute events and the faults injected
  meanwhile (`during` may inject them: it is called with the lab and the number of collectives
  completed so far).
- `Simulated`: the plan on `fabric.flowsim` (`traffic.replay.simulate`) with its options, link events
  and all-to-all model.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fabric.emulation import EmulationOptions
from fabric.flowsim import LinkEvent, SimOptions
from fabric.model import Fabric
from fabriclab.session import Lab
from traffic.replay import (BackendRun, ReplayOptions, ReplayPlan, RunProgress, build_result, place,
                            plan_replay)
from traffic.replay.alone import choice_check_note
from traffic.replay.driver import Driver
from traffic.replay.emulated import emulated_run
from traffic.replay.simulate import check_all_to_all, plan_for_simulation, simulate_plan
from traffic.results import RunResult
from traffic.workload import Workload

Progress = Callable[[RunProgress], None]

#: The controller's port polling is scaled with the emulated link rate: as many bytes per poll as
#: `fabriclab up`'s 10 ms polls see at 20 Mbit/s, between 10 and 100 ms. At the replay's default
#: 1 Mbit/s NICs a full-size frame takes 12 ms, so 10 ms polls see one packet or none, and cost the
#: 2-core machine ~70% of a core (controller and ovs-vswitchd, measured) that the agents and the
#: datapath then lack.
POLL_MS_AT_20_MBPS = 10.0


class Backend(Protocol):
    """Where a workload runs: `name` as results say it ("emulation", "flowsim")."""

    name: str

    def plan(self, workload: Workload, fabric: Fabric, options: ReplayOptions) -> ReplayPlan:
        """The plan as this backend runs it (bad input fails here, before anything is built)."""
        ...

    def run(self, plan: ReplayPlan, routing: str, progress: Progress | None) -> BackendRun:
        """Run `plan` under `routing`, telling `progress` (where given) how far it is."""
        ...


@dataclass(frozen=True)
class Run:
    plan: ReplayPlan
    result: RunResult


def run_workload(workload: Workload, trace_label: str, fabric: Fabric, routing: str, options: ReplayOptions,
                 backend: Backend, *, progress: Progress | None = None, out_dir: Path | None = None,
                 spec: dict[str, Any] | None = None) -> Run:
    """`workload` on `fabric` under `routing` by `backend` (module docstring); the result written to
    `out_dir` (its `result.json`) where given; `spec`: the resolved run specification, kept in the result's meta."""
    if progress is not None:
        progress(RunProgress("plan"))
    plan = backend.plan(workload, fabric, options)
    result = build_result(plan, backend.run(plan, routing, progress), trace=trace_label, routing=routing)
    if spec is not None:
        result = dataclasses.replace(result, meta=dataclasses.replace(result.meta, spec=spec))
    if out_dir is not None:
        result.write(out_dir)
    return Run(plan, result)


def describe_progress(p: RunProgress) -> str:
    """One line on how far a run is: its stage, the calls and bytes done and, on the simulator, the simulated
    time so far."""
    text = f"{p.stage}: {p.calls_done}/{p.calls} calls, {p.bytes_share:.0%} of bytes"
    return text + f", simulated {p.sim_s * 1e3:.4g} ms" if p.stage == "simulate" else text


def numpy_hugepage_advice_off() -> None:
    """Turn numpy's huge-page advice off for this process and the ones it starts, unless
    `NUMPY_MADVISE_HUGEPAGE` says otherwise. numpy advises the kernel to back every array of 4 MB and
    more with huge pages; where transparent huge pages are `madvise` with defrag `madvise` (Debian's and
    Ubuntu's default), the kernel compacts memory synchronously at the first touch of each such array,
    and the simulator makes many short-lived ones: one 1024-GPU step took 2.5 s with the advice and
    0.65 s without it here (`benchmarks/flowsim.py --hugepages default off`)."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"  # read at numpy's import: processes started later
    import numpy as np

    core = getattr(np, "_core", None) or getattr(np, "core")  # numpy 2 / numpy 1
    core.multiarray._set_madvise_hugepage(False)


def controller_poll_ms(fabric: Fabric, mbps_per_gbps: float) -> float:
    nic_mbps = max(p.rate_gbps for p in fabric.nic_ports) * mbps_per_gbps
    return min(100.0, max(10.0, POLL_MS_AT_20_MBPS * 20.0 / nic_mbps))


@dataclass
class Emulated:
    """The emulation: real OVS switches, the controller, real TCP bytes between the hosts' agents."""

    link_interval_s: float = 0.5  # how often the switches' counters are sampled
    during: Callable[[Lab, int, int], None] | None = None
    log: Callable[[str], None] | None = None
    name: str = "emulation"
    tunnel_links: tuple[tuple[str, str], ...] = ()  # links carried by a tunnel (EmulationOptions)
    tunnel_kind: str = "vxlan"

    def plan(self, workload: Workload, fabric: Fabric, options: ReplayOptions) -> ReplayPlan:
        return plan_replay(workload, fabric, options)

    def run(self, plan: ReplayPlan, routing: str, progress: Progress | None) -> BackendRun:
        placed = place(plan)  # every transfer's host and connections, before anything is built
        fabric = plan.fabric
        weight = [max(plan.templates[c.template].size_bytes, 1) for c in plan.calls]
        total = float(sum(weight))
        done_bytes = 0.0
        tell = progress or (lambda p: None)
        poll_ms = controller_poll_ms(fabric, plan.mbps_per_gbps)
        tell(RunProgress("bring-up", 0, len(plan.calls)))
        opts = EmulationOptions(mbps_per_gbps=plan.mbps_per_gbps, tunnel_links=self.tunnel_links,
                                tunnel_kind=self.tunnel_kind)
        with Lab(fabric, routing=routing, opts=opts, log=self.log, controller_args=["--poll-ms", f"{poll_ms:g}"]) as lab:
            if lab.emulation is None or lab.controller is None or lab.run_dir is None:
                raise RuntimeError("the lab did not come up")
            ctl = lab.controller

            def counters() -> dict[tuple[str, int], int]:
                return {(sw, int(port)): int(tx) for sw, port, tx, _rx in ctl.get("/api/counters")["ports"]}

            def done(n: int, calls: int, call: int) -> None:
                nonlocal done_bytes
                done_bytes += weight[call]
                tell(RunProgress("replay", n, calls, done_bytes / total))
                if self.during is not None:
                    self.during(lab, n, calls)

            tell(RunProgress("replay", 0, len(plan.calls)))
            raw = Driver(placed, lab.emulation, lab.run_dir, counters, self.link_interval_s, done).run()
            events = ctl.get("/api/events?limit=100000")
            faults = [{"kind": f.kind, "target": f.target, "up": f.up, "at_s": f.at_s}
                      for f in (lab.faults.log if lab.faults else [])]
            gaps = tuple(f"the controller died and was restarted during the run ({g.gap_s} s to resync)"
                         for g in lab.controller_gaps)
        return emulated_run(plan, raw, faults=faults, events=events, notes=gaps)


@dataclass
class Simulated:
    """The flow-level simulator, at the real rates."""

    sim: SimOptions = field(default_factory=SimOptions)
    link_events: Sequence[LinkEvent] = ()
    all_to_all: str = "auto"  # traffic.replay.simulate.A2A_MODELS
    name: str = "flowsim"
    # NCCL's choices simulated alone against the other algorithms, and the run's notes say where one is > 10%
    # slower (`traffic.replay.alone`)
    check_choice: bool = True

    def plan(self, workload: Workload, fabric: Fabric, options: ReplayOptions) -> ReplayPlan:
        check_all_to_all(self.all_to_all)  # before anything is planned
        return plan_for_simulation(workload, fabric,
                                   dataclasses.replace(options, nvlink_latency_us=self.sim.nvlink_latency_s * 1e6))

    def run(self, plan: ReplayPlan, routing: str, progress: Progress | None) -> BackendRun:
        run = simulate_plan(plan, routing, self.sim, self.link_events, self.all_to_all, progress)
        note = choice_check_note(plan, routing, self.sim) if self.check_choice else None
        return dataclasses.replace(run, notes=(*run.notes, note)) if note else run
