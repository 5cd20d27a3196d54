"""A workload's collectives per step and process group, as one rank sees them (pure).

`trace show` prints this table for jobs too large to list rank by rank: for one rank (rank 0 by
default), per step, each group it communicates in (its stream: "tp", "pp", "dp", "ep" for generated
LLM workloads and AICB files; the device stream for recorded traces) and each collective kind there,
the count (an entry's `count` included), the size of one collective (smallest and largest) and the
total bytes, and the group's size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traffic.workload import TraceError, Workload


@dataclass(frozen=True)
class GroupRow:
    step: int  # the step's number
    group: str  # the stream the collectives ran on (the process group's name where the workload has one)
    kind: str
    group_size: int  # ranks in the group (the largest, if the stream runs groups of several sizes)
    count: int  # collectives, an entry's `count` included
    min_bytes: int  # one collective's size (nccl-tests convention), smallest and largest
    max_bytes: int
    total_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "group": self.group, "kind": self.kind, "group_size": self.group_size,
                "count": self.count, "min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
                "total_bytes": self.total_bytes}


def by_group(workload: Workload, rank: int = 0) -> list[GroupRow]:
    """Rank `rank`'s collectives per step, group (stream) and kind, in the order they first appear."""
    trace = next((r for r in workload.ranks if r.rank == rank), None)
    if trace is None:
        have = [r.rank for r in workload.ranks]
        shown = ", ".join(map(str, have[:8])) + (", ..." if len(have) > 8 else "")
        raise TraceError(f"{workload.source}: rank {rank} is not in the trace (it has ranks {shown})")
    rows: list[GroupRow] = []
    for step in trace.steps:
        acc: dict[tuple[str, str], list[int]] = {}
        for c in step.collectives:
            key = (c.stream, c.kind)
            a = acc.get(key)
            if a is None:
                acc[key] = [c.group_size, c.count, c.size_bytes, c.size_bytes, c.total_bytes]
            else:
                a[0] = max(a[0], c.group_size)
                a[1] += c.count
                a[2] = min(a[2], c.size_bytes)
                a[3] = max(a[3], c.size_bytes)
                a[4] += c.total_bytes
        rows.extend(GroupRow(step.number, g, k, *v) for (g, k), v in acc.items())
    return rows
