"""Record a small real data-parallel training job on the CPU, as one gzipped Kineto trace per rank.

`record` spawns `ranks` local processes (torch.multiprocessing) that train an MLP of about 7 MB of fp32
parameters (`MLP_WIDTHS`) with PyTorch DDP over gloo, rendezvous on 127.0.0.1 at a free port, under
`torch.profiler.profile(record_shapes=True)` with a schedule that skips the first two iterations (DDP rebuilds
its gradient buckets after the first one and broadcasts the new layout in the second) and records `steps`
`ProfilerStep`s. Each rank writes `rank{N}.json.gz` into `out_dir`; gloo's collectives appear there as
`gloo:all_reduce` annotations with `Input Dims` and `Input type`, which `traffic.traces.kineto` reads.

torch is an optional dependency, imported only when recording.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

from fabric.errors import FabriclabError

#: Layer widths of the recorded MLP: 512 -> 1024 -> 1024 -> 128 -> 10, 1,707,402 fp32 parameters (6.83 MB).
MLP_WIDTHS = (512, 1024, 1024, 128, 10)
SKIPPED_ITERATIONS = 2  # not recorded: the first backward, and the bucket rebuild in the next forward
_INIT_TIMEOUT_S = 120


class RecordError(FabriclabError):
    """Recording a training job failed (bad arguments, torch missing, a rank failed)."""


def record(out_dir: Path, ranks: int = 4, steps: int = 6, *, batch: int = 32, seed: int = 0,
           threads_per_rank: int = 1, bucket_cap_mb: float = 1.0) -> list[Path]:
    """Train `steps` recorded steps of a DDP MLP on `ranks` local CPU processes; return the per-rank trace files
    (`out_dir/rank{N}.json.gz`, rank order). Inputs are random, reproducible from `seed`. DDP's bucket cap
    (`bucket_cap_mb`, 1 MB here rather than DDP's 25) splits the gradients into two all-reduces per step."""
    if ranks < 1 or steps < 1 or batch < 1 or threads_per_rank < 1:
        raise RecordError(f"ranks, steps, batch and threads_per_rank must be >= 1 (got ranks={ranks}, "
                          f"steps={steps}, batch={batch}, threads_per_rank={threads_per_rank})")
    try:
        import torch.multiprocessing as mp
    except ImportError as exc:
        raise RecordError(f"recording needs torch (pip install torch): {exc}") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"rank{r}.json.gz" for r in range(ranks)]
    for p in paths:
        p.unlink(missing_ok=True)
    config = {"ranks": ranks, "steps": steps, "batch": batch, "seed": seed, "threads": threads_per_rank,
              "bucket_cap_mb": bucket_cap_mb, "port": _free_port(), "out": str(out)}
    try:
        mp.spawn(_worker, args=(config,), nprocs=ranks, join=True)
    except Exception as exc:  # a rank raised or died: torch reports which
        raise RecordError(f"recording {ranks} ranks into {out} failed: {exc}") from None
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise RecordError(f"recording into {out}: ranks finished but wrote no {', '.join(missing)}")
    return paths


def parameter_count(widths: tuple[int, ...] = MLP_WIDTHS) -> int:
    """Parameters of the MLP (weights and biases of each Linear layer)."""
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, config: dict[str, Any]) -> None:
    """One rank: join the gloo group, train, and export the trace (runs in a spawned process)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if "GLOO_SOCKET_IFNAME" not in os.environ and Path("/sys/class/net/lo").exists():
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo on loopback whatever the host name resolves to
    torch.set_num_threads(config["threads"])
    world = config["ranks"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{config['port']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=_INIT_TIMEOUT_S))
    try:
        torch.manual_seed(config["seed"])  # the same initial weights on every rank
        layers: list[torch.nn.Module] = []
        for a, b in zip(MLP_WIDTHS, MLP_WIDTHS[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        model = DistributedDataParallel(torch.nn.Sequential(*layers[:-1]), bucket_cap_mb=config["bucket_cap_mb"])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.Generator().manual_seed(config["seed"] * 1000 + rank)
        path = Path(config["out"]) / f"rank{rank}.json.gz"
        schedule = torch.profiler.schedule(wait=1, warmup=SKIPPED_ITERATIONS - 1, active=config["steps"], repeat=1)

        def export(prof: torch.profiler.profile) -> None:
            prof.export_chrome_trace(str(path))  # gzipped because of the .gz suffix

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                    schedule=schedule, on_trace_ready=export) as prof:
            for _ in range(SKIPPED_ITERATIONS + config["steps"]):
                x = torch.randn(config["batch"], MLP_WIDTHS[0], generator=data)
                y = torch.randint(0, MLP_WIDTHS[-1], (config["batch"],), generator=data)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                prof.step()
    finally:
        dist.destroy_process_group()
