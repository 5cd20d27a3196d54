"""Which algorithm NCCL would run for one collective of a workload, from its own tuning model (`traffic.nccl_tuning`).

`nccl_choice(kind, size_bytes, n_ranks, n_nodes, ...)` builds the tuning inputs a group of GPUs gives NCCL on
the fabric and takes NCCL's argmin (issue 43 part 4). The inputs, stated in docs/simulator.md and in each run's
resolved specification:
- an sm90 GPU (H100) on an Intel host (`Machine(cuda_arch=90, cpu="intel")`): NCCL's constants for them;
- the ring and tree search graphs alike: nChannels = channels per NIC x the group's GPUs in a server (one NIC
  each, rail-optimised servers); bwInter = the NIC's GB/s / channels per NIC, and bwIntra the same on several
  nodes (NCCL searches intra and inter at one speed); on one node bwIntra = the GPU's NVLink GB/s / nChannels;
  paths NVL inside, PXN between nodes where a server holds several of the group's GPUs (the ring leaves
  through another GPU's NIC, PIX otherwise); the tree graph's pattern balanced (1), as NCCL prints it on
  servers whose GPUs each have a NIC;
- NVLS, NVLSTree and CollNet off (not modelled: NVSwitch multicast, SHARP); so on one node only the ring.

The simulator runs the chosen algorithm (`traffic.collectives`: ring, NCCL's tree, PAT) at the link rates, with
the chosen protocol's bytes and latencies (`traffic.replay.plan.protocol_costs`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from traffic.nccl_tuning import Graph, Machine, TuningTable, choose, tune

#: the collectives NCCL's tuning model chooses for, as `traffic.workload` names them
TUNED_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
#: `--nccl-algo`: NCCL_ALGO's choices modelled here ("auto": NCCL's tuning model)
NCCL_ALGOS = ("auto", "ring", "tree", "pat")


@dataclass(frozen=True)
class NcclChoice:
    algo: str  # ring, tree or pat (a `traffic.collectives` algorithm)
    proto: str  # LL, LL128 or Simple
    model_us: float  # NCCL's own time estimate (ncclTopoGetAlgoTime)
    why: str  # how it came out, for the run's notes


@functools.lru_cache(maxsize=256)  # a step's many collectives over one group share it
def group_table(n_ranks: int, n_nodes: int, nic_gbps: float, nvlink_gbps: float, channels_per_nic: int) -> TuningTable:
    """NCCL's tuning table for a group of `n_ranks` GPUs on `n_nodes` servers (equal per server) whose GPUs have a
    NIC of `nic_gbps` each and NVLink of `nvlink_gbps` each way (module docstring)."""
    ppn = n_ranks // n_nodes
    n_ch = channels_per_nic * ppn
    inter = nic_gbps / 8 / channels_per_nic
    intra = inter if n_nodes > 1 else nvlink_gbps / 8 / n_ch
    kind = "PXN" if ppn > 1 else "PIX"
    graphs = {"ring": Graph(n_ch, intra, inter, "NVL", kind, pattern=4),
              "tree": Graph(n_ch, intra, inter, "NVL", kind, pattern=1)}
    return tune(Machine(n_ranks, n_nodes, cuda_arch=90, cpu="intel"), graphs)


def nccl_choice(kind: str, size_bytes: int, n_ranks: int, n_nodes: int, nic_gbps: float, nvlink_gbps: float,
                channels_per_nic: int, asked: str = "auto") -> NcclChoice:
    """The algorithm NCCL runs for `kind` of `size_bytes` (nccl-tests convention) over `n_ranks` GPUs on `n_nodes`
    servers, with NCCL_ALGO = `asked` ("auto": its tuning model's argmin; "ring", "tree", "pat": that algorithm where
    NCCL has it for the collective, else NCCL's choice among the others, as NCCL falls back). One node, or a group
    uneven across its servers: the ring (NCCL's intra-node tree and NVLS are not modelled)."""
    if asked not in NCCL_ALGOS:
        raise ValueError(f"--nccl-algo must be one of {', '.join(NCCL_ALGOS)}, got {asked!r}")
    if kind not in TUNED_KINDS or n_ranks < 2:
        return NcclChoice("ring", "Simple", 0.0, f"{kind}: not tuned")
    if n_nodes < 2 or n_ranks % n_nodes:
        why = "one server: the ring" if n_nodes < 2 else "uneven across its servers: the ring"
        return NcclChoice("ring", "Simple", 0.0, why)
    table = group_table(n_ranks, n_nodes, nic_gbps, nvlink_gbps, channels_per_nic)
    algos = None if asked == "auto" else (asked,)
    try:
        c = choose(table, kind, size_bytes, algos)
        why = "NCCL's tuning model" if asked == "auto" else f"--nccl-algo {asked}"
    except ValueError:  # the algorithm asked does not run this collective here (tree: all-reduce only; PAT: 1 GPU a node)
        c = choose(table, kind, size_bytes)
        why = f"--nccl-algo {asked} does not run {kind} on {n_ranks // n_nodes} GPU(s) a server: NCCL's choice"
    return NcclChoice(c.algo, c.proto, c.time_us, why)
