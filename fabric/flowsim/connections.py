"""Which connections carry a host pair's transfers: NIC ports, planes and source ports.

The one rule, for the simulator and the emulation replay alike (`traffic.replay.plan` plans its agents'
connections with `plan_connection_table`): every host pair that exchanges data gets `channels` connections
per plane both hosts are in (in the sender's NIC order; NCCL_IB_MERGE_NICS=1, a dual-port NIC's channels
striped over its ports), or with `merge_nics` off `channels` in all, whole channels alternating over the
planes; a transfer is split evenly over its pair's connections (`fabric.transfers.split_bytes`). Source ports:
- `planned`: connection c of hosts (a, b) gets `fabric.routing.entropy.pair_sport` (the one rule
  both use): under default weights the channels of a pair take distinct equal-cost next hops,
  and the pairs of a host spread over all of them, as do a leaf's pairs at a constant distance
  (a pipeline's stages, a ring across leaves);
- `hashed`: drawn from `random.Random(seed)` in Linux's ephemeral range
  32768..60999, pairs in order of (lane, sender index, receiver index), NICs in order, channels in
  order, drawing again if the (source address, source port, destination address, lane) is taken.

Lanes: the replay gives each stream of a trace its own set of connections (a lane, to its own port of
the agents); a pair given as (sender, receiver, lane) gets that lane's connections, (sender, receiver)
lane 0's. With the same pairs, lanes and seed, the replay and the simulator get the very same ports,
so the same ECMP collisions.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fabric.flowsim.maxmin import FlowSimError, IntArray
from fabric.model import Fabric, NicPort
from fabric.analysis import edge_order
from fabric.routing.entropy import EPHEMERAL_BASE, EntropyPlan, pair_sport, twist_blocks

PORT_RULES = ("planned", "hashed")
#: Linux's default ephemeral range (net.ipv4.ip_local_port_range), as the replay draws from it.
HASHED_PORTS = (32768, 61000)


@dataclass(frozen=True)
class Connection:
    """One transport connection: from NIC `src` to NIC `dst` (one plane) with source port `sport`, on lane
    `lane` (its host pair's set of connections), to destination port `dport` (the replay's agents listen on
    one port per lane; 0 where no port is planned). The one connection type of both backends."""

    id: int
    src: NicPort
    dst: NicPort
    channel: int
    sport: int
    lane: int = 0
    dport: int = 0

    @property
    def src_host(self) -> str:
        return self.src.host

    @property
    def dst_host(self) -> str:
        return self.dst.host

    @property
    def plane(self) -> str:
        return self.src.plane

    @property
    def src_ip(self) -> str:
        return str(self.src.ip)

    @property
    def dst_ip(self) -> str:
        return str(self.dst.ip)


Pair = tuple[str, str] | tuple[str, str, int]


@dataclass(frozen=True, eq=False)
class ConnectionTable:
    """Every connection of a set of host pairs, as arrays (an all-to-all at 1024 hosts has 1M pairs and
    2-4M connections: objects would not fit). Pairs are keyed `(lane x hosts + sender) x hosts + receiver`
    (host positions in `fabric.hosts`), ascending in `pair_key`; pair i's connections are ids
    `pair_ptr[i]:pair_ptr[i + 1]`, in the sender's NIC order, then channel order. NICs are indexes into
    `fabric.nic_ports`."""

    fabric: Fabric
    pair_key: IntArray
    pair_ptr: IntArray
    src_nic: IntArray
    dst_nic: IntArray
    channel: IntArray
    sport: IntArray

    def __len__(self) -> int:
        return int(self.src_nic.size)

    def connection(self, c: int, dport_base: int = 0) -> Connection:
        """Connection `c` as an object; its destination port `dport_base` + its lane (the replay's agents
        listen on one port per lane from `dport_base`), 0 where `dport_base` is 0."""
        nics = self.fabric.nic_ports
        lane = int(self.pair_lane[self.pair_of_connection[c]])
        return Connection(c, nics[int(self.src_nic[c])], nics[int(self.dst_nic[c])], int(self.channel[c]),
                          int(self.sport[c]), lane, dport_base + lane if dport_base else 0)

    def connections(self, dport_base: int = 0) -> tuple[Connection, ...]:
        """Every connection as an object (`connection`), in id order."""
        return tuple(self.connection(c, dport_base) for c in range(len(self)))

    def pair_of(self, keys: IntArray) -> IntArray:
        """The pair index of each of `keys` (which must be among `pair_key`)."""
        return np.searchsorted(self.pair_key, keys).astype(np.intp)

    @cached_property
    def pair_of_connection(self) -> IntArray:
        return np.repeat(np.arange(self.pair_key.size, dtype=np.intp), np.diff(self.pair_ptr))

    @cached_property
    def pair_lane(self) -> IntArray:
        """Each pair's lane (`pair_key` decoded)."""
        n = len(self.fabric.hosts)
        return self.pair_key // (n * n)

    @cached_property
    def pair_hosts(self) -> tuple[IntArray, IntArray]:
        """Each pair's (sender, receiver) host positions (`pair_key` decoded)."""
        n = len(self.fabric.hosts)
        return self.pair_key // n % n, self.pair_key % n


def sorted_unique(values: IntArray) -> IntArray:
    """The distinct values, ascending: numpy's `unique` without its overhead (it hashes, slower on the
    millions of keys planned here, and its set-up adds up over the simulator's many small batches per
    event); values that come sorted, as a schedule's and a ring step's do, are not sorted again."""
    if values.size < 2:
        return values
    v = values if bool((values[1:] >= values[:-1]).all()) else np.sort(values)
    return v[np.concatenate(([True], v[1:] != v[:-1]))]


def pair_key(n_hosts: int, sender: IntArray | int, receiver: IntArray | int, lane: IntArray | int = 0) -> IntArray:
    """`ConnectionTable`'s key of host pairs (host positions), on lane `lane`."""
    return (np.asarray(lane, dtype=np.int64) * n_hosts + sender) * n_hosts + receiver


def plan_connection_table(fabric: Fabric, entropy: EntropyPlan, pair_keys: IntArray, *, channels: int = 2,
                          ports: str = "planned", seed: int = 0, merge_nics: bool = True) -> ConnectionTable:
    """The connections of the host pairs `pair_keys` (`pair_key`'s; duplicates dropped), by the module's rule;
    `merge_nics` False: `channels` connections a pair in all, channel c on the c-th (mod their count) plane
    both hosts are in (NCCL_IB_MERGE_NICS=0: each port its own NIC, whole channels alternating over them)."""
    if channels < 1:
        raise FlowSimError(f"channels must be >= 1, got {channels}")
    if ports not in PORT_RULES:
        raise FlowSimError(f"ports must be one of {PORT_RULES}, got {ports!r}")
    n = len(fabric.hosts)
    keys = sorted_unique(np.asarray(pair_keys, dtype=np.int64))
    if keys.size and keys[0] < 0:
        raise FlowSimError(f"pair key {int(keys[0])} is negative")
    sender, receiver = keys // n % n, keys % n
    # each host's NICs in order, and its NIC in each plane (at most one per plane: the model's rule)
    nics = fabric.nic_ports
    plane_of = {p.name: i for i, p in enumerate(fabric.planes)}
    host_pos = {h.name: i for i, h in enumerate(fabric.hosts)}
    width = max((len(v) for v in fabric.nics_of.values()), default=0)
    own = np.full((n, max(width, 1)), -1, dtype=np.int64)  # host -> its i-th NIC
    in_plane = np.full((n, len(fabric.planes)), -1, dtype=np.int64)  # host -> its NIC in the plane
    nic_plane = np.zeros(len(nics), dtype=np.int64)
    for i, p in enumerate(nics):
        h = host_pos[p.host]
        own[h, int((own[h] >= 0).sum())] = i
        in_plane[h, plane_of[p.plane]] = i
        nic_plane[i] = plane_of[p.plane]
    src = own[sender]  # (pairs, width): the sender's NICs
    dst = np.where(src >= 0, in_plane[receiver[:, None], nic_plane[np.maximum(src, 0)]], -1)
    ok = (src >= 0) & (dst >= 0)
    none = np.flatnonzero(~ok.any(axis=1)) if keys.size else np.zeros(0, dtype=np.intp)
    if none.size:
        names = [h.name for h in fabric.hosts]
        raise FlowSimError(f"hosts {names[int(sender[none[0]])]} and {names[int(receiver[none[0]])]} share no plane")
    # connections in pair order, the sender's NICs in order, channels in order
    if not merge_nics:  # channel c on the pair's (c mod shared)-th shared NIC, in the sender's NIC order
        shared = ok.sum(axis=1)
        column = np.argsort(~ok, axis=1, kind="stable")  # each pair's shared NICs first, in order
        channel = np.tile(np.arange(channels, dtype=np.int64), keys.size)
        pick = column[np.repeat(np.arange(keys.size), channels), channel % np.repeat(shared, channels)]
        src_nic = src[np.repeat(np.arange(keys.size), channels), pick]
        dst_nic = dst[np.repeat(np.arange(keys.size), channels), pick]
        counts = np.full(keys.size, channels, dtype=np.int64)
    elif bool(ok.all()):  # the usual fabric: every pair shares every plane its sender is in
        src_nic, dst_nic = np.repeat(src.ravel(), channels), np.repeat(dst.ravel(), channels)
        channel = np.tile(np.arange(channels, dtype=np.int64), ok.size)
        counts = np.full(keys.size, ok.shape[1] * channels, dtype=np.int64)
    else:
        per_nic = np.repeat(ok, channels, axis=1)
        src_nic = np.repeat(src, channels, axis=1)[per_nic]
        dst_nic = np.repeat(dst, channels, axis=1)[per_nic]
        channel = np.broadcast_to(np.tile(np.arange(channels, dtype=np.int64), ok.shape[1]), per_nic.shape)[per_nic]
        counts = per_nic.sum(axis=1)
    pair_ptr = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)]).astype(np.intp)
    which = np.repeat(np.arange(keys.size), counts)
    if ports == "planned":
        # a host's place in edge-switch order, not its index: the rule counts on through the hosts of a
        # leaf, and on a rail-wired fabric a leaf's hosts are every G-th index (GPU g of each server), so
        # counting by index would put all of a leaf's flows to one peer leaf on the same few uplinks
        order = {name: i for i, name in enumerate(edge_order(fabric))}
        index = np.asarray([order[h.name] for h in fabric.hosts], dtype=np.int64)
        if merge_nics:
            sport = planned_sports(entropy, index[sender[which]], index[receiver[which]], channel, channels)
        else:  # a plane's channels of the pair counted among themselves: the rule spreads each plane's own
            shared = ok.sum(axis=1)
            per_plane = -(-channels // max(1, int(shared.min()) if shared.size else 1))
            nth = channel // np.repeat(shared, channels)
            sport = planned_sports(entropy, index[sender[which]], index[receiver[which]], nth, per_plane)
    else:
        sport = _hashed_sports(src_nic.size, channels, seed)
    return ConnectionTable(fabric, keys, pair_ptr, src_nic.astype(np.intp), dst_nic.astype(np.intp),
                           channel, sport)


def planned_sports(entropy: EntropyPlan, src_index: IntArray, dst_index: IntArray, channel: IntArray,
                   channels: int) -> IntArray:
    """`pair_sport` for arrays of connections: the rule's count, then its mixed-radix slots
    (`sports_of_counts`)."""
    if not entropy.fields:  # no decisions anywhere: the channels only need ports of their own
        return EPHEMERAL_BASE + 2 * np.asarray(channel, dtype=np.int64)
    if src_index.size:  # the rule's own checks, once (channel and channels are the same everywhere)
        pair_sport(entropy, 0, 0, int(channel.max()), channels)
    blocks = twist_blocks(entropy, channels)
    twist = sum((src_index // b for b in blocks), np.zeros_like(src_index)) % 2  # `source_twist`, on arrays
    return sports_of_counts(entropy, channels * (src_index + dst_index + twist) + channel)


def sports_of_counts(entropy: EntropyPlan, count: IntArray) -> IntArray:
    """The source port of each of `count` (>= 0) as `pair_sport` turns its count into one: the mixed-radix
    count over the tiers' slots, the ports of the few distinct slot combinations looked up once each."""
    w = np.asarray(count, dtype=np.int64)
    tiers = sorted(entropy.fields)
    slots = []
    for tier in tiers:
        slots.append(w % entropy.slots(tier))
        w = w // entropy.fan_outs[tier]
    code = np.zeros(w.size, dtype=np.int64)
    for tier, s in zip(tiers, slots):
        code = code * entropy.slots(tier) + s
    # the combinations number at most 2^13 (the slot fields' bits): a table over all of them
    table = np.zeros(math.prod(entropy.slots(t) for t in tiers), dtype=np.int64)
    for c in np.flatnonzero(np.bincount(code, minlength=table.size)).tolist():
        chosen, rest = {}, c
        for tier in reversed(tiers):
            chosen[tier] = rest % entropy.slots(tier)
            rest //= entropy.slots(tier)
        table[c] = entropy.src_port_for(chosen)
    return table[code]


def _hashed_sports(n_connections: int, channels: int, seed: int) -> IntArray:
    """Source ports drawn as the replay draws them: one `random.Random(seed)` in connection order, drawing
    again while (source NIC, port, destination NIC, lane) is taken. A NIC pair's `channels` connections
    are consecutive (with `merge_nics` off, a host pair's: checked together, a superset) and no other
    connection has its (source NIC, destination NIC, lane), so only a
    connection's earlier siblings can take its port: the draws are checked a block of pairs at a time on
    arrays, and only a pair that drew a port twice is redrawn one by one (~1 in 14,000 for 2 channels)."""
    rng = random.Random(seed)
    lo, hi = HASHED_PORTS
    stream: list[int] = []

    def drawn(upto: int) -> None:  # the stream's first `upto` values drawn
        if upto > len(stream):
            stream.extend(rng.randrange(lo, hi) for _ in range(upto - len(stream)))

    groups = n_connections // channels
    out = np.empty((groups, channels), dtype=np.int64)
    g = extra = 0  # next pair; values drawn again so far
    while g < groups:
        end = min(groups, g + _HASHED_BLOCK)
        drawn(end * channels + extra)
        block = np.asarray(stream[g * channels + extra:end * channels + extra], dtype=np.int64).reshape(-1, channels)
        ordered = np.sort(block, axis=1)
        twice = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
        first = int(np.argmax(twice)) if bool(twice.any()) else end - g
        out[g:g + first] = block[:first]
        g += first
        if g == end:
            continue
        at = g * channels + extra  # pair g drew a port twice: its draws one by one
        taken: list[int] = []
        for _ in range(channels):
            drawn(at + 1)
            sport = stream[at]
            at += 1
            while sport in taken:
                drawn(at + 1)
                sport = stream[at]
                at += 1
            taken.append(sport)
        out[g] = taken
        g += 1
        extra = at - g * channels
    return out.reshape(-1)


#: pairs whose hashed ports are checked together
_HASHED_BLOCK = 1 << 16


def plan_connections(fabric: Fabric, entropy: EntropyPlan, pairs: Iterable[Pair], *, channels: int = 2,
                     ports: str = "planned", seed: int = 0, merge_nics: bool = True) -> dict[Pair, tuple[Connection, ...]]:
    """(sender host, receiver host[, lane]) -> its connections, for every pair in `pairs`, keyed as
    given (module docstring; `plan_connection_table` as objects, for small sets)."""
    index = {h.name: i for i, h in enumerate(fabric.hosts)}
    given = set(pairs)
    for pair in given:
        for h in pair[:2]:
            if h not in index:
                raise FlowSimError(f"host {h!r} is not in fabric {fabric.name!r}")
        if len(pair) == 3 and not (isinstance(pair[2], int) and pair[2] >= 0):
            raise FlowSimError(f"pair {pair}: a lane is an integer >= 0")
    n = len(fabric.hosts)
    key_of = {p: (p[2] if len(p) == 3 else 0) * n * n + index[p[0]] * n + index[p[1]] for p in given}
    table = plan_connection_table(fabric, entropy, np.asarray(sorted(key_of.values()), dtype=np.int64),
                                  channels=channels, ports=ports, seed=seed, merge_nics=merge_nics)
    at = {int(k): i for i, k in enumerate(table.pair_key.tolist())}
    return {p: tuple(table.connection(c) for c in range(int(table.pair_ptr[at[k]]), int(table.pair_ptr[at[k] + 1])))
            for p, k in key_of.items()}
