"""The `fabriclab` command line: its arguments (`build_parser`) and `main`; each command is a function of
`fabriclab.commands`, which only calls library functions and formats their results.

    fabriclab topo show FILE [FILE2] [--json]   what a fabric is (two files: side by side, differences marked)
    fabriclab topo check FILE                   validate a topology file
    fabriclab up [FILE] [--routing R] [--cli | --hold]
                                                bring up fabric + controller, check all-pairs reachability,
                                                print a summary, tear down
    fabriclab trace show FILE|DIR [--json]      what a trace holds: ranks, steps, compute, collectives
    fabriclab workload llm [SPEC] [--write F]   a transformer training step from a model config (presets:
                                                gpt3-175b, llama3-70b, ...); anywhere a TRACE goes: llm:SPEC
    fabriclab replay [TRACE] [--topology T ...] [--routing R ...] [--out DIR]
                                                replay a trace's collectives as real TCP bytes; with no
                                                arguments: the main job, a 16-GPU slice of the GPT-3 175B
                                                step on dual-plane-16-servers (adaptive) and
                                                pyramid-16-servers (ecmp), side by side, with the simulator's
                                                figures and the whole step at 1,024 GPUs
    fabriclab sim [TRACE] [--topology T ...] [--routing R ...] [--link-down SW:PORT@US ...]
                                                the same on the flow-level simulator: no root, any size
    fabriclab compare [TRACE] [--topology T --routing R ...] [--sizes N ...]
                                                a trace over fabrics, routings and sizes on the simulator
    fabriclab plan [TRACE | --model SPEC] [--gpus N] [--designs FILE] [--prices FILE] [--cluster ADDRESS]
                                                the what-if planner: designs swept on the simulator, their
                                                step, p99, cost in parts and the Pareto front
    fabriclab report DIR [DIR2]                 re-render a run's report, or put two runs side by side
    fabriclab record OUT [--ranks 4 --steps 6]  record a small real DDP job (PyTorch, gloo) as Kineto traces

Any FabriclabError becomes a one-line message and exit code 2; a failed check exits 1.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import signal
import sys
import threading
from typing import Any

from fabric import topofile
from fabric.errors import FabriclabError
from fabric.latency import (COARSE_RESOLUTION_US, DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US, DEFAULT_RESOLUTION_US,
                            NCCL_NVLINK_RING_STEP_US)
from fabric.routing import MODES
from fabriclab.commands import (cmd_calibrate, cmd_clean, cmd_compare, cmd_crosscheck, cmd_plan, cmd_record,
                                cmd_replay, cmd_report, cmd_sim, cmd_topo_check, cmd_topo_show, cmd_trace_show,
                                cmd_up, cmd_workload_llm)
from fabriclab.study.spec import FLAT_RING_MAX
from fabriclab.sweep import add_cluster_argument
from traffic.nccl_choice import NCCL_ALGOS
from traffic.workload import LAUNCHLESS_KERNELS

PLACEMENT_HELP = ("rank -> host: block (in host order, the default), spread (one rank every hosts/ranks hosts), "
                  "pods (whole servers spread evenly over the fabric's pods), fragmented[:OCC[:SEED]] (whole servers "
                  "drawn at random from those a share OCC of other jobs leaves free; default 0.5, seed 0), or a "
                  "YAML/JSON file")

ROUTING_HELP = (f"routing policy: {', '.join(MODES)}, or a class of your own as package.module:ClassName "
                "(a fabric.routing.RoutingPolicy subclass, importable here)")


def _run_args(p: argparse.ArgumentParser) -> None:
    """How a workload runs (`fabriclab.study.spec.RunOptions`): every command that runs one takes these."""
    p.add_argument("--placement", default="block", help=PLACEMENT_HELP)
    p.add_argument("--algorithm", default="nccl",
                   help="nccl (default): NCCL's algorithm for all-reduce, all-gather and reduce-scatter, as "
                        "--nccl-algo says (on the simulator above --hierarchical-above GPUs the all-reduce's "
                        "hierarchical ring); or an all-reduce algorithm: ring, tree, halving_doubling, hierarchical, "
                        "auto")
    p.add_argument("--nccl-algo", choices=list(NCCL_ALGOS), default="auto",
                   help="as NCCL_ALGO: auto (default: NCCL 2.30.7's tuning model picks ring, tree or PAT by size, "
                        "nodes and GPUs a node), or ring, tree (all-reduce), pat (all-gather, reduce-scatter at one "
                        "GPU a server); where NCCL lacks it for a collective, NCCL's choice")
    p.add_argument("--channels", "--channels-per-nic", dest="channels", type=int, default=2,
                   help="channels per NIC (as NCCL_MIN/MAX_NCHANNELS): connections per plane per host pair, and the "
                        "nChannels of NCCL's tuning model per GPU of a group in a server (default 2, as NCCL runs "
                        "on H100 servers)")
    p.add_argument("--pxn", choices=["on", "off"], default="on",
                   help="NCCL's PXN (default on, as NCCL 2.12+): a ring's server exit and an all-to-all's piece for "
                        "another rail cross NVLink to the GPU of the peer's rail and leave through its NIC")
    p.add_argument("--nvls", choices=["on", "off"], default="off",
                   help="NCCL's NVLS and NVLSTree (NVLink SHARP): off, the only choice modelled (docs/simulator.md)")
    p.add_argument("--collnet", choices=["on", "off"], default="off",
                   help="NCCL's CollNet (SHARP in the switches): off, as NCCL without a CollNet plugin; not modelled")
    p.add_argument("--merge-nics", choices=["on", "off"], default="on",
                   help="as NCCL_IB_MERGE_NICS (default on): each channel striped over a dual-port NIC's ports (the "
                        "dual-plane's two planes); off: each port its own NIC, whole channels alternating over the "
                        "planes (with --channels 1 a pair uses one plane)")
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
    _launchless_arg(p)


def _launchless_arg(p: argparse.ArgumentParser) -> None:
    """`--launchless-kernels`, for every command that reads a trace (`traffic.traces.load`)."""
    p.add_argument("--launchless-kernels", choices=LAUNCHLESS_KERNELS, default=None,
                   help="Kineto traces only: GPU kernels without a launch event in the trace (launched before the "
                        "profiler started) are left out of the steps' compute, as HolisticTraceAnalysis does "
                        "(leave-out, the default), or put in the step whose window holds their start, clipped to "
                        "its end (by-time)")


def _workload_args(p: argparse.ArgumentParser, default_out: str) -> None:
    """The arguments `replay` and `sim` share: the trace, the fabrics and routings, the plan."""
    p.add_argument("trace", nargs="?", metavar="TRACE",
                   help="trace file or directory, llm:SPEC, or `builtin` (the built-in CPU recording, mapped onto 16 "
                        "ranks); default: the main job, a 16-GPU slice of the GPT-3 175B step (TP4 PP2 DP2) on "
                        "dual-plane-16-servers (adaptive) and pyramid-16-servers (ecmp)")
    p.add_argument("--topology", action="append", metavar="T",
                   help="topology file or shipped name; repeat for a side-by-side comparison "
                        "(default: the main job's fabrics; for a TRACE, dual-plane-16 and pyramid-16)")
    p.add_argument("--routing", action="append", metavar="R",
                   help=ROUTING_HELP + "; one per --topology (default: adaptive, and ecmp for the pyramid)")
    p.add_argument("--ranks", type=int, help="map a data-parallel trace onto this many ranks "
                                             "(default: every host for a single-rank trace)")
    _run_args(p)
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="AICB CSV and SimAI files only: map the job onto N ranks (default: as the file says)")
    p.add_argument("--ep", type=int, default=None, metavar="N",
                   help="AICB CSV only: the expert-parallel group's size, which AICB's ep_group rows do not give "
                        "(checked: N divides the job; without it those rows are left out, their time noted)")
    p.add_argument("--out", default=default_out, help=f"output directory (default {default_out})")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")


def _sim_args(p: argparse.ArgumentParser) -> None:
    """The simulator's own arguments (`sim` and `compare`; read by `fabriclab.commands._sim_model`)."""
    p.add_argument("--per-transfer-us", type=float, default=DEFAULT_PER_TRANSFER_US,
                   help="fixed cost of one point-to-point transfer (a ring step), real microseconds (default "
                        f"{DEFAULT_PER_TRANSFER_US:g}: with 4 hops, NCCL's per-network-step latency of its ring; "
                        "0 and --per-hop-us 0: bandwidth only; sources in docs/simulator.md)")
    p.add_argument("--per-hop-us", type=float, default=DEFAULT_PER_HOP_US,
                   help="latency per link of a transfer's path, real microseconds (default "
                        f"{DEFAULT_PER_HOP_US:g}: a 51.2T-class switch's port-to-port latency and 10 m of fibre)")
    p.add_argument("--nvlink-latency-us", type=float, default=NCCL_NVLINK_RING_STEP_US,
                   help="latency of each transfer between two GPUs of a server (NVLink), real microseconds (default "
                        f"{NCCL_NVLINK_RING_STEP_US:g}: NCCL's intra-node step latency of its ring, Simple protocol; "
                        "0: NVLink at its rate only)")
    p.add_argument("--resolution-us", type=float, default=None,
                   help="the simulator's time resolution, real microseconds: flows that end and events that fall "
                        "due within this long after the first are taken together, one rate computation for all "
                        f"(default {DEFAULT_RESOLUTION_US:g} for traces: exact to the model; {COARSE_RESOLUTION_US:g} "
                        "for generated LLM steps (--model, llm:SPEC), whose network transfers are MB-sized: several "
                        "times faster on congested fabrics, the step within 0.2%%; wrong for latency-bound "
                        "collectives; errors in docs/simulator.md)")
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
    p.add_argument("--lockstep", choices=["auto", "on", "off"], default="auto",
                   help="run each collective's steps in lockstep, each waiting for all of the step before "
                        "(default auto: above --hierarchical-above GPUs, where the exact dependencies can take hours)")
    p.add_argument("--hierarchical-above", type=int, default=FLAT_RING_MAX, metavar="GPUS",
                   help="above this many GPUs a ring all-reduce runs in its hierarchical form (rings inside each "
                        "leaf, rings across leaves) and --lockstep auto is on (default %(default)s); every command "
                        "resolves a run the same way (fabriclab.study.spec) and says so in its output")


def _sweep_args(p: argparse.ArgumentParser, what: str) -> None:
    """The arguments `compare` and `plan` share: how the workload runs, where rows run and are cached."""
    _run_args(p)
    _sim_args(p)
    p.add_argument("--jobs", type=int, help=f"{what} run at once (default: the number of cores; on a "
                                            "--cluster, as many as its CPUs take; 1 without a cluster: one after "
                                            "another in this process, no Ray)")
    add_cluster_argument(p)
    p.add_argument("--cache", default="results/compare/cache",
                   help="where rows are cached by content (default results/compare/cache, compare's and plan's)")
    p.add_argument("--no-cache", action="store_true", help="compute every row, read and write no cache")


def _inspect_parsers(sub: Any) -> None:
    """`topo show|check` and `trace show`: inspect topology files and traces."""

    topo = sub.add_parser("topo", help="inspect topology files").add_subparsers(dest="topo_command", required=True)
    show = topo.add_parser("show", help="counts, bandwidths, oversubscription, hops and paths")
    show.add_argument("files", nargs="+", metavar="FILE", help="topology file(s) or shipped names; two compare")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_topo_show)
    check = topo.add_parser("check", help="validate a topology file")
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=cmd_topo_check)

    trace = sub.add_parser("trace", help="inspect traces").add_subparsers(dest="trace_command", required=True)
    tshow = trace.add_parser("show", help="ranks, steps, compute, collectives per kind, exposed-communication share")
    tshow.add_argument("trace", metavar="FILE|DIR|llm:SPEC", help="Kineto JSON (.json, .json.gz, or a directory "
                       "of per-rank files), Chakra .et, an NCCL debug log, an AICB CSV or SimAI workload file, or "
                       "a generated LLM training step (llm:PRESET[,key=value...] or llm:FILE.yaml[,...])")
    tshow.add_argument("--compute-gap-us", type=float, default=None,
                       help="compute before each collective, for traces without timings (NCCL logs)")
    tshow.add_argument("--step-ops", type=int, default=None, metavar="N",
                       help="NCCL logs only: every N collectives of a rank are a step, in place of the steps found "
                            "from the log's own period or opCount restarts")
    tshow.add_argument("--world-size", type=int, default=None, metavar="N",
                       help="AICB CSV and SimAI files only: map the job onto N ranks (default: as the file says)")
    tshow.add_argument("--ep", type=int, default=None, metavar="N",
                       help="AICB CSV only: the expert-parallel group's size, which AICB's ep_group rows do not give "
                            "(checked: N divides the job; without it those rows are left out, their time noted)")
    _launchless_arg(tshow)
    tshow.add_argument("--rank", type=int, default=None,
                       help="show this rank's collectives per step and process group (the default for jobs of "
                            "more than 16 ranks, with their first rank)")
    tshow.add_argument("--json", action="store_true")
    tshow.set_defaults(func=cmd_trace_show)


def _up_parser(sub: Any) -> None:
    """`up`: bring a fabric up with its controller, check it, tear it down."""
    up = sub.add_parser("up", help="bring up fabric + controller, check reachability, print a summary, tear down")
    up.add_argument("topology", nargs="?", default=str(topofile.DEFAULT_TOPOLOGY),
                    help="topology file or shipped name (default: dual-plane-16)")
    up.add_argument("--routing", default="adaptive", help=ROUTING_HELP + " (default adaptive)")
    up.add_argument("--mbps-per-gbps", type=float, default=0.1,
                    help="emulated Mbit/s per real Gbit/s (default 0.1: 200G -> 20 Mbit/s)")
    up.add_argument("--datapath", default="auto", choices=["auto", "kernel", "user"])
    up.add_argument("--delay-us", type=float, default=0.0, help="per-link delay (needs sch_netem)")
    up.add_argument("--loss-pct", type=float, default=0.0, help="per-link random loss (needs sch_netem)")
    up.add_argument("--tunnel-link", action="append", default=[], metavar="SW1-SW2",
                    help="carry this switch-to-switch link by a tunnel between two namespaces standing for two "
                         "servers instead of a veth pair; repeatable (docs/cluster.md)")
    up.add_argument("--tunnel-kind", default="vxlan", choices=["vxlan", "gre"],
                    help="the tunnel's encapsulation (default vxlan)")
    up.add_argument("--count", type=int, default=3, help="pings per host pair and plane (default 3)")
    hold = up.add_mutually_exclusive_group()
    hold.add_argument("--cli", action="store_true", help="open the Mininet CLI after the check")
    hold.add_argument("--hold", action="store_true", help="keep the fabric up until Ctrl-C")
    up.add_argument("--json", action="store_true", help="machine-readable summary")
    up.set_defaults(func=cmd_up)


def _workload_parsers(sub: Any) -> None:
    """`workload llm`: a generated LLM training step."""
    wl = sub.add_parser("workload", help="generate training workloads").add_subparsers(dest="workload_command",
                                                                                     required=True)
    wllm = wl.add_parser("llm", help="a transformer training step from a model config (docs/workloads.md): its "
                                     "collectives per process group, compute and schedule")
    wllm.add_argument("spec", nargs="?", default="gpt3-175b", metavar="SPEC",
                      help="PRESET[,key=value...] or FILE.yaml[,key=value...] (default gpt3-175b: TP8 PP8 DP16 on "
                           "1024 GPUs); the same SPEC runs anywhere as TRACE llm:SPEC")
    wllm.add_argument("--rank", type=int, default=None, help="the rank whose collectives are listed (default: the "
                                                             "first)")
    wllm.add_argument("--write", metavar="FILE", help="write the resolved config as YAML")
    wllm.add_argument("--topology", metavar="T", help="also say how far each process group reaches on this fabric "
                                                      "(one server, one leaf, a pod, the core)")
    wllm.add_argument("--placement", default="block", help="rank -> host for --topology: block (Megatron's order "
                                                           "on the hosts in order, the default), spread, pods, "
                                                           "fragmented[:OCC[:SEED]] (as for sim), or a file")
    wllm.add_argument("--json", action="store_true")
    wllm.set_defaults(func=cmd_workload_llm)


def _replay_parser(sub: Any) -> None:
    """`replay`: a trace's collectives as real TCP bytes on the emulator (root)."""
    rp = sub.add_parser("replay", help="replay a trace's collectives as real TCP bytes over the emulated fabric")
    _workload_args(rp, "results/replay")
    rp.add_argument("--mbps-per-gbps", type=float, default=None,
                    help="emulated Mbit/s per real Gbit/s (default: the fastest host NIC at 1 Mbit/s, where the 2-core "
                         "machine stays faithful with every host busy on both planes, agents and controller included)")
    rp.add_argument("--at-scale", type=int, default=1024, metavar="GPUS",
                    help="the main job only: also the whole GPT-3 175B step at this many GPUs on the simulator, on "
                         "server-wired fabrics of that size (pyramid-1024-servers, dual-plane-1024-servers), rows "
                         "cached in --cache (default 1024; 0: none)")
    rp.add_argument("--cache", default="results/compare/cache",
                    help="where --at-scale's rows are cached (default results/compare/cache, as compare's)")
    rp.add_argument("--dilation", type=float, help="emulated time / real time (default: chosen so that "
                                                    "collectives are bandwidth-bound)")
    rp.set_defaults(func=cmd_replay)


def _sim_parser(sub: Any) -> None:
    """`sim`: the same on the flow-level simulator."""
    sm = sub.add_parser("sim", help="run a trace's collectives on the flow-level simulator (no root; any size), "
                                    "with the same plan, routing and report as replay")
    _workload_args(sm, "results/sim")
    _sim_args(sm)
    sm.add_argument("--link-down", action="append", metavar="SWITCH:PORT@US",
                    help="take a link down at a real time (microseconds since the first collective); repeatable")
    sm.add_argument("--link-up", action="append", metavar="SWITCH:PORT@US",
                    help="bring a link back up at a real time; repeatable")
    sm.set_defaults(func=cmd_sim)


def _compare_parser(sub: Any) -> None:
    """`compare`: a workload over fabrics, routing modes and sizes on the simulator."""
    cp = sub.add_parser("compare", help="a trace over fabrics, routing modes and sizes on the simulator: "
                                        "utilisation, communication share, step times, busbw, scaling efficiency")
    cp.add_argument("trace", nargs="?", metavar="TRACE", help="trace file or directory, mapped onto each size's ranks, "
                                                              "or `builtin` (the built-in CPU recording); default: "
                                                              "--model gpt3-175b, the answer for a 100B-class LLM")
    cp.add_argument("--topology", action="append", metavar="T",
                    help="a builder topology file or shipped name, built at each size; repeat for each series "
                         "(default: pyramid-1024 with ecmp and dual-plane-1024 with adaptive, the same bandwidth "
                         "per host)")
    cp.add_argument("--routing", action="append", metavar="R", help=ROUTING_HELP + "; one per --topology")
    cp.add_argument("--model", metavar="SPEC", help="a generated LLM training step in place of TRACE "
                    "(llm:SPEC: a preset such as gpt3-175b, llama3-70b, or FILE.yaml, with ,key=value overrides), "
                    "weak-scaled to each size: TP, CP and PP kept, DP = GPUs / (TP x CP x PP), the micro-batches "
                    "per replica kept; default series pyramid-1024-rail (ecmp) and dual-plane-1024-rail (adaptive)")
    cp.add_argument("--stragglers", nargs="?", const="stragglers.jitter_cv=0.05", default=None, metavar="OVERRIDES",
                    help="LLM steps only: every series again with these straggler overrides (default when given "
                         "alone: stragglers.jitter_cv=0.05, a lognormal compute jitter of CV 5%% per GPU and step; "
                         "add steps=N to the spec for a p99 over steps)")
    cp.add_argument("--sensitivity", action="store_true",
                    help="then, at the largest size, a sweep of the conditions the vendor's figures may need "
                         "(the pyramid at 1:1 and 4:1, ECMP's ports planned, the dual-plane's hashed, a fragmented "
                         "job, kernels at 80%% of peak, all at once): each vendor figure judged 'reproduced', "
                         "'reproduced only if ...' or 'not reproduced', its arithmetic checked, the stragglers "
                         "its tail needs, the production anchors (docs/simulator.md#sensitivity)")
    cp.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512, 1024], metavar="N",
                    help="GPUs (one per host); the smallest is the scaling base (default 128 256 512 1024)")
    _sweep_args(cp, "configurations")
    cp.add_argument("--out", default="results/compare", help="output directory (default results/compare)")
    cp.add_argument("--json", action="store_true", help="print compare.json instead of the table")
    cp.set_defaults(func=cmd_compare)


def _plan_parser(sub: Any) -> None:
    """`plan`: the what-if planner."""
    pl = sub.add_parser("plan", help="the what-if planner: a workload at a GPU count over designs (spines, "
                                     "oversubscription per tier, plane kind, rails, routing, NIC rate) on the "
                                     "simulator; step, p99, communication, efficiency, cost in parts, Pareto front")
    pl.add_argument("trace", nargs="?", metavar="TRACE", help="trace file or directory (default: --model gpt3-175b)")
    pl.add_argument("--model", metavar="SPEC", help="a generated LLM training step (llm:SPEC: a preset such as "
                    "gpt3-175b, or FILE.yaml, with ,key=value overrides), weak-scaled to --gpus as compare does "
                    "(default gpt3-175b when no TRACE is given)")
    pl.add_argument("--gpus", type=int, default=1024, help="the cluster's GPUs, one per host (default 1024)")
    pl.add_argument("--designs", metavar="FILE", help="the designs to sweep (YAML: defaults:, sweep: cross "
                    "products of axes, designs: one by one; docs/planner.md); default: plans/designs.yaml, 14 "
                    "designs around the 1,024-GPU fabrics")
    pl.add_argument("--prices", metavar="FILE", help="prices per part kind (YAML: unit, switch, switch_port, optic, "
                    "link, nic_port; each a figure or figures by size); default 1 unit per switch port and per optic")
    pl.add_argument("--no-reference", action="store_true",
                    help="no reference rows (one non-blocking switch per GPU bandwidth): no scaling efficiency")
    _sweep_args(pl, "designs simulated")
    pl.add_argument("--out", default="results/plan", help="output directory (default results/plan): plan.json, "
                    ".csv, .txt, .png and topologies/ (each design at --gpus and at 16 hosts)")
    pl.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    pl.set_defaults(func=cmd_plan)


def _other_parsers(sub: Any) -> None:
    """`report`, `clean`, `calibrate`, `crosscheck` and `record`."""
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fabriclab", description="A lab for AI-training cluster networks.")
    sub = ap.add_subparsers(dest="command", required=True)
    for add in (_inspect_parsers, _up_parser, _workload_parsers, _replay_parser, _sim_parser, _compare_parser,
                _plan_parser, _other_parsers):
        add(sub)
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
