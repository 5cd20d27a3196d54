"""Stragglers (docs/workloads.md#stragglers): the compute multipliers of a generated job's ranks (pure).

`lognormal_multipliers` is the one straggler draw, a lognormal of mean 1 and coefficient of variation cv,
used by `compute_multipliers` here and by `fabriclab.sensitivity` (the variation a vendor's p99 needs).
"""
from __future__ import annotations

import math

import numpy as np

from traffic.llm.config import LLMConfig
from traffic.workload import TraceError


def lognormal_multipliers(rng: np.random.Generator, cv: float, size: int | tuple[int, ...]) -> np.ndarray:
    """`size` multipliers drawn from `rng` (one `rng.lognormal` call, so a seed gives the same stream
    wherever it is drawn): lognormal of mean 1 and CV `cv`, sigma^2 = ln(1 + cv^2) and mu = -sigma^2 / 2."""
    sigma2 = math.log1p(cv * cv)
    return rng.lognormal(-sigma2 / 2, math.sqrt(sigma2), size=size)


def compute_multipliers(cfg: LLMConfig) -> np.ndarray:
    """Compute multipliers, shape (steps, ranks, micro-batches) with `jitter_per: microbatch`, else (steps, ranks,
    1): lognormal jitter of mean 1 and CV `jitter_cv` (`lognormal_multipliers`) drawn from numpy's
    Generator(seed), times `slow_factor` on `slow_ranks` and the ranks of `slow_servers`."""
    st, world, m = cfg.stragglers, cfg.world_size, cfg.micro_batches
    base = np.ones(world)
    for r in st.slow_ranks:
        if not 0 <= r < world:
            raise TraceError(f"{cfg.name}: stragglers.slow_ranks: rank {r} is not in the {world}-rank job")
        base[r] *= st.slow_factor
    servers = -(-world // cfg.gpus_per_server)
    for s in st.slow_servers:
        if not 0 <= s < servers:
            raise TraceError(f"{cfg.name}: stragglers.slow_servers: server {s} is not in the job's {servers} servers")
        base[s * cfg.gpus_per_server:(s + 1) * cfg.gpus_per_server] *= st.slow_factor
    shape = (cfg.steps, world, m if st.jitter_per == "microbatch" else 1)
    out = np.broadcast_to(base[None, :, None], shape).copy()
    if st.jitter_cv > 0:
        out *= lognormal_multipliers(np.random.default_rng(st.seed), st.jitter_cv, shape)
    return out
