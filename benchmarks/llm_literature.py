"""Sanity against the literature: the runs Narayanan et al. publish (SC'21, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM": GPT models on DGX A100 servers, sequence 2048, vocabulary 51,200, full
activation recompute) run through the generator and the simulator with Megatron-LM 2021's settings; our step time
next to the one their throughput implies, and the difference split into the step's parts (no root).

    .venv/bin/python benchmarks/llm_literature.py [--rows 76.1B 175B 1T] [--grad-dtypes float16 float32]
        [--layout script|plain] [--no-sim [ROW ...]] [--json FILE] [--markdown FILE]

Rows (`PAPER_ROWS`): Table 1's 39.1B, 76.1B, 145.6B, 310.1B and 1T, and Table 2's 175B (GPT-3's shape, 174.6B
parameters) on 1,536 GPUs: model-parallel size 96 = TP8 PP12, DP16, batch 1536, micro-batch 1, 141 TFLOP/s per
GPU (as two independent transcriptions of Table 2 give it, with Figure 10's PTD-P 175B curve ending near 141; the
paper's own text was not at hand).
Default rows: 76.1B, 175B, 1T.

The paper's step time is its eq. (3), F = 96 B s l h^2 (1 + s / (6h) + V / (16 l h)) FLOPs per iteration (the
layers' four passes with recompute, the logits' three), over GPUs x its achieved TFLOP/s per GPU. Ours is the
generator's nominal timeline (collectives at the NIC or NVLink rate, no contention) and the simulated one (the
flow-level simulator; `--no-sim` skips it for all rows, `--no-sim ROW ...` for those). MFU counts the model's three
passes without recompute (`traffic.llm.model.model_flops_per_step`), the paper's too, at its step time.

Layout (`--layout script`, the default) as the authors' own reproduction script for Table 1 sets it
(Megatron-LM `examples/sc21/run_table_1.sh`, 2021-08): micro-batch 4 for 39.1B, 2 for 76.1B and 145.6B, 1 for the
rest; the interleaved schedule with 5 layers per virtual stage for 76.1B (3 model chunks) and 145.6B (2), 3 for
310.1B (2); plain 1F1B for 39.1B (PP2) and 1T. 175B: Table 2's micro-batch 1, 1F1B (its schedule is not given;
`examples/sc21/run_figure_12.sh` runs this layout interleaved, 2 layers per virtual stage). `--layout plain`:
micro-batch 1 and 1F1B for every row (this benchmark's choice before 2026-12-07).

Megatron-LM 2021's settings on every row (`SETTINGS_2021`; the code of the scripts' date, `de7dc40f88`):
pipeline scatter/gather on (`--scatter-gather-tensors-in-pipeline`, its default); gradients all-reduced by
`--DDP-impl local` after the pipeline flush, one all-reduce per model chunk, nothing under backward
(`parallel.overlap_grad_reduce=false`); tensor-parallel all-reduces blocking (`parallel.tp_comm_overlap_bwd=false`:
the asynchronous input-grad all-reduce came in 2022); fp16. The gradient reduction's precision is run both ways
(`--grad-dtypes`): the scripts pass `--fp16` without `--accumulate-allreduce-grads-in-fp32`, so fp16; the paper
does not say.

The fabric is Selene's as published: 8 A100s per server on NVLink 3 (300 GB/s each way), 8 x 200 Gbit/s HDR
InfiniBand per server, one non-blocking rail-optimised fat tree (here `fabric.builders.leaf_spine`, rail wiring,
32 GPUs per leaf, as many spines as leaves), ECMP with hashed source ports. The kernel efficiency is the generator's
default (0.5, docs/workloads.md).

The parts of a step (`Breakdown`), the job's: its slowest rank's step time; compute (GEMMs at the kernel
efficiency, and the optimizer's memory-bound time), exposed communication per stream and idle time are the ranks'
means (`traffic.replay.result.job_step`), so they add up to the step. The gap to the paper, in % of its step, is
the sum of those parts, with the GEMMs counted against the paper's whole step (`gap_parts`), and idle split in two:
the bubble, (pp - 1) / (m v) of the GEMMs (m micro-batches, v model chunks), and the idle beyond it (the last
stage's logits make it the slowest, the others wait; waits on other ranks' communication). `closing_efficiency` is
the kernel efficiency at which our step would equal the paper's if the GEMMs and idle time (made of compute) scaled
with it and the exposed communication and optimizer did not.

Wall time and memory on a busy 2-core machine (2026-12-07): 76.1B and 175B 1.5-4 min a run; 1T 1-2 min generated,
24 min and 8.7 GB simulated (a 10-minute replay plan of 4.3 million calls, a 10-minute simulation), hence
`--no-sim 1T` in the command of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

A100_NVLINK_GBPS = 2400.0  # NVLink 3: 300 GB/s per GPU each way
HDR_GBPS = 200.0
SEQ_LEN = 2048
VOCAB = 51200
DEFAULT_ROWS = ("76.1B", "175B", "1T")
GRAD_DTYPES = ("float16", "float32")

#: Megatron-LM 2021's settings (see the module docstring), on every row
SETTINGS_2021: dict[str, Any] = {"parallel.pipeline_scatter_gather": True, "parallel.overlap_grad_reduce": False,
                                 "parallel.tp_comm_overlap_bwd": False, "dtype": "float16"}
#: a stream's exposed time goes to this part of the gap (anything else: "other")
STREAM_PARTS = {"tp": "exposed TP", "pp": "exposed PP", "dp": "exposed DP", "emb": "exposed DP"}
PARTS = ("GEMMs vs the paper's step", "optimizer", "exposed TP", "exposed PP", "exposed DP", "exposed other",
         "bubble", "idle beyond the bubble")


@dataclass(frozen=True, slots=True)
class PaperRow:
    """One published run: shape, layout, batch and achieved throughput (TFLOP/s per GPU, recompute counted)."""

    name: str
    source: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    micro_batch: int  # Table 1: examples/sc21/run_table_1.sh; Table 2: its column
    layers_per_virtual_stage: int | None  # --num-layers-per-virtual-pipeline-stage; None: 1F1B
    tflops_per_gpu: float

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def virtual_stages(self) -> int:
        lpv = self.layers_per_virtual_stage
        return 1 if lpv is None else self.layers // self.pp // lpv


PAPER_ROWS: dict[str, PaperRow] = {r.name: r for r in (
    PaperRow("39.1B", "Table 1", 64, 8192, 48, 8, 2, 512, 1536, 4, None, 138),
    PaperRow("76.1B", "Table 1", 80, 10240, 60, 8, 4, 1024, 1792, 2, 5, 140),
    PaperRow("145.6B", "Table 1", 96, 12288, 80, 8, 8, 1536, 2304, 2, 5, 148),
    PaperRow("310.1B", "Table 1", 128, 16384, 96, 8, 16, 1920, 2160, 1, 3, 155),
    PaperRow("175B", "Table 2", 96, 12288, 96, 8, 12, 1536, 1536, 1, None, 141),
    PaperRow("1T", "Table 1", 160, 25600, 128, 8, 64, 3072, 3072, 1, None, 163),
)}


def eq3_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al.'s eq. (3): FLOPs per iteration with full activation recompute."""
    h = hidden
    return 96 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))


def paper_step_s(row: PaperRow) -> float:
    """The step time the paper's achieved throughput implies: eq. (3) / (GPUs x TFLOP/s per GPU)."""
    return eq3_flops(row.global_batch, SEQ_LEN, row.layers, row.hidden, VOCAB) / (row.gpus * row.tflops_per_gpu * 1e12)


def spec_of(row: PaperRow, grad_dtype: str, layout: str) -> str:
    """The generator's spec (`fabriclab workload llm SPEC` takes it too) of `row` with Megatron-LM 2021's settings."""
    plain = layout == "plain"
    keys: dict[str, Any] = {
        "name": f"narayanan-{row.name}", "model.heads": row.heads, "model.kv_heads": row.heads,
        "model.hidden": row.hidden, "model.ffn_hidden": 4 * row.hidden, "model.layers": row.layers,
        "model.vocab": VOCAB, "model.seq_len": SEQ_LEN, "parallel.tp": row.tp, "parallel.pp": row.pp,
        "parallel.dp": row.dp, "parallel.virtual_stages": 1 if plain else row.virtual_stages,
        "micro_batch": 1 if plain else row.micro_batch, "global_batch": row.global_batch, "compute.gpu": "a100",
        "compute.recompute": "full", "nvlink_gbps": A100_NVLINK_GBPS, "nic_gbps": HDR_GBPS,
        **SETTINGS_2021, "parallel.grad_reduce_dtype": grad_dtype}
    return "gpt3-175b," + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items())


def selene(gpus: int) -> Any:
    """Selene-like: rail-wired leaves of 32 servers' same-rail GPUs (the largest divisor of the servers up to 32,
    for jobs not in whole groups of 32 servers), as many spines as leaves."""
    from fabric.builders import leaf_spine

    servers = gpus // 8
    per_leaf = max(d for d in range(1, 33) if servers % d == 0)
    leaves = gpus // per_leaf
    return leaf_spine(hosts=gpus, hosts_per_leaf=per_leaf, spines=leaves, nic_rate_gbps=HDR_GBPS, gpus_per_server=8,
                      nvlink_gbps=A100_NVLINK_GBPS, wiring="rail", name=f"selene-like-{gpus}")


@dataclass(frozen=True, slots=True)
class Breakdown:
    """A step's parts, the job's (module docstring), in microseconds: they add up to `step_us`."""

    step_us: float
    gemm_us: float
    optimizer_us: float
    exposed_us: dict[str, float]  # per stream
    idle_us: float


def breakdown(step_us: float, compute_us: float, optimizer_us: float, exposed_by_stream_us: dict[str, float],
              idle_us: float) -> Breakdown:
    return Breakdown(step_us, compute_us - optimizer_us, optimizer_us, dict(sorted(exposed_by_stream_us.items())),
                     idle_us)


def bubble_share(cfg: Any) -> float:
    """The pipeline bubble as a share of the GEMMs: (pp - 1) / (m v) (Narayanan et al., section 2.2)."""
    p = cfg.parallel
    return float((p.pp - 1) / (cfg.micro_batches * p.virtual_stages))


def gap_parts(b: Breakdown, paper_us: float, bubble: float) -> dict[str, float]:
    """Our step minus the paper's, in shares of the paper's step, by part (`PARTS`); they sum to the gap. `bubble`:
    the bubble's share of the GEMMs (`bubble_share`); the idle time up to that is the bubble, the rest beyond it."""
    out = dict.fromkeys(PARTS, 0.0)
    out[PARTS[0]] = (b.gemm_us - paper_us) / paper_us
    out["optimizer"] = b.optimizer_us / paper_us
    for stream, us in b.exposed_us.items():
        out[STREAM_PARTS.get(stream, "exposed other")] += us / paper_us
    out["bubble"] = min(b.idle_us, bubble * b.gemm_us) / paper_us
    out[PARTS[-1]] = b.idle_us / paper_us - out["bubble"]
    return out


def closing_efficiency(b: Breakdown, paper_us: float, efficiency: float) -> float | None:
    """The kernel efficiency at which `b`'s step equals `paper_us`, GEMMs and idle scaling as 1 / efficiency,
    exposed communication and the optimizer fixed; None if those alone exceed the paper's step."""
    fixed = b.optimizer_us + sum(b.exposed_us.values())
    if fixed >= paper_us:
        return None
    return efficiency * (b.gemm_us + b.idle_us) / (paper_us - fixed)


def nominal_breakdown(cfg: Any, workload: Any) -> Breakdown:
    """The generator's own timeline, the job's parts. Without contention every rank of a pipeline stage runs the
    same timeline, so one rank per stage stands for its stage (all stages have as many ranks)."""
    from traffic import metrics
    from traffic.replay.result import job_step
    from traffic.results import StepResult

    grid = cfg.grid
    rows = []
    for stage in range(cfg.parallel.pp):
        rank = next(r for r in range(cfg.world_size) if grid.coords(r)["pp"] == stage)
        step = workload.ranks[rank].steps[0]
        timeline = metrics.compose_step(step)
        t = metrics.step_times(timeline)
        rows.append(StepResult(step.number, 0, rank, t.step_us, t.compute_us, t.exposed_comm_us, t.idle_us,
                               step.duration_us, metrics.exposed_by_stream(timeline, [c.stream for c in step.collectives])))
    job = job_step(rows)
    return breakdown(job.step_us, job.compute_us, mean_optimizer_us(cfg), job.exposed_by_stream_us, job.idle_us)


def mean_optimizer_us(cfg: Any) -> float:
    """The optimizer step's time, the mean over the pipeline stages (each stage steps its own parameters)."""
    from traffic.llm.program import optimizer_us

    return sum(optimizer_us(cfg, s) for s in range(cfg.parallel.pp)) / cfg.parallel.pp


def simulated_breakdown(cfg: Any, result: Any) -> Breakdown:
    """The simulated run's job step (rank -1) in parts."""
    job = next(s for s in result.steps if s.rank == -1)
    return breakdown(job.step_us, job.compute_us, mean_optimizer_us(cfg), job.exposed_by_stream_us, job.idle_us)


@dataclass(slots=True)
class RowRun:
    """One row at one gradient precision: the paper's figures, ours, and what it took."""

    row: str
    source: str
    layout: str
    grad_dtype: str
    spec: str
    gpus: int
    parallel: str  # "TP x PP x DP, micro-batch b, schedule"
    paper_tflops_per_gpu: float
    paper_step_s: float
    paper_mfu: float
    efficiency: float
    nominal: Breakdown
    nominal_mfu: float
    build_s: float
    simulated: Breakdown | None = None
    simulated_mfu: float | None = None
    sim_s: float | None = None
    gaps: dict[str, dict[str, float]] = field(default_factory=dict)  # "nominal"/"simulated" -> gap_parts
    closing: dict[str, float | None] = field(default_factory=dict)  # "nominal"/"simulated" -> closing_efficiency


def run_row(row: PaperRow, grad_dtype: str, layout: str, sim: bool, tell: Any = None) -> RowRun:
    """`row` at `grad_dtype` through the generator, and with `sim` the simulator; `tell(text)` reports the stage."""
    from traffic.llm import build_workload, load_config
    from traffic.replay import ReplayOptions
    from traffic.replay.result import build_result
    from traffic.replay.simulate import plan_for_simulation, simulate_plan

    say = tell or (lambda text: None)
    spec = spec_of(row, grad_dtype, layout)
    cfg = load_config(spec)
    say("generating")
    t0 = time.monotonic()
    workload = build_workload(cfg)
    info = workload.training
    assert info is not None
    nominal = nominal_breakdown(cfg, workload)
    paper_us = paper_step_s(row) * 1e6
    schedule = (f"interleaved, {cfg.parallel.virtual_stages} chunks" if cfg.parallel.virtual_stages > 1 else "1F1B")
    out = RowRun(row.name, row.source, layout, grad_dtype, spec, cfg.world_size,
                 f"{row.tp} x {row.pp} x {row.dp}, mb {cfg.micro_batch}, {schedule}", row.tflops_per_gpu,
                 paper_us / 1e6, info.mfu(paper_us), info.kernel_efficiency, nominal, info.mfu(nominal.step_us),
                 time.monotonic() - t0)
    out.gaps["nominal"] = gap_parts(nominal, paper_us, bubble_share(cfg))
    out.closing["nominal"] = closing_efficiency(nominal, paper_us, info.kernel_efficiency)
    if sim:
        t1 = time.monotonic()
        say("planning the replay")
        plan = plan_for_simulation(workload, selene(cfg.world_size), ReplayOptions(ports="hashed"))

        def shown(p: Any) -> None:
            say(f"{p.stage}: {p.calls_done:,}/{p.calls:,} calls, {p.sim_s:,.1f} s simulated")

        result = build_result(plan, simulate_plan(plan, "ecmp", progress=shown), trace=f"llm:{cfg.name}",
                              routing="ecmp")
        out.simulated = simulated_breakdown(cfg, result)
        out.simulated_mfu = info.mfu(out.simulated.step_us)
        out.sim_s = time.monotonic() - t1
        out.gaps["simulated"] = gap_parts(out.simulated, paper_us, bubble_share(cfg))
        out.closing["simulated"] = closing_efficiency(out.simulated, paper_us, info.kernel_efficiency)
    return out


# ---- output ---------------------------------------------------------------------------------------------------

def _pct(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else f"{x:+.1%}" if signed else f"{x:.1%}"


def _timeline(r: RowRun) -> str:
    """The timeline the gap is read on: the simulated one where the row was simulated."""
    return "nominal" if r.simulated is None else "simulated"


def main_table(runs: list[RowRun]) -> list[list[str]]:
    """Header and rows: the paper's step and MFU beside ours, nominal and simulated, per gradient precision."""
    out = [["row", "GPUs (TP x PP x DP), layout", "grad all-reduce", "paper: TFLOP/s per GPU", "paper: step (eq. 3)",
            "paper: MFU", "ours: nominal step (MFU)", "ours: simulated step (MFU)", "gap (simulated)"]]
    for r in runs:
        sim = "-" if r.simulated is None else f"{r.simulated.step_us / 1e6:.2f} s ({_pct(r.simulated_mfu)})"
        gap = "-" if r.simulated is None else _pct(r.simulated.step_us / 1e6 / r.paper_step_s - 1, signed=True)
        if r.simulated is None:
            gap = f"{_pct(r.nominal.step_us / 1e6 / r.paper_step_s - 1, signed=True)} (nominal)"
        out.append([r.row, f"{r.gpus:,} ({r.parallel})", r.grad_dtype.replace("float", "fp"), f"{r.paper_tflops_per_gpu:g}",
                    f"{r.paper_step_s:.2f} s", _pct(r.paper_mfu), f"{r.nominal.step_us / 1e6:.2f} s ({_pct(r.nominal_mfu)})",
                    sim, gap])
    return out


def parts_table(runs: list[RowRun]) -> list[list[str]]:
    """Header and rows: the gap split into parts (shares of the paper's step), of the simulated step where there
    is one, and the kernel efficiency that would close it."""
    used = [p for p in PARTS if any(abs(r.gaps[_timeline(r)][p]) > 0 for r in runs)]
    out = [["row", "grad all-reduce", "timeline", *(f"{i}. {p}" for i, p in enumerate(used, 1)), "gap",
            "kernel efficiency to close"]]
    for r in runs:
        which = _timeline(r)
        g = r.gaps[which]
        eff = r.closing[which]
        out.append([r.row, r.grad_dtype.replace("float", "fp"), which, *(_pct(g[p], signed=True) for p in used),
                    _pct(sum(g.values()), signed=True), "-" if eff is None else f"{eff:.3f}"])
    return out


def markdown(table: list[list[str]]) -> str:
    head, *rows = table
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), choices=list(PAPER_ROWS))
    ap.add_argument("--grad-dtypes", nargs="+", default=list(GRAD_DTYPES), choices=["float16", "float32", "bfloat16"],
                    help="the gradient all-reduce's precision, one run each (default: both of the 2021 code's)")
    ap.add_argument("--layout", choices=["script", "plain"], default="script",
                    help="script: micro-batch and schedule as examples/sc21/run_table_1.sh; plain: mb 1, 1F1B")
    ap.add_argument("--no-sim", nargs="*", default=None, metavar="ROW",
                    help="the nominal timeline only: for every row (no ROW given) or for the rows named")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="write the two tables as markdown")
    args = ap.parse_args()
    nominal_only = set(PAPER_ROWS) if args.no_sim == [] else set(args.no_sim or ())
    unknown = nominal_only - set(PAPER_ROWS)
    if unknown:
        ap.error(f"--no-sim: unknown row(s) {', '.join(sorted(unknown))} (rows: {', '.join(PAPER_ROWS)})")
    console = Console(stderr=True)
    runs: list[RowRun] = []
    t_start = time.monotonic()
    jobs = [(name, dtype) for name in args.rows for dtype in args.grad_dtypes]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("Narayanan et al.", total=len(jobs))
        for name, dtype in jobs:
            def tell(text: str, what: str = f"{name} ({dtype} grads)") -> None:
                bar.update(task, description=f"{what}: {text}")

            runs.append(run_row(PAPER_ROWS[name], dtype, args.layout, name not in nominal_only, tell))
            bar.advance(task)
            r = runs[-1]
            console.print(f"{name} ({dtype} grads): generated in {r.build_s:.0f} s"
                          + (f", simulated in {r.sim_s:.0f} s" if r.sim_s is not None else ", not simulated"))
            if args.json:
                args.json.write_text(json.dumps({"wall_s": time.monotonic() - t_start, "layout": args.layout,
                                                 "runs": [asdict(x) for x in runs]}, indent=1))
    out = Console(width=220)
    for title, rows in (("Narayanan et al. (SC'21) on fabriclab: step time and MFU (model FLOPs, no recompute)",
                         main_table(runs)),
                        ("The gap in parts, shares of the paper's step", parts_table(runs))):
        table = Table(title=title)
        for col in rows[0]:
            table.add_column(col)
        for cells in rows[1:]:
            table.add_row(*cells)
        out.print(table)
    if args.markdown:
        args.markdown.write_text(markdown(main_table(runs)) + "\n\n" + markdown(parts_table(runs)) + "\n")
    console.print(f"wall time {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
