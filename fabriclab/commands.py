"""The `fabriclab` commands (`fabriclab.cli` parses their arguments): each turns its arguments into library
calls and prints their results; the rules and the work live in the library (`fabriclab.backends`,
`fabriclab.checkup`, `fabriclab.compare`, `fabriclab.calibrate`, `traffic`, `fabric`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabric import topofile
from fabric.analysis import summarize
from fabric.emulation import EmulationOptions
from fabric.errors import FabriclabError
from fabriclab.backends import numpy_hugepage_advice_off
from fabriclab.options import load_options, run_options
from fabriclab.progress import ProgressView, shown_rows
from fabriclab.texts import format_runs, format_topologies, format_workload


def cmd_topo_show(args: argparse.Namespace) -> int:
    summaries = [summarize(topofile.load(f)) for f in args.files]
    print(format_topologies(summaries, args.json))
    return 0


def cmd_topo_check(args: argparse.Namespace) -> int:
    fab = topofile.load(args.file)
    print(f"ok: {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
          f"{len(fab.links)} links, planes {', '.join(p.name for p in fab.planes)}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from fabric.emulation.tunnels import parse_link
    from fabriclab.checkup import check_fabric, format_check

    fab = topofile.load(args.topology)
    opts = EmulationOptions(mbps_per_gbps=args.mbps_per_gbps, datapath=args.datapath,
                            delay_us=args.delay_us, loss_pct=args.loss_pct,
                            tunnel_links=tuple(parse_link(fab, text) for text in args.tunnel_link),
                            tunnel_kind=args.tunnel_kind)
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    log(f"[fabriclab] bringing up {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
        f"routing {args.routing}")

    def while_up(lab: Any) -> None:
        if args.cli:
            lab.emulation.interactive()
        elif args.hold:
            # the message inside the try: a Ctrl-C or SIGTERM sent the moment it appears (a script
            # waiting for it) can arrive before the loop starts, and must still end in the summary
            try:
                log("[fabriclab] fabric is up; Ctrl-C tears it down")
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass

    check = check_fabric(fab, args.routing, opts, count=args.count, log=lambda msg: log(f"[fabriclab] {msg}"),
                         while_up=while_up)
    print(json.dumps(check.figures, indent=2) if args.json else format_check(check, fab))
    return 0 if check.ok else 1


def cmd_trace_show(args: argparse.Namespace) -> int:
    from traffic.traces import load

    workload = load(args.trace, **load_options(args))
    print(format_workload(workload, args.rank, args.json))
    return 0


def cmd_workload_llm(args: argparse.Namespace) -> int:
    """`workload llm SPEC`: the model, its parallelism and compute model, then the generated step as
    `trace show` prints it; `--write FILE` keeps the resolved config as YAML (to edit and pass back)."""
    import yaml

    from traffic.llm import describe, load_config
    from traffic.traces import llm_workload

    config = load_config(args.spec)
    if args.write:
        Path(args.write).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    workload = llm_workload(config)
    reach = []
    if args.topology:
        from traffic.placement import check_job_fits, resolve_placement
        from traffic.reach import group_reach

        fab = topofile.load(args.topology)
        check_job_fits(workload.world_size, fab, args.spec)
        reach = group_reach(workload, fab, resolve_placement(fab, workload.world_size, args.placement))
    if not args.json:
        print(describe(config, workload))
        if args.write:
            print(f"config       written to {args.write}")
        for r in reach:
            print(f"reach        on {args.topology} ({args.placement}): {r.describe()}")
    print(format_workload(workload, args.rank, args.json, {"reach": [r.to_dict() for r in reach]} if reach else None))
    return 0


#: compare's and plan's workload when none is given: the answer's model (`--model`)
DEFAULT_MODEL = "gpt3-175b"
#: a TRACE of this name (and no such file) is the built-in CPU recording (the main job before issue 27)
BUILTIN_NAME = "builtin"


def _replay_pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    topologies = args.topology or ["dual-plane-16", "pyramid-16"]
    routings = args.routing or (["adaptive", "ecmp"] if not args.topology else ["adaptive"] * len(topologies))
    if len(routings) == 1 and len(topologies) > 1:
        routings = routings * len(topologies)
    if len(routings) != len(topologies):
        raise FabriclabError(f"give one --routing per --topology ({len(topologies)} topologies, "
                             f"{len(routings)} routings)")
    return list(zip(topologies, routings))


def _trace(args: argparse.Namespace) -> tuple[str, str]:
    """The trace to run (the built-in recording when none is given, or one named `builtin` that is no
    file) and its label."""
    from traffic.traces import BUILTIN_TRACE

    if args.trace and not (args.trace == BUILTIN_NAME and not Path(BUILTIN_NAME).exists()):
        return args.trace, args.trace
    return str(BUILTIN_TRACE), f"builtin ({BUILTIN_TRACE.name})"


def _sim_model(args: argparse.Namespace) -> Any:
    """The simulator's model as asked (`fabriclab.study.spec.SimModel`: `_sim_args`' arguments), checked;
    numpy's huge-page advice off (`fabriclab.backends.numpy_hugepage_advice_off`)."""
    from fabriclab.study.spec import SimModel

    numpy_hugepage_advice_off()
    model = SimModel(per_transfer_us=args.per_transfer_us, per_hop_us=args.per_hop_us, resolution_us=args.resolution_us,
                     poll_ms=args.poll_ms, forwarding=args.forwarding, lockstep=args.lockstep,
                     all_to_all=args.all_to_all, hierarchical_above_gpus=args.hierarchical_above,
                     nvlink_latency_us=args.nvlink_latency_us)
    model.check()
    return model


def cmd_replay(args: argparse.Namespace) -> int:
    return _run_workload(args, "emulation")


def cmd_sim(args: argparse.Namespace) -> int:
    return _run_workload(args, "flowsim")


def _run_workload(args: argparse.Namespace, backend: str) -> int:
    """`replay` (emulation) and `sim` (flowsim): one trace over one or two (topology, routing) pairs,
    a report per run and, for two, the comparison."""
    from fabriclab.backends import Emulated, describe_progress, run_workload
    from fabriclab.study import main_job
    from fabriclab.study.spec import RunSpec, WorkloadSpec, simulated_runs
    from traffic import report
    from traffic.traces import BUILTIN_TRACE, default_ranks, load

    is_main = main_job.apply_defaults(args)
    log: Callable[[str], None] = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    if is_main and backend == "emulation" and args.at_scale and (args.at_scale < 128 or args.at_scale % 64):
        raise FabriclabError(f"--at-scale must be a multiple of 64 GPUs, at least 128 (the preset's TP8 x PP8 "
                             f"replicas), or 0 for none; got {args.at_scale}")
    trace, label = _trace(args)
    if is_main:
        label = "gpt3-175b-slice16"
    workload = load(trace, **load_options(args))
    pairs = _replay_pairs(args)
    fabrics = [(t, topofile.load(t), r) for t, r in pairs]  # every topology checked before anything runs
    ranks = default_ranks(args.ranks, None if trace == str(BUILTIN_TRACE) else args.trace)
    if backend == "emulation":
        asked = run_options(args, ranks)
        runs: list[tuple[str, Any, str, Any, Any, dict[str, Any] | None]] = [
            (t, fab, routing, asked.replay_options(routing, mbps_per_gbps=args.mbps_per_gbps, dilation=args.dilation),
             Emulated(log=lambda msg: log(f"[fabriclab] {msg}")), None) for t, fab, routing in fabrics]
    else:
        runs = list(simulated_runs(RunSpec(WorkloadSpec.parse(trace), run_options(args, ranks), _sim_model(args)),
                                   workload, fabrics, args.link_down or [], args.link_up or []))
    out = Path(args.out)
    results = []
    verb = "replaying" if backend == "emulation" else "simulating"
    for _, fab, routing, run_opts, runner, spec in runs:
        sub = out / f"{fab.name}-{routing.replace(':', '_').replace('/', '_')}" if len(runs) > 1 else out
        log(f"[fabriclab] {verb} {label} on {fab.name} ({routing})")
        with ProgressView(f"{backend} {fab.name} {routing}", quiet=args.json) as view:
            result = run_workload(workload, label, fab, routing, run_opts, runner, out_dir=sub, spec=spec,
                                  progress=lambda p: view.running({0: (p.bytes_share, describe_progress(p))})).result
        report.write_report(result, sub)
        results.append((sub, result))
        log(f"[fabriclab] {fab.name} ({routing}): report in {sub / 'report.html'}")
    if len(results) == 2:
        report.write_comparison(results[0][1], results[1][1], out)
    check = None
    if backend == "emulation" and is_main and len(results) == 2:
        # the simulator on the same plan and fabrics, beside the emulator's figures (issue 27: their
        # dual-plane / pyramid step ratios agree within 20%), and the whole step at scale
        log("[fabriclab] the same on the simulator (seconds)")
        sims = [run_workload(workload, label, fab, routing, run_opts, runner, spec=spec).result
                for _, fab, routing, run_opts, runner, spec in simulated_runs(
                    RunSpec(WorkloadSpec.parse(trace), run_options(args, ranks), main_job.CHECK_MODEL), workload,
                    fabrics)]
        check = main_job.emulated_and_simulated([r for _, r in results], sims)
        if args.at_scale:
            log(f"[fabriclab] the whole {main_job.MAIN_SCALE_PRESET[4:]} step at {args.at_scale} GPUs on the simulator "
                f"(cached in {args.cache}; minutes the first time)")
            check["at_scale"] = main_job.at_scale(args.at_scale, Path(args.cache), shown_rows(
                f"simulator {args.at_scale} GPUs", args.json, jobs=None, cluster=None))
        (out / "simulated.json").write_text(json.dumps(check, indent=2))
    print(format_runs(results, check, out, args.json))
    return 0


def _sweep_workload(args: argparse.Namespace) -> tuple[str, str]:
    """compare's and plan's workload: TRACE, or `--model SPEC` (one or the other), else the answer's model
    (`DEFAULT_MODEL`, a generated LLM step); `builtin` names the built-in recording; (the trace, its label)."""
    from fabriclab.study.spec import WorkloadSpec

    if args.model is not None and args.trace:
        raise FabriclabError("give a TRACE or --model, not both")
    if args.trace:
        return _trace(args)
    text = WorkloadSpec.model(args.model or DEFAULT_MODEL).text
    return text, text


def _sweep_request(args: argparse.Namespace) -> Any:
    """compare's and plan's shared arguments as a `fabriclab.study.sweeps.SweepRequest`."""
    from fabriclab.study.sweeps import SweepRequest

    if args.jobs is not None and args.jobs < 1:
        raise FabriclabError(f"--jobs must be >= 1, got {args.jobs}")
    trace, label = _sweep_workload(args)
    options = {k: v for k, v in dataclasses.asdict(run_options(args)).items() if k != "ranks"}
    return SweepRequest(trace, label, options, _sim_model(args), None if args.no_cache else Path(args.cache),
                        Path(args.out))


def _print_outcome(args: argparse.Namespace, outcome: Any, also: str = "") -> int:
    from fabriclab.compare_output import format_failed

    if args.json:
        print(outcome.paths[0].read_text())
    else:
        print(outcome.text)
        if outcome.failed:
            print()
            print(format_failed(outcome.failed))
        print(f"wrote        {', '.join(str(p) for p in outcome.paths)}{also}")
    return 1 if outcome.failed else 0


def cmd_compare(args: argparse.Namespace) -> int:
    from fabriclab import compare as cmp
    from fabriclab.study.sweeps import CompareRequest, compare_study

    sweep = _sweep_request(args)
    if args.topology:
        series = [cmp.Series(t, r) for t, r in _replay_pairs(args)]
    else:
        if args.routing:
            raise FabriclabError("--routing needs --topology (one per topology)")
        series = list(cmp.LLM_SERIES if sweep.workload.llm else cmp.DEFAULT_SERIES)
    request = CompareRequest(sweep, tuple(series), tuple(args.sizes), args.stragglers, args.sensitivity)
    return _print_outcome(args, compare_study(request, _runner(args)))


def cmd_plan(args: argparse.Namespace) -> int:
    """`fabriclab plan`: every design of the designs file (or the built-in set) at `--gpus`, as compare's series."""
    from fabriclab import planner
    from fabriclab.study.sweeps import PlanRequest, plan_study

    request = PlanRequest(_sweep_request(args), args.gpus,
                          Path(args.designs) if args.designs else planner.DEFAULT_DESIGNS_FILE, args.prices,
                          not args.no_reference)
    return _print_outcome(args, plan_study(request, _runner(args)), f", {Path(args.out) / 'topologies'}/*.yaml")


def _runner(args: argparse.Namespace) -> Callable[[str], Callable[..., list[Any]]]:
    return lambda title: shown_rows(title, args.json, args.jobs, args.cluster)


def cmd_report(args: argparse.Namespace) -> int:
    from traffic import report
    from traffic.results import load_result

    if len(args.dirs) > 2:
        raise FabriclabError(f"give one run directory, or two to compare; got {len(args.dirs)}")
    runs = [load_result(Path(d)) for d in args.dirs]
    if len(runs) == 1:
        paths = report.write_report(runs[0], Path(args.out or args.dirs[0]))
        print(report.format_summary(report.summarize(runs[0])))
    else:
        out = Path(args.out or args.dirs[0])
        paths = report.write_comparison(runs[0], runs[1], out)
        print(report.format_comparison(report.compare(runs[0], runs[1])))
    print("wrote        " + ", ".join(str(p) for p in paths if p.suffix in (".html", ".json")))
    return 0


def _emulated_runner(args: argparse.Namespace) -> Any:
    """Run a workload on the emulation replay (`fabriclab.calibrate.EmulatedRun`), quietly or logged."""
    from fabriclab.backends import Emulated, run_workload

    log = (lambda msg: None) if args.json else (lambda msg: print(f"[fabriclab] {msg}", file=sys.stderr))

    def run(workload: Any, fabric: Any, routing: str, options: Any) -> Any:
        return run_workload(workload, workload.source, fabric, routing, options, Emulated(log=log)).result
    return run


def cmd_calibrate(args: argparse.Namespace) -> int:
    from fabriclab import calibrate as cal_mod

    fabrics = [(topofile.load(t), "adaptive") for t in (args.topology or ["dual-plane-16", "pyramid-16"])]
    if args.dilation is not None and not args.dilation > 0:
        raise FabriclabError(f"--dilation must be > 0, got {args.dilation:g}")
    log = (lambda msg: None) if args.json else (lambda msg: print(f"[fabriclab] {msg}", file=sys.stderr))
    cal = cal_mod.calibrate(fabrics, _emulated_runner(args), args.dilation or cal_mod.MICRO_DILATION, log=log)
    cal.write(Path(args.out))
    if args.json:
        print(json.dumps(cal.to_dict(), indent=2))
    else:
        print(cal_mod.format_calibration(cal))
        print(f"calibration  {args.out}")
    return 0


def cmd_crosscheck(args: argparse.Namespace) -> int:
    from fabriclab import calibrate as cal_mod
    from traffic.traces import BUILTIN_TRACE, default_ranks, load

    cal = cal_mod.Calibration.read(args.calibration)
    trace, label = _trace(args)
    workload = load(trace, **load_options(args))
    if args.steps is not None:
        if args.steps < 1:
            raise FabriclabError(f"--steps must be >= 1, got {args.steps}")
        workload = dataclasses.replace(workload, ranks=tuple(dataclasses.replace(r, steps=r.steps[:args.steps])
                                                             for r in workload.ranks))
    pairs = _replay_pairs(args)
    fabrics = [(topofile.load(t), r) for t, r in pairs]
    ranks = default_ranks(args.ranks, None if trace == str(BUILTIN_TRACE) else args.trace)
    out: list[dict[str, Any]] = []
    for fab, routing in fabrics:
        opts = run_options(args, ranks).replay_options(routing)
        rows, emulated, _ = cal_mod.crosscheck(workload, label, fab, routing, opts, cal, _emulated_runner(args))
        out.append(cal_mod.crosscheck_doc(fab.name, routing, emulated.meta.dilation, rows))
        if not args.json:
            print(f"{label} on {fab.name} ({routing}), emulated at dilation {emulated.meta.dilation:.4g}; "
                  f"simulated with the calibration of {args.calibration}")
            print(cal_mod.format_rows(rows))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "crosscheck.json").write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"figures      {Path(args.out) / 'crosscheck.json'}")
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    from traffic.record import record

    paths = record(Path(args.out), ranks=args.ranks, steps=args.steps)
    print(f"recorded     {len(paths)} rank trace(s) in {args.out}")
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from fabric.emulation import claims

    if os.geteuid() != 0:
        raise FabriclabError("clean removes processes, namespaces and interfaces: run it as root (sudo)")
    live = [c for c in claims.claims() if not c.stale]
    removed = claims.reclaim_stale()
    for c, left in removed:
        print(f"removed      {c.path.name}: {len(left.pids)} processes, {len(left.namespaces)} namespaces, "
              f"{len(left.paths)} files or directories, {len(left.bridges)} bridges, {len(left.interfaces)} interfaces")
    print(f"clean        {len(removed)} stale run(s) removed, {len(live)} live run(s) left alone")
    return 0
