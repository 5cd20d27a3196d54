"""One collective alone on the fabric, and NCCL's choice checked against the simulator.

NCCL picks its algorithm from its own cost model (`traffic.nccl_choice`), which knows nothing of the fabric's
paths. So after a simulated run, each distinct collective whose algorithm NCCL chose is simulated alone on the
same fabric, hosts, routing, connections rule and latencies, once with each algorithm NCCL could run for it
(NCCL_ALGO forced, NCCL's protocol for that algorithm); where the one chosen comes out more than
`SLOWER_BY` later than the best, the run's notes say so, with both times. "Alone": every link up, no other
call in flight; one group of each shape (kind, size, ranks, servers, GPUs a server) stands for the others.
Checks are bounded (`BUDGET_TRANSFERS`): shapes past it are named as not checked, never silently skipped.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fabric.flowsim import SimOptions
from fabric.model import Fabric
from traffic.formatting import format_bytes
from traffic.nccl_choice import TUNED_KINDS
from traffic.replay.plan import ReplayOptions, ReplayPlan, Template, group_choice
from traffic.workload import Collective, RankTrace, Step, Workload

#: the chosen algorithm is called out when it simulates more than this much later than another
SLOWER_BY = 0.10
#: transfers the checks of one run may simulate in all (the largest groups are left out first)
BUDGET_TRANSFERS = 2_000_000
#: the algorithms NCCL_ALGO may force (NCCL falls back where one does not run the collective)
FORCED = ("ring", "tree", "pat")


def one_collective(kind: str, size_bytes: int, ranks: Sequence[int], world_size: int) -> Workload:
    """A one-step workload of a single collective over `ranks` (ascending) in a job of `world_size` ranks."""
    c = Collective(kind, size_bytes, "bfloat16", tuple(ranks), "0")
    return Workload("alone", "alone", "generated", world_size,
                    tuple(RankTrace(r, (Step(0, None, (), (c,)),)) for r in ranks), False)


def collective_alone_s(kind: str, size_bytes: int, ranks: Sequence[int], world_size: int, fabric: Fabric,
                       routing: str, options: ReplayOptions, sim: SimOptions) -> tuple[float, str, str]:
    """(seconds, algorithm, protocol) of one collective alone on `fabric` under `options` (its placement,
    connections rule, NCCL_ALGO) and `sim` (latencies, resolution), every link up."""
    from traffic.replay.simulate import plan_for_simulation, simulate_plan

    opts = dataclasses.replace(options, ranks=None, repeat=1, step_ops=None)
    plan = plan_for_simulation(one_collective(kind, size_bytes, ranks, world_size), fabric, opts)
    run = simulate_plan(plan, routing, sim, links=False)
    start = min(c.start_s for c in run.timings.calls)
    end = max(c.end_s for c in run.timings.calls)
    t = plan.templates[0]
    return end - start, t.algorithm, t.proto


def _shape(plan: ReplayPlan, ranks: Sequence[int]) -> tuple[int, int, tuple[int, ...]]:
    """(ranks, servers, GPUs of the group in each server) of a group under the plan's placement."""
    per: dict[object, int] = {}
    for r in ranks:
        s = plan.fabric.server_of(plan.placement.host(r))
        per[s] = per.get(s, 0) + 1
    return len(ranks), len(per), tuple(sorted(per.values()))


def choice_check_note(plan: ReplayPlan, routing: str, sim: SimOptions) -> str | None:
    """The run's note on NCCL's choices checked alone (module docstring); None where NCCL chose nothing."""
    o = plan.options
    if o.algorithm != "nccl" or o.nccl_algo != "auto":
        return None
    shapes: dict[tuple[str, int, tuple[int, int, tuple[int, ...]]], Template] = {}
    for t in plan.templates:
        if t.kind in TUNED_KINDS and not t.discarded and t.local_us is None:
            shapes.setdefault((t.kind, t.size_bytes, _shape(plan, t.ranks)), t)
    if not shapes:
        return None
    slower: list[str] = []
    skipped: list[str] = []
    checked = spent = 0
    for (kind, size, shape), t in sorted(shapes.items(), key=lambda kv: (kv[1].transfer_count, str(kv[0]))):
        label = f"{kind} {format_bytes(size)} over {shape[0]} GPUs ({shape[1]} servers)"
        algos = {group_choice(kind, size, t.ranks, plan.placement, plan.fabric, o.channels, a).algo for a in FORCED}
        if len(algos) < 2:
            continue
        cost = t.transfer_count * len(algos)
        if spent + cost > BUDGET_TRANSFERS:
            skipped.append(label)
            continue
        spent += cost
        checked += 1
        times = {}
        for a in sorted(algos):
            forced = dataclasses.replace(o, nccl_algo=a)
            s, algo, proto = collective_alone_s(kind, size, t.ranks, plan.workload.world_size, plan.fabric, routing,
                                                forced, sim)
            times[f"{algo}/{proto}"] = s
        mine = f"{t.algorithm}/{t.proto}"
        best = min(times, key=times.__getitem__)
        if mine in times and times[mine] > (1 + SLOWER_BY) * times[best]:
            slower.append(f"{label}: NCCL's {mine} {times[mine] * 1e6:.1f} us, {best} {times[best] * 1e6:.1f} us "
                          f"({times[mine] / times[best] - 1:+.0%})")
    if not checked and not skipped:
        return None
    head = (f"NCCL's choice checked alone on the fabric (each algorithm it could run, every link up): {checked} "
            "collective shape(s)")
    body = ("; chosen > 10% slower than another: " + "; ".join(slower)) if slower else ", each within 10% of the best"
    tail = (f"; not checked (over {BUDGET_TRANSFERS:,} transfers): " + ", ".join(skipped)) if skipped else ""
    return head + body + tail

