"""The command line's arguments as the library's options: what `traffic.traces.load` reads a trace with, and a
run's options (`fabriclab.study.spec.RunOptions`). `fabriclab.cli` defines the arguments; `fabriclab.commands`
runs them."""
from __future__ import annotations

import argparse
from typing import Any


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """`traffic.traces.load`'s keyword options as the command line gives them (None where a command has none)."""
    return {"compute_gap_us": args.compute_gap_us, "collectives_per_step": args.step_ops,
            "world_size": getattr(args, "world_size", None), "ep_size": getattr(args, "ep", None),
            "launchless_kernels": getattr(args, "launchless_kernels", None)}


def run_options(args: argparse.Namespace, ranks: int | None = None) -> Any:
    """The run options as asked (`fabriclab.study.spec.RunOptions`)."""
    from fabriclab.study.spec import RunOptions

    return RunOptions(ranks=ranks, placement=args.placement, algorithm=args.algorithm, channels=args.channels,
                      ports=args.ports, seed=args.seed, repeat=args.repeat, compute_gap_us=args.compute_gap_us or 0.0,
                      step_ops=args.step_ops, launchless_kernels=getattr(args, "launchless_kernels", None),
                      pxn=getattr(args, "pxn", "on") != "off", nccl_algo=getattr(args, "nccl_algo", "auto"))
