"""The compiled kernel of `fabric.flowsim.maxmin.max_min_rates`: progressive filling over a binary
heap of links (see that module's docstring). Imported only when first used, as numba's import and
compilation take a second or two; numba caches the machine code beside this file."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@njit(cache=True)
def push(key: FloatArray, val: IntArray, size: int, k: float, v: int) -> int:
    """Add (k, v) to the heap held in key[:size], val[:size]; returns the new size."""
    i = size
    key[i] = k
    val[i] = v
    while i > 0:
        up = (i - 1) >> 1
        if key[up] <= key[i]:
            break
        key[up], key[i] = key[i], key[up]
        val[up], val[i] = val[i], val[up]
        i = up
    return size + 1


@njit(cache=True)
def pop(key: FloatArray, val: IntArray, size: int) -> int:
    """Remove the heap's top (key[0], val[0]); returns the new size."""
    size -= 1
    key[0] = key[size]
    val[0] = val[size]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        c = a + 1 if a + 1 < size and key[a + 1] < key[a] else a
        if key[i] <= key[c]:
            break
        key[c], key[i] = key[i], key[c]
        val[c], val[i] = val[i], val[c]
        i = c
    return size


@njit(cache=True)
def fill(n_flows: int, crossing_flow: IntArray, crossing_link: IntArray, cap: FloatArray,
         rel_tol: float) -> FloatArray:
    """Max-min fair rates (`fabric.flowsim.maxmin.max_min_rates`, whose arguments it takes checked).
    A link full at a round's level: its capacity left, at that level, within rel_tol of its
    capacity (the heap's next links are checked in level order, so a link that fills a little
    later yet within its own tolerance saturates in the next round: rates differ by < rel_tol)."""
    n = cap.size
    m = crossing_flow.size
    # compressed rows both ways: each link's flows, each flow's links (a counting sort)
    link_ptr = np.zeros(n + 1, np.int64)
    flow_ptr = np.zeros(n_flows + 1, np.int64)
    for i in range(m):
        link_ptr[crossing_link[i] + 1] += 1
        flow_ptr[crossing_flow[i] + 1] += 1
    for i in range(n):
        link_ptr[i + 1] += link_ptr[i]
    for i in range(n_flows):
        flow_ptr[i + 1] += flow_ptr[i]
    link_at = link_ptr[:-1].copy()
    flow_at = flow_ptr[:-1].copy()
    link_flows = np.empty(m, np.int64)
    flow_links = np.empty(m, np.int64)
    for i in range(m):
        f = crossing_flow[i]
        lk = crossing_link[i]
        link_flows[link_at[lk]] = f
        link_at[lk] += 1
        flow_links[flow_at[f]] = lk
        flow_at[f] += 1
    unfrozen = link_ptr[1:] - link_ptr[:-1]  # per link
    given = np.zeros(n)  # per link: the rates of its frozen flows
    fills_at = np.full(n, np.inf)  # per link: the level at which it fills (its heap key)
    done = np.zeros(n, np.bool_)  # full, or no unfrozen flow left
    rate = np.zeros(n_flows)
    frozen = np.zeros(n_flows, np.bool_)
    # the heap holds (level, link), stale entries included (skipped: key != fills_at)
    key = np.empty(n + m + 1)
    val = np.empty(n + m + 1, np.int64)
    size = 0
    for lk in range(n):
        if unfrozen[lk] > 0:
            fills_at[lk] = cap[lk] / unfrozen[lk]
            size = push(key, val, size, fills_at[lk], lk)
        else:
            done[lk] = True
    full = np.empty(n, np.int64)
    touched = np.empty(n, np.int64)
    marked = np.zeros(n, np.bool_)
    left = n_flows
    while left > 0 and size > 0:
        level = key[0]
        lk = val[0]
        size = pop(key, val, size)
        if done[lk] or level != fills_at[lk]:
            continue
        # the links full at this level: this one, and those the heap gives next within tolerance
        n_full = 1
        full[0] = lk
        done[lk] = True
        while size > 0:
            nxt = val[0]
            if done[nxt] or key[0] != fills_at[nxt]:
                size = pop(key, val, size)
            elif cap[nxt] - given[nxt] - level * unfrozen[nxt] <= rel_tol * cap[nxt]:
                size = pop(key, val, size)
                full[n_full] = nxt
                n_full += 1
                done[nxt] = True
            else:
                break
        # their unfrozen flows freeze at the level; the links those flows cross fill later
        n_touched = 0
        for i in range(n_full):
            for j in range(link_ptr[full[i]], link_ptr[full[i] + 1]):
                f = link_flows[j]
                if frozen[f]:
                    continue
                frozen[f] = True
                rate[f] = level
                left -= 1
                for k in range(flow_ptr[f], flow_ptr[f + 1]):
                    other = flow_links[k]
                    given[other] += level
                    unfrozen[other] -= 1
                    if not marked[other]:
                        marked[other] = True
                        touched[n_touched] = other
                        n_touched += 1
        for i in range(n_touched):
            other = touched[i]
            marked[other] = False
            if done[other]:
                continue
            if unfrozen[other] > 0:
                fills_at[other] = (cap[other] - given[other]) / unfrozen[other]
                size = push(key, val, size, fills_at[other], other)
            else:
                done[other] = True
    return rate


@njit(cache=True)
def _crosses(paths: IntArray, f: int, j: int) -> bool:
    """Whether row f's j-th entry is a link it crosses, counted once (not -1, not a repeat of an earlier one)."""
    lk = paths[f, j]
    if lk < 0:
        return False
    for i in range(j):
        if paths[f, i] == lk:
            return False
    return True


@njit(cache=True)
def fill_paths(paths: IntArray, cap: FloatArray, rel_tol: float) -> tuple[FloatArray, FloatArray]:
    """`fill` for flows given as the rows of `paths` (each row a flow's links, then -1s; a link
    repeated in a row counts once); also returns each link's load (the sum of its flows' rates)."""
    n_flows, width = paths.shape
    m = 0
    for f in range(n_flows):
        for j in range(width):
            if paths[f, j] >= 0:
                m += 1
    crossing_flow = np.empty(m, np.int64)
    crossing_link = np.empty(m, np.int64)
    m = 0
    for f in range(n_flows):
        for j in range(width):
            if _crosses(paths, f, j):
                crossing_flow[m] = f
                crossing_link[m] = paths[f, j]
                m += 1
    rate = fill(n_flows, crossing_flow[:m], crossing_link[:m], cap, rel_tol)
    load = np.zeros(cap.size)
    for i in range(m):
        load[crossing_link[i]] += rate[crossing_flow[i]]
    return rate, load


@njit(cache=True)
def _root(parent: IntArray, x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


@njit(cache=True)
def touched_flows(paths: IntArray, n_links: int, dirty_links: IntArray) -> npt.NDArray[np.bool_]:
    """Which flows (rows of `paths`, as `fill_paths`) share a connected component (flows joined by the links they
    cross) with any of `dirty_links` (-1s ignored): the flows whose max-min rates may have changed when flows on
    those links started or ended. The others' components are as they were, and so are their rates."""
    parent = np.arange(n_links)
    n_flows, width = paths.shape
    for f in range(n_flows):
        first = -1
        for j in range(width):
            lk = paths[f, j]
            if lk < 0:
                continue
            r = _root(parent, lk)
            if first < 0:
                first = r
            elif r != first:
                parent[r] = first
    mark = np.zeros(n_links, np.bool_)
    for i in range(dirty_links.size):
        lk = dirty_links[i]
        if lk >= 0:
            mark[_root(parent, lk)] = True
    out = np.zeros(n_flows, np.bool_)
    for f in range(n_flows):
        for j in range(width):
            lk = paths[f, j]
            if lk >= 0:
                out[f] = mark[_root(parent, lk)]
                break
    return out


@njit(cache=True)
def fill_paths_again(paths: IntArray, cap: FloatArray, rel_tol: float, dirty_links: IntArray,
                     rates: FloatArray) -> tuple[FloatArray, FloatArray]:
    """`fill_paths` after a change: `rates` (each flow's, from the last solve) kept for the flows outside the
    components of `dirty_links` (`touched_flows`), the others filled again (on the links' whole capacity: no
    flow of another component crosses their links); returns (rates, each link's load)."""
    again = touched_flows(paths, cap.size, dirty_links)
    n = 0
    for f in range(again.size):
        if again[f]:
            n += 1
    out = rates.copy()
    if n:
        sub = np.empty((n, paths.shape[1]), np.int64)
        k = 0
        for f in range(again.size):
            if again[f]:
                sub[k] = paths[f]
                k += 1
        sub_rates, _ = fill_paths(sub, cap, rel_tol)
        k = 0
        for f in range(again.size):
            if again[f]:
                out[f] = sub_rates[k]
                k += 1
    load = np.zeros(cap.size)
    for f in range(paths.shape[0]):
        for j in range(paths.shape[1]):
            if _crosses(paths, f, j):
                load[paths[f, j]] += out[f]
    return out, load
