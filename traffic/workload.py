"""The workload: what a training job communicates, per rank and step, read from a trace.

Every trace format (`traffic.traces`: Kineto JSON, Chakra execution traces, NCCL debug logs) is
parsed into one `Workload`: per rank, per training step, the compute intervals and the collectives
(kind, bytes, dtype, process group) in the order the trace has them, with the trace's own timings
kept where it has any. Times are microseconds relative to the start of their step.

Sizes follow the nccl-tests convention (`size_bytes`): all-reduce, broadcast, reduce: the buffer;
all-gather: the whole output (every rank's part); reduce-scatter: the whole input; all-to-all: the
whole send buffer of one rank. Kineto's "max(In msg nelems, Out msg nelems) x dtype size" is that size.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable

from fabric.errors import FabriclabError

#: Collective kinds, named as in PyTorch / nccl-tests (snake case).
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather",
         "scatter", "send_recv", "barrier")


class TraceError(FabriclabError):
    """A trace cannot be read: the message names the file and the problem (the CLI exits 2)."""


Interval = tuple[float, float]  # (start_us, end_us), relative to the step start

#: What a Kineto trace's GPU kernels without a launch event count as (`traffic.traces.kineto`): "leave-out" (the
#: default, as HolisticTraceAnalysis: a GPU event takes its launch's step, and these have none) or "by-time" (the
#: step whose window holds the kernel's start, clipped to the step's end).
LAUNCHLESS_KERNELS = ("leave-out", "by-time")

#: The largest collective a trace may declare: 2^48 bytes (256 TiB), beyond any real training job's buffer
#: (a 100B-parameter model's fp32 gradients are 4e11 bytes). A size above it, or a negative one, is a corrupt or
#: hostile trace, refused where it is read.
MAX_COLLECTIVE_BYTES = 1 << 48


def checked_size(where: str, what: str, size_bytes: int) -> int:
    """`size_bytes` if it is a collective size a trace may declare (0 <= size <= MAX_COLLECTIVE_BYTES), else a
    TraceError naming `where` (the file, and the line or timestamp) and `what` (the event and the fields the size
    came from, e.g. "NCCL kernel 'ncclDevKernel_AllReduce' In msg nelems -5 x float32")."""
    if size_bytes < 0:
        raise TraceError(f"{where}: {what}: negative size ({size_bytes} bytes)")
    if size_bytes > MAX_COLLECTIVE_BYTES:
        raise TraceError(f"{where}: {what}: {size_bytes} bytes is more than the 2^48 bytes a collective may have")
    return size_bytes


#: the stream of collectives recorded but left out of a replay (`Collective.left_out`): their recorded time
LEFT_OUT_STREAM = "left-out collectives"
#: a timed log's step 0 is warm-up where a group's first call took more than this many times that call's median
WARMUP_RATIO = 10.0


@dataclass(frozen=True)
class Collective:
    kind: str  # one of KINDS
    size_bytes: int  # nccl-tests size (see the module docstring)
    dtype: str  # "float32", "bfloat16", ... ("unknown" if the trace does not say)
    group_ranks: tuple[int, ...]  # global ranks of the process group, ascending
    stream: str = "0"  # the device stream / track it ran on: collectives on one stream are serial
    start_us: float | None = None  # relative to the step start; None where the trace has no timings
    duration_us: float | None = None
    name: str = ""  # the trace's own name for it (kernel, annotation or node name)
    # it stands for `count` back-to-back collectives of `size_bytes` each, over `duration_us` together (AICB's
    # `count`; a layer chunk's in-server TP all-reduces); every reader counts and sums bytes with it
    count: int = 1
    # in a program-ordered step (`Workload.program`): whether the compute after it waits for it to end (SimAI's
    # blocking forward and input-gradient collectives) or runs on beside it (its non-blocking weight-gradient ones)
    blocking: bool = True
    # recorded but not replayed (its group is unknown: an AICB ep_group row without `--ep`): no call is planned for
    # it, its recorded time stays in the step on stream LEFT_OUT_STREAM, and it is not counted in `bytes_by_kind`
    left_out: bool = False

    @property
    def total_bytes(self) -> int:
        return self.size_bytes * self.count

    @property
    def group_size(self) -> int:
        return len(self.group_ranks)

    @property
    def end_us(self) -> float | None:
        if self.start_us is None or self.duration_us is None:
            return None
        return self.start_us + self.duration_us


@dataclass(frozen=True)
class Step:
    number: int  # ProfilerStep#N's N, or 0, 1, ... where the trace has no step markers
    duration_us: float | None  # None where the trace has no timings
    compute: tuple[Interval, ...]  # merged, sorted busy intervals of compute (not communication)
    collectives: tuple[Collective, ...]  # in issue order (by start time where timed)
    # a timed log's first step that set up communicators (a group's first call > WARMUP_RATIO x its median)
    warmup: bool = False

    @property
    def compute_us(self) -> float:
        return sum(b - a for a, b in self.compute)

    @property
    def comm_intervals(self) -> tuple[Interval, ...]:
        spans = [(c.start_us, c.end_us) for c in self.collectives if c.start_us is not None and c.end_us is not None]
        return merge_intervals(spans)  # type: ignore[arg-type]

    @property
    def comm_us(self) -> float:
        """Time at least one collective was running (union of their intervals)."""
        return sum(b - a for a, b in self.comm_intervals)

    @property
    def exposed_comm_us(self) -> float:
        """Communication time not hidden behind compute (union of collectives minus compute)."""
        return self.comm_us - overlap_us(self.comm_intervals, self.compute)

    @property
    def left_out_us(self) -> float:
        """The recorded time of the collectives left out of a replay (`Collective.left_out`), not under compute:
        part of `exposed_comm_us`, on its own stream (LEFT_OUT_STREAM)."""
        spans = merge_intervals([(c.start_us, c.end_us) for c in self.collectives  # type: ignore[misc]
                                 if c.left_out and c.start_us is not None and c.end_us is not None])
        return sum(b - a for a, b in spans) - overlap_us(spans, self.compute)

    def bytes_by_kind(self) -> dict[str, tuple[int, int]]:
        """kind -> (count, total bytes) in this step."""
        out: dict[str, tuple[int, int]] = {}
        for c in self.collectives:
            if c.left_out:
                continue
            n, b = out.get(c.kind, (0, 0))
            out[c.kind] = (n + c.count, b + c.total_bytes)
        return out


@dataclass(frozen=True)
class RankTrace:
    rank: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class TrainingInfo:
    """What a generated training step computes, for MFU (model FLOPs utilisation): the model's FLOPs per step
    (forward + backward, no recomputation) over the job's peak FLOP/s for the step's time."""

    model: str
    gpu: str  # "a100", "h100", ...
    peak_flops_per_gpu: float  # dense bf16 FLOP/s
    kernel_efficiency: float  # achieved / peak FLOP/s of the compute model's kernels
    world_size: int
    model_flops_per_step: float  # whole job
    tokens_per_step: int
    compute_model: str  # one line: how compute times were made

    def mfu(self, step_us: float) -> float:
        """model FLOPs per step / (step time x world size x peak FLOP/s per GPU)."""
        if not step_us > 0:
            raise TraceError(f"{self.model}: MFU needs a step time > 0, got {step_us} us")
        return self.model_flops_per_step / (step_us * 1e-6 * self.world_size * self.peak_flops_per_gpu)

    def summary(self) -> str:
        return (f"{self.model}: {self.model_flops_per_step:.3e} model FLOPs and {self.tokens_per_step} tokens per "
                f"step on {self.world_size} x {self.gpu} ({self.peak_flops_per_gpu / 1e12:g} TFLOP/s peak, kernel "
                f"efficiency {self.kernel_efficiency:g}); {self.compute_model}")


@dataclass(frozen=True)
class Workload:
    name: str  # e.g. the file's stem
    source: str  # the path it was read from
    format: str  # "kineto", "chakra" or "nccl-log"
    world_size: int  # ranks in the job (the largest process group, or as the trace says)
    ranks: tuple[RankTrace, ...]  # the ranks the trace covers (one for a single-rank trace)
    timed: bool  # whether steps carry the trace's own timings
    notes: tuple[str, ...] = field(default=())  # what the parser assumed or could not know
    training: TrainingInfo | None = None  # a generated training step's model FLOPs, for MFU (None for traces)
    # untimed, yet each step carries its compute (`Step.compute`, laid out with communication taking no time) and
    # each collective's place in it (`Collective.start_us`, `blocking`): a step is composed in that order
    # (`traffic.metrics.compose_program`), not as collectives back to back (SimAI files, generated AICB files)
    program: bool = False

    @property
    def steps(self) -> int:
        return max((len(r.steps) for r in self.ranks), default=0)

    def collectives(self) -> Iterable[Collective]:
        for r in self.ranks:
            for s in r.steps:
                yield from s.collectives

    def mapped_to(self, n_ranks: int) -> "Workload":
        """A data-parallel job from fewer ranks, on `n_ranks` ranks: every rank runs rank 0's steps, and
        every collective whose group spanned the whole recorded job spans all `n_ranks`. Collectives
        over a sub-group of the recorded job cannot be mapped and raise TraceError."""
        if n_ranks < 2:
            raise TraceError(f"{self.source}: cannot map onto {n_ranks} ranks (need at least 2)")
        base = self.ranks[0]
        whole = set(range(self.world_size))
        steps = []
        for s in base.steps:
            colls = []
            for c in s.collectives:
                if set(c.group_ranks) != whole and c.kind != "send_recv":
                    raise TraceError(
                        f"{self.source}: step {s.number}: {c.kind} over ranks {list(c.group_ranks)} is not "
                        f"data-parallel over all {self.world_size} ranks; it cannot be mapped onto {n_ranks}")
                colls.append(replace(c, group_ranks=tuple(range(n_ranks))))
            steps.append(replace(s, collectives=tuple(colls)))
        ranks = tuple(RankTrace(r, tuple(steps)) for r in range(n_ranks))
        note = f"mapped from {self.world_size} recorded rank(s) onto {n_ranks} (data-parallel: rank {base.rank}'s steps)"
        return replace(self, world_size=n_ranks, ranks=ranks, notes=self.notes + (note,))


def merge_intervals(spans: Iterable[Interval]) -> tuple[Interval, ...]:
    """Union of intervals, as sorted disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def overlap_us(xs: tuple[Interval, ...], ys: tuple[Interval, ...]) -> float:
    """Total length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a = max(xs[i][0], ys[j][0])
        b = min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


# --- names shared by the trace parsers: dtypes and collective kinds -------------------------------------------------

#: Bytes per element, by canonical dtype name (the names `Collective.dtype` uses).
DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1,
    "bool": 1, "complex128": 16, "complex64": 8,
}

# How the traces spell them: c10 ScalarType names (Kineto's `dtype` arg: "Float", "BFloat16"), C++ type names
# (Kineto's `Input type`: "float", "long int", "c10::Half") and numpy-style names; compared in lower case.
_DTYPE_ALIASES = {
    "double": "float64", "float": "float32", "half": "float16", "c10::half": "float16",
    "c10::bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn", "c10::float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2", "c10::float8_e5m2": "float8_e5m2",
    "long": "int64", "long int": "int64", "long long": "int64", "long long int": "int64", "int64_t": "int64",
    "int": "int32", "int32_t": "int32", "short": "int16", "short int": "int16", "int16_t": "int16",
    "char": "int8", "signed char": "int8", "int8_t": "int8",
    "byte": "uint8", "unsigned char": "uint8", "uint8_t": "uint8", "unsigned short": "uint16",
    "unsigned int": "uint32", "unsigned long": "uint64", "unsigned long int": "uint64",
    "complexfloat": "complex64", "c10::complex<float>": "complex64",
    "complexdouble": "complex128", "c10::complex<double>": "complex128",
}


def canonical_dtype(name: str) -> str | None:
    """The canonical dtype name ("float32", ...) for a trace's spelling, or None if it is not a known dtype."""
    key = name.strip().lower()
    if key in DTYPE_BYTES:
        return key
    return _DTYPE_ALIASES.get(key)


# Collective names as the traces spell them, with case, underscores and variant suffixes removed
# ("_allgather_base", "all_gather_into_tensor_coalesced", "AllGather" -> "allgather").
_KIND_KEYS = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "alltoallv": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
    "gather": "gather", "scatter": "scatter", "send": "send_recv", "recv": "send_recv", "sendrecv": "send_recv",
    "barrier": "barrier",
}
_KIND_SUFFIXES = ("_coalesced", "_base", "_into_tensor", "_tensor", "_single", "_sparse")


def _kind_key(name: str) -> str:
    key = name.strip().lower().lstrip("_")
    changed = True
    while changed:
        changed = False
        for suffix in _KIND_SUFFIXES:
            if key.endswith(suffix):
                key = key[: -len(suffix)]
                changed = True
    return key.replace("_", "")


def collective_kind(name: str) -> str | None:
    """The KINDS member for a trace's collective name ("allreduce", "nccl:_allgather_base" without its prefix,
    NCCL's "ReduceScatter", ...), or None if the name is not a known collective."""
    return _KIND_KEYS.get(_kind_key(name))


def is_receive(name: str) -> bool:
    """Whether a collective name is the receiving half of a point-to-point transfer ("recv", NCCL's "Recv").
    The parsers count a transfer once, at its sender, so they leave these out (and say so in the notes)."""
    return _kind_key(name) == "recv"
