"""Topology files (YAML): read, validate, write.

Two forms. A builder with parameters:

    name: dual-plane-16
    builder: dual_plane
    params: {hosts: 16, hosts_per_leaf: 4, spines_per_plane: 2, nic_rate_gbps: 200}

or nodes and links listed explicitly (ports optional: numbered in link order when omitted):

    name: tiny
    planes: [{name: A, subnet: 198.18.0.0/16}]
    switches: [{name: leaf0, role: leaf, plane: A}]
    hosts: [h0, h1]
    links: [{a: h0, b: leaf0, rate_gbps: 100}, {a: h1, b: leaf0, rate_gbps: 100}]

The file's structure is checked by a pydantic schema; the fabric's meaning by `fabric.model`.
"""
from __future__ import annotations

import ipaddress
from collections import defaultdict
from pathlib import Path
from typing import Any, Union

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict

from fabric.builders import build
from fabric.errors import TopologyError
from fabric.model import DEFAULT_SUBNETS, Endpoint, Fabric, Host, Link, Plane, Switch

#: Where the shipped topologies live (repository checkout or editable install).
TOPOLOGY_DIR = Path(__file__).resolve().parent.parent / "topologies"
DEFAULT_TOPOLOGY = TOPOLOGY_DIR / "dual-plane-16.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlaneSpec(_Strict):
    name: str
    subnet: str | None = None


class SwitchSpec(_Strict):
    name: str
    role: str
    plane: str
    dpid: int | None = None


class HostSpec(_Strict):
    name: str


class LinkSpec(_Strict):
    a: str
    b: str
    rate_gbps: float
    a_port: int | None = None
    b_port: int | None = None


class ExplicitSpec(_Strict):
    name: str
    planes: list[Union[str, PlaneSpec]]
    switches: list[SwitchSpec]
    hosts: list[Union[str, HostSpec]]
    links: list[LinkSpec]


class BuilderSpec(_Strict):
    name: str | None = None
    builder: str
    params: dict[str, Any] = {}


def _schema_error(source: str, err: pydantic.ValidationError) -> TopologyError:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        lines.append(f"  {loc}: {e['msg']}")
    return TopologyError(f"{source}: invalid topology:\n" + "\n".join(lines))


def from_dict(data: Any, source: str = "topology") -> Fabric:
    """Build a Fabric from the parsed YAML/JSON form (builder or explicit)."""
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        if "builder" in data:
            bspec = BuilderSpec.model_validate(data)
            params = dict(bspec.params)
            if bspec.name is not None:
                params.setdefault("name", bspec.name)
            try:
                return build(bspec.builder, params)
            except TopologyError as e:
                raise TopologyError(f"{source}: {e}") from None
        spec = ExplicitSpec.model_validate(data)
    except pydantic.ValidationError as e:
        raise _schema_error(source, e) from None
    try:
        return _explicit(spec)
    except TopologyError as e:
        raise TopologyError(f"{source}: {e}") from None


def _explicit(spec: ExplicitSpec) -> Fabric:
    planes = []
    for i, p in enumerate(spec.planes):
        ps = PlaneSpec(name=p) if isinstance(p, str) else p
        subnet = ps.subnet
        if subnet is None:
            if i >= len(DEFAULT_SUBNETS):
                raise TopologyError(f"plane {ps.name!r}: give a subnet (only {len(DEFAULT_SUBNETS)} defaults)")
            subnet = DEFAULT_SUBNETS[i]
        try:
            net = ipaddress.IPv4Network(subnet)
        except ValueError as e:
            raise TopologyError(f"plane {ps.name!r}: bad subnet {subnet!r}: {e}") from None
        planes.append(Plane(ps.name, net))
    switches = tuple(
        Switch(name=s.name, role=s.role, plane=s.plane, dpid=s.dpid if s.dpid is not None else i + 1)
        for i, s in enumerate(spec.switches)
    )
    host_names = [h if isinstance(h, str) else h.name for h in spec.hosts]
    hosts = tuple(Host(n, i) for i, n in enumerate(host_names))
    switch_names = {s.name for s in switches}
    # Auto-number ports after the explicitly given ones on each node.
    taken: dict[str, set[int]] = defaultdict(set)
    for ls in spec.links:
        if ls.a_port is not None:
            taken[ls.a].add(ls.a_port)
        if ls.b_port is not None:
            taken[ls.b].add(ls.b_port)

    def next_port(node: str) -> int:
        port = 1 if node in switch_names else 0
        while port in taken[node]:
            port += 1
        taken[node].add(port)
        return port

    links = []
    for ls in spec.links:
        pa = ls.a_port if ls.a_port is not None else next_port(ls.a)
        pb = ls.b_port if ls.b_port is not None else next_port(ls.b)
        links.append(Link(Endpoint(ls.a, pa), Endpoint(ls.b, pb), ls.rate_gbps))
    return Fabric(name=spec.name, planes=tuple(planes), switches=switches, hosts=hosts, links=tuple(links))


def to_dict(fab: Fabric) -> dict[str, Any]:
    """The explicit form of a fabric; `from_dict(to_dict(f)) == f`."""
    return {
        "name": fab.name,
        "planes": [{"name": p.name, "subnet": str(p.subnet)} for p in fab.planes],
        "switches": [{"name": s.name, "role": s.role, "plane": s.plane, "dpid": s.dpid} for s in fab.switches],
        "hosts": [h.name for h in fab.hosts],
        "links": [
            {"a": l.a.node, "a_port": l.a.port, "b": l.b.node, "b_port": l.b.port, "rate_gbps": l.rate_gbps}
            for l in fab.links
        ],
    }


def loads(text: str, source: str = "topology") -> Fabric:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TopologyError(f"{source}: not valid YAML: {e}") from None
    return from_dict(data, source)


def load(path: str | Path) -> Fabric:
    """Read a topology file. A bare name like `dual-plane-16` finds a shipped topology."""
    p = Path(path)
    if not p.exists() and not p.suffix and (TOPOLOGY_DIR / f"{p}.yaml").exists():
        p = TOPOLOGY_DIR / f"{p}.yaml"
    try:
        text = p.read_text()
    except OSError as e:
        raise TopologyError(f"{path}: cannot read topology file: {e.strerror}") from None
    return loads(text, source=str(path))


def dumps(fab: Fabric) -> str:
    return yaml.safe_dump(to_dict(fab), sort_keys=False, default_flow_style=None, width=120)
