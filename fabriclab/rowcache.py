"""The row cache's keys: a row is kept under a key of everything it depends on (the trace's bytes or the LLM
spec's config, the fabric template, routing, size, the resolved run, and the source code of `fabric` and
`traffic`), so a re-run with one size changed computes only that size."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fabric import topofile
from fabric.errors import FabriclabError
from fabriclab.study.spec import WorkloadSpec

# 4: rows are built from the resolved run specification (fabriclab.study.spec) and carry it
CACHE_VERSION = 4
ROOT = Path(__file__).resolve().parents[1]


def _digest_paths(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(p.anchor)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def trace_digest(trace: str | Path) -> str:
    """What a trace's rows depend on: its files' bytes, or a generated LLM step's whole config (and the
    profile it reads)."""
    workload = WorkloadSpec.parse(str(trace))
    if workload.llm:
        from traffic.llm import load_config

        cfg = load_config(workload.llm_spec)
        h = hashlib.sha256(cfg.model_dump_json().encode())
        if cfg.compute.profile:
            h.update(trace_digest(cfg.compute.profile).encode())
        return h.hexdigest()
    p = Path(trace)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    if not files:
        raise FabriclabError(f"{trace}: no trace files")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def code_digest() -> str:
    """The source of what a row depends on: the packages `fabric` and `traffic`."""
    return _digest_paths([f for pkg in ("fabric", "traffic") for f in (ROOT / pkg).rglob("*.py")])


def row_key(task: dict[str, Any], trace: str, code: str) -> str:
    template = topofile.template(task["topology"])
    doc = {"v": CACHE_VERSION, "trace": trace, "template": template, "params": task.get("params") or {},
           "routing": task["routing"],
           "gpus": task["gpus"], "opts": task["opts"], "sim": task["sim"], "a2a": task["all_to_all"], "code": code}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
