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
    gpus_per_server: 2      # optional (default 1): hosts 2s, 2s+1 are the GPUs of server s
    nvlink_gbps: 3600       # optional: in-server bandwidth per GPU each way (needed when gpus_per_server > 1)

The file's structure is checked by a pydantic schema; the fabric's meaning by `fabric.model`.
Before either, the limits of `fabric.limits`: the file's size and encoding (UTF-8), then a streaming
scan of the YAML for nesting depth and node count (PyYAML recurses per level and holds every node),
then the counts of hosts, switches and links, each refused with a `TopologyError` naming the file.
"""
from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict

from fabric.builders import build
from fabric.errors import TopologyError
from fabric.limits import (
    MAX_TOPOLOGY_FILE_BYTES,
    MAX_YAML_INT_BITS,
    MAX_YAML_NESTING_LEVELS,
    MAX_YAML_NODES,
    check_sizes,
)
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
    gpus_per_server: int = 1
    nvlink_gbps: float = 0.0


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
            return build(bspec.builder, params)
        _check_list_lengths(data)
        spec = ExplicitSpec.model_validate(data)
    except TopologyError as e:
        raise TopologyError(f"{source}: {e}") from None
    except pydantic.ValidationError as e:
        raise _schema_error(source, e) from None
    try:
        return _explicit(spec)
    except TopologyError as e:
        raise TopologyError(f"{source}: {e}") from None


def _check_list_lengths(data: dict[Any, Any]) -> None:
    """The explicit form's counts, refused before the schema or the model spends time on them."""

    def length(key: str) -> int:
        items = data.get(key)
        return len(items) if isinstance(items, list) else 0

    check_sizes("explicit form", length("hosts"), length("switches"), length("links"), length("planes"))


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

    # The lowest free port only rises (explicit ports are fixed up front), so each node keeps a cursor:
    # restarting from the bottom each time is quadratic for a switch with many explicit ports.
    cursor: dict[str, int] = {}

    def next_port(node: str) -> int:
        port = cursor.get(node, 1 if node in switch_names else 0)
        while port in taken[node]:
            port += 1
        taken[node].add(port)
        cursor[node] = port + 1
        return port

    links = []
    for ls in spec.links:
        pa = ls.a_port if ls.a_port is not None else next_port(ls.a)
        pb = ls.b_port if ls.b_port is not None else next_port(ls.b)
        links.append(Link(Endpoint(ls.a, pa), Endpoint(ls.b, pb), ls.rate_gbps))
    return Fabric(name=spec.name, planes=tuple(planes), switches=switches, hosts=hosts, links=tuple(links),
                  gpus_per_server=spec.gpus_per_server, nvlink_gbps=spec.nvlink_gbps)


def to_dict(fab: Fabric) -> dict[str, Any]:
    """The explicit form of a fabric; `from_dict(to_dict(f)) == f`. Servers (`gpus_per_server`,
    `nvlink_gbps`) are written only when the fabric has them, so a fabric without stays as it was."""
    servers: dict[str, Any] = {}
    if fab.gpus_per_server > 1 or fab.nvlink_gbps:
        servers = {"gpus_per_server": fab.gpus_per_server, "nvlink_gbps": fab.nvlink_gbps}
    return {
        "name": fab.name,
        **servers,
        "planes": [{"name": p.name, "subnet": str(p.subnet)} for p in fab.planes],
        "switches": [{"name": s.name, "role": s.role, "plane": s.plane, "dpid": s.dpid} for s in fab.switches],
        "hosts": [h.name for h in fab.hosts],
        "links": [
            {"a": l.a.node, "a_port": l.a.port, "b": l.b.node, "b_port": l.b.port, "rate_gbps": l.rate_gbps}
            for l in fab.links
        ],
    }


#: libyaml's parser when PyYAML was built with it (4x faster on large files), else the pure-Python one.
_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc]
    """PyYAML's safe loader, for documents `_scan` has bounded: integers of at most 64 bits, merge keys
    (`<<`) that cannot expand exponentially, and a value Python cannot convert (a date like 2001-13-45)
    reported with its line instead of escaping as a ValueError."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.mapping_entries = 0

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as e:
            shown = f" {node.value[:40]!r}" if isinstance(node, yaml.ScalarNode) else ""
            raise yaml.constructor.ConstructorError(None, None, f"cannot read{shown}: {e}", node.start_mark) from None

    def construct_bounded_int(self, node: yaml.ScalarNode) -> int:
        # Judged by its length first: Python refuses (and slowly) to convert 4,300 decimal digits or more.
        # 64 bits need at most "-0b" and 64 digits.
        length = len(str(node.value).replace("_", ""))
        value = int(self.construct_yaml_int(node)) if length <= MAX_YAML_INT_BITS + 3 else None
        if value is None or value.bit_length() > MAX_YAML_INT_BITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {length:,} characters is beyond {MAX_YAML_INT_BITS} bits", node.start_mark)
        return value

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Each merge copies the merged mappings' entries, so nested merges of merges grow exponentially
        # (a "billion laughs"); count every entry flattened and stop at the document's node limit.
        super().flatten_mapping(node)
        self.mapping_entries += len(node.value)
        if self.mapping_entries > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"mappings (merge keys included) hold more than {MAX_YAML_NODES:,} entries", node.start_mark)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_bounded_int)


def _scan(text: str, source: str, loader: Any = _BaseLoader) -> None:
    """Refuse a document nested deeper than MAX_YAML_NESTING_LEVELS or with more than MAX_YAML_NODES nodes.

    Reads the parser's event stream, which is iterative and holds no nodes; stops at the first excess.
    """
    depth = nodes = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            nodes += 1
            if nodes > MAX_YAML_NODES:
                raise TopologyError(f"{source}: more than {MAX_YAML_NODES:,} YAML nodes (fabric.limits.MAX_YAML_NODES)")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_NESTING_LEVELS:
                mark = event.start_mark
                raise TopologyError(
                    f"{source}: line {mark.line + 1}, column {mark.column + 1}: collections nested more than "
                    f"{MAX_YAML_NESTING_LEVELS} levels deep (fabric.limits.MAX_YAML_NESTING_LEVELS)")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def loads(text: str, source: str = "topology") -> Fabric:
    """Parse and build a topology from YAML text (see the module docstring for what is refused)."""
    size_bytes = len(text.encode("utf-8", "surrogatepass"))
    if size_bytes > MAX_TOPOLOGY_FILE_BYTES:
        raise TopologyError(f"{source}: {size_bytes:,} bytes; a topology file may have at most "
                            f"{MAX_TOPOLOGY_FILE_BYTES:,} (fabric.limits.MAX_TOPOLOGY_FILE_BYTES)")
    try:
        _scan(text, source)
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise TopologyError(f"{source}: not valid YAML: {e}") from None
    return from_dict(data, source)


def load(path: str | Path) -> Fabric:
    """Read a topology file. A bare name like `dual-plane-16` finds a shipped topology."""
    p = Path(path)
    if not p.exists() and not p.suffix and (TOPOLOGY_DIR / f"{p}.yaml").exists():
        p = TOPOLOGY_DIR / f"{p}.yaml"
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_TOPOLOGY_FILE_BYTES + 1)  # no further: the path may be a device or a huge file
    except OSError as e:
        raise TopologyError(f"{path}: cannot read topology file: {e.strerror}") from None
    if len(raw) > MAX_TOPOLOGY_FILE_BYTES:
        raise TopologyError(f"{path}: larger than {MAX_TOPOLOGY_FILE_BYTES:,} bytes, the most a topology file "
                            "may have (fabric.limits.MAX_TOPOLOGY_FILE_BYTES)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise TopologyError(f"{path}: not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start} "
                            f"(line {line}) cannot be decoded") from None
    return loads(text, source=str(path))


def template(path: str | Path) -> tuple[str, dict[str, Any]]:
    """A builder topology file as (builder, params with the name), to build at other sizes (`scaled`).
    The file is read and checked as `load` reads it (it must also build as it is)."""
    fab = load(path)
    p = Path(path)
    if not p.exists() and (TOPOLOGY_DIR / f"{p}.yaml").exists():
        p = TOPOLOGY_DIR / f"{p}.yaml"
    data = yaml.load(p.read_text(encoding="utf-8"), Loader=_Loader)
    if not isinstance(data, dict) or "builder" not in data:
        raise TopologyError(f"{path}: only a builder topology (builder: + params:) can be scaled to other sizes; "
                            "this one lists its nodes and links")
    params = dict(data.get("params") or {})
    params["name"] = data.get("name") or fab.name
    return str(data["builder"]), params


#: the parameters that count units of the tier above the hosts, per builder: scaled down with the
#: host count so that a smaller fabric keeps the template's per-switch shape where it can
_POD = {"pyramid": ("hosts_per_tor", "tors_per_pod")}

#: each builder's hosts-per-edge-switch parameter and its default (a rail group is that many servers)
_PER_EDGE = {"dual_plane": ("hosts_per_leaf", 4), "leaf_spine": ("hosts_per_leaf", 4),
             "pyramid": ("hosts_per_tor", 4)}

#: name endings kept after the host count (`dual-plane-1024-rail` at 128: `dual-plane-128-rail`)
_SUFFIXES = ("-rail", "-servers")


def scaled(path: str | Path, hosts: int, overrides: Mapping[str, Any] | None = None) -> Fabric:
    """The fabric of a builder topology file at `hosts` hosts: the same builder and parameters (NIC
    rates, hosts per edge switch, oversubscription, spines), `hosts` replaced; a pyramid's pods hold
    at most the ToRs there are (`tors_per_pod` = min(its value, ToRs)). With servers of G GPUs,
    `hosts` must be a multiple of G; a rail-wired fabric with fewer servers than a rail group has
    its hosts per edge switch cut to the servers there are. Named like the file with the host count
    replaced (`dual-plane-1024` at 128 hosts: `dual-plane-128`; `dual-plane-1024-rail`:
    `dual-plane-128-rail`, `pyramid-1024-servers`: `pyramid-128-servers`). `overrides`: builder parameters replaced before it is built (e.g.
    `{"oversubscription": 4.0}`), checked as a file's are."""
    builder, params = template(path)
    name = str(params.pop("name"))
    for k, v in (overrides or {}).items():
        if k in ("hosts", "name"):
            raise TopologyError(f"{path}: '{k}' cannot be overridden (the size and name are set by scaling)")
        params[k] = v
    params["hosts"] = hosts
    g = params.get("gpus_per_server", 1)
    if isinstance(g, int) and g > 1 and hosts % g:
        raise TopologyError(f"{path} at {hosts} hosts: {hosts} hosts are not a whole number of servers of {g} GPUs "
                            f"(gpus_per_server); give a multiple of {g}")
    if params.get("wiring") == "rail" and builder in _PER_EDGE and isinstance(g, int) and g > 1:
        per_edge, default = _PER_EDGE[builder]
        servers = hosts // g
        if 0 < servers < int(params.get(per_edge, default)):
            params[per_edge] = servers
    if builder in _POD:
        per_edge, per_pod = _POD[builder]
        edges = -(-hosts // int(params.get(per_edge, 4)))
        if per_pod in params:
            params[per_pod] = max(1, min(int(params[per_pod]), edges))
    suffix = next((x for x in _SUFFIXES if name.endswith(x)), "")
    base = name[: len(name) - len(suffix)]
    stem, dash, count = base.rpartition("-")
    params["name"] = (f"{stem}-{hosts}" if dash and count.isdigit() else f"{base}-{hosts}") + suffix
    where = f"{path} at {hosts} hosts" + (f" with {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else "")
    return from_dict({"builder": builder, "params": params}, where)


def dumps(fab: Fabric) -> str:
    return yaml.safe_dump(to_dict(fab), sort_keys=False, default_flow_style=None, width=120)
