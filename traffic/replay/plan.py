"""The replay plan (pure): a workload placed on a fabric, scaled, scheduled and cut into connections; the
one plan both backends run (the simulator as it is, the emulation once `traffic.replay.place` has put it
on its agents).

- **Calls**: the workload's collectives in replay order, one `Call` per collective per step per
  repetition. A multi-rank trace's collectives are matched across ranks by process group and order
  (NCCL issues a communicator's collectives in the same order on every rank). A call may start once
  (a) on each of its ranks, the previous call on its stream has ended and (b) every call of its ranks
  that had ended before it started in the recording has ended, so collectives run concurrently exactly
  where the trace has them concurrent (`_call_deps`); a trace without timings runs them one after the other. Calls of a later step wait for
  all calls of earlier steps.
- **Templates**: each distinct (kind, size, ranks) becomes one transfer DAG (`traffic.collectives`,
  as arrays), by rank at real sizes; the placement puts ranks on hosts, and transfers between ranks on
  the same server (`Fabric.gpus_per_server`; with one GPU per server: the same host) are local: they
  never touch the fabric (no connections) and take size x 8 / `Fabric.nvlink_bps` (between GPUs of a
  server; 0 on one host). A template whose transfers are all local has `local_us`: its DAG's critical
  path at that rate (each GPU's NVLink taken as its own: no contention inside a server).
- **Shared hosts**: a host is one GPU, so ranks on one host that move bytes between them (e.g. 24 ranks on
  16 hosts under block placement) are refused, naming both counts (`_shared_host_notes`); ranks that share
  a host but exchange nothing with one another, and in-server NVLink transfers, are noted.
- **Empty collectives**: a collective of 0 bytes but a send_recv or barrier has no transfer, as NCCL
  discards it (`traffic.collectives.discarded`, which cites NCCL's source): its template has `local_us` 0
  on any fabric, so both backends end its calls as they start (no agent is involved) and a note counts them.
- **Counts**: a collective with `count` > 1 (back-to-back collectives of its size) is one call standing
  for all of them (`Call.count`) when its template is all local (its time: `count x local_us`), else
  `count` calls one after the other on its stream.
- **Scaling** (time dilation, docs/architecture.md): links run at `rate_gbps x mbps_per_gbps` Mbit/s; bytes are
  scaled by `bytes_scale = dilation x mbps_per_gbps / 1000`, so an emulated duration divided by the
  dilation is the real one. The default dilation makes the typical transfer (of the bytes-weighted
  median collective) take ~`TARGET_TRANSFER_EMU_S` on its sender's NIC (`choose_dilation`): long against
  the datapath's tens-of-ms stalls and the emulated path latency, so collectives are bandwidth-bound.
- **Connections**: every host pair that exchanges data gets `channels` TCP connections per plane they
  share. With `ports="planned"`, connection c's source port is chosen by the controller's entropy rule
  (`fabric.routing.entropy.pair_sport`), so the channels of a pair take distinct equal-cost paths,
  the pairs of a host (an all-to-all's) spread over all of them, and both planes carry load (what a
  fabric-aware collective library does). With `ports="hashed"`
  they are drawn at random from the ephemeral range (seeded), as the OS would pick them: classic
  ECMP, where two flows may hash onto one link. A transfer is split evenly over its pair's
  connections (`parts`). The rule is the simulator's, planned by the same code
  (`fabric.flowsim.connections.plan_connection_table`), planned once here: both backends get the very
  same connections.
"""
from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Sequence

import numpy as np

from fabric.errors import FabriclabError
from fabric.limits import HTB_BURST_BYTES
from fabric.flowsim.connections import Connection, ConnectionTable, pair_key, plan_connection_table
from fabric.flowsim.maxmin import FlowSimError, IntArray
from fabric.model import Fabric
from fabric.routing import PathTable, plan_entropy
from fabric.transfers import Placement, TransferColumns, TransferError
from traffic import collectives
from traffic.nccl_choice import NCCL_ALGOS, TUNED_KINDS, NcclChoice, nccl_choice
from traffic.nccl_tuning import HW_LAT, PROTOCOLS
from traffic.placement import check_job_fits, check_placement, groups_by, resolve_placement
from traffic.workload import LAUNCHLESS_KERNELS, Collective, Workload

#: The fastest host NIC runs at this rate by default (the link scale). Measured on the 2-core machine,
#: with every host busy on both planes, the replay agents and the controller: a ring all-reduce on
#: dual-plane-16 reached 0.62-0.84 of the goodput bound at 2 Mbit/s per NIC and 0.90-0.97 at 1 Mbit/s.
#: One rate for the NICs of every fabric also gives every fabric the same per-packet latency, so
#: fabrics compare on their structure, not on how fast the emulator serialises a frame.
NIC_EMU_MBPS = 1.0
#: The typical transfer should take about this long on the emulator (default dilation).
TARGET_TRANSFER_EMU_S = 0.2
#: ... unless one repetition of the steps would then take longer than this.
MAX_STEPS_EMU_S = 90.0
MIN_DILATION, MAX_DILATION = 1.0, 1e9
#: TCP payload per wire byte on the emulated links: 1448 of 1514 bytes (MTU 1500, timestamps),
#: less ~2% for the ACKs sharing a host's egress with its own data in a ring.
GOODPUT_SHARE = 1448 / 1514 * 0.98
#: how the plan's notes on its scaling begin (they apply to a scaled run only, not to the simulator's)
SCALING_NOTES = ("link scale", "dilation")


class ReplayError(FabriclabError):
    """A replay cannot be planned or run; the message names the offending item."""


def default_ports(routing: str, asked: str = "auto") -> str:
    """Source ports: as `asked`, unless "auto" (the user did not say): planned under adaptive routing (a
    fabric-aware collective library puts each channel on its own path, as the controller's entropy plan
    allows), hashed otherwise (as the OS picks them: classic ECMP)."""
    if asked != "auto":
        return asked
    return "planned" if routing == "adaptive" else "hashed"


@dataclass(frozen=True)
class ReplayOptions:
    ranks: int | None = None  # map a data-parallel trace onto this many ranks (default: every host)
    placement: str = "block"  # block, spread, pods, fragmented[:OCC[:SEED]], or a YAML/JSON file rank -> host
    # all-reduce algorithm (traffic.collectives.ALGORITHMS, "auto"), or "nccl": NCCL's for all-reduce, all-gather and
    # reduce-scatter as `nccl_algo` says (`traffic.nccl_choice`)
    algorithm: str = "ring"
    nccl_algo: str = "auto"  # with algorithm "nccl": NCCL_ALGO's auto (its tuning model), ring, tree or pat
    channels: int = 2  # connections per plane per host pair
    merge_nics: bool = True  # False: `channels` per host pair in all, whole channels alternating over the planes
    mbps_per_gbps: float | None = None  # emulated link scale; None: the fastest host NIC at NIC_EMU_MBPS
    dilation: float | None = None  # None: chosen (TARGET_TRANSFER_EMU_S)
    repeat: int = 1  # loop the trace's steps this many times
    compute: str = "composed"  # or "slept": sleep compute gaps at the dilation (slow)
    compute_gap_us: float = 0.0  # compute before each collective, for traces without timings
    step_ops: int | None = None  # NCCL logs: collectives per step (None: the steps the reader finds)
    launchless_kernels: str | None = None  # Kineto: GPU kernels without a launch (None: "leave-out"; "by-time")
    pxn: bool = True  # NCCL's PXN (`traffic.collectives.schedule_columns`)
    # latency of each in-server (NVLink) transfer on an all in-server collective's path (`local_path_us`); the
    # simulator sets it from `SimOptions.nvlink_latency_s` (`plan_for_simulation`), the emulator leaves it at 0
    nvlink_latency_us: float = 0.0
    port: int = 7000  # the agents' first data port (one per stream lane)
    ports: str = "planned"  # source ports: "planned" (channel c on the c-th path) or "hashed" (as the OS picks)
    seed: int = 0  # for hashed source ports

    def check(self) -> None:
        try:
            check_placement(self.placement)
        except TransferError as e:
            raise ReplayError(f"--placement: {e}") from None
        if self.channels < 1:
            raise ReplayError(f"--channels must be >= 1, got {self.channels}")
        if self.repeat < 1:
            raise ReplayError(f"--repeat must be >= 1, got {self.repeat}")
        if self.mbps_per_gbps is not None and not self.mbps_per_gbps > 0:
            raise ReplayError(f"--mbps-per-gbps must be > 0, got {self.mbps_per_gbps}")
        if self.dilation is not None and not MIN_DILATION <= self.dilation <= MAX_DILATION:
            raise ReplayError(f"--dilation must be in [{MIN_DILATION:g}, {MAX_DILATION:g}], got {self.dilation}")
        if self.compute not in ("composed", "slept"):
            raise ReplayError(f"--compute must be composed or slept, got {self.compute!r}")
        if self.compute == "slept":
            raise ReplayError("sleeping compute gaps at the dilation (--sleep-compute) is not implemented yet; "
                              "steps are composed from the trace's compute and the measured collectives")
        if self.compute_gap_us < 0:
            raise ReplayError(f"--compute-gap-us must be >= 0, got {self.compute_gap_us}")
        if self.step_ops is not None and self.step_ops < 1:
            raise ReplayError(f"--step-ops must be >= 1, got {self.step_ops}")
        if self.launchless_kernels is not None and self.launchless_kernels not in LAUNCHLESS_KERNELS:
            raise ReplayError(f"--launchless-kernels must be one of {', '.join(LAUNCHLESS_KERNELS)}, got "
                              f"{self.launchless_kernels!r}")
        if self.ports not in ("planned", "hashed"):
            raise ReplayError(f"--ports must be planned or hashed, got {self.ports!r}")
        if self.nccl_algo not in NCCL_ALGOS:
            raise ReplayError(f"--nccl-algo must be one of {', '.join(NCCL_ALGOS)}, got {self.nccl_algo!r}")
        if self.algorithm not in ("nccl", "auto", *collectives.ALGORITHMS["all_reduce"]):
            raise ReplayError(f"--algorithm must be nccl, auto or one of {', '.join(collectives.ALGORITHMS['all_reduce'])}"
                              f", got {self.algorithm!r}")


@dataclass(frozen=True)
class Template:
    """One collective's transfer DAG at real sizes, by rank (`traffic.collectives.schedule_columns`), on
    one lane; `emu_bytes` its size as the emulation sends it (`bytes_scale` applied)."""

    id: int
    kind: str
    algorithm: str
    size_bytes: int  # real
    emu_bytes: int
    ranks: tuple[int, ...]
    dag: TransferColumns
    lane: int = 0  # the connections it uses: one set per stream of the trace
    # real microseconds, for a template whose transfers are all in-server (servers of > 1 GPU): the
    # critical path of its DAG at the NVLink rate; 0 for a discarded (empty) collective, on any fabric;
    # None: some transfer crosses the fabric
    local_us: float | None = None
    proto: str = "Simple"  # NCCL's protocol (algorithm "nccl"): its bytes and latencies (`protocol_costs`)

    @cached_property
    def discarded(self) -> bool:
        """An empty collective NCCL discards (`traffic.collectives.discarded`): no transfer, no time."""
        return collectives.discarded(self.kind, self.size_bytes)

    @property
    def transfer_count(self) -> int:
        return len(self.dag)


@dataclass(frozen=True)
class Call:
    id: int
    template: int
    step: int  # the trace's step number
    step_index: int  # position of the step in the trace
    repeat: int
    stream: str
    deps: tuple[int, ...]  # calls that must end first
    collective: Collective  # as recorded (the lowest member rank's record)
    # per rank: the index of this call's collective in that rank's step (for composing its timeline)
    rank_index: tuple[tuple[int, int], ...] = ()
    # back-to-back collectives this call stands for (an all-local collective's `count`: it takes
    # count x local_us); a count > 1 collective across the fabric is `count` calls of 1
    count: int = 1


@dataclass(frozen=True)
class ReplayPlan:
    """The plan both backends run: the calls, their templates (DAGs by rank), the placement, the scaling
    and every lane's planned connections (`connections`; `traffic.replay.place` places it for the
    emulation's agents)."""

    workload: Workload
    fabric: Fabric
    options: ReplayOptions
    placement: Placement
    dilation: float
    bytes_scale: float
    templates: tuple[Template, ...]
    calls: tuple[Call, ...]
    connections: ConnectionTable
    notes: tuple[str, ...] = field(default=())

    def hosts(self) -> list[str]:
        """Every host that takes part (sends, receives or runs a rank)."""
        return list(self._hosts)

    @cached_property
    def _hosts(self) -> tuple[str, ...]:
        used = set(self.placement.hosts)
        names = [h.name for h in self.fabric.hosts]
        for i in np.unique(np.concatenate(self.connections.pair_hosts)).tolist():
            used.add(names[i])
        return tuple(h for h in names if h in used)

    @property
    def mbps_per_gbps(self) -> float:
        """The link scale the plan was made for (resolved from the options)."""
        if self.options.mbps_per_gbps is None:
            raise ReplayError("the plan has no link scale")
        return self.options.mbps_per_gbps

    def host_emu_bps(self, host: str) -> float:
        return sum(n.rate_gbps for n in self.fabric.nics_of[host]) * self.mbps_per_gbps * 1e6

    def connection_list(self) -> tuple[Connection, ...]:
        """The planned connections as objects, each lane's to its own port of the agents (`options.port` +
        lane)."""
        return self.connections.connections(self.options.port)


# ---- building the plan -------------------------------------------------------------------------------
def _global_calls(workload: Workload) -> list[list[tuple[Collective, list[tuple[int, int]]]]]:
    """Per step position: the collectives in replay order, each with [(rank, index in its step)].

    Ranks' collectives are matched by (process group, k-th occurrence in the step)."""
    n_steps = workload.steps
    out = []
    # a group by a small number: its ranks' tuple is hashed once per tuple object (a mapped trace's
    # ranks share one), not once per rank and call (16,384 ranks hashing a 16,384-rank tuple each)
    by_id: dict[int, int] = {}
    by_ranks: dict[tuple[int, ...], int] = {}

    def group(ranks: tuple[int, ...]) -> int:
        g = by_id.get(id(ranks))
        if g is None:
            g = by_id[id(ranks)] = by_ranks.setdefault(ranks, len(by_ranks))
        return g

    for s in range(n_steps):
        seen: dict[tuple[int, int], list[tuple[int, int]]] = {}
        first: dict[tuple[int, int], Collective] = {}
        order: list[tuple[int, int]] = []
        for rt in sorted(workload.ranks, key=lambda r: r.rank):
            if s >= len(rt.steps):
                continue
            count: dict[int, int] = defaultdict(int)
            for i, c in enumerate(rt.steps[s].collectives):
                if c.left_out:  # recorded only: its recorded time stays in the composed step
                    continue
                g = group(c.group_ranks)
                key = (g, count[g])
                count[g] += 1
                if key not in seen:
                    seen[key], first[key] = [], c
                    order.append(key)
                elif first[key].kind != c.kind:
                    raise ReplayError(f"{workload.source}: step {rt.steps[s].number}: rank {rt.rank}'s collective "
                                      f"#{key[1]} in group {list(c.group_ranks)} is {c.kind}, rank "
                                      f"{seen[key][0][0]}'s is {first[key].kind}: the ranks do not match")
                seen[key].append((rt.rank, i))
        calls = [(first[k], seen[k]) for k in order]
        if workload.timed:
            calls.sort(key=lambda x: (x[0].start_us if x[0].start_us is not None else math.inf))
        out.append(calls)
    return out


def _call_deps(step_calls: list[tuple[Collective, list[tuple[int, int]]]], timed: bool) -> list[tuple[int, ...]]:
    """Per call of a step (by position), the positions of the calls in the step it waits for: on each of its
    ranks, the rank's previous call on the same stream and, in a timed trace, on each of the rank's other
    streams the last call that had ended before it started (calls on one rank's stream run one after the
    other, so the earlier ones are implied). A trace without timings runs each rank's calls one after the
    other, in the step's order: calls of other groups at the same place (the SPMD ranks of an AICB or SimAI
    file) run at once, as they would.

    Dependencies go through the ranks a call has: a call of other ranks that ended before it started is
    not waited for unless a chain of calls over shared ranks leads to it (that is how one rank's progress
    reaches another's in a job). Linear in the calls' members: 10^5 calls of a 1,024-rank step plan in
    seconds (every call against every earlier one was quadratic)."""
    deps: list[tuple[int, ...]] = []
    # (rank, stream) -> (running maximum of the recorded ends, positions), in the stream's order
    chain: dict[tuple[int, str], tuple[list[float], list[int]]] = {}
    last_of_rank: dict[int, int] = {}  # untimed: each rank's last call so far
    streams: dict[int, list[str]] = defaultdict(list)
    for i, (c, members) in enumerate(step_calls):
        d: set[int] = set()
        start = c.start_us
        for r, _ in members:
            mine = chain.get((r, c.stream))
            if mine is not None:
                d.add(mine[1][-1])
            if not timed and r in last_of_rank:
                d.add(last_of_rank[r])
            if timed and start is not None:
                for st in streams[r]:
                    if st == c.stream:
                        continue
                    ends, pos = chain[(r, st)]
                    k = bisect.bisect_right(ends, start)
                    if k:
                        d.add(pos[k - 1])
        end = c.end_us if c.end_us is not None else math.inf
        for r, _ in members:
            last_of_rank[r] = i
            mine = chain.get((r, c.stream))
            if mine is None:
                mine = chain[(r, c.stream)] = ([], [])
                streams[r].append(c.stream)
            mine[0].append(max(end, mine[0][-1]) if mine[0] else end)
            mine[1].append(i)
        deps.append(tuple(sorted(d)))
    return deps


def choose_dilation(occurrences: list[tuple[int, float]], steps_cost_s: float) -> tuple[float, str]:
    """The bytes scale at which the typical transfer takes TARGET_TRANSFER_EMU_S on its sender's NIC,
    unless one pass over the steps would then take longer than MAX_STEPS_EMU_S.

    `occurrences`: per collective occurrence, (real bytes, emulated seconds its median transfer would
    take on one sender NIC at bytes scale 1); the typical one is the bytes-weighted median.
    `steps_cost_s`: emulated seconds one pass over the steps takes at bytes scale 1 (the busiest host's
    bytes over its NICs). Returns the bytes scale and why.

    Why per transfer: a collective's steps depend on each other (a ring's step k forwards step k-1's
    data), so each step also pays the emulated path's latency (tens of ms: 1500-byte frames serialised
    at a few Mbit/s per hop, plus the agents' reaction). Transfers of ~0.2 s keep that to a few µs in
    real units, about what a real fabric's ring step costs, and the collective bandwidth-bound."""
    costs = sorted((cost, size) for size, cost in occurrences if cost > 0)
    if not costs:
        return 1.0, "no collective sends data over the network"
    total = sum(size for _, size in costs)
    acc = 0
    median_cost = costs[-1][0]
    for cost, size in costs:
        acc += size
        if acc >= total / 2:
            median_cost = cost
            break
    scale = TARGET_TRANSFER_EMU_S / median_cost
    why = f"the typical transfer takes ~{TARGET_TRANSFER_EMU_S:g} s on an emulated NIC"
    if steps_cost_s * scale > MAX_STEPS_EMU_S:
        scale = MAX_STEPS_EMU_S / steps_cost_s
        why = (f"one pass over the steps takes ~{MAX_STEPS_EMU_S:g} s emulated (capped: the typical transfer then "
               f"takes {median_cost * scale:.2g} s, so per-step latency weighs more)")
    return scale, why


def default_mbps_per_gbps(fabric: Fabric) -> float:
    """The link scale at which the fastest host NIC runs at NIC_EMU_MBPS."""
    return NIC_EMU_MBPS / max(n.rate_gbps for n in fabric.nic_ports)


def plan_replay(workload: Workload, fabric: Fabric, options: ReplayOptions) -> ReplayPlan:
    """The replay's plan (module docstring), the one both backends run: the DAGs as arrays
    (`schedule_columns`, so that 16,384 ranks plan in seconds) and every lane's connections as a table.
    The emulation places it on its agents (`traffic.replay.place`)."""
    options.check()
    notes: list[str] = []
    if options.mbps_per_gbps is None:
        options = replace(options, mbps_per_gbps=default_mbps_per_gbps(fabric))
        notes.append(f"link scale {options.mbps_per_gbps:g} Mbit/s per Gbit/s chosen: the fastest host NIC runs at "
                     f"{NIC_EMU_MBPS:g} Mbit/s")
    scale = options.mbps_per_gbps
    if scale is None:  # for the type checker
        raise ReplayError("no link scale")
    # a single-rank (data-parallel) trace runs on every host unless told otherwise; a multi-rank trace
    # keeps its own ranks and groups unless --ranks maps it (it must then be data-parallel)
    n_ranks = options.ranks
    if n_ranks is None and len(workload.ranks) == 1:
        n_ranks = len(fabric.hosts)
    if n_ranks is not None and (n_ranks != workload.world_size or len(workload.ranks) != n_ranks):
        workload = workload.mapped_to(n_ranks)
        notes.extend(workload.notes[-1:])
    if workload.training is not None:  # a generated step: a GPU a rank
        check_job_fits(workload.world_size, fabric, workload.name)
    placement = resolve_placement(fabric, workload.world_size, options.placement)
    if len(placement) < workload.world_size:
        raise ReplayError(f"placement covers {len(placement)} ranks; the workload has {workload.world_size}")
    leaf_of = {h.name: min(n.switch for n in fabric.nics_of[h.name]) for h in fabric.hosts}
    groups = groups_by(placement, lambda h: leaf_of[h])
    # the job's ranks by server: a group with several GPUs in each server runs one ring per NIC (NCCL's rings)
    servers = groups_by(placement, fabric.server_of) if fabric.gpus_per_server > 1 else None

    # one DAG per distinct collective (kind, size, ranks), at real sizes; one template per DAG and lane:
    # each stream of the trace gets its own connections (a lane), as NCCL's communicators do, so
    # collectives that run concurrently never queue behind each other's data
    step_calls = _global_calls(workload)
    lanes: dict[str, int] = {}
    for scalls in step_calls:
        for c, _ in scalls:
            lanes.setdefault(c.stream, len(lanes))
    dag_of: dict[tuple[str, int, tuple[int, ...]], int] = {}
    dags: list[TransferColumns] = []
    algos: list[tuple[str, str]] = []  # per DAG: (algorithm, NCCL's protocol)
    chosen: dict[tuple[str, str, str, str], int] = {}  # (kind, algorithm, protocol, why) -> distinct collectives
    keys: dict[tuple[str, int, tuple[int, ...], int], int] = {}  # (kind, size, ranks, lane) -> template
    for scalls in step_calls:
        for c, _ in scalls:
            key = (c.kind, c.size_bytes, c.group_ranks)
            keys.setdefault((*key, lanes[c.stream]), len(keys))
            if key in dag_of:
                continue
            if any(r >= len(placement) for r in c.group_ranks):
                raise ReplayError(f"{workload.source}: {c.kind} over ranks {list(c.group_ranks)}: no host for rank "
                                  f"{max(c.group_ranks)} (placement covers {len(placement)} ranks)")
            algo, proto, size = _algorithm_of(c, options, groups, fabric, placement, chosen)
            dag_of[key] = len(dags)
            dags.append(collectives.schedule_columns(c.kind, size, c.group_ranks, algo, groups=groups,
                                                     servers=servers, pxn=options.pxn))
            if c.kind == "all_to_all" and algo == "pairwise" and collectives.server_blocks(c.group_ranks, servers):
                algo = GROUPED_A2A  # posted as one group (`traffic.collectives._grouped_all_to_all`)
            algos.append((algo, proto))

    # each DAG's transfers between hosts: (sender, receiver) host positions, and their transfers
    pos = {h.name: i for i, h in enumerate(fabric.hosts)}
    g = fabric.gpus_per_server
    server = np.asarray([fabric.server_of(h.name) for h in fabric.hosts], dtype=np.int64)  # by host position
    host_pairs = [_host_pairs(d, placement, pos, server) for d in dags]
    notes.extend(_shared_host_notes(workload, fabric, placement, dags, dag_of, pos, host_pairs, options.placement))
    if options.dilation is not None:
        dilation = options.dilation
        bytes_scale = dilation * scale / 1000
        notes.append(f"dilation {dilation:g} as asked")
    else:
        bytes_scale, why = choose_dilation(*_dilation_inputs(fabric, scale, step_calls, dags, dag_of, host_pairs))
        dilation = bytes_scale * 1000 / scale
        dilation = min(MAX_DILATION, max(MIN_DILATION, dilation))
        bytes_scale = dilation * scale / 1000
        notes.append(f"dilation {dilation:.4g} chosen: {why}")

    templates = []
    pair_keys = [np.zeros(0, dtype=np.int64)]
    n_hosts = len(fabric.hosts)
    for (kind, size_real, ranks, lane), tid in sorted(keys.items(), key=lambda kv: kv[1]):
        d = dag_of[(kind, size_real, ranks)]
        a, b, remote = host_pairs[d]
        local_us = (local_path_us(dags[d], placement, pos, server, fabric.nvlink_bps, options.nvlink_latency_us)
                    if (g > 1 or not len(dags[d])) and not remote.size else None)  # an empty DAG: 0
        templates.append(Template(tid, kind, algos[d][0], size_real, int(round(size_real * bytes_scale)), ranks,
                                  dags[d], lane, local_us, algos[d][1]))
        pair_keys.append(pair_key(n_hosts, a, b, lane))
    if chosen:
        notes.append(_choice_note(chosen))
    small = _small_transfers_note(step_calls, dags, dag_of, host_pairs, bytes_scale, dilation)
    if small:
        notes.append(small)
    # connections for every host pair with data on a lane, `channels` per shared plane: the one rule
    # (`fabric.flowsim.connections`), for both backends
    try:
        table = plan_connection_table(fabric, plan_entropy(PathTable(fabric)), np.concatenate(pair_keys),
                                      channels=options.channels, ports=options.ports, seed=options.seed,
                                      merge_nics=options.merge_nics)
    except FlowSimError as exc:
        raise ReplayError(str(exc)) from None

    calls: list[Call] = []
    # a step waits for every call of the step before (across repetitions too): its calls that wait for no call
    # of their own step wait for the calls of the step before that no call there waited for (every other call
    # of that step is an ancestor of one of those)
    previous: list[int] = []
    for rep in range(options.repeat):
        for s, scalls in enumerate(step_calls):
            deps = _call_deps(scalls, workload.timed)  # by position in the step
            number = workload.ranks[0].steps[s].number if s < len(workload.ranks[0].steps) else s
            last: list[int] = []  # per position: its last call (a count > 1 collective across the fabric has many)
            waited = [False] * len(scalls)
            for (c, members), cdeps in zip(scalls, deps):
                tkey = (c.kind, c.size_bytes, c.group_ranks, lanes[c.stream])
                tid = keys[tkey]
                for j in cdeps:
                    waited[j] = True
                first = tuple(sorted(last[j] for j in cdeps)) if cdeps else tuple(previous)
                if templates[tid].local_us is not None or c.count == 1:
                    calls.append(Call(len(calls), tid, number, s, rep, c.stream, first, c, tuple(members), c.count))
                else:
                    for k in range(c.count):
                        calls.append(Call(len(calls), tid, number, s, rep, c.stream,
                                          first if k == 0 else (len(calls) - 1,), c, tuple(members)))
                last.append(len(calls) - 1)
            if scalls:
                previous = sorted(last[j] for j in range(len(scalls)) if not waited[j])
    if not calls:
        raise ReplayError(f"{workload.source}: no collectives to replay")
    empty = sum(c.count for c in calls if templates[c.template].discarded)
    if empty:
        notes.append(f"{empty} collective(s) of 0 bytes discarded, as NCCL does ({collectives.NCCL_DISCARDS_EMPTY}): "
                     "no transfer, no time; a 0-byte send_recv keeps its latency")
    if workload.program and not workload.timed:
        notes.append("the file has no communication times: collectives replayed one after another, each alone on the "
                     "fabric; the step composed from the file's own compute in its order (compute after a blocking "
                     "collective waits for it, compute after a non-blocking one runs beside it)")
    elif not workload.timed:
        notes.append("the trace has no timings: collectives replayed one after another, compute "
                     f"{options.compute_gap_us:g} us before each" + (" (--compute-gap-us)" if workload.format == "nccl-log"
                                                                    else f" (a {workload.format} file without compute)"))
    return ReplayPlan(workload, fabric, options, placement, dilation, bytes_scale, tuple(templates), tuple(calls),
                      table, tuple(notes))


#: a template's algorithm where an all-to-all over several GPUs in each server runs as NCCL's one group of sends
GROUPED_A2A = "grouped"


def _algorithm_of(c: Collective, options: ReplayOptions, groups: Sequence[Sequence[int]], fabric: Fabric,
                  placement: Placement, chosen: dict[tuple[str, str, str, str], int]) -> tuple[str, str, int]:
    """The algorithm a collective runs, NCCL's protocol for it and the bytes its DAG moves: with algorithm "nccl",
    NCCL's choice for all-reduce, all-gather and reduce-scatter (`traffic.nccl_choice`, counted in `chosen`), the
    bytes over the protocol's bandwidth factor (`protocol_costs`); else the algorithm asked (all-reduce) or the
    kind's own, Simple."""
    if options.algorithm == "nccl" and c.kind in TUNED_KINDS:
        ch = group_choice(c.kind, c.size_bytes, c.group_ranks, placement, fabric, options.channels, options.nccl_algo)
        chosen[(c.kind, ch.algo, ch.proto, ch.why)] = chosen.get((c.kind, ch.algo, ch.proto, ch.why), 0) + 1
        return ch.algo, ch.proto, int(math.ceil(c.size_bytes / protocol_costs(ch.algo, ch.proto)[0]))
    algorithm = options.algorithm if c.kind == "all_reduce" and options.algorithm != "nccl" else "auto"
    if algorithm == "hierarchical" and len(groups) < 2:
        algorithm = "ring"
    algo = collectives.resolve_algorithm(c.kind, algorithm, groups if c.kind == "all_reduce" else None)
    return algo, "Simple", c.size_bytes


def group_choice(kind: str, size_bytes: int, ranks: Sequence[int], placement: Placement, fabric: Fabric,
                 channels_per_nic: int, asked: str) -> NcclChoice:
    """NCCL's choice (`traffic.nccl_choice.nccl_choice`) for a collective over `ranks` placed on `fabric`: its
    ranks, the servers they take, and the slowest host's NIC bandwidth (all its ports)."""
    hosts = [placement.host(r) for r in ranks]
    nodes = len({fabric.server_of(h) for h in hosts})
    nic_gbps = min(sum(n.rate_gbps for n in fabric.nics_of[h]) for h in hosts)
    return nccl_choice(kind, size_bytes, len(hosts), nodes, nic_gbps, fabric.nvlink_gbps, channels_per_nic, asked)


def protocol_costs(algo: str, proto: str) -> tuple[float, float, float]:
    """NCCL's protocol against Simple, for the algorithm: (bandwidth factor: LL x0.5, LL128 x0.92, Simple 1,
    tuning.cc:327-335; network latency share: hwLat[NET][algo][proto] / [Simple]; NVLink latency share:
    hwLat[NVLINK][algo][proto] / [Simple], tuning.cc:157-175). The DAG moves its bytes over the factor (LL's flags,
    LL128's 8 bytes of 128), and its transfers' latencies are scaled by the shares (`fabric.flowsim.Job`)."""
    if proto == "Simple":
        return 1.0, 1.0, 1.0
    p = PROTOCOLS.index(proto)
    net, nvl = HW_LAT["net"][algo], HW_LAT["nvlink"][algo]
    return (0.5 if proto == "LL" else 0.92), net[p] / net[2], nvl[p] / nvl[2]


def _choice_note(chosen: dict[tuple[str, str, str, str], int]) -> str:
    """The run's note on NCCL's choices: per kind, algorithm/protocol and how many distinct collectives took it."""
    parts = [f"{kind} {algo}/{proto} x{n} ({why})" for (kind, algo, proto, why), n in sorted(chosen.items())]
    return ("NCCL's algorithm (NCCL 2.30.7's tuning model, sm90 on an Intel host, NVLS and CollNet off; "
            "traffic.nccl_choice): " + "; ".join(parts))


def _rank_hosts(dag: TransferColumns, placement: Placement, pos: dict[str, int]) -> tuple[IntArray, IntArray]:
    """Each transfer's (sender, receiver) host positions under `placement`."""
    rank_host = np.zeros(max(dag.ranks, default=-1) + 1, dtype=np.int64)
    for r in dag.ranks:
        rank_host[r] = pos[placement.host(r)]
    return rank_host[dag.src], rank_host[dag.dst]


def _small_transfers_note(step_calls: list[list[tuple[Collective, list[tuple[int, int]]]]],
                          dags: Sequence[TransferColumns], dag_of: dict[tuple[str, int, tuple[int, ...]], int],
                          host_pairs: Sequence[tuple[IntArray, IntArray, IntArray]], bytes_scale: float,
                          dilation: float) -> str | None:
    """A note (emulation only: it begins with "dilation") naming the collective kinds whose network
    transfers are all under two HTB bursts once scaled: they leave at the veth's speed, so those
    collectives come out faster than the links allow; the dilation that makes them two bursts is named."""
    floor = 2 * HTB_BURST_BYTES
    calls: dict[str, list[int]] = {}  # kind -> [calls with network transfers, calls with only small ones]
    largest_small: dict[str, float] = {}
    for scalls in step_calls:
        for c, _ in scalls:
            d = dag_of[(c.kind, c.size_bytes, c.group_ranks)]
            sizes = dags[d].size_bytes[host_pairs[d][2]]
            if not sizes.size:
                continue
            n = calls.setdefault(c.kind, [0, 0])
            n[0] += 1
            top = float(sizes.max()) * bytes_scale
            if 0 < top < floor:
                n[1] += 1
                largest_small[c.kind] = max(largest_small.get(c.kind, 0.0), top)
    small = {k: v for k, v in calls.items() if v[1]}
    if not small:
        return None
    kinds = ", ".join(f"{k} {v[1]} of {v[0]} (--dilation {dilation * floor / largest_small[k]:.3g} makes them "
                      f"{floor // 1024} kB)" for k, v in small.items())
    return (f"dilation {dilation:.4g}: calls whose network transfers are all under {floor // 1024} kB emulated "
            f"(two of the link shaper's {HTB_BURST_BYTES // 1024} kB bursts; they leave faster than the link "
            f"rate, so their bandwidth reads high): {kinds}")


def _host_pairs(dag: TransferColumns, placement: Placement, pos: dict[str, int],
                server: IntArray | None = None) -> tuple[IntArray, IntArray, IntArray]:
    """The DAG's transfers across the fabric under `placement`: (sender, receiver) host positions and the
    transfers' indexes (the others are local: both ranks on one server; `server`: each host position's
    server, `Fabric.server_of`; None: every host its own)."""
    a, b = _rank_hosts(dag, placement, pos)
    remote = np.flatnonzero(a != b if server is None else server[a] != server[b])
    return a[remote], b[remote], remote


def _shared_host_notes(workload: Workload, fabric: Fabric, placement: Placement, dags: Sequence[TransferColumns],
                       dag_of: dict[tuple[str, int, tuple[int, ...]], int], pos: dict[str, int],
                       host_pairs: Sequence[tuple[IntArray, IntArray, IntArray]], how: str) -> list[str]:
    """Refuse ranks that share a host and move bytes between them (issue 42, defect 4), else the notes on
    which case applies.

    A host of the model is one GPU and its NIC on every fabric (a server of G GPUs is G hosts), so two
    ranks on one host are two ranks on one GPU, which NCCL refuses ("Duplicate GPU detected"), and the
    bytes between them would move in no time (a 16 MiB all-reduce in 0.001 us, busbw in Pbit/s): a
    `ReplayError` naming the rank and host counts. Ranks that share a host but exchange no bytes with one
    another (a placement file may put them so) share its NIC and nothing runs for free: a note. On servers
    of G > 1 GPUs, transfers between two GPUs of one server (two hosts) run over NVLink at
    `Fabric.nvlink_gbps` (`local_path_us`, `fabric.flowsim.executor`): a note says so."""
    n = workload.world_size
    on: dict[str, list[int]] = {}
    for rank, host in enumerate(placement.hosts[:n]):
        on.setdefault(host, []).append(rank)
    crowded = {h: rs for h, rs in on.items() if len(rs) > 1}

    def listed(ranks: list[int]) -> str:
        return ", ".join(map(str, ranks[:4])) + (", ..." if len(ranks) > 4 else "")

    if crowded:  # else no transfer can have both ends on one host
        for (kind, size, ranks), d in dag_of.items():
            a, b = _rank_hosts(dags[d], placement, pos)
            free = np.flatnonzero((a == b) & (dags[d].size_bytes > 0))
            if not free.size:
                continue
            src, dst = int(dags[d].src[free[0]]), int(dags[d].dst[free[0]])
            host = placement.host(src)
            hosts, g = len(fabric.hosts), fabric.gpus_per_server
            gpus = (f"{fabric.name}'s servers of {g} GPUs are {g} hosts each, joined by NVLink" if g > 1
                    else f"{fabric.name} has one GPU per server and no NVLink model")
            raise ReplayError(
                f"{n} ranks on {hosts} hosts: {len(on[host])} ranks would share a host ({host}: ranks "
                f"{listed(on[host])}; --placement {how}), and the {kind} of {size} bytes over {len(ranks)} ranks "
                f"would move bytes between ranks {src} and {dst} for free; this fabric's hosts carry 1 GPU each "
                f"({gpus}) and NCCL refuses two ranks on one GPU. Give at most {hosts} ranks (--ranks, or "
                f"--world-size for an AICB/SimAI file), a fabric of at least {n} hosts, or a placement with one "
                f"rank per host")
    notes = []
    if crowded:
        host = next(iter(crowded))
        notes.append(f"{len(crowded)} host(s) hold several ranks (e.g. {host}: ranks {listed(crowded[host])}) that "
                     "exchange no bytes with one another: they share the host's NIC; nothing runs for free")
    in_server = False
    if fabric.gpus_per_server > 1:
        for dag, (_, _, remote) in zip(dags, host_pairs):
            local = dag.size_bytes > 0
            local[remote] = False
            if local.any():  # with no host shared (checked above), between two GPUs of one server
                in_server = True
                break
    if in_server:
        notes.append(f"in-server: transfers between two GPUs of one server (one rank per GPU) run over NVLink at "
                     f"{fabric.nvlink_gbps:g} Gbit/s per GPU each way, not over the fabric")
    return notes


def local_path_us(dag: TransferColumns, placement: Placement, pos: dict[str, int], server: IntArray,
                  nvlink_bps: float, latency_us: float = 0.0) -> float:
    """Real microseconds an all in-server DAG takes: its critical path, each transfer between two GPUs
    taking size x 8 / `nvlink_bps` + `latency_us` (0 between ranks on one GPU) once every transfer it depends on
    is delivered (a ring all-reduce of S bytes over n GPUs: 2(n - 1) x (S/n x 8 / nvlink_bps + latency))."""
    a, b = _rank_hosts(dag, placement, pos)
    if bool((server[a] != server[b]).any()):
        raise ReplayError(f"{dag.label or 'transfer DAG'}: not all in-server")
    if not len(dag):
        return 0.0
    if not nvlink_bps > 0:
        raise ReplayError(f"{dag.label or 'transfer DAG'}: in-server transfers need the fabric's nvlink_gbps > 0")
    took_s = np.where(a != b, dag.size_bytes * 8 / nvlink_bps + latency_us * 1e-6, 0.0).tolist()
    dep, ptr = dag.dep.tolist(), dag.dep_ptr.tolist()
    end_s = [0.0] * len(took_s)
    for i, t in enumerate(took_s):  # dependencies are earlier transfers: one pass in order
        end_s[i] = max((end_s[d] for d in dep[ptr[i]:ptr[i + 1]]), default=0.0) + t
    return max(end_s) * 1e6


def _dilation_inputs(fabric: Fabric, scale: float, step_calls: list[list[tuple[Collective, list[tuple[int, int]]]]],
                     dags: Sequence[TransferColumns], dag_of: dict[tuple[str, int, tuple[int, ...]], int],
                     host_pairs: Sequence[tuple[IntArray, IntArray, IntArray]]) -> tuple[list[tuple[int, float]], float]:
    """`choose_dilation`'s inputs: per collective occurrence, (real bytes, the emulated seconds its median
    network transfer takes on one sender NIC at bytes scale 1: split over the NICs of the planes both hosts
    share, at the slowest of them), and the emulated seconds one pass over the steps takes (the busiest
    host's bytes over its NICs)."""
    hosts = fabric.hosts
    nic_bps = {n.ip: n.rate_gbps * scale * 1e6 for n in fabric.nic_ports}
    host_bps = np.asarray([sum(n.rate_gbps for n in fabric.nics_of[h.name]) * scale * 1e6 for h in hosts])
    shared_of: dict[tuple[int, int], tuple[int, float]] = {}  # (sender, receiver) -> (NICs shared, slowest bps)
    per_dag: dict[int, tuple[IntArray, float | None]] = {}  # DAG -> (bytes sent per host, median seconds)
    for d, (a, b, remote) in enumerate(host_pairs):
        size = dags[d].size_bytes[remote]
        count = np.empty(a.size, dtype=np.float64)
        slowest = np.empty(a.size, dtype=np.float64)
        for k, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
            if (x, y) not in shared_of:
                mine, theirs = fabric.nics_of[hosts[x].name], fabric.nics_of[hosts[y].name]
                shared = [n for n in mine if any(m.plane == n.plane for m in theirs)]
                shared_of[(x, y)] = (len(shared), min(nic_bps[n.ip] for n in shared))
            count[k], slowest[k] = shared_of[(x, y)]
        per_nic_s = np.sort(size / count * 8 / slowest)
        per_dag[d] = (np.bincount(a, weights=size, minlength=len(hosts)).astype(np.int64),
                      float(per_nic_s[len(per_nic_s) // 2]) if per_nic_s.size else None)
    occurrences: list[tuple[int, float]] = []
    sent = np.zeros(len(hosts), dtype=np.int64)
    for scalls in step_calls:
        for c, _ in scalls:
            by_host, median_s = per_dag[dag_of[(c.kind, c.size_bytes, c.group_ranks)]]
            sent += by_host
            if median_s is not None:
                occurrences.append((c.size_bytes, median_s))
    steps_cost_s = float((sent * 8 / host_bps).max()) if bool((sent > 0).any()) else 0.0
    return occurrences, steps_cost_s
