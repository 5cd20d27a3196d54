"""Reading a Kineto trace: its JSON streamed with ijson (`events`, `read_header`), the fields of an event,
and pass 1 over the events (`pass1`): steps, collective annotations, NCCL kernels, a bounded sample of the
launches and the set of their correlation ids (see `traffic.traces.kineto`). Parsing uses ijson's C backend
(`yajl2_c`) where it is installed, else ijson's default (`BACKEND` says which)."""
from __future__ import annotations

import ast
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ijson

from traffic.traces.files import open_trace, read_error
from traffic.traces.kineto_attach import Annotation, NcclKernel
from traffic.workload import DTYPE_BYTES, TraceError, canonical_dtype, checked_size, collective_kind, is_receive

try:
    _IJSON: Any = ijson.get_backend("yajl2_c")
except ImportError:  # no compiled backend on this platform: ijson's default (pure Python or cffi)
    _IJSON = ijson
#: The ijson backend in use ("yajl2_c" where the C extension is available).
BACKEND: str = str(_IJSON.backend_name)

NCCL_KERNEL_PREFIXES = ("ncclKernel_", "ncclDevKernel_")
COLLECTIVE_ANNOTATION_PREFIXES = ("nccl:", "gloo:")
STEP_PREFIX = "ProfilerStep#"
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
_ANNOTATION_CATS = frozenset({"user_annotation", "cpu_op"})
_READ_ERRORS = (ijson.JSONError, EOFError, OSError, zlib.error, UnicodeDecodeError)
_HEADER_KEYS = frozenset({"distributedInfo"})  # top-level metadata kept from the header
_MAX_SAMPLES = 1 << 13  # launch (correlation, ts) samples kept in pass 1; thinned by half when full


class LaunchIds:
    """The correlation ids of the trace's launch events, a bitmap in blocks of 1024 ids: memory follows the span of
    the ids (dense in a real trace: 128 bytes per 1024 launches), not an object per launch."""

    _SHIFT = 10
    _MASK = (1 << _SHIFT) - 1

    def __init__(self) -> None:
        self._blocks: dict[int, bytearray] = {}

    def add(self, corr: int) -> None:
        block = self._blocks.get(corr >> self._SHIFT)
        if block is None:
            block = self._blocks[corr >> self._SHIFT] = bytearray(1 << (self._SHIFT - 3))
        bit = corr & self._MASK
        block[bit >> 3] |= 1 << (bit & 7)

    def __contains__(self, corr: object) -> bool:
        if not isinstance(corr, int):
            return False
        block = self._blocks.get(corr >> self._SHIFT)
        bit = corr & self._MASK
        return block is not None and bool(block[bit >> 3] >> (bit & 7) & 1)


@dataclass
class Pass1:
    """What pass 1 keeps of a trace (`pass1`)."""

    steps: dict[int, list[float]] = field(default_factory=dict)  # number -> [start_us, end_us]
    annotations: list[Annotation] = field(default_factory=list)
    nccl_kernels: list[NcclKernel] = field(default_factory=list)
    compute_kernels: int = 0
    first_us: float = float("inf")
    last_us: float = float("-inf")
    samples: list[tuple[int, float]] = field(default_factory=list)  # (correlation, ts) of launches, thinned
    sample_stride: int = 1
    launches_seen: int = 0
    min_launch: tuple[int, float] | None = None
    max_launch: tuple[int, float] | None = None
    launch_ids: LaunchIds = field(default_factory=LaunchIds)  # every launch's correlation id


def events(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with open_trace(path) as f:
            for ev in _IJSON.items(f, "traceEvents.item", use_float=True):
                if not isinstance(ev, dict):
                    raise TraceError(f"{path}: a traceEvents entry is not an object: {str(ev)[:80]!r}")
                yield ev
    except _READ_ERRORS as exc:
        raise read_error(path, exc) from None


def read_header(path: Path) -> dict[str, Any]:
    """The top-level keys before `traceEvents` (Kineto writes its metadata there); checks it is a Chrome trace."""
    header: dict[str, Any] = {}
    try:
        with open_trace(path) as f:
            parser = _IJSON.parse(f, use_float=True)
            first = next(parser, None)
            if first is None or first[1] != "start_map":
                raise TraceError(f"{path}: JSON that is not a Chrome trace (the top level is not an object "
                                 "with traceEvents)")
            key: str | None = None
            builder: Any = None
            for prefix, event, value in parser:
                if prefix == "" and event in ("map_key", "end_map"):
                    if key is not None and builder is not None:
                        header[key] = builder.value
                    if event == "end_map":
                        break
                    if value == "traceEvents":
                        return header
                    key, builder = value, (ijson.ObjectBuilder() if value in _HEADER_KEYS else None)
                elif builder is not None:
                    builder.event(event, value)
    except _READ_ERRORS as exc:
        raise read_error(path, exc) from None
    raise TraceError(f"{path}: JSON that is not a Chrome trace (no traceEvents)")


def distributed_info(raw: Any) -> dict[str, Any]:
    """Kineto's `distributedInfo`: an object, or (recent PyTorch) a string holding a Python dict literal."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(raw)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, dict):
                return value
    return {}


def event_args(ev: dict[str, Any]) -> dict[str, Any]:
    args = ev.get("args")
    return args if isinstance(args, dict) else {}


def thread(ev: dict[str, Any]) -> tuple[str, str]:
    """(pid, tid) of a CPU event, as strings (Chrome traces allow numbers or names)."""
    return str(ev.get("pid")), str(ev.get("tid"))


def num(ev: dict[str, Any], key: str, path: Path) -> float:
    value = ev.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TraceError(f"{path}: event {str(ev.get('name'))[:60]!r} has no numeric {key!r} (got {value!r})")


def pass1(path: Path) -> Pass1:
    p = Pass1()
    for ev in events(path):
        cat = ev.get("cat")
        if cat == "kernel" or cat == "Kernel":
            name = str(ev.get("name", ""))
            start = num(ev, "ts", path)
            end = start + num(ev, "dur", path)
            if name.startswith(NCCL_KERNEL_PREFIXES):
                args = event_args(ev)
                corr = args.get("correlation")
                p.nccl_kernels.append(NcclKernel(name, corr if isinstance(corr, int) else None,
                                                  str(ev.get("tid")), start, end - start, args))
            else:
                p.compute_kernels += 1
        elif cat in LAUNCH_CATS:
            corr = event_args(ev).get("correlation")
            if isinstance(corr, int):
                _sample(p, corr, num(ev, "ts", path))
            continue
        elif cat in _ANNOTATION_CATS:
            name = str(ev.get("name", ""))
            if name.startswith(STEP_PREFIX):
                _add_step(p, name, ev, path)
            elif name.startswith(COLLECTIVE_ANNOTATION_PREFIXES):
                p.annotations.append(_annotation(name, ev, path))
        else:
            continue
        start = num(ev, "ts", path)
        p.first_us = min(p.first_us, start)
        p.last_us = max(p.last_us, start + float(ev.get("dur") or 0.0))
    return p


def _sample(p: Pass1, corr: int, ts: float) -> None:
    p.launch_ids.add(corr)
    if p.min_launch is None or corr < p.min_launch[0]:
        p.min_launch = (corr, ts)
    if p.max_launch is None or corr > p.max_launch[0]:
        p.max_launch = (corr, ts)
    p.launches_seen += 1
    if p.launches_seen % p.sample_stride:
        return
    p.samples.append((corr, ts))
    if len(p.samples) >= _MAX_SAMPLES:
        p.samples.sort()
        p.samples = p.samples[::2]
        p.sample_stride *= 2


def _add_step(p: Pass1, name: str, ev: dict[str, Any], path: Path) -> None:
    try:
        number = int(name[len(STEP_PREFIX):])
    except ValueError:
        raise TraceError(f"{path}: step marker {name!r} has no step number") from None
    start = num(ev, "ts", path)
    end = start + num(ev, "dur", path)
    known = p.steps.get(number)
    if known is None:
        p.steps[number] = [start, end]
    else:  # the same step on another CPU track: count it once
        known[0], known[1] = min(known[0], start), max(known[1], end)


def _annotation(name: str, ev: dict[str, Any], path: Path) -> Annotation:
    op = name.split(":", 1)[1]
    kind = collective_kind(op)
    if kind is None:
        raise TraceError(f"{path}: unknown collective {name!r} at ts {ev.get('ts')}")
    start = num(ev, "ts", path)
    args = event_args(ev)
    sized = _input_bytes(args.get("Input Dims"), args.get("Input type"), f"{path} at ts {start}",
                         f"annotation {name!r}")
    return Annotation(name, kind, is_receive(op), thread(ev), start,
                       start + num(ev, "dur", path), sized[0] if sized else None, sized[1] if sized else "unknown")


def _input_bytes(dims: Any, types: Any, where: str, what: str) -> tuple[int, str] | None:
    """Sum of numel x dtype size over the tensor inputs, and the first tensor's dtype; None if there are none.
    A negative dimension, or more than MAX_COLLECTIVE_BYTES, is a TraceError naming `where` and `what`."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0
    first: str | None = None
    for shape, type_name in zip(dims, types):
        if isinstance(shape, list) and any(isinstance(d, int) and d < 0 for d in shape):
            raise TraceError(f"{where}: {what}: negative dimension in Input Dims {str(shape)[:80]}")
        dtype = canonical_dtype(type_name) if isinstance(type_name, str) else None
        if dtype is None or not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            continue
        tensor = DTYPE_BYTES[dtype] if 0 not in shape else 0
        for d in shape:
            # refused as soon as it is too big: a hostile shape's exact product could take long to compute
            tensor = checked_size(where, f"{what}: Input Dims {str(shape)[:80]} x {dtype}", tensor * d)
        total = checked_size(where, f"{what}: Input Dims x Input type summed", total + tensor)
        first = first or dtype
    return (total, first) if first else None

