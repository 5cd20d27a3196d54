"""What a replay (or, later, a simulation) produces: one `RunResult`, written as `result.json`.

Every backend fills the same record, and `traffic.report` renders it (CSV, PNG, HTML) or puts two
runs side by side. Units are in the names: `_us` microseconds, `_s` seconds, `_bps` bits per second,
`_bytes` bytes. "real" means in the units of the real fabric being modelled (after dividing
emulated times by the dilation); "emu" means as measured on the emulator.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fabric.errors import FabriclabError

SCHEMA_VERSION = 1


class ResultError(FabriclabError):
    """A result file cannot be read; the message names the file and the problem."""


@dataclass(frozen=True)
class RunMeta:
    trace: str  # the trace's path (or "builtin:<name>")
    trace_format: str  # kineto, chakra, nccl-log
    workload: str  # the workload's name
    backend: str  # "emulation" or "flowsim"
    topology: str
    routing: str
    ranks: int
    hosts: int
    placement: str  # "block", "spread", "pods", "fragmented[:OCC[:SEED]]" or a file path
    algorithm: str  # all-reduce algorithm asked for ("auto", "ring", ...)
    channels: int  # connections per plane per host pair
    mbps_per_gbps: float  # emulated link scale
    dilation: float  # emulated time / real time
    bytes_scale: float  # emulated bytes / real bytes (= dilation x mbps_per_gbps / 1000)
    compute: str  # "composed" (default) or "slept"
    repeat: int
    steps_recorded: int
    started_wall: float  # time.time() at the start
    duration_s: float  # wall time of the whole run
    notes: tuple[str, ...] = ()
    ports: str = "planned"  # connection source ports: planned per path, or hashed (as the OS picks)
    # a generated training step's compute model (`traffic.workload.TrainingInfo` as a dict: model FLOPs per
    # step, the GPU's peak, the GPU count, ...): what MFU is computed from; None for recorded traces
    training: dict[str, Any] | None = None
    # the resolved run specification (`fabriclab.study.spec.Resolved.doc`): every choice the run made; None where
    # the run was not built from one (a replay, a library call)
    spec: dict[str, Any] | None = None


@dataclass(frozen=True)
class CollectiveResult:
    index: int  # in replay order
    step: int  # the trace's step number
    repeat: int  # which repetition of the steps (0-based)
    kind: str
    algorithm: str  # the one used
    size_bytes: int  # real
    emu_bytes: int  # what was sent per the nccl-tests size after scaling
    group_size: int
    stream: str
    transfers: int  # point-to-point transfers in its DAG
    start_emu_s: float  # relative to the run's first collective
    duration_emu_s: float
    duration_real_us: float
    algbw_bps: float  # real
    busbw_bps: float  # real


@dataclass(frozen=True)
class StepResult:
    step: int
    repeat: int
    rank: int  # the rank whose compute timeline was composed (-1: the job: `traffic.replay.result.job_step`)
    step_us: float
    compute_us: float
    exposed_comm_us: float
    idle_us: float
    recorded_step_us: float | None  # the trace's own step time, where it has one
    # the exposed communication split by stream (process group kind: "dp", "pp", ...; `metrics.exposed_by_stream`)
    exposed_by_stream_us: dict[str, float] = field(default_factory=dict)

    @property
    def utilisation(self) -> float:
        return self.compute_us / self.step_us if self.step_us > 0 else 0.0

    @property
    def comm_share(self) -> float:
        return self.exposed_comm_us / self.step_us if self.step_us > 0 else 0.0


@dataclass(frozen=True)
class LinkSeries:
    """A directed link's utilisation over time, from the switches' port counters."""

    switch: str
    port: int
    peer: str
    capacity_bps: float  # emulated
    tier: str  # "host" (a host's NIC link), "fabric" (switch to switch)
    plane: str
    emu_bytes: int  # sent over the whole run (emulated bytes)
    util: tuple[float, ...]  # per sample interval, 0..1; interval i starts at link_origin_emu_s + i x interval

    @property
    def name(self) -> str:
        return f"{self.switch}:{self.port}->{self.peer}"


@dataclass(frozen=True)
class Fidelity:
    """How faithful the emulation was: delivered vs bound per link, and whether the run was CPU-bound."""

    cpu_idle_share: float  # share of CPU time idle during the replay (both cores)
    cpu_bound: bool
    busiest_links: tuple[dict[str, Any], ...]  # {link, tier, delivered_bps, bound_bps, ratio}: emulated rates
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunResult:
    meta: RunMeta
    collectives: tuple[CollectiveResult, ...]
    steps: tuple[StepResult, ...]
    link_interval_s: float
    links: tuple[LinkSeries, ...]
    fidelity: Fidelity
    faults: tuple[dict[str, Any], ...] = ()  # injected during the run: kind, target, up, at_emu_s
    events: tuple[dict[str, Any], ...] = ()  # the controller's reroutes during the run
    schema: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    link_origin_emu_s: float = 0.0  # start of the first link sample, relative to the first collective's start

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["meta"]["training"] is None:  # recorded traces: the record as it was before generated steps
            del d["meta"]["training"]
        d["steps"] = [asdict(s) | {"utilisation": s.utilisation, "comm_share": s.comm_share} for s in self.steps]
        return d

    def write(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "result.json"
        tmp = out_dir / "result.json.tmp"
        tmp.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))
        tmp.replace(path)
        return path


def load_result(path: Path) -> RunResult:
    """Read a `result.json` (or the directory holding one)."""
    if path.is_dir():
        path = path / "result.json"
    try:
        d = json.loads(path.read_text())
    except OSError as e:
        raise ResultError(f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise ResultError(f"{path}: not JSON: {e}") from None
    try:
        if d.get("schema") != SCHEMA_VERSION:
            raise ResultError(f"{path}: schema {d.get('schema')!r} is not {SCHEMA_VERSION}")
        meta = RunMeta(**(d["meta"] | {"notes": tuple(d["meta"].get("notes", ()))}))
        steps = tuple(StepResult(**{k: v for k, v in s.items() if k not in ("utilisation", "comm_share")})
                      for s in d["steps"])
        fid = d["fidelity"]
        return RunResult(
            meta=meta,
            collectives=tuple(CollectiveResult(**c) for c in d["collectives"]),
            steps=steps,
            link_interval_s=d["link_interval_s"],
            links=tuple(LinkSeries(**(l | {"util": tuple(l["util"])})) for l in d["links"]),
            fidelity=Fidelity(fid["cpu_idle_share"], fid["cpu_bound"], tuple(fid["busiest_links"]),
                              tuple(fid.get("warnings", ()))),
            faults=tuple(d.get("faults", ())),
            events=tuple(d.get("events", ())),
            extra=d.get("extra", {}),
            link_origin_emu_s=d.get("link_origin_emu_s", 0.0),
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise ResultError(f"{path}: not a fabriclab result: {type(e).__name__}: {e}") from None
