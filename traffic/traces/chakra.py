"""Read MLCommons Chakra execution traces (`.et`) into a `Workload`.

A Chakra trace is a stream of protobuf messages, each prefixed by its length as a varint: one
`GlobalMetadata`, then one `Node` per operation (schema: `chakra_et.proto` beside this module, the
format's `schema/protobuf/et_def.proto`). The stream is framed with protobuf's own varint decoder and
each message parsed by the generated classes, one node at a time: memory grows with the collectives
and the merged compute intervals, not with the number of nodes.

What becomes what:
- A collective is a `COMM_COLL_NODE` with attributes `comm_type` (the `CollectiveCommType` enum) and
  `comm_size` (bytes, the nccl-tests size). A COLL node flagged `is_cpu_op` is the host-side launch of a
  collective whose device kernel is its own COLL node; it is counted in the notes, not as a collective.
  Any other COLL node without `comm_size` or `comm_type` is an error, and so is a `comm_size` that is
  negative or above 2^48 bytes (`checked_size`; the message names the file and the node's id and name).
- dtype: a `dtype` attribute, else the single tensor type of the node's inputs (`Tensor(float)`), else
  "unknown". Stream: a `stream` attribute, else a device node's `tid` (the device stream), else "0".
- Process group: a `pg_name` (or `comm_group`) attribute, resolved to ranks through the trace's
  `## process_group:init ##` node (PyTorch's process-group table); with no group named, the whole world.
- Compute: `COMP_NODE`s that are not CPU ops (`is_cpu_op` false, or every COMP node where the trace has no
  such flag), placed by `start_time_micros` and `duration_micros` and merged.
- Steps: `ProfilerStep#N` nodes split a timed trace into steps (step N runs from its marker's start to
  the next marker's start); without markers the trace is one step, number 0.
- Times: microseconds relative to the step start. Chakra's PyTorch converter records durations but no
  start times; such a trace is read untimed (`Workload.timed` false): collectives keep their durations,
  nothing has a start, and the notes say so.
"""
from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, TypeVar

from google.protobuf.internal.decoder import _DecodeVarint32
from google.protobuf.message import DecodeError

from traffic.traces import chakra_et_pb2 as pb
from traffic.workload import (Collective, Interval, RankTrace, Step, TraceError, Workload, checked_size,
                              merge_intervals)

#: Chakra's `CollectiveCommType` -> the Workload's collective kind.
COMM_KINDS: dict[int, str] = {
    pb.ALL_REDUCE: "all_reduce", pb.REDUCE: "reduce", pb.ALL_GATHER: "all_gather", pb.GATHER: "gather",
    pb.SCATTER: "scatter", pb.BROADCAST: "broadcast", pb.ALL_TO_ALL: "all_to_all",
    pb.REDUCE_SCATTER: "reduce_scatter", pb.REDUCE_SCATTER_BLOCK: "reduce_scatter", pb.BARRIER: "barrier",
}

#: Tensor element types as PyTorch's execution trace spells them -> the Workload's dtype names.
DTYPES: dict[str, str] = {
    "float": "float32", "float32": "float32", "double": "float64", "float64": "float64",
    "half": "float16", "float16": "float16", "c10::half": "float16",
    "bfloat16": "bfloat16", "c10::bfloat16": "bfloat16",
    "int": "int32", "int32": "int32", "long": "int64", "long int": "int64", "int64": "int64",
    "short": "int16", "int16": "int16", "signed char": "int8", "int8": "int8",
    "unsigned char": "uint8", "uint8": "uint8", "bool": "bool",
}

_CHUNK_BYTES = 1 << 20
_VARINT_MAX_BYTES = 10  # the most a varint can take; framing reads lengths of up to 5
_COMPACT_EVERY = 4096  # merge the compute intervals once at least this many new ones are pending
_STEP_RE = re.compile(r"ProfilerStep#(\d+)")
_TENSOR_RE = re.compile(r"Tensor\(([^)]*)\)")
_PG_NAME_ATTRS = ("pg_name", "comm_group")
_Message = TypeVar("_Message", pb.GlobalMetadata, pb.Node)


def read_chakra(path: Path, *, world_size: int | None = None) -> Workload:
    """Read one rank's Chakra execution trace. `world_size`, where given, is the job's size for a trace
    that does not say it (and must agree with a trace that does). Raises TraceError naming the file and
    the problem for anything that is not a readable Chakra trace with at least one collective."""
    path = Path(path)
    if world_size is not None and world_size < 1:
        raise TraceError(f"{path}: world_size must be at least 1, not {world_size}")
    try:
        f = path.open("rb")
    except OSError as e:
        raise TraceError(f"{path}: cannot open: {e.strerror or e}") from e
    with f:
        try:
            file_bytes = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise TraceError(f"{path}: cannot stat: {e.strerror or e}") from e
        reader = _Reader(path)
        frames = _frames(f, path, file_bytes)
        first = next(frames, None)
        if first is None:
            raise TraceError(f"{path}: empty file: a Chakra trace starts with its GlobalMetadata")
        offset, data = first
        reader.metadata(_parse(pb.GlobalMetadata, data, path, offset))
        for offset, data in frames:
            reader.node(_parse(pb.Node, data, path, offset), offset)
    return reader.workload(world_size)


def _frames(f: BinaryIO, path: Path, file_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(file offset, bytes) of each varint-length-prefixed message, reading the file in chunks."""
    buf = b""  # immutable and replaced on refill: a bytearray trimmed at the front keeps growing
    base = 0  # file offset of buf[0]
    pos = 0  # read position in buf
    while True:
        if len(buf) - pos < _VARINT_MAX_BYTES:  # top up so that a whole length prefix is in the buffer
            buf, base, pos = buf[pos:] + f.read(_CHUNK_BYTES), base + pos, 0
        if pos == len(buf):
            return
        try:
            size, body = _DecodeVarint32(buf, pos)
        except IndexError as e:
            raise TraceError(f"{path}: truncated: the length prefix at byte {base + pos} is cut off "
                             f"by the end of the file") from e
        except DecodeError as e:
            raise TraceError(f"{path}: garbage at byte {base + pos}: not a length prefix ({e})") from e
        if base + body + size > file_bytes:
            raise TraceError(f"{path}: truncated: the message at byte {base + pos} declares {size} bytes, "
                             f"but only {file_bytes - base - body} remain in the file")
        if len(buf) - body < size:  # a message longer than what is buffered: read the rest of it at once
            buf, base, body = buf[pos:] + f.read(max(_CHUNK_BYTES, size - (len(buf) - body))), base + pos, body - pos
            pos = 0
            if len(buf) - body < size:
                raise TraceError(f"{path}: truncated: the file ended while reading the message at byte "
                                 f"{base} ({size} bytes)")
        yield base + pos, buf[body:body + size]
        pos = body + size


def _parse(cls: type[_Message], data: bytes, path: Path, offset: int) -> _Message:
    """Parse one message with the generated class; any failure is a TraceError at that offset."""
    try:
        return cls.FromString(data)
    except (DecodeError, ValueError, TypeError, RuntimeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: garbage at byte {offset}: not a Chakra {cls.__name__} ({e})") from e


def _attr_value(attr: pb.AttributeProto) -> object:
    """The value an AttributeProto carries (a list for the *_list types), or None if it carries none."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    value = getattr(attr, which)
    return list(value.values) if which.endswith("_list") else value


def _attrs(msg: pb.GlobalMetadata | pb.Node) -> dict[str, object]:
    return {a.name: _attr_value(a) for a in msg.attr}


def _dtype(attrs: dict[str, object], input_types: str) -> str:
    given = attrs.get("dtype")
    if isinstance(given, str) and given:
        return DTYPES.get(given.lower(), given)
    found = {t.strip().lower() for t in _TENSOR_RE.findall(input_types)}
    if len(found) == 1:
        (name,) = found
        return DTYPES.get(name, name)
    return "unknown"


@dataclass(frozen=True)
class _RawCollective:
    """A collective as read, before steps and process groups are known."""
    kind: str
    size_bytes: int
    dtype: str
    pg_name: str | None
    stream: str
    start_us: float
    duration_us: float
    name: str


@dataclass(frozen=True)
class _StepMarker:
    number: int
    start_us: float
    end_us: float


class _Reader:
    """Accumulates what the Workload needs from the nodes, one node at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta: dict[str, object] = {}
        self.nodes = 0
        self.timed_nodes = 0
        self.type_counts: dict[int, int] = {}
        self.cpu_flags = 0  # nodes carrying is_cpu_op
        self.host_colls = 0  # COLL nodes that are host-side launches
        self.collectives: list[_RawCollective] = []
        self.compute: list[Interval] = []
        self.pending_compute = 0
        self.compute_nodes = 0
        self.compute_total_us = 0.0
        self.markers: list[_StepMarker] = []
        self.groups: dict[str, tuple[int, ...]] = {}
        self.default_group_size: int | None = None
        self.pg_notes: list[str] = []
        self.first_us: float | None = None
        self.last_us: float | None = None

    def metadata(self, meta: pb.GlobalMetadata) -> None:
        self.meta = _attrs(meta)

    def node(self, n: pb.Node, offset: int) -> None:
        self.nodes += 1
        ntype = int(n.type)
        self.type_counts[ntype] = self.type_counts.get(ntype, 0) + 1
        name: str = n.name
        start_us = float(n.start_time_micros)
        duration_us = float(n.duration_micros)
        if start_us:
            self.timed_nodes += 1
            self.first_us = start_us if self.first_us is None else min(self.first_us, start_us)
            self.last_us = max(self.last_us or 0.0, start_us + duration_us)
        attrs = _attrs(n)
        is_cpu = attrs.get("is_cpu_op")
        if is_cpu is not None:
            self.cpu_flags += 1
        step = _STEP_RE.search(name)
        if step:
            self.markers.append(_StepMarker(int(step.group(1)), start_us, start_us + duration_us))
        if "process_group:init" in name:
            self._read_groups(n.inputs.values, offset)
        if ntype == pb.COMM_COLL_NODE:
            if is_cpu is True:
                self.host_colls += 1
                return
            self.collectives.append(self._collective(n, name, attrs, start_us, duration_us, offset))
        elif ntype == pb.COMP_NODE and is_cpu is not True and not step:
            self.compute_nodes += 1
            self.compute_total_us += duration_us
            if duration_us > 0:
                self.compute.append((start_us, start_us + duration_us))
                self.pending_compute += 1
                # merge when the pending part is as long as the merged part: amortised O(n log n)
                if self.pending_compute >= max(_COMPACT_EVERY, len(self.compute) - self.pending_compute):
                    self.compute = list(merge_intervals(self.compute))
                    self.pending_compute = 0

    def _collective(self, n: pb.Node, name: str, attrs: dict[str, object], start_us: float,
                    duration_us: float, offset: int) -> _RawCollective:
        where = f"{self.path}: COLL node {n.id} {name[:60]!r} at byte {offset}"
        size = attrs.get("comm_size")
        if size is None:
            raise TraceError(f"{where}: no comm_size attribute (attributes: {sorted(attrs)})")
        if isinstance(size, float) and size.is_integer():
            size = int(size)
        if isinstance(size, bool) or not isinstance(size, int):
            raise TraceError(f"{where}: comm_size {size!r} is not a byte count")
        comm_type = attrs.get("comm_type")
        if comm_type is None:
            raise TraceError(f"{where}: no comm_type attribute (attributes: {sorted(attrs)})")
        if isinstance(comm_type, bool) or not isinstance(comm_type, int) or comm_type not in COMM_KINDS:
            raise TraceError(f"{where}: comm_type {comm_type!r} is not a Chakra CollectiveCommType "
                             f"(0..{max(COMM_KINDS)})")
        # comm_size is already the whole collective's bytes (nccl-tests size, no x nranks): checked as given
        checked_size(where, f"{COMM_KINDS[comm_type]} comm_size", size)
        pg_name = next((str(attrs[k]) for k in _PG_NAME_ATTRS if attrs.get(k) not in (None, "")), None)
        stream = attrs.get("stream")
        if stream is None and attrs.get("is_cpu_op") is False:
            stream = attrs.get("tid")  # a device node's tid is its stream
        return _RawCollective(kind=COMM_KINDS[comm_type], size_bytes=size,
                              dtype=_dtype(attrs, n.inputs.types),
                              pg_name=pg_name, stream="0" if stream is None else str(stream),
                              start_us=start_us, duration_us=duration_us, name=name)

    def _read_groups(self, values: str, offset: int) -> None:
        """PyTorch's process-group table, as the `## process_group:init ##` node's input: a JSON list of
        {"pg_name", "pg_desc", "ranks" (empty: all), "group_size"} inside a Python-literal list."""
        configs = _pg_configs(values)
        if not configs:
            self.pg_notes.append(f"the process_group:init node at byte {offset} lists no readable process "
                                 f"groups ({values[:80]!r})")
            return
        for c in configs:
            size = c.get("group_size", c.get("pg_size"))
            ranks = c.get("ranks") or []
            if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
                raise TraceError(f"{self.path}: process group {c.get('pg_name')!r}: ranks {ranks!r} are not "
                                 f"a list of rank numbers")
            if not ranks:
                if not isinstance(size, int) or size < 1:
                    raise TraceError(f"{self.path}: process group {c.get('pg_name')!r} lists no ranks and "
                                     f"no group_size ({c})")
                ranks = list(range(size))
            self.groups[str(c.get("pg_name"))] = tuple(sorted(ranks))
            if c.get("pg_desc") == "default_pg":
                self.default_group_size = len(ranks)

    def workload(self, world_size: int | None) -> Workload:
        path = self.path
        if not self.collectives:
            host = f" ({self.host_colls} host-side COLL nodes, none with a device kernel)" if self.host_colls else ""
            raise TraceError(f"{path}: no collectives: none of its {self.nodes} nodes is a COMM_COLL_NODE "
                             f"with comm_size{host}")
        notes: list[str] = list(self.pg_notes)
        timed = self.timed_nodes > 0
        world, rank, group_of = self._groups(world_size, notes)
        if self.host_colls:
            notes.append(f"{self.host_colls} host-side COLL nodes (is_cpu_op) are launches, not collectives: "
                         f"the {len(self.collectives)} device-side COLL nodes are")
        if not self.cpu_flags:
            notes.append("no node says whether it is a CPU op (is_cpu_op): every COMP node counted as compute")
        p2p = self.type_counts.get(pb.COMM_SEND_NODE, 0) + self.type_counts.get(pb.COMM_RECV_NODE, 0)
        if p2p:
            notes.append(f"{p2p} point-to-point nodes (COMM_SEND/COMM_RECV) are not read")
        if timed:
            steps = self._timed_steps(group_of, notes)
        else:
            steps = (self._untimed_step(group_of, notes),)
        return Workload(name=path.stem, source=str(path), format="chakra", world_size=world,
                        ranks=(RankTrace(rank, steps),), timed=timed, notes=tuple(notes))

    def _groups(self, world_size: int | None, notes: list[str]) -> tuple[int, int, dict[str | None, tuple[int, ...]]]:
        """World size, this trace's rank, and process group name -> ranks."""
        path = self.path
        said = self.meta.get("world_size")
        trace_world = said if isinstance(said, int) and not isinstance(said, bool) and said > 0 else None
        if trace_world is None and self.default_group_size is not None:
            trace_world = self.default_group_size
        if trace_world is None and self.groups:
            trace_world = max(max(r) for r in self.groups.values()) + 1
        if world_size is not None and trace_world is not None and world_size != trace_world:
            raise TraceError(f"{path}: world_size {world_size} given, but the trace says {trace_world}")
        world = world_size or trace_world
        said_rank = self.meta.get("rank")
        rank = said_rank if isinstance(said_rank, int) and not isinstance(said_rank, bool) else None
        if world is None:
            world = 1
            notes.append("the trace names neither the world size nor its rank: read as rank 0 of a 1-rank job "
                         "(Workload.mapped_to(n) replays it data-parallel on n ranks)")
            rank = 0
        elif rank is None:
            rank = 0
            notes.append(f"the trace does not name its rank: taken as rank 0 of {world}")
        if not 0 <= rank < world:
            raise TraceError(f"{path}: rank {rank} is outside the world of {world} ranks")
        whole = tuple(range(world))
        names = sorted({c.pg_name for c in self.collectives if c.pg_name is not None})
        unknown = [g for g in names if g not in self.groups]
        group_of: dict[str | None, tuple[int, ...]] = {None: whole}
        for g in names:
            group_of[g] = self.groups.get(g, whole)
        if len(unknown) > 1:
            raise TraceError(f"{path}: collectives over process groups {unknown} whose ranks the trace does not "
                             f"list (no '## process_group:init ##' entry for them)")
        if unknown:
            notes.append(f"process group {unknown[0]!r} is not listed in the trace: taken as the whole world")
        if len(names) == 0:
            notes.append(f"no collective names its process group: all taken over the whole world of {world} rank(s)")
        for pg, ranks in group_of.items():
            if any(not 0 <= r < world for r in ranks):
                raise TraceError(f"{path}: process group {pg!r} has ranks {list(ranks)} outside the world of "
                                 f"{world} ranks")
        return world, rank, group_of

    def _untimed_step(self, group_of: dict[str | None, tuple[int, ...]], notes: list[str]) -> Step:
        notes.append(f"the trace has no start times (start_time_micros is 0 on all {self.nodes} nodes): one "
                     f"step, collectives in stream order with their own durations but no start, compute not "
                     f"placed ({self.compute_nodes} device compute nodes, {self.compute_total_us:.0f} us in total)")
        if self.markers:
            notes.append(f"{len(self.markers)} ProfilerStep markers cannot split an untimed trace: read as one step")
        colls = tuple(self._collective_out(c, group_of, None) for c in self.collectives)
        return Step(number=0, duration_us=None, compute=(), collectives=colls)

    def _timed_steps(self, group_of: dict[str | None, tuple[int, ...]], notes: list[str]) -> tuple[Step, ...]:
        compute = merge_intervals(self.compute)
        colls = sorted(self.collectives, key=lambda c: c.start_us)  # stable: stream order among equals
        first = self.first_us or 0.0
        last = self.last_us or first
        by_number: dict[int, _StepMarker] = {}
        for m in self.markers:  # one step per number (a step can be marked on the host and on the device)
            seen = by_number.get(m.number)
            by_number[m.number] = m if seen is None else _StepMarker(
                m.number, min(seen.start_us, m.start_us), max(seen.end_us, m.end_us))
        markers = sorted(by_number.values(), key=lambda m: m.start_us)
        if not markers:
            markers = [_StepMarker(0, first, last)]
        starts = [m.start_us for m in markers]
        early = sum(1 for c in colls if c.start_us < starts[0])
        if early:
            notes.append(f"{early} collectives start before the first step marker and are in no step")
        steps = []
        for i, m in enumerate(markers):
            lo = m.start_us
            hi = starts[i + 1] if i + 1 < len(markers) else float("inf")
            mine = [c for c in colls if lo <= c.start_us < hi]
            spans = tuple((max(a, lo) - lo, min(b, hi) - lo) for a, b in compute if b > lo and a < hi)
            if hi == float("inf"):
                ends = [m.end_us] + [b for _, b in compute if b > lo] + [c.start_us + c.duration_us for c in mine]
                hi = max(ends)
            steps.append(Step(number=m.number, duration_us=hi - lo, compute=spans,
                              collectives=tuple(self._collective_out(c, group_of, lo) for c in mine)))
        return tuple(steps)

    @staticmethod
    def _collective_out(c: _RawCollective, group_of: dict[str | None, tuple[int, ...]],
                        step_start_us: float | None) -> Collective:
        return Collective(kind=c.kind, size_bytes=c.size_bytes, dtype=c.dtype, group_ranks=group_of[c.pg_name],
                          stream=c.stream,
                          start_us=None if step_start_us is None else c.start_us - step_start_us,
                          duration_us=c.duration_us, name=c.name)


def _pg_configs(values: str) -> list[dict[str, object]]:
    """The process-group dicts inside a process_group:init node's input text (JSON or Python literal,
    possibly holding the table as a JSON string)."""
    try:
        parsed: object = json.loads(values)
    except ValueError:
        try:
            parsed = ast.literal_eval(values)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return []
    out: list[dict[str, object]] = []

    def walk(obj: object, depth: int) -> None:
        if depth > 8:
            return
        if isinstance(obj, dict):
            if "pg_name" in obj:
                out.append(obj)
            return
        if isinstance(obj, list):
            for item in obj:
                walk(item, depth + 1)
        elif isinstance(obj, str) and obj[:1] in ("[", "{"):
            try:
                walk(json.loads(obj), depth + 1)
            except ValueError:
                return

    walk(parsed, 0)
    return out
