"""A Kineto trace's collectives: one per sized NCCL kernel (new style) or per collective annotation (old
style, and CPU-only traces), placed in their steps, with the notes on what was left out or assumed (see
`traffic.traces.kineto`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traffic.traces.kineto_attach import Annotation, NcclKernel, attach
from traffic.traces.kineto_events import Pass1
from traffic.traces.kineto_steps import Boundaries, step_index
from traffic.workload import (DTYPE_BYTES, Collective, TraceError, canonical_dtype, checked_size, collective_kind,
                              is_receive)

_NAMED_KERNELS = 10  # unattributed NCCL kernels named in the note (the rest are counted)


def world_size(info: dict[str, Any], p: Pass1, rank: int) -> int:
    sizes = [rank + 1]
    if isinstance(info.get("world_size"), int):
        sizes.append(info["world_size"])
    for k in p.nccl_kernels:
        if isinstance(k.args.get("Group size"), int):
            sizes.append(k.args["Group size"])
        sizes.extend(r + 1 for r in _parse_ranks(k.args.get("Process Group Ranks")) or ())
    return max(sizes)


def _parse_ranks(raw: Any) -> tuple[int, ...] | None:
    """`Process Group Ranks`: a list, or a string such as "[0, 1]"; None if absent or unreadable."""
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(r, int) and r >= 0 for r in value):
        return tuple(sorted(value))
    return None


def collectives_into_steps(path: Path, p: Pass1, launches: dict[int, tuple[float, tuple[str, str]]],
                           steps: list[tuple[int, float, float]], bounds: Boundaries, world: int,
                           per_step: list[list[Collective]], notes: list[str], tag: str) -> int:
    """Fill per_step with the step's collectives; return how many fell outside every step."""
    attach(p.annotations, p.nccl_kernels, launches)
    whole = tuple(range(world))
    outside = receives = 0

    def place(index: int | None, coll: Collective) -> None:
        nonlocal outside
        if index is None:
            outside += 1
            return
        start = steps[index][1]
        per_step[index].append(Collective(coll.kind, coll.size_bytes, coll.dtype, coll.group_ranks, coll.stream,
                                          (coll.start_us or 0.0) - start, coll.duration_us, coll.name))

    unlaunched = 0
    for k in p.nccl_kernels:  # new style: one collective per kernel
        if not k.sized:
            continue
        if k.launch_us is None:
            unlaunched += 1
        op = str(k.args["Collective name"])
        if is_receive(op):
            receives += 1
            continue
        launched = k.start_us if k.launch_us is None else k.launch_us
        place(step_index(bounds.region_of_time(launched)), _new_style(path, k, op, whole))
    _unattributed(path, p, notes, tag)
    counted = cpu_only = by_annotation = 0
    for ann in p.annotations:  # old style, and CPU-only: one collective per annotation
        kernels = sorted((k for k in ann.kernels if not k.sized), key=lambda k: k.start_us)
        if ann.kernels and not kernels:
            continue  # its new-style kernels carry the collective
        counted += 1
        if ann.receive:
            receives += 1
            continue
        if kernels:
            end = max(k.start_us + k.duration_us for k in kernels)
            coll = _from_annotation(path, ann, whole, kernels[0].stream, kernels[0].start_us,
                                    end - kernels[0].start_us, kernels[0].name)
        else:
            cpu_only += 1
            coll = _from_annotation(path, ann, whole, f"thread:{ann.thread[1]}", ann.start_us,
                                    ann.end_us - ann.start_us, ann.name)
        by_annotation += 1
        place(step_index(bounds.region_of_time(ann.start_us)), coll)
    unsized = [k for k in p.nccl_kernels if not k.sized]
    by_order = sum(1 for k in unsized if k.launch_us is None and k.annotation is not None)
    if by_annotation:
        notes.append(f"process groups are not recorded on nccl:/gloo: annotations: those collectives are taken "
                     f"over all {world} ranks")
    if unsized and counted != len(unsized):
        notes.append(f"{tag}collectives counted from the {counted} nccl:/gloo: annotation(s), receives included; "
                     f"the {len(unsized)} NCCL kernel(s) without sizes give their timing only")
    if cpu_only and (p.nccl_kernels or p.compute_kernels):
        notes.append(f"{tag}{cpu_only} collective(s) had no device kernel: timed by their CPU annotation")
    if receives:
        notes.append(f"{tag}{receives} receive(s) left out: a point-to-point transfer counts once, at its sender")
    if unlaunched:
        notes.append(f"{tag}{unlaunched} NCCL kernel(s) without a launch event in the trace: placed by their "
                     "device start")
    if by_order:
        notes.append(f"{tag}{by_order} NCCL kernel(s) without a launch event in the trace: attached to their "
                     "nccl: annotation by stream, kind and order")
    return outside


def _unattributed(path: Path, p: Pass1, notes: list[str], tag: str) -> None:
    """Note the kernels without sizes that no annotation took: in a trace sized by its annotations, the profiler
    window cut theirs off, so they are outside the recording like any collective there. Without such annotations
    nothing gives their size: the trace is refused."""
    left = sorted((k for k in p.nccl_kernels if not k.sized and k.annotation is None), key=lambda k: k.start_us)
    if not left:
        return
    if not any(a.input_bytes is not None and a.name.startswith("nccl:") for a in p.annotations):
        raise TraceError(f"{path}: NCCL kernel {left[0].short_name!r} at ts {left[0].start_us} has no size: no "
                         "'In msg nelems' args, and no nccl:* annotation in the trace has 'Input Dims' to give it")
    named = ", ".join(f"{k.short_name!r} at ts {k.start_us}" for k in left[:_NAMED_KERNELS])
    more = f" and {len(left) - _NAMED_KERNELS} more" if len(left) > _NAMED_KERNELS else ""
    notes.append(f"{tag}{len(left)} NCCL kernel(s) without sizes matched no nccl: annotation (the profiler window "
                 f"cut theirs off), left out: {named}{more}")


def _new_style(path: Path, k: NcclKernel, op: str, whole: tuple[int, ...]) -> Collective:
    where, what = f"{path} at ts {k.start_us}", f"NCCL kernel {k.short_name!r}"
    kind = collective_kind(op)
    if kind is None:
        raise TraceError(f"{where}: {what}: unknown 'Collective name' {op!r}")
    raw_dtype = k.args.get("dtype")
    dtype = canonical_dtype(raw_dtype) if isinstance(raw_dtype, str) else None
    if dtype is None:
        raise TraceError(f"{where}: {what}: unknown dtype {raw_dtype!r}")
    nelems = {key: k.args.get(key) for key in ("In msg nelems", "Out msg nelems")}
    sizes = [checked_size(where, f"{what} {key} {n} x {dtype}", n * DTYPE_BYTES[dtype])  # each: max() hides one
             for key, n in nelems.items() if isinstance(n, int) and not isinstance(n, bool)]
    if not sizes:
        raise TraceError(f"{where}: {what}: message sizes {list(nelems.values())!r} are not counts")
    ranks = _parse_ranks(k.args.get("Process Group Ranks"))
    size = k.args.get("Group size")
    if ranks is None or (isinstance(size, int) and len(ranks) != size):
        if isinstance(size, int) and size != len(whole):
            raise TraceError(f"{where}: {what}: process group of {size} ranks but "
                             f"'Process Group Ranks' {k.args.get('Process Group Ranks')!r} does not list them")
        ranks = whole
    return Collective(kind, max(sizes), dtype, ranks, k.stream, k.start_us, k.duration_us, k.name)


def _from_annotation(path: Path, ann: Annotation, whole: tuple[int, ...], stream: str, start_us: float,
                     duration_us: float, name: str) -> Collective:
    if ann.input_bytes is None:
        if ann.kind != "barrier":
            raise TraceError(f"{path}: collective without sizes: annotation {ann.name!r} at ts {ann.start_us} has "
                             "no 'Input Dims'/'Input type' (record with record_shapes=True)")
        size = 0
    else:
        group = len(whole) if ann.kind in ("all_gather", "gather") else 1
        size = checked_size(f"{path} at ts {ann.start_us}",
                            f"annotation {ann.name!r}: {ann.input_bytes} input bytes x {group} rank(s)",
                            ann.input_bytes * group)
    return Collective(ann.kind, size, ann.dtype, whole, stream, start_us, duration_us, name)
