"""The `fabriclab` command line. It only calls library functions and formats their results.

    fabriclab topo show FILE [FILE2] [--json]   what a fabric is (two files: side by side, differences marked)
    fabriclab topo check FILE                   validate a topology file
    fabriclab up [FILE] [--routing R] [--cli | --hold]
                                                bring up fabric + controller, check all-pairs reachability,
                                                print a summary, tear down
    fabriclab trace show FILE|DIR [--json]      what a trace holds: ranks, steps, compute, collectives
    fabriclab replay [TRACE] [--topology T ...] [--routing R ...] [--out DIR]
                                                replay a trace's collectives as real TCP bytes; with no
                                                arguments: the built-in trace on dual-plane-16 (adaptive)
                                                and pyramid-16 (ecmp), side by side
    fabriclab sim [TRACE] [--topology T ...] [--routing R ...] [--link-down SW:PORT@US ...]
                                                the same on the flow-level simulator: no root, any size
    fabriclab compare [TRACE] [--topology T --routing R ...] [--sizes N ...]
                                                a trace over fabrics, routings and sizes on the simulator
    fabriclab report DIR [DIR2]                 re-render a run's report, or put two runs side by side
    fabriclab record OUT [--ranks 4 --steps 6]  record a small real DDP job (PyTorch, gloo) as Kineto traces

Any FabriclabError becomes a one-line message and exit code 2; a failed check exits 1.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import ipaddress
import json
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fabric import topofile
from fabric.analysis import TopoSummary, summarize
from fabric.emulation import EmulationOptions
from fabric.errors import FabriclabError
from fabric.routing import MODES
from fabriclab.progress import ProgressView
from traffic.formatting import format_bytes, format_us

ROUTING_HELP = (f"routing policy: {', '.join(MODES)}, or a class of your own as package.module:ClassName "
                "(a fabric.routing.RoutingPolicy subclass, importable here)")


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


def _show(summaries: list[TopoSummary], as_json: bool) -> str:
    dicts = [s.to_dict() for s in summaries]
    if as_json:
        return json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2)
    width = max(len(v) for v in _LABELS.values()) + 2
    lines = []
    for key, label in _LABELS.items():
        values = [_fmt(d[key]) for d in dicts]
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
    from fabriclab.session import Lab
    from traffic.ping import ping_all

    fab = topofile.load(args.topology)
    opts = EmulationOptions(mbps_per_gbps=args.mbps_per_gbps, datapath=args.datapath,
                            delay_us=args.delay_us, loss_pct=args.loss_pct)
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    log(f"[fabriclab] bringing up {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
        f"routing {args.routing}")
    t0 = time.monotonic()
    with Lab(fab, routing=args.routing, opts=opts, log=lambda msg: log(f"[fabriclab] {msg}")) as lab:
        if lab.emulation is None or lab.bringup is None:
            raise FabriclabError("the lab did not come up")
        log(f"[fabriclab] up in {lab.bringup.total_s:.1f} s (datapath {lab.emulation.datapath}); "
            "checking all-pairs reachability")
        pings = ping_all(lab.emulation, count=args.count)
        per_plane: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # pairs, pairs ok, lost packets
        for p in pings:
            plane = fab.nic_by_ip[ipaddress.IPv4Address(p.dst_ip)].plane
            per_plane[plane][0] += 1
            per_plane[plane][1] += p.received == p.sent
            per_plane[plane][2] += p.sent - p.received
        if args.cli:
            lab.emulation.interactive()
        elif args.hold:
            log("[fabriclab] fabric is up; Ctrl-C tears it down")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    left = lab.leftovers()
    expected_pairs = {p.name: len(fab.hosts) * (len(fab.hosts) - 1) for p in fab.planes}
    gaps = [{"exit_code": g.exit_code, "gap_s": None if g.gap_s is None else round(g.gap_s, 3), "error": g.error}
            for g in lab.controller_gaps]
    restored = all(g["gap_s"] is not None for g in gaps)
    ok = all(per_plane[p][1] == n for p, n in expected_pairs.items()) and left.empty() and restored
    result = {
        "topology": fab.name,
        "hosts": len(fab.hosts),
        "switches": len(fab.switches),
        "routing": args.routing,
        "datapath": lab.emulation.datapath if lab.emulation else None,
        "bringup_s": {k: round(v, 3) for k, v in vars(lab.bringup).items()} | {"total_s": round(lab.bringup.total_s, 3)},
        "reachability": {
            p: {"pairs": n, "pairs_ok": per_plane[p][1], "packets_lost": per_plane[p][2], "pings_per_pair": args.count}
            for p, n in expected_pairs.items()
        },
        "controller_gaps": gaps,
        "teardown_clean": left.empty(),
        "elapsed_s": round(time.monotonic() - t0, 3),
        "ok": ok,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        b = lab.bringup
        print(f"fabric       {fab.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
              f"{len(fab.links)} links, planes {', '.join(p.name for p in fab.planes)}")
        print(f"controller   os-ken, routing {args.routing}; datapath {result['datapath']}")
        print(f"bring-up     {b.total_s:.2f} s (controller {b.controller_s:.2f}, build {b.build_s:.2f}, "
              f"connect {b.connect_s:.2f}, flows {b.flows_s:.2f})")
        for p, r in result["reachability"].items():
            print(f"plane {p}      {r['pairs_ok']}/{r['pairs']} host pairs reachable, "
                  f"{r['packets_lost']} of {r['pairs'] * args.count} pings lost")
        for g in gaps:
            what = f"resynchronised after {g['gap_s']:.2f} s" if g["gap_s"] is not None else f"NOT restored: {g['error']}"
            print(f"controller   died (exit code {g['exit_code']}); restarted, {what}")
        print(f"teardown     {'clean' if left.empty() else f'LEFT BEHIND: {left}'}")
        print("result       " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


def cmd_trace_show(args: argparse.Namespace) -> int:
    from traffic.traces import load, summarize as summarize_trace

    summary = summarize_trace(load(args.trace, compute_gap_us=args.compute_gap_us,
                                   collectives_per_step=args.step_ops))
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    print(f"trace        {summary.source} ({summary.format})")
    print(f"ranks        {len(summary.ranks)} in the trace of a {summary.world_size}-rank job; "
          f"{summary.steps} step(s) per rank; {'timed' if summary.timed else 'NO timings'}")
    print(f"{'rank':>5} {'step':>6} {'duration':>11} {'compute':>11} {'exposed comm':>13} {'share':>7}  collectives")
    for st in summary.step_summaries:
        share = "-" if st.exposed_comm_share is None else f"{st.exposed_comm_share:.1%}"
        kinds = ", ".join(f"{k.count} {k.kind} {format_bytes(k.size_bytes)}" for k in st.kinds)
        print(f"{st.rank:>5} {st.number:>6} {format_us(st.duration_us):>11} {format_us(st.compute_us):>11} "
              f"{format_us(st.exposed_comm_us):>13} {share:>7}  {kinds}")
    for note in summary.notes:
        print(f"note         {note}")
    return 0


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
    """The trace to run (the built-in recording by default) and its label."""
    from traffic.traces import BUILTIN_TRACE

    return (args.trace, args.trace) if args.trace else (str(BUILTIN_TRACE), f"builtin ({BUILTIN_TRACE.name})")


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


def _sim_options(args: argparse.Namespace) -> Any:
    """The simulator's options from `--per-transfer-us`, `--per-hop-us`, `--poll-ms` and `--forwarding`
    (`_sim_args`); numpy's huge-page advice off (`numpy_hugepage_advice_off`)."""
    from fabric.flowsim import SimOptions

    numpy_hugepage_advice_off()

    if args.per_transfer_us < 0 or args.per_hop_us < 0:
        raise FabriclabError(f"--per-transfer-us and --per-hop-us must be >= 0, got {args.per_transfer_us:g} "
                             f"and {args.per_hop_us:g}")
    if not args.poll_ms >= 0:
        raise FabriclabError(f"--poll-ms must be >= 0, got {args.poll_ms:g}")
    return SimOptions(per_transfer_s=args.per_transfer_us / 1e6, per_hop_s=args.per_hop_us / 1e6,
                      poll_s=args.poll_ms / 1e3, cut_through=args.forwarding == "cut-through")


@contextlib.contextmanager
def _progress_bar(quiet: bool, unit: str, desc: str) -> Iterator[Callable[[int, int], None]]:
    """A progress callback (done, total) of `unit`s: a bar on a terminal's stderr, plain lines otherwise
    (`fabriclab.progress`)."""
    with ProgressView(f"{desc} ({unit})", quiet=quiet) as view:
        yield view.items


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_replay(args: argparse.Namespace) -> int:
    return _run_workload(args, "emulation")


def cmd_sim(args: argparse.Namespace) -> int:
    return _run_workload(args, "flowsim")


def _run_workload(args: argparse.Namespace, backend: str) -> int:
    """`replay` (emulation) and `sim` (flowsim): one trace over one or two (topology, routing) pairs,
    a report per run and, for two, the comparison."""
    from traffic import report
    from traffic.replay import ReplayOptions, default_ports
    from traffic.traces import default_ranks, load

    trace, label = _trace(args)
    workload = load(trace, compute_gap_us=args.compute_gap_us, collectives_per_step=args.step_ops)
    pairs = _replay_pairs(args)
    fabrics = [(topofile.load(t), r) for t, r in pairs]  # every topology checked before anything runs
    ranks = default_ranks(args.ranks, args.trace)
    common = {"ranks": ranks, "placement": args.placement, "algorithm": args.algorithm, "channels": args.channels,
              "repeat": args.repeat, "compute_gap_us": args.compute_gap_us or 0.0, "step_ops": args.step_ops}
    if backend == "emulation":
        opts = ReplayOptions(**common, mbps_per_gbps=args.mbps_per_gbps, dilation=args.dilation,  # type: ignore[arg-type]
                             compute="slept" if args.sleep_compute else "composed")
    else:
        from traffic.replay.simulate import parse_link_event

        opts = ReplayOptions(**common)  # type: ignore[arg-type]
        sim_opts = _sim_options(args)
        link_events = {fab.name: [parse_link_event(t, fab, up) for up, texts in ((False, args.link_down or []),
                                                                                   (True, args.link_up or []))
                                  for t in texts] for fab, _ in fabrics}
    out = Path(args.out)
    results = []
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    verb = "replaying" if backend == "emulation" else "simulating"
    for fab, routing in fabrics:
        ports = args.ports if args.ports != "auto" else default_ports(routing)
        run_opts = dataclasses.replace(opts, ports=ports, seed=args.seed)
        sub = out / f"{fab.name}-{routing.replace(':', '_').replace('/', '_')}" if len(fabrics) > 1 else out
        log(f"[fabriclab] {verb} {label} on {fab.name} ({routing})")
        if backend == "emulation":
            from fabriclab.replay import replay_on_emulation

            with _progress_bar(args.json, "coll", f"{fab.name} {routing}") as progress:
                result = replay_on_emulation(workload, label, fab, routing, run_opts, sub, progress=progress,
                                             log=lambda msg: log(f"[fabriclab] {msg}"))
        else:
            from traffic.replay.simulate import simulate_replay

            with ProgressView(f"sim {fab.name} {routing}", quiet=args.json) as view:
                def shown(p: Any) -> None:
                    view.running({0: (p.bytes_share, f"{p.stage}: {p.calls_done}/{p.calls} calls, "
                                                     f"{p.bytes_share:.0%} of bytes, simulated {p.sim_s * 1e3:.4g} ms")})

                result = simulate_replay(workload, label, fab, routing, run_opts, sim_opts, link_events[fab.name],
                                         all_to_all=args.all_to_all, progress=shown)
            result.write(sub)
        report.write_report(result, sub)
        results.append((sub, result))
        log(f"[fabriclab] {fab.name} ({routing}): report in {sub / 'report.html'}")
    if len(results) == 2:
        report.write_comparison(results[0][1], results[1][1], out)
    if args.json:
        print(json.dumps({"runs": [{"dir": str(d), "summary": report.summarize(r).to_dict()} for d, r in results],
                          "comparison": report.compare(results[0][1], results[1][1]).to_dict()
                          if len(results) == 2 else None}, indent=2))
    elif len(results) == 2:
        print(report.format_comparison(report.compare(results[0][1], results[1][1])))
        print(f"reports      {out / 'comparison.html'}, {results[0][0] / 'report.html'}, "
              f"{results[1][0] / 'report.html'}")
    else:
        print(report.format_summary(report.summarize(results[0][1])))
        print(f"report       {results[0][0] / 'report.html'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from fabriclab import compare as cmp

    trace, label = _trace(args)
    if args.topology:
        pairs = _replay_pairs(args)
        series = [cmp.Series(t, r) for t, r in pairs]
    else:
        if args.routing:
            raise FabriclabError("--routing needs --topology (one per topology)")
        series = list(cmp.DEFAULT_SERIES)
    sim = _sim_options(args)
    if args.jobs is not None and args.jobs < 1:
        raise FabriclabError(f"--jobs must be >= 1, got {args.jobs}")
    options: dict[str, Any] = {"placement": args.placement, "algorithm": args.algorithm, "channels": args.channels,
                               "repeat": args.repeat, "seed": args.seed, "compute_gap_us": args.compute_gap_us or 0.0}
    if args.ports != "auto":
        options["ports"] = args.ports
    if args.step_ops is not None:  # only when given: rows cached without it keep their keys
        options["step_ops"] = args.step_ops
    t0 = time.monotonic()
    meta = {"trace": label, "series": [dataclasses.asdict(s) for s in series], "sizes": sorted(set(args.sizes)),
            "options": options, "sim": dataclasses.asdict(sim), "lockstep": args.lockstep,
            "all_to_all": args.all_to_all}
    expected = len(series) * len(set(args.sizes))

    def partial(rows: list[Any]) -> None:  # every finished row on disk at once: a stopped run keeps them
        cmp.write(rows, cmp.seed_check(rows), Path(args.out),
                  meta | {"complete": len(rows) == expected, "rows_expected": expected,
                          "wall_s": time.monotonic() - t0})

    with ProgressView("compare", quiet=args.json) as view:
        def shown(p: Any) -> None:
            view.items(p.rows_done, p.rows)
            view.running({r.label: (r.bytes_share, r.describe()) for r in p.running})

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _interrupted) if main else None  # workers end too (`_sweep`)
        try:
            rows = cmp.compare(trace, series, args.sizes, options=options, sim=sim, label=label,
                               cache_dir=None if args.no_cache else Path(args.cache), jobs=args.jobs,
                               progress=shown, lockstep=args.lockstep, all_to_all=args.all_to_all, on_rows=partial)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
    seed = cmp.seed_check(rows)
    paths = cmp.write(rows, seed, Path(args.out), meta | {"complete": True, "rows_expected": expected,
                                                          "wall_s": time.monotonic() - t0})
    if args.json:
        print(paths[0].read_text())
    else:
        print(cmp.format_table(rows, seed))
        print(f"wrote        {', '.join(str(p) for p in paths)}")
    return 0


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
    from fabriclab.replay import replay_on_emulation

    log = (lambda msg: None) if args.json else (lambda msg: print(f"[fabriclab] {msg}", file=sys.stderr))

    def run(workload: Any, fabric: Any, routing: str, options: Any) -> Any:
        return replay_on_emulation(workload, workload.source, fabric, routing, options, log=log)
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
    workload = load(trace, compute_gap_us=args.compute_gap_us, collectives_per_step=args.step_ops)
    if args.steps is not None:
        if args.steps < 1:
            raise FabriclabError(f"--steps must be >= 1, got {args.steps}")
        workload = dataclasses.replace(workload, ranks=tuple(dataclasses.replace(r, steps=r.steps[:args.steps])
                                                             for r in workload.ranks))
    pairs = _replay_pairs(args)
    fabrics = [(topofile.load(t), r) for t, r in pairs]
    ranks = default_ranks(args.ranks, args.trace)
    out: list[dict[str, Any]] = []
    for fab, routing in fabrics:
        ports = args.ports if args.ports != "auto" else default_ports(routing)
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


def _workload_args(p: argparse.ArgumentParser, default_out: str) -> None:
    """The arguments `replay` and `sim` share: the trace, the fabrics and routings, the plan."""
    p.add_argument("trace", nargs="?", metavar="TRACE", help="trace file or directory (default: the built-in "
                                                             "recording, mapped onto 16 ranks)")
    p.add_argument("--topology", action="append", metavar="T",
                   help="topology file or shipped name; repeat for a side-by-side comparison "
                        "(default: dual-plane-16 and pyramid-16)")
    p.add_argument("--routing", action="append", metavar="R",
                   help=ROUTING_HELP + "; one per --topology (default: adaptive, and ecmp for pyramid-16)")
    p.add_argument("--ranks", type=int, help="map a data-parallel trace onto this many ranks "
                                             "(default: every host for a single-rank trace)")
    p.add_argument("--placement", default="block", help="rank -> host: block, spread, or a YAML/JSON file")
    p.add_argument("--algorithm", default="ring", help="all-reduce algorithm: ring (default), tree, "
                                                        "halving_doubling, hierarchical, or auto")
    p.add_argument("--channels", type=int, default=2, help="connections per plane per host pair (default 2)")
    p.add_argument("--ports", choices=["auto", "planned", "hashed"], default="auto",
                   help="connection source ports: planned (each channel on its own equal-cost path), hashed "
                        "(random, as the OS picks them: classic ECMP collisions), or auto: planned under "
                        "adaptive routing, hashed otherwise (default)")
    p.add_argument("--seed", type=int, default=0, help="seed for hashed source ports (default 0)")
    p.add_argument("--repeat", type=int, default=1, help="loop the trace's steps N times (more samples for p99)")
    p.add_argument("--compute-gap-us", type=float, default=None,
                   help="compute before each collective, for traces without timings")
    p.add_argument("--step-ops", type=int, default=None, metavar="N",
                   help="NCCL logs only: every N collectives of a rank are a step, in place of the steps found "
                        "from the log's own period or opCount restarts")
    p.add_argument("--out", default=default_out, help=f"output directory (default {default_out})")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")


def _sim_args(p: argparse.ArgumentParser) -> None:
    """The simulator's own arguments (`sim` and `compare`; read by `_sim_options`)."""
    p.add_argument("--per-transfer-us", type=float, default=0.0,
                   help="fixed overhead per point-to-point transfer, real microseconds (default 0)")
    p.add_argument("--per-hop-us", type=float, default=0.0,
                   help="latency per link of a transfer's path, real microseconds (default 0)")
    p.add_argument("--forwarding", choices=["store-and-forward", "cut-through"], default="store-and-forward",
                   help="a transfer begins once those it depends on are delivered (store-and-forward, default), "
                        "or once they have begun, its bytes following theirs, as the replay's agents forward "
                        "(cut-through; not with --lockstep on)")
    p.add_argument("--poll-ms", type=float, default=10.0,
                   help="congestion feedback: the routing policy sees link and slot rates every this many "
                        "simulated ms, as the controller polls its counters (default 10; 0: never)")
    p.add_argument("--all-to-all", choices=["auto", "exact", "lockstep", "sampled"], default="auto",
                   help="how all-to-alls are simulated: exact (the DAG as scheduled), lockstep (each round "
                        "waits for the whole round before), sampled (lockstep, one round of each block "
                        "simulated and the block's others run as it ran, bytes on their own paths); default "
                        "auto: exact up to 16 ranks (the emulated sizes), sampled above (errors in "
                        "benchmarks/RESULTS.md)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fabriclab", description="A lab for AI-training cluster networks.")
    sub = ap.add_subparsers(dest="command", required=True)

    topo = sub.add_parser("topo", help="inspect topology files").add_subparsers(dest="topo_command", required=True)
    show = topo.add_parser("show", help="counts, bandwidths, oversubscription, hops and paths")
    show.add_argument("files", nargs="+", metavar="FILE", help="topology file(s) or shipped names; two compare")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_topo_show)
    check = topo.add_parser("check", help="validate a topology file")
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=cmd_topo_check)

    up = sub.add_parser("up", help="bring up fabric + controller, check reachability, print a summary, tear down")
    up.add_argument("topology", nargs="?", default=str(topofile.DEFAULT_TOPOLOGY),
                    help="topology file or shipped name (default: dual-plane-16)")
    up.add_argument("--routing", default="adaptive", help=ROUTING_HELP + " (default adaptive)")
    up.add_argument("--mbps-per-gbps", type=float, default=0.1,
                    help="emulated Mbit/s per real Gbit/s (default 0.1: 200G -> 20 Mbit/s)")
    up.add_argument("--datapath", default="auto", choices=["auto", "kernel", "user"])
    up.add_argument("--delay-us", type=float, default=0.0, help="per-link delay (needs sch_netem)")
    up.add_argument("--loss-pct", type=float, default=0.0, help="per-link random loss (needs sch_netem)")
    up.add_argument("--count", type=int, default=3, help="pings per host pair and plane (default 3)")
    hold = up.add_mutually_exclusive_group()
    hold.add_argument("--cli", action="store_true", help="open the Mininet CLI after the check")
    hold.add_argument("--hold", action="store_true", help="keep the fabric up until Ctrl-C")
    up.add_argument("--json", action="store_true", help="machine-readable summary")
    up.set_defaults(func=cmd_up)

    trace = sub.add_parser("trace", help="inspect traces").add_subparsers(dest="trace_command", required=True)
    tshow = trace.add_parser("show", help="ranks, steps, compute, collectives per kind, exposed-communication share")
    tshow.add_argument("trace", metavar="FILE|DIR", help="Kineto JSON (.json, .json.gz, or a directory of "
                                                          "per-rank files), Chakra .et, or an NCCL debug log")
    tshow.add_argument("--compute-gap-us", type=float, default=None,
                       help="compute before each collective, for traces without timings (NCCL logs)")
    tshow.add_argument("--step-ops", type=int, default=None, metavar="N",
                       help="NCCL logs only: every N collectives of a rank are a step, in place of the steps found "
                            "from the log's own period or opCount restarts")
    tshow.add_argument("--json", action="store_true")
    tshow.set_defaults(func=cmd_trace_show)

    rp = sub.add_parser("replay", help="replay a trace's collectives as real TCP bytes over the emulated fabric")
    _workload_args(rp, "results/replay")
    rp.add_argument("--mbps-per-gbps", type=float, default=None,
                    help="emulated Mbit/s per real Gbit/s (default: the fastest host NIC at 1 Mbit/s, where the 2-core "
                         "machine stays faithful with every host busy on both planes, agents and controller included)")
    rp.add_argument("--dilation", type=float, help="emulated time / real time (default: chosen so that "
                                                    "collectives are bandwidth-bound)")
    rp.add_argument("--sleep-compute", action="store_true",
                    help="sleep compute gaps at the dilation instead of composing the step timeline (slow)")
    rp.set_defaults(func=cmd_replay)

    sm = sub.add_parser("sim", help="run a trace's collectives on the flow-level simulator (no root; any size), "
                                    "with the same plan, routing and report as replay")
    _workload_args(sm, "results/sim")
    _sim_args(sm)
    sm.add_argument("--link-down", action="append", metavar="SWITCH:PORT@US",
                    help="take a link down at a real time (microseconds since the first collective); repeatable")
    sm.add_argument("--link-up", action="append", metavar="SWITCH:PORT@US",
                    help="bring a link back up at a real time; repeatable")
    sm.set_defaults(func=cmd_sim)

    cp = sub.add_parser("compare", help="a trace over fabrics, routing modes and sizes on the simulator: "
                                        "utilisation, communication share, step times, busbw, scaling efficiency")
    cp.add_argument("trace", nargs="?", metavar="TRACE", help="trace file or directory (default: the built-in "
                                                              "recording); mapped onto each size's ranks")
    cp.add_argument("--topology", action="append", metavar="T",
                    help="a builder topology file or shipped name, built at each size; repeat for each series "
                         "(default: pyramid-1024 with ecmp and dual-plane-1024 with adaptive, the same bandwidth "
                         "per host)")
    cp.add_argument("--routing", action="append", metavar="R", help=ROUTING_HELP + "; one per --topology")
    cp.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512, 1024], metavar="N",
                    help="GPUs (one per host); the smallest is the scaling base (default 128 256 512 1024)")
    cp.add_argument("--placement", default="block", help="rank -> host: block, spread, or a YAML/JSON file")
    cp.add_argument("--algorithm", default="ring", help="all-reduce algorithm (default ring; above 1024 GPUs its hierarchical form, as NCCL switches too)")
    cp.add_argument("--channels", type=int, default=2, help="connections per plane per host pair (default 2)")
    cp.add_argument("--ports", choices=["auto", "planned", "hashed"], default="auto",
                    help="source ports (default auto: planned under adaptive routing, hashed otherwise)")
    cp.add_argument("--seed", type=int, default=0, help="seed for hashed source ports (default 0)")
    cp.add_argument("--repeat", type=int, default=1, help="loop the trace's steps N times")
    cp.add_argument("--compute-gap-us", type=float, default=None,
                    help="compute before each collective, for traces without timings")
    cp.add_argument("--step-ops", type=int, default=None, metavar="N",
                    help="NCCL logs only: every N collectives of a rank are a step, in place of the steps found "
                         "from the log's own period or opCount restarts")
    _sim_args(cp)
    cp.add_argument("--lockstep", choices=["auto", "on", "off"], default="auto",
                    help="run each collective's steps in lockstep, each waiting for all of the step before "
                         "(default auto: above 1024 GPUs, where the exact dependencies can take hours)")
    cp.add_argument("--jobs", type=int, help="configurations run at once (default: the number of cores)")
    cp.add_argument("--cache", default="results/compare/cache",
                    help="where rows are cached by content (default results/compare/cache)")
    cp.add_argument("--no-cache", action="store_true", help="compute every row, read and write no cache")
    cp.add_argument("--out", default="results/compare", help="output directory (default results/compare)")
    cp.add_argument("--json", action="store_true", help="print compare.json instead of the table")
    cp.set_defaults(func=cmd_compare)

    rep = sub.add_parser("report", help="re-render a run's report, or two runs side by side")
    rep.add_argument("dirs", nargs="+", metavar="DIR", help="one or two run directories (with result.json)")
    rep.add_argument("--out", help="where to write (default: the first DIR)")
    rep.set_defaults(func=cmd_report)

    cl = sub.add_parser("clean", help="remove what killed runs left behind (bridges, veths, processes); "
                                      "never touches a run that is still running")
    cl.set_defaults(func=cmd_clean)

    ca = sub.add_parser("calibrate", help="fit the simulator's overheads to the emulator on microbenchmarks "
                                          "(ring all-reduces of several sizes on idle emulated fabrics; root)")
    ca.add_argument("--topology", action="append", metavar="T",
                    help="fabric to run the microbenchmarks on; repeatable (default: dual-plane-16 and pyramid-16)")
    ca.add_argument("--dilation", type=float, default=None, help="the microbenchmarks' dilation (default 100000)")
    ca.add_argument("--out", default="results/calibration.json", help="where to write the calibration "
                                                                      "(default results/calibration.json)")
    ca.add_argument("--json", action="store_true", help="print the calibration as JSON")
    ca.set_defaults(func=cmd_calibrate)

    cc = sub.add_parser("crosscheck", help="run a trace on the emulator and on the calibrated simulator and print "
                                           "the difference per collective (root)")
    _workload_args(cc, "results/crosscheck")
    cc.add_argument("--calibration", default="results/calibration.json",
                    help="a file from `fabriclab calibrate` (default results/calibration.json)")
    cc.add_argument("--steps", type=int, default=None, help="only the trace's first N steps")
    cc.set_defaults(func=cmd_crosscheck)

    rec = sub.add_parser("record", help="record a small real data-parallel training job (needs PyTorch)")
    rec.add_argument("out", metavar="OUT", help="directory for the per-rank traces")
    rec.add_argument("--ranks", type=int, default=4)
    rec.add_argument("--steps", type=int, default=6)
    rec.set_defaults(func=cmd_record)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # `kill -USR1 PID` prints every thread's Python stack to stderr: where a run that seems stuck is
        with contextlib.suppress(AttributeError, ValueError, OSError):  # no SIGUSR1, or no fd behind stderr
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        return int(args.func(args))
    except FabriclabError as e:
        print(f"fabriclab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fabriclab: interrupted; torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
