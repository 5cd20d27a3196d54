"""Replay a workload on an emulated fabric: the session composes the lab, the plan and the driver.

    result = replay_on_emulation(workload, "trace.json.gz", topofile.load("dual-plane-16"), "adaptive",
                                 ReplayOptions(), out_dir)

Brings up the lab (controller first, then the fabric) at the replay's link scale, plans the replay,
runs the agents, samples the switches' port counters from the controller's REST API, and builds the
`RunResult` with the controller's reroute events and the faults injected meanwhile (`during` may inject
them: it is called with the lab and the number of collectives completed so far).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from fabric.emulation import EmulationOptions
from fabric.model import Fabric
from fabriclab.session import Lab
from traffic.replay import Driver, ReplayOptions, build_result, plan_replay
from traffic.results import RunResult
from traffic.workload import Workload

Progress = Callable[[int, int], None]

#: The controller's port polling is scaled with the emulated link rate: as many bytes per poll as
#: `fabriclab up`'s 10 ms polls see at 20 Mbit/s, between 10 and 100 ms. At the replay's default
#: 1 Mbit/s NICs a full-size frame takes 12 ms, so 10 ms polls see one packet or none, and cost the
#: 2-core machine ~70% of a core (controller and ovs-vswitchd, measured) that the agents and the
#: datapath then lack.
POLL_MS_AT_20_MBPS = 10.0


def controller_poll_ms(fabric: Fabric, mbps_per_gbps: float) -> float:
    nic_mbps = max(p.rate_gbps for p in fabric.nic_ports) * mbps_per_gbps
    return min(100.0, max(10.0, POLL_MS_AT_20_MBPS * 20.0 / nic_mbps))


def replay_on_emulation(workload: Workload, trace_label: str, fabric: Fabric, routing: str, options: ReplayOptions,
                        out_dir: Path | None = None, *, progress: Progress | None = None,
                        during: Callable[[Lab, int, int], None] | None = None,
                        log: Callable[[str], None] | None = None, link_interval_s: float = 0.5) -> RunResult:
    plan = plan_replay(workload, fabric, options)  # bad input fails before anything is built
    poll_ms = controller_poll_ms(fabric, plan.mbps_per_gbps)
    with Lab(fabric, routing=routing, opts=EmulationOptions(mbps_per_gbps=plan.mbps_per_gbps), log=log,
             controller_args=["--poll-ms", f"{poll_ms:g}"]) as lab:
        if lab.emulation is None or lab.controller is None or lab.run_dir is None:
            raise RuntimeError("the lab did not come up")
        ctl = lab.controller

        def counters() -> dict[tuple[str, int], int]:
            return {(sw, int(port)): int(tx) for sw, port, tx, _rx in ctl.get("/api/counters")["ports"]}

        def done(n: int, total: int) -> None:
            if progress is not None:
                progress(n, total)
            if during is not None:
                during(lab, n, total)

        raw = Driver(plan, lab.emulation, lab.run_dir, counters, link_interval_s, done).run()
        events = ctl.get("/api/events?limit=100000")
        faults = [{"kind": f.kind, "target": f.target, "up": f.up, "at_s": f.at_s}
                  for f in (lab.faults.log if lab.faults else [])]
        gaps = tuple(f"the controller died and was restarted during the run ({g.gap_s} s to resync)"
                     for g in lab.controller_gaps)
    result = build_result(plan, raw, trace=trace_label, topology=fabric.name, routing=routing, faults=faults,
                          events=events, extra_notes=gaps)
    if out_dir is not None:
        result.write(out_dir)
    return result
