"""The simulator's busbw-vs-size curve of a ring and a tree all-reduce at 8, 128 and 1,024 GPUs, beside
NCCL's own tuning model and published nccl-tests figures (issue 27 §1; no root).

    .venv/bin/python benchmarks/latency_curve.py [--gpus 8 128 1024] [--sizes 8 65536 ...] [--pyramid]
                                                 [--lockstep auto] [--max-point-s 60] [--json FILE] [--quick]

For every GPU count N (one GPU per host), on `dual-plane-1024` built at N hosts (`topofile.scaled`: 2 x 200G
NIC ports, 400 Gbit/s per GPU, 32 hosts per leaf; below 32 hosts one leaf holding all of them, as a
32-port leaf with N hosts would be) under adaptive routing with planned source ports, and with `--pyramid`
also on `pyramid-1024` at N (1 x 400G, ECMP), each all-reduce (`traffic.collectives.schedule`, ring and
tree) of each size runs on `fabric.flowsim.simulate` twice: with the default latencies of
`fabric.latency` (a = DEFAULT_PER_TRANSFER_US per transfer, h = DEFAULT_PER_HOP_US per link of its path)
and with none (the bandwidth-only model). Each point records the simulated time, algbw = S / T and
busbw = algbw x 2(n-1)/n (GB/s = 1e9 B/s, nccl-tests' convention for all-reduce), its wall time, and for
the ring the hand alpha-beta value T = 2(n-1) (S/n x 8 / B + a + h k_max) (B: the GPU's NIC rate;
k_max: links of the ring's longest edge, read from the fabric's path table: 2 inside a leaf, 4 between
leaves of a 2-tier fabric, 6 across a pyramid's pods). Beside the ring: NCCL's own model time for
Ring/Simple at the same N and size (8 GPUs per server; `nccl_ring_simple`). A point whose simulation
passes `--max-point-s` of wall time is stopped and recorded as such. The ring at N >= 1,024 runs in
lockstep (`SimOptions.lockstep`; `--lockstep auto`): measured on this machine, the exact DAG of an 8 B
ring over 1,024 ranks took 95 s of wall time (lockstep 2 s) and both gave the hand value within 1e-6.

The output is markdown (for benchmarks/RESULTS.md): the curve, the published figures with their
sources, and notes; `--json FILE` holds the same, rewritten after every point (a stopped run keeps
what it finished). `--quick`: 8 GPUs, three sizes, for the test (tests/test_benchmark_latency_curve.py).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KIB, MIB, GIB = 2**10, 2**20, 2**30
#: nccl-tests starts at 8 B; the schedules accept any size >= 0 (0-byte pieces are kept as 0-byte transfers)
SIZES = (8, 64 * KIB, MIB, 16 * MIB, 128 * MIB, GIB)
QUICK_SIZES = (8, 64 * KIB, MIB)
GPUS = (8, 128, 1024)
ALGORITHMS = ("ring", "tree")
#: the ring runs in lockstep from this many ranks on (`--lockstep auto`; `fabriclab compare` does above 1,024)
LOCKSTEP_FROM = 1024
DUAL_PLANE = ("dual-plane-1024", "adaptive")
PYRAMID = ("pyramid-1024", "ecmp")

# ---- NCCL's tuning model, Ring/Simple all-reduce (NVIDIA/nccl src/graph/tuning.cc, v2.30.7-1) --------------
NCCL_VERSION = "2.30.7"
NCCL_BASE_LAT_RING_SIMPLE_US = 8.4  # baseLatencies[Ring][Simple]
NCCL_NVLINK_RING_SIMPLE_US = 3.4  # hwLatencies[NVLINK][Ring][Simple]
NCCL_NET_RING_SIMPLE_US = 14.0  # hwLatencies[NET][Ring][Simple] (= [NET][Tree][Simple], used when ppn == 1)
NCCL_NET_OVERHEAD_INTEL_US = 1.0  # getNetOverhead() on an Intel x86 host, x3 for Simple on > 1 node
NCCL_PLATEAU_SM80 = 1.4  # ring Simple all-reduce on > 1 node, nBytes / (nChannels x nRanks) >= 64, sm80+
NCCL_GPUS_PER_NODE = 8
NCCL_CHANNELS = 32  # assumed (an 8-GPU, 8-NIC H100 server); only decides where the plateau factor starts
NCCL_BUSBW_GBPS = 48.0  # per GPU: one 400G NDR NIC's measured busbw (nccl-tests#290)


def nccl_ring_simple(n: int, size: int) -> dict[str, Any]:
    """NCCL's model time of a Ring/Simple all-reduce of `size` bytes over `n` GPUs, 8 per server, Intel hosts:
    lat = baseLat + (2(n-1) - 2(nodes-1)) x intraLat + 2(nodes-1) x interLat (intraLat: 3.4 us NVLink, on > 1
    node max(3.4, 3 x 1.0); interLat 14 us, latencyInter 0), x 1.4 past the plateau threshold, plus
    size / algbw with algbw = 48 GB/s busbw per GPU x n / (2(n-1))."""
    nodes = max(1, n // NCCL_GPUS_PER_NODE)
    steps, inter = 2 * (n - 1), 2 * (nodes - 1)
    intra = NCCL_NVLINK_RING_SIMPLE_US
    if nodes > 1:
        intra = max(intra, 3 * NCCL_NET_OVERHEAD_INTEL_US)
    lat = NCCL_BASE_LAT_RING_SIMPLE_US + (steps - inter) * intra + inter * NCCL_NET_RING_SIMPLE_US
    plateau = nodes > 1 and size / (NCCL_CHANNELS * n) >= 64
    if plateau:
        lat *= NCCL_PLATEAU_SM80
    algbw = NCCL_BUSBW_GBPS * n / steps
    t_us = lat + size / (1000 * algbw)
    return {"nccl_model_us": t_us, "nccl_model_latency_us": lat, "nccl_model_plateau": plateau,
            "nccl_model_busbw_gbs": busbw_gbs(n, size, t_us * 1e-6)}


# ---- published figures (the lead's survey, issue 27 §1; each with its source) -----------------------------------
PUBLISHED: tuple[tuple[str, str, str], ...] = (
    ("NCCL tuning model", "hwLat NET Ring Simple 14.0 us, NET Ring LL 2.7 us, NET Tree Simple 14 us; baseLat Ring "
     "Simple 8.4 us; NVLink Ring Simple 3.4 us; ring all-reduce latency = baseLat + (2(n-1) - 2(nodes-1)) x intraLat "
     "+ 2(nodes-1) x interLat; Simple ring all-reduce on > 1 node x 1.4 (plateau, sm80+)",
     f"NVIDIA/nccl src/graph/tuning.cc, v{NCCL_VERSION}"),
    ("8 GPUs, 1 node, H100", "~460-480 GB/s busbw at large sizes (NVLS); ~370 GB/s with NCCL_ALGO=RING",
     "NVIDIA/nccl-tests#212 (maintainer, 2024-05-06)"),
    ("8 GPUs, 1 node, ND H100 v5", "health-check threshold busbw >= 460 GB/s at 16 GB",
     "Azure/azurehpc-health-checks conf/nd96isr_h100_v5.conf"),
    ("400G NDR, per NIC", "~46-48 GB/s busbw", "NVIDIA/nccl-tests#290 (maintainer)"),
    ("8-NIC node, Ring", "up to ~396 GB/s busbw per node", "NVIDIA/nccl-tests#319"),
    ("64 GPUs / 8 nodes, 8 x 400G IB, NCCL 2.18.1, COLLNETCHAIN (SHARP)",
     "512 MiB 356.0 GB/s, 1 GiB 365.9 GB/s, 8 GiB 386.6 GB/s busbw", "coreweave/nccl-tests README @fb4787c (2023-06-15)"),
    ("128 GPUs / 16 nodes, NCCL 2.20.5", "8 B: 72.01 us (out-of-place); 64 MiB: ~150 GB/s busbw", "NVIDIA/nccl#1469"),
    ("32 GPUs / 4 nodes, 8 x 400G RoCE, NCCL 2.19.3", "~320 GB/s busbw at 4-8 GB", "NVIDIA/nccl#1221"),
    ("1,984 GPUs, H200", "~350 GB/s busbw at 512 MiB, default algorithm", "NVIDIA/nccl-tests#283"),
    ("1,024 GPUs at 400G, NCCL_ALGO=Ring or Tree", "no public table found; nor a full Ring-vs-Tree table at 16 GPUs "
     "on 400G", "-"),
)


def busbw_gbs(n: int, size: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, GB/s: algbw x 2(n-1)/n."""
    return algbw_gbs(size, seconds) * 2 * (n - 1) / n


def algbw_gbs(size: int, seconds: float) -> float:
    return size / seconds / 1e9 if seconds > 0 else math.inf


def hand_ring_s(n: int, size: int, nic_bps: float, per_transfer_s: float, per_hop_s: float, links: int) -> float:
    """The alpha-beta ring: 2(n-1) steps, each S/n bytes over the NIC plus a + h x k_max."""
    return 2 * (n - 1) * (size / n * 8 / nic_bps + per_transfer_s + per_hop_s * links)


def fabric_at(topology: str, n: int) -> Any:
    """`topology` built at `n` hosts (`topofile.scaled`); below one edge switch's worth of hosts, one edge
    switch holding them all (the file's other parameters kept)."""
    from fabric import topofile

    builder, params = topofile.template(topology)
    per_edge = {"dual_plane": "hosts_per_leaf", "leaf_spine": "hosts_per_leaf", "pyramid": "hosts_per_tor"}.get(builder)
    if per_edge and n < int(params.get(per_edge, 4)):
        name = str(params.pop("name"))
        params.update({"hosts": n, per_edge: n, "name": f"{name.rpartition('-')[0] or name}-{n}"})
        if builder == "pyramid":
            params["tors_per_pod"] = 1
        return topofile.from_dict({"builder": builder, "params": params}, f"{topology} at {n} hosts")
    return topofile.scaled(topology, n)


class OverBudget(Exception):
    """A point's simulation ran past `--max-point-s` of wall time."""


class Setting:
    """One fabric at one GPU count: its path table, hosts, NIC rate and the ring's longest edge."""

    def __init__(self, topology: str, routing: str, n: int) -> None:
        from fabric.routing import PathTable
        from fabric.transfers import Placement

        t0 = time.perf_counter()
        self.topology, self.routing, self.n = topology, routing, n
        self.fabric = fabric_at(topology, n)
        self.table = PathTable(self.fabric)
        hosts = [h.name for h in self.fabric.hosts[:n]]
        self.placement = Placement(tuple(hosts))
        rates = {self.fabric.host_bandwidth_gbps(h) for h in hosts}
        if len(rates) != 1:
            raise SystemExit(f"{self.fabric.name}: hosts of different NIC rates {sorted(rates)}")
        self.nic_bps = rates.pop() * 1e9
        self.k_max = max(self.table.pair(hosts[i], hosts[(i + 1) % n]).hops for i in range(n)) if n > 1 else 0
        self.setup_s = time.perf_counter() - t0

    def policy(self) -> Any:
        from fabric.routing import AdaptivePolicy, EcmpPolicy

        return (AdaptivePolicy if self.routing == "adaptive" else EcmpPolicy)(self.table)

    def run(self, algorithm: str, size: int, per_transfer_s: float, per_hop_s: float, lockstep: bool,
            budget_s: float, shown: Any = None) -> dict[str, Any]:
        from fabric.flowsim import Job, SimOptions, simulate
        from traffic.collectives import schedule_columns

        t0 = time.perf_counter()
        dag = schedule_columns("all_reduce", size, list(range(self.n)), algorithm)
        built = time.perf_counter()

        def progress(p: Any) -> None:
            if shown is not None:
                shown(p)
            if time.perf_counter() - built > budget_s:
                raise OverBudget(f"over {budget_s:g} s of wall time (stopped at {p.now_s * 1e6:.0f} us simulated)")

        opts = SimOptions(ports="planned", per_transfer_s=per_transfer_s, per_hop_s=per_hop_s, lockstep=lockstep,
                          transfer_times=False)
        res = simulate(self.fabric, self.policy(), [Job(dag, self.placement)], options=opts, progress=progress)
        done = time.perf_counter()
        if res.stalled:
            raise SystemExit(f"{self.fabric.name} {algorithm} {size} B: {len(res.stalled)} transfers never delivered")
        t = float(res.job_time_s[0])
        row: dict[str, Any] = {"time_us": t * 1e6, "algbw_gbs": algbw_gbs(size, t),
                               "busbw_gbs": busbw_gbs(self.n, size, t), "transfers": len(dag), "events": res.events,
                               "build_s": built - t0, "simulate_s": done - built, "wall_s": done - t0}
        if algorithm == "ring":
            hand = hand_ring_s(self.n, size, self.nic_bps, per_transfer_s, per_hop_s, self.k_max)
            row.update({"hand_us": hand * 1e6, "sim_vs_hand": t / hand - 1})
        return row


MODELS = ("latency", "bandwidth")


def latencies_s(model: str) -> tuple[float, float]:
    from fabric.latency import DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US

    return (DEFAULT_PER_TRANSFER_US / 1e6, DEFAULT_PER_HOP_US / 1e6) if model == "latency" else (0.0, 0.0)


# ---- output ---------------------------------------------------------------------------------------------------

def size_label(b: int) -> str:
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"


def num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if v == 0 or abs(v) >= 0.01:
        return f"{v:,.{digits}f}"
    return f"{v:.2g}"


def wall(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def us(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if v >= 100 else f"{v:,.2f}" if v >= 0.01 else f"{v:.2g}"


def markdown(doc: dict[str, Any]) -> str:
    from fabric.latency import DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US, NCCL_NET_RING_STEP_US

    meta = doc["meta"]
    a, h = DEFAULT_PER_TRANSFER_US, DEFAULT_PER_HOP_US
    out = [f"### All-reduce busbw vs size on the simulator: ring and tree at {', '.join(map(str, meta['gpus']))} GPUs",
           "",
           f"One GPU per host; latencies a = {a:g} us per transfer, h = {h:g} us per link (`fabric.latency`); "
           "bandwidth only: a = h = 0. algbw = S / T, busbw = algbw x 2(n-1)/n (GB/s = 1e9 B/s, as nccl-tests). "
           "alpha-beta: the ring's hand value 2(n-1)(S/n x 8/B + a + h k_max). NCCL model: NCCL's Ring/Simple "
           "time for the same n at 8 GPUs per server (formula in the notes). wall: seconds of this machine for the "
           "point with latencies / without.",
           "",
           "| fabric (routing) | GPUs | k_max | algorithm | size | time us | algbw GB/s | busbw GB/s | alpha-beta us "
           "| sim / alpha-beta - 1 | bw-only time us | bw-only busbw GB/s | NCCL model us | NCCL model busbw GB/s "
           "| wall s |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lat, bw = r.get("latency") or {}, r.get("bandwidth") or {}
        skipped = lat.get("skipped") or bw.get("skipped")
        algo = r["algorithm"] + (" (lockstep)" if r["lockstep"] else "")
        ring = r["algorithm"] == "ring"
        rel = lat.get("sim_vs_hand")
        out.append(
            f"| {r['fabric']} ({r['routing']}) | {r['gpus']:,} | {r['k_max']} | {algo} | {size_label(r['size_bytes'])} "
            f"| {us(lat.get('time_us'))} | {num(lat.get('algbw_gbs'))} | {num(lat.get('busbw_gbs'))} "
            f"| {us(lat.get('hand_us')) if ring else '-'} | {f'{rel:.1e}' if rel is not None else '-'} "
            f"| {us(bw.get('time_us'))} | {num(bw.get('busbw_gbs'))} "
            f"| {us(r['nccl_model_us']) if ring else '-'} | {num(r['nccl_model_busbw_gbs']) if ring else '-'} "
            f"| {wall(lat.get('wall_s'))} / {wall(bw.get('wall_s'))}{' (' + skipped + ')' if skipped else ''} |")
    out += ["", f"Total wall time {doc['wall_s']:.0f} s" + ("" if doc["complete"] else " (incomplete: stopped)") + ".",
            "", "### Published all-reduce figures (NCCL, nccl-tests), for comparison", "",
            "| setting | figure | source |", "|---|---|---|"]
    out += [f"| {s} | {f} | {src} |" for s, f, src in PUBLISHED]
    out += ["", "Notes:", "",
            f"- Ours are single-GPU hosts: every one of a ring's 2(n-1) steps crosses the network and pays "
            f"a + h k ({a + 2 * h:.2f} us inside a leaf, k = 2; {NCCL_NET_RING_STEP_US:g} us between leaves, k = 4; "
            f"{a + 6 * h:.2f} us across a pyramid's pods, k = 6). NCCL's figures are from 8-GPU servers: only "
            "2(nodes-1) of the 2(n-1) ring steps cross the network; NCCL's model charges the others an NVLink "
            "step of 3.4 us (max(3.4, 3 x 1.0 us net overhead) on > 1 node, Intel host).",
            "- At small sizes NCCL picks the LL/LL128 protocols (NET Ring LL: 2.7 us a step) and Tree or NVLS; "
            f"our per-step latency is the Simple protocol's ({NCCL_NET_RING_STEP_US:g} us), so our small-size figures "
            "are pessimistic by design against NCCL's defaults (e.g. 128 GPUs, 8 B: NCCL measured 72 us).",
            f"- NCCL model (NCCL {NCCL_VERSION}, src/graph/tuning.cc), Ring/Simple all-reduce, 8 GPUs per server, "
            "nodes = n/8: T = lat + S / algbw, lat = 8.4 + (2(n-1) - 2(nodes-1)) x 3.4 + 2(nodes-1) x 14 us "
            f"(latencyInter 0), x {NCCL_PLATEAU_SM80:g} on > 1 node when S / ({NCCL_CHANNELS} channels x n) >= 64 B "
            f"(the plateau factor, sm80+); algbw = {NCCL_BUSBW_GBPS:g} GB/s busbw per GPU x n / (2(n-1)) (a 400G "
            "NIC's measured busbw). At 8 GPUs (one server) NCCL's real bandwidth is NVLink's (~370 GB/s Ring): "
            "the 48 GB/s term there is the network-bound figure, comparable with our single-GPU hosts.",
            "- The tree is the simulator's double binary tree (each half of the buffer reduced up one tree and "
            "broadcast down, pipelined in 4 chunks per half, `traffic.collectives.DEFAULT_PIPELINE_CHUNKS`): "
            "its latency grows with the trees' depth (~log2 n), not n, and its large-size bandwidth is limited "
            "by the few pipeline chunks; NCCL pipelines in many more.",
            "- sim / alpha-beta: the hand value spreads a step's S/n bytes over both NIC ports. Below a byte per "
            "port (8 B: pieces of 1 or 0 bytes) a step's piece crosses one 200G port: 0.02-0.04 ns more a step, "
            "1.6e-6 of the 8 B ring at 8 GPUs; in the bandwidth-only model at 8 B that is the whole time (tens of "
            "ns, its busbw meaningless).",
            f"- Lockstep: {meta['lockstep_note']}"]
    return "\n".join(out)


def main() -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=list(GPUS))
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="bytes (default 8 B .. 1 GiB)")
    ap.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    ap.add_argument("--pyramid", action="store_true", help="also pyramid-1024 at each --gpus (ECMP)")
    ap.add_argument("--lockstep", choices=["auto", "on", "off"], default="auto",
                    help=f"auto (default): the ring in lockstep from {LOCKSTEP_FROM} GPUs on, the tree never")
    ap.add_argument("--max-point-s", type=float, default=60.0,
                    help="stop a point's simulation after this much wall time and record it as such (default 60)")
    ap.add_argument("--quick", action="store_true", help="8 GPUs, 8 B / 64 KiB / 1 MiB (the test's mode)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here (after every point)")
    args = ap.parse_args()
    if args.quick:
        args.gpus, args.sizes = [8], list(QUICK_SIZES)
    settings = [DUAL_PLANE] + ([PYRAMID] if args.pyramid else [])
    t_start = time.perf_counter()
    lock_note = {"auto": f"the ring ran in lockstep at {LOCKSTEP_FROM:,} GPUs and more (`fabriclab compare` "
                         "switches it on above 1,024), the tree never. Measured at 1,024 GPUs with `--lockstep off` "
                         "(this machine): the exact ring DAG took 95 s of wall time at 8 B (65 s "
                         "bandwidth-only), past the ~60 s budget, and 9-16 s from 64 KiB to 1 GiB, against 1.4-2.7 s "
                         "in lockstep; the simulated times agreed within 1e-14, except the 8 B ring with latencies "
                         "(lockstep 20 ns later: 7e-7). So no size was dropped.",
                 "on": "every point in lockstep", "off": "no point in lockstep (the exact DAG)"}[args.lockstep]
    doc: dict[str, Any] = {"meta": {"gpus": args.gpus, "sizes": args.sizes, "algorithms": args.algorithms,
                                    "settings": [list(s) for s in settings], "lockstep": args.lockstep,
                                    "lockstep_note": lock_note, "max_point_s": args.max_point_s,
                                    "latency_us": dict(zip(("per_transfer", "per_hop"),
                                                           (x * 1e6 for x in latencies_s("latency")))),
                                    "published": [dict(zip(("setting", "figure", "source"), p)) for p in PUBLISHED]},
                           "rows": [], "complete": False, "wall_s": 0.0}

    def save() -> None:
        doc["wall_s"] = time.perf_counter() - t_start
        if args.json:
            args.json.write_text(json.dumps(doc, indent=1))

    console = Console(stderr=True)
    total = len(settings) * len(args.gpus) * len(args.algorithms) * len(args.sizes) * len(MODELS)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("latency curve", total=total)
        for topology, routing in settings:
            for n in args.gpus:
                bar.update(task, description=f"{topology} at {n}: building")
                s = Setting(topology, routing, n)
                for algorithm in args.algorithms:
                    lock = args.lockstep == "on" or (args.lockstep == "auto" and algorithm == "ring"
                                                     and n >= LOCKSTEP_FROM)
                    for size in args.sizes:
                        row: dict[str, Any] = {"topology": topology, "fabric": s.fabric.name, "routing": routing,
                                               "gpus": n, "nic_gbps": s.nic_bps / 1e9, "k_max": s.k_max,
                                               "algorithm": algorithm, "lockstep": lock, "size_bytes": size,
                                               "setup_s": s.setup_s, **nccl_ring_simple(n, size)}
                        for model in MODELS:
                            what = f"{s.fabric.name} {algorithm} {size_label(size)} ({model})"
                            bar.update(task, description=what)

                            def shown(p: Any, what: str = what) -> None:
                                bar.update(task, description=f"{what}: {p.now_s * 1e6:,.0f} us simulated, "
                                                             f"{p.events:,} events")

                            try:
                                row[model] = s.run(algorithm, size, *latencies_s(model), lock, args.max_point_s, shown)
                            except OverBudget as e:
                                row[model] = {"skipped": str(e)}
                            bar.advance(task)
                            r = row[model]
                            line = r["skipped"] if "skipped" in r else (
                                f"{us(r['time_us'])} us, busbw {r['busbw_gbs']:.3g} GB/s"
                                + (f" (alpha-beta {us(r['hand_us'])} us)" if "hand_us" in r else "")
                                + f", wall {r['wall_s']:.1f} s")
                            console.print(f"{what}: {line}", soft_wrap=True)
                        doc["rows"].append(row)
                        save()
    doc["complete"] = True
    save()
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
