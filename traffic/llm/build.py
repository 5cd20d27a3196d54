"""An LLM config -> its generated `Workload` (`build_workload`) and the summary the CLI prints (`describe`)."""
from __future__ import annotations

from traffic.llm import model, program, rules, schedule
from traffic.llm.config import LLMConfig
from traffic.llm.schema import Stragglers
from traffic.workload import TraceError, TrainingInfo, Workload

_CACHE: dict[str, Workload] = {}  # the last config's workload: `workload llm` describes and shows the same build


def training_info(cfg: LLMConfig) -> TrainingInfo:
    c = cfg.compute
    return TrainingInfo(
        model=cfg.name, gpu=c.gpu, peak_flops_per_gpu=model.GPU_PEAK_FLOPS[c.gpu], kernel_efficiency=c.kernel_efficiency,
        world_size=cfg.world_size, model_flops_per_step=model.model_flops_per_step(cfg),
        tokens_per_step=cfg.global_batch * cfg.model.seq_len,
        compute_model=(f"compute = layer FLOPs / (tp x cp) / ({c.gpu} peak x {c.kernel_efficiency:g}), recompute "
                       f"{c.recompute}; optimizer memory-bound ({program.ADAM_BYTES_PER_PARAM} bytes/param at HBM "
                       "bandwidth); collectives nominal size x busbw factor / link rate, no latency"))


def measured_efficiency(cfg: LLMConfig, recorded: Workload) -> tuple[float, str]:
    """The kernel efficiency at which the generated step's compute on `compute.profile_rank` equals the
    compute its profile `recorded` (the file `compute.profile` names, read by `traffic.traces.load`)
    measured: the median over the profile's steps of that rank's compute time. Returns it and a note
    saying so. Stragglers are left out of the comparison (they scale compute on purpose)."""
    c = cfg.compute
    assert c.profile is not None
    if c.profile_rank >= cfg.world_size:
        raise TraceError(f"compute.profile_rank {c.profile_rank}: the job has {cfg.world_size} ranks")
    trace = next((r for r in recorded.ranks if r.rank == c.profile_rank), recorded.ranks[0] if len(recorded.ranks) == 1
                 else None)
    if trace is None or not trace.steps:
        raise TraceError(f"compute.profile {c.profile}: no steps of rank {c.profile_rank} in it")
    measured = sorted(s.compute_us for s in trace.steps)[len(trace.steps) // 2]
    if not measured > 0:
        raise TraceError(f"compute.profile {c.profile}: rank {c.profile_rank}'s steps record no compute")
    plain = cfg.model_copy(update={"compute": c.model_copy(update={"profile": None}), "stragglers": Stragglers(),
                                   "steps": 1})
    ranks, _ = schedule.rank_traces(plain)
    modelled = next(r for r in ranks if r.rank == c.profile_rank).steps[0].compute_us
    optimizer = program.optimizer_us(plain, plain.grid.coords(c.profile_rank)["pp"])
    kernels_at_peak = (modelled - optimizer) * c.kernel_efficiency  # what the kernels take at 100% of peak
    eff = kernels_at_peak / max(measured - optimizer, 1e-9)
    if not 0 < eff <= 1:
        raise TraceError(f"compute.profile {c.profile}: rank {c.profile_rank} computes {measured / 1e3:.3g} ms per step, "
                         f"faster than this job's FLOPs allow at the {c.gpu}'s peak ({kernels_at_peak / 1e3:.3g} ms): "
                         "not a profile of this job (model, parallelism, micro-batches) on this GPU")
    return eff, (f"compute: kernel efficiency {eff:.3g} measured from {c.profile} (rank {c.profile_rank}: "
                 f"{measured / 1e3:.4g} ms of compute per step, median of {len(trace.steps)} step(s)), in place of "
                 f"the stated {c.kernel_efficiency:g}")


def build_workload(cfg: LLMConfig, profile: Workload | None = None) -> Workload:
    """The job's `cfg.steps` training steps on all `world_size` ranks, timed by the nominal schedule
    (`traffic.llm.schedule`), format "llm", with `training` for MFU. With `compute.profile`, the kernel
    efficiency is measured first (`measured_efficiency`) from `profile`, that file as read by
    `traffic.traces.load` (which reads it: `traffic.traces.llm_workload`, `load("llm:...")`)."""
    if cfg.compute.profile is not None and profile is None:
        raise TraceError(f"compute.profile {cfg.compute.profile}: build_workload needs the profile read "
                         "(traffic.traces.llm_workload reads it)")
    key = cfg.model_dump_json()
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    measured_note: tuple[str, ...] = ()
    if cfg.compute.profile is not None:
        assert profile is not None
        eff, note = measured_efficiency(cfg, profile)
        cfg = cfg.model_copy(update={"compute": cfg.compute.model_copy(update={"kernel_efficiency": eff})})
        measured_note = (note,)
    ranks, step_us = schedule.rank_traces(cfg)
    par = cfg.parallel
    kind = f"interleaved 1F1B ({par.virtual_stages} chunks per stage)" if par.virtual_stages > 1 else "1F1B"
    notes = (f"generated: Megatron {kind}, tp {par.tp} cp {par.cp} pp {par.pp} dp {par.dp} ep {par.ep}, "
             f"{cfg.micro_batches} micro-batches of {cfg.micro_batch}",
             "timings: the generator's nominal schedule (collectives at size x busbw factor / "
             f"{cfg.nic_gbps:g} Gbit/s NIC or {cfg.nvlink_gbps:g} Gbit/s NVLink, no latency): "
             f"step {max(step_us) / 1e3:.2f} ms (the slowest rank{', slowest step' if len(step_us) > 1 else ''})",
             *measured_note)
    wl = Workload(name=cfg.name, source=f"llm:{cfg.name}", format="llm", world_size=cfg.world_size, ranks=ranks,
                  timed=True, notes=notes, training=training_info(cfg))
    _CACHE.clear()
    _CACHE[key] = wl
    return wl


def bytes_per_axis(wl: Workload, rank: int = 0) -> dict[str, int]:
    """`rank`'s collective bytes in the first step per stream (process-group axis): nccl-tests size x count."""
    out: dict[str, int] = {}
    for c in wl.ranks[rank].steps[0].collectives:
        out[c.stream] = out.get(c.stream, 0) + c.total_bytes
    return out


def _groups_line(cfg: LLMConfig) -> str:
    """Per parallel axis of size > 1: groups x ranks, and whether they sit inside one server (NVLink)."""
    grid, g = cfg.grid, cfg.gpus_per_server
    sizes = {"tp": grid.tp, "cp": grid.cp, "dp": grid.dp, "pp": grid.pp, "ep": grid.ep, "edp": grid.edp}
    if cfg.model.moe is None:
        del sizes["ep"], sizes["edp"]
    parts = []
    for axis, n in sizes.items():
        if n == 1:
            continue
        groups = grid.groups(axis)
        inside = sum(grp[0] // g == grp[-1] // g for grp in groups)
        where = "NVLink" if inside == len(groups) else "network" if inside == 0 else f"{inside} inside a server"
        parts.append(f"{axis} {len(groups)} x {n} ({where})")
    return ", ".join(parts) or "one rank"


def describe(cfg: LLMConfig, wl: Workload | None = None) -> str:
    """Multi-line "key   value" summary: model, parallelism, micro-batches, compute, bubble, bytes, step time, MFU,
    of `wl`, the config's built workload (built here when not given)."""
    par, mdl = cfg.parallel, cfg.model
    wl = wl if wl is not None else build_workload(cfg)
    info = wl.training
    assert info is not None
    step_us = max(s.duration_us or 0.0 for r in wl.ranks for s in r.steps[:1])
    timed = cfg.model_copy(update={"compute": cfg.compute.model_copy(update={"kernel_efficiency": info.kernel_efficiency})})
    prog = [program.stage_program(timed, s) for s in range(par.pp)]  # at the efficiency the build used (measured?)
    m = cfg.micro_batches
    moe = "" if mdl.moe is None else f", MoE {mdl.moe.experts} experts top-{mdl.moe.top_k}"
    lines = [
        ("model", f"{cfg.name}: {model.total_params(cfg) / 1e9:.1f}B parameters, {mdl.layers} layers, hidden "
                  f"{mdl.hidden}, {mdl.heads} heads ({mdl.kv_heads} kv), seq {mdl.seq_len}{moe}"),
        ("world", f"{cfg.world_size} GPUs ({-(-cfg.world_size // cfg.gpus_per_server)} servers of "
                  f"{cfg.gpus_per_server}): tp {par.tp} cp {par.cp} pp {par.pp} dp {par.dp} ep {par.ep}"
                  + (f" etp {par.etp}" if par.etp is not None else "") + f", zero {par.zero}"),
        ("groups", _groups_line(cfg)),
        ("batch", f"global {cfg.global_batch} = {m} micro-batches of {cfg.micro_batch} x dp {par.dp}; "
                  f"{info.tokens_per_step} tokens per step"),
        ("compute", f"per micro-batch on one GPU: forward {prog[0].forward_us:.0f} us, backward "
                    f"{prog[0].backward_us:.0f} us (stage 0); last stage {prog[-1].forward_us:.0f} + "
                    f"{prog[-1].backward_us:.0f} us"),
        ("bubble", f"(pp - 1) / m = {(par.pp - 1) / m:.3f}" if par.virtual_stages == 1 else
                   f"(pp - 1) / (m x virtual_stages) = {(par.pp - 1) / (m * par.virtual_stages):.3f}"),
        ("p2p", f"{rules.pp_p2p_bytes(cfg)} bytes per activation per TP rank"),
    ]
    for axis, b in sorted(bytes_per_axis(wl).items()):
        lines.append((f"bytes {axis}", f"{b / 1e9:.3f} GB per step on rank 0 (nccl-tests sizes x count)"))
    lines += [
        ("step", f"{step_us / 1e3:.2f} ms nominal (slowest rank), MFU {info.mfu(step_us):.3f}"),
        ("compute model", info.compute_model),
    ]
    width = max(len(k) for k, _ in lines) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in lines)
