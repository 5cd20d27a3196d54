"""What a simulation is given and what it reports while it runs (`executor.simulate`'s types).

- `Job`: a transfer DAG placed on hosts, with its start time, the jobs it waits for, its lane, and
  its lockstep and phase-sampling settings.
- `LinkEvent`: a link down or up at a time.
- `SimOptions`: the connections (channels, source ports), the overheads, the congestion polling, the
  resolution, lockstep and the forwarding (store and forward, or cut-through).
- `SimProgress`: where a run is, for its progress callback.
- `directed_links`: the fabric's directed links and their capacities, in the order every per-link
  array of the simulator uses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fabric.flowsim.maxmin import FloatArray, FlowSimError
from fabric.flowsim.result import DirectedLinkName
from fabric.model import Fabric
from fabric.transfers import Placement, TransferColumns, TransferDag


@dataclass(frozen=True)
class Job:
    """One transfer DAG (either form) on hosts, started at `start_s`, and not before every job in
    `after` (indexes of earlier jobs in the same run) has completed."""

    dag: TransferDag | TransferColumns
    placement: Placement
    start_s: float = 0.0
    after: tuple[int, ...] = ()
    lane: int = 0  # the set of connections its transfers use (the replay's lane: one per stream of a trace)
    # its phases in lockstep (`SimOptions.lockstep`); None: as the options say
    lockstep: bool | None = None
    # phase sampling (an approximation for DAGs of many phases alike in shape but not in host pairs, such
    # as an all-to-all's rounds; needs lockstep): its phases in blocks of this many, the first of a block
    # to begin on an otherwise idle fabric simulated, the block's later ones replayed from it
    # (`phases.PhaseReplays`); 1: every phase simulated
    sample_phases: int = 1
    # a job without transfers (an empty DAG) that takes this long: it completes `hold_s` after it starts
    # (a replay's in-server collective, timed at the NVLink rate); 0 for a job with transfers
    hold_s: float = 0.0
    # its transfers' latencies as a share of the options' (store and forward only): the network's (per transfer
    # and per hop) and NVLink's, for a collective NCCL runs with a protocol of lower latency than Simple's
    # (LL, LL128: `traffic.nccl_choice`)
    net_latency_scale: float = 1.0
    nvlink_latency_scale: float = 1.0

    @property
    def columns(self) -> TransferColumns:
        return self.dag if isinstance(self.dag, TransferColumns) else self.dag.columns


@dataclass(frozen=True)
class LinkEvent:
    """The link at `switch`'s `port` goes down (or up) at `time_s`, both directions at once."""

    time_s: float
    switch: str
    port: int
    up: bool = False


@dataclass(frozen=True)
class SimProgress:
    """Where a run is (`simulate`'s `progress` callback): simulated time, jobs, events, rate computations,
    and each job's completion time so far (nan: not completed; a view, valid during the call)."""

    now_s: float
    jobs_done: int
    jobs: int
    events: int
    rate_updates: int
    job_end_s: FloatArray


@dataclass(frozen=True)
class SimOptions:
    channels: int = 2  # connections per plane per host pair (as the replay's --channels)
    merge_nics: bool = True  # False: `channels` per host pair in all, alternating over the planes (--merge-nics off)
    ports: str = "planned"  # source ports: "planned" or "hashed" (as the replay's --ports)
    seed: int = 0  # for hashed source ports
    per_transfer_s: float = 0.0  # fixed delay per transfer (e.g. software overhead), seconds
    per_hop_s: float = 0.0  # latency per link of a transfer's path, seconds
    # latency of a transfer between two GPUs of a server (NVLink), on top of its size at the NVLink rate, seconds
    # (`fabric.latency.NCCL_NVLINK_RING_STEP_US` in `fabriclab sim` and `compare`)
    nvlink_latency_s: float = 0.0
    # congestion feedback: every poll_s of simulated time while flows run, the policy is given the
    # rates of every switch egress link and every slot (as the controller's port and flow counters give
    # them) and may move slots; 0: never (a policy without a load reaction is never polled)
    poll_s: float = 0.0
    # flows due to end within this long after the first to end are taken to end with it (their last
    # bits are dropped), and deliveries, job starts and ends and cut-through set-ups due within this
    # long after the first timed event are handled with it (`clock.EARLY_KINDS`; a replay's end, a link
    # event and a poll keep their times): transfers of one step whose sizes differ by a byte end as one
    # event, not as two that let the steps drift apart event by event, and transfers whose paths differ
    # by a hop are delivered in one event; the error is at most this per event (each taken early by at
    # most this). `fabriclab sim` and `compare` use `fabric.latency.DEFAULT_RESOLUTION_US`
    resolution_s: float = 1e-9
    # keep every transfer's start and end time for the result (`FlowSimResult.transfer_start_s`); off,
    # only the jobs' times are kept, and memory holds only the jobs that run at the moment
    transfer_times: bool = True
    # the share of a link's rate that carries the transfers' bytes (the rest: packet headers, ACKs), for
    # a calibration against the emulator (TCP over Ethernet at MTU 1500: ~1448 / 1514); 1: all of it
    goodput_share: float = 1.0
    # bulk-synchronous steps: a transfer begins only once every transfer of its job in an earlier
    # phase (the DAG's `phase`, a collective's step) has been delivered, as well as its own
    # dependencies. An approximation for scale: a ring's steps then start together, so flows that
    # ECMP collisions slow do not drift apart event by event (each step repeats the one before, and
    # its rates come from the memo). Not exact: a step that could overlap the next one waits. A phase
    # that begins on an idle fabric with the same host pairs and sizes as an earlier one is replayed
    # from it (one event instead of its flows' events; same times, same loads)
    lockstep: bool = False
    # cut-through, as the replay's agents forward (`traffic.replay.agent`): a transfer may begin once
    # each transfer it depends on has begun (received data is forwarded as it arrives) or, for the same
    # sender's earlier sends, has been sent; it is delivered no earlier than those it depends on; and a
    # host pair's transfers take its connections one after another, in order (each connection's parts
    # are sent in turn). The per-transfer delay then holds the pair before the first byte (the agent's
    # work per transfer), the per-hop delay is the latency between the last byte sent and delivered.
    # Off: store and forward (a transfer waits for its dependencies in full; it is delivered both
    # delays after its last byte), and transfers of one pair share its connections at once. Not with
    # lockstep
    cut_through: bool = False

    def check(self) -> None:
        if self.cut_through and self.lockstep:
            raise FlowSimError("cut_through and lockstep exclude each other (lockstep waits for whole steps)")
        if self.per_transfer_s < 0 or self.per_hop_s < 0 or not self.nvlink_latency_s >= 0:
            raise FlowSimError(f"overheads must be >= 0, got per_transfer_s={self.per_transfer_s}, "
                               f"per_hop_s={self.per_hop_s}, nvlink_latency_s={self.nvlink_latency_s}")
        if not (0 <= self.resolution_s <= 1e-3):
            raise FlowSimError(f"resolution_s must be in [0, 1 ms], got {self.resolution_s}")
        if not 0 < self.goodput_share <= 1:
            raise FlowSimError(f"goodput_share must be in (0, 1], got {self.goodput_share}")
        if not (self.poll_s >= 0 and math.isfinite(self.poll_s)):
            raise FlowSimError(f"poll_s must be finite and >= 0, got {self.poll_s}")


def directed_links(fabric: Fabric) -> tuple[tuple[DirectedLinkName, ...], FloatArray]:
    """Every directed link (from node, to node) of the fabric and its capacity in bits per second."""
    names: list[DirectedLinkName] = []
    caps: list[float] = []
    for link in fabric.links:
        for a, b in ((link.a.node, link.b.node), (link.b.node, link.a.node)):
            names.append((a, b))
            caps.append(link.rate_gbps * 1e9)
    return tuple(names), np.asarray(caps)
