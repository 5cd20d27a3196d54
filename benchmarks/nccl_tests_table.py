"""An nccl-tests-like table from the simulator (issue 43 part 6): busbw of all_reduce, all_gather, reduce_scatter,
alltoall and sendrecv by size, GPUs and GPUs per server, on both rail fabrics, as NCCL maps them (no root).

    .venv/bin/python benchmarks/nccl_tests_table.py [--groups 16x1 16x8 128x1 ...] [--sizes 1M 16M 256M 4G]
                                                     [--fabric dual-plane|pyramid ...] [--json FILE] [--quick]

A group "GxK" is G GPUs, K on each of G/K servers of 8 GPUs (the first K GPUs of each server: K = 1 is a TP8 job's
DP group, K = 8 whole servers), on `dual-plane-1024-rail` and `pyramid-1024-rail` scaled to 8 x G/K GPUs
(`topofile.scaled`: 8 GPUs a server, 400 Gbit/s a GPU; the dual-plane's two 200G ports on two planes, adaptive
routing with planned ports; the pyramid's one 400G port, 2:1 at the ToR, ECMP with hashed ports). Each point is one
collective alone on the fabric through the one pipeline (`fabriclab.backends.run_workload`, the simulator), with
`fabriclab sim`'s defaults: NCCL's algorithm and protocol (`--algorithm nccl --nccl-algo auto`), 2 channels a NIC,
PXN on, latencies 11.4 us a network transfer + 0.65 us a link, 3.4 us an NVLink transfer, resolution 1 ns.
sendrecv: every GPU sends S to its peer on the next server (the same GPU index: rank r to r + K, the last server's
to the first's) and receives S from the one before, all at once: each pair its own two-rank communicator (as
Megatron's pipeline pairs), and rail-aligned as nccl-tests' rank shift is through PXN, so the network's pairs.

Figures as nccl-tests prints them: algbw = S / t and busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
reduce_scatter, alltoall), 1 (sendrecv), in GB/s (1e9 B/s), S the nccl-tests size (all_gather: the whole output).
Beside the tuned collectives: NCCL's choice (algorithm/protocol), its own model time (`traffic.nccl_tuning`) and
busbw from it, and the simulated time of the other algorithm where NCCL has one (all_reduce ring <-> tree;
all_gather and reduce_scatter ring <-> PAT at one GPU a server): a "!" marks a choice that simulates over 10%
slower than the other. The output is markdown; `--json FILE` keeps every point as it finishes (a stopped run keeps
what it finished). A simulation past `--max-point-s` of wall time (default 120) is stopped and marked so (its
time left out), as is the other algorithm's. `--quick`: one small group and size, for the test.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fabric import topofile  # noqa: E402
from fabric.flowsim import SimOptions  # noqa: E402
from fabric.latency import DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US, NCCL_NVLINK_RING_STEP_US  # noqa: E402
from traffic.nccl_choice import nccl_choice  # noqa: E402
from traffic.replay import ReplayOptions, default_ports  # noqa: E402
from traffic.replay.alone import one_collective  # noqa: E402
from traffic.workload import Collective, RankTrace, Step, Workload  # noqa: E402

GPUS_PER_SERVER = 8
NIC_GBPS = 400.0
NVLINK_GBPS = 3600.0
CHANNELS_PER_NIC = 2
SIZES = {"1M": 1 << 20, "16M": 16 << 20, "256M": 256 << 20, "4G": 4 << 30}
GROUPS = ("16x1", "16x8", "128x1", "128x2", "128x4", "128x8", "1024x1", "1024x8")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
FABRICS = {"dual-plane": ("dual-plane-1024-rail", "adaptive"), "pyramid": ("pyramid-1024-rail", "ecmp")}
#: nccl-tests' bus factor per collective, as a function of n
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "send_recv": lambda n: 1.0}
#: the other algorithm NCCL has for a tuned collective (sim-compared with its choice)
OTHER = {("all_reduce", "ring"): "tree", ("all_reduce", "tree"): "ring", ("all_gather", "ring"): "pat",
         ("all_gather", "pat"): "ring", ("reduce_scatter", "ring"): "pat", ("reduce_scatter", "pat"): "ring"}


def sim_options() -> SimOptions:
    return SimOptions(per_transfer_s=DEFAULT_PER_TRANSFER_US / 1e6, per_hop_s=DEFAULT_PER_HOP_US / 1e6,
                      nvlink_latency_s=NCCL_NVLINK_RING_STEP_US / 1e6)


def group_ranks(gpus: int, k: int) -> tuple[int, ...]:
    """The first k GPUs of each of gpus/k servers of 8."""
    return tuple(GPUS_PER_SERVER * s + i for s in range(gpus // k) for i in range(k))


def workload(kind: str, size: int, ranks: tuple[int, ...], world: int, k: int = 1) -> Workload:
    """One collective over `ranks` (sendrecv: the shift by one server, `k` ranks, every send at once), as a one-step
    trace."""
    if kind != "send_recv":
        return one_collective(kind, size, ranks, world)
    n = len(ranks)
    sends = [Collective("send_recv", size, "bfloat16", (ranks[q], ranks[(q + k) % n]), f"s{q}", 0.0, 1.0)
             for q in range(n)]
    by_rank = {r: tuple(c for c in sends if r in c.group_ranks) for r in ranks}
    return Workload("t", "nccl-tests", "kineto", world, tuple(RankTrace(r, (Step(0, None, (), by_rank[r]),))
                                                            for r in ranks), True)


class Stopped(Exception):
    """A point's simulation passed `--max-point-s`."""


_FIRED = [False]  # the alarm went off (raised inside compiled code, it surfaces as a SystemError)


def _stop(signum: int, frame: Any) -> None:
    _FIRED[0] = True
    raise Stopped()


#: wall seconds a simulation may take (`--max-point-s`)
MAX_POINT_S = [120]


def run_point(kind: str, size: int, ranks: tuple[int, ...], fabric: Any, routing: str, nccl_algo: str = "auto",
              k: int = 1) -> tuple[float | None, str, float]:
    """(simulated us, None if stopped at `MAX_POINT_S`; the algorithm it ran; wall s) of one collective alone on
    `fabric`."""
    from fabriclab.backends import Simulated, run_workload

    opts = ReplayOptions(algorithm="nccl", nccl_algo=nccl_algo, channels=CHANNELS_PER_NIC,
                         ports=default_ports(routing, "auto"))
    t0 = time.monotonic()
    _FIRED[0] = False
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(MAX_POINT_S[0])
    try:
        res = run_workload(workload(kind, size, ranks, len(fabric.hosts), k), "t", fabric, routing, opts,
                           Simulated(sim_options(), check_choice=False)).result
    except (Stopped, SystemError):
        if not _FIRED[0]:
            raise
        return None, nccl_algo if nccl_algo != "auto" else "?", time.monotonic() - t0
    finally:
        signal.alarm(0)
    wall = time.monotonic() - t0
    start = min(c.start_emu_s for c in res.collectives)
    end = max(c.start_emu_s + c.duration_emu_s for c in res.collectives)
    dilation = res.meta.dilation
    return (end - start) / dilation * 1e6, res.collectives[0].algorithm, wall


def point(kind: str, size_name: str, group: str, fab_name: str, fabrics: dict[int, Any]) -> dict[str, Any]:
    gpus, k = (int(x) for x in group.split("x"))
    size = SIZES[size_name]
    ranks = group_ranks(gpus, k)
    servers = gpus // k
    topo, routing = FABRICS[fab_name]
    hosts = GPUS_PER_SERVER * servers
    if hosts not in fabrics:
        fabrics[hosts] = topofile.scaled(ROOT / "topologies" / f"{topo}.yaml", hosts)
    fabric = fabrics[hosts]
    us, algo, wall = run_point(kind, size, ranks, fabric, routing, k=k)
    n = len(ranks)
    algbw = size / (us * 1e-6) / 1e9 if us else None
    row: dict[str, Any] = {"kind": kind, "size": size_name, "size_bytes": size, "group": group, "gpus": gpus, "k": k,
                           "fab": fab_name,
                           "fabric": fabric.name, "routing": routing, "time_us": us, "algbw_GBps": algbw,
                           "busbw_GBps": algbw * BUS[kind](n) if algbw else None, "algorithm": algo, "wall_s": wall}
    if kind in ("all_reduce", "all_gather", "reduce_scatter"):
        ch = nccl_choice(kind, size, n, servers, NIC_GBPS, NVLINK_GBPS, CHANNELS_PER_NIC)
        row["algorithm"] = ch.algo
        row.update(proto=ch.proto, nccl_model_us=ch.model_us,
                   nccl_model_busbw_GBps=size / (ch.model_us * 1e-6) / 1e9 * BUS[kind](n) if ch.model_us else None)
        other = OTHER.get((kind, algo))
        if other and not (other == "pat" and k > 1) and servers > 1:
            other_us, _, other_wall = run_point(kind, size, ranks, fabric, routing, nccl_algo=other)
            row.update(other=other, other_time_us=other_us, wall_s=wall + other_wall)
    return row


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    return f"{x:,.{max(0, digits - len(str(int(abs(x)))))}f}" if abs(x) >= 1 else f"{x:.{digits - 1}g}"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| collective | GPUs (per server) | size | fabric | algorithm | time us | algbw GB/s | busbw GB/s | "
            "NCCL model us | NCCL model busbw | other: time us | wall s |")
    out = [head, "|" + "---|" * 12]
    for r in rows:
        algo = r["algorithm"] + (f"/{r['proto']}" if r.get("proto") else "")
        other = "-"
        if r.get("other"):
            if r["other_time_us"] is None:
                other = f"{r['other']}: stopped"
            else:
                slower = r["time_us"] is not None and r["time_us"] > 1.1 * r["other_time_us"]
                other = f"{r['other']}: {fmt(r['other_time_us'])}" + (" !" if slower else "")
        if r["time_us"] is None:
            algo += f" (stopped at {r['wall_s']:.0f} s)"
        out.append(f"| {r['kind']} | {r['gpus']} ({r['k']}) | {r['size']} | {r['fabric']} ({r['routing']}) | {algo} | "
                   f"{fmt(r['time_us'])} | {fmt(r['algbw_GBps'])} | {fmt(r['busbw_GBps'])} | "
                   f"{fmt(r.get('nccl_model_us'))} | {fmt(r.get('nccl_model_busbw_GBps'))} | {other} | "
                   f"{r['wall_s']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", nargs="+", default=list(GROUPS), help="GxK: G GPUs, K a server")
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--fabric", nargs="+", default=list(FABRICS), choices=list(FABRICS))
    ap.add_argument("--json", help="keep every point here as it finishes")
    ap.add_argument("--resume", action="store_true", help="keep the points already in --json, run the others")
    ap.add_argument("--max-point-s", type=int, default=120, help="stop a simulation past this many wall seconds")
    ap.add_argument("--quick", action="store_true", help="16 GPUs of 8 a server, 1 MiB and 16 MiB: for the test")
    args = ap.parse_args(argv)
    for g in args.groups:
        gpus, _, k = g.partition("x")
        if not (gpus.isdigit() and k.isdigit() and int(k) in (1, 2, 4, 8) and int(gpus) % int(k) == 0):
            ap.error(f"--groups: {g!r} is not GxK with K in 1, 2, 4, 8 dividing G")
    if args.quick:
        args.groups, args.sizes = ["16x8"], ["1M", "16M"]
    MAX_POINT_S[0] = args.max_point_s
    from rich.progress import Progress

    points = [(kind, s, g, f) for f in args.fabric for g in args.groups for kind in args.kinds for s in args.sizes]
    rows: list[dict[str, Any]] = []
    if args.resume and args.json and Path(args.json).exists():
        rows = json.loads(Path(args.json).read_text())["rows"]
    done = {(r["kind"], r["size"], r["group"], r["fab"]) for r in rows}
    points = [p for p in points if p not in done]
    fabrics: dict[str, dict[int, Any]] = {f: {} for f in FABRICS}
    t0 = time.monotonic() - sum(r["wall_s"] for r in rows)
    with Progress(transient=True) as progress:
        task = progress.add_task("nccl-tests table", total=len(points))
        for kind, s, g, f in points:
            progress.update(task, description=f"{kind} {s} {g} {f}")
            rows.append(point(kind, s, g, f, fabrics[f]))
            if args.json:
                Path(args.json).write_text(json.dumps({"rows": rows, "wall_s": time.monotonic() - t0}, indent=1))
            progress.advance(task)
    print(markdown(rows))
    print(f"\nTotal wall time {time.monotonic() - t0:.0f} s for {len(rows)} points.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
