"""The command line's arguments as the library's options: what `traffic.traces.load` reads a trace with, and a
run's options (`fabriclab.study.spec.RunOptions`). `fabriclab.cli` defines the arguments; `fabriclab.commands`
runs them."""
from __future__ import annotations

import argparse
from typing import Any


#: NCCL algorithms named as options but not modelled (off, as NCCL has them on the fabrics modelled here), and why
UNMODELLED = {
    "nvls": "NVLS and NVLSTree are not modelled: they reduce in the NVSwitch (NVLink SHARP multicast), which this "
            "model's NVLink (each in-server transfer at the per-GPU rate, no switch) has no part for; NCCL's choice "
            "here is made without them",
    "collnet": "CollNet (SHARP in the network switches) is not modelled: the emulated and simulated switches do "
               "not reduce; NCCL too has it off unless a CollNet plugin and NCCL_COLLNET_ENABLE=1 are given",
}


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """`traffic.traces.load`'s keyword options as the command line gives them (None where a command has none)."""
    return {"compute_gap_us": args.compute_gap_us, "collectives_per_step": args.step_ops,
            "world_size": getattr(args, "world_size", None), "ep_size": getattr(args, "ep", None),
            "launchless_kernels": getattr(args, "launchless_kernels", None)}


def run_options(args: argparse.Namespace, ranks: int | None = None) -> Any:
    """The run options as asked (`fabriclab.study.spec.RunOptions`); NVLS and CollNet asked on are refused."""
    from fabric.errors import FabriclabError
    from fabriclab.study.spec import RunOptions

    for name, why in UNMODELLED.items():
        if getattr(args, name, "off") == "on":
            raise FabriclabError(f"--{name.replace('_', '-')} on: {why}")

    return RunOptions(ranks=ranks, placement=args.placement, algorithm=args.algorithm, channels=args.channels,
                      ports=args.ports, seed=args.seed, repeat=args.repeat, compute_gap_us=args.compute_gap_us or 0.0,
                      step_ops=args.step_ops, launchless_kernels=getattr(args, "launchless_kernels", None),
                      pxn=getattr(args, "pxn", "on") != "off", nccl_algo=getattr(args, "nccl_algo", "auto"),
                      merge_nics=getattr(args, "merge_nics", "on") != "off")
