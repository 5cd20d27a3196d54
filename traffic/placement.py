"""Placement: which host each rank runs on (`fabric.transfers.Placement`, rank -> host name).

- `resolve_placement(fabric, n_ranks, how)`: the `--placement` choice: `block`, `spread`, `pods`,
  `fragmented[:OCCUPANCY[:SEED]]` or a file.
- `block_placement`: consecutive ranks in equal blocks per host, in host order (several per host when there
  are more ranks than hosts; the replay plan refuses those that would exchange bytes on one host).
- `pods_placement`, `fragmented_placement`: a job on whole servers, as a cluster scheduler gives it
  (below); `server_pods`: the fabric's servers by pod.
- `placement_from_file`: a YAML or JSON mapping rank -> host (a key given twice is an error).
- `groups_by`: ranks grouped by a key of their host (e.g. its leaf switch), the `groups` of
  `traffic.collectives.schedule` for the hierarchical all-reduce.

Whole servers (`pods`, `fragmented`): a job of n_ranks = S x G ranks (G = `fabric.gpus_per_server`;
n_ranks must be a multiple of G when G > 1) gets S whole servers of the fabric, at most all of them;
rank r is GPU r % G of the job's (r // G)-th server. The G ranks of a server stay together, so with
Megatron's order a TP group of up to G ranks stays inside its server; a DP group (the ranks with one GPU
index across servers) lands on the job's servers in the job's server order.
"""
from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Hashable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml
from networkx.utils import UnionFind

from fabric.model import Fabric
from fabric.transfers import Placement, TransferError
from traffic.reach import host_pods

#: The named placements (anything else is `fragmented[:OCCUPANCY[:SEED]]` or a file).
NAMED = ("block", "spread", "pods", "fragmented")
DEFAULT_OCCUPANCY = Fraction(1, 2)
DEFAULT_SEED = 0
MAX_SEED = 2**63 - 1


def resolve_placement(fabric: Fabric, n_ranks: int, how: str) -> Placement:
    """`n_ranks` ranks on the fabric's hosts: `how` is "block" (`block_placement`), "spread" (one rank
    every len(hosts) / n_ranks hosts; block when there are more ranks than hosts), "pods"
    (`pods_placement`), "fragmented[:OCCUPANCY[:SEED]]" (`fragmented_placement`; defaults 0.5 and 0)
    or a placement file (`placement_from_file`; a file named like a placement is given as ./NAME)."""
    hosts = [h.name for h in fabric.hosts]
    if how == "block":
        return block_placement(n_ranks, hosts)
    if how == "spread":
        if n_ranks > len(hosts):
            return block_placement(n_ranks, hosts)
        step = len(hosts) / n_ranks
        return Placement(tuple(hosts[int(i * step)] for i in range(n_ranks)))
    if how == "pods":
        return pods_placement(fabric, n_ranks)
    frag = parse_fragmented(how)
    if frag is not None:
        return fragmented_placement(fabric, n_ranks, *frag)
    return placement_from_file(how, hosts)


def check_job_fits(gpus: int, fabric: Fabric, what: str) -> None:
    """Refuse a job of `gpus` GPUs (a generated training step: one GPU, so one host, per rank) on a fabric
    with fewer GPU hosts, naming both counts: block placement would put two ranks on one GPU and run their
    traffic for free."""
    have = len(fabric.hosts)
    if gpus > have:
        g = fabric.gpus_per_server
        raise TransferError(f"{what}: {gpus} GPUs do not fit on {fabric.name}, which has {have} "
                            f"({have // g} servers of {g}); use a larger fabric or fewer GPUs (e.g. a smaller "
                            f"parallel.dp)")


def check_placement(how: str) -> None:
    """Refuse a malformed named placement before any fabric is at hand (a `fragmented` spec's syntax and
    ranges); files and what a fabric can take are checked by `resolve_placement`."""
    parse_fragmented(how)


def parse_fragmented(how: str) -> tuple[Fraction, int] | None:
    """(occupancy, seed) of "fragmented", "fragmented:OCCUPANCY" or "fragmented:OCCUPANCY:SEED"; None
    for any other string. OCCUPANCY is a decimal in [0, 1) (e.g. 0.5, .75), kept exact; SEED an integer
    in 0..2^63-1."""
    name, colon, rest = how.partition(":")
    if name != "fragmented":
        return None
    if not colon:
        return DEFAULT_OCCUPANCY, DEFAULT_SEED
    form = "fragmented[:OCCUPANCY[:SEED]], e.g. fragmented:0.5:3"
    parts = rest.split(":")
    if len(parts) > 2:
        raise TransferError(f"placement {how!r}: {len(parts)} fields after 'fragmented', at most 2 ({form})")
    occ_text = parts[0]
    if not re.fullmatch(r"[0-9]+\.?[0-9]*|\.[0-9]+", occ_text):
        raise TransferError(f"placement {how!r}: occupancy {occ_text!r} is not a decimal number in [0, 1) ({form})")
    occupancy = Fraction(occ_text)
    if not 0 <= occupancy < 1:
        raise TransferError(f"placement {how!r}: occupancy must be in [0, 1) (the share of servers other jobs "
                            f"hold), got {occ_text}")
    seed = DEFAULT_SEED
    if len(parts) == 2:
        seed_text = parts[1]
        if not re.fullmatch(r"[0-9]{1,19}", seed_text) or int(seed_text) > MAX_SEED:
            raise TransferError(f"placement {how!r}: seed {seed_text!r} is not an integer in 0..2^63-1 ({form})")
        seed = int(seed_text)
    return occupancy, seed


def _job_servers(fabric: Fabric, n_ranks: int, how: str) -> int:
    """The whole servers a job of `n_ranks` ranks takes (module docstring), checked against the fabric."""
    g = fabric.gpus_per_server
    if isinstance(n_ranks, bool) or not isinstance(n_ranks, int) or n_ranks < 1:
        raise TransferError(f"{how}: n_ranks must be an integer >= 1, got {n_ranks!r}")
    if n_ranks % g:
        raise TransferError(f"{how}: {n_ranks} ranks are not whole servers of {g} GPUs (gpus_per_server); "
                            f"give a multiple of {g}, or use block or a placement file")
    servers = n_ranks // g
    if servers > fabric.servers:
        raise TransferError(f"{how}: the job needs {servers} servers ({n_ranks} ranks at {g} per server), the "
                            f"fabric has {fabric.servers}; block puts several ranks on a host")
    return servers


def _on_servers(fabric: Fabric, servers: Sequence[int], n_ranks: int) -> Placement:
    """Rank r on GPU r % G of `servers[r // G]`."""
    g = fabric.gpus_per_server
    return Placement(tuple(fabric.server_hosts(servers[r // g])[r % g] for r in range(n_ranks)))


def server_pods(fabric: Fabric) -> tuple[tuple[int, ...], ...]:
    """The fabric's servers by pod (`traffic.reach.host_pods`), servers ascending in each, pods in order
    of their lowest server. A server whose GPUs hang from several pods (a rail-wired pyramid whose pods
    hold fewer rails than a server has GPUs, e.g. pyramid-16-rail) joins those pods into one: no job of
    whole servers can be split between them."""
    pod = host_pods(fabric)
    joined = UnionFind(pod.values())
    for s in range(fabric.servers):
        joined.union(*(pod[h] for h in fabric.server_hosts(s)))
    out: dict[int, list[int]] = {}
    for s in range(fabric.servers):
        out.setdefault(joined[pod[fabric.server_hosts(s)[0]]], []).append(s)
    return tuple(tuple(servers) for servers in out.values())


def pods_placement(fabric: Fabric, n_ranks: int) -> Placement:
    """The job's S whole servers spread evenly over the fabric's pods (`server_pods`), in pod order:
    with P pods and S >= P, S must be a multiple of P and each pod gives its first S / P servers
    (ascending); with S < P, the first S pods give their first server each. The job's servers run pod
    by pod, so a DP group (one GPU index across the job's servers) spans min(S, P) pods.

    Unlike `spread`, which strides GPUs (one rank every len(hosts) / n_ranks hosts, blind to servers
    and pods: with G > 1 it puts ranks of one TP group on different servers), `pods` moves whole servers
    and follows the fabric's pods. On a fabric of one pod (a 2-tier leaf-spine or dual-plane Clos, a
    mesh, a one-pod pyramid) it is `block`."""
    servers = _job_servers(fabric, n_ranks, "pods")
    pods = server_pods(fabric)
    used = pods[:servers]
    per_pod, rest = divmod(servers, len(used))
    if rest:
        raise TransferError(f"pods: {servers} servers ({n_ranks} ranks) do not split evenly over the fabric's "
                            f"{len(pods)} pods; give a multiple of {len(pods)} servers (a multiple of "
                            f"{len(pods) * fabric.gpus_per_server} ranks) or at most {len(pods)} (one per pod)")
    for i, p in enumerate(used):
        if len(p) < per_pod:
            raise TransferError(f"pods: {servers} servers over {len(used)} pods need {per_pod} per pod; pod {i} "
                                f"has {len(p)}")
    return _on_servers(fabric, [s for p in used for s in p[:per_pod]], n_ranks)


def fragmented_placement(fabric: Fabric, n_ranks: int, occupancy: Fraction | float = DEFAULT_OCCUPANCY,
                         seed: int = DEFAULT_SEED) -> Placement:
    """The job on a partly occupied cluster: first floor(occupancy x servers) of the fabric's servers
    (exact decimal arithmetic: 0.29 of 100 servers is 29) are held by other jobs, then the job's S
    servers are drawn from the free ones, both at random with one `random.Random(seed)`:

        rng = random.Random(seed)
        occupied = set(rng.sample(range(servers), floor(occupancy * servers)))
        job = sorted(rng.sample([s for s in range(servers) if s not in occupied], S))

    The job's servers are used in ascending order, as a scheduler (Slurm) hands out its node list
    sorted by name: rank r is GPU r % G of the (r // G)-th lowest-numbered server drawn. Occupancy 0
    draws the job's servers from the whole fabric."""
    occ = Fraction(str(occupancy)) if isinstance(occupancy, float) else Fraction(occupancy)
    if not 0 <= occ < 1:
        raise TransferError(f"fragmented: occupancy must be in [0, 1) (the share of servers other jobs hold), "
                            f"got {occupancy}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise TransferError(f"fragmented: seed must be an integer in 0..2^63-1, got {seed!r}")
    servers = _job_servers(fabric, n_ranks, "fragmented")
    rng = random.Random(seed)
    taken = math.floor(occ * fabric.servers)
    occupied = set(rng.sample(range(fabric.servers), taken))
    free = [s for s in range(fabric.servers) if s not in occupied]
    if len(free) < servers:
        raise TransferError(f"fragmented: the job needs {servers} servers ({n_ranks} ranks), {len(free)} are free "
                            f"({taken} of the fabric's {fabric.servers} occupied at occupancy {float(occ):g}); "
                            "lower the occupancy or the ranks")
    return _on_servers(fabric, sorted(rng.sample(free, servers)), n_ranks)


def block_placement(n_ranks: int, hosts: Sequence[str]) -> Placement:
    """Ranks in blocks of ceil(n_ranks / len(hosts)) consecutive ranks per host, in host order (fewer
    ranks than hosts: one per host, the first n_ranks hosts). Every host used gets the same count, as
    a job has the same number of GPUs per host: a count that would leave the last host partly filled
    (e.g. 5 ranks on 4 hosts) is an error.

    Several ranks per host are allowed here on purpose: this is a rule over host names, used by the
    collectives' own tests and by placements whose co-located ranks exchange nothing with one another.
    A host of the model is one GPU (a server of G GPUs is G hosts), so ranks on one host that do move
    bytes between them would move them for free; the replay plan, which both backends run, refuses that
    case, naming the rank and host counts (`traffic.replay.plan`, issue 42, defect 4), as
    `check_job_fits` refuses a generated step larger than its fabric."""
    if n_ranks < 1:
        raise TransferError(f"n_ranks must be >= 1, got {n_ranks}")
    if not hosts:
        raise TransferError("no hosts to place ranks on")
    dup = sorted({h for h in hosts if list(hosts).count(h) > 1})
    if dup:
        raise TransferError(f"duplicate host names {dup}")
    per_host = -(-n_ranks // len(hosts))
    if n_ranks % per_host:
        raise TransferError(f"{n_ranks} ranks do not fill hosts evenly at {per_host} per host "
                            f"({len(hosts)} hosts); use a multiple of {per_host} or a placement file")
    return Placement(tuple(hosts[r // per_host] for r in range(n_ranks)))


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that rejects a key given twice (PyYAML keeps the last one silently)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in out:
            raise TransferError(f"key {key!r} given twice (line {key_node.start_mark.line + 1})")
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _json_unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise TransferError(f"key {k!r} given twice")
        out[k] = v
    return out


def placement_from_file(path: str | Path, hosts: Sequence[str]) -> Placement:
    """A placement from a YAML or JSON file (JSON for a .json suffix) holding a mapping rank -> host
    name, e.g. `{0: h1, 1: h1, 2: h2}`. Every rank 0..n-1 must appear exactly once and every host must
    be one of `hosts` (the fabric's host names)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TransferError(f"{p}: cannot read placement file: {e.strerror or e}") from None
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text, object_pairs_hook=_json_unique)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: safe
    except TransferError as e:
        raise TransferError(f"{p}: {e}") from None
    except (ValueError, yaml.YAMLError) as e:
        raise TransferError(f"{p}: not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: {e}") from None
    if not isinstance(data, dict) or not data:
        raise TransferError(f"{p}: expected a non-empty mapping rank -> host, got {type(data).__name__}")
    by_rank: dict[int, str] = {}
    for key, host in data.items():
        rank = _rank_key(key)
        if rank is None:
            raise TransferError(f"{p}: {key!r} is not a rank (a non-negative integer)")
        if rank in by_rank:
            raise TransferError(f"{p}: rank {rank} given twice")
        if not isinstance(host, str) or host not in hosts:
            known = ", ".join(list(hosts)[:8]) + (", ..." if len(hosts) > 8 else "")
            raise TransferError(f"{p}: rank {rank}: {host!r} is not a host of the fabric ({known})")
        by_rank[rank] = host
    missing = [r for r in range(len(by_rank)) if r not in by_rank]
    if missing:
        raise TransferError(f"{p}: ranks must be 0..{len(by_rank) - 1} each once; missing {missing}, "
                            f"present {sorted(by_rank)}")
    return Placement(tuple(by_rank[r] for r in range(len(by_rank))))


def _rank_key(key: object) -> int | None:
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key if key >= 0 else None
    if isinstance(key, str) and key.strip().isdigit():
        return int(key.strip())
    return None


def groups_by(placement: Placement, key: Callable[[str], Hashable]) -> tuple[tuple[int, ...], ...]:
    """Ranks grouped by `key(host)` (e.g. the host's leaf switch): groups in order of their lowest
    rank, ranks ascending inside a group; for `traffic.collectives.schedule(..., groups=...)`."""
    out: dict[Hashable, list[int]] = {}
    for rank, host in enumerate(placement.hosts):
        out.setdefault(key(host), []).append(rank)
    return tuple(tuple(g) for g in out.values())
