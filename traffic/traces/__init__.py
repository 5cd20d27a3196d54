"""Trace ingestion: read a training trace (a file, or a directory of per-rank files) into a `Workload`.

`load` detects the format from the content, not the name: gzip magic, then JSON (Kineto Chrome trace,
`traffic.traces.kineto`), an AICB CSV (its `comm_type,comm_group,...` header, `traffic.traces.aicb`), a SimAI
workload (its first word a SimAI parallelism policy, `traffic.traces.simai`), NCCL `COLL` debug log text
(`traffic.traces.nccl_log`), or a Chakra execution trace (a varint-length-prefixed protobuf stream,
`traffic.traces.chakra`). `summarize` turns a workload into
a small record the CLI prints. Every failure is a `TraceError` whose message names the file and the problem.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traffic.traces.aicb import HEADER_START as AICB_HEADER_START
from traffic.traces.files import open_trace, read_error
from traffic.traces.simai import POLICIES as SIMAI_POLICIES
from traffic.workload import TraceError, Workload

if TYPE_CHECKING:
    from traffic.llm.config import LLMConfig

__all__ = ["BUILTIN_RANKS", "BUILTIN_TRACE", "FORMATS", "TraceSummary", "default_ranks", "detect_format", "load",
           "summarize"]

#: The built-in recording: a CPU data-parallel job (DDP, gloo, 4 ranks), one gzipped Kineto trace per rank.
BUILTIN_TRACE = Path(__file__).resolve().parent.parent / "data" / "builtin"
#: The built-in 4-rank recording is replayed on this many ranks by default: every host of the 16-host fabrics.
BUILTIN_RANKS = 16


def default_ranks(ranks: int | None, trace: str | None) -> int | None:
    """The ranks a replay maps a trace onto: `ranks` if given; with no trace (the built-in recording)
    `BUILTIN_RANKS`; else None (the plan's default: every host for a single-rank trace)."""
    if ranks is not None or trace:
        return ranks
    return BUILTIN_RANKS

FORMATS = ("kineto", "nccl-log", "chakra", "aicb", "simai")
#: A TRACE argument starting with this is a generated LLM training step, not a file (`load`)
LLM_PREFIX = "llm:"
_SNIFF_BYTES = 1 << 16  # how much of a file's (decompressed) start the format detection reads
_SNIFF_LINES = 4  # an AICB header comes after at most a line or two of rank listing


def detect_format(path: Path) -> str:
    """"kineto", "nccl-log", "chakra", "aicb" or "simai", from the file's first bytes (decompressed if gzipped)."""
    try:
        with open_trace(path) as f:
            head = f.read(_SNIFF_BYTES)
    except (EOFError, OSError, zlib.error) as exc:
        raise read_error(path, exc) from None
    if not head:
        raise TraceError(f"{path}: empty file, not a trace")
    text = _as_text(head)
    if text is not None:  # AICB's CSV may start with "[rank0 ~ rank127]", so before JSON
        lines = [ln.strip() for ln in text.splitlines()[:_SNIFF_LINES]]
        if any(ln.startswith(AICB_HEADER_START) for ln in lines):
            return "aicb"
        first = lines[0].split() if lines else []
        if first and first[0] in SIMAI_POLICIES:
            return "simai"
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "kineto"
    if text is not None:
        if "NCCL" in text:
            return "nccl-log"
        raise TraceError(f"{path}: text that is neither JSON, an AICB CSV, a SimAI workload nor an NCCL debug log; "
                         "not a known trace format")
    if _looks_like_chakra(head) or path.suffix == ".et":
        return "chakra"
    raise TraceError(f"{path}: binary data that is not gzip, JSON, an NCCL log or a Chakra trace; "
                     "not a known trace format")


def _as_text(head: bytes) -> str | None:
    """The bytes as text if they are UTF-8 without control characters other than whitespace."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the end of the sniffed block
            return None
        text = head[: exc.start].decode("utf-8")
    if any(ord(c) < 32 and c not in "\t\n\r\f\v" for c in text):
        return None
    return text


def _looks_like_chakra(head: bytes) -> bool:
    """A Chakra ET file is a stream of varint32-length-prefixed protobuf messages; the first message
    (GlobalMetadata) starts with a length-delimited field, so its first tag byte has wire type 2."""
    length = shift = 0
    for i, byte in enumerate(head[:5]):
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            body = head[i + 1:]
            fits = len(body) >= length or len(head) == _SNIFF_BYTES
            return length > 0 and bool(body) and body[0] & 0x07 == 2 and fits
    return False


def llm_workload(cfg: LLMConfig) -> Workload:
    """The generated workload of an LLM config (`traffic.llm.build_workload`), with the trace its
    `compute.profile` names read here first (the kernel efficiency is measured from it)."""
    from traffic.llm import build_workload

    profile = load(cfg.compute.profile) if cfg.compute.profile is not None else None
    return build_workload(cfg, profile=profile)


def load(path: str | Path, *, compute_gap_us: float | None = None,
         collectives_per_step: int | None = None, world_size: int | None = None,
         launchless_kernels: str | None = None, ep_size: int | None = None) -> Workload:
    """Read a trace file, or a directory of per-rank trace files of one format, into a Workload.

    `compute_gap_us` and `collectives_per_step` apply to NCCL logs only (they have no timings and no step
    markers); passing them for another format is a TraceError. `world_size` applies to AICB CSVs and SimAI
    workloads only (one rank's view of a job): the ranks to map it onto (default: the job's, as the file says).
    `ep_size` applies to AICB CSVs only: the expert-parallel group's size (AICB's ep_group rows give none).
    `launchless_kernels` applies to Kineto traces only: "leave-out" (None: the default) or "by-time", what GPU
    compute kernels without a launch event count as (`traffic.traces.kineto`).

    `llm:SPEC` is no file: a transformer training step generated from a model config (`traffic.llm`:
    `llm:PRESET[,key=value...]` or `llm:FILE.yaml[,key=value...]`)."""
    if isinstance(path, str) and path.startswith(LLM_PREFIX):
        if compute_gap_us is not None or collectives_per_step is not None:
            raise TraceError(f"{path}: compute_gap_us / collectives_per_step (--compute-gap-us / --step-ops) apply to "
                             "NCCL logs only; a generated LLM step has its own compute and steps")
        if world_size is not None or ep_size is not None:
            raise TraceError(f"{path}: world_size / ep_size (--world-size / --ep) apply to AICB and SimAI files only; "
                             "a generated LLM step takes its ranks and groups from its config")
        if launchless_kernels is not None:
            raise TraceError(f"{path}: launchless_kernels (--launchless-kernels) applies to Kineto traces only; a "
                             "generated LLM step has no trace kernels")
        from traffic.llm import load_config
        return llm_workload(load_config(path[len(LLM_PREFIX):]))
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        if not files:
            raise TraceError(f"{p}: empty directory, no trace files in it")
    else:
        files = [p]
    formats = {f: detect_format(f) for f in files}
    kinds = sorted(set(formats.values()))
    if len(kinds) > 1:
        listing = ", ".join(f"{f.name} ({k})" for f, k in formats.items())
        raise TraceError(f"{p}: a directory mixing trace formats: {listing}")
    fmt = kinds[0]
    if fmt != "nccl-log" and (compute_gap_us is not None or collectives_per_step is not None):
        raise TraceError(f"{p}: compute_gap_us / collectives_per_step (--compute-gap-us / --step-ops) apply to NCCL "
                         f"logs only; this is a {fmt} trace with its own timings and steps")
    if world_size is not None and fmt not in ("aicb", "simai"):
        raise TraceError(f"{p}: world_size applies to AICB and SimAI files only (one rank's view of a job); this is "
                         f"a {fmt} trace with its own ranks")
    if launchless_kernels is not None and fmt != "kineto":
        raise TraceError(f"{p}: launchless_kernels (--launchless-kernels) applies to Kineto traces only (GPU kernels "
                         f"without a launch event); this is a {fmt} trace")
    if ep_size is not None and fmt != "aicb":
        raise TraceError(f"{p}: ep_size (--ep) applies to AICB CSVs only (their ep_group rows give no size); this is "
                         f"a {fmt} trace" + (" whose header gives ep" if fmt == "simai" else " with its own groups"))
    if fmt in ("aicb", "simai"):
        if len(files) > 1:
            raise TraceError(f"{p}: a directory of {len(files)} {fmt} files; an {fmt} file describes the whole job, "
                             "load one")
        if fmt == "aicb":
            from traffic.traces.aicb import read_aicb
            return read_aicb(files[0], world_size=world_size, ep_size=ep_size)
        from traffic.traces.simai import read_simai
        return read_simai(files[0], world_size=world_size)
    if fmt == "nccl-log":
        from traffic.traces.nccl_log import read_nccl_logs
        return read_nccl_logs(files, source=p, compute_gap_us=compute_gap_us,
                              collectives_per_step=collectives_per_step)
    if fmt == "kineto":
        from traffic.traces.kineto import read_kineto
        return _merge_ranks([read_kineto(f, in_directory=p.is_dir(), launchless_kernels=launchless_kernels or
                                         "leave-out") for f in files], p)
    try:
        from traffic.traces.chakra import read_chakra
    except ImportError as exc:
        raise TraceError(f"{p}: Chakra support is missing (traffic.traces.chakra cannot be imported: {exc})") from None
    return _merge_ranks([read_chakra(f) for f in files], p)


def _merge_ranks(parts: list[Workload], source: Path) -> Workload:
    """One Workload from per-rank files: each file keeps its own ranks and groups."""
    if len(parts) == 1:
        return parts[0]
    seen: dict[int, str] = {}
    ranks = []
    notes: list[str] = []
    for w in parts:
        for r in w.ranks:
            if r.rank in seen:
                raise TraceError(f"{source}: rank {r.rank} appears in both {seen[r.rank]} and {w.source}")
            seen[r.rank] = w.source
            ranks.append(r)
        notes.extend(n for n in w.notes if n not in notes)
    ranks.sort(key=lambda r: r.rank)
    world = max([w.world_size for w in parts] + [ranks[-1].rank + 1])
    return replace(parts[0], name=source.name, source=str(source), world_size=world, ranks=tuple(ranks),
                   timed=all(w.timed for w in parts), notes=tuple(notes))


# --- summary -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KindSummary:
    kind: str
    count: int
    size_bytes: int  # total over the step's collectives of this kind

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count, "size_bytes": self.size_bytes}


@dataclass(frozen=True)
class StepSummary:
    rank: int
    number: int
    duration_us: float | None
    compute_us: float
    exposed_comm_us: float | None  # None where the trace has no timings
    exposed_comm_share: float | None  # exposed communication / step duration, as recorded
    kinds: tuple[KindSummary, ...]
    warmup: bool = False  # the step set up communicators (`Step.warmup`)
    left_out_us: float = 0.0  # of the exposed communication, collectives recorded but left out (`Step.left_out_us`)

    @property
    def collectives(self) -> int:
        return sum(k.count for k in self.kinds)

    @property
    def size_bytes(self) -> int:
        return sum(k.size_bytes for k in self.kinds)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "step": self.number, "duration_us": self.duration_us,
                "compute_us": self.compute_us, "exposed_comm_us": self.exposed_comm_us,
                "exposed_comm_share": self.exposed_comm_share, "collectives": self.collectives,
                "size_bytes": self.size_bytes, "by_kind": [k.to_dict() for k in self.kinds],
                "warmup": self.warmup, "left_out_us": self.left_out_us}


@dataclass(frozen=True)
class TraceSummary:
    name: str
    source: str
    format: str
    world_size: int
    ranks: tuple[int, ...]  # the ranks the trace covers
    steps: int  # steps per rank (the most any rank has)
    timed: bool
    step_summaries: tuple[StepSummary, ...]  # every rank's steps, by rank then step
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "format": self.format, "world_size": self.world_size,
                "ranks": list(self.ranks), "steps": self.steps, "timed": self.timed,
                "per_step": [s.to_dict() for s in self.step_summaries], "notes": list(self.notes)}


def summarize(workload: Workload) -> TraceSummary:
    """Per rank and step: compute time, collectives (count and bytes per kind), exposed-communication share."""
    rows = []
    for r in workload.ranks:
        for s in r.steps:
            kinds = tuple(KindSummary(k, n, b) for k, (n, b) in sorted(s.bytes_by_kind().items()))
            exposed = s.exposed_comm_us if workload.timed else None
            share = None
            if exposed is not None and s.duration_us:
                share = exposed / s.duration_us
            rows.append(StepSummary(r.rank, s.number, s.duration_us, s.compute_us, exposed, share, kinds, s.warmup,
                                    s.left_out_us if workload.timed else 0.0))
    return TraceSummary(workload.name, workload.source, workload.format, workload.world_size,
                        tuple(r.rank for r in workload.ranks), workload.steps, workload.timed, tuple(rows),
                        workload.notes)
