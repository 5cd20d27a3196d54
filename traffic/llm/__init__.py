"""Generated LLM training workloads (docs/workloads.md): a model config (`config`, `presets`) -> FLOPs
(`model`) and collective rules (`rules`) -> each pipeline stage's program (`program`) -> one training step's
per-rank timeline (`schedule`, with the ranks' straggler multipliers from `stragglers`) -> a `Workload`
(`build`)."""
from __future__ import annotations

from traffic.llm.build import build_workload, describe
from traffic.llm.config import PRESETS, LLMConfig, load_config, parse_config

__all__ = ["PRESETS", "LLMConfig", "build_workload", "describe", "load_config", "parse_config"]
