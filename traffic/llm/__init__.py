"""Generated LLM training workloads (docs/workloads.md): config, presets, FLOPs, collective rules.

`build_workload` and `describe` (the schedule) come from `traffic.llm.build`; until that module is
in, asking for them raises AttributeError.
"""
from __future__ import annotations

from typing import Any

from traffic.llm.config import PRESETS, LLMConfig, load_config, parse_config

__all__ = ["PRESETS", "LLMConfig", "build_workload", "describe", "load_config", "parse_config"]


def __getattr__(name: str) -> Any:
    if name in ("build_workload", "describe"):
        try:
            from traffic.llm import build
        except ModuleNotFoundError:
            raise AttributeError(f"traffic.llm.{name}: the schedule (traffic.llm.build) is not in this tree") from None
        return getattr(build, name)
    raise AttributeError(f"module 'traffic.llm' has no attribute {name!r}")
