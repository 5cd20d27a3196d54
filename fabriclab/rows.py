"""The rows of a comparison: a series (a fabric template and a routing mode, and a variant of it), a row (one series
at one size: its figures and their causes), how a row is read from a simulated run (`row_from_result`), and
scaling efficiency across a series' sizes (`with_efficiency`).

Per row (definitions in docs/architecture.md; times real):
- step time mean and p99 over the steps (the job's step, rank -1: the slowest rank's, split as the ranks' mean);
  utilisation = compute / step and communication share = exposed communication / step, averaged over the
  steps; busbw = sum(bytes x 8 x nccl-tests factor) / sum(durations) over the collectives that move data, and
  by process group (stream);
- scaling efficiency = throughput per GPU at N / at the series' smallest size (a fixed batch per GPU, so
  throughput per GPU is 1 / mean step);
- the evidence per link, over the fabric links (switch to switch, both directions): hot-link share = of the
  (link, interval) pairs in which a link was busy (> `BUSY_UTIL`), the share above `HOT_UTIL`; max / mean load;
  the hottest link's peak by tier; ECMP collisions among the connections, counted on their paths.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fabric import topofile
from fabric.errors import FabriclabError

BUSY_UTIL, HOT_UTIL = 0.05, 0.9


class CompareError(FabriclabError):
    """A comparison cannot be set up; the message names the offending item."""


@dataclass(frozen=True)
class Series:
    topology: str  # a builder topology file or shipped name, built at each size
    routing: str
    # a variant of the series (the sensitivity sweep's points, `fabriclab.sensitivity`): its name (the rows'
    # `variant`), builder parameters replaced in the template (`topofile.scaled`'s overrides), replay options
    # replaced (e.g. ("ports", "planned")) and LLM spec overrides ("key=value,...")
    variant: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    extra: str = ""

    def doc(self) -> dict[str, Any]:
        """The series as JSON: the fields that are set (a plain series is its topology and routing)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k in ("topology", "routing") or v}


DEFAULT_SERIES = (Series("pyramid-1024", "ecmp"), Series("dual-plane-1024", "adaptive"))
#: for generated LLM steps: servers of 8 GPUs, rail-wired, the same bandwidth per GPU
LLM_SERIES = (Series("pyramid-1024-rail", "ecmp"), Series("dual-plane-1024-rail", "adaptive"))


@dataclass(frozen=True)
class Row:
    topology: str  # the template
    fabric: str  # the fabric built at this size
    routing: str
    gpus: int
    steps: int
    step_mean_us: float
    step_p99_us: float
    utilisation: float
    comm_share: float
    busbw_bps: float
    hot_link_share: float
    load_max_over_mean: float
    ecmp_collisions: int
    ecmp_choices: int
    variant: str = ""  # "" or "stragglers" (the LLM spec with the straggler overrides: `compare(stragglers=...)`)
    cluster_gpus: int = 0  # the fabric's GPUs, when the job holds only part of it (a fragmented placement)
    mfu: float = math.nan  # model FLOPs utilisation, for generated LLM steps (`traffic.llm`)
    idle_share: float = 0.0  # of the step, neither computing nor communicating: waits for other ranks
    exposed_by_group: dict[str, float] = field(default_factory=dict)  # stream -> exposed comm / step
    busbw_by_group: dict[str, float] = field(default_factory=dict)  # stream -> busbw, bit/s
    hottest_by_tier: dict[str, float] = field(default_factory=dict)  # "tor->agg" -> its hottest link's peak util
    collisions_by_tier: dict[str, int] = field(default_factory=dict)  # switch role -> ECMP collisions there
    algorithm: str = ""  # the all-reduce algorithm of this row (resolved: hierarchical above the threshold)
    lockstep: bool = False  # the collectives' steps ran in lockstep (SimOptions.lockstep)
    efficiency: float = math.nan  # filled once the series' base size is known
    sim_wall_s: float = 0.0  # wall time of the simulation (set-up included)
    cached: bool = False
    spec: dict[str, Any] = field(default_factory=dict)  # the resolved run (fabriclab.study.spec.Resolved.doc)


@functools.lru_cache(maxsize=64)
def builder_of(topology: str) -> str:
    """The builder of a topology template ("pyramid", "dual_plane", ...), read once per name (reading
    builds the fabric: seconds for 1024 hosts)."""
    return topofile.template(topology)[0]


def _tier(fab: Any, switch: str, peer: str) -> str:
    roles = fab.switch_by_name
    return f"{roles[switch].role}->{roles[peer].role}" if peer in roles else f"{roles[switch].role}->host"


def row_from_result(result: Any, topology: str, fabric: str, routing: str, gpus: int, fab: Any = None) -> Row:
    """The table's row from a simulated `RunResult` (module docstring); `fab` (the fabric it ran on)
    names the links' tiers."""
    from traffic import metrics
    from traffic.report.summary import mean_shares, pooled_busbw_bps

    steps = [s for s in result.steps if s.rank == -1]
    if not steps:
        raise CompareError(f"{fabric} ({routing}): the run has no steps")
    pct = metrics.percentiles([s.step_us for s in steps])
    shares = mean_shares(steps)
    busbw, busbw_by_group = pooled_busbw_bps(result.collectives)
    fabric_links = [l for l in result.links if l.tier == "fabric"]
    busy = [u for l in fabric_links for u in l.util if u > BUSY_UTIL]
    loads = [l.emu_bytes for l in fabric_links]
    mean_load = sum(loads) / len(loads) if loads else 0.0
    ecmp = result.extra.get("ecmp", {})
    hottest: dict[str, float] = {}
    if fab is not None:
        for l in fabric_links:
            t = _tier(fab, l.switch, l.peer)
            hottest[t] = max(hottest.get(t, 0.0), max(l.util, default=0.0))
    t = result.meta.training
    mfu = metrics.mfu(t["model_flops_per_step"], pct.mean, t["peak_flops_per_gpu"], t["world_size"]) if t else math.nan
    return Row(
        topology=topology, fabric=fabric, routing=routing, gpus=gpus, steps=len(steps),
        mfu=float(mfu), idle_share=shares["idle_share"], exposed_by_group=shares["exposed_by_stream"],
        busbw_by_group=busbw_by_group, hottest_by_tier=hottest, collisions_by_tier=dict(ecmp.get("by_role", {})),
        step_mean_us=pct.mean, step_p99_us=pct.p99, utilisation=shares["utilisation"], comm_share=shares["comm_share"],
        busbw_bps=busbw,
        hot_link_share=sum(u > HOT_UTIL for u in busy) / len(busy) if busy else 0.0,
        load_max_over_mean=max(loads) / mean_load if mean_load > 0 else 0.0,
        ecmp_collisions=int(ecmp.get("collisions", 0)), ecmp_choices=int(ecmp.get("choices", 0)))


def with_efficiency(rows: Sequence[Row]) -> list[Row]:
    """Scaling efficiency per row: 1 / mean step (throughput per GPU, fixed batch per GPU) at N over
    the same at the series' smallest size."""
    base: dict[tuple[str, str, str], Row] = {}
    for r in sorted(rows, key=lambda r: r.gpus):
        base.setdefault((r.topology, r.routing, r.variant), r)
    return [dataclasses.replace(r, efficiency=base[(r.topology, r.routing, r.variant)].step_mean_us / r.step_mean_us)
            for r in rows]
