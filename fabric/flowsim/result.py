"""What a flow-level simulation gives: per-transfer times, per-job completion, per-link load over time.

Plain arrays (numpy), so metrics and reports can read them without knowing the simulator. Link load
is piecewise constant between events: interval k runs from `edges_s[k]` to `edges_s[k + 1]`, and
the directed links that carry traffic in it, with their rates, are kept sparse (CSR-like:
`load_ptr[k]:load_ptr[k + 1]` index `load_link` and `load_bps`); `link_rate_bps()` expands it.
Consecutive events that leave the allocation as it was (the steps of a ring, whose flows are alike)
extend one interval rather than adding one each: `events` counts the events. A log that would
exceed `load_log.LOAD_LOG_ENTRIES` entries has its resolution halved as it grows (neighbouring
intervals averaged, the bytes every link carried kept): `coarsened` says how many times.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fabric.flowsim.maxmin import FloatArray, FlowSimError, IntArray

DirectedLinkName = tuple[str, str]  # (from node, to node): links are never parallel in the model


@dataclass(frozen=True, eq=False)
class FlowSimResult:
    links: tuple[DirectedLinkName, ...]  # every directed link of the fabric, in index order
    capacity_bps: FloatArray  # per directed link
    job_offsets: tuple[int, ...]  # job j's transfer i is transfer job_offsets[j] + i
    job_start_s: FloatArray  # per job: when it started (its start_s, or later if it waited for jobs; nan: never)
    job_end_s: FloatArray  # per job: when its last transfer was delivered (nan if one never was)
    transfer_start_s: FloatArray  # per transfer: when it began (its dependencies all delivered)
    transfer_end_s: FloatArray  # per transfer: when it was delivered in full (nan if never)
    edges_s: FloatArray  # interval boundaries, ascending (K + 1 values; none if nothing was sent)
    load_ptr: IntArray  # K + 1 offsets into load_link / load_bps
    load_link: IntArray  # directed link index
    load_bps: FloatArray  # its rate in that interval, bits per second
    rate_updates: int  # how many times the max-min rates were computed (the simulator's cost driver)
    route_changes: int  # link events applied through the routing policy
    stalled: tuple[int, ...]  # transfers never delivered (a flow with no live path at the end)
    polls: int = 0  # congestion feedback rounds (SimOptions.poll_s)
    congestion_moves: int = 0  # slots the policy moved on load
    coarsened: int = 0  # times the load log's time resolution was halved
    events: int = 0  # instants at which flows ended or timed events (starts, deliveries, link events, polls) ran
    phases_replayed: int = 0  # lockstep phases whose run was taken from an identical earlier one (SimOptions.lockstep)
    phases_sampled: int = 0  # lockstep phases whose run was taken from a simulated phase of their block (`Job.sample_phases`)

    @property
    def job_time_s(self) -> FloatArray:
        """Per job: completion time, from its start to its last delivery."""
        return self.job_end_s - self.job_start_s

    def transfer_index(self, job: int, transfer: int) -> int:
        if not 0 <= job < len(self.job_offsets):
            raise FlowSimError(f"job {job} out of range 0..{len(self.job_offsets) - 1}")
        return self.job_offsets[job] + transfer

    def link_index(self, a: str, b: str) -> int:
        """The index of directed link a -> b."""
        try:
            return self._index[(a, b)]
        except KeyError:
            raise FlowSimError(f"no link {a} -> {b}") from None

    @property
    def _index(self) -> dict[DirectedLinkName, int]:
        cached: dict[DirectedLinkName, int] | None = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {l: i for i, l in enumerate(self.links)}
            object.__setattr__(self, "_index_cache", cached)
        return cached

    @property
    def durations_s(self) -> FloatArray:
        return np.diff(self.edges_s)

    def link_rate_bps(self) -> FloatArray:
        """Dense (intervals x directed links) rates, bits per second."""
        k = max(len(self.edges_s) - 1, 0)
        out = np.zeros((k, len(self.links)))
        rows = np.repeat(np.arange(k), np.diff(self.load_ptr))
        out[rows, self.load_link] = self.load_bps
        return out

    def link_utilisation(self) -> FloatArray:
        """Dense (intervals x directed links) rate / capacity."""
        return self.link_rate_bps() / self.capacity_bps

    def link_bytes(self) -> FloatArray:
        """Bytes each directed link carried over the whole run."""
        k = max(len(self.edges_s) - 1, 0)
        rows = np.repeat(np.arange(k), np.diff(self.load_ptr))
        weights = self.load_bps * self.durations_s[rows] / 8
        out: FloatArray = np.bincount(self.load_link, weights=weights, minlength=len(self.links)).astype(np.float64)
        return out
