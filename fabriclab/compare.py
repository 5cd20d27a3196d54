"""`fabriclab compare`: one workload over fabrics, routing modes and sizes, on the flow-level simulator.

    rows = compare("trace.json.gz", [Series("pyramid-1024", "ecmp"), Series("dual-plane-1024", "adaptive")],
                   sizes=[128, 256, 512, 1024])

Each configuration is a series (a builder topology file, used as a template, and a routing mode) at a
size N: the template built at N hosts (`fabric.topofile.scaled`: same NIC rates, edge switch size and
oversubscription), the trace mapped onto N ranks, one per host, and run by `fabriclab sim`'s code
(`fabriclab.backends.Simulated`). The default series have the same bandwidth per host (pyramid: one 400G
NIC; dual-plane: two 200G NICs, one per plane).

Each row is one resolved run (`fabriclab.study.spec.resolve`, the row's `spec`): the all-reduce is a ring
(`--algorithm`) up to `--hierarchical-above` GPUs (1024) and its hierarchical form above (the row's
`algorithm` says which). The plan is made on arrays (`plan_replay`,
`schedule_columns`) and the simulator holds the state of the running calls only, so 16,384 GPUs plan
in seconds and run in bounded memory. Above the same size the collectives also run in lockstep
(`SimOptions.lockstep`, `--lockstep auto`; the row's `lockstep` says so): each step of a collective
waits for all of the step before, so flows that hashed ECMP slows do not drift apart event by event.
A ring runs at its slowest hop's pace either way (measured: the same job times on the 16-host
fabrics with collisions, tests/test_flowsim_phases.py); the exact DAG at 1024 GPUs and above can take hours.

The rows and their figures are `fabriclab.rows`'s; the outputs `fabriclab.compare_output`'s.

Rows run as Ray tasks (`fabriclab.sweep`), on a local Ray instance of `jobs` CPUs or on a cluster
(`cluster`); at `jobs` 1 without a cluster, one after another in this process (no Ray); and each row is cached in `cache_dir` under a key of everything it depends on: the trace's
bytes, the template, routing, size, the options and the source code of `fabric` and `traffic`. A re-run
with one size changed computes only that size. `plan_rows` gives the rows as tasks, `run_row` runs one in
this process.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric import topofile
from fabric.errors import FabriclabError
from fabric.flowsim import SimOptions
from fabriclab.rowcache import code_digest, row_key, trace_digest
from fabriclab.rows import DEFAULT_SERIES, LLM_SERIES, CompareError, Row, Series, row_from_result, with_efficiency
from fabriclab.study.spec import RunOptions, RunSpec, SimModel, WorkloadSpec, resolve

__all__ = ["DEFAULT_SERIES", "LLM_SERIES", "CompareError", "Row", "Series", "compare", "plan_rows", "run_row"]
DEFAULT_SIZES = (128, 256, 512, 1024)
#: the run options a row's task carries (`ReplayOptions` fields)
RUN_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(RunOptions))


# ---- one configuration (a task on a Ray worker, or in this process) ---------------------------------

def load_workload(task: dict[str, Any]) -> Any:
    """The workload of a row's task: its trace read (or its LLM step generated) as the row reads it."""
    from traffic.traces import load

    return load(task["trace"], compute_gap_us=task["opts"].get("compute_gap_us") or None,
                collectives_per_step=task["opts"].get("step_ops"),
                launchless_kernels=task["opts"].get("launchless_kernels"))


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
                                                  algorithm=opts.algorithm, lockstep=bool(task["sim"]["lockstep"]),
                                                  spec=task["spec"]))


def _row_task(tell: Callable[[Any], None], task: dict[str, Any], workload: Any, fab: Any) -> dict[str, Any]:
    """`run_row` as a sweep's task (`fabriclab.sweep`): its progress told as plain dicts."""
    return run_row(task, workload, fab, lambda p: tell(dataclasses.asdict(p)))


# ---- the sweep ------------------------------------------------------------------------------------

def cluster_gpus(job_gpus: int, occupancy: Any) -> int:
    """The fabric a fragmented job of `job_gpus` runs in: at least job / (1 - occupancy) GPUs, so that the
    free servers hold the job, doubled from the job's size (the shipped builders' sizes are powers of two)."""
    n = job_gpus
    while n * (1 - occupancy) < job_gpus:
        n *= 2
    return n


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
              options: dict[str, Any] | None = None, sim: SimModel | None = None, label: str | None = None,
              stragglers: str | None = None) -> tuple[list[dict[str, Any]], list[Any]]:
    """The rows of `compare` (its arguments) as tasks, in table order, and the fabric each runs on; every
    input checked (a bad one is a `CompareError` naming it, before anything runs). Each row's run is
    `fabriclab.study.spec.resolve`d (its `spec`); `run_row` runs one."""
    from fabric.routing import load_policy
    from traffic.placement import parse_fragmented, resolve_placement

    sizes = sorted({int(n) for n in sizes})
    if not sizes or sizes[0] < 2:
        raise CompareError(f"sizes must be >= 2 GPUs, got {list(sizes)}")
    if not series:
        raise CompareError("no series to compare")
    workload = WorkloadSpec.parse(str(trace))
    base = _run_options(options or {}, "")
    model = sim or SimModel()
    if stragglers is not None and not workload.llm:
        raise CompareError("stragglers are a generated LLM step's (llm:SPEC or --model); this trace has its own timings")
    variants = [("", "")] + ([("stragglers", stragglers)] if stragglers is not None else [])
    if any(s.extra for s in series) and not workload.llm:
        raise CompareError("spec overrides of a series are a generated LLM step's (llm:SPEC or --model)")
    tasks: list[dict[str, Any]] = []
    fabrics: list[Any] = []
    for s, (v_name, v_extra) in ((s, v) for s in series for v in variants):
        load_policy(s.routing)  # a bad routing fails before anything runs
        variant = "+".join(x for x in (s.variant, v_name) if x)
        extra = ",".join(x for x in (s.extra, v_extra) if x)
        spec = RunSpec(workload, _run_options(dataclasses.asdict(base) | dict(s.options), f"{s.topology} {s.variant}"),
                       model)
        spec.options.replay_options(s.routing).check()  # a malformed option fails first, as the replay words it
        frag = parse_fragmented(spec.options.placement)
        for n in sizes:
            cluster = cluster_gpus(n, frag[0]) if frag is not None else n
            # so does a size (or a parameter) the template cannot be built at
            fab = topofile.scaled(s.topology, cluster, dict(s.params))
            fabrics.append(fab)
            try:
                run = resolve(spec, n, s.topology, s.routing, extra)
                opts = run.replay_options()
                opts.check()
            except FabriclabError as e:
                raise CompareError(f"{fab.name} ({n} GPUs): {e}") from None
            if spec.options.placement == "pods" or frag is not None:  # and a whole-server placement it cannot take
                try:
                    resolve_placement(fab, n, spec.options.placement)
                except FabriclabError as e:
                    raise CompareError(f"{fab.name} ({n} GPUs): {e}") from None
            tasks.append({"index": len(tasks), "row": f"{fab.name} {s.routing} ({n} GPUs{', ' + variant if variant else ''})",
                          "trace": run.workload, "label": label or str(trace), "variant": variant,
                          "cluster_gpus": cluster if cluster != n else 0,
                          "topology": s.topology, "params": dict(s.params), "routing": s.routing, "gpus": n,
                          "opts": {k: getattr(opts, k) for k in RUN_OPTION_FIELDS},
                          "sim": dataclasses.asdict(run.sim_options()), "all_to_all": run.all_to_all,
                          "spec": run.doc()})
    return tasks, fabrics


def _run_options(options: dict[str, Any], where: str) -> RunOptions:
    unknown = set(options) - set(RUN_OPTION_FIELDS)
    if unknown:
        raise CompareError(f"{where + ': ' if where else ''}unknown replay option(s): {', '.join(sorted(unknown))}")
    return RunOptions(**options)


def compare(trace: str | Path, series: Sequence[Series] = DEFAULT_SERIES, sizes: Sequence[int] = DEFAULT_SIZES, *,
            options: dict[str, Any] | None = None, sim: SimModel | None = None, label: str | None = None,
            cache_dir: Path | None = None, jobs: int | None = None,
            progress: Callable[[CompareProgress], None] | None = None,
            on_rows: Callable[[list[Row]], None] | None = None,
            stragglers: str | None = None, cluster: str | None = None) -> list[Row]:
    """Every series at every size (module docstring); rows ordered by series, variant, then size.
    A generated LLM step (`trace` "llm:SPEC") is scaled to each size (`WorkloadSpec.at`: DP grows, the
    micro-batches per replica stay); `stragglers` (LLM only: overrides such as
    "stragglers.jitter_cv=0.05") adds a second variant of every series with them. `options`:
    `fabriclab.study.spec.RunOptions` fields (placement, algorithm, channels, repeat, ports, seed,
    compute_gap_us, step_ops); `sim`: the simulator's model (`SimModel`: latencies, resolution, lockstep, the
    all-to-all model); each row's run is resolved from them (`resolve`: ports, algorithm, lockstep, resolution).
    The rows are Ray tasks (`fabriclab.sweep`): on `cluster` ("ray://HOST:PORT"; default $RAY_ADDRESS), else
    on a local Ray instance of `jobs` CPUs (default the machine's) started for the rows to compute and ended
    with them; on a cluster `jobs` (if given) bounds the rows running at once.
    `progress` is called as rows start, advance (every ~0.5 s) and finish; `on_rows` with the rows
    finished so far (in table order) each time one finishes, so a stopped run keeps them; finished rows
    are cached at once, so a run started again computes only the others. A row that fails (an error, or its
    worker process lost twice) does not stop the others: once they are done, `RowsFailed` is raised with them."""
    tasks, fabrics = plan_rows(trace, series, sizes, options=options, sim=sim, label=label, stragglers=stragglers)
    results: dict[int, dict[str, Any]] = {}
    keys: dict[int, str] = {}
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        cdig = code_digest()
        digests: dict[str, str] = {}
        for i, t in enumerate(tasks):
            if t["trace"] not in digests:
                digests[t["trace"]] = trace_digest(t["trace"])
            keys[i] = row_key(t, digests[t["trace"]], cdig)
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

    if cluster is None and jobs == 1:
        return _in_process(tasks, fabrics, todo, running, report, finished)
    cpus = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    with sweep.Session(cluster, cpus) as session:
        workloads: dict[tuple[str, Any, Any, Any], Any] = {}
        calls: dict[int, tuple[Any, ...]] = {}
        for i in todo:
            t = tasks[i]
            workload = None
            if not WorkloadSpec.parse(t["trace"]).llm:  # an LLM step is generated by its row: per size, up to GB at 16k GPUs
                wkey = (t["trace"], t["opts"].get("compute_gap_us"), t["opts"].get("step_ops"),
                        t["opts"].get("launchless_kernels"))
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




def _in_process(tasks: list[dict[str, Any]], fabrics: list[Any], todo: list[int], running: dict[int, RowProgress],
                report: Callable[[], None], finished: Callable[[int, dict[str, Any]], None]) -> list[Any]:
    """`--jobs 1` without a cluster: the rows one after another in this process, no Ray instance (its start-up and
    ~1 GB saved); a row that raises is reported failed as a task's exception would be (`sweep.Failure`), and the
    others go on. A row that kills the process (out of memory) ends the command here, where Ray would retry it."""
    from fabriclab import sweep

    where = sweep.Where(os.getpid(), "127.0.0.1", "in-process")
    workloads: dict[tuple[str, Any, Any, Any], Any] = {}
    failed = []
    for i in todo:
        t = tasks[i]
        workload = None
        if not WorkloadSpec.parse(t["trace"]).llm:
            wkey = (t["trace"], t["opts"].get("compute_gap_us"), t["opts"].get("step_ops"),
                    t["opts"].get("launchless_kernels"))
            if wkey not in workloads:
                workloads[wkey] = load_workload(t)
            workload = workloads[wkey]

        def told(doc: dict[str, Any], i: int = i) -> None:
            running[i] = RowProgress(tasks[i]["row"], doc["stage"], doc["calls_done"], doc["calls"],
                                     doc["bytes_share"], doc["sim_s"], doc["recorded_s"], doc["events"],
                                     doc["wall_s"], where.pid, where.node, where.node_id)
            report()

        try:
            row = _row_task(told, t, workload, fabrics[i])
        except Exception as e:  # as a Ray task's exception: this row failed, the others run
            running.pop(i, None)
            report()
            failed.append(sweep.Failure(i, "error", f"{type(e).__name__}: {e}"))
            continue
        finished(i, row)
    return failed
