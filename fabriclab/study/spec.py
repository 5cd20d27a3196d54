"""The run specification: what one simulated run is, with every "auto" choice made in one place.

    spec = RunSpec(WorkloadSpec.parse("llm:gpt3-175b"), RunOptions(), SimModel())
    run = resolve(spec, gpus=2048, topology="pyramid-1024-rail", routing="ecmp")
    run.replay_options(), run.sim_options(), run.all_to_all, run.doc()

A `RunSpec` holds what the user asked: the workload (a trace path, `builtin`, or a generated LLM step
`llm:SPEC`, parsed once here), the run options (`RunOptions`: placement, all-reduce algorithm, channels,
ports, ...) and the simulator's model (`SimModel`: latencies, resolution, lockstep, the all-to-all model).
`resolve(spec, gpus, topology, routing)` turns it into a `Resolved` run at one size on one fabric, making
each "auto" choice by one rule:
- the all-reduce algorithm: a ring above `SimModel.hierarchical_above_gpus` GPUs runs in its hierarchical
  form (rings inside each leaf, rings across leaves), as NCCL does not run a flat ring over 16k ranks either;
- lockstep (`fabric.flowsim.SimOptions.lockstep`): auto is on above the same size, unless cut-through;
- the time resolution: 5 us for generated LLM steps (MB-sized transfers), 1 ns for traces
  (`fabric.latency.COARSE_RESOLUTION_US`, `DEFAULT_RESOLUTION_US`);
- source ports: planned under adaptive routing, hashed otherwise (`traffic.replay.default_ports`);
- the all-to-all model: auto is exact up to `A2A_EXACT_MAX` ranks per call and sampled above
  (`traffic.replay.simulate.sample_phases`, per call).
Fields for the choices later issues bring (NCCL's own algorithm, channels per NIC, PXN, a fast simulator
model) are there with today's behaviour. `fabriclab sim`, `compare`, `plan` and the main job build their runs
from it, and every result (`RunMeta.spec`) and every compare or plan row (`Row.spec`) carries `doc()`, so two
commands at the same size cannot run different models unseen.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fabric.errors import FabriclabError
from fabric.latency import (COARSE_RESOLUTION_US, DEFAULT_PER_HOP_US, DEFAULT_PER_TRANSFER_US, DEFAULT_RESOLUTION_US,
                            NCCL_NVLINK_RING_STEP_US)
from traffic.traces import LLM_PREFIX  # the prefix of a generated LLM step where a trace goes
from traffic.nccl_choice import NCCL_ALGOS

#: above this many GPUs a ring all-reduce runs hierarchical and lockstep is on (the defaults of `SimModel`)
FLAT_RING_MAX = 1024
LOCKSTEP_CHOICES = ("auto", "on", "off")
FORWARDING_CHOICES = ("store-and-forward", "cut-through")


class SpecError(FabriclabError):
    """A run specification that cannot be resolved; the message names the offending item."""


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The workload as given: a trace file or directory, `builtin`, or a generated LLM step `llm:SPEC`."""

    text: str

    @classmethod
    def parse(cls, text: str) -> WorkloadSpec:
        if not text:
            raise SpecError("no workload given")
        return cls(text)

    @classmethod
    def model(cls, spec: str) -> WorkloadSpec:
        """`--model SPEC`: a generated LLM step, with or without its `llm:` prefix."""
        return cls(spec if spec.startswith(LLM_PREFIX) else LLM_PREFIX + spec)

    @property
    def llm(self) -> bool:
        return self.text.startswith(LLM_PREFIX)

    @property
    def llm_spec(self) -> str:
        """The LLM spec without its prefix (`traffic.llm.load_config`'s argument)."""
        if not self.llm:
            raise SpecError(f"{self.text}: not a generated LLM step (llm:SPEC)")
        return self.text[len(LLM_PREFIX):]

    def at(self, gpus: int, extra: str = "") -> WorkloadSpec:
        """The workload at `gpus` GPUs. A trace is mapped by the run (`--ranks`); a generated LLM step is
        weak-scaled: TP, CP and PP as the spec says, DP = gpus / (TP x CP x PP), and the global batch scaled
        with DP so that every replica runs the same micro-batches (its pipeline, bubble and gradient size stay;
        throughput per GPU compares across sizes); `extra`: more overrides ("key=value,...")."""
        if not self.llm:
            if extra:
                raise SpecError("spec overrides are a generated LLM step's (llm:SPEC or --model)")
            return self
        from traffic.llm import load_config

        cfg = load_config(self.llm_spec)
        par = cfg.parallel
        cell = par.tp * par.cp * par.pp
        if gpus % cell:
            raise SpecError(f"{self.text} at {gpus} GPUs: {gpus} is not a multiple of TP x CP x PP = {par.tp} x "
                            f"{par.cp} x {par.pp} = {cell}")
        dp = gpus // cell
        per_replica = cfg.global_batch // par.dp  # samples per replica and step (micro-batches x micro-batch)
        out = f"{self.text},parallel.dp={dp},global_batch={per_replica * dp}" + (f",{extra}" if extra else "")
        try:
            load_config(out[len(LLM_PREFIX):])
        except FabriclabError as e:
            raise SpecError(f"{self.text} at {gpus} GPUs (DP {dp}): {e}") from None
        return WorkloadSpec(out)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How the workload runs, as asked (`ReplayOptions`' fields that a user sets; "auto" where it may be)."""

    ranks: int | None = None
    placement: str = "block"
    algorithm: str = "nccl"  # "nccl": NCCL's algorithm as `nccl_algo` says; or an all-reduce algorithm (ring, ...)
    channels: int = 2
    ports: str = "auto"
    seed: int = 0
    repeat: int = 1
    compute_gap_us: float = 0.0
    step_ops: int | None = None
    launchless_kernels: str | None = None  # Kineto traces: "leave-out" (None: the reader's default) or "by-time"
    pxn: bool = True  # NCCL's PXN: a ring's server exit and an all-to-all's cross-rail piece through the peer rail's NIC
    nccl_algo: str = "auto"  # NCCL_ALGO: auto (its tuning model), ring, tree or pat (`traffic.nccl_choice`)
    merge_nics: bool = True  # NCCL_IB_MERGE_NICS: a channel striped over a dual-port NIC's planes; False: alternating

    def replay_options(self, routing: str, **emulation: Any) -> Any:
        """`traffic.replay.ReplayOptions` for a run under `routing` (ports resolved: planned under adaptive routing,
        hashed otherwise), with the emulation's own settings (`mbps_per_gbps`, `dilation`) where given."""
        from traffic.replay import ReplayOptions, default_ports

        return ReplayOptions(ranks=self.ranks, placement=self.placement, algorithm=self.algorithm,
                             channels=self.channels, repeat=self.repeat, compute_gap_us=self.compute_gap_us,
                             step_ops=self.step_ops, ports=default_ports(routing, self.ports), seed=self.seed,
                             launchless_kernels=self.launchless_kernels, pxn=self.pxn, nccl_algo=self.nccl_algo,
                             merge_nics=self.merge_nics, **emulation)


@dataclass(frozen=True, slots=True)
class SimModel:
    """The simulator's model, as asked (None / "auto": resolved by `resolve`)."""

    per_transfer_us: float = DEFAULT_PER_TRANSFER_US
    per_hop_us: float = DEFAULT_PER_HOP_US
    resolution_us: float | None = None
    poll_ms: float = 10.0
    forwarding: str = "store-and-forward"
    lockstep: str = "auto"
    all_to_all: str = "auto"
    hierarchical_above_gpus: int = FLAT_RING_MAX
    nvlink_latency_us: float = NCCL_NVLINK_RING_STEP_US  # per in-server (NVLink) transfer (`SimOptions`)

    def options(self, llm: bool) -> Any:
        """The simulator's options of every size (`fabric.flowsim.SimOptions`; lockstep is a size's: `Resolved`)
        for a generated LLM step (`llm`) or a trace."""
        from fabric.flowsim import SimOptions

        resolution = self.resolution_us
        if resolution is None:
            resolution = COARSE_RESOLUTION_US if llm else DEFAULT_RESOLUTION_US
        return SimOptions(per_transfer_s=self.per_transfer_us / 1e6, per_hop_s=self.per_hop_us / 1e6,
                          poll_s=self.poll_ms / 1e3, cut_through=self.forwarding == "cut-through",
                          resolution_s=resolution / 1e6, nvlink_latency_s=self.nvlink_latency_us / 1e6)

    def check(self) -> None:
        if self.per_transfer_us < 0 or self.per_hop_us < 0:
            raise SpecError(f"--per-transfer-us and --per-hop-us must be >= 0, got {self.per_transfer_us:g} and "
                            f"{self.per_hop_us:g}")
        if not 0 <= self.nvlink_latency_us <= 1000:
            raise SpecError(f"--nvlink-latency-us must be in [0, 1000], got {self.nvlink_latency_us:g}")
        if self.resolution_us is not None and not 0 <= self.resolution_us <= 1000:
            raise SpecError(f"--resolution-us must be in [0, 1000], got {self.resolution_us:g}")
        if not self.poll_ms >= 0:
            raise SpecError(f"--poll-ms must be >= 0, got {self.poll_ms:g}")
        if self.forwarding not in FORWARDING_CHOICES:
            raise SpecError(f"forwarding must be one of {', '.join(FORWARDING_CHOICES)}, got {self.forwarding!r}")
        if self.lockstep not in LOCKSTEP_CHOICES:
            raise SpecError(f"lockstep must be auto, on or off, got {self.lockstep!r}")
        from traffic.replay.simulate import A2A_MODELS

        if self.all_to_all not in A2A_MODELS:
            raise SpecError(f"all_to_all must be one of {', '.join(A2A_MODELS)}, got {self.all_to_all!r}")
        if self.lockstep == "on" and self.forwarding == "cut-through":
            raise SpecError("cut-through forwarding and lockstep exclude each other (lockstep waits for whole steps)")
        if self.hierarchical_above_gpus < 1:
            raise SpecError(f"--hierarchical-above must be >= 1 GPU, got {self.hierarchical_above_gpus}")


@dataclass(frozen=True, slots=True)
class RunSpec:
    workload: WorkloadSpec
    options: RunOptions = RunOptions()
    model: SimModel = SimModel()


@dataclass(frozen=True, slots=True)
class Resolved:
    """One run with every choice made: what ran, for the result's meta and the reports."""

    workload: str  # the workload at this size (a generated LLM step with its DP and batch)
    gpus: int
    ranks: int | None  # as the run maps the workload (`ReplayOptions.ranks`; None: the trace's own ranks)
    topology: str
    routing: str
    placement: str
    algorithm: str  # the all-reduce algorithm
    channels: int
    ports: str
    seed: int
    repeat: int
    compute_gap_us: float
    step_ops: int | None
    per_transfer_us: float
    per_hop_us: float
    resolution_us: float
    poll_ms: float
    forwarding: str
    lockstep: bool
    all_to_all: str  # the model asked; "auto" is exact up to `all_to_all_exact_max_ranks` ranks a call
    all_to_all_exact_max_ranks: int
    nvlink_latency_us: float = 0.0  # per in-server transfer (0 in rows resolved before it was modelled)
    # NCCL's mapping: its algorithm (with `algorithm` "nccl": `nccl_algo`, "auto" its tuning model), one ring per NIC
    # where a group has several GPUs in each server, PXN as asked; the exact event-driven model
    nccl_algorithm: str = "as asked"  # "auto", "ring", "tree", "pat" with algorithm "nccl" (`traffic.nccl_choice`)
    channels_per_nic: str = "one ring per NIC where a group has several GPUs a server; --channels flows each"
    pxn: str = "on"
    merge_nics: str = "on"  # NCCL_IB_MERGE_NICS: "on" a channel striped over the NIC's planes, "off" alternating
    sim_model: str = "exact"
    launchless_kernels: str | None = None  # Kineto traces: as asked (None: "leave-out", the reader's default)
    why: tuple[str, ...] = ()  # how each auto choice came out

    def replay_options(self) -> Any:
        """`traffic.replay.ReplayOptions` of this run."""
        nccl_algo = self.nccl_algorithm if self.nccl_algorithm in NCCL_ALGOS else "auto"
        return RunOptions(self.ranks, self.placement, self.algorithm, self.channels, self.ports, self.seed,
                          self.repeat, self.compute_gap_us, self.step_ops,
                          launchless_kernels=self.launchless_kernels,
                          pxn=self.pxn != "off", nccl_algo=nccl_algo,
                          merge_nics=self.merge_nics != "off").replay_options(self.routing)

    def sim_options(self) -> Any:
        """The simulator's options of this run (`fabric.flowsim.SimOptions`)."""
        model = SimModel(self.per_transfer_us, self.per_hop_us, self.resolution_us, self.poll_ms, self.forwarding,
                         nvlink_latency_us=self.nvlink_latency_us)
        return dataclasses.replace(model.options(llm=False), lockstep=self.lockstep)

    def doc(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}


def resolve(spec: RunSpec, gpus: int, topology: str, routing: str, extra: str = "", *,
            own_ranks: bool = False) -> Resolved:
    """`spec` at `gpus` GPUs on `topology` under `routing`, every auto choice made (module docstring);
    `extra`: LLM spec overrides of this run (a series' or the stragglers'); `own_ranks`: the trace keeps its
    own ranks (`fabriclab sim` without `--ranks`), else it is mapped onto `gpus` ranks."""
    from traffic.replay import default_ports
    from traffic.replay.simulate import A2A_EXACT_MAX

    if gpus < 1:
        raise SpecError(f"a run needs at least 1 GPU, got {gpus}")
    m, o = spec.model, spec.options
    m.check()
    why: list[str] = []
    big = gpus > m.hierarchical_above_gpus
    algorithm = o.algorithm
    if algorithm in ("ring", "nccl") and big:
        algorithm = "hierarchical"
        why.append(f"all-reduce hierarchical: {gpus} GPUs > {m.hierarchical_above_gpus}")
    elif algorithm == "nccl":
        why.append(f"NCCL's algorithm: {o.nccl_algo} (NCCL 2.30.7's tuning model for all-reduce, all-gather, "
                   "reduce-scatter: sm90, Intel host, NVLS and CollNet off)" if o.nccl_algo == "auto"
                   else f"NCCL's algorithm: {o.nccl_algo} (as NCCL_ALGO)")
    cut = m.forwarding == "cut-through"
    lockstep = m.lockstep == "on" or (m.lockstep == "auto" and big and not cut)
    if m.lockstep == "auto" and lockstep:
        why.append(f"lockstep: {gpus} GPUs > {m.hierarchical_above_gpus}")
    resolution = m.resolution_us
    if resolution is None:
        resolution = COARSE_RESOLUTION_US if spec.workload.llm else DEFAULT_RESOLUTION_US
        why.append(f"resolution {resolution:g} us: " + ("a generated LLM step (MB-sized transfers)"
                                                        if spec.workload.llm else "a trace (exact)"))
    ports = default_ports(routing, o.ports)
    if o.ports == "auto":
        why.append(f"ports {ports}: {routing} routing")
    return Resolved(workload=spec.workload.at(gpus, extra).text, gpus=gpus,
                    ranks=None if own_ranks else gpus, topology=topology, routing=routing,
                    placement=o.placement, algorithm=algorithm, channels=o.channels, ports=ports, seed=o.seed,
                    repeat=o.repeat, compute_gap_us=o.compute_gap_us, step_ops=o.step_ops,
                    per_transfer_us=m.per_transfer_us, per_hop_us=m.per_hop_us, resolution_us=resolution,
                    poll_ms=m.poll_ms, forwarding=m.forwarding, lockstep=lockstep, all_to_all=m.all_to_all,
                    all_to_all_exact_max_ranks=A2A_EXACT_MAX, nvlink_latency_us=m.nvlink_latency_us,
                    launchless_kernels=o.launchless_kernels,
                    pxn="on" if o.pxn else "off", merge_nics="on" if o.merge_nics else "off",
                    nccl_algorithm=o.nccl_algo if algorithm == "nccl" else "as asked",
                    why=tuple(why))


def job_gpus(workload: Any, hosts: int, ranks: int | None) -> int:
    """The GPUs a run of `workload` takes on a fabric of `hosts` hosts: `ranks` if given; a single-rank
    (data-parallel) trace runs on every host; a multi-rank one keeps its own ranks (`plan_replay`'s rule)."""
    if ranks is not None:
        return ranks
    return hosts if len(workload.ranks) == 1 else int(workload.world_size)


def format_spec(doc: dict[str, Any], title: str = "model") -> str:
    """A resolved run as the reports print it: one line of the choices, then why the auto ones came out so."""
    keys = ("gpus", "algorithm", "channels", "ports", "lockstep", "all_to_all", "resolution_us", "per_transfer_us",
            "per_hop_us", "nvlink_latency_us", "poll_ms", "forwarding", "nccl_algorithm", "channels_per_nic", "pxn", "merge_nics", "sim_model")
    line = ", ".join(f"{k} {doc[k]}" for k in keys if k in doc)
    return f"{title:<12} {line}" + (f"\n  auto       {'; '.join(doc['why'])}" if doc.get("why") else "")


def simulated_runs(spec: RunSpec, workload: Any, fabrics: Sequence[tuple[str, Any, str]], link_down: Sequence[str] = (),
                   link_up: Sequence[str] = ()) -> list[tuple[str, Any, str, Any, Any, dict[str, Any]]]:
    """`fabriclab sim`'s runs: each (topology, fabric, routing) resolved as `compare` resolves a row, at the job's
    size on that fabric (`job_gpus`; the trace's own ranks unless `spec.options.ranks`): (topology, fabric,
    routing, replay options, the simulator backend with the link events, the resolved specification)."""
    from fabriclab.backends import Simulated
    from traffic.replay.simulate import parse_link_event

    ranks = spec.options.ranks
    out = []
    for t, fab, routing in fabrics:
        run = resolve(spec, job_gpus(workload, len(fab.hosts), ranks), t, routing, own_ranks=ranks is None)
        events = [parse_link_event(text, fab, up) for up, texts in ((False, link_down), (True, link_up))
                  for text in texts]
        out.append((t, fab, routing, run.replay_options(), Simulated(run.sim_options(), events, run.all_to_all),
                    run.doc()))
    return out
