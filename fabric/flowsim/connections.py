"""Which connections carry a host pair's transfers: NIC ports, planes and source ports.

The same rule as the emulation replay (`traffic.replay.plan`), re-implemented here because
`fabric` may not import `traffic`: every host pair that exchanges data gets `channels` connections
per plane both hosts are in (in the sender's NIC order); a transfer is split evenly over its pair's
connections (`fabric.transfers.split_bytes`). Source ports:
- `planned`: connection c of hosts (a, b) gets `fabric.routing.entropy.pair_sport` (the one rule
  both use): under default weights the channels of a pair take distinct equal-cost next hops,
  and the pairs of a host spread over all of them;
- `hashed`: drawn as the replay draws them, from `random.Random(seed)` in Linux's ephemeral range
  32768..60999, pairs in order of (lane, sender index, receiver index), NICs in order, channels in
  order, drawing again if the (source address, source port, destination address, lane) is taken.

Lanes: the replay gives each stream of a trace its own set of connections (a lane, to its own port of
the agents); a pair given as (sender, receiver, lane) gets that lane's connections, (sender, receiver)
lane 0's. With the same pairs, lanes and seed, the replay and the simulator get the very same ports,
so the same ECMP collisions.
"""
from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from fabric.flowsim.maxmin import FlowSimError
from fabric.model import Fabric, NicPort
from fabric.routing.entropy import EntropyPlan, pair_sport

PORT_RULES = ("planned", "hashed")
#: Linux's default ephemeral range (net.ipv4.ip_local_port_range), as the replay draws from it.
HASHED_PORTS = (32768, 61000)


@dataclass(frozen=True)
class Connection:
    """One transport connection: from NIC `src` to NIC `dst` (one plane) with source port `sport`."""

    id: int
    src: NicPort
    dst: NicPort
    channel: int
    sport: int


Pair = tuple[str, str] | tuple[str, str, int]


def plan_connections(fabric: Fabric, entropy: EntropyPlan, pairs: Iterable[Pair], *, channels: int = 2,
                     ports: str = "planned", seed: int = 0) -> dict[Pair, tuple[Connection, ...]]:
    """(sender host, receiver host[, lane]) -> its connections, for every pair in `pairs`, keyed as
    given (module docstring)."""
    if channels < 1:
        raise FlowSimError(f"channels must be >= 1, got {channels}")
    if ports not in PORT_RULES:
        raise FlowSimError(f"ports must be one of {PORT_RULES}, got {ports!r}")
    index = {h.name: h.index for h in fabric.hosts}
    given = set(pairs)
    for pair in given:
        for h in pair[:2]:
            if h not in index:
                raise FlowSimError(f"host {h!r} is not in fabric {fabric.name!r}")
        if len(pair) == 3 and not (isinstance(pair[2], int) and pair[2] >= 0):
            raise FlowSimError(f"pair {pair}: a lane is an integer >= 0")
    rng = random.Random(seed)
    used: set[tuple[object, int, object, int]] = set()  # (source address, port, destination address, lane) drawn
    out: dict[Pair, tuple[Connection, ...]] = {}
    n = 0
    for pair in sorted(given, key=lambda p: (p[2] if len(p) == 3 else 0, index[p[0]], index[p[1]])):
        a, b = pair[0], pair[1]
        lane = pair[2] if len(pair) == 3 else 0
        conns = []
        for nic in fabric.nics_of[a]:
            peer = [m for m in fabric.nics_of[b] if m.plane == nic.plane]
            if not peer:
                continue
            for ch in range(channels):
                if ports == "planned":
                    sport = pair_sport(entropy, index[a], index[b], ch, channels)
                else:
                    sport = rng.randrange(*HASHED_PORTS)
                    while (nic.ip, sport, peer[0].ip, lane) in used:
                        sport = rng.randrange(*HASHED_PORTS)
                    used.add((nic.ip, sport, peer[0].ip, lane))
                conns.append(Connection(n, nic, peer[0], ch, sport))
                n += 1
        if not conns:
            raise FlowSimError(f"hosts {a} and {b} share no plane")
        out[pair] = tuple(conns)
    return out
