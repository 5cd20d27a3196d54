"""The simulator backend's side in traffic (`fabric.flowsim`): a plan run on the flow-level simulator.

    plan = plan_for_simulation(workload, topofile.load("dual-plane-1024"), ReplayOptions())
    run = simulate_plan(plan, "adaptive", SimOptions(per_hop_s=1e-6))   # a BackendRun
    result = build_result(plan, run, trace="trace.json.gz", routing="adaptive")

The same plan as the emulation's (`plan_replay`: calls matched across ranks, their order and
dependencies, the collective schedules, the placement, the connections), planned at the real rates (link
scale 1000 Mbit/s per Gbit/s, dilation 1: nothing is scaled). Each call becomes one simulator job: its
collective's transfer DAG at real sizes, placed on the plan's hosts, started once the calls it
depends on have completed; a call whose collective is all in-server (`Template.local_us`) is a job
without transfers that takes `count x local_us` (no link carries it; 0 for an empty collective, which NCCL
discards: `traffic.collectives.discarded`), and a mixed one's in-server
transfers take their NVLink time (`fabric.flowsim.executor`). The routing policy is the controller's (`fabric.routing.load_policy`),
driven by the link events given (a link down or up at a real time since the first collective).

What it measures beside the calls' times (`BackendRun`): per-link utilisation over `LINK_BINS` equal
intervals of the run, the link events as faults, the policy's reroutes as controller events, the ECMP
collisions of the plan's connections, and notes on the model. What the simulator models and does not
is in `fabric.flowsim`; the report says it. `fabriclab.backends.Simulated` runs it for the CLI.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fabric.flowsim import FlowSimResult, Job, LinkEvent, SimOptions, SimProgress, directed_links, simulate
from fabric.flowsim.collisions import ecmp_collisions
from fabric.flowsim.routes import LinkRoutes
from fabric.model import Fabric
from fabric.transfers import TransferColumns
from fabric.routing import PathTable, load_policy
from traffic.replay.plan import GROUPED_A2A, ReplayError, ReplayOptions, ReplayPlan, plan_replay, protocol_costs
from traffic.replay.result import busiest_links
from traffic.replay.timings import BackendRun, CallTimes, RunProgress, RunTimings
from traffic.results import Fidelity, LinkSeries
from traffic.workload import Workload

#: link utilisation is reported over this many equal intervals of the run
LINK_BINS = 200
#: How an all-to-all's n - 1 rounds are simulated (`simulate_plan`'s `all_to_all`):
#: - "exact": the DAG as scheduled (pairwise: a rank's round-k send waits for its round k - 1 receive, so
#:   rounds drift into each other where ECMP collisions slow some flows; ~n^2 transfers, each flow end an
#:   event: at 512 hosts on pyramid hashed ECMP 4e5 rate computations, minutes);
#: - "lockstep": round k + 1 begins once every transfer of round k is delivered (no drift);
#: - "sampled": lockstep, and of every block of `sample_phases(n)` rounds only the first is simulated, the
#:   others run as it ran (`fabric.flowsim.Job.sample_phases`; their bytes on their own paths);
#: - "auto": exact up to `A2A_EXACT_MAX` ranks (the emulated fabrics: the simulator then runs the DAG the
#:   emulation replay runs), sampled above, so that the sizes of one comparison share one model.
#: What each costs in accuracy is measured by benchmarks/compare.py (figures in benchmarks/RESULTS.md).
A2A_MODELS = ("auto", "exact", "lockstep", "sampled")
A2A_EXACT_MAX = 16
#: rounds an all-to-all simulates at most under "sampled"
A2A_SAMPLED_ROUNDS = 32
#: the plan's scale for the simulator: links at their real rates, bytes as recorded
REAL_MBPS_PER_GBPS = 1000.0
_NONE = np.zeros(0, dtype=np.int64)
#: the DAG of a job without transfers (an all in-server call)
NO_TRANSFERS = TransferColumns(_NONE, _NONE, _NONE, _NONE, np.zeros(1, dtype=np.int64), _NONE, (),
                               label="in-server collective")

MODEL_NOTE = ("simulated by fabric.flowsim: fluid flows at max-min fair shares of the link capacities on the "
              "routing policy's paths, recomputed at every flow start, flow end and link event; no packets, "
              "queues, TCP dynamics or failure-detection time; latency only as the per-transfer and per-hop "
              "overheads ({overheads}); congestion feedback {feedback}; {forwarding}; one set of connections per host "
              "pair and stream, as the replay's")


def parse_link_event(text: str, fabric: Fabric, up: bool) -> LinkEvent:
    """`SWITCH:PORT@MICROSECONDS` (real time since the first collective) -> a `LinkEvent`, checked
    against the fabric: the switch exists and the port has a link."""
    where, at, when = text.partition("@")
    switch, colon, port_s = where.rpartition(":")
    if not at or not colon:
        raise ReplayError(f"link event {text!r}: expected SWITCH:PORT@MICROSECONDS, e.g. spine0-a:1@1500")
    try:
        port = int(port_s)
        time_us = float(when)
    except ValueError:
        raise ReplayError(f"link event {text!r}: the port must be an integer and the time a number of "
                          "microseconds") from None
    if not time_us >= 0 or time_us == float("inf"):
        raise ReplayError(f"link event {text!r}: the time must be finite and >= 0 microseconds")
    if switch not in fabric.switch_by_name:
        raise ReplayError(f"link event {text!r}: no switch {switch!r} in fabric {fabric.name!r}")
    ports = sorted(e.port for link in fabric.links for e in (link.a, link.b) if e.node == switch)
    if port not in ports:
        raise ReplayError(f"link event {text!r}: switch {switch} has no link on port {port} (ports: "
                          f"{', '.join(map(str, ports))})")
    return LinkEvent(time_us / 1e6, switch, port, up)


def plan_for_simulation(workload: Workload, fabric: Fabric, options: ReplayOptions) -> ReplayPlan:
    """The replay's plan at the real rates: nothing scaled (bytes scale 1, dilation 1)."""
    return plan_replay(workload, fabric, dataclasses.replace(options, mbps_per_gbps=REAL_MBPS_PER_GBPS, dilation=1.0))


def sample_phases(n_ranks: int, model: str) -> tuple[bool | None, int]:
    """(the job's lockstep, its phase sampling) for an all-to-all over `n_ranks` under `model` (A2A_MODELS);
    None: as the options say."""
    check_all_to_all(model)
    if model == "auto":
        model = "exact" if n_ranks <= A2A_EXACT_MAX else "sampled"
    if model == "exact":
        return None, 1
    if model == "lockstep":
        return True, 1
    return True, max(1, math.ceil((n_ranks - 1) / A2A_SAMPLED_ROUNDS))


def check_all_to_all(model: str) -> None:
    if model not in A2A_MODELS:
        raise ReplayError(f"all-to-all model must be one of {', '.join(A2A_MODELS)}, got {model!r}")


def simulate_plan(plan: ReplayPlan, routing: str, sim: SimOptions | None = None, link_events: Sequence[LinkEvent] = (),
                  all_to_all: str = "auto", progress: Callable[[RunProgress], None] | None = None,
                  links: bool = True) -> BackendRun:
    """`plan` (`plan_for_simulation`'s) on the simulator under `routing`: its calls' times and measurements (`links`
    False: no per-link series, for callers that need the times only)."""
    sim = sim or SimOptions()
    check_all_to_all(all_to_all)
    tell = progress or (lambda p: None)
    wall0, t0 = time.time(), time.monotonic()
    fabric = plan.fabric
    if sim.nvlink_latency_s and abs(sim.nvlink_latency_s * 1e6 - plan.options.nvlink_latency_us) > 1e-9:
        raise ReplayError(f"NVLink latency {sim.nvlink_latency_s * 1e6:g} us to simulate a plan made with "
                          f"{plan.options.nvlink_latency_us:g} us (plan it with that ReplayOptions.nvlink_latency_us)")
    sim = dataclasses.replace(sim, channels=plan.options.channels, merge_nics=plan.options.merge_nics,
                              ports=plan.options.ports, seed=plan.options.seed,
                              nvlink_latency_s=plan.options.nvlink_latency_us / 1e6,
                              transfer_times=False)  # the report needs the calls' times only
    policy = load_policy(routing)(PathTable(fabric))
    # every link up; each lane's connections counted among themselves (a stream's calls run one at a time)
    tell(RunProgress("connections", calls=len(plan.calls)))
    table = plan.connections
    routes = LinkRoutes(fabric, policy, directed_links(fabric)[0])
    paths = routes.rows(table.src_nic, table.dst_nic, table.sport)  # walked once: the run starts on them
    lane = table.pair_lane
    per_lane = [ecmp_collisions(policy, table, routes, paths,
                                np.flatnonzero(np.repeat(lane == k, np.diff(table.pair_ptr))))
                for k in np.unique(lane).tolist()]
    ecmp: dict[str, Any] = {k: sum(c[k] for c in per_lane) for k in ("collisions", "choices", "ports_idle")}
    ecmp["by_role"] = {}
    for c in per_lane:
        for role, k in c["by_role"].items():
            ecmp["by_role"][role] = ecmp["by_role"].get(role, 0) + k
    jobs = []
    a2a: set[tuple[str, int]] = set()  # (model, ranks) of the all-to-alls, for the note
    for call in plan.calls:
        tpl = plan.templates[call.template]
        if tpl.local_us is not None:  # all in-server (or discarded): no transfer on the fabric, the NVLink time
            jobs.append(Job(NO_TRANSFERS, plan.placement, after=call.deps, lane=tpl.lane,
                            hold_s=tpl.local_us * call.count / 1e6))
            continue
        lock, every = (None, 1)
        # (an all-to-all posted as one group has rounds of two kinds, network and NVLink, not alike: simulated exactly)
        if tpl.kind == "all_to_all" and tpl.algorithm != GROUPED_A2A and not sim.cut_through:
            lock, every = sample_phases(len(tpl.ranks), all_to_all)
            a2a.add(("sampled" if every > 1 else "lockstep" if lock else "exact", len(tpl.ranks)))
        # NCCL's protocol's latencies (store and forward only: under cut-through the agents' own delays hold)
        _, net_scale, nvlink_scale = protocol_costs(tpl.algorithm, tpl.proto) if not sim.cut_through else (1, 1, 1)
        jobs.append(Job(tpl.dag, plan.placement, after=call.deps, lane=tpl.lane, lockstep=lock, sample_phases=every,
                        net_latency_scale=net_scale, nvlink_latency_scale=nvlink_scale))
    weight = np.asarray([max(plan.templates[c.template].size_bytes, 1) for c in plan.calls], dtype=np.float64)
    recorded_s = sum(c.collective.duration_us or 0.0 for c in plan.calls) / 1e6

    started = time.monotonic()

    def simulated(p: SimProgress) -> None:
        done = ~np.isnan(p.job_end_s)
        tell(RunProgress("simulate", p.jobs_done, p.jobs, float(weight[done].sum() / weight.sum()) if weight.size else 1.0,
                         p.now_s, recorded_s, p.events, p.rate_updates, time.monotonic() - started))

    res = simulate(fabric, policy, jobs, options=sim, link_events=link_events, connections=table, routes=paths,
                   progress=simulated if progress is not None else None)
    if res.stalled:
        job = int(np.searchsorted(np.asarray(res.job_offsets), res.stalled[0], side="right")) - 1
        call = plan.calls[job]
        raise ReplayError(f"the simulation stalled: {len(res.stalled)} transfer(s) never delivered, first in call "
                          f"{call.id} ({call.collective.kind}, step {call.step}): no live path between its hosts "
                          "after the link events given")
    begun, done = res.job_start_s.tolist(), res.job_end_s.tolist()  # (Python floats, not 2 x 217k numpy scalars)
    calls = tuple(CallTimes(c.id, begun[c.id], done[c.id]) for c in plan.calls)
    interval, series = link_series(fabric, res) if links else (0.0, [])
    overheads = f"{sim.per_transfer_s * 1e6:g} us per transfer, {sim.per_hop_s * 1e6:g} us per hop"
    notes = (MODEL_NOTE.format(overheads=overheads, forwarding=(
                 "cut-through, as the emulation replay forwards: a transfer begins with what it depends on, a "
                 "pair's transfers in turn" if sim.cut_through else
                 "store and forward: a transfer starts once its dependencies are delivered in full (the "
                 "emulation replay forwards cut-through)"), feedback=(
                 f"every {sim.poll_s * 1e3:g} ms (exact link and slot rates to the policy; {res.polls} polls, "
                 f"{res.congestion_moves} slots moved)" if sim.poll_s > 0 else "off")),
             f"simulator cost: {res.rate_updates} rate computations, {res.route_changes} link events",
             *([f"time resolution {sim.resolution_s * 1e6:g} us: events within it of the first are taken together "
                "(--resolution-us)"] if sim.resolution_s > SimOptions().resolution_s else []),
             *_a2a_notes(a2a, res))
    faults = tuple({"kind": "link", "target": f"{e.switch}:{e.port}", "up": e.up, "at_emu_s": e.time_s}
                   for e in sorted(link_events, key=lambda e: e.time_s))
    events = tuple({"time_s": e.time_s, "cause": m.cause, "trigger": e.trigger, "switch": m.switch, "dest": m.dest,
                    "slot": m.slot, "old_port": m.old_port, "new_port": m.new_port, "decision_us": e.decision_us,
                    "at_emu_s": e.time_s} for e in policy.events() for m in e.moves)
    timings = RunTimings(calls, t0, time.monotonic(), wall0)
    return BackendRun("flowsim", timings, interval, tuple(series), _fidelity(series, interval), faults, events, notes,
                      scaled=False, extra={"ecmp": ecmp})


def _a2a_notes(models: set[tuple[str, int]], res: FlowSimResult) -> tuple[str, ...]:
    """What the run's all-to-alls were simulated by (`A2A_MODELS`)."""
    out = []
    for model, n in sorted(models, key=lambda m: m[1]):
        if model == "exact":
            out.append(f"all-to-all over {n} ranks: the exact DAG")
        elif model == "lockstep":
            out.append(f"all-to-all over {n} ranks: rounds in lockstep (each waits for the whole round before)")
        else:
            k = sample_phases(n, "sampled")[1]
            out.append(f"all-to-all over {n} ranks: rounds in lockstep, sampled: the first round of each block of "
                       f"{k} simulated, the block's others run as it ran, their bytes on their own paths "
                       f"({res.phases_sampled} rounds in this run; error measured in benchmarks/RESULTS.md)")
    return tuple(out)


def link_series(fabric: Fabric, res: FlowSimResult, bins: int = LINK_BINS) -> tuple[float, list[LinkSeries]]:
    """Every switch egress port's utilisation over `bins` equal intervals from 0 to the last load."""
    edges = res.edges_s
    if len(edges) < 2 or not edges[-1] > 0:
        return 0.0, []
    end = float(edges[-1])
    interval = end / bins
    grid = np.linspace(0.0, end, bins + 1)
    # cut the simulator's intervals at the grid's edges, so each piece lies in one bin
    cuts = np.union1d(edges, grid[(grid > edges[0]) & (grid < end)])
    parent = np.searchsorted(edges, cuts[:-1], side="right") - 1  # the simulator interval of each piece
    piece_s = np.diff(cuts)
    piece_bin = np.minimum(np.searchsorted(grid, cuts[:-1], side="right") - 1, bins - 1)
    counts = np.diff(res.load_ptr)[parent]  # entries of each piece
    starts = res.load_ptr[:-1][parent]
    idx = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    piece_of_entry = np.repeat(np.arange(len(piece_s)), counts)
    n_links = len(res.links)
    bits = np.bincount(piece_bin[piece_of_entry] * n_links + res.load_link[idx],
                       weights=res.load_bps[idx] * piece_s[piece_of_entry], minlength=bins * n_links)
    bits = bits.reshape(bins, n_links)
    out = []
    for link in fabric.links:
        for end_, other in ((link.a, link.b), (link.b, link.a)):
            if end_.node not in fabric.switch_by_name:
                continue
            i = res.link_index(end_.node, other.node)
            cap = float(res.capacity_bps[i])
            util = tuple(float(u) for u in np.clip(bits[:, i] / (cap * interval), 0.0, None))
            tier = "host" if other.node in fabric.host_by_name else "fabric"
            out.append(LinkSeries(end_.node, end_.port, other.node, cap, tier, fabric.switch_by_name[end_.node].plane,
                                  round(bits[:, i].sum() / 8), util))
    return interval, out


def _fidelity(links: list[LinkSeries], interval_s: float) -> Fidelity:
    """The simulator runs no datapath: nothing is CPU-bound. The busiest links' delivered rate while busy
    is shown against their capacity (the fluid model's bound; no packet overheads)."""
    return Fidelity(1.0, False, tuple(busiest_links(links, interval_s, 1.0)), ())
