"""`fabriclab plan`: which fabric to buy, among many, for a workload at a GPU count.

    designs = load_designs("plans/designs.yaml")            # or DEFAULT_DESIGNS
    planned = resolve(designs, gpus=1024, default_gpus_per_server=8)
    series = plan_series(planned, references(planned, 1024)) # rows run by fabriclab.compare.compare()

A design is a set of choices (`Design`): the fabric (pyramid, dual-plane, leaf-spine), the plane kind
(clos or mesh, dual-plane), spines per plane (a pyramid's cores), oversubscription per tier (the edge:
ToR or leaf; and the pyramid's aggregation), wiring (rail or server), routing, NIC rate, and the sizes
of the tiers. A designs file (YAML) lists designs one by one (`designs:`), as cross products of axes
(`sweep:`, each block's list values multiplied), or both, with `defaults:` for every design whose
fabric has the key. Each design is a builder's parameters (`fabric.builders`), so each is written as a
topology file at the planned size and at 16 hosts (for `topo show`, `sim`, `replay`, `up`).

Every design runs as a series of `fabriclab.compare.compare()` at the one size (its row engine, cache,
progress and partial rows), and so does a reference per GPU bandwidth: one non-blocking switch (a
crossbar) holding every GPU with a NIC of that bandwidth. Per design:

- step time mean and p99, communication share (compare's definitions);
- scaling efficiency = the design's throughput per GPU over the reference's: with a fixed batch per
  GPU, reference step / design step. 1 when the fabric costs the workload nothing; what the network
  can still win at this NIC bandwidth;
- its parts and their cost (`fabric.parts`: switches by radix, switch ports, optics and links by tier;
  default prices 1 unit per switch port and 1 per optic);
- whether it is on the Pareto front of step time against cost.

The results, the front and the output files (table, CSV, JSON, plot): `fabriclab.plan_report`.
"""
from __future__ import annotations

import difflib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field

from fabric import parts as parts_mod
from fabric import topofile
from fabric.builders import build
from fabric.errors import FabriclabError
from fabric.model import Fabric
from fabriclab.rows import Series

#: keys only some fabrics have
ONLY = {"agg_oversubscription": ("pyramid",), "tors_per_pod": ("pyramid",), "aggs_per_pod": ("pyramid",),
        "plane": ("dual-plane",)}
#: the size of the second topology file of each design, for the emulator
EMULATED_HOSTS = 16
#: a designs file larger than this is refused before it is parsed
MAX_DESIGNS_FILE_BYTES = 1 << 20
#: a designs file with more designs than this is refused (each is a simulator row: minutes at 1,024 GPUs)
MAX_DESIGNS = 1000
#: where the sample designs live
PLANS_DIR = Path(__file__).resolve().parents[1] / "plans"


class PlanError(FabriclabError):
    """A plan cannot be set up; the message names the offending key or design."""


class Design(BaseModel):
    """One design's choices; None: the default for its fabric and size (`builder_params`)."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
    fabric: Literal["pyramid", "dual-plane", "leaf-spine"]
    plane: Literal["clos", "mesh"] = "clos"
    spines: int | None = Field(None, ge=1)  # per plane; a pyramid's core switches
    edge_oversubscription: float = Field(1.0, gt=0)  # the ToR (pyramid) or leaf tier
    agg_oversubscription: float = Field(1.0, gt=0)  # the pyramid's aggregation tier
    wiring: Literal["rail", "server"] = "rail"
    routing: str | None = None  # default: adaptive on a dual-plane, ecmp otherwise
    nic_gbps: float | None = Field(None, gt=0)  # per NIC port; default 200 on a dual-plane (2 planes), 400 otherwise
    hosts_per_edge: int | None = Field(None, ge=1)
    tors_per_pod: int | None = Field(None, ge=1)
    aggs_per_pod: int | None = Field(None, ge=1)
    gpus_per_server: int | None = Field(None, ge=1)  # default: the workload's (an LLM step's), else 8
    nvlink_gbps: float = Field(3600.0, gt=0)
    port_gbps: float | None = Field(None, gt=0)  # switch-to-switch port speed (parts); default: the NIC rate

    @pydantic.model_validator(mode="after")
    def _applies(self) -> Design:
        for key, fabrics in ONLY.items():
            if key in self.model_fields_set and self.fabric not in fabrics:
                raise ValueError(f"{key}: only a {' or '.join(fabrics)} has it, not a {self.fabric}")
        if "spines" in self.model_fields_set and self.plane == "mesh":
            raise ValueError("spines: a mesh plane has no spines (its leaves link to each other)")
        return self


DESIGN_KEYS = tuple(Design.model_fields)


class _PlanFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    defaults: dict[str, Any] = {}
    sweep: list[dict[str, Any]] = []
    designs: list[dict[str, Any]] = []


#: the designs `fabriclab plan` sweeps without a file: 14 choices around the project's 1,024-GPU fabrics
DEFAULT_DESIGNS_FILE = PLANS_DIR / "designs.yaml"


# ---- reading designs ------------------------------------------------------------------------------

def _where(source: str, part: str, err: pydantic.ValidationError, axis_index: Mapping[str, int] | None = None,
           ) -> PlanError:
    problems = []
    for e in err.errors():
        loc = [str(x) for x in e["loc"]]
        key = loc[0] if loc else ""
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(key, DESIGN_KEYS, n=1)
            msg = f"unknown key ({f'did you mean {close[0]}? ' if close else ''}keys: {', '.join(DESIGN_KEYS)})"
        else:
            msg = e["msg"].removeprefix("Value error, ")
        if axis_index and key in axis_index and e["type"] != "extra_forbidden":
            loc[0] = f"{key}[{axis_index[key]}]"
        problems.append(f"{part}{'.' + '.'.join(loc) if loc else ''}: {msg}")
    return PlanError(f"{source}: " + "; ".join(problems))


def _design(data: dict[str, Any], defaults: Mapping[str, Any], source: str, part: str,
            axis_index: Mapping[str, int] | None = None) -> Design:
    fabric = data.get("fabric", defaults.get("fabric"))
    merged = {k: v for k, v in defaults.items() if k not in ONLY or fabric in ONLY[k]}
    if "spines" in merged and data.get("plane", merged.get("plane")) == "mesh":
        merged.pop("spines")  # a default spine count is for the clos designs
    try:
        return Design.model_validate(merged | data)
    except pydantic.ValidationError as e:
        raise _where(source, part, e, axis_index) from None


def designs_from(data: Any, source: str = "designs") -> list[Design]:
    """The designs of a parsed designs file (module docstring); errors name the key (`sweep[1].wiring`)."""
    if not isinstance(data, dict):
        raise PlanError(f"{source}: expected a mapping with defaults:, sweep: and/or designs:, got "
                        f"{type(data).__name__}")
    try:
        spec = _PlanFile.model_validate(data)
    except pydantic.ValidationError as e:
        problems = []
        for err in e.errors():
            loc = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err["loc"]).lstrip(".")
            msg = "unknown key (keys: defaults, sweep, designs)" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{loc}: {msg}")
        raise PlanError(f"{source}: " + "; ".join(problems)) from None
    for key in spec.defaults:
        if key not in DESIGN_KEYS or key == "name":
            raise PlanError(f"{source}: defaults.{key}: "
                            + ("a name is a design's own" if key == "name" else f"unknown key (keys: {', '.join(DESIGN_KEYS)})"))
    out: list[Design] = []
    for i, block in enumerate(spec.sweep):
        part = f"sweep[{i}]"
        axes = {k: v for k, v in block.items() if isinstance(v, list)}
        for k, v in axes.items():
            if not v:
                raise PlanError(f"{source}: {part}.{k}: an empty list (an axis needs at least one value)")
        if "name" in block:
            raise PlanError(f"{source}: {part}.name: a sweep's designs are named from their choices; name designs "
                            "one by one under designs:")
        fixed = {k: v for k, v in block.items() if k not in axes}
        keys = list(axes)
        for combo in itertools.product(*(range(len(axes[k])) for k in keys)):
            if len(out) >= MAX_DESIGNS:
                raise PlanError(f"{source}: more than {MAX_DESIGNS} designs")
            data_i = fixed | {k: axes[k][j] for k, j in zip(keys, combo)}
            out.append(_design(data_i, spec.defaults, source, part, dict(zip(keys, combo))))
    for i, d in enumerate(spec.designs):
        if len(out) >= MAX_DESIGNS:
            raise PlanError(f"{source}: more than {MAX_DESIGNS} designs")
        if not isinstance(d, dict):
            raise PlanError(f"{source}: designs[{i}]: a design is a mapping of keys, got {type(d).__name__}")
        out.append(_design(d, spec.defaults, source, f"designs[{i}]"))
    if not out:
        raise PlanError(f"{source}: no designs (give sweep: and/or designs:)")
    return out


def _read_yaml(path: str | Path, what: str) -> Any:
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_DESIGNS_FILE_BYTES + 1)
    except OSError as e:
        raise PlanError(f"{path}: cannot read the {what} file: {e.strerror}") from None
    if len(raw) > MAX_DESIGNS_FILE_BYTES:
        raise PlanError(f"{path}: larger than {MAX_DESIGNS_FILE_BYTES:,} bytes, the most a {what} file may have")
    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise PlanError(f"{path}: not a YAML file: {e}") from None


def load_designs(path: str | Path) -> list[Design]:
    """A designs file (YAML)."""
    return designs_from(_read_yaml(path, "designs"), str(path))


def load_prices(path: str | Path) -> parts_mod.Prices:
    """A prices file (YAML): part kind -> price, or price by size (`fabric.parts`)."""
    data = _read_yaml(path, "prices")
    if isinstance(data, dict):  # YAML reads a size as a number; the prices key sizes as text
        data = {k: ({str(s): v for s, v in val.items()} if isinstance(val, dict) else val) for k, val in data.items()}
    return parts_mod.prices_from(data, str(path))


# ---- designs as builder parameters ----------------------------------------------------------------

def _defaults(d: Design, gpus: int, default_gpus_per_server: int) -> dict[str, Any]:
    """The design's choices with every default filled in at `gpus` GPUs."""
    g = d.gpus_per_server or default_gpus_per_server
    if gpus % g:
        raise PlanError(f"{gpus} GPUs are not whole servers of {g} (gpus_per_server)")
    servers = gpus // g
    if d.hosts_per_edge is not None:
        per_edge = d.hosts_per_edge
    elif d.wiring == "rail":
        per_edge = min(32, servers)  # a rail group of up to 32 servers under each rail's edge switch
    else:
        per_edge = 32 if gpus >= 64 and 32 % g == 0 else g  # 4 servers of 8 under each edge, or one server
    edges = max(1, gpus // per_edge)
    out: dict[str, Any] = {
        "fabric": d.fabric, "plane": d.plane if d.fabric == "dual-plane" else None,
        "edge_oversubscription": d.edge_oversubscription,
        "agg_oversubscription": d.agg_oversubscription if d.fabric == "pyramid" else None,
        "wiring": d.wiring, "routing": d.routing or ("adaptive" if d.fabric == "dual-plane" else "ecmp"),
        "nic_gbps": d.nic_gbps or (200.0 if d.fabric == "dual-plane" else 400.0),
        "hosts_per_edge": per_edge, "gpus_per_server": g, "nvlink_gbps": d.nvlink_gbps if g > 1 else 0.0,
        "port_gbps": d.port_gbps, "tors_per_pod": None, "aggs_per_pod": None,
        "spines": None if d.plane == "mesh" and d.fabric == "dual-plane" else d.spines,
    }
    if d.fabric == "pyramid":
        tpp = d.tors_per_pod or min(8, max(1, edges // 2))  # two pods at least: traffic reaches the core
        app = d.aggs_per_pod or min(4, max(1, tpp // 2))
        out |= {"tors_per_pod": tpp, "aggs_per_pod": app, "spines": d.spines or min(8, max(1, edges // tpp) * app)}
    elif out["spines"] is None and out["plane"] != "mesh":
        # one spine per host of a leaf at 1:1 (as many uplinks as hosts, each at the NIC's rate), fewer as the
        # leaf is oversubscribed (its uplinks stay at the NIC's rate: fewer ports, not slower ones)
        out["spines"] = max(1, math.floor(min(per_edge, edges) / d.edge_oversubscription))
    return out


def builder_params(choices: Mapping[str, Any], gpus: int, name: str) -> tuple[str, dict[str, Any]]:
    """(builder, parameters) of a design's resolved choices (`_defaults`) at `gpus` hosts."""
    c = choices
    common = {"hosts": gpus, "nic_rate_gbps": c["nic_gbps"], "oversubscription": c["edge_oversubscription"],
              "gpus_per_server": c["gpus_per_server"], "nvlink_gbps": c["nvlink_gbps"], "wiring": c["wiring"],
              "name": name}
    if c["fabric"] == "pyramid":
        return "pyramid", common | {"hosts_per_tor": c["hosts_per_edge"], "tors_per_pod": c["tors_per_pod"],
                                    "aggs_per_pod": c["aggs_per_pod"], "cores": c["spines"],
                                    "core_oversubscription": c["agg_oversubscription"]}
    if c["fabric"] == "dual-plane":
        extra = {"spines_per_plane": c["spines"]} if c["plane"] == "clos" else {}
        return "dual_plane", common | {"hosts_per_leaf": c["hosts_per_edge"], "plane_kind": c["plane"], **extra}
    return "leaf_spine", common | {"hosts_per_leaf": c["hosts_per_edge"], "spines": c["spines"]}


#: name tokens per choice, in name order
_TOKENS: tuple[tuple[str, Any], ...] = (
    ("plane", lambda v: str(v)),
    ("edge_oversubscription", lambda v: f"{v:g}to1"),
    ("agg_oversubscription", lambda v: f"agg{v:g}to1"),
    ("wiring", lambda v: "rail" if v == "rail" else "servers"),
    ("routing", lambda v: re.sub(r"[^A-Za-z0-9]+", "", str(v).rpartition(":")[2]).lower() or "policy"),
    ("nic_gbps", lambda v: f"{v:g}g"),
    ("spines", lambda v: f"{v}sp"),
    ("hosts_per_edge", lambda v: f"{v}pe"),
    ("tors_per_pod", lambda v: f"{v}tpp"),
    ("aggs_per_pod", lambda v: f"{v}app"),
    ("gpus_per_server", lambda v: f"{v}gps"),
    ("nvlink_gbps", lambda v: f"nvl{v:g}"),
    ("port_gbps", lambda v: f"port{v:g}"),
)


def _names(designs: Sequence[Design], choices: Sequence[dict[str, Any]]) -> list[str]:
    """Each design's name: its own, or its fabric and the choices that vary among the set's designs of
    that fabric, as given (a default left to the fabric, e.g. the spine count, is not a choice), with
    their resolved values."""
    varying: dict[str, list[str]] = {}
    for fabric in {d.fabric for d in designs}:
        group = [d for d in designs if d.fabric == fabric]
        varying[fabric] = [k for k, _ in _TOKENS if len({json.dumps(getattr(d, k)) for d in group}) > 1]
    out = []
    for d, c in zip(designs, choices):
        if d.name:
            out.append(d.name)
            continue
        tokens = [c["fabric"]] + [fmt(c[k]) for k, fmt in _TOKENS if k in varying[c["fabric"]] and c[k] is not None]
        out.append("-".join(tokens))
    return out


@dataclass(frozen=True)
class Planned:
    """A design resolved at the planned size: its name, choices (every default filled in), builder and
    parameters, routing, and its fabric (built: the parts are counted from it)."""

    name: str
    choices: dict[str, Any]
    builder: str
    params: dict[str, Any]
    fabric: Fabric

    @property
    def routing(self) -> str:
        return str(self.choices["routing"])

    @property
    def gpu_gbps(self) -> float:
        """The NIC bandwidth of one GPU (all its ports)."""
        return self.fabric.host_bandwidth_gbps(self.fabric.hosts[0].name)


def resolve(designs: Sequence[Design], gpus: int, default_gpus_per_server: int = 8) -> list[Planned]:
    """Every design at `gpus` GPUs, built (an impossible one is refused naming it), named, and checked to
    differ from the others."""
    if gpus < 2:
        raise PlanError(f"--gpus must be >= 2, got {gpus}")
    choices = []
    for i, d in enumerate(designs):
        try:
            choices.append(_defaults(d, gpus, default_gpus_per_server))
        except PlanError as e:
            raise PlanError(f"design {d.name or i + 1} ({d.fabric}): {e}") from None
    names = _names(designs, choices)
    seen: dict[str, str] = {}
    same: dict[str, str] = {}
    out = []
    for c, name in zip(choices, names):
        if name in seen:
            raise PlanError(f"two designs are named {name!r}; name them (name:) or make them differ")
        seen[name] = name
        key = json.dumps(c, sort_keys=True)
        if key in same:
            raise PlanError(f"designs {same[key]!r} and {name!r} are the same design")
        same[key] = name
        builder, params = builder_params(c, gpus, f"{name}-{gpus}")
        try:
            fab = build(builder, params)
        except FabriclabError as e:
            raise PlanError(f"design {name!r} at {gpus} GPUs: {e}") from None
        out.append(Planned(name, c, builder, params, fab))
    return out


def emulated_twin(p: Planned, hosts: int = EMULATED_HOSTS) -> tuple[str, dict[str, Any]] | str:
    """(builder, parameters) of the design at `hosts` hosts, its tier sizes chosen again for that size
    (`_defaults`), or why it cannot be built there."""
    c = p.choices
    keep = ("fabric", "plane", "edge_oversubscription", "agg_oversubscription", "wiring", "routing", "nic_gbps",
            "gpus_per_server", "nvlink_gbps", "port_gbps")
    d = Design.model_validate({k: c[k] for k in keep if c[k]})  # None (does not apply) and 0 (no NVLink) left out
    try:
        builder, params = builder_params(_defaults(d, hosts, c["gpus_per_server"]), hosts, f"{p.name}-{hosts}")
        build(builder, params)
    except FabriclabError as e:
        return str(e)
    return builder, params


def reference(gpu_gbps: float, gpus: int, gpus_per_server: int, nvlink_gbps: float) -> tuple[str, dict[str, Any]]:
    """The non-blocking reference of a GPU bandwidth: one switch holding every GPU with one NIC port of
    `gpu_gbps` (leaf_spine with one leaf; its one spine link carries nothing, so it is thinned to a NIC's
    rate by an oversubscription of `gpus`)."""
    name = f"crossbar-{gpu_gbps:g}g-{gpus}"
    return "leaf_spine", {"hosts": gpus, "hosts_per_leaf": gpus, "spines": 1, "nic_rate_gbps": gpu_gbps,
                          "oversubscription": float(gpus), "gpus_per_server": gpus_per_server,
                          "nvlink_gbps": nvlink_gbps, "wiring": "server", "name": name}


# ---- topology files -------------------------------------------------------------------------------

def _describe(c: Mapping[str, Any]) -> str:
    bits = [c["fabric"]]
    if c["plane"]:
        bits.append(f"{c['plane']} planes")
    bits.append(f"edge {c['edge_oversubscription']:g}:1")
    if c["agg_oversubscription"] is not None:
        bits.append(f"aggregation {c['agg_oversubscription']:g}:1")
    bits += [f"{c['wiring']}-wired", f"routing {c['routing']}", f"NIC {c['nic_gbps']:g}G"]
    return ", ".join(bits)


def topology_text(builder: str, params: Mapping[str, Any], comment: str) -> str:
    """A builder topology file (`fabric.topofile`)."""
    doc = {"name": params["name"], "builder": builder, "params": {k: v for k, v in params.items() if k != "name"}}
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)


def write_topologies(planned: Sequence[Planned], gpus: int, out_dir: Path) -> dict[str, dict[str, str]]:
    """Each design's topology file at `gpus` hosts and at EMULATED_HOSTS (where it can be built there),
    in `out_dir`; name -> {"file": ..., "emulated": ... or "emulated_error": ...}. Each file is read back
    by `fabric.topofile.load` (what `topo check` does)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, str]] = {}
    for p in planned:
        path = out_dir / f"{p.params['name']}.yaml"
        path.write_text(topology_text(p.builder, p.params, f"fabriclab plan: design {p.name} at {gpus} GPUs\n"
                                                           f"{_describe(p.choices)}"))
        topofile.load(path)
        entry = {"file": str(path)}
        twin = emulated_twin(p) if gpus != EMULATED_HOSTS else "the design's own file"
        if gpus == EMULATED_HOSTS:
            entry["emulated"] = str(path)
        elif isinstance(twin, str):
            entry["emulated_error"] = twin
        else:
            tpath = out_dir / f"{twin[1]['name']}.yaml"
            tpath.write_text(topology_text(twin[0], twin[1], f"fabriclab plan: design {p.name} at {EMULATED_HOSTS} "
                                                             f"hosts, for the emulator\n{_describe(p.choices)}"))
            topofile.load(tpath)
            entry["emulated"] = str(tpath)
        files[p.name] = entry
    return files


def write_references(planned: Sequence[Planned], gpus: int, out_dir: Path) -> dict[tuple[float, int, float], Path]:
    """The reference topology file of each (GPU bandwidth, GPUs per server, NVLink) among the designs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    refs: dict[tuple[float, int, float], Path] = {}
    keys = list(dict.fromkeys((p.gpu_gbps, p.fabric.gpus_per_server, p.fabric.nvlink_gbps) for p in planned))
    servers_differ = len({k[1:] for k in keys}) > 1
    for key in keys:
        builder, params = reference(key[0], gpus, key[1], key[2])
        if servers_differ:
            params["name"] = f"crossbar-{key[0]:g}g-{key[1]}gps-nvl{key[2]:g}-{gpus}"
        path = out_dir / f"{params['name']}.yaml"
        path.write_text(topology_text(builder, params, f"fabriclab plan: the non-blocking reference for "
                                                       f"{key[0]:g} Gbit/s per GPU: one switch, every GPU on it"))
        topofile.load(path)
        refs[key] = path
    return refs


def plan_series(planned: Sequence[Planned], files: Mapping[str, Mapping[str, str]],
                refs: Mapping[tuple[float, int, float], Path]) -> list[Series]:
    """The compare series: each reference first (variant `reference:FILE-STEM`, ecmp: it has one path; its
    row is needed for every design's efficiency), then each design (variant = its name)."""
    out = [Series(str(path), "ecmp", variant=f"reference:{path.stem}") for path in refs.values()]
    return out + [Series(files[p.name]["file"], p.routing, variant=p.name) for p in planned]
