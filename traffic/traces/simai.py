"""SimAI workload files (aliyun/SimAI's astra-sim input, as AICB's SimAI workload generator writes them) into a
`Workload` of every rank of the job: one training step.

Line 1: the parallelism policy and `key: value` pairs, e.g. `HYBRID_TRANSFORMER_FWD_IN_BCKWD
model_parallel_NPU_group: 8 ep: 1 pp: 1 vpp: 8 ga: 1 all_gpus: 32 checkpoints: 0 checkpoint_initiates: 0
pp_comm: 0`. Line 2: the number of layers. Then one line per layer of 12 whitespace-separated fields (SimAI's
`Workload::initialize_workload`): name, a reserved field (-1), forward compute time, forward comm type, its size,
input-gradient compute time, comm type, size, weight-gradient compute time, comm type, size, weight-update time.

- Times are SimAI ticks, nanoseconds; sizes bytes (the nccl-tests sizes: SimAI's all-gather is the whole
  output, its reduce-scatter the whole input).
- Degrees: tp = model_parallel_NPU_group, pp = pp, ep = ep, world = all_gpus (or the caller's world_size),
  dp = world / (tp x pp); groups in Megatron-Core order (`traffic.parallel.ParallelGrid`).
- Comm types ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, NONE. The group, as SimAI takes it: forward and
  input-gradient comms on the tensor-parallel group ("tp"), weight-gradient comms on the data-parallel group
  ("dp"); a `_EP` suffix puts it on the expert-parallel group ("ep"), `_DP_EP` on the expert data-parallel group
  ("edp"). In MICRO and DATA files every comm is on the data-parallel group (the whole job). BROADCAST is no
  communication to SimAI (it reads it as none): left out, noted.
- The step, in SimAI's order (`Workload::iterate_hybrid_parallel_Transformer*` in astra-sim-alibabacloud's
  workload/Workload.cc:702-931, aliyun/SimAI cef83f9d): each layer's forward compute then its collective, in file order;
  then, layers in reverse, input-gradient compute and collective, weight-gradient compute and collective. The
  compute waits for forward and input-gradient collectives (issued Blocking there) and runs beside weight-gradient
  ones (Non_Blocking: `Collective.blocking` False); a layer's update time follows each of its blocking comms
  (Layer::call adds it to the comm's finish). With pp > 1 and a `pp_comm` size, each stage sends pp_comm bytes to
  the next stage after its forward pass and to the previous one after its backward pass, `ga` times
  (`Collective.count`: one each way per micro-batch, as Megatron's 1F1B without interleaving), listed by both
  ranks of the transfer, beside the compute. `vpp` is not applied: AICB's generator writes vpp = the layers per
  stage (aliyun/aicb utils/utils.py:699 divides num_layers by pp; SimAI_training_workload_generator.py:858
  writes it), not a virtual-pipeline degree, and AICB has no interleaving option; SimAI's analytical pipeline
  time multiplies by it (Layer.cc:504), one transfer per layer per micro-batch.
- No communication times: timed=False, program=True: compute intervals are laid out with collectives taken as
  instantaneous, and a replay composes the step in that order with the collectives' measured times
  (`traffic.metrics.compose_program`).
- Bad lines are TraceErrors naming file:line and the field; nothing half-read is returned.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from traffic.parallel import ParallelError, ParallelGrid
from traffic.traces.files import open_trace, read_error
from traffic.workload import Collective, RankTrace, Step, TraceError, Workload, checked_size

#: SimAI's parallelism policies (`Workload::decode_parallelsim`): a file's first word (format detection).
POLICIES = ("DATA", "HYBRID_TRANSFORMER", "HYBRID_TRANSFORMER_FWD_IN_BCKWD", "HYBRID_DLRM", "HYBRID_DLRM_ENHANCED",
            "MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA", "HYBRID_CUSTOMIZED", "MICRO", "DISTRIBUTED_INFERENCE")
#: The ones read here: the transformer policies, and the all-data-parallel ones.
READ_POLICIES = ("HYBRID_TRANSFORMER", "HYBRID_TRANSFORMER_FWD_IN_BCKWD", "MICRO", "DATA")
MAX_RANKS = 1 << 20
MAX_LAYERS = 1 << 20
#: rows x ranks above this is refused: the Workload would not fit in memory.
MAX_ROW_RANKS = 50_000_000
#: The longest a compute time may be: 10^15 ns (11.6 days).
MAX_TICKS = 10 ** 15
_KINDS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "REDUCESCATTER": "reduce_scatter",
          "ALLTOALL": "all_to_all"}
_INT = re.compile(r"-?\d{1,20}$")
_FIELDS = ("name", "reserved", "fwd_compute_time", "fwd_comm_type", "fwd_comm_size", "ig_compute_time",
           "ig_comm_type", "ig_comm_size", "wg_compute_time", "wg_comm_type", "wg_comm_size", "wg_update_time")
_HEADER_KEYS = ("model_parallel_NPU_group", "ep", "expert_parallel_npu_group", "pp", "vpp", "ga", "all_gpus",
                "pp_comm")


@dataclass(frozen=True)
class _Comm:
    kind: str
    axis: str
    size_bytes: int
    phase: str  # "fwd", "ig", "wg"


@dataclass(frozen=True)
class _Layer:
    line: int
    name: str
    fwd_ns: int
    fwd: _Comm | None
    ig_ns: int
    ig: _Comm | None
    wg_ns: int
    wg: _Comm | None
    update_ns: int


def read_simai(path: Path, *, world_size: int | None = None) -> Workload:
    """Every rank's step from one SimAI workload file (see the module docstring)."""
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                   or not 1 <= world_size <= MAX_RANKS):
        raise TraceError(f"{path}: world_size must be an integer from 1 to {MAX_RANKS}, got {world_size!r}")
    lines = _text_lines(path)
    if not lines:
        raise TraceError(f"{path}: empty file, not a SimAI workload")
    policy, header, unknown = _header(path, lines[0][1], lines[0][0])
    notes: list[str] = []
    broadcasts = [0, 0]
    layers = _layers(path, lines[1:], policy, broadcasts)
    grid = _grid(path, policy, header, world_size, notes)
    if len(layers) * 3 * grid.world > MAX_ROW_RANKS:
        raise TraceError(f"{path}: {len(layers)} layers x {grid.world} ranks is more than the {MAX_ROW_RANKS} "
                         "collectives a workload may hold")
    pp_bytes = header.get("pp_comm", 0)
    ga = max(1, header.get("ga", 1))
    compute, positions, duration_us = _layout(layers)
    cache: dict[tuple[str, tuple[int, ...]], Collective] = {}
    skipped_one = 0
    ranks = []
    for rank in range(grid.world):
        stage = grid.coords(rank)["pp"]
        pipe = grid.group_of("pp", rank)
        colls: list[Collective] = []

        def add(key: str, c: _Comm, start: float, group: tuple[int, ...], count: int = 1) -> None:
            nonlocal skipped_one
            if len(group) < 2:
                skipped_one += rank == 0
                return
            hit = cache.get((key, group))
            if hit is None:  # the compute waits for forward and input-gradient comms (SimAI: Blocking)
                hit = cache[(key, group)] = Collective(c.kind, c.size_bytes, "unknown", group, c.axis, start, None,
                                                       key, count, blocking=c.phase in ("fwd", "ig"))
            colls.append(hit)

        def pp_send(key: str, start: float, peers: list[int]) -> None:
            for peer in peers:
                pair = (rank, peer) if rank < peer else (peer, rank)
                add(key, _Comm("send_recv", "pp", pp_bytes, "pp"), start, pair, ga)

        for (key, c), start in zip(_comms(layers), positions):
            if key == "pp:fwd":  # activations forward: sent to the next stage, received from the previous
                if grid.pp > 1 and pp_bytes:
                    pp_send(key, start, [pipe[s] for s in (stage - 1, stage + 1) if 0 <= s < grid.pp])
                continue
            if key == "pp:bwd":
                if grid.pp > 1 and pp_bytes:
                    pp_send(key, start, [pipe[s] for s in (stage + 1, stage - 1) if 0 <= s < grid.pp])
                continue
            if c is not None:
                add(key, c, start, grid.group_of(c.axis, rank))
        ranks.append(RankTrace(rank, (Step(0, duration_us, compute, tuple(colls)),)))
    if not any(s.collectives for r in ranks for s in r.steps):
        raise TraceError(f"{path}: no communication on a group of 2 or more ranks: nothing to replay")
    notes.insert(0, f"SimAI workload ({policy}): every rank runs the layers (SPMD) on its own groups in "
                    f"Megatron-Core order tp-cp-dp-pp (tp={grid.tp}, pp={grid.pp}, dp={grid.dp}, ep={grid.ep}; "
                    f"world {grid.world}); one step")
    notes.append("compute times read as nanoseconds (SimAI ticks), in SimAI's order: per layer forward compute "
                 "then its comm; layers in reverse, input-gradient compute, its comm, weight-gradient compute, "
                 "its comm; "
                 "the compute waits for forward and input-gradient comms (blocking in SimAI), not for weight-gradient "
                 "ones; a layer's update time follows its blocking comms")
    if header.get("checkpoints"):
        notes.append(f"{header['checkpoints']} checkpoint layer(s) in the header: the forward recomputed in the "
                     "backward pass (SimAI's fwd_in_bckwd) is not modelled")
    if broadcasts[0]:
        notes.append(f"{broadcasts[0]} BROADCAST comm(s) ({broadcasts[1]} bytes) left out: SimAI reads BROADCAST "
                     "as no communication")
    if skipped_one:
        notes.append(f"{skipped_one} comm(s) on a group of 1 rank left out (no traffic)")
    if grid.pp > 1:
        notes.append(f"pipeline: {pp_bytes} bytes (pp_comm) to the next stage after the forward pass and to the "
                     f"previous after the backward, x{ga} (ga: one each way per micro-batch, as Megatron sends without "
                     f"interleaving), beside the compute (non-blocking); vpp {header.get('vpp', 1)} not applied: AICB "
                     "writes vpp = layers per stage, not an interleaving degree (SimAI multiplies its analytical "
                     "pipeline time by it); no pipeline bubble" if pp_bytes
                     else "pp > 1 but no pp_comm size in the header: no pipeline traffic")
    if grid.pp == 1 and pp_bytes:
        notes.append(f"pp_comm {pp_bytes} with pp 1: no pipeline, no pipeline traffic")
    for key in unknown:
        notes.append(f"header key {key!r} not read")
    return Workload(name=path.name.split(".")[0], source=str(path), format="simai", world_size=grid.world,
                    ranks=tuple(ranks), timed=False, notes=tuple(notes), program=True)


def _text_lines(path: Path) -> list[tuple[int, str]]:
    """Non-blank lines with their numbers."""
    try:
        with open_trace(path) as f:
            raw = f.read()
    except (EOFError, OSError, zlib.error) as exc:
        raise read_error(path, exc) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise read_error(path, exc) from None
    if "\x00" in text:
        raise TraceError(f"{path}: NUL bytes in the file: not a SimAI workload")
    return [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]


def _header(path: Path, line: str, lineno: int) -> tuple[str, dict[str, int], tuple[str, ...]]:
    """The policy, the `key: value` numbers it gives, and the keys not read."""
    tokens = line.split()
    policy = tokens[0]
    if policy not in POLICIES:
        raise TraceError(f"{path}:{lineno}: {policy[:40]!r} is not a SimAI parallelism policy ({', '.join(POLICIES)})")
    if policy not in READ_POLICIES:
        raise TraceError(f"{path}:{lineno}: SimAI policy {policy} is not read here (only {', '.join(READ_POLICIES)})")
    out: dict[str, int] = {}
    unknown = []
    i = 1
    while i < len(tokens):
        key = tokens[i].rstrip(":")
        if key in ("checkpoints", "checkpoint_initiates"):
            n = _int(f"{path}:{lineno}", key, tokens[i + 1] if i + 1 < len(tokens) else "")
            if not 0 <= n <= len(tokens):
                raise TraceError(f"{path}:{lineno}: {key}: {n} layers listed, beyond the line's end")
            out[key] = n
            i += 2 + n
            continue
        if key in _HEADER_KEYS:
            value = _int(f"{path}:{lineno}", key, tokens[i + 1] if i + 1 < len(tokens) else "")
            if value < 0:
                raise TraceError(f"{path}:{lineno}: {key} {value} is negative")
            if key == "pp_comm":
                checked_size(f"{path}:{lineno}", "pp_comm", value)
            elif value > MAX_RANKS:
                raise TraceError(f"{path}:{lineno}: {key} {value} is above {MAX_RANKS}")
            out["ep" if key == "expert_parallel_npu_group" else key] = value
            i += 2
            continue
        unknown.append(key)
        i += 1
    return policy, out, tuple(unknown)


def _int(where: str, field: str, raw: str) -> int:
    if not _INT.match(raw.strip()):
        raise TraceError(f"{where}: {field} {raw[:40]!r} is not an integer")
    return int(raw)


def _ticks(where: str, field: str, raw: str) -> int:
    v = _int(where, field, raw)
    if not 0 <= v <= MAX_TICKS:
        raise TraceError(f"{where}: {field} {v} is not from 0 to {MAX_TICKS} ns")
    return v


def _layers(path: Path, lines: list[tuple[int, str]], policy: str, broadcasts: list[int]) -> list[_Layer]:
    if not lines:
        raise TraceError(f"{path}: only a header line, no layer count and no layers")
    lineno, count_text = lines[0]
    n = _int(f"{path}:{lineno}", "the number of layers", count_text)
    if not 1 <= n <= MAX_LAYERS:
        raise TraceError(f"{path}:{lineno}: the number of layers {n} is not from 1 to {MAX_LAYERS}")
    body = lines[1:]
    if len(body) < n:
        raise TraceError(f"{path}: {len(body)} layer line(s), but line {lineno} says {n}")
    if len(body) > n:
        raise TraceError(f"{path}:{body[n][0]}: more layer lines than the {n} line {lineno} says")
    whole = policy in ("MICRO", "DATA")
    out = []
    for ln, text in body:
        where = f"{path}:{ln}"
        f = text.split()
        if len(f) != len(_FIELDS):
            raise TraceError(f"{where}: {len(f)} fields, a layer has {len(_FIELDS)} ({' '.join(_FIELDS)})")
        _int(where, "reserved", f[1])
        comms = []
        for phase, ti, si in (("fwd", 3, 4), ("ig", 6, 7), ("wg", 9, 10)):
            comms.append(_comm(where, phase, f[ti], f[si], whole, broadcasts))
        out.append(_Layer(ln, f[0], _ticks(where, "fwd_compute_time", f[2]), comms[0],
                          _ticks(where, "ig_compute_time", f[5]), comms[1], _ticks(where, "wg_compute_time", f[8]),
                          comms[2], _ticks(where, "wg_update_time", f[11])))
    return out


def _comm(where: str, phase: str, ctype: str, raw_size: str, whole: bool, broadcasts: list[int]) -> _Comm | None:
    size = checked_size(where, f"{phase}_comm_size ({ctype[:40]})", _int(where, f"{phase}_comm_size", raw_size))
    if ctype == "NONE":
        return None
    if ctype == "BROADCAST":
        broadcasts[0] += 1
        broadcasts[1] += size
        return None
    base, axis = ctype, ("dp" if whole or phase == "wg" else "tp")
    for suffix, a in (("_DP_EP", "edp"), ("_EP", "ep")):
        if ctype.endswith(suffix):
            base, axis = ctype[: -len(suffix)], a
            break
    if base not in _KINDS:
        raise TraceError(f"{where}: {phase}_comm_type {ctype[:40]!r} is not one read here (ALLREDUCE, ALLGATHER, "
                         "REDUCESCATTER, ALLTOALL, optionally _EP or _DP_EP; NONE; BROADCAST)")
    return _Comm(_KINDS[base], axis, size, phase)


def _comms(layers: list[_Layer]) -> list[tuple[str, _Comm | None]]:
    """The step's communication in order, keyed by what it is ("L3:fwd attention_layer"); "pp:fwd" / "pp:bwd"
    mark where the pipeline transfers go."""
    out: list[tuple[str, _Comm | None]] = []
    for i, layer in enumerate(layers):
        if layer.fwd is not None:
            out.append((f"L{i}:fwd {layer.name}", layer.fwd))
    out.append(("pp:fwd", None))
    for i in reversed(range(len(layers))):
        layer = layers[i]
        if layer.ig is not None:
            out.append((f"L{i}:ig {layer.name}", layer.ig))
        if layer.wg is not None:
            out.append((f"L{i}:wg {layer.name}", layer.wg))
    out.append(("pp:bwd", None))
    return out


def _layout(layers: list[_Layer]) -> tuple[tuple[tuple[float, float], ...], list[float], float]:
    """The compute intervals (us), the place of each entry of `_comms` in them (communication taking no time),
    the step's compute length. SimAI's order (`Workload::iterate_hybrid_parallel_Transformer*`, Workload.cc): per
    layer forward compute, then its comm; layers in reverse, input-gradient compute, its comm, weight-gradient
    compute, its comm. A layer's update time follows each of its comms that the compute waits for (Layer::call
    adds it to the comm's finish, Layer.cc:92-113): the forward and input-gradient ones."""
    compute: list[tuple[float, float]] = []
    starts: list[float] = []
    t = 0.0

    def busy(ns: int) -> None:
        nonlocal t
        if ns > 0:
            compute.append((t, t + ns / 1000.0))
            t += ns / 1000.0

    for layer in layers:
        busy(layer.fwd_ns)
        if layer.fwd is not None:
            starts.append(t)
            busy(layer.update_ns)
    starts.append(t)  # pp:fwd
    for layer in reversed(layers):
        busy(layer.ig_ns)
        if layer.ig is not None:
            starts.append(t)
            busy(layer.update_ns)
        busy(layer.wg_ns)
        if layer.wg is not None:
            starts.append(t)
    starts.append(t)  # pp:bwd
    merged: list[tuple[float, float]] = []
    for a, b in compute:  # adjacent intervals: one
        if merged and math.isclose(merged[-1][1], a):
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return tuple(merged), starts, t


def _grid(path: Path, policy: str, header: dict[str, int], world_size: int | None,
          notes: list[str]) -> ParallelGrid:
    whole = policy in ("MICRO", "DATA")
    tp = 1 if whole else max(1, header.get("model_parallel_NPU_group", 1))
    pp = 1 if whole else max(1, header.get("pp", 1))
    ep = 1 if whole else max(1, header.get("ep", 1))
    listed = header.get("all_gpus")
    if world_size is not None:
        world = world_size
        if listed and listed != world_size:
            notes.append(f"mapped onto {world_size} ranks (world_size), not the file's all_gpus {listed}")
    elif listed:
        world = listed
    else:
        raise TraceError(f"{path}:1: no all_gpus in the header: the job's size is unknown; pass world_size")
    if world % (tp * pp):
        raise TraceError(f"{path}: world size {world} is not a multiple of tp x pp = {tp} x {pp}")
    try:
        return ParallelGrid(tp=tp, pp=pp, dp=world // (tp * pp), ep=ep)
    except ParallelError as exc:
        raise TraceError(f"{path}: the header's sizes make no Megatron grid: {exc}") from None
