"""The `fabriclab` commands (`fabriclab.cli` parses their arguments): each turns its arguments into library
calls and prints their results; the rules and the work live in the library (`fabriclab.backends`,
`fabriclab.checkup`, `fabriclab.compare`, `fabriclab.calibrate`, `traffic`, `fabric`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fabric import topofile
from fabric.analysis import TopoSummary, summarize
from fabric.emulation import EmulationOptions
from fabric.errors import FabriclabError
from fabriclab.progress import ProgressView
from traffic.formatting import format_bytes, format_us


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items()) or "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


_LABELS = {
    "name": "name",
    "planes": "planes",
    "hosts": "hosts",
    "switches": "switches",
    "switches_by_role": "  by role",
    "links": "links",
    "nic_ports_per_host": "NIC ports per host",
    "host_bandwidth_gbps": "per-host bandwidth (Gbit/s)",
    "total_host_bandwidth_gbps": "total host bandwidth (Gbit/s)",
    "bisection_bandwidth_gbps": "bisection bandwidth (Gbit/s)",
    "bisection_ratio": "bisection / half the hosts' bandwidth",
    "oversubscription": "oversubscription (down:up, worst per tier)",
    "hops_min": "hops between hosts, min",
    "hops_max": "hops between hosts, max",
    "ecmp_paths_min": "equal-cost paths between hosts, min",
    "ecmp_paths_max": "equal-cost paths between hosts, max",
}


#: shown after "hosts" when a fabric has servers of more than one GPU
_SERVER_LABELS = {
    "servers": "servers",
    "gpus_per_server": "GPUs per server",
    "rails": "rails",
    "nvlink_gbps": "NVLink per GPU, each way (Gbit/s)",
}


def _labels(dicts: list[dict[str, Any]]) -> dict[str, str]:
    if all(d["gpus_per_server"] == 1 for d in dicts):
        return _LABELS
    out: dict[str, str] = {}
    for key, label in _LABELS.items():
        out[key] = label
        if key == "hosts":
            out.update(_SERVER_LABELS)
    return out


def _show_value(d: dict[str, Any], key: str) -> str:
    if key == "rails" and not d[key]:
        return "no rail wiring"
    return _fmt(d[key])


def _show(summaries: list[TopoSummary], as_json: bool) -> str:
    dicts = [s.to_dict() for s in summaries]
    if as_json:
        return json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2)
    labels = _labels(dicts)
    width = max(len(v) for v in labels.values()) + 2
    lines = []
    for key, label in labels.items():
        values = [_show_value(d, key) for d in dicts]
        mark = "  *" if len(values) > 1 and len(set(values)) > 1 and key != "name" else ""
        lines.append(f"{label:<{width}}" + "".join(f"{v:<28}" for v in values).rstrip() + mark)
    if len(dicts) > 1:
        lines.append("(* marks what differs)")
    return "\n".join(lines)


def cmd_topo_show(args: argparse.Namespace) -> int:
    summaries = [summarize(topofile.load(f)) for f in args.files]
    print(_show(summaries, args.json))
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


#: `trace show` lists a job rank by rank up to this many ranks, else one rank per process group
TRACE_SHOW_RANKS = 16


def cmd_trace_show(args: argparse.Namespace) -> int:
    from traffic.traces import load

    workload = load(args.trace, compute_gap_us=args.compute_gap_us, collectives_per_step=args.step_ops,
                    world_size=getattr(args, "world_size", None))
    return _show_workload(workload, args.rank, args.json)


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
        from traffic.placement import resolve_placement
        from traffic.reach import group_reach

        fab = topofile.load(args.topology)
        reach = group_reach(workload, fab, resolve_placement(fab, workload.world_size, args.placement))
    if not args.json:
        print(describe(config, workload))
        if args.write:
            print(f"config       written to {args.write}")
        for r in reach:
            print(f"reach        on {args.topology} ({args.placement}): {r.describe()}")
    return _show_workload(workload, args.rank, args.json, {"reach": [r.to_dict() for r in reach]} if reach else None)


def _show_workload(workload: Any, rank_asked: int | None, as_json: bool, extra: dict[str, Any] | None = None) -> int:
    from traffic.traces import summarize as summarize_trace
    from traffic.traces.groups import by_group

    summary = summarize_trace(workload)
    # a large job is shown as one rank sees it, per process group; a small one rank by rank
    per_group = rank_asked is not None or len(workload.ranks) > TRACE_SHOW_RANKS
    rank = rank_asked if rank_asked is not None else workload.ranks[0].rank
    groups = by_group(workload, rank) if per_group else []
    if as_json:
        out = summary.to_dict()
        if per_group:
            out["per_step"] = [s for s in out["per_step"] if s["rank"] == rank]
            out["by_group"] = {"rank": rank, "rows": [g.to_dict() for g in groups]}
        out.update(extra or {})
        print(json.dumps(out, indent=2))
        return 0
    print(f"trace        {summary.source} ({summary.format})")
    print(f"ranks        {len(summary.ranks)} in the trace of a {summary.world_size}-rank job; "
          f"{summary.steps} step(s) per rank; {'timed' if summary.timed else 'NO timings'}")
    training = getattr(workload, "training", None)
    if training is not None:
        print(f"model        {training.summary()}")
    rows = [st for st in summary.step_summaries if not per_group or st.rank == rank]
    print(f"{'rank':>5} {'step':>6} {'duration':>11} {'compute':>11} {'exposed comm':>13} {'share':>7}  collectives")
    for st in rows:
        share = "-" if st.exposed_comm_share is None else f"{st.exposed_comm_share:.1%}"
        kinds = ", ".join(f"{k.count} {k.kind} {format_bytes(k.size_bytes)}" for k in st.kinds)
        print(f"{st.rank:>5} {st.number:>6} {format_us(st.duration_us):>11} {format_us(st.compute_us):>11} "
              f"{format_us(st.exposed_comm_us):>13} {share:>7}  {kinds}")
    if per_group:
        print(f"\nrank {rank}'s collectives per step and group (stream)")
        print(f"{'step':>6} {'group':>6} {'kind':<15} {'ranks':>5} {'count':>7} {'each':>19} {'total':>11}")
        for g in groups:
            each = (format_bytes(g.min_bytes) if g.min_bytes == g.max_bytes
                    else f"{format_bytes(g.min_bytes)}-{format_bytes(g.max_bytes)}")
            print(f"{g.step:>6} {g.group:>6} {g.kind:<15} {g.group_size:>5} {g.count:>7} {each:>19} "
                  f"{format_bytes(g.total_bytes):>11}")
    for note in summary.notes:
        print(f"note         {note}")
    return 0


#: The main job (`fabriclab replay` and `sim` with no TRACE; `scripts/lab run`): a 16-GPU slice of the GPT-3 175B
#: step (the 175B layer shape, 8 of its 96 layers, TP4 in each of 4 servers, PP2 and DP2 across them, 4
#: micro-batches) on two server-wired 16-GPU fabrics, where every DP and PP byte leaves its server's edge switch:
#: through the pyramid's 2:1 ToR uplinks (ECMP), or the dual-plane's non-blocking leaves (adaptive)
MAIN_TRACE = ("llm:gpt3-175b,name=gpt3-175b-slice16,model.layers=8,parallel.tp=4,parallel.pp=2,parallel.dp=2,"
              "global_batch=8,gpus_per_server=4")
MAIN_TOPOLOGIES = ("dual-plane-16-servers", "pyramid-16-servers")
#: the main job's dilation on the emulator: its 50 MB pipeline transfers at two of the shaper's bursts and more
#: (at the automatic dilation, chosen for its GB-sized gradient buckets, they would leave faster than the links)
MAIN_DILATION = 122.0
#: the main job's verdict at scale: the same preset (the whole GPT-3 175B step, DP grown to the size) on the
#: simulator on server-wired fabrics of that size, wired as the main job's 16-GPU ones (a server's GPUs under one
#: edge switch), pyramid first
MAIN_SCALE_PRESET = "llm:gpt3-175b"
MAIN_SCALE_SERIES = (("pyramid-1024-servers", "ecmp"), ("dual-plane-1024-servers", "adaptive"))
#: a TRACE of this name (and no such file) is the built-in CPU recording (the main job before issue 27)
BUILTIN_NAME = "builtin"


def _main_job(args: argparse.Namespace) -> bool:
    """With no TRACE, the main job's: its trace, fabrics (unless given) and emulation dilation (unless
    given) put on `args`; True then. A TRACE named `builtin` is the built-in recording."""
    if args.trace:
        return False
    args.trace = MAIN_TRACE
    if not args.topology:
        if args.routing:
            raise FabriclabError("--routing needs --topology (one per topology)")
        args.topology, args.routing = list(MAIN_TOPOLOGIES), ["adaptive", "ecmp"]
    if getattr(args, "dilation", None) is None and hasattr(args, "dilation"):
        args.dilation = MAIN_DILATION
    return True


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


def _sim_options(args: argparse.Namespace, llm: bool = False) -> Any:
    """The simulator's options from `--per-transfer-us`, `--per-hop-us`, `--resolution-us`, `--poll-ms` and `--forwarding`
    (`_sim_args`); numpy's huge-page advice off (`numpy_hugepage_advice_off`). `--resolution-us` not given: exact
    (`DEFAULT_RESOLUTION_US`), or `COARSE_RESOLUTION_US` for a generated LLM step (`llm`), whose network transfers are
    MB-sized (the step's error measured in docs/simulator.md#resolution)."""
    from fabric.flowsim import SimOptions
    from fabric.latency import COARSE_RESOLUTION_US, DEFAULT_RESOLUTION_US

    numpy_hugepage_advice_off()
    if args.resolution_us is None:
        args.resolution_us = COARSE_RESOLUTION_US if llm else DEFAULT_RESOLUTION_US

    if args.per_transfer_us < 0 or args.per_hop_us < 0:
        raise FabriclabError(f"--per-transfer-us and --per-hop-us must be >= 0, got {args.per_transfer_us:g} "
                             f"and {args.per_hop_us:g}")
    if not 0 <= args.resolution_us <= 1000:
        raise FabriclabError(f"--resolution-us must be in [0, 1000], got {args.resolution_us:g}")
    if not args.poll_ms >= 0:
        raise FabriclabError(f"--poll-ms must be >= 0, got {args.poll_ms:g}")
    return SimOptions(per_transfer_s=args.per_transfer_us / 1e6, per_hop_s=args.per_hop_us / 1e6,
                      poll_s=args.poll_ms / 1e3, cut_through=args.forwarding == "cut-through",
                      resolution_s=args.resolution_us / 1e6)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_replay(args: argparse.Namespace) -> int:
    return _run_workload(args, "emulation")


def cmd_sim(args: argparse.Namespace) -> int:
    return _run_workload(args, "flowsim")


def _run_workload(args: argparse.Namespace, backend: str) -> int:
    """`replay` (emulation) and `sim` (flowsim): one trace over one or two (topology, routing) pairs,
    a report per run and, for two, the comparison."""
    from fabriclab.backends import Backend, Emulated, Simulated, describe_progress, run_workload
    from traffic import report
    from traffic.replay import ReplayOptions, default_ports
    from traffic.traces import default_ranks, load

    main_job = _main_job(args)
    if main_job and backend == "emulation" and args.at_scale and (args.at_scale < 128 or args.at_scale % 64):
        raise FabriclabError(f"--at-scale must be a multiple of 64 GPUs, at least 128 (the preset's TP8 x PP8 "
                             f"replicas), or 0 for none; got {args.at_scale}")
    trace, label = _trace(args)
    if main_job:
        label = "gpt3-175b-slice16"
    workload = load(trace, compute_gap_us=args.compute_gap_us, collectives_per_step=args.step_ops,
                    world_size=getattr(args, "world_size", None))
    pairs = _replay_pairs(args)
    fabrics = [(topofile.load(t), r) for t, r in pairs]  # every topology checked before anything runs
    from traffic.traces import BUILTIN_TRACE

    ranks = default_ranks(args.ranks, None if trace == str(BUILTIN_TRACE) else args.trace)
    common = {"ranks": ranks, "placement": args.placement, "algorithm": args.algorithm, "channels": args.channels,
              "repeat": args.repeat, "compute_gap_us": args.compute_gap_us or 0.0, "step_ops": args.step_ops}
    if backend == "emulation":
        opts = ReplayOptions(**common, mbps_per_gbps=args.mbps_per_gbps, dilation=args.dilation,  # type: ignore[arg-type]
                             compute="slept" if args.sleep_compute else "composed")
    else:
        from traffic.replay.simulate import parse_link_event

        opts = ReplayOptions(**common)  # type: ignore[arg-type]
        sim_opts = _sim_options(args, llm=str(trace).startswith("llm:"))
        link_events = {fab.name: [parse_link_event(t, fab, up) for up, texts in ((False, args.link_down or []),
                                                                                   (True, args.link_up or []))
                                  for t in texts] for fab, _ in fabrics}
    out = Path(args.out)
    results = []
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    verb = "replaying" if backend == "emulation" else "simulating"
    for fab, routing in fabrics:
        ports = default_ports(routing, args.ports)
        run_opts = dataclasses.replace(opts, ports=ports, seed=args.seed)
        sub = out / f"{fab.name}-{routing.replace(':', '_').replace('/', '_')}" if len(fabrics) > 1 else out
        log(f"[fabriclab] {verb} {label} on {fab.name} ({routing})")
        runner: Backend = (Emulated(log=lambda msg: log(f"[fabriclab] {msg}")) if backend == "emulation"
                           else Simulated(sim_opts, link_events[fab.name], args.all_to_all))
        with ProgressView(f"{backend} {fab.name} {routing}", quiet=args.json) as view:
            result = run_workload(workload, label, fab, routing, run_opts, runner, out_dir=sub,
                                  progress=lambda p: view.running({0: (p.bytes_share, describe_progress(p))})).result
        report.write_report(result, sub)
        results.append((sub, result))
        log(f"[fabriclab] {fab.name} ({routing}): report in {sub / 'report.html'}")
    if len(results) == 2:
        report.write_comparison(results[0][1], results[1][1], out)
    check = None
    if backend == "emulation" and main_job and len(results) == 2:
        # the simulator on the same plan and fabrics, beside the emulator's figures (issue 27: their
        # dual-plane / pyramid step ratios agree within 20%)
        log("[fabriclab] the same on the simulator (seconds)")
        sims = [run_workload(workload, label, fab, routing,
                             dataclasses.replace(ReplayOptions(**common), ports=default_ports(routing, args.ports),  # type: ignore[arg-type]
                                                 seed=args.seed), Simulated(_main_sim_options())).result
                for fab, routing in fabrics]
        check = _emulated_and_simulated([r for _, r in results], sims)
        if args.at_scale:
            check["at_scale"] = _at_scale(args, log)
        (out / "simulated.json").write_text(json.dumps(check, indent=2))
    if args.json:
        print(json.dumps({"runs": [{"dir": str(d), "summary": report.summarize(r).to_dict()} for d, r in results],
                          "comparison": report.compare(results[0][1], results[1][1]).to_dict()
                          if len(results) == 2 else None, **({"simulated": check} if check else {})}, indent=2))
    elif len(results) == 2:
        print(report.format_comparison(report.compare(results[0][1], results[1][1])))
        if check:
            print(_format_check(check))
            if "at_scale" in check:
                print(_format_at_scale(check["at_scale"]))
        print(f"reports      {out / 'comparison.html'}, {results[0][0] / 'report.html'}, "
              f"{results[1][0] / 'report.html'}")
    else:
        print(report.format_summary(report.summarize(results[0][1])))
        print(f"report       {results[0][0] / 'report.html'}")
    return 0


def _main_sim_options() -> Any:
    """The simulator's defaults (`fabriclab sim`'s: the default latency)."""
    from fabriclab.compare import default_sim_options

    numpy_hugepage_advice_off()
    return dataclasses.replace(default_sim_options(), poll_s=0.01)


def _at_scale(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """The main job's verdict at `--at-scale` GPUs: `fabriclab compare` of the whole preset at that size on
    the server-wired pyramid and dual-plane (`MAIN_SCALE_SERIES`), rows cached as compare's are (a second
    run reads them); the two rows and the evidence for the difference."""
    from fabric.latency import COARSE_RESOLUTION_US
    from fabriclab import compare as cmp

    log(f"[fabriclab] the whole {MAIN_SCALE_PRESET[4:]} step at {args.at_scale} GPUs on the simulator "
        f"(cached in {args.cache}; minutes the first time)")
    series = [cmp.Series(t, r) for t, r in MAIN_SCALE_SERIES]
    # compare's own settings for `_compare_shown`: the cache given, its default jobs and models
    shown = argparse.Namespace(json=args.json, no_cache=False, cache=args.cache, jobs=None, lockstep="auto",
                               all_to_all="auto", cluster=None)
    # its transfers are MB-sized (pipeline activations, gradient buckets): events 5 us apart are taken together,
    # for a step within 0.1% of the exact one (docs/simulator.md#resolution) in a fraction of the time
    sim = dataclasses.replace(cmp.default_sim_options(), resolution_s=COARSE_RESOLUTION_US / 1e6)
    pyr, dual = _compare_shown(f"simulator {args.at_scale} GPUs", shown, MAIN_SCALE_PRESET, series, [args.at_scale],
                               {}, sim, MAIN_SCALE_PRESET, lambda rows: None)
    keys = ("fabric", "routing", "gpus", "step_mean_us", "comm_share", "utilisation", "exposed_by_group",
            "busbw_by_group", "hottest_by_tier", "collisions_by_tier", "sim_wall_s", "cached")
    return {"preset": MAIN_SCALE_PRESET, "gpus": args.at_scale, "resolution_us": COARSE_RESOLUTION_US,
            "rows": [{k: getattr(r, k) for k in keys} for r in (pyr, dual)],
            "step_ratio": pyr.step_mean_us / dual.step_mean_us}


def _format_at_scale(c: dict[str, Any]) -> str:
    """The at-scale verdict as the main job prints it: the step ratio, then its cause from the rows."""
    from traffic.formatting import format_bps, format_share, format_us

    p, d = c["rows"]

    def group(key: str, g: str, fmt: Callable[[float], str]) -> str:
        return f"{fmt(p[key].get(g, 0.0))} / {fmt(d[key].get(g, 0.0))}"

    hot_p = max(p["hottest_by_tier"].items(), key=lambda kv: kv[1], default=("-", 0.0))
    hot_d = max(d["hottest_by_tier"].items(), key=lambda kv: kv[1], default=("-", 0.0))
    return (f"at {c['gpus']} GPUs the whole {c['preset'][4:]} step on the simulator: {p['fabric']} / {d['fabric']} "
            f"{format_us(p['step_mean_us'])} / {format_us(d['step_mean_us'])} = {c['step_ratio']:.3f}x\n"
            f"  why        pipeline busbw {group('busbw_by_group', 'pp', format_bps)}, exposed pp "
            f"{group('exposed_by_group', 'pp', format_share)} and dp {group('exposed_by_group', 'dp', format_share)} "
            f"of the step, communication {format_share(p['comm_share'])} / {format_share(d['comm_share'])}; hottest "
            f"link {hot_p[0]} {format_share(hot_p[1])} / {hot_d[0]} {format_share(hot_d[1])}")


def _emulated_and_simulated(emulated: list[Any], simulated: list[Any]) -> dict[str, Any]:
    """The two fabrics' mean steps on the emulator and the simulator, and their ratios (b / a)."""
    from traffic import report

    def steps(rs: list[Any]) -> list[float]:
        out = []
        for r in rs:
            p = report.summarize(r).step_time_us
            if p is None:
                raise FabriclabError(f"{r.meta.topology}: the run has no steps")
            out.append(p.mean)
        return out

    emu, sim = steps(emulated), steps(simulated)
    return {"fabrics": [r.meta.topology for r in emulated], "emulated_step_us": emu, "simulated_step_us": sim,
            "emulated_ratio": emu[1] / emu[0], "simulated_ratio": sim[1] / sim[0],
            "agreement": (emu[1] / emu[0]) / (sim[1] / sim[0])}


def _format_check(c: dict[str, Any]) -> str:
    from traffic.formatting import format_us

    a, b = c["fabrics"]
    return (f"simulated    the same plan on the flow-level simulator: {b} / {a} step "
            f"{format_us(c['simulated_step_us'][1])} / {format_us(c['simulated_step_us'][0])} = "
            f"{c['simulated_ratio']:.3f}x (emulated {c['emulated_ratio']:.3f}x; ratio of ratios "
            f"{c['agreement']:.3f})")


def cmd_compare(args: argparse.Namespace) -> int:
    from fabriclab import compare as cmp

    if args.model is not None:
        if args.trace:
            raise FabriclabError("give a TRACE or --model, not both")
        args.trace = args.model if args.model.startswith("llm:") else f"llm:{args.model}"
    trace, label = _trace(args)
    if args.topology:
        pairs = _replay_pairs(args)
        series = [cmp.Series(t, r) for t, r in pairs]
    else:
        if args.routing:
            raise FabriclabError("--routing needs --topology (one per topology)")
        series = list(cmp.LLM_SERIES if cmp.is_llm(trace) else cmp.DEFAULT_SERIES)
    sim = _sim_options(args, llm=cmp.is_llm(trace))
    if args.jobs is not None and args.jobs < 1:
        raise FabriclabError(f"--jobs must be >= 1, got {args.jobs}")
    options: dict[str, Any] = {"placement": args.placement, "algorithm": args.algorithm, "channels": args.channels,
                               "repeat": args.repeat, "seed": args.seed, "compute_gap_us": args.compute_gap_us or 0.0}
    if args.ports != "auto":
        options["ports"] = args.ports
    if args.step_ops is not None:  # only when given: rows cached without it keep their keys
        options["step_ops"] = args.step_ops
    t0 = time.monotonic()
    meta = {"trace": label, "series": [s.doc() for s in series], "sizes": sorted(set(args.sizes)),
            "options": options, "sim": dataclasses.asdict(sim), "lockstep": args.lockstep,
            "all_to_all": args.all_to_all, **({"stragglers": args.stragglers} if args.stragglers is not None else {})}
    expected = len(series) * len(set(args.sizes)) * (2 if args.stragglers is not None else 1)

    def partial(rows: list[Any]) -> None:  # every finished row on disk at once: a stopped run keeps them
        cmp.write(rows, cmp.seed_check(rows), Path(args.out),
                  meta | {"complete": len(rows) == expected, "rows_expected": expected,
                          "wall_s": time.monotonic() - t0}, sim)

    rows: list[Any] | None = None
    try:
        rows = _compare_shown("compare", args, trace, series, args.sizes, options, sim, label, partial,
                              stragglers=args.stragglers)
        seed = cmp.seed_check(rows)
        meta |= {"complete": True, "rows_expected": expected, "wall_s": time.monotonic() - t0}
        sens = _sensitivity(args, trace, label, series, options, sim, rows, seed, meta) if args.sensitivity else None
    except cmp.RowsFailed as e:
        # every other row finished: written and shown with the failed ones listed (those of the table, or of
        # the sensitivity sweep after a complete table: then without its section), and exit 1
        done = e.rows if rows is None else rows
        meta |= {"complete": rows is not None, "rows_expected": expected, "wall_s": time.monotonic() - t0,
                 "failed": e.failed}
        seed = cmp.seed_check(done)
        paths = cmp.write(done, seed, Path(args.out), meta, sim)
        _print_compare(args, paths, done, seed, sim, "", e.failed)
        return 1
    from fabriclab.sensitivity import format_section

    sens_text = format_section(sens) if sens is not None else ""
    paths = cmp.write(rows, seed, Path(args.out), meta, sim, sens, sens_text)
    _print_compare(args, paths, rows, seed, sim, sens_text, [])
    return 0


def _print_compare(args: argparse.Namespace, paths: list[Path], rows: list[Any], seed: list[Any], sim: Any,
                   sens_text: str, failed: list[dict[str, str]]) -> None:
    from fabriclab import compare as cmp

    if args.json:
        print(paths[0].read_text())
        return
    print(cmp.format_table(rows, seed, sim))
    if sens_text:
        print()
        print(sens_text)
    if failed:
        print()
        print(cmp.format_failed(failed))
    print(f"wrote        {', '.join(str(p) for p in paths)}")


def _sensitivity(args: argparse.Namespace, trace: str, label: str, series: list[Any], options: dict[str, Any],
                 sim: Any, rows: list[Any], seed: list[Any], meta: dict[str, Any]) -> dict[str, Any]:
    """`compare --sensitivity`: the sweep's rows at the largest size (`fabriclab.sensitivity`), cached
    like the table's, each written as it finishes; its section, with the sweep's wall time."""
    from fabriclab import compare as cmp
    from fabriclab import sensitivity as sens_mod

    gpus = max(args.sizes)
    sweep = sens_mod.sweep_series(series, cmp.is_llm(trace))
    if not sweep:
        raise FabriclabError("--sensitivity needs a pyramid or a dual-plane series (its points change those)")
    t0 = time.monotonic()

    def section(sweep_rows: list[Any]) -> dict[str, Any]:
        doc = sens_mod.analyse(rows, sweep_rows, gpus, trace)
        return doc | {"rows": [dataclasses.asdict(r) for r in sweep_rows], "rows_expected": len(sweep),
                      "complete": len(sweep_rows) == len(sweep), "wall_s": time.monotonic() - t0}

    def partial(sweep_rows: list[Any]) -> None:
        doc = section(sweep_rows)
        cmp.write(rows, seed, Path(args.out), meta, sim, doc, sens_mod.format_section(doc))

    return section(_compare_shown("sensitivity", args, trace, sweep, [gpus], options, sim, label, partial))


def cmd_plan(args: argparse.Namespace) -> int:
    """`fabriclab plan`: every design of the designs file (or the built-in set) at `--gpus`, run as compare's
    series (`fabriclab.planner`); the table, CSV, JSON and plot rewritten as each row finishes."""
    from fabric.parts import DEFAULT_PRICES
    from fabriclab import compare as cmp
    from fabriclab import plan_report, planner

    if args.model is not None and args.trace:
        raise FabriclabError("give a TRACE or --model, not both")
    if args.trace:
        trace, label = _trace(args)
    else:
        model = args.model or "gpt3-175b"
        trace = model if model.startswith("llm:") else f"llm:{model}"
        label = trace
    if args.jobs is not None and args.jobs < 1:
        raise FabriclabError(f"--jobs must be >= 1, got {args.jobs}")
    default_g = 8
    if cmp.is_llm(trace):
        from traffic.llm import load_config

        default_g = load_config(trace[len("llm:"):]).gpus_per_server
        cmp.llm_spec_at(trace, args.gpus)  # a GPU count the model cannot be split over fails here
    sim = _sim_options(args, llm=cmp.is_llm(trace))
    designs_file = Path(args.designs) if args.designs else planner.DEFAULT_DESIGNS_FILE
    designs = planner.load_designs(designs_file)
    prices = planner.load_prices(args.prices) if args.prices else DEFAULT_PRICES
    planned = planner.resolve(designs, args.gpus, default_g)
    out = Path(args.out)
    files = planner.write_topologies(planned, args.gpus, out / "topologies")
    refs = {} if args.no_reference else planner.write_references(planned, args.gpus, out / "topologies")
    series = planner.plan_series(planned, files, refs)
    options: dict[str, Any] = {"placement": args.placement, "algorithm": args.algorithm, "channels": args.channels,
                               "repeat": args.repeat, "seed": args.seed, "compute_gap_us": args.compute_gap_us or 0.0}
    if args.ports != "auto":
        options["ports"] = args.ports
    if args.step_ops is not None:
        options["step_ops"] = args.step_ops
    t0 = time.monotonic()
    meta: dict[str, Any] = {"workload": label, "gpus": args.gpus, "designs_file": str(designs_file),
                            "prices_file": args.prices, "series": [s.doc() for s in series], "options": options,
                            "sim": dataclasses.asdict(sim), "lockstep": args.lockstep, "all_to_all": args.all_to_all}
    outputs = plan_report.Outputs(out)

    def write(rows: list[Any], complete: bool, failed: list[dict[str, str]] | None = None) -> list[Path]:
        res = plan_report.results(planned, files, refs, rows, prices)
        return outputs.write(res, prices, meta | {"complete": complete, "rows_done": len(rows),
                                                  "rows_expected": len(series), "wall_s": time.monotonic() - t0,
                                                  **({"failed": failed} if failed else {})},
                             args.gpus, label)

    write([], False)
    failed: list[dict[str, str]] = []
    try:
        rows = _compare_shown(f"plan {args.gpus} GPUs", args, trace, series, [args.gpus], options, sim, label,
                              lambda rows: None if write(rows, False) else None)
    except cmp.RowsFailed as e:  # every other design finished: written and shown, the failed ones listed, exit 1
        rows, failed = e.rows, e.failed
    paths = write(rows, not failed, failed)
    if args.json:
        print(paths[0].read_text())
    else:
        print(paths[2].read_text(), end="")
        if failed:
            print()
            print(cmp.format_failed(failed))
        print(f"wrote        {', '.join(str(p) for p in paths)}, {out / 'topologies'}/*.yaml")
    return 1 if failed else 0


def _compare_shown(title: str, args: argparse.Namespace, trace: str, series: Sequence[Any], sizes: Sequence[int],
                   options: dict[str, Any], sim: Any, label: str, on_rows: Callable[[list[Any]], None],
                   stragglers: str | None = None) -> list[Any]:
    """`fabriclab.compare.compare` with the command's cache, jobs, cluster and models, its progress shown under
    `title`, and SIGTERM ending it as Ctrl-C does (its Ray tasks are cancelled and a local Ray instance it
    started shut down: `fabriclab.sweep.Session`)."""
    from fabriclab import compare as cmp

    with ProgressView(title, quiet=args.json) as view:
        def shown(p: Any) -> None:
            view.items(p.rows_done, p.rows)
            view.running({r.label: (r.bytes_share, r.describe()) for r in p.running})

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _interrupted) if main else None
        try:
            return cmp.compare(trace, series, sizes, options=options, sim=sim, label=label,
                               cache_dir=None if args.no_cache else Path(args.cache), jobs=args.jobs,
                               progress=shown, lockstep=args.lockstep, all_to_all=args.all_to_all, on_rows=on_rows,
                               stragglers=stragglers, cluster=args.cluster)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)


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
    from traffic.replay import ReplayOptions, default_ports
    from traffic.traces import default_ranks, load

    cal = cal_mod.Calibration.read(args.calibration)
    trace, label = _trace(args)
    workload = load(trace, compute_gap_us=args.compute_gap_us, collectives_per_step=args.step_ops,
                    world_size=getattr(args, "world_size", None))
    if args.steps is not None:
        if args.steps < 1:
            raise FabriclabError(f"--steps must be >= 1, got {args.steps}")
        workload = dataclasses.replace(workload, ranks=tuple(dataclasses.replace(r, steps=r.steps[:args.steps])
                                                             for r in workload.ranks))
    pairs = _replay_pairs(args)
    fabrics = [(topofile.load(t), r) for t, r in pairs]
    from traffic.traces import BUILTIN_TRACE

    ranks = default_ranks(args.ranks, None if trace == str(BUILTIN_TRACE) else args.trace)
    out: list[dict[str, Any]] = []
    for fab, routing in fabrics:
        ports = default_ports(routing, args.ports)
        opts = ReplayOptions(ranks=ranks, placement=args.placement, algorithm=args.algorithm, channels=args.channels,
                             ports=ports, seed=args.seed, repeat=args.repeat, compute_gap_us=args.compute_gap_us or 0.0,
                             step_ops=args.step_ops)
        rows, emulated, _ = cal_mod.crosscheck(workload, label, fab, routing, opts, cal, _emulated_runner(args))
        out.append({"topology": fab.name, "routing": routing, "dilation": emulated.meta.dilation,
                    "collectives": [dataclasses.asdict(r) | {"difference": r.difference,
                                                             "bandwidth_bound": r.bandwidth_bound,
                                                             "comparable": r.comparable} for r in rows]})
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
