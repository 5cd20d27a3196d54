"""Max-min fair rates of flows over links with capacities, by progressive filling.

The model: every flow crosses a fixed set of links (its path) and sends at a constant rate; a
link's flows together get at most its capacity. The max-min fair allocation is the one where no
flow's rate can grow without shrinking a flow whose rate is no larger. Progressive filling finds it:
raise every unfrozen flow's rate together until some link is full (its remaining capacity shared
equally among its unfrozen flows is the tightest), freeze the flows on every link that is now full,
repeat until every flow is frozen. Each round freezes at least one link, so there are at most as
many rounds as links, and in practice as many as there are distinct bottleneck levels.

Three implementations of the same algorithm:
- `max_min_rates`: compiled (numba), one link at a time from a binary heap of the links keyed by the
  level at which each fills: (capacity - rates of its frozen flows) / its unfrozen flows. Freezing
  a link's flows touches only the links those flows cross, so a solve costs O(crossings x log links)
  however many levels there are. Links that fill at the same level (within a relative tolerance,
  checked from the top of the heap) saturate in the same round. The flows x links incidence comes
  as two parallel index arrays (one entry per (flow, link) crossing: a sparse COO matrix without the
  values), turned into compressed rows both ways by a counting sort.
- `max_min_rates_vectorised`: numpy over the same incidence; a round is a few `bincount`s and masked
  array operations over every remaining crossing and every link, so a solve costs O(levels x
  crossings). It was the simulator's solver before; on the pyramid's hashed ECMP flows (hundreds of
  levels) it is the slow one, and it stays as the fair baseline of the speed ratio and a cross-check.
- `max_min_rates_reference`: plain Python lists and loops, one link per round (the tightest, lowest
  index first). It is the reference: for checking the others, and the baseline of a speed ratio; it
  is not meant to be fast.

Rates and capacities are in bits per second. Nothing about packets, queues or TCP is modelled:
a flow's rate is its fair share from the first instant (see `fabric.flowsim` for the whole model).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType

import numpy as np
import numpy.typing as npt

from fabric.errors import FabriclabError

#: A link whose remaining capacity is below this share of its capacity counts as full.
REL_TOL = 1e-9

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


class FlowSimError(FabriclabError):
    """A flow-level simulation input that cannot be honoured; the message names the offending item."""


def incidence(paths: Sequence[Sequence[int]]) -> tuple[IntArray, IntArray]:
    """The flows x links incidence as (flow index, link index) per crossing, from each flow's links.
    A link listed twice in one path counts once."""
    flows: list[int] = []
    links: list[int] = []
    for f, path in enumerate(paths):
        unique = dict.fromkeys(path)
        flows.extend([f] * len(unique))
        links.extend(unique)
    return np.asarray(flows, dtype=np.intp), np.asarray(links, dtype=np.intp)


def _check_capacity(capacity_bps: FloatArray) -> None:
    if capacity_bps.size and not np.all(capacity_bps > 0):
        bad = int(np.argmin(capacity_bps > 0))
        raise FlowSimError(f"link {bad}: capacity_bps must be > 0, got {capacity_bps[bad]}")


def _check(n_flows: int, crossing_flow: IntArray, crossing_link: IntArray, capacity_bps: FloatArray) -> None:
    if crossing_flow.shape != crossing_link.shape:
        raise FlowSimError(f"incidence arrays differ in length: {crossing_flow.shape} and {crossing_link.shape}")
    _check_capacity(capacity_bps)
    if crossing_link.size and (crossing_link.min() < 0 or crossing_link.max() >= capacity_bps.size):
        raise FlowSimError(f"incidence names links outside 0..{capacity_bps.size - 1}")
    if crossing_flow.size and (crossing_flow.min() < 0 or crossing_flow.max() >= n_flows):
        raise FlowSimError(f"incidence names flows outside 0..{n_flows - 1}")
    per_flow = np.bincount(crossing_flow, minlength=n_flows)
    if n_flows and per_flow.min() == 0:
        raise FlowSimError(f"flow {int(np.argmin(per_flow))} crosses no link: its rate would be unbounded")


def max_min_rates(n_flows: int, crossing_flow: IntArray, crossing_link: IntArray,
                  capacity_bps: FloatArray) -> FloatArray:
    """Max-min fair rate (bits/s) of each of `n_flows` flows; flow `crossing_flow[i]` crosses link
    `crossing_link[i]`, and link l carries at most `capacity_bps[l]`. Compiled progressive filling
    (module docstring); every flow must cross at least one link, and no (flow, link) pair may repeat
    (see `incidence`)."""
    capacity_bps = np.asarray(capacity_bps, dtype=np.float64)
    crossing_flow = np.asarray(crossing_flow, dtype=np.int64)
    crossing_link = np.asarray(crossing_link, dtype=np.int64)
    _check(n_flows, crossing_flow, crossing_link, capacity_bps)
    rate: FloatArray = _compiled().fill(n_flows, crossing_flow, crossing_link, capacity_bps, REL_TOL)
    return rate


def max_min_rates_on_paths(paths: IntArray, capacity_bps: FloatArray) -> tuple[FloatArray, FloatArray]:
    """`max_min_rates` for flows given as the rows of `paths` (flow f crosses links paths[f, :k],
    the rest of its row -1; a link repeated in a row counts once), as the simulator keeps its
    connections' paths; returns (each flow's rate, each link's load: the sum of its flows' rates),
    bits/s. Every row must name at least one link."""
    capacity_bps = np.asarray(capacity_bps, dtype=np.float64)
    paths = np.asarray(paths, dtype=np.int64)
    if paths.ndim != 2:
        raise FlowSimError(f"paths must be a 2-d array (a row per flow), got {paths.ndim} dimension(s)")
    _check_capacity(capacity_bps)
    if paths.size and (paths.max() >= capacity_bps.size or paths.min() < -1):
        raise FlowSimError(f"paths name links outside 0..{capacity_bps.size - 1}")
    if paths.shape[0] and not bool((paths >= 0).any(axis=1).all()):
        raise FlowSimError(f"flow {int(np.argmin((paths >= 0).any(axis=1)))} crosses no link: its rate would be "
                           "unbounded")
    rate, load = _compiled().fill_paths(paths, capacity_bps, REL_TOL)
    return rate, load


def rates_on_routed_paths(paths: IntArray, capacity_bps: FloatArray) -> tuple[FloatArray, FloatArray]:
    """`max_min_rates_on_paths` without its checks, for the simulator's own paths (`Flows.update_rates`: rows of
    walked links, each with one at least; capacities checked when the links were built): tens of thousands of
    solves a row, each paying three passes over the paths for the checks otherwise."""
    rate, load = _compiled().fill_paths(paths, capacity_bps, REL_TOL)
    return rate, load


def rates_on_routed_paths_again(paths: IntArray, capacity_bps: FloatArray, dirty_links: IntArray,
                                rates: FloatArray) -> tuple[FloatArray, FloatArray]:
    """`rates_on_routed_paths` after flows on `dirty_links` started or ended: `rates` (the last solve's, per row of
    `paths`) kept outside their connected components, the rest filled again (`_fill.fill_paths_again`)."""
    rate, load = _compiled().fill_paths_again(paths, capacity_bps, REL_TOL, np.asarray(dirty_links, dtype=np.int64),
                                              np.asarray(rates, dtype=np.float64))
    return rate, load


def max_min_rates_vectorised(n_flows: int, crossing_flow: IntArray, crossing_link: IntArray,
                             capacity_bps: FloatArray) -> FloatArray:
    """The same rates as `max_min_rates`, by progressive filling vectorised with numpy, every link
    reaching a round's level (within a relative tolerance) saturating in that round (module
    docstring): the speed ratio's fair baseline and a cross-check."""
    capacity_bps = np.asarray(capacity_bps, dtype=np.float64)
    crossing_flow = np.asarray(crossing_flow, dtype=np.intp)
    crossing_link = np.asarray(crossing_link, dtype=np.intp)
    _check(n_flows, crossing_flow, crossing_link, capacity_bps)
    n_links = capacity_bps.size
    rate = np.zeros(n_flows)
    room = capacity_bps.copy()  # capacity not yet given to frozen flows nor to the common level
    level = 0.0  # the rate every unfrozen flow has now
    flow, link = crossing_flow, crossing_link
    count = np.bincount(link, minlength=n_links)  # unfrozen flows per link
    while flow.size:
        used = count > 0
        share = np.full(n_links, np.inf)
        np.divide(room, count, out=share, where=used)
        tight = int(share.argmin())
        step = float(share[tight])
        level += step
        room[used] -= step * count[used]
        full = used & (room <= REL_TOL * capacity_bps)
        full[tight] = True  # the tightest is full whatever the rounding
        newly = np.zeros(n_flows, dtype=bool)
        newly[flow[full[link]]] = True
        rate[newly] = level
        gone = newly[flow]
        count -= np.bincount(link[gone], minlength=n_links)
        flow, link = flow[~gone], link[~gone]
    return rate


@functools.cache
def _compiled() -> ModuleType:
    """`fabric.flowsim._fill`, the compiled kernels, imported at their first use: numba compiles them
    then, or loads the machine code it cached beside the module."""
    from fabric.flowsim import _fill

    return _fill


def max_min_rates_reference(paths: Sequence[Sequence[int]], capacity_bps: Sequence[float]) -> list[float]:
    """The same progressive filling in plain Python: the reference implementation (for checks and as
    the baseline of a speed ratio; not for use at scale). `paths[f]` lists the links flow f crosses.

    Each round: among links with unfrozen flows, the one whose remaining capacity per unfrozen flow
    is smallest (lowest index on a tie) is full at that level; its unfrozen flows get the level and
    freeze, and their rate is taken from every link they cross."""
    n_links = len(capacity_bps)
    for f, path in enumerate(paths):
        if not path:
            raise FlowSimError(f"flow {f} crosses no link: its rate would be unbounded")
        for l in path:
            if not 0 <= l < n_links:
                raise FlowSimError(f"flow {f} names link {l} outside 0..{n_links - 1}")
    on_link: list[set[int]] = [set() for _ in range(n_links)]
    for f, path in enumerate(paths):
        for l in path:
            on_link[l].add(f)
    room = [float(c) for c in capacity_bps]  # capacity left for the unfrozen flows
    rates: list[float | None] = [None] * len(paths)
    while any(r is None for r in rates):
        best: tuple[float, int] | None = None
        for l in range(n_links):
            if on_link[l]:
                share = room[l] / len(on_link[l])
                if best is None or share < best[0]:
                    best = (share, l)
        if best is None:  # unreachable: every unfrozen flow is on some link
            raise FlowSimError("progressive filling found no link for the remaining flows")
        share, tight = best
        for f in sorted(on_link[tight]):
            rates[f] = share
            for l in set(paths[f]):
                room[l] -= share
                on_link[l].discard(f)
    return [float(r) for r in rates if r is not None]
