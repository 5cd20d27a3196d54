"""`fabriclab compare`: one workload over fabrics, routing modes and sizes, on the flow-level simulator.

    rows = compare("trace.json.gz", [Series("pyramid-1024", "ecmp"), Series("dual-plane-1024", "adaptive")],
                   sizes=[128, 256, 512, 1024])

Each configuration is a series (a builder topology file, used as a template, and a routing mode) at a
size N: the template built at N hosts (`fabric.topofile.scaled`: same NIC rates, edge switch size and
oversubscription), the trace mapped onto N ranks, one per host, and run by `fabriclab sim`'s code
(`fabriclab.backends.Simulated`). The default series have the same bandwidth per host (pyramid: one 400G
NIC; dual-plane: two 200G NICs, one per plane).

The all-reduce is a ring (`--algorithm`) up to `FLAT_RING_MAX` GPUs and its hierarchical form above
(the row's `algorithm` says which). The plan is made on arrays (`plan_replay`,
`schedule_columns`) and the simulator holds the state of the running calls only, so 16,384 GPUs plan
in seconds and run in bounded memory. Above `FLAT_RING_MAX` the collectives also run in lockstep
(`SimOptions.lockstep`, `lockstep="auto"`; the row's `lockstep` says so): each step of a collective
waits for all of the step before, so flows that hashed ECMP slows do not drift apart event by event.
A ring runs at its slowest hop's pace either way (measured: the same job times on the 16-host
fabrics with collisions, tests/test_flowsim_phases.py); the exact DAG at 1024 GPUs and above can take hours.

Per row (definitions in docs/architecture.md; times real):
- step time mean and p99 over the steps (composed from the trace's compute with the simulated
  collectives); utilisation = compute / step and communication share = exposed communication / step,
  both averaged over the steps; busbw = sum(bytes x 8 x nccl-tests factor) / sum(durations) over
  the collectives that move data;
- scaling efficiency = throughput per GPU at N / at the series' smallest size. The trace's batch
  per GPU is fixed (weak scaling), so throughput per GPU is 1 / mean step time;
- the evidence per link, over the fabric links (switch to switch, both directions): hot-link share =
  of the (link, interval) pairs in which a link was busy (> 5% utilised), the share above 90%;
  max / mean load = the most bytes a link carried over the mean of all fabric links (1: perfectly
  even); ECMP collisions among the connections, counted on their paths (`ecmp_collisions`).

Rows run as Ray tasks (`fabriclab.sweep`), on a local Ray instance of `jobs` CPUs or on a cluster
(`cluster`), and each row is cached in `cache_dir` under a key of everything it depends on: the trace's
bytes, the template, routing, size, the options and the source code of `fabric` and `traffic`. A re-run
with one size changed computes only that size. `plan_rows` gives the rows as tasks, `run_row` runs one in
this process.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric import topofile
from fabric.errors import FabriclabError
from fabric.flowsim import SimOptions

CACHE_VERSION = 3
DEFAULT_SIZES = (128, 256, 512, 1024)
#: Above this many GPUs a ring all-reduce runs in its hierarchical form (rings inside each leaf, rings
#: across leaves): a flat ring over 16,384 ranks is 5.4e8 transfers of a few kB, latency-bound, and not
#: what NCCL runs at that size either (it switches to trees and hierarchical algorithms).
FLAT_RING_MAX = 1024
BUSY_UTIL, HOT_UTIL = 0.05, 0.9
ROOT = Path(__file__).resolve().parents[1]


def default_sim_options() -> SimOptions:
    """The simulator's options of a comparison when none are given: the default latencies and time
    resolution of `fabric.latency` (as `fabriclab compare`'s `--per-transfer-us`, `--per-hop-us` and
    `--resolution-us`)."""
    from fabric.latency import DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US, DEFAULT_RESOLUTION_US

    return SimOptions(per_transfer_s=DEFAULT_PER_TRANSFER_US / 1e6, per_hop_s=DEFAULT_PER_HOP_US / 1e6,
                      resolution_s=DEFAULT_RESOLUTION_US / 1e6)


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
    algorithm: str = ""  # the all-reduce algorithm asked for this row (FLAT_RING_MAX)
    lockstep: bool = False  # the collectives' steps ran in lockstep (SimOptions.lockstep)
    efficiency: float = math.nan  # filled once the series' base size is known
    sim_wall_s: float = 0.0  # wall time of the simulation (set-up included)
    cached: bool = False


# ---- one configuration (a task on a Ray worker, or in this process) ---------------------------------

def load_workload(task: dict[str, Any]) -> Any:
    """The workload of a row's task: its trace read (or its LLM step generated) as the row reads it."""
    from traffic.traces import load

    return load(task["trace"], compute_gap_us=task["opts"].get("compute_gap_us") or None,
                collectives_per_step=task["opts"].get("step_ops"))


def run_row(task: dict[str, Any], workload: Any = None, fab: Any = None,
            tell: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """One row (`plan_rows`' task) as a dict of `Row`'s fields: `workload` and `fab` as the sweep ships them
    (None: read and built here), `tell` called with each `traffic.replay.RunProgress`."""
    from fabriclab.backends import Simulated, run_workload
    from traffic.replay import ReplayOptions, RunProgress

    t0 = time.monotonic()
    if tell is not None:
        tell(RunProgress("load"))
    if fab is None:
        fab = topofile.scaled(task["topology"], task.get("cluster_gpus") or task["gpus"], task.get("params"))
    if workload is None:
        workload = load_workload(task)
    opts = ReplayOptions(**task["opts"])
    result = run_workload(workload, task["label"], fab, task["routing"], opts,
                          Simulated(SimOptions(**task["sim"]), all_to_all=task["all_to_all"]), progress=tell).result
    row = row_from_result(result, task["topology"], fab.name, task["routing"], task["gpus"], fab)
    return dataclasses.asdict(dataclasses.replace(row, sim_wall_s=time.monotonic() - t0, variant=task.get("variant", ""),
                                                  cluster_gpus=task.get("cluster_gpus") or task["gpus"],
                                                  algorithm=opts.algorithm, lockstep=bool(task["sim"]["lockstep"])))


def _row_task(tell: Callable[[Any], None], task: dict[str, Any], workload: Any, fab: Any) -> dict[str, Any]:
    """`run_row` as a sweep's task (`fabriclab.sweep`): its progress told as plain dicts."""
    return run_row(task, workload, fab, lambda p: tell(dataclasses.asdict(p)))


def _tier(fab: Any, switch: str, peer: str) -> str:
    roles = fab.switch_by_name
    return f"{roles[switch].role}->{roles[peer].role}" if peer in roles else f"{roles[switch].role}->host"


def row_from_result(result: Any, topology: str, fabric: str, routing: str, gpus: int, fab: Any = None) -> Row:
    """The table's row from a simulated `RunResult` (module docstring); `fab` (the fabric it ran on)
    names the links' tiers."""
    from traffic import metrics

    steps = [s for s in result.steps if s.rank == -1]
    if not steps:
        raise CompareError(f"{fabric} ({routing}): the run has no steps")
    pct = metrics.percentiles([s.step_us for s in steps])
    moving = [c for c in result.collectives if c.size_bytes > 0 and c.kind != "barrier"]
    bus_bits = sum(c.size_bytes * 8 * metrics.busbw_factor(c.kind, c.group_size) for c in moving)
    bus_s = sum(c.duration_real_us for c in moving) / 1e6
    fabric_links = [l for l in result.links if l.tier == "fabric"]
    busy = [u for l in fabric_links for u in l.util if u > BUSY_UTIL]
    loads = [l.emu_bytes for l in fabric_links]
    mean_load = sum(loads) / len(loads) if loads else 0.0
    ecmp = result.extra.get("ecmp", {})
    exposed: dict[str, float] = {}
    for st in steps:
        for k, v in st.exposed_by_stream_us.items():
            exposed[k] = exposed.get(k, 0.0) + v / st.step_us / len(steps)
    group_bits: dict[str, float] = {}
    group_s: dict[str, float] = {}
    for c in moving:
        group_bits[c.stream] = group_bits.get(c.stream, 0.0) + c.size_bytes * 8 * metrics.busbw_factor(c.kind, c.group_size)
        group_s[c.stream] = group_s.get(c.stream, 0.0) + c.duration_real_us / 1e6
    hottest: dict[str, float] = {}
    if fab is not None:
        for l in fabric_links:
            t = _tier(fab, l.switch, l.peer)
            hottest[t] = max(hottest.get(t, 0.0), max(l.util, default=0.0))
    t = result.meta.training
    mfu = metrics.mfu(t["model_flops_per_step"], pct.mean, t["peak_flops_per_gpu"], t["world_size"]) if t else math.nan
    return Row(
        topology=topology, fabric=fabric, routing=routing, gpus=gpus, steps=len(steps),
        mfu=float(mfu), idle_share=sum(s.idle_us / s.step_us for s in steps) / len(steps),
        exposed_by_group=exposed,
        busbw_by_group={k: group_bits[k] / group_s[k] for k in group_bits if group_s[k] > 0},
        hottest_by_tier=hottest, collisions_by_tier=dict(ecmp.get("by_role", {})),
        step_mean_us=pct.mean, step_p99_us=pct.p99,
        utilisation=sum(s.compute_us / s.step_us for s in steps) / len(steps),
        comm_share=sum(s.exposed_comm_us / s.step_us for s in steps) / len(steps),
        busbw_bps=bus_bits / bus_s if bus_s > 0 else 0.0,
        hot_link_share=sum(u > HOT_UTIL for u in busy) / len(busy) if busy else 0.0,
        load_max_over_mean=max(loads) / mean_load if mean_load > 0 else 0.0,
        ecmp_collisions=int(ecmp.get("collisions", 0)), ecmp_choices=int(ecmp.get("choices", 0)))


# ---- the sweep ------------------------------------------------------------------------------------

def _digest_paths(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(p.anchor)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def trace_digest(trace: str | Path) -> str:
    """What a trace's rows depend on: its files' bytes, or a generated LLM step's whole config (and the
    profile it reads)."""
    if is_llm(trace):
        from traffic.llm import load_config

        cfg = load_config(str(trace)[len("llm:"):])
        h = hashlib.sha256(cfg.model_dump_json().encode())
        if cfg.compute.profile:
            h.update(trace_digest(cfg.compute.profile).encode())
        return h.hexdigest()
    p = Path(trace)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    if not files:
        raise CompareError(f"{trace}: no trace files")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def builder_of(topology: str) -> str:
    """The builder of a topology template ("pyramid", "dual_plane", ...), read once per name (reading
    builds the fabric: seconds for 1024 hosts)."""
    return topofile.template(topology)[0]


def is_llm(trace: str | Path) -> bool:
    return isinstance(trace, str) and trace.startswith("llm:")


def llm_spec_at(trace: str, gpus: int, extra: str = "") -> str:
    """The generated LLM step `trace` ("llm:SPEC") at `gpus` GPUs, weak-scaled: TP, CP and PP as the spec
    says, DP = gpus / (TP x CP x PP), and the global batch scaled with DP so that every replica runs the
    same micro-batches (its pipeline, bubble and gradient size stay; throughput per GPU compares across
    sizes); `extra`: more overrides ("key=value,..."), e.g. stragglers."""
    from traffic.llm import load_config

    spec = trace[len("llm:"):]
    cfg = load_config(spec)
    par = cfg.parallel
    cell = par.tp * par.cp * par.pp
    if gpus % cell:
        raise CompareError(f"{trace} at {gpus} GPUs: {gpus} is not a multiple of TP x CP x PP = {par.tp} x {par.cp} x "
                           f"{par.pp} = {cell}")
    dp = gpus // cell
    per_replica = cfg.global_batch // par.dp  # samples per replica and step (micro-batches x micro-batch)
    out = f"{trace},parallel.dp={dp},global_batch={per_replica * dp}" + (f",{extra}" if extra else "")
    try:
        load_config(out[len("llm:"):])
    except FabriclabError as e:
        raise CompareError(f"{trace} at {gpus} GPUs (DP {dp}): {e}") from None
    return out


def cluster_gpus(job_gpus: int, occupancy: Any) -> int:
    """The fabric a fragmented job of `job_gpus` runs in: at least job / (1 - occupancy) GPUs, so that the
    free servers hold the job, doubled from the job's size (the shipped builders' sizes are powers of two)."""
    n = job_gpus
    while n * (1 - occupancy) < job_gpus:
        n *= 2
    return n


def code_digest() -> str:
    """The source of what a row depends on: the packages `fabric` and `traffic`."""
    return _digest_paths([f for pkg in ("fabric", "traffic") for f in (ROOT / pkg).rglob("*.py")])


def _key(task: dict[str, Any], trace: str, code: str) -> str:
    template = topofile.template(task["topology"])
    doc = {"v": CACHE_VERSION, "trace": trace, "template": template, "params": task.get("params") or {},
           "routing": task["routing"],
           "gpus": task["gpus"], "opts": task["opts"], "sim": task["sim"], "a2a": task["all_to_all"], "code": code}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class RowProgress:
    """A row being computed: which, its stage (`traffic.replay.RunProgress`), the calls done,
    the share of its bytes done, its simulated time so far and the calls' recorded time, events, the wall
    time of its simulation stage, the worker process computing it (PID, its node's IP address and Ray node
    id), and the time to go estimated from the share of bytes done (None until some are)."""

    label: str
    stage: str
    calls_done: int
    calls: int
    bytes_share: float
    sim_s: float
    recorded_s: float
    events: int
    wall_s: float
    pid: int = 0
    node: str = ""
    node_id: str = ""

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        if self.stage != "simulate" or not 0 < self.bytes_share < 1:
            return None
        return self.wall_s * (1 - self.bytes_share) / self.bytes_share

    def describe(self) -> str:
        if self.stage != "simulate":
            return f"{self.label}: {self.stage}"
        eta = self.eta_s
        recorded = f" (recorded: {self.recorded_s * 1e3:.4g} ms of collectives)" if self.recorded_s > 0 else ""
        return (f"{self.label}: {self.calls_done}/{self.calls} calls, {self.bytes_share:.0%} of bytes, simulated "
                f"{self.sim_s * 1e3:.4g} ms{recorded}, {self.events_per_s:,.0f} events/s"
                + (f", ~{eta:.0f} s to go" if eta is not None else ""))


@dataclass(frozen=True)
class CompareProgress:
    rows_done: int
    rows: int
    running: tuple[RowProgress, ...]


class RowsFailed(CompareError):
    """Some rows of a comparison failed (`fabriclab.sweep`: an error in the row, or its worker process lost
    twice); every other row finished. `rows`: those (with efficiency, in table order); `failed`: per failed
    row its label, kind ("error", "worker died") and message."""

    def __init__(self, rows: list[Row], failed: list[dict[str, str]]) -> None:
        self.rows = rows
        self.failed = failed
        names = "; ".join(f"{f['row']}: {f['error']}" for f in failed)
        super().__init__(f"{len(failed)} of {len(rows) + len(failed)} rows failed: {names}")


def plan_rows(trace: str | Path, series: Sequence[Series] = DEFAULT_SERIES, sizes: Sequence[int] = DEFAULT_SIZES, *,
              options: dict[str, Any] | None = None, sim: SimOptions | None = None, label: str | None = None,
              lockstep: str = "auto", all_to_all: str = "auto", stragglers: str | None = None
              ) -> tuple[list[dict[str, Any]], list[Any]]:
    """The rows of `compare` (its arguments) as tasks, in table order, and the fabric each runs on; every
    input checked (a bad one is a `CompareError` naming it, before anything runs). `run_row` runs one."""
    if lockstep not in ("auto", "on", "off"):
        raise CompareError(f"lockstep must be auto, on or off, got {lockstep!r}")
    from traffic.replay.simulate import A2A_MODELS

    if all_to_all not in A2A_MODELS:
        raise CompareError(f"all_to_all must be one of {', '.join(A2A_MODELS)}, got {all_to_all!r}")
    sizes = sorted({int(n) for n in sizes})
    if not sizes or sizes[0] < 2:
        raise CompareError(f"sizes must be >= 2 GPUs, got {list(sizes)}")
    if not series:
        raise CompareError("no series to compare")
    from fabric.routing import load_policy
    from traffic.placement import parse_fragmented, resolve_placement
    from traffic.replay import ReplayOptions, default_ports

    base_opts = dict(options or {})
    unknown = set(base_opts) - {f.name for f in dataclasses.fields(ReplayOptions)}
    if unknown:
        raise CompareError(f"unknown replay option(s): {', '.join(sorted(unknown))}")
    sim_doc = dataclasses.asdict(sim or default_sim_options())
    if sim_doc["cut_through"] and lockstep == "on":
        raise CompareError("cut-through forwarding and lockstep exclude each other (lockstep waits for whole steps)")
    llm = is_llm(trace)
    if stragglers is not None and not llm:
        raise CompareError("stragglers are a generated LLM step's (llm:SPEC or --model); this trace has its own timings")
    variants = [("", "")] + ([("stragglers", stragglers)] if stragglers is not None else [])
    ReplayOptions(**base_opts).check()  # a malformed option fails first, as the replay words it
    if any(s.extra for s in series) and not llm:
        raise CompareError("spec overrides of a series are a generated LLM step's (llm:SPEC or --model)")
    tasks: list[dict[str, Any]] = []
    fabrics: list[Any] = []
    for s, (v_name, v_extra) in ((s, v) for s in series for v in variants):
        load_policy(s.routing)  # a bad routing fails before anything runs
        variant = "+".join(x for x in (s.variant, v_name) if x)
        extra = ",".join(x for x in (s.extra, v_extra) if x)
        s_opts = base_opts | dict(s.options)
        unknown = set(dict(s.options)) - {f.name for f in dataclasses.fields(ReplayOptions)}  # the base's: above
        if unknown:
            raise CompareError(f"{s.topology} {s.variant}: unknown replay option(s): {', '.join(sorted(unknown))}")
        how = str(s_opts.get("placement", "block"))
        frag = parse_fragmented(how)
        for n in sizes:
            cluster = cluster_gpus(n, frag[0]) if frag is not None else n
            # so does a size (or a parameter) the template cannot be built at
            fab = topofile.scaled(s.topology, cluster, dict(s.params))
            fabrics.append(fab)
            name = fab.name
            spec = llm_spec_at(str(trace), n, extra) if llm else str(trace)
            opts = {"ports": default_ports(s.routing, s_opts.get("ports", "auto")), **s_opts, "ranks": n}
            if opts.get("algorithm", "ring") == "ring" and n > FLAT_RING_MAX:
                opts["algorithm"] = "hierarchical"
            ReplayOptions(**opts).check()
            if how == "pods" or frag is not None:  # and a whole-server placement it cannot take
                try:
                    resolve_placement(fab, n, how)
                except FabriclabError as e:
                    raise CompareError(f"{name} ({n} GPUs): {e}") from None
            lock = lockstep == "on" or (lockstep == "auto" and n > FLAT_RING_MAX and not sim_doc["cut_through"])
            tasks.append({"index": len(tasks), "row": f"{name} {s.routing} ({n} GPUs{', ' + variant if variant else ''})",
                          "trace": spec, "label": label or str(trace), "variant": variant,
                          "cluster_gpus": cluster if cluster != n else 0,
                          "topology": s.topology, "params": dict(s.params), "routing": s.routing, "gpus": n, "opts": opts,
                          "sim": {**sim_doc, "lockstep": lock}, "all_to_all": all_to_all})
    return tasks, fabrics


def compare(trace: str | Path, series: Sequence[Series] = DEFAULT_SERIES, sizes: Sequence[int] = DEFAULT_SIZES, *,
            options: dict[str, Any] | None = None, sim: SimOptions | None = None, label: str | None = None,
            cache_dir: Path | None = None, jobs: int | None = None,
            progress: Callable[[CompareProgress], None] | None = None, lockstep: str = "auto",
            all_to_all: str = "auto", on_rows: Callable[[list[Row]], None] | None = None,
            stragglers: str | None = None, cluster: str | None = None) -> list[Row]:
    """Every series at every size (module docstring); rows ordered by series, variant, then size.
    A generated LLM step (`trace` "llm:SPEC") is scaled to each size (`llm_spec_at`: DP grows, the
    micro-batches per replica stay); `stragglers` (LLM only: overrides such as
    "stragglers.jitter_cv=0.05") adds a second variant of every series with them. `options`:
    `ReplayOptions` fields (placement, algorithm, channels, repeat, ports, seed, compute_gap_us);
    `ports` defaults per row to planned under adaptive routing and hashed otherwise. `lockstep`:
    "auto" (above `FLAT_RING_MAX` GPUs, unless `sim.cut_through`), "on" or "off" (overrides
    `sim.lockstep`). `all_to_all`: how all-to-alls are simulated (`traffic.replay.simulate.A2A_MODELS`).
    The rows are Ray tasks (`fabriclab.sweep`): on `cluster` ("ray://HOST:PORT"; default $RAY_ADDRESS), else
    on a local Ray instance of `jobs` CPUs (default the machine's) started for the rows to compute and ended
    with them; on a cluster `jobs` (if given) bounds the rows running at once.
    `progress` is called as rows start, advance (every ~0.5 s) and finish; `on_rows` with the rows
    finished so far (in table order) each time one finishes, so a stopped run keeps them; finished rows
    are cached at once, so a run started again computes only the others. A row that fails (an error, or its
    worker process lost twice) does not stop the others: once they are done, `RowsFailed` is raised with them."""
    tasks, fabrics = plan_rows(trace, series, sizes, options=options, sim=sim, label=label, lockstep=lockstep,
                               all_to_all=all_to_all, stragglers=stragglers)
    results: dict[int, dict[str, Any]] = {}
    keys: dict[int, str] = {}
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        cdig = code_digest()
        digests: dict[str, str] = {}
        for i, t in enumerate(tasks):
            if t["trace"] not in digests:
                digests[t["trace"]] = trace_digest(t["trace"])
            keys[i] = _key(t, digests[t["trace"]], cdig)
            hit = cache_dir / f"{keys[i]}.json"
            if hit.is_file():
                try:
                    results[i] = json.loads(hit.read_text()) | {"cached": True}
                except (OSError, json.JSONDecodeError):
                    pass  # an unreadable entry is recomputed
    running: dict[int, RowProgress] = {}

    def report() -> None:
        if progress is not None:
            progress(CompareProgress(len(results), len(tasks), tuple(running[i] for i in sorted(running))))

    def finished(i: int, row: dict[str, Any]) -> None:
        results[i] = row
        running.pop(i, None)
        if cache_dir is not None:
            tmp = cache_dir / f".{keys[i]}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(row))
            tmp.replace(cache_dir / f"{keys[i]}.json")
        if on_rows is not None:
            on_rows(with_efficiency([Row(**results[k]) for k in sorted(results)]))
        report()

    report()
    if results and on_rows is not None:
        on_rows(with_efficiency([Row(**results[k]) for k in sorted(results)]))
    todo = [i for i in range(len(tasks)) if i not in results]
    failed = _sweep(tasks, fabrics, todo, jobs, cluster, running, report, finished) if todo else []
    rows = with_efficiency([Row(**results[i]) for i in sorted(results)])
    if failed:
        raise RowsFailed(rows, [{"row": tasks[f.key]["row"], "kind": f.kind, "error": f.message} for f in failed])
    return rows


def _sweep(tasks: list[dict[str, Any]], fabrics: list[Any], todo: list[int], jobs: int | None, cluster: str | None,
           running: dict[int, RowProgress], report: Callable[[], None],
           finished: Callable[[int, dict[str, Any]], None]) -> list[Any]:
    """Run `todo` as tasks of a `fabriclab.sweep.Session` (on `cluster`, else a local Ray instance of `jobs`
    CPUs), relaying their progress (`running`, `report`) and each row as it finishes (`finished`); a trace's
    workload read once and its fabric shipped with each row. Returns the failed rows (`sweep.Failure`)."""
    from fabriclab import sweep

    cpus = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    with sweep.Session(cluster, cpus) as session:
        workloads: dict[tuple[str, Any, Any], Any] = {}
        calls: dict[int, tuple[Any, ...]] = {}
        for i in todo:
            t = tasks[i]
            workload = None
            if not is_llm(t["trace"]):  # an LLM step is generated by its row: per size, up to GB at 16k GPUs
                wkey = (t["trace"], t["opts"].get("compute_gap_us"), t["opts"].get("step_ops"))
                if wkey not in workloads:
                    workloads[wkey] = session.share(load_workload(t))
                workload = workloads[wkey]
            calls[i] = (t, workload, session.share(fabrics[i]))

        def told(i: int, doc: dict[str, Any], where: sweep.Where) -> None:
            running[i] = RowProgress(tasks[i]["row"], doc["stage"], doc["calls_done"], doc["calls"],
                                     doc["bytes_share"], doc["sim_s"], doc["recorded_s"], doc["events"],
                                     doc["wall_s"], where.pid, where.node, where.node_id)
            report()

        def lost(i: int, failure: sweep.Failure) -> None:
            running.pop(i, None)
            report()

        # rows start in table order, `jobs` (locally: the instance's CPUs) at a time; on a cluster without --jobs
        # all are queued at once and its CPUs take them as they come
        return session.run(_row_task, calls, limit=cpus if session.local else jobs, on_progress=told,
                           on_done=finished, on_failed=lost)


def with_efficiency(rows: Sequence[Row]) -> list[Row]:
    """Scaling efficiency per row: 1 / mean step (throughput per GPU, fixed batch per GPU) at N over
    the same at the series' smallest size."""
    base: dict[tuple[str, str, str], Row] = {}
    for r in sorted(rows, key=lambda r: r.gpus):
        base.setdefault((r.topology, r.routing, r.variant), r)
    return [dataclasses.replace(r, efficiency=base[(r.topology, r.routing, r.variant)].step_mean_us / r.step_mean_us)
            for r in rows]


# ---- the seed figures -----------------------------------------------------------------------------

#: The vendor article's figures at 1024 GPUs (pyramid + ECMP, dual-plane + adaptive); as the issue
#: notes, they are not self-consistent, so only directions and ratios are compared.
SEED = {"utilisation": (0.68, 0.92), "comm_share": (0.32, 0.11), "step_mean_us": (2.8e6, 1.9e6),
        "step_p99_us": (4.7e6, 2.3e6), "efficiency": (0.62, 0.87)}
SEED_BETTER = {"utilisation": "higher", "comm_share": "lower", "step_mean_us": "lower", "step_p99_us": "lower",
               "efficiency": "higher"}
#: a ratio (dual-plane / pyramid) within this factor of the seed's counts as reproduced in size
SIZE_TOLERANCE = 1.25
#: two rows whose figure differs by less than this share tie: the simulator resolves a step to about that (a
#: congested row moves by up to 1% when one delivery shifts by a us; the LLM steps' 5 us resolution by 0.1%:
#: docs/simulator.md#resolution), so a smaller difference is no verdict either way
TIE_TOLERANCE = 0.01


def _equal_because(p: Row, d: Row) -> str:
    """Why the pyramid row `p` and the dual-plane row `d` tie, from their own evidence."""
    upper = max((v for k, v in p.hottest_by_tier.items() if not k.endswith("->host")), default=None)
    if upper is None:
        return ("equal here: the workload's collectives never load the pyramid's oversubscribed tiers or "
                "collide on ECMP more than the dual-plane's (the seed assumes they do)")
    if upper <= BUSY_UTIL:
        return (f"equal here: no traffic crosses the pyramid's switch tiers at {p.gpus} GPUs (every group "
                "stays under one ToR: rail wiring or the placement), so its oversubscription is never met")
    return (f"equal here: the pyramid's links above the ToRs peak at {upper:.0%} and its exposed communication "
            f"is {p.comm_share - d.comm_share:+.1%} of the step against the dual-plane's, but the step barely "
            f"moves ({p.step_mean_us / d.step_mean_us - 1:+.2%}, within the {TIE_TOLERANCE:.0%} the simulator "
            f"resolves): the slower transfers overlap compute or waits for other ranks (idle "
            f"{p.idle_share:.1%} against {d.idle_share:.1%})")


def seed_check(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Per seed figure: the seed's pyramid and dual-plane values, ours at the largest size both series
    ran, whether the direction (which fabric is better) and the size (the dual-plane / pyramid ratio,
    within SIZE_TOLERANCE) were reproduced, and what differs where not."""
    def family(r: Row) -> str:
        return builder_of(r.topology)

    def at(variant: str) -> tuple[Row, Row] | None:
        pyr = [r for r in rows if family(r) == "pyramid" and r.variant == variant]
        dual = [r for r in rows if family(r) == "dual_plane" and r.variant == variant]
        common = sorted({r.gpus for r in pyr} & {r.gpus for r in dual})
        if not common:
            return None
        return next(r for r in pyr if r.gpus == common[-1]), next(r for r in dual if r.gpus == common[-1])

    base = at("")
    if base is None:
        return []
    slow = at("stragglers")  # the tail is the stragglers' where they ran
    out = []
    for metric, (seed_p, seed_d) in SEED.items():
        p, d = slow if metric == "step_p99_us" and slow is not None else base
        n = p.gpus
        ours_p, ours_d = float(getattr(p, metric)), float(getattr(d, metric))
        better = SEED_BETTER[metric]
        same = math.isclose(ours_p, ours_d, rel_tol=TIE_TOLERANCE)
        direction = not same and ((ours_d > ours_p) if better == "higher" else (ours_d < ours_p))
        seed_ratio = seed_d / seed_p
        ratio = ours_d / ours_p if ours_p else math.inf
        size = direction and seed_ratio / SIZE_TOLERANCE <= ratio <= seed_ratio * SIZE_TOLERANCE
        if size:
            why = ""
        elif same:
            why = _equal_because(p, d)
        elif direction:
            why = (f"the gap differs: ours {ratio:.3g}x, the seed's {seed_ratio:.3g}x; the seed's workload, "
                   "compute/communication mix and model sizes are not ours (its figures also disagree with each "
                   "other, see the issue)")
        else:
            why = "the opposite direction here; see the evidence columns (hot links, load, collisions)"
        out.append({"metric": metric, "gpus": n, "variant": p.variant, "seed_pyramid": seed_p, "seed_dual_plane": seed_d,
                    "ours_pyramid": ours_p, "ours_dual_plane": ours_d, "better": better,
                    "direction_reproduced": bool(direction), "size_reproduced": bool(size), "differs": why})
    return out


# ---- output ---------------------------------------------------------------------------------------

COLUMNS = (("fabric", "fabric"), ("routing", "routing"), ("gpus", "GPUs"), ("algorithm", "all-reduce"),
           ("utilisation", "util"),
           ("comm_share", "comm"), ("step_mean_us", "step mean"), ("step_p99_us", "step p99"),
           ("busbw_bps", "busbw"), ("efficiency", "eff"), ("hot_link_share", "hot links"),
           ("load_max_over_mean", "max/mean load"), ("ecmp_collisions", "ECMP coll."), ("cached", "cached"))


def _cell(key: str, v: Any) -> str:
    from traffic.formatting import format_bps, format_share, format_us

    if key in ("utilisation", "comm_share", "hot_link_share", "mfu", "idle_share"):
        return format_share(v)
    if key.endswith("_us"):
        return format_us(v)
    if key == "busbw_bps":
        return format_bps(v)
    if key in ("efficiency", "load_max_over_mean"):
        return f"{v:.3f}"
    if key == "cached":
        return "yes" if v else ""
    return str(v)


def latency_note(sim: SimOptions) -> str:
    """The latency a comparison's rows were simulated with, in words."""
    res = (f"; events within {sim.resolution_s * 1e6:.3g} us taken together (--resolution-us)"
           if sim.resolution_s > SimOptions().resolution_s else "")
    if sim.per_transfer_s <= 0 and sim.per_hop_s <= 0:
        return "latency: none (bandwidth only: --per-transfer-us 0 --per-hop-us 0)" + res
    return (f"latency: {sim.per_transfer_s * 1e6:.3g} us per transfer and {sim.per_hop_s * 1e6:.3g} us per link of its "
            "path (defaults: NCCL's per-network-step ring latency over a leaf-spine path, a 51.2T-class switch; "
            "docs/simulator.md)" + res)


def format_table(rows: Sequence[Row], seed: Sequence[dict[str, Any]] = (), sim: SimOptions | None = None) -> str:
    from traffic.formatting import format_bps, format_share

    def cell(r: Row, k: str) -> str:
        return _cell(k, getattr(r, k)) + (" lockstep" if k == "algorithm" and r.lockstep else "")

    cols = list(COLUMNS)
    if any(r.variant for r in rows):
        cols.insert(3, ("variant", "variant"))
    if any(math.isfinite(r.mfu) for r in rows):
        cols.insert(cols.index(("utilisation", "util")) + 1, ("mfu", "MFU"))
    left = cols.index(("algorithm", "all-reduce"))
    table = [[h for _, h in cols]] + [[cell(r, k) for k, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) if i > left else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.append("")
    causes = [r for r in rows if r.exposed_by_group or r.hottest_by_tier]
    if causes:
        lines.append("the cause, per row: exposed communication by process group (of the step), busbw by group, "
                     "the hottest link's peak utilisation by tier, ECMP collisions by switch role, waits (idle):")
        for r in causes:
            exposed = ", ".join(f"{k} {format_share(v)}" for k, v in sorted(r.exposed_by_group.items(),
                                                                             key=lambda kv: -kv[1]) if v > 0)
            bus = ", ".join(f"{k} {format_bps(v)}" for k, v in sorted(r.busbw_by_group.items()))
            hot = ", ".join(f"{k} {format_share(v)}" for k, v in sorted(r.hottest_by_tier.items()))
            coll = ", ".join(f"{k} {v}" for k, v in sorted(r.collisions_by_tier.items())) or "none"
            lines.append(f"  {r.fabric} {r.routing} {r.gpus}{' ' + r.variant if r.variant else ''}: exposed "
                         f"{exposed or 'none'}; busbw {bus or '-'}; hottest {hot or '-'}; collisions {coll}; "
                         f"idle {format_share(r.idle_share)}")
        lines.append("")
    if any(r.lockstep for r in rows):
        lines.append("lockstep: each step of a collective waited for all of the step before (the simulator's "
                     "approximation at scale; a ring runs at its slowest hop's pace either way)")
    if sim is not None:
        lines.append(latency_note(sim))
    lines.append("scaling efficiency: 1 / mean step at N over the same at the series' smallest size (fixed batch "
                 "per GPU); hot links: share of busy fabric link-intervals above 90%; ECMP collisions: connections "
                 "sharing a port while an equal-cost port of the same switch carries none")
    if seed:
        lines.append("")
        lines.append(f"seed figures (vendor article, 1024 GPUs) against ours at {seed[0]['gpus']} GPUs, "
                     "pyramid / dual-plane:")
        for s in seed:
            m = s["metric"]
            verdict = ("reproduced in direction and size" if s["size_reproduced"] else
                       "reproduced in direction, not in size" if s["direction_reproduced"] else "not reproduced")
            lines.append(f"  {m:<13} seed {_cell(m, s['seed_pyramid'])} / {_cell(m, s['seed_dual_plane'])}; ours "
                         f"{_cell(m, s['ours_pyramid'])} / {_cell(m, s['ours_dual_plane'])}: {verdict}"
                         + (f" ({s['differs']})" if s["differs"] else ""))
    return "\n".join(lines)


def format_failed(failed: Sequence[dict[str, str]]) -> str:
    """The rows that failed (`RowsFailed.failed`), one line each."""
    return "\n".join([f"failed rows ({len(failed)}; every other row finished):"]
                     + [f"  {f['row']}: {f['kind']}: {f['error']}" for f in failed])


def write(rows: Sequence[Row], seed: Sequence[dict[str, Any]], out_dir: Path, meta: dict[str, Any],
          sim: SimOptions | None = None, sensitivity: dict[str, Any] | None = None, sensitivity_text: str = ""
          ) -> list[Path]:
    """compare.json, .csv and .txt in `out_dir`; `sensitivity`: the sweep's section
    (`fabriclab.sensitivity.analyse`, its rows in `sensitivity["rows"]`) and its text (`format_section`); the
    rows that failed (`meta["failed"]`) listed in the text too."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "compare.json", out_dir / "compare.csv", out_dir / "compare.txt"]
    doc = {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows], "seed": list(seed)}
    if sensitivity is not None:
        doc["sensitivity"] = sensitivity
    paths[0].write_text(json.dumps(doc, indent=2, default=str))
    with paths[1].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fld.name for fld in dataclasses.fields(Row)])
        w.writeheader()
        for r in rows:
            w.writerow(dataclasses.asdict(r))
    text = (format_table(rows, seed, sim) + (f"\n\n{sensitivity_text}" if sensitivity_text else "")
            + (f"\n\n{format_failed(meta['failed'])}" if meta.get("failed") else ""))
    paths[2].write_text(text + "\n")
    return paths
