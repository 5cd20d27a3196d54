"""Placement: which host each rank runs on (`fabric.transfers.Placement`, rank -> host name).

- `resolve_placement(fabric, n_ranks, how)`: the `--placement` choice, `block`, `spread` or a file.
- `block_placement`: consecutive ranks in equal blocks per host, in host order.
- `placement_from_file`: a YAML or JSON mapping rank -> host (a key given twice is an error).
- `groups_by`: ranks grouped by a key of their host (e.g. its leaf switch), the `groups` of
  `traffic.collectives.schedule` for the hierarchical all-reduce.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from fabric.model import Fabric
from fabric.transfers import Placement, TransferError


def resolve_placement(fabric: Fabric, n_ranks: int, how: str) -> Placement:
    """`n_ranks` ranks on the fabric's hosts: `how` is "block" (`block_placement`), "spread" (one rank
    every len(hosts) / n_ranks hosts; block when there are more ranks than hosts) or a placement file
    (`placement_from_file`)."""
    hosts = [h.name for h in fabric.hosts]
    if how == "block":
        return block_placement(n_ranks, hosts)
    if how == "spread":
        if n_ranks > len(hosts):
            return block_placement(n_ranks, hosts)
        step = len(hosts) / n_ranks
        return Placement(tuple(hosts[int(i * step)] for i in range(n_ranks)))
    return placement_from_file(how, hosts)


def block_placement(n_ranks: int, hosts: Sequence[str]) -> Placement:
    """Ranks in blocks of ceil(n_ranks / len(hosts)) consecutive ranks per host, in host order (fewer
    ranks than hosts: one per host, the first n_ranks hosts). Every host used gets the same count, as
    a job has the same number of GPUs per host: a count that would leave the last host partly filled
    (e.g. 5 ranks on 4 hosts) is an error."""
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


def groups_by(placement: Placement, key: Callable[[str], str]) -> tuple[tuple[int, ...], ...]:
    """Ranks grouped by `key(host)` (e.g. the host's leaf switch): groups in order of their lowest
    rank, ranks ascending inside a group; for `traffic.collectives.schedule(..., groups=...)`."""
    out: dict[str, list[int]] = {}
    for rank, host in enumerate(placement.hosts):
        out.setdefault(key(host), []).append(rank)
    return tuple(tuple(g) for g in out.values())
