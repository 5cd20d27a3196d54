"""AICB workload / communication-log CSV files (aliyun/aicb) into a `Workload` of every rank of the job.

AICB writes one CSV per job (its `LogItem` fields): `comm_type,comm_group,comm_group_size,msg_size,stage,dst,
src,additional,_elapsed_time,algbw,busbw,count`, e.g. `CommType.all_reduce,CommGroup.tp_group,8,33554432,
forward.MegatronRowLinear,None,None,,None,None,None,1`. It may start with `[rank0 ~ rank127]` (the job's ranks),
or hold one section per pipeline stage, each `[ pp_stageK: [rank.., ...] ]` then the header and that stage's rows.
Micro-benchmark files have no `comm_group_size` column.

- Rows are one rank's view (SPMD): every rank of a pipeline stage runs its stage's rows, each collective on that
  rank's own group, in Megatron-Core's rank order (`traffic.parallel.ParallelGrid`). The degrees come from the
  rows' `comm_group_size` (set-up rows included): tp from `tp_group`, dp from `dp_group`, ep from `ep_group`, pp
  from the number of stage sections, else `pp_group` collectives, else the ranks `[rank0 ~ rankN]` leaves over
  tp x dp; world_size from the caller, else `[rank0 ~ rankN]` or the sections' ranks, else tp x pp x dp; then
  dp = world / (tp x pp). cp is 1 (AICB has no cp group).
- Groups -> streams: tp_group "tp", dp_group "dp", pp_group "pp", ep_group "ep", ep_dp_group "edp",
  ep_tp_group "etp", embedding_group "emb" (first and last stage of the rank's pipeline), all_nodes "world".
- `msg_size` is bytes in the nccl-tests convention (AICB's replayer sizes all-gather by its output,
  reduce-scatter by its input, all-to-all by one rank's send buffer), bfloat16 (its buffers' dtype); `count`
  is back-to-back repetitions (`Collective.count`). `algbw`/`busbw` are ignored (AICB computes busbw without the
  group's size).
- Pipeline `isend` / `irecv` rows (`additional` send_next, send_prev / recv_prev, recv_next) are 2-rank
  send_recv with the next / previous stage's rank of the same pipeline, listed by both of its ranks (the sender's
  isend, the receiver's irecv: the replay pairs a group's k-th calls of its ranks into one transfer); one off
  either end of the pipeline is skipped (AICB skips it too), noted.
- Steps end at `CommType.epoch_end` rows. `init`/`init.*` rows are set-up, not steps: left out, noted. Rows after
  the last epoch_end (a cut file) are a partial step: left out, noted; a section without epoch_end is one step,
  noted. In a timed log step 0 is marked warm-up (`Step.warmup`) where a group's first call took more than
  WARMUP_RATIO x that call's median over the later steps (NCCL creates communicators at their first call).
- ep_group rows carry no comm_group_size (AICB's generator writes none): `ep_size` (`--ep`) gives it, checked
  (it divides the job, each ep all-to-all splits into ep equal parts); without it they are left out
  (`Collective.left_out`, stream LEFT_OUT_STREAM), their recorded time kept in the step, and noted.
- Timings: `_elapsed_time` is in milliseconds; an `epoch_end` row's is the step's time. Where the rows have
  them (a log of an AICB run) the workload is timed: the step lasts its epoch's time, its compute is that time
  minus the rows' times (computation rows are compute where they are), spread evenly before its collectives,
  which run back to back for their own elapsed times. Without (a generated workload),
  timed=False; its computation rows' times (AIOB), if any, are its compute in row order, each collective waited
  for where it stands (program=True); else no compute.
- Bad rows are TraceErrors naming file:line and the field; nothing half-read is returned.
"""
from __future__ import annotations

import csv
import io
import math
import re
import statistics
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from traffic.parallel import ParallelError, ParallelGrid
from traffic.traces.files import open_trace, read_error
from traffic.workload import (LEFT_OUT_STREAM, WARMUP_RATIO, Collective, RankTrace, Step, TraceError, Workload,
                              checked_size, merge_intervals)

#: The start of AICB's CSV header (how `traffic.traces.detect_format` recognises the format).
HEADER_START = "comm_type,comm_group,"
#: The most ranks a job may have (world_size, comm_group_size): far above any job, and small enough to build.
MAX_RANKS = 1 << 20
#: rows x ranks above this is refused: the Workload would not fit in memory.
MAX_ROW_RANKS = 50_000_000
#: The longest a row or an epoch may take: 10^9 ms (11.6 days), beyond any training step.
MAX_ELAPSED_MS = 1e9
_REQUIRED = ("comm_type", "comm_group", "msg_size")
_INT = re.compile(r"\s*(-?\d{1,20})(?:\.0*)?\s*$")
_MISSING = ("", "none", "nan", "-1", "-1.0")  # AICB writes None, or -1 (pandas fillna) for no value
_WORLD = re.compile(r"\[\s*rank(\d+)\s*~\s*rank(\d+)\s*\]\s*$")
_RANK = re.compile(r"rank\d{1,7}$")
_STAGE = re.compile(r"\[\s*pp_stage(\d+)\s*:\s*\[([^\]]*)\]\s*\]\s*$")
_KINDS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
          "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter", "all_to_all": "all_to_all",
          "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier", "isend": "send_recv",
          "irecv": "send_recv"}
_OTHER_TYPES = ("computation", "epoch_end")
#: a pipeline transfer's direction (`additional`) -> the peer's stage offset
_P2P = {"isend": {"send_next": 1, "send_prev": -1}, "irecv": {"recv_next": 1, "recv_prev": -1}}
_GROUPS = {"tp_group": "tp", "dp_group": "dp", "pp_group": "pp", "ep_group": "ep", "ep_dp_group": "edp",
           "ep_tp_group": "etp", "embedding_group": "emb", "all_nodes": "world", "all": "world"}


@dataclass(frozen=True)
class _Row:
    line: int
    comm_type: str  # without "CommType."
    axis: str | None  # stream name, None for epoch_end / computation
    group_size: int | None
    size_bytes: int
    stage: str
    additional: str
    elapsed_ms: float | None
    count: int


@dataclass
class _Section:
    line: int  # of its `[ pp_stageK: ...]` line, or its header
    stage: int | None  # pp_stageK's K, None without stage sections
    rows: list[_Row]
    listed: tuple[int, ...] = ()  # the ranks its `[ pp_stageK: [...]]` line lists


def read_aicb(path: Path, *, world_size: int | None = None, ep_size: int | None = None) -> Workload:
    """Every rank's steps from one AICB CSV (see the module docstring); `world_size` maps it onto that many ranks;
    `ep_size` is the expert-parallel group's size, which AICB's ep_group rows do not give."""
    for name, value in (("world_size", world_size), ("ep_size", ep_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_RANKS):
            raise TraceError(f"{path}: {name} must be an integer from 1 to {MAX_RANKS}, got {value!r}")
    sections, listed_world = _read(path)
    notes: list[str] = []
    grid = _grid(path, sections, world_size, listed_world, notes, ep_size)
    if ep_size is not None:
        _check_all_to_alls(path, sections, grid.ep)
    leave_out_ep = ep_size is None and not any(r.axis == "ep" and r.group_size is not None
                                               for sec in sections for r in sec.rows)
    if world_size is None or world_size == listed_world:
        for sec in sections:
            if sec.stage is not None and sec.listed != tuple(_stage_ranks(grid, sec.stage)):
                want = _stage_ranks(grid, sec.stage)
                raise TraceError(f"{path}:{sec.line}: pp_stage{sec.stage} lists other ranks than the stage's in "
                                 f"Megatron order (rank{want[0]} .. rank{want[-1]})")
    n_rows = sum(len(s.rows) for s in sections)
    if n_rows * grid.world > MAX_ROW_RANKS:
        raise TraceError(f"{path}: {n_rows} rows x {grid.world} ranks is more than the {MAX_ROW_RANKS} "
                         "collectives a workload may hold")
    timed = _timed(path, sections)
    stats = _Stats()
    stats.leave_out_ep = leave_out_ep
    program = not timed and any(r.comm_type == "computation" and (r.elapsed_ms or 0.0) > 0
                                for sec in sections for r in sec.rows)
    steps: dict[int, list[Step]] = {r: [] for r in range(grid.world)}
    for sec in sections:
        stages = [sec.stage] if sec.stage is not None else list(range(grid.pp))
        segments = _segments(sec.rows, stats, sec.stage)
        warmup = timed and _warmup(segments, stats, sec.stage)
        for number, segment in enumerate(segments):
            _build(path, segment, number, stages, grid, timed, program, stats, steps, warmup and number == 0)
    ranks = [RankTrace(r, tuple(steps[r])) for r in range(grid.world)]
    if not any(s.collectives for r in ranks for s in r.steps):
        raise TraceError(f"{path}: no collectives on a group of 2 or more ranks outside set-up (init) rows: "
                         "nothing to replay")
    notes.insert(0, f"AICB CSV: one rank's view per pipeline stage, run by every rank of the stage (SPMD), on "
                    f"its own groups in Megatron-Core order tp-cp-dp-pp (tp={grid.tp}, pp={grid.pp}, dp={grid.dp}, "
                    f"ep={grid.ep}; world {grid.world})")
    notes.extend(stats.notes(timed, program))
    return Workload(name=path.name.split(".")[0], source=str(path), format="aicb", world_size=grid.world,
                    ranks=tuple(ranks), timed=timed, notes=tuple(notes), program=program)


# --- reading -------------------------------------------------------------------------------------------------------

def _read(path: Path) -> tuple[list[_Section], int | None]:
    try:
        with open_trace(path) as f:
            text = io.TextIOWrapper(f, encoding="utf-8", newline="").read()
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:
        raise read_error(path, exc) from None
    if "\x00" in text:
        raise TraceError(f"{path}: NUL bytes in the file: not an AICB CSV")
    sections: list[_Section] = []
    listed_world: int | None = None
    header: list[str] | None = None
    pending_stage: tuple[int, int] | None = None  # (stage, line) of a `[ pp_stageK: ...]` awaiting its header
    pending_listed: tuple[int, ...] = ()
    stage_ranks: list[int] = []
    try:
        for lineno, fields in _lines(path, text):
            first = fields[0].strip() if fields else ""
            joined = ",".join(fields).strip()
            if not joined:
                continue
            if first == "comm_type":
                header = [h.strip() for h in fields]
                missing = [c for c in _REQUIRED if c not in header]
                if missing:
                    raise TraceError(f"{path}:{lineno}: header lacks column(s) {', '.join(missing)}")
                stage, start = None, lineno
                listed: tuple[int, ...] = ()
                if pending_stage is not None:
                    stage, start = pending_stage
                    listed = pending_listed
                    pending_stage = None
                elif sections and sections[-1].stage is not None:
                    raise TraceError(f"{path}:{lineno}: a header without its `[ pp_stageK: ...]` line")
                sections.append(_Section(start, stage, [], listed))
                continue
            m = _WORLD.match(joined)
            if m and not sections:
                lo, hi = int(m.group(1)), int(m.group(2))
                if lo != 0 or not 0 <= hi < MAX_RANKS:
                    raise TraceError(f"{path}:{lineno}: rank range {joined!r}: expected [rank0 ~ rankN], "
                                     f"N < {MAX_RANKS}")
                listed_world = hi + 1
                continue
            m = _STAGE.match(joined)
            if m:
                k = int(m.group(1)) if len(m.group(1)) < 8 else -1
                if k != len([s for s in sections if s.stage is not None]) or (sections and sections[-1].stage is None):
                    raise TraceError(f"{path}:{lineno}: pp_stage{m.group(1)}: stage sections must be numbered "
                                     "0, 1, ... from the file's start")
                names = [x.strip() for x in m.group(2).split(",") if x.strip()]
                if not all(_RANK.match(x) for x in names):
                    raise TraceError(f"{path}:{lineno}: pp_stage{k}: ranks must be rank<N>, got {m.group(2)[:60]!r}")
                pending_listed = tuple(int(x[4:]) for x in names)
                stage_ranks.append(len(names))
                pending_stage = (k, lineno)
                continue
            if header is None or not sections:
                raise TraceError(f"{path}:{lineno}: a row before the header (comm_type,comm_group,...)")
            if pending_stage is not None:
                raise TraceError(f"{path}:{lineno}: pp_stage{pending_stage[0]} (line {pending_stage[1]}) has no header")
            sections[-1].rows.append(_row(path, lineno, header, fields))
    except csv.Error as exc:
        raise TraceError(f"{path}: not a readable CSV ({exc})") from None
    if not sections:
        raise TraceError(f"{path}: no AICB header (comm_type,comm_group,...)")
    if not any(s.rows for s in sections):
        raise TraceError(f"{path}: only a header, no rows")
    if stage_ranks:
        if len(set(stage_ranks)) > 1:
            raise TraceError(f"{path}: pipeline stages list different numbers of ranks ({stage_ranks})")
        listed_world = sum(stage_ranks)
    return sections, listed_world


def _lines(path: Path, text: str) -> Iterator[tuple[int, list[str]]]:
    reader = csv.reader(io.StringIO(text))
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: not a readable CSV row ({exc})") from None
        yield reader.line_num, fields


def _row(path: Path, lineno: int, header: list[str], fields: list[str]) -> _Row:
    where = f"{path}:{lineno}"
    if len(fields) < len(header):
        raise TraceError(f"{where}: {len(fields)} fields, the header has {len(header)} "
                         f"(missing {', '.join(header[len(fields):])})")
    if len(fields) > len(header):
        raise TraceError(f"{where}: {len(fields)} fields, the header has {len(header)}")
    v = {h: f.strip() for h, f in zip(header, fields)}
    ctype = v["comm_type"].removeprefix("CommType.")
    if ctype not in _KINDS and ctype not in _OTHER_TYPES:
        raise TraceError(f"{where}: comm_type {v['comm_type']!r} is not one AICB writes "
                         f"({', '.join(sorted(set(_KINDS) | set(_OTHER_TYPES)))})")
    axis = None
    group_size = None
    if ctype not in ("epoch_end", "computation"):
        gname = v["comm_group"].removeprefix("CommGroup.")
        if gname not in _GROUPS:
            raise TraceError(f"{where}: comm_group {v['comm_group']!r} is not one AICB writes "
                             f"({', '.join(sorted(_GROUPS))})")
        axis = _GROUPS[gname]
        if v.get("comm_group_size", "").lower() not in _MISSING:
            group_size = _int(where, "comm_group_size", v["comm_group_size"])
            if not 1 <= group_size <= MAX_RANKS:
                raise TraceError(f"{where}: comm_group_size {group_size} is not from 1 to {MAX_RANKS}")
    size = 0
    if ctype != "computation":  # a computation row's msg_size is a tensor shape
        size = checked_size(where, f"{ctype} msg_size", _int(where, "msg_size", v["msg_size"]))
    count = 1
    if v.get("count", "").lower() not in _MISSING:
        count = _int(where, "count", v["count"])
        if count < 1:
            raise TraceError(f"{where}: count {count}: a row stands for at least 1 collective")
        checked_size(where, f"{ctype} msg_size {size} x count {count}", size * count)
    elapsed = None
    raw = v.get("_elapsed_time", "")
    if raw.lower() not in _MISSING:
        try:
            elapsed = float(raw)
        except ValueError:
            raise TraceError(f"{where}: _elapsed_time {raw[:40]!r} is not a number (milliseconds)") from None
        if not (math.isfinite(elapsed) and 0 <= elapsed <= MAX_ELAPSED_MS):
            raise TraceError(f"{where}: _elapsed_time {raw[:40]!r} is not from 0 to {MAX_ELAPSED_MS:g} ms")
    return _Row(lineno, ctype, axis, group_size, size, v.get("stage", ""), v.get("additional", ""), elapsed, count)


def _int(where: str, field: str, raw: str) -> int:
    m = _INT.match(raw)
    if not m:
        raise TraceError(f"{where}: {field} {raw[:40]!r} is not an integer")
    return int(m.group(1))


# --- the grid ------------------------------------------------------------------------------------------------------

def _grid(path: Path, sections: list[_Section], world_size: int | None, listed_world: int | None,
          notes: list[str], ep_size: int | None = None) -> ParallelGrid:
    seen: dict[str, tuple[int, int]] = {}  # axis -> (size, line where first seen)
    for sec in sections:
        for r in sec.rows:
            if r.axis is None or r.group_size is None or r.comm_type in _P2P or r.axis in ("emb", "world"):
                continue
            if r.axis in seen and seen[r.axis][0] != r.group_size:
                raise TraceError(f"{path}:{r.line}: comm_group_size {r.group_size} for {r.axis}_group, but "
                                 f"line {seen[r.axis][1]} says {seen[r.axis][0]}")
            seen.setdefault(r.axis, (r.group_size, r.line))
    stages = [s.stage for s in sections if s.stage is not None]
    tp = seen.get("tp", (1, 0))[0]
    if stages:
        pp = len(stages)
    elif "pp" in seen:
        pp = seen["pp"][0]
    elif listed_world is not None and "dp" in seen and listed_world % (tp * seen["dp"][0]) == 0:
        pp = listed_world // (tp * seen["dp"][0])  # no pipeline collective: the stages the rank count leaves
    else:
        pp = 1
    if stages and "pp" in seen and seen["pp"][0] not in (1, pp):
        raise TraceError(f"{path}:{seen['pp'][1]}: pp_group of {seen['pp'][0]} ranks, but the file has {pp} "
                         "pipeline stage sections")
    ep = seen.get("ep", (1, 0))[0]
    if ep_size is not None:
        if "ep" in seen and seen["ep"][0] != ep_size:
            raise TraceError(f"{path}:{seen['ep'][1]}: comm_group_size {seen['ep'][0]} for ep_group, but --ep "
                             f"(ep_size) is {ep_size}")
        ep = ep_size
    etp = seen["etp"][0] if "etp" in seen else None
    if world_size is None:
        if listed_world is None and not seen:
            raise TraceError(f"{path}: no comm_group_size in the rows and no [rank0 ~ rankN] line: the job's size "
                             "is unknown; pass world_size")
        world = listed_world if listed_world is not None else tp * pp * seen.get("dp", (1, 0))[0]
    else:
        world = world_size
    if world % (tp * pp):
        raise TraceError(f"{path}: world size {world} is not a multiple of tp x pp = {tp} x {pp}")
    dp = world // (tp * pp)
    if ep_size is not None and world % ep_size:
        raise TraceError(f"{path}: --ep (ep_size) {ep_size} does not divide the job's {world} ranks")
    if "dp" in seen and seen["dp"][0] != dp:
        if world_size is None:
            raise TraceError(f"{path}:{seen['dp'][1]}: dp_group of {seen['dp'][0]} ranks, but the job's "
                             f"{world} ranks / (tp x pp = {tp} x {pp}) make dp = {dp}")
        notes.append(f"mapped onto {world} ranks (world_size): dp {dp}, not the file's dp_group of {seen['dp'][0]}")
    elif world_size is not None and listed_world is not None and listed_world != world_size:
        notes.append(f"mapped onto {world} ranks (world_size), not the file's {listed_world}")
    try:
        grid = ParallelGrid(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp)
    except ParallelError as exc:
        raise TraceError(f"{path}: the groups' sizes make no Megatron grid"
                         f"{f' with --ep {ep_size}' if ep_size is not None else ''}: {exc}") from None
    if "edp" in seen and seen["edp"][0] != grid.edp:
        raise TraceError(f"{path}:{seen['edp'][1]}: ep_dp_group of {seen['edp'][0]} ranks, but the grid's expert "
                         f"data parallelism is {grid.edp}")
    return grid


def _timed(path: Path, sections: list[_Section]) -> bool:
    """Whether the rows carry elapsed times: all of them (outside set-up) or none. Computation rows do not count:
    AICB's generator gives them times (from AIOB) in files that are otherwise untimed."""
    rows = [r for s in sections for r in s.rows if not _is_init(r) and r.comm_type != "computation"]
    have = [r for r in rows if r.elapsed_ms is not None]
    if have and len(have) != len(rows):
        lacking = next(r for r in rows if r.elapsed_ms is None)
        raise TraceError(f"{path}:{lacking.line}: _elapsed_time missing, but line {have[0].line} has one: a file "
                         "is timed throughout (an AICB run's log) or not at all (a generated workload)")
    return bool(have)


def _is_init(r: _Row) -> bool:
    return r.stage == "init" or r.stage.startswith("init.")


# --- steps ---------------------------------------------------------------------------------------------------------

def _check_all_to_alls(path: Path, sections: list[_Section], ep: int) -> None:
    """With the ep group's size given: each ep all-to-all's buffer splits into one equal part per rank of it."""
    for sec in sections:
        for r in sec.rows:
            if r.axis == "ep" and r.comm_type == "all_to_all" and r.size_bytes % ep:
                raise TraceError(f"{path}:{r.line}: all_to_all of {r.size_bytes} bytes on an ep group of {ep} "
                                 f"ranks (--ep) does not split into {ep} equal parts: not this group's size")


class _Stats:
    def __init__(self) -> None:
        self.init_rows = 0
        self.init_bytes = 0
        self.skipped: dict[str, int] = {}  # rows left out per stage: sends off the pipeline's end, 1-rank groups
        self.clamped = 0
        self.leave_out_ep = False  # ep_group rows without a size and no --ep: recorded, not replayed
        self.ep_rows = 0  # of those, on the first rank of each stage: rows, collectives, bytes, recorded ms
        self.ep_calls = 0
        self.ep_bytes = 0
        self.ep_ms = 0.0
        self.cut: list[tuple[int | None, int]] = []  # (stage, rows) after a section's last epoch_end
        self.no_epoch: list[int | None] = []  # stages without any epoch_end: their rows are one step
        self.warmup: list[str] = []

    def notes(self, timed: bool, program: bool) -> list[str]:
        out = []
        if self.init_rows:
            out.append(f"{self.init_rows} set-up row(s) (stage init / init.*, {self.init_bytes} bytes) left out: "
                       "they run once, before training")
        if self.ep_rows:
            recorded = f", {self.ep_ms:.6g} ms recorded" if timed else ""
            out.append(f"{self.ep_rows} ep_group row(s) ({self.ep_calls} collective(s), {self.ep_bytes} bytes{recorded}"
                       ") left out: AICB writes no size for the expert-parallel group; give it with --ep N (ep_size)"
                       + (f"; their recorded time stays in the step as '{LEFT_OUT_STREAM}', neither compute nor "
                          "idle" if timed else ""))
        for what, n in sorted(self.skipped.items()):
            if what.startswith(("send_", "recv_")):
                out.append(f"{n} {what} row(s) left out on the pipeline stage at that end (no peer there)")
            else:
                out.append(f"{n} row(s) on a {what} left out (no traffic)")
        for stage, n in self.cut:
            where = f"pp_stage{stage}: " if stage is not None else ""
            out.append(f"{where}{n} row(s) after the last epoch_end left out: a partial step (the file was cut)")
        for stage in self.no_epoch:
            where = f"pp_stage{stage}: " if stage is not None else ""
            out.append(f"{where}no epoch_end row: all its rows read as one step")
        out.extend(self.warmup)
        if timed:
            out.append("timed from _elapsed_time (ms): each step lasts its epoch_end row's time; its compute is that "
                       "time minus its rows' times, spread evenly before its collectives, which run back to back; "
                       "AICB's algbw/busbw ignored")
            if self.clamped:
                out.append(f"{self.clamped} step(s) whose rows take longer than the epoch's time: no compute, the "
                           "step lasts its rows' times")
        elif program:
            out.append("no communication times (_elapsed_time None: a generated workload); compute from its "
                       "computation "
                       "rows (AIOB times, ms), in row order; each collective waited for where it stands")
        else:
            out.append("no timings (_elapsed_time None: a generated workload); no compute")
        return out


def _segments(rows: list[_Row], stats: _Stats, stage: int | None) -> list[tuple[list[_Row], float | None]]:
    """The section's steps: (rows, epoch time in ms) per epoch_end, set-up rows left out; rows after the last
    epoch_end (a cut file) left out; a section without epoch_end is one step."""
    out: list[tuple[list[_Row], float | None]] = []
    current: list[_Row] = []
    ended = False
    for r in rows:
        if _is_init(r):
            stats.init_rows += 1
            stats.init_bytes += r.size_bytes * r.count
            continue
        if r.comm_type == "epoch_end":
            ended = True
            if current:
                out.append((current, r.elapsed_ms))
            current = []
            continue
        current.append(r)
    if current and ended:
        stats.cut.append((stage, len(current)))
    elif current:
        stats.no_epoch.append(stage)
        out.append((current, None))
    return out


def _warmup(segments: list[tuple[list[_Row], float | None]], stats: _Stats, stage: int | None) -> bool:
    """Whether step 0 set up communicators: a group's first call in it took more than WARMUP_RATIO x the median of
    that call (the group's first) over the later steps (NCCL creates a communicator at its first call)."""
    if len(segments) < 2:
        return False
    firsts: list[dict[tuple[str | None, str], float]] = []
    for rows, _ in segments:
        first: dict[tuple[str | None, str], float] = {}
        for r in rows:
            if r.comm_type in _KINDS and r.elapsed_ms is not None:
                first.setdefault((r.axis, r.comm_type), r.elapsed_ms)
        firsts.append(first)
    for key, ms in firsts[0].items():
        later = [f[key] for f in firsts[1:] if key in f]
        if not later:
            continue
        median = statistics.median(later)
        if ms > WARMUP_RATIO * median and median > 0:
            where = f"pp_stage{stage}: " if stage is not None else ""
            stats.warmup.append(f"{where}step 0 marked warm-up: its first {key[0]}_group {key[1]} took {ms:.6g} ms, "
                                f"{ms / median:.0f}x that call's median of {median:.6g} ms over the {len(later)} "
                                "later step(s) (NCCL creates a communicator at its first call)")
            return True
    return False


def _build(path: Path, segment: tuple[list[_Row], float | None], number: int, stages: list[int],
           grid: ParallelGrid, timed: bool, program: bool, stats: _Stats, steps: dict[int, list[Step]],
           warmup: bool = False) -> None:
    """Step `number` of every rank of `stages`, from one epoch's rows."""
    rows, epoch_ms = segment
    starts: list[float | None] = [None] * len(rows)
    durations: list[float | None] = [None] * len(rows)
    compute: tuple[tuple[float, float], ...] = ()
    duration_us = None
    if timed:
        starts, durations, compute, duration_us = _layout(rows, epoch_ms, stats)
    elif program:
        starts, compute = _program_layout(rows)
    cache: dict[tuple[int, object], Collective] = {}  # ranks of one group share the Collective
    for st in stages:
        stage_ranks = _stage_ranks(grid, st)
        for rank in stage_ranks:
            colls = []
            for i, r in enumerate(rows):
                if r.comm_type not in _KINDS:
                    continue
                if stats.leave_out_ep and r.axis == "ep":
                    if rank == stage_ranks[0]:
                        stats.ep_rows += 1
                        stats.ep_calls += r.count
                        stats.ep_bytes += r.size_bytes * r.count
                        stats.ep_ms += r.elapsed_ms or 0.0
                    colls.append(Collective(_KINDS[r.comm_type], r.size_bytes, "bfloat16", (rank,), LEFT_OUT_STREAM,
                                            starts[i], durations[i], f"{r.comm_type} {r.stage}".strip(), r.count,
                                            left_out=True))
                    continue
                group = _group(path, r, rank, st, grid)
                if len(group) < 2:
                    if rank == stage_ranks[0]:
                        what = r.additional if r.comm_type in _P2P else f"{r.axis} group of 1 rank"
                        stats.skipped[what] = stats.skipped.get(what, 0) + 1
                    continue
                # big groups are the grid's own tuples, shared by their ranks: keyed by identity, not hashed
                key = (i, group) if len(group) <= 2 else (i, id(group))
                c = cache.get(key)
                if c is None:
                    c = Collective(_KINDS[r.comm_type], r.size_bytes, "bfloat16", group, r.axis or "0", starts[i],
                                   durations[i], f"{r.comm_type} {r.stage}".strip(), r.count)
                    cache[key] = c
                colls.append(c)
            steps[rank].append(Step(number, duration_us, compute, tuple(colls), warmup))


def _program_layout(rows: list[_Row]) -> tuple[list[float | None], tuple[tuple[float, float], ...]]:
    """An untimed file's computation rows (their AIOB times) laid out in row order, with each collective's place
    among them (communication taking no time)."""
    starts: list[float | None] = [None] * len(rows)
    compute: list[tuple[float, float]] = []
    t = 0.0
    for i, r in enumerate(rows):
        if r.comm_type in _KINDS:
            starts[i] = t
        elif r.comm_type == "computation" and (r.elapsed_ms or 0.0) > 0:
            d = (r.elapsed_ms or 0.0) * 1000.0
            compute.append((t, t + d))
            t += d
    return starts, merge_intervals(compute)


def _layout(rows: list[_Row], epoch_ms: float | None, stats: _Stats) -> tuple[
        list[float | None], list[float | None], tuple[tuple[float, float], ...], float]:
    """Start and duration (us) of each row's collective, the compute intervals and the step's duration: the
    epoch's time minus its rows' times is compute, spread evenly before the collectives."""
    n_colls = sum(1 for r in rows if r.comm_type in _KINDS)
    busy_us = sum((r.elapsed_ms or 0.0) for r in rows) * 1000.0
    epoch_us = busy_us if epoch_ms is None else epoch_ms * 1000.0
    residual = epoch_us - busy_us
    if residual < 0:
        stats.clamped += 1
        residual = 0.0
    gap = residual / n_colls if n_colls else residual
    starts: list[float | None] = [None] * len(rows)
    durations: list[float | None] = [None] * len(rows)
    compute: list[tuple[float, float]] = []
    t = 0.0
    if not n_colls and gap > 0:
        compute.append((0.0, gap))
        t = gap
    for i, r in enumerate(rows):
        d = (r.elapsed_ms or 0.0) * 1000.0
        if r.comm_type in _KINDS:
            if gap > 0:
                compute.append((t, t + gap))
                t += gap
            starts[i], durations[i] = t, d
        elif r.comm_type == "computation" and d > 0:
            compute.append((t, t + d))
        t += d
    return starts, durations, merge_intervals(compute), t


def _stage_ranks(grid: ParallelGrid, stage: int) -> range:
    per = grid.world // grid.pp
    return range(stage * per, (stage + 1) * per)


def _group(path: Path, r: _Row, rank: int, stage: int, grid: ParallelGrid) -> tuple[int, ...]:
    """The rank's group for the row: its own group of the axis, or (sender, receiver) ascending for a pipeline
    transfer; () for one off the end of the pipeline."""
    if r.comm_type in _P2P:
        directions = _P2P[r.comm_type]
        if r.additional not in directions:
            raise TraceError(f"{path}:{r.line}: {r.comm_type} with additional {r.additional!r}: expected "
                             f"{' or '.join(directions)} (the pipeline direction)")
        peer_stage = stage + directions[r.additional]
        if not 0 <= peer_stage < grid.pp:
            return ()
        peer = grid.group_of("pp", rank)[peer_stage]
        return (rank, peer) if rank < peer else (peer, rank)
    if r.axis == "world":
        return _world(grid.world)
    if r.axis == "emb":
        pipe = grid.group_of("pp", rank)
        return (pipe[0],) if len(pipe) == 1 else (pipe[0], pipe[-1])
    return grid.group_of(r.axis or "", rank)


@lru_cache(maxsize=8)
def _world(n: int) -> tuple[int, ...]:
    return tuple(range(n))
