"""Generated LLM training workloads: a model config (`config`, `presets`) -> FLOPs (`model`) and
communication rules (`rules`) -> one training step's per-rank schedule (`schedule`) -> a `Workload` (`build`)."""
from __future__ import annotations

from traffic.llm.build import build_workload, describe
from traffic.llm.config import LLMConfig, load_config
from traffic.llm.presets import PRESETS

__all__ = ["LLMConfig", "PRESETS", "build_workload", "describe", "load_config"]
