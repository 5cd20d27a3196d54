"""Generated LLM training workloads (docs/workloads.md): a model config (`config`, `presets`) -> FLOPs
(`model`) and collective rules (`rules`) -> one training step's per-rank schedule (`schedule`) -> a
`Workload` (`build`)."""
from __future__ import annotations

from traffic.llm.build import build_workload, describe
from traffic.llm.config import PRESETS, LLMConfig, load_config, parse_config

__all__ = ["PRESETS", "LLMConfig", "build_workload", "describe", "load_config", "parse_config"]
