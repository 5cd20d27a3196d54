"""The active flows and their rates: a flow is one part of a transfer, on one of its host pair's
connections; the flows are parallel arrays (connection, transfer, bits left), and their rates the max-min
fair shares of the links' goodput (`rates_on_routed_paths`), recomputed only when the flows or the
routing change (`dirty`) and memoised by the multiset of active connections and the routing's version:
the steps of a ring, whose flows are alike, compute them once.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fabric.flowsim.connections import sorted_unique
from fabric.flowsim.maxmin import FloatArray, IntArray, rates_on_routed_paths, rates_on_routed_paths_again
from fabric.flowsim.pool import TransferPool
from fabric.flowsim.routes import ConnectionPaths

#: memoised max-min results kept at most, by total flows held
RATE_MEMO_FLOWS = 4_000_000


class Flows:
    """The active flows (`conn`, `transfer`, `left_bits`), their `rates` and the allocation's link
    loads (`load`: links, rates) once `update_rates` has run since they last changed (`dirty`).
    `on_start` is called whenever flows start (the congestion feedback's first poll)."""

    def __init__(self, pool: TransferPool, paths: ConnectionPaths, goodput_bps: FloatArray, per_hop: bool,
                 on_start: Callable[[], None] | None = None) -> None:
        self.pool, self.paths = pool, paths
        self.goodput_bps = goodput_bps  # what the transfers' bytes may use of each link
        self.per_hop = per_hop  # a transfer's hops are kept only where they cost time (a per-hop delay)
        self.on_start = on_start
        self.conn = np.zeros(0, dtype=np.intp)
        self.transfer = np.zeros(0, dtype=np.intp)
        self.left_bits = np.zeros(0)
        # since the last solve: the connections of flows started or ended (their links' components are re-solved,
        # the others keep their rates), and the routing version it solved; None: solve everything next time
        self.changed: list[IntArray] = []
        self.solved_version: int | None = None
        self.rates = np.zeros(0)
        self.load = (np.zeros(0, dtype=np.intp), np.zeros(0))  # (links, rates) of the current allocation
        self.dirty = True
        self.memo: dict[tuple[int, bytes], tuple[FloatArray, IntArray, FloatArray]] = {}
        self.memo_flows = 0
        self.rate_updates = 0

    def start(self, g: IntArray) -> IntArray:
        """Transfers `g` (between two hosts) start sending now: one flow per connection of their pair;
        returns those with nothing to send (0 bytes)."""
        pool, paths = self.pool, self.paths
        pair = pool.t_pair[g]
        lo, hi = paths.pair_ptr[pair], paths.pair_ptr[pair + 1]
        k = hi - lo  # connections per transfer
        if k[0] == k[-1] and bool((k == k[0]).all()):  # the usual case: as many for every pair
            # one row per transfer, one column per connection of its pair
            w = int(k[0])
            j = np.arange(w)
            part_t = np.repeat(g, w)
            conn = (lo[:, None] + j).ravel()
            base, extra = np.divmod(pool.t_size[g], w)
            part_bytes = (base[:, None] + (j < extra[:, None])).ravel()
            paths.route(conn)
            keep = part_bytes > 0
            if w == 1:  # (numpy's reductions along a short axis cost ~0.1 ms a call: not for one column)
                if self.per_hop:
                    pool.hops[g] = paths.conn_hops[conn]
                pool.parts_left[g] = keep
            else:
                hops = paths.conn_hops[conn].reshape(-1, w)
                kept = keep.reshape(-1, w)
                most, count = hops[:, 0].copy(), kept[:, 0].astype(np.int64)
                for c in range(1, w):
                    np.maximum(most, hops[:, c], out=most)
                    count += kept[:, c]
                if self.per_hop:
                    pool.hops[g] = most
                pool.parts_left[g] = count
        else:
            part_t = np.repeat(g, k)  # one row per (transfer, connection)
            jk = np.arange(part_t.size) - np.repeat(np.cumsum(k) - k, k)  # connection's rank in its pair
            conn = np.repeat(lo, k) + jk
            base, extra = np.divmod(pool.t_size[g], k)
            part_bytes = np.repeat(base, k) + (jk < np.repeat(extra, k))
            paths.route(conn)
            if self.per_hop:
                pool.hops[g] = np.maximum.reduceat(paths.conn_hops[conn], np.cumsum(k) - k)
            keep = part_bytes > 0
            pool.parts_left[g] = np.add.reduceat(keep.astype(np.int64), np.cumsum(k) - k)
        if keep.any():
            if not self.conn.size and keep.all():  # the usual case after a ring's step
                self.conn, self.transfer, self.left_bits = conn, part_t, part_bytes * 8.0
                self.rates = np.zeros(conn.size)
                self.changed.append(conn)
            else:
                self.conn = np.concatenate([self.conn, conn[keep]])
                self.transfer = np.concatenate([self.transfer, part_t[keep]])
                self.left_bits = np.concatenate([self.left_bits, part_bytes[keep] * 8.0])
                self.rates = np.concatenate([self.rates, np.zeros(int(keep.sum()))])  # set by `update_rates`
                self.changed.append(conn[keep])
            self.dirty = True
            if self.on_start is not None:
                self.on_start()
        return g[pool.parts_left[g] == 0]

    def finish(self, done: IntArray) -> IntArray:
        """Flows `done` (indexes) have sent their last bit: removed; returns the transfers that have
        no flow left (their last byte sent now)."""
        parts_left = self.pool.parts_left
        ended = self.transfer[done]
        np.subtract.at(parts_left, ended, 1)
        t = sorted_unique(ended)
        drained = t[parts_left[t] == 0]
        self.changed.append(self.conn[done])
        if done.size == self.conn.size:  # every flow ended (a ring's step)
            self.conn, self.transfer = self.conn[:0], self.transfer[:0]
            self.left_bits, self.rates = self.left_bits[:0], self.rates[:0]
        else:
            keep = np.ones(self.conn.size, dtype=bool)
            keep[done] = False
            self.conn, self.transfer = self.conn[keep], self.transfer[keep]
            self.left_bits, self.rates = self.left_bits[keep], self.rates[keep]
        self.dirty = True
        return drained

    def reroute(self) -> None:
        """The routing changed: every connection's path is stale, the active flows' walked again."""
        self.paths.invalidate()
        self.paths.route(self.conn)
        self.solved_version = None
        self.dirty = True

    def update_rates(self) -> None:
        """The max-min rates of the active flows on their paths (a flow without a path: 0)."""
        order = np.argsort(self.conn, kind="stable")
        key = (self.paths.version, self.conn[order].tobytes())
        found = self.memo.get(key)
        if found is not None:
            hit = found
        else:
            rates, load = self._solve()
            if load is not None:
                self.rate_updates += 1
                used: IntArray = np.flatnonzero(load > 0).astype(np.intp)
                used_bps: FloatArray = np.asarray(load[used], dtype=np.float64)
                hit = (rates[order], used, used_bps)
            else:
                hit = (rates[order], np.zeros(0, dtype=np.intp), np.zeros(0))
            if self.memo_flows + len(order) > RATE_MEMO_FLOWS:
                self.memo.clear()
                self.memo_flows = 0
            self.memo[key] = hit
            self.memo_flows += len(order)
        self.rates = np.empty(len(order))
        self.rates[order] = hit[0]
        self.load = (hit[1], hit[2])
        self.dirty = False
        self.changed.clear()
        self.solved_version = self.paths.version

    def _solve(self) -> tuple[FloatArray, FloatArray | None]:
        """Each active flow's max-min rate (in flow order; 0 without a path) and the links' loads (None: no flow
        has a path). Max-min fairness splits over the connected components of flows and the links they cross, so
        after a solve only the components holding a link of a flow started or ended since are filled again
        (`maxmin.rates_on_routed_paths_again`): the others' flows keep their rates. A routing change solves
        everything. (The rates agree with a whole solve to the filling's tolerance: a link tying another's level
        within it freezes with it, `maxmin.REL_TOL`.)"""
        conn_path, conn_hops = self.paths.conn_path, self.paths.conn_hops
        routed = np.flatnonzero(conn_hops[self.conn] > 0)
        rates = np.zeros(self.conn.size)
        if not routed.size:
            return rates, None
        paths = conn_path[self.conn[routed]]
        if self.solved_version != self.paths.version or self.rates.size != self.conn.size:
            rates[routed], load = rates_on_routed_paths(paths, self.goodput_bps)
        else:
            changed = np.concatenate(self.changed) if self.changed else np.zeros(0, dtype=np.intp)
            rates[routed], load = rates_on_routed_paths_again(paths, self.goodput_bps, conn_path[changed].ravel(),
                                                              self.rates[routed])
        return rates, load
