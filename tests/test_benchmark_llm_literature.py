"""`benchmarks/llm_literature.py`: the paper's step time from its eq. (3), the rows' layouts and Megatron-LM 2021's
settings, the gap split into parts, and a small job through the generator and the simulator whose parts add up to
its step (the published rows themselves are in benchmarks/RESULTS.md, from the same script)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from traffic.llm import load_config

ROOT = Path(__file__).resolve().parents[1]


def bench():
    spec = importlib.util.spec_from_file_location("llm_literature_bench", ROOT / "benchmarks" / "llm_literature.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_1t_step_from_eq_3_is_102_6_s():
    b = bench()
    # 96 B s l h^2 (1 + s / 6h + V / 16lh) with B 3072, s 2048, l 128, h 25600, V 51200:
    # 96 x 3072 x 2048 x 128 x 25600^2 = 5.0666e19; x (1 + 0.013333 + 0.000977) = 5.1391e19 FLOPs,
    # over 3072 GPUs x 163 TFLOP/s = 5.0074e17 FLOP/s: 102.6 s
    assert b.paper_step_s(b.PAPER_ROWS["1T"]) == pytest.approx(102.6, rel=1e-3)
    # 76.1B: 96 x 1792 x 2048 x 60 x 10240^2 = 2.2166e18; x (1 + 0.033333 + 0.005208) = 2.3020e18 FLOPs, over
    # 1024 GPUs x 140 TFLOP/s = 1.4336e17 FLOP/s: 16.06 s
    assert b.eq3_flops(1792, 2048, 60, 10240, 51200) == pytest.approx(2.3020e18, rel=1e-4)
    assert b.paper_step_s(b.PAPER_ROWS["76.1B"]) == pytest.approx(16.06, rel=1e-3)


def test_rows_run_as_the_authors_script_lays_them_out_with_the_2021_settings():
    b = bench()
    cfg = load_config(b.spec_of(b.PAPER_ROWS["76.1B"], "float16", "script"))
    p = cfg.parallel
    # TP8 PP4 on 1024 GPUs: DP 32; micro-batch 2 -> 1792 / 32 / 2 = 28 micro-batches; 60 layers / 4 stages / 5
    # layers a virtual stage = 3 model chunks
    assert (p.tp, p.pp, p.dp, cfg.micro_batch, cfg.micro_batches, p.virtual_stages) == (8, 4, 32, 2, 28, 3)
    assert (p.pipeline_scatter_gather, p.overlap_grad_reduce, p.tp_comm_overlap_bwd, p.grad_reduce_dtype) == \
        (True, False, False, "float16")
    assert (cfg.compute.gpu, cfg.compute.recompute, cfg.nic_gbps, cfg.dtype) == ("a100", "full", 200.0, "float16")
    plain = load_config(b.spec_of(b.PAPER_ROWS["76.1B"], "float32", "plain"))
    assert (plain.micro_batch, plain.micro_batches, plain.parallel.virtual_stages) == (1, 56, 1)
    assert plain.parallel.grad_reduce_dtype == "float32"
    # Table 2's 175B: model-parallel size 96 = TP8 x PP12, DP16 on 1536 GPUs, 1536 micro-batches of 1 / 16
    t2 = load_config(b.spec_of(b.PAPER_ROWS["175B"], "float16", "script"))
    assert (t2.parallel.tp, t2.parallel.pp, t2.parallel.dp, t2.world_size, t2.micro_batches) == (8, 12, 16, 1536, 96)
    one_t = load_config(b.spec_of(b.PAPER_ROWS["1T"], "float16", "script"))
    assert (one_t.parallel.dp, one_t.micro_batches, one_t.parallel.virtual_stages) == (6, 512, 1)


def test_the_gap_parts_add_up_and_the_closing_efficiency_closes_it():
    b = bench()
    # our step 120 against the paper's 100: GEMMs 80, optimizer 2, TP 10, PP 3, DP 4 + embedding 1, idle 20
    step = b.Breakdown(120.0, 80.0, 2.0, {"tp": 10.0, "pp": 3.0, "dp": 4.0, "emb": 1.0}, 20.0)
    # a bubble of 3 / 20 = 0.15 of the GEMMs: 12 of the idle 20; 8 beyond it
    parts = b.gap_parts(step, 100.0, 3 / 20)
    assert parts == pytest.approx({"GEMMs vs the paper's step": -0.20, "optimizer": 0.02, "exposed TP": 0.10,
                                   "exposed PP": 0.03, "exposed DP": 0.05, "exposed other": 0.0, "bubble": 0.12,
                                   "idle beyond the bubble": 0.08})
    assert sum(parts.values()) == pytest.approx(0.20)
    assert b.gap_parts(step, 100.0, 0.5)["bubble"] == pytest.approx(0.20)  # never more than the idle time
    # GEMMs and idle (100 at 0.5) must shrink to 100 - 20 fixed = 80: 0.5 x 100 / 80 = 0.625
    assert b.closing_efficiency(step, 100.0, 0.5) == pytest.approx(0.625)
    assert b.closing_efficiency(step, 19.0, 0.5) is None  # the fixed parts alone are longer


def test_a_small_job_generated_and_simulated_breaks_down_into_its_step():
    b = bench()
    # 16 GPUs (2 servers): TP2 PP2 DP4, 8 layers in 2 chunks of 2 per stage, 16 sequences: 4 micro-batches a replica
    row = b.PaperRow("toy", "none", 4, 256, 8, 2, 2, 16, 16, 1, 2, 100.0)
    run = b.run_row(row, "float16", "script", sim=True)
    assert run.parallel == "2 x 2 x 4, mb 1, interleaved, 2 chunks"
    assert b.bubble_share(load_config(run.spec)) == pytest.approx(1 / 8)  # (pp - 1) / (m v) = 1 / (4 x 2)
    for which, part in (("nominal", run.nominal), ("simulated", run.simulated)):
        assert part.gemm_us + part.optimizer_us + sum(part.exposed_us.values()) + part.idle_us == \
            pytest.approx(part.step_us, rel=1e-9), which
        assert sum(run.gaps[which].values()) == pytest.approx(part.step_us / (run.paper_step_s * 1e6) - 1), which
    assert {"tp", "pp", "dp"} <= set(run.nominal.exposed_us)
    from traffic.llm import build_workload
    wl = build_workload(load_config(run.spec))
    assert run.nominal.step_us == pytest.approx(max(r.steps[0].duration_us for r in wl.ranks), rel=1e-9)
