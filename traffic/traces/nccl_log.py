"""NCCL debug logs (`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`) into an untimed `Workload`.

One line per collective call and rank, e.g.
`host:pid:tid [dev] NCCL INFO AllReduce: opCount 1b sendbuff 0x.. recvbuff 0x.. count 237184 datatype 7 op 0
root 0 comm 0x.. [nranks=2] stream 0x..`; some NCCL versions print `acc (nil)` after `recvbuff`, newer ones
append `task T globalrank G`. Text before `host:` (a launcher's prefix) is allowed; other lines are not
collectives and are skipped, but a line that says `NCCL INFO ...: opCount` and does not parse is an error.

- Sizes (nccl-tests convention): `count` is in elements of `datatype`; for AllGather it is the per-rank send
  count and for ReduceScatter the per-rank receive count, so those are multiplied by `nranks`.
- Ranks: `globalrank` where the line has it, else one rank per (host, pid, device) in order of appearance (a
  process that drives several GPUs logs one device per rank; with one GPU per process this is (host, pid)).
- Process groups: within a rank, the `comm` pointer (with `nranks`) is one communicator; pointers differ between
  processes, so a communicator of all ranks is taken as ranks 0..N-1, and a smaller one is matched across ranks
  by its sequence of calls (same opCount/op/count/datatype); where that cannot decide, the contiguous block of
  `nranks` ranks holding the rank is assumed (noted).
- Send lines are point-to-point transfers (`send_recv`, peer = `root`); Recv lines are left out, since each
  transfer counts once, at its sender (noted).
- Steps: the log has no step markers. Each rank's collectives are in log order (opCount order per communicator);
  a new step starts where a communicator's opCount restarts (goes back), or every `collectives_per_step`
  collectives when given.
- No timings: `timed=False`, no durations. With `compute_gap_us`, each collective is preceded by that much
  compute: compute interval i is [i*gap, (i+1)*gap) and collective i starts at (i+1)*gap, as if collectives took
  no time (their durations are unknown); without it there is no compute. A note says which.
"""
from __future__ import annotations

import io
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from traffic.traces import open_trace, read_error
from traffic.workload import (DTYPE_BYTES, Collective, RankTrace, Step, TraceError, Workload, collective_kind,
                              is_receive, merge_intervals)

#: NCCL's ncclDataType_t values (nccl.h) -> canonical dtype names.
NCCL_DATATYPES = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64", 6: "float16",
                  7: "float32", 8: "float64", 9: "bfloat16", 10: "float8_e4m3fn", 11: "float8_e5m2"}

_LINE = re.compile(
    r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO (?P<op>[A-Za-z]+): "
    r"opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) recvbuff (?P<recvbuff>\S+)"
    r"(?: acc (?P<acc>\S+))? count (?P<count>\d+) datatype (?P<datatype>\d+) op (?P<redop>\d+) "
    r"root (?P<root>-?\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)"
    r"(?: task (?P<task>-?\d+) globalrank (?P<globalrank>\d+))?\s*$")
_CANDIDATE = re.compile(r"NCCL INFO [A-Za-z]+: opCount ")
_SIGNATURE_OPS = 16  # calls compared when matching a communicator across ranks


@dataclass(frozen=True)
class _Call:
    process: tuple[str, int, int]  # (host, pid, device)
    globalrank: int | None
    op: str
    opcount: int
    count: int
    dtype: str
    root: int
    comm: str
    nranks: int
    stream: str
    where: str  # "file:line", for messages


def read_nccl_logs(paths: list[Path], *, source: Path, compute_gap_us: float | None = None,
                   collectives_per_step: int | None = None) -> Workload:
    """One Workload from one or more NCCL COLL logs (e.g. one per rank, or one for the whole job)."""
    if compute_gap_us is not None and not compute_gap_us >= 0:
        raise TraceError(f"{source}: compute_gap_us must be >= 0, got {compute_gap_us!r}")
    gap_us = None if compute_gap_us is None else float(compute_gap_us)
    if collectives_per_step is not None and collectives_per_step < 1:
        raise TraceError(f"{source}: collectives_per_step must be >= 1, got {collectives_per_step!r}")
    calls: list[_Call] = []
    for path in paths:
        calls.extend(_read(path))
    if not calls:
        raise TraceError(f"{source}: no collectives at all (no 'NCCL INFO <Op>: opCount ...' lines; log with "
                         "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL)")
    notes: list[str] = []
    rank_of = _ranks(calls, notes)
    world = max([c.nranks for c in calls] + [r + 1 for r in rank_of.values()])
    groups = _groups(calls, rank_of, world, notes)
    by_rank: dict[int, list[_Call]] = {}
    for c in calls:
        by_rank.setdefault(rank_of[c.process if c.globalrank is None else c.globalrank], []).append(c)
    receives = sum(1 for c in calls if is_receive(c.op))
    ranks = []
    for rank in sorted(by_rank):
        sent = [c for c in by_rank[rank] if not is_receive(c.op)]
        steps = _split(sent, collectives_per_step)
        ranks.append(RankTrace(rank, tuple(_step(i, s, rank, groups, gap_us) for i, s in enumerate(steps))))
    if not any(s.collectives for r in ranks for s in r.steps):
        raise TraceError(f"{source}: no collectives at all (only Recv lines)")
    notes.append("NCCL log: no timings; steps split " + (
        f"every {collectives_per_step} collectives" if collectives_per_step else "where an opCount restarts"))
    if compute_gap_us is None:
        notes.append("no compute assumed: collectives back to back (pass compute_gap_us to assume some)")
    else:
        notes.append(f"assumed {compute_gap_us:g} us of compute before each collective (collectives taken as "
                     "instantaneous when placing it)")
    if receives:
        notes.append(f"{receives} Recv line(s) left out: a point-to-point transfer counts once, at its sender")
    name = source.name if source.is_dir() else source.name.split(".")[0]
    return Workload(name=name, source=str(source), format="nccl-log", world_size=world, ranks=tuple(ranks),
                    timed=False, notes=tuple(notes))


def _read(path: Path) -> list[_Call]:
    out = []
    try:
        with open_trace(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as text:
            for number, line in enumerate(text, 1):
                if "NCCL INFO" not in line or not _CANDIDATE.search(line):
                    continue
                m = _LINE.search(line)
                if m is None:
                    raise TraceError(f"{path}:{number}: an NCCL collective line that does not parse: "
                                     f"{line.strip()[:200]!r}")
                out.append(_call(m, f"{path}:{number}"))
    except (EOFError, OSError, zlib.error) as exc:
        raise read_error(path, exc) from None
    return out


def _call(m: re.Match[str], where: str) -> _Call:
    code = int(m["datatype"])
    dtype = NCCL_DATATYPES.get(code)
    if dtype is None:
        raise TraceError(f"{where}: unknown NCCL datatype {code}")
    if collective_kind(m["op"]) is None:
        raise TraceError(f"{where}: unknown NCCL operation {m['op']!r}")
    nranks = int(m["nranks"])
    if nranks < 1:
        raise TraceError(f"{where}: nranks={nranks}")
    return _Call((m["host"], int(m["pid"]), int(m["dev"])),
                 int(m["globalrank"]) if m["globalrank"] is not None else None, m["op"], int(m["opcount"], 16),
                 int(m["count"]), dtype, int(m["root"]), m["comm"], nranks, m["stream"], where)


def _ranks(calls: list[_Call], notes: list[str]) -> dict[object, int]:
    """Rank of every process (and of every globalrank): globalrank where given, else order of appearance."""
    rank_of: dict[object, int] = {}
    for c in calls:
        if c.globalrank is not None:
            rank_of.setdefault(c.process, c.globalrank)
            rank_of[c.globalrank] = c.globalrank
    taken = {v for v in rank_of.values()}
    numbered = 0
    for c in calls:
        if c.process not in rank_of:
            free = next(r for r in range(len(taken) + 1) if r not in taken)
            rank_of[c.process] = free
            taken.add(free)
            numbered += 1
    if numbered:
        notes.append(f"{numbered} rank(s) numbered by (host, pid, device) in order of appearance (no globalrank)")
    return rank_of


def _rank(c: _Call, rank_of: dict[object, int]) -> int:
    return rank_of[c.process if c.globalrank is None else c.globalrank]


def _groups(calls: list[_Call], rank_of: dict[object, int], world: int,
            notes: list[str]) -> dict[tuple[int, str], tuple[int, ...]]:
    """(rank, comm pointer) -> the communicator's global ranks, ascending."""
    history: dict[tuple[int, str], list[tuple[int, str, int, str]]] = {}
    nranks: dict[tuple[int, str], int] = {}
    for c in calls:
        key = (_rank(c, rank_of), c.comm)
        nranks[key] = c.nranks
        seq = history.setdefault(key, [])
        if len(seq) < _SIGNATURE_OPS and not c.op.lower().startswith(("send", "recv")):
            seq.append((c.opcount, c.op, c.count, c.dtype))
    out: dict[tuple[int, str], tuple[int, ...]] = {}
    members: dict[tuple[int, tuple[tuple[int, str, int, str], ...]], list[int]] = {}
    for key, n in nranks.items():
        if n == world:
            out[key] = tuple(range(world))
        else:
            members.setdefault((n, tuple(history[key])), []).append(key[0])
    guessed = 0
    for key, n in nranks.items():
        if key in out:
            continue
        same = sorted(set(members[(n, tuple(history[key]))]))
        if len(same) % n == 0:
            i = same.index(key[0]) // n
            out[key] = tuple(same[i * n:(i + 1) * n])
            if len(same) == n:
                continue
        else:
            first = key[0] // n * n
            out[key] = tuple(range(first, first + n))
        guessed += 1
    if guessed:
        notes.append(f"{guessed} communicator(s) smaller than the job could not be told apart from the log: "
                     "taken as contiguous blocks of ranks")
    return out


def _split(calls: list[_Call], per_step: int | None) -> list[list[_Call]]:
    if per_step is not None:
        return [calls[i:i + per_step] for i in range(0, len(calls), per_step)] or [[]]
    steps: list[list[_Call]] = [[]]
    last: dict[str, int] = {}
    for c in calls:
        if c.comm in last and c.opcount < last[c.comm]:
            steps.append([])
            last = {}
        last[c.comm] = c.opcount
        steps[-1].append(c)
    return steps


def _step(number: int, calls: list[_Call], rank: int, groups: dict[tuple[int, str], tuple[int, ...]],
          gap_us: float | None) -> Step:
    collectives = []
    for i, c in enumerate(calls):
        kind = collective_kind(c.op) or "unknown"
        group = groups[(rank, c.comm)]
        size = c.count * DTYPE_BYTES[c.dtype]
        if kind in ("all_gather", "reduce_scatter"):
            size *= c.nranks
        if kind == "send_recv":
            peer = group[c.root] if 0 <= c.root < len(group) else c.root
            group = tuple(sorted({rank, peer}))
        start = None if gap_us is None else (i + 1) * gap_us
        collectives.append(Collective(kind, size, c.dtype, group, c.stream, start, None,
                                      f"{c.op} opCount {c.opcount:x} comm {c.comm}"))
    compute = () if gap_us is None else merge_intervals((i * gap_us, (i + 1) * gap_us) for i in range(len(calls)))
    return Step(number, None, compute, tuple(collectives))
