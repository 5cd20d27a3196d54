"""The simulator's default latencies (real microseconds), what they stand for and where they come from.

The max-min model moves bytes at link rates; without latency a 1 MiB ring all-reduce over 1,024 ranks
runs at the NIC's bound, where NCCL at that size is latency-bound (2 x 1,023 steps of a few µs each).
`fabriclab sim` and `fabriclab compare` therefore default to two delays (`SimOptions.per_transfer_s`,
`SimOptions.per_hop_s`; `--per-transfer-us`, `--per-hop-us`; 0 and 0 give the bandwidth-only model):

- `DEFAULT_PER_HOP_US`: latency per link of a transfer's path: a switch's port-to-port (cut-through)
  latency, the class of 51.2 Tbit/s AI-fabric switch assumed (`SWITCH_PORT_TO_PORT_US`), plus the
  propagation over a few metres of fibre (`PROPAGATION_US`, 5 ns/m).
- `DEFAULT_PER_TRANSFER_US`: the fixed cost of one point-to-point transfer (one step of a ring: the
  kernel's chunk hand-off, the proxy thread, the NIC), chosen so that a transfer across a two-tier
  leaf-spine (4 links: NIC-leaf-spine-leaf-NIC) costs NCCL's own per-network-step latency for the ring
  algorithm and the Simple protocol (`NCCL_NET_RING_STEP_US`, `hwLat[NET][Ring][Simple]` in NCCL's
  tuning model, src/graph/tuning.cc): a pyramid's 6-link paths then cost two hops more, a path inside a
  leaf two fewer.

- `DEFAULT_RESOLUTION_US`: the simulator's time resolution (`SimOptions.resolution_s`, `--resolution-us`):
  flows that end, and deliveries and job starts that fall due, within this long after the first are
  taken with it, so one rate computation serves them all. 1 ns by default for traces: exact to the model.
  `COARSE_RESOLUTION_US` (5 µs) by default for generated LLM steps, whose network transfers are MB-sized
  (`fabriclab.study.spec.resolve`), and a speed knob for steps of large transfers only: on a congested 1,024-GPU pyramid a
  GPT-3 step recomputes its rates every few hundred ns (transfers whose paths differ by a hop are
  delivered 0.65 µs apart), and 5 µs makes the row several times faster for a step 0.02% off; but every
  event it takes early shortens a chain of small transfers (a ring step of 64 KB is ~15 µs), so
  latency-bound collectives come out faster than the NIC allows. Measured: docs/simulator.md
  ("Resolution").

- `NCCL_NVLINK_RING_STEP_US`: the latency of a transfer between two GPUs of a server (NVLink), on top of its
  size at the NVLink rate: NCCL's intra-node step latency (`hwLat[NVLINK][Ring][Simple]`), so an 8-GPU ring
  all-reduce in a server pays 14 x 3.4 µs (`SimOptions.nvlink_latency_s`, `--nvlink-latency-us`; 0 gives the
  NVLink rate only). In-server transfers pay neither of the two network delays.

Not modelled: NCCL's per-call base latency (`baseLat`, a few µs per collective). Its LL/LL128 protocols enter
where NCCL's tuning model picks them (`traffic.nccl_choice`): a collective's transfers then pay these
latencies scaled by the protocol's share of Simple's (`fabric.flowsim.Job.net_latency_scale`). Sources and the
resulting busbw-vs-size curves: docs/simulator.md ("Latency") and benchmarks/RESULTS.md.
"""
from __future__ import annotations

#: NCCL's latency for one inter-node step of a ring (Simple protocol), µs: `hwLat[NCCL_HW_NET][RING][SIMPLE]`
#: in NVIDIA/nccl src/graph/tuning.cc, 14.0 from NCCL 2.26.2 to 2.30.7 (read 2026-12-04)
NCCL_NET_RING_STEP_US = 14.0
#: NCCL's latency for one intra-node (NVLink) step of a ring (Simple protocol), µs: `hwLat[NCCL_HW_NVLINK][RING][SIMPLE]`
#: in NVIDIA/nccl src/graph/tuning.cc:159 (NCCL 2.30.7, commit 5067397c); every in-server transfer pays it
#: (`SimOptions.nvlink_latency_s`, `--nvlink-latency-us`)
NCCL_NVLINK_RING_STEP_US = 3.4
#: port-to-port latency of a 51.2 Tbit/s-class Ethernet switch (Broadcom Tomahawk 5 class, cut-through), µs;
#: vendors publish no datasheet figure: ~0.6 us is the figure reported for Tomahawk 5 (docs/simulator.md)
SWITCH_PORT_TO_PORT_US = 0.6
#: light in fibre, 5 ns/m, over a 10 m cable, µs
PROPAGATION_US = 0.05
#: links of a path between two leaves of a two-tier leaf-spine (NIC-leaf-spine-leaf-NIC)
LEAF_SPINE_PATH_LINKS = 4

DEFAULT_PER_HOP_US = SWITCH_PORT_TO_PORT_US + PROPAGATION_US
DEFAULT_PER_TRANSFER_US = NCCL_NET_RING_STEP_US - LEAF_SPINE_PATH_LINKS * DEFAULT_PER_HOP_US
#: the simulator's time resolution by default (`fabriclab sim` and `fabriclab compare`, as `SimOptions`'), µs:
#: events within it of one another are taken together (module docstring)
DEFAULT_RESOLUTION_US = 0.001
#: a coarser resolution for steps whose fabric transfers are MB-sized (the main job's 1,024-GPU verdict), µs
COARSE_RESOLUTION_US = 5.0
