"""A plan put on the emulation's agents (pure): each template's transfers on hosts, at emulated sizes,
split over their pair's planned connections.

    placed = place(plan_replay(workload, fabric, options))

The plan (`traffic.replay.plan`) is the one both backends run; the simulator takes it as it is, the
emulation's agents need it placed: per template, every transfer between its hosts (`PlacedTransfer`) at
`bytes_scale` x its real size, split evenly over the connections the plan gave its host pair on its lane
(`parts`, each at least one byte; a 0-byte transfer is one 0-byte part), and per host what its agent
sends, receives and does locally (`PlacedPlan.agent_plan`, plain data for JSON).

- **In-server transfers** (between two GPUs of one server, `Fabric.gpus_per_server`) have no parts: no
  connection, no byte on the fabric. The sending agent waits their NVLink time at the emulated rate
  (`nvlink_s`: emulated bytes at `nvlink_gbps x mbps_per_gbps` Mbit/s, so real time x dilation) once
  everything they depend on is complete (store and forward), then tells the driver, which tells the
  receiving agent (`traffic.replay.agent`). A template whose transfers are all in-server
  (`Template.local_us`) is not given to the agents: the driver times its calls.

- **Cut-through**: the agents forward data as it arrives (`traffic.replay.agent`), like NCCL's slices:
  byte i of a transfer may leave once each transfer it depends on has delivered the same fraction of
  its own bytes (for dependencies received by this host), or been sent (for earlier sends of this host).
  So every dependency of a transfer must be known to its sending host: a transfer it received, or one it
  sent itself (`place` checks it, naming the transfer).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from fabric.flowsim.connections import Connection, pair_key
from fabric.transfers import split_bytes
from traffic.replay.plan import ReplayError, ReplayPlan, Template


@dataclass(frozen=True)
class Part:
    conn: int
    size_bytes: int


@dataclass(frozen=True)
class PlacedTransfer:
    src_host: str
    dst_host: str
    size_bytes: int  # emulated
    deps: tuple[int, ...]
    parts: tuple[Part, ...]  # empty: a local transfer (both ranks on one server)
    nvlink_s: float = 0.0  # emulated seconds a local transfer between two GPUs of a server takes

    @property
    def local(self) -> bool:
        return not self.parts


@dataclass(frozen=True)
class PlacedTemplate:
    """One template's transfers on hosts (emulated sizes), in the DAG's order."""

    template: Template
    transfers: tuple[PlacedTransfer, ...]

    def hosts(self) -> set[str]:
        return {t.src_host for t in self.transfers} | {t.dst_host for t in self.transfers}

    def bytes_sent_by(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for t in self.transfers:
            if not t.local:
                out[t.src_host] += t.size_bytes
        return dict(out)


@dataclass(frozen=True)
class PlacedPlan:
    """A plan placed for the emulation: its templates' transfers on hosts (`placed`, by template id) and
    its connections as objects (`connections`, by id)."""

    plan: ReplayPlan
    placed: tuple[PlacedTemplate, ...]
    connections: tuple[Connection, ...]

    def agent_plan(self, host: str) -> dict[str, Any]:
        """Everything one host's agent needs, as plain data (JSON)."""
        fab = self.plan.fabric
        outgoing = [c for c in self.connections if c.src_host == host]
        incoming = [c for c in self.connections if c.dst_host == host]
        templates: dict[int, Any] = {}
        for p in self.placed:
            if p.template.local_us is not None:  # all in-server: timed by the driver
                continue
            sends, recvs, local, nv_sends, nv_recvs = [], [], [], [], []
            for i, x in enumerate(p.transfers):
                if x.local and x.src_host == x.dst_host == host:
                    local.append([i, x.size_bytes, list(x.deps)])
                elif x.local and x.src_host == host:
                    nv_sends.append([i, x.size_bytes, list(x.deps), x.dst_host, x.nvlink_s])
                elif x.local and x.dst_host == host:
                    nv_recvs.append(i)
                elif x.src_host == host:
                    sends.append([i, x.size_bytes, list(x.deps), [[q.conn, q.size_bytes] for q in x.parts]])
                elif x.dst_host == host:
                    recvs.append([i, x.size_bytes])
            if sends or recvs or local or nv_sends or nv_recvs:
                templates[p.template.id] = {"sends": sends, "recvs": recvs, "local": local,
                                            "nvlink_sends": nv_sends, "nvlink_recvs": nv_recvs}
        return {
            "host": host,
            "ips": [str(n.ip) for n in fab.nics_of[host]],
            "ports": sorted({c.dport for c in incoming}),
            "outgoing": [[c.id, c.src_ip, c.sport, c.dst_ip, c.dport] for c in outgoing],
            "incoming": [c.id for c in incoming],
            "templates": templates,
        }


def place(plan: ReplayPlan) -> PlacedPlan:
    """`plan` on the emulation's agents (module docstring)."""
    fabric = plan.fabric
    names = [h.name for h in fabric.hosts]
    n = len(names)
    table = plan.connections
    connections = plan.connection_list()
    ids_of: dict[int, range] = {int(k): range(int(table.pair_ptr[i]), int(table.pair_ptr[i + 1]))
                                for i, k in enumerate(table.pair_key.tolist())}
    pos = {h: i for i, h in enumerate(names)}
    nvlink_emu_bps = fabric.nvlink_gbps * plan.mbps_per_gbps * 1e6
    placed = []
    for t in plan.templates:
        dag = t.dag
        hosts = [plan.placement.host(r) for r in range(max(dag.ranks, default=-1) + 1)]
        out = []
        for i, (s, d, size_real) in enumerate(zip(dag.src.tolist(), dag.dst.tolist(), dag.size_bytes.tolist())):
            a, b = hosts[s], hosts[d]
            size = int(round(size_real * plan.bytes_scale))
            nvlink_s = 0.0
            if a == b or fabric.same_server(a, b):  # one server: no connection
                parts: tuple[Part, ...] = ()
                if a != b:
                    nvlink_s = size * 8 / nvlink_emu_bps
            else:
                ids = ids_of[int(pair_key(n, pos[a], pos[b], t.lane))]
                # every part carries at least one byte; a 0-byte transfer is one 0-byte part
                split = [(cid, k) for cid, k in zip(ids, split_bytes(size, len(ids))) if k > 0]
                parts = tuple(Part(cid, k) for cid, k in split) if split else (Part(ids[0], 0),)
            out.append(PlacedTransfer(a, b, size, dag.deps_of(i), parts, nvlink_s))
        _check_local_deps(dag.label, out)
        placed.append(PlacedTemplate(t, tuple(out)))
    return PlacedPlan(plan, tuple(placed), connections)


def _check_local_deps(label: str, placed: list[PlacedTransfer]) -> None:
    """Every dependency of a transfer must be known to its sending host: a transfer it received, or
    one it sent itself (the agents know nothing else)."""
    for i, t in enumerate(placed):
        for d in t.deps:
            dep = placed[d]
            if t.src_host not in (dep.dst_host, dep.src_host):
                raise ReplayError(f"{label}: transfer {i} ({t.src_host} -> {t.dst_host}) depends on transfer "
                                  f"{d} ({dep.src_host} -> {dep.dst_host}), which its host never sees")

