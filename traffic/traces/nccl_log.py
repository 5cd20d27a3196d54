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
- Sizes are checked where read (`checked_size`): a negative count, or a collective of more than 2^48 bytes
  (count x dtype size, x nranks for AllGather/ReduceScatter), is a TraceError naming file:line.
- Steps: the log has no step markers, so steps are found per rank, in this order of precedence:
  1. `collectives_per_step` (`--step-ops N`) given: every N collectives (of the rank, in log order) are a step.
  2. A communicator's opCount restarts (goes back, as when a communicator is destroyed and a new one gets the
     same pointer): a new step starts at each restart.
  3. Otherwise the log's own period. The rank's *busiest* communicator (the most bytes; first seen on a tie)
     defines it, because that is the one a training step drives (DDP's gradient all-reduces), and the others'
     calls (a 2-rank group, point-to-point sends) are fewer and may not repeat as cleanly. On that
     communicator's calls, as (op, count, datatype), a period p is a length such that the calls end in at
     least two exact repeats of the same p calls; the run of repeats is extended back as far as it goes and
     cut into whole periods counted from the end (k = how many). Of all such p, the one covering the most
     calls (k x p) wins, the smallest on a tie. (Plainly the smallest p would differ only where a step itself
     ends in repeated calls: steps of sizes [A, B, B] end in "B, B", a period of 1 call, which would make steps
     of one call and the rest warm-up; the most calls covered reads the period of 3.)
     The winner must cover at least half of the communicator's calls: a single step that happens to end in two
     equal calls ([A, B, C, D, D]) is one step, not two steps of one call after three calls of warm-up.
     Each full period is a step, starting at its first call on the busiest communicator; every other call
     of the rank goes to the step it falls in by log order. Calls before the first full period are warm-up
     (DDP rebuilds its buckets after the first step, so the first period may differ; NCCL's and DDP's setup
     broadcasts come first too): they are left out of the steps, so that per-step figures are the steady
     state, and a note gives their count and bytes. No period: the rank is one step, as logged. A log cut in the middle of a step has no period at its end (or a shifted one):
     pass `--step-ops` there.
  Ranks whose logs agree get the same steps (the rule reads only each rank's own calls); ranks that end up with
  different numbers of steps are named in a note. The notes say, per group of ranks, which rule split them.
- No timings: `timed=False`, no durations. With `compute_gap_us`, each collective is preceded by that much
  compute: compute interval i is [i*gap, (i+1)*gap) and collective i starts at (i+1)*gap, as if collectives took
  no time (their durations are unknown); without it there is no compute. A note says which.
"""
from __future__ import annotations

import io
import itertools
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from traffic.traces.files import open_trace, read_error
from traffic.workload import (DTYPE_BYTES, Collective, RankTrace, Step, TraceError, Workload, checked_size,
                              collective_kind, is_receive, merge_intervals)

#: NCCL's ncclDataType_t values (nccl.h) -> canonical dtype names.
NCCL_DATATYPES = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64", 6: "float16",
                  7: "float32", 8: "float64", 9: "bfloat16", 10: "float8_e4m3fn", 11: "float8_e5m2"}

_LINE = re.compile(
    r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO (?P<op>[A-Za-z]+): "
    r"opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) recvbuff (?P<recvbuff>\S+)"
    r"(?: acc (?P<acc>\S+))? count (?P<count>-?\d+) datatype (?P<datatype>\d+) op (?P<redop>\d+) "
    r"root (?P<root>-?\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)"
    r"(?: task (?P<task>-?\d+) globalrank (?P<globalrank>\d+))?\s*$")
_CANDIDATE = re.compile(r"NCCL INFO [A-Za-z]+: opCount ")
_SIGNATURE_OPS = 16  # calls compared when matching a communicator across ranks
#: The most ranks a communicator (nranks) or a globalrank may name: beyond any job (the largest train on a few
#: hundred thousand GPUs), yet small enough that a communicator's tuple of ranks fits in memory: a hostile
#: `[nranks=4000000000]` would otherwise build a tuple of 4e9 ranks.
MAX_RANKS = 1 << 20
_COUNT_DIGITS = 20  # a count with more digits is far above MAX_COLLECTIVE_BYTES (and int() refuses 4300+)
_PER_SIZE_KINDS = ("all_gather", "reduce_scatter")  # count is per rank: the nccl-tests size is count x nranks


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
    size_bytes: int  # nccl-tests size, checked (checked_size)

    @property
    def signature(self) -> tuple[str, int, str]:
        """What a call is when looking for the log's period: (op, count, datatype)."""
        return (self.op, self.count, self.dtype)


def read_nccl_logs(paths: list[Path], *, source: Path, compute_gap_us: float | None = None,
                   collectives_per_step: int | None = None) -> Workload:
    """One Workload from one or more NCCL COLL logs (e.g. one per rank, or one for the whole job)."""
    if compute_gap_us is not None and not compute_gap_us >= 0:
        raise TraceError(f"{source}: compute_gap_us must be >= 0, got {compute_gap_us!r}")
    gap_us = None if compute_gap_us is None else float(compute_gap_us)
    if collectives_per_step is not None and collectives_per_step < 1:
        raise TraceError(f"{source}: collectives_per_step must be >= 1 (--step-ops), got "
                         f"{collectives_per_step!r}")
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
    splits: dict[int, _Split] = {}
    for rank in sorted(by_rank):
        sent = [c for c in by_rank[rank] if not is_receive(c.op)]
        splits[rank] = _split(sent, collectives_per_step)
        ranks.append(RankTrace(rank, tuple(_step(i, s, rank, groups, gap_us)
                                           for i, s in enumerate(splits[rank].steps))))
    if not any(s.collectives for r in ranks for s in r.steps):
        raise TraceError(f"{source}: no collectives at all (only Recv lines)")
    notes.append("NCCL log: no timings")
    notes.extend(_step_notes(splits, collectives_per_step))
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
                try:
                    out.append(_call(m, f"{path}:{number}"))
                except ValueError:  # int() refuses a decimal of 4300+ digits (a pid, a device, a root ...)
                    raise TraceError(f"{path}:{number}: a number too long to read in the NCCL collective line "
                                     f"{line.strip()[:200]!r}") from None
    except (EOFError, OSError, zlib.error) as exc:
        raise read_error(path, exc) from None
    return out


def _call(m: re.Match[str], where: str) -> _Call:
    code = int(m["datatype"])
    dtype = NCCL_DATATYPES.get(code)
    if dtype is None:
        raise TraceError(f"{where}: unknown NCCL datatype {code}")
    kind = collective_kind(m["op"])
    if kind is None:
        raise TraceError(f"{where}: unknown NCCL operation {m['op']!r}")
    nranks = int(m["nranks"])
    if not 1 <= nranks <= MAX_RANKS:
        raise TraceError(f"{where}: {m['op']} opCount {m['opcount']}: nranks={nranks} (a communicator has 1 to "
                         f"{MAX_RANKS} ranks)")
    globalrank = int(m["globalrank"]) if m["globalrank"] is not None else None
    if globalrank is not None and globalrank >= MAX_RANKS:
        raise TraceError(f"{where}: {m['op']} opCount {m['opcount']}: globalrank {globalrank} (at most "
                         f"{MAX_RANKS - 1})")
    count = _count(m, kind, dtype, nranks, where)
    size = count * DTYPE_BYTES[dtype] * (nranks if kind in _PER_SIZE_KINDS else 1)
    checked_size(where, _what(m, kind, dtype, nranks), size)
    return _Call((m["host"], int(m["pid"]), int(m["dev"])), globalrank, m["op"], int(m["opcount"], 16),
                 count, dtype, int(m["root"]), m["comm"], nranks, m["stream"], where, size)


def _what(m: re.Match[str], kind: str, dtype: str, nranks: int) -> str:
    """The event and the fields its size comes from, for size errors: "AllGather opCount 1b count 5 x bfloat16
    x nranks 2"."""
    per_rank = f" x nranks {nranks}" if kind in _PER_SIZE_KINDS else ""
    return f"{m['op']} opCount {m['opcount']} count {m['count'][:_COUNT_DIGITS + 1]} x {dtype}{per_rank}"


def _count(m: re.Match[str], kind: str, dtype: str, nranks: int, where: str) -> int:
    """The line's count; one too long for int() (4300+ digits) is refused as too large, not as unreadable."""
    text = m["count"]
    if len(text.lstrip("-")) > _COUNT_DIGITS:
        sign = "negative, " if text.startswith("-") else ""
        raise TraceError(f"{where}: {_what(m, kind, dtype, nranks)}...: a count of {len(text.lstrip('-'))} "
                         f"digits ({sign}far more than the 2^48 bytes a collective may have)")
    return int(text)


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


_SplitKey = tuple[str, int, int, int, int, int, int]


@dataclass(frozen=True)
class _Split:
    """One rank's steps and how they were found (`rule`: "fixed", "restart", "period", "none" or "empty")."""
    steps: list[list[_Call]]
    rule: str
    comm: str = ""  # the busiest communicator ("period", "none")
    nranks: int = 0  # its size
    period: int = 0  # calls per period on it ("period")
    warmup: int = 0  # calls before the first full period, left out ("period")
    warmup_bytes: int = 0

    def key(self) -> _SplitKey:
        """What ranks must share to be described by one note (the comm pointer differs between processes)."""
        return (self.rule, self.nranks, self.period, len(self.steps), sum(len(s) for s in self.steps),
                self.warmup, self.warmup_bytes)


def _split(calls: list[_Call], per_step: int | None) -> _Split:
    """One rank's calls (log order, Recv lines already out) into steps, by the module docstring's rules."""
    if per_step is not None:
        return _Split([calls[i:i + per_step] for i in range(0, len(calls), per_step)] or [[]], "fixed")
    if not calls:
        return _Split([[]], "empty")
    restarted = _split_at_restarts(calls)
    if len(restarted) > 1:
        return _Split(restarted, "restart")
    return _split_by_period(calls)


def _split_at_restarts(calls: list[_Call]) -> list[list[_Call]]:
    """A new step wherever a communicator's opCount goes back."""
    steps: list[list[_Call]] = [[]]
    last: dict[str, int] = {}
    for c in calls:
        if c.comm in last and c.opcount < last[c.comm]:
            steps.append([])
            last = {}
        last[c.comm] = c.opcount
        steps[-1].append(c)
    return steps


def _busiest(calls: list[_Call]) -> str:
    """The communicator carrying the most bytes (the first seen among equals: dicts keep insertion order)."""
    total: dict[str, int] = {}
    for c in calls:
        total[c.comm] = total.get(c.comm, 0) + c.size_bytes
    return max(total, key=lambda comm: total[comm])


def _split_by_period(calls: list[_Call]) -> _Split:
    """Steps from the period of the busiest communicator's calls; calls before the first period are left out."""
    comm = _busiest(calls)
    where = [i for i, c in enumerate(calls) if c.comm == comm]  # positions of its calls in the rank's log
    nranks = calls[where[0]].nranks
    found = _tail_period([calls[i].signature for i in where])
    if found is None:
        return _Split([calls], "none", comm, nranks)
    period, repeats = found
    first = len(where) - period * repeats  # the busiest communicator's calls before the first full period
    starts = [where[first + j * period] for j in range(repeats)] + [len(calls)]
    steps = [calls[a:b] for a, b in itertools.pairwise(starts)]
    warmup = calls[:starts[0]]
    return _Split(steps, "period", comm, nranks, period, len(warmup), sum(c.size_bytes for c in warmup))


def _tail_period(seq: list[tuple[str, int, str]]) -> tuple[int, int] | None:
    """(p, k): the sequence ends in k >= 2 exact repeats of its last p items, for the p whose k repeats cover the
    most items (the smallest such p on a tie); None where no p repeats twice at the end, or where the best covers
    less than half of the sequence. Linear time: the Z array of the reversed sequence gives, for every p, how far
    the repeats of the last p items reach back."""
    ids: dict[tuple[str, int, str], int] = {}
    rev = [ids.setdefault(s, len(ids)) for s in reversed(seq)]
    z = _z_array(rev)
    best: tuple[int, int] | None = None
    for p in range(1, len(rev) // 2 + 1):
        if z[p] < p:  # the last p items are not repeated just before them
            continue
        k = (p + z[p]) // p
        if best is None or k * p > best[0] * best[1]:
            best = (p, k)
    if best is not None and 2 * best[0] * best[1] < len(seq):
        return None  # a coincidence at the end of the log (one step ending in two equal calls), not its period
    return best


def _z_array(s: list[int]) -> list[int]:
    """z[i] = the length of the longest common prefix of s and s[i:] (z[0] = len(s)); O(len(s))."""
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    left = right = 0  # s[left:right] is the rightmost window found that matches a prefix of s
    for i in range(1, n):
        if i < right:
            z[i] = min(right - i, z[i - left])
        while i + z[i] < n and s[z[i]] == s[i + z[i]]:
            z[i] += 1
        if i + z[i] > right:
            left, right = i, i + z[i]
    return z


def _step_notes(splits: dict[int, _Split], per_step: int | None) -> list[str]:
    """How the steps were found: one note per group of ranks split alike, and one where ranks disagree."""
    if per_step is not None:
        return [f"steps split every {per_step} collectives of each rank (collectives_per_step, --step-ops)"]
    alike: dict[_SplitKey, list[int]] = {}
    for rank, s in splits.items():
        alike.setdefault(s.key(), []).append(rank)
    notes = [_split_note(splits[ranks[0]], ranks) for ranks in alike.values()]
    counts = {rank: len(s.steps) for rank, s in splits.items()}
    if len(set(counts.values())) > 1:
        by_count: dict[int, list[int]] = {}
        for rank, n in counts.items():
            by_count.setdefault(n, []).append(rank)
        listing = "; ".join(f"{n} step(s) on {_ranks_text(r)}" for n, r in sorted(by_count.items()))
        notes.append(f"ranks disagree on the number of steps ({listing}): their logs differ; --step-ops N "
                     "imposes one split on every rank")
    return notes


def _split_note(s: _Split, ranks: list[int]) -> str:
    who = _ranks_text(ranks)
    comm = f"comm {s.comm} [nranks={s.nranks}]" + (f" on rank {ranks[0]}" if len(ranks) > 1 else "")
    if s.rule == "restart":
        return f"steps ({who}): split where a communicator's opCount restarts (goes back): {len(s.steps)} steps"
    if s.rule == "empty":
        return f"steps ({who}): no collectives of its own (only Recv lines): one empty step"
    if s.rule == "none":
        return (f"steps ({who}): no period found (the (op, count, datatype) calls on the busiest communicator, "
                f"{comm}, do not end in two or more repeats of one sequence covering at least half of them): one "
                f"step of all {len(s.steps[0])} collectives (--step-ops N splits every N)")
    calls = "call" if s.warmup == 1 else "calls"
    warmup = (f"{s.warmup} warm-up {calls} ({s.warmup_bytes} bytes) before the first period left out"
              if s.warmup else "no warm-up calls before the first period")
    return (f"steps ({who}): period of {s.period} calls found on {comm} (the communicator carrying the most "
            f"bytes), {len(s.steps)} periods = {len(s.steps)} steps; {warmup}; other communicators' calls go to "
            "the step they fall in by log order")


def _ranks_text(ranks: list[int]) -> str:
    """"rank 3", "ranks 0-7", "ranks 0-3, 6"."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def _step(number: int, calls: list[_Call], rank: int, groups: dict[tuple[int, str], tuple[int, ...]],
          gap_us: float | None) -> Step:
    collectives = []
    for i, c in enumerate(calls):
        kind = collective_kind(c.op) or "unknown"
        group = groups[(rank, c.comm)]
        size = c.size_bytes
        if kind == "send_recv":
            peer = group[c.root] if 0 <= c.root < len(group) else c.root
            group = tuple(sorted({rank, peer}))
        start = None if gap_us is None else (i + 1) * gap_us
        collectives.append(Collective(kind, size, c.dtype, group, c.stream, start, None,
                                      f"{c.op} opCount {c.opcount:x} comm {c.comm}"))
    compute = () if gap_us is None else merge_intervals((i * gap_us, (i + 1) * gap_us) for i in range(len(calls)))
    return Step(number, None, compute, tuple(collectives))
