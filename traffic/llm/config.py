"""An LLM training job's config, and `load_config`: a preset or a YAML file, with dotted-key overrides.

    load_config("gpt3-175b")
    load_config("llama3-70b,parallel.pp=8,compute.gpu=a100,stragglers.jitter_cv=0.05")
    load_config("my-model.yaml,micro_batch=2")

The records live in `traffic.llm.schema` (re-exported here); every failure is a `TraceError` naming the
preset, key, file or field.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from traffic.llm.presets import PRESETS
from traffic.llm.schema import Compute, LLMConfig, Model, MoE, Parallel, Stragglers
from traffic.workload import TraceError

__all__ = ["PRESETS", "Compute", "LLMConfig", "MoE", "Model", "Parallel", "Stragglers", "load_config",
           "parse_config"]


def parse_config(data: Any, where: str = "config") -> LLMConfig:
    """An `LLMConfig` from a mapping (a YAML document), or a TraceError naming `where` and the bad field."""
    if not isinstance(data, dict):
        raise TraceError(f"{where}: a config is a mapping of fields, got {type(data).__name__}")
    try:
        return LLMConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
                             for e in exc.errors())
        raise TraceError(f"{where}: {problems}") from None
    except TraceError as exc:
        raise TraceError(f"{where}: {exc}") from None


def load_config(spec: str) -> LLMConfig:
    """`PRESET`, `PRESET,key=value,...` or `FILE.yaml[,key=value...]`; keys are dotted field paths
    (`parallel.pp=16`), values YAML scalars or flow lists (`stragglers.slow_ranks=[3,7]`)."""
    parts = _split(spec)
    if not parts or not parts[0]:
        raise TraceError(f"llm:{spec}: no preset or file given (presets: {', '.join(PRESETS)})")
    base, overrides = parts[0], parts[1:]
    if base in PRESETS:
        data = PRESETS[base].model_dump(mode="python")
    elif base.endswith((".yaml", ".yml")) or "/" in base or Path(base).exists():
        data = _read_yaml(Path(base))
    else:
        raise TraceError(f"llm:{spec}: unknown preset {base!r} (presets: {', '.join(PRESETS)}; or a .yaml file)")
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise TraceError(f"llm:{spec}: override {item!r} is not key=value")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise TraceError(f"llm:{spec}: override {key}: {text!r} is not a YAML value") from None
        if isinstance(value, str) and _FLOAT.fullmatch(value):
            value = float(value)  # YAML 1.1 reads "5e-2" as a string
        _set(data, key, value, spec)
    if overrides and not any(i.partition("=")[0].strip() == "name" for i in overrides):
        data["name"] = spec
    return parse_config(data, f"llm:{spec}")


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _split(spec: str) -> list[str]:
    """Split at commas outside brackets (a flow list's commas stay in its value)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in spec:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the config: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TraceError(f"{path}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}: a config file is a YAML mapping of fields")
    return data


_RECORDS: dict[str, Any] = {"": LLMConfig, "model": Model, "model.moe": MoE, "parallel": Parallel,
                            "compute": Compute, "stragglers": Stragglers}


def _set(data: dict[str, Any], key: str, value: Any, spec: str) -> None:
    """Set the dotted `key` in the nested dict, refusing a key no record has."""
    path = key.split(".")
    node = data
    for depth, name in enumerate(path):
        prefix = ".".join(path[:depth])
        record = _RECORDS.get(prefix)
        if record is None or name not in record.model_fields:
            known = ", ".join(record.model_fields) if record is not None else "none"
            where = prefix or "the config"
            raise TraceError(f"llm:{spec}: unknown key {key!r} ({where} has: {known})")
        if depth == len(path) - 1:
            node[name] = value
            return
        child = node.get(name)
        if child is None:  # e.g. model.moe on a dense model: the override starts it
            child = node[name] = {}
        if not isinstance(child, dict):
            raise TraceError(f"llm:{spec}: unknown key {key!r} ({'.'.join(path[:depth + 1])} is a value)")
        node = child
