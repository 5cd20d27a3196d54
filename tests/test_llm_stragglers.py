"""Stragglers: jittered compute and slow servers, against the expected maximum of N lognormal draws."""
from __future__ import annotations

import math

import numpy as np
import pytest

from traffic.llm import build_workload, model, rules, schedule
from traffic.llm.config import Compute, LLMConfig, Model, Parallel, Stragglers

H100_PEAK = 989e12
H100_HBM = 3.35e12
H, VOCAB, SEQ, LAYERS, M = 1024, 32768, 1024, 2, 2


def dp_job(n: int, steps: int = 1, **stragglers: object) -> LLMConfig:
    """pp 1, tp 1, dp n; no overlap: one gradient bucket, all-reduced after the last backward."""
    return LLMConfig(
        name=f"dp{n}", model=Model(layers=LAYERS, hidden=H, ffn_hidden=4 * H, heads=16, kv_heads=16, vocab=VOCAB,
                                   seq_len=SEQ, gated_ffn=False, tied_embeddings=False),
        parallel=Parallel(dp=n, overlap_grad_reduce=False), micro_batch=1, global_batch=M * n, steps=steps,
        compute=Compute(gpu="h100", kernel_efficiency=0.5, recompute="none"), stragglers=Stragglers(**stragglers))


def parts(cfg: LLMConfig) -> tuple[float, float, float]:
    """(compute of one rank's step before jitter, the all-reduce, the optimizer), by hand."""
    def us(flops: float) -> float:
        return flops / (H100_PEAK * 0.5) * 1e6

    tokens = SEQ
    f = sum(us(model.layer_flops(cfg, i, tokens, "fwd")) for i in range(LAYERS)) + us(2 * tokens * H * VOCAB)
    b = sum(us(model.layer_flops(cfg, i, tokens, "bwd")) for i in range(LAYERS)) + us(4 * tokens * H * VOCAB)
    (bucket,) = rules.dp_buckets(cfg, 0)
    params = model.total_params(cfg)  # pp 1, tp 1: every parameter's fp32 gradient is in the one bucket
    assert bucket.size_bytes == 4 * params and bucket.kind == "all_reduce"
    n = cfg.parallel.dp
    bw_gbps = 3600.0 if n <= 8 else 400.0  # inside one 8-GPU server: NVLink; else the NIC
    allreduce = 4 * params * 2 * (n - 1) / n * 8 / (bw_gbps * 1e9) * 1e6
    optimizer = 30 * params / H100_HBM * 1e6
    return M * (f + b), allreduce, optimizer


def expected_max(n: int, cv: float) -> tuple[float, float]:
    """Mean and standard deviation of the maximum of n lognormal draws of mean 1 and CV cv, by integrating
    E[X] = int_0^inf (1 - F(x)^n) dx and E[X^2] = int_0^inf 2x (1 - F(x)^n) dx (the trapezoid rule, fine grid)."""
    s2 = math.log1p(cv * cv)
    mu, sigma = -s2 / 2, math.sqrt(s2)
    x = np.linspace(1e-9, 6.0, 600_001)
    cdf = 0.5 * (1 + np.vectorize(math.erf)((np.log(x) - mu) / (sigma * math.sqrt(2))))
    tail = 1 - cdf ** n
    mean = float(np.trapezoid(tail, x))
    second = float(np.trapezoid(2 * x * tail, x))
    return mean, math.sqrt(second - mean * mean)


def step_times(cfg: LLMConfig) -> np.ndarray:
    wl = build_workload(cfg)
    return np.array([max(r.steps[k].duration_us for r in wl.ranks) for k in range(cfg.steps)])


@pytest.mark.parametrize("n", [2, 16])
def test_mean_step_is_the_expected_maximum_of_n_jittered_computes(n):
    cv, k = 0.1, 2000
    cfg = dp_job(n, steps=k, jitter_cv=cv, seed=7)
    compute, allreduce, optimizer = parts(cfg)
    mean_max, sd_max = expected_max(n, cv)
    steps = step_times(cfg)
    # every step: the slowest rank's compute, then the all-reduce it gates, then the (unjittered) optimizer
    want = mean_max * compute + allreduce + optimizer
    # the mean of k independent maxima has standard error sd_max x compute / sqrt(k): 4 of them (a false failure
    # below 1e-4; the seed fixes the draw anyway)
    assert abs(steps.mean() - want) < 4 * sd_max * compute / math.sqrt(k)
    assert mean_max > 1.0  # the expected maximum is above the mean of one rank


def test_p99_grows_with_ranks_while_one_ranks_compute_does_not():
    cv, k = 0.1, 400
    p99, rank0 = {}, {}
    for n in (2, 16):
        cfg = dp_job(n, steps=k, jitter_cv=cv, seed=3)
        compute, _, optimizer = parts(cfg)
        wl = build_workload(cfg)
        p99[n] = float(np.percentile(step_times(cfg), 99))
        rank0[n] = np.mean([s.compute_us - optimizer for s in wl.ranks[0].steps])
        # one rank's mean compute stays the nominal one: lognormal mean 1, standard error cv x compute / sqrt(k)
        assert abs(rank0[n] - compute) < 4 * cv * compute / math.sqrt(k)
    assert p99[16] > p99[2]


def test_a_slow_server_sets_the_step_exactly():
    cfg = dp_job(16, slow_servers=[1], slow_factor=1.1)
    compute, allreduce, optimizer = parts(cfg)
    wl = build_workload(cfg)
    want = 1.1 * compute + allreduce + optimizer
    for r in wl.ranks:
        assert r.steps[0].duration_us == pytest.approx(want, rel=1e-12)
        slowed = 1.1 if r.rank >= 8 else 1.0  # server 1 = ranks 8..15
        assert r.steps[0].compute_us == pytest.approx(slowed * compute + optimizer, rel=1e-12)


def test_multipliers_seeded_and_per_microbatch():
    cfg = dp_job(4, steps=3, jitter_cv=0.2, jitter_per="microbatch", seed=11, slow_ranks=[2], slow_factor=1.5)
    a, b = schedule.compute_multipliers(cfg), schedule.compute_multipliers(cfg)
    assert a.shape == (3, 4, M) and np.array_equal(a, b)
    assert not np.allclose(a[:, :, 0], a[:, :, 1])  # a draw per micro-batch
    s2 = math.log1p(0.2 ** 2)
    rng = np.random.default_rng(11)
    draws = rng.lognormal(-s2 / 2, math.sqrt(s2), size=(3, 4, M))
    draws[:, 2, :] *= 1.5
    assert np.allclose(a, draws)
    other = schedule.compute_multipliers(dp_job(4, steps=3, jitter_cv=0.2, jitter_per="step", seed=11))
    assert other.shape == (3, 4, 1)  # one draw per (rank, step)
    assert np.allclose(other[:, :, 0], rng_draws(11, (3, 4, 1), 0.2)[:, :, 0])


def rng_draws(seed, shape, cv):
    s2 = math.log1p(cv ** 2)
    return np.random.default_rng(seed).lognormal(-s2 / 2, math.sqrt(s2), size=shape)
