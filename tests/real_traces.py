"""The shared real traces that tests read, and the one rule for the tests that need them.

The traces are real recordings kept outside the project (read-only, never copied in). They are found under
`$FABRICLAB_TRACES`, by default `../shared/traces` beside the checkout; a user's plain clone has none.
A test that reads them says so with `@needs(RESNET, ...)` (the `shared_traces` marker). `tests/conftest.py`
checks the marked paths before the test's fixtures run:
- outside CI a missing file skips the test, and the reason names the file and the variable that sets it;
- in CI (`CI=true`) the same test fails, since CI always has the traces beside it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the variable that locates the traces
VARIABLE = "FABRICLAB_TRACES"
TRACES = Path(os.environ.get(VARIABLE, ROOT.parent / "shared" / "traces"))
RESNET = TRACES / "kineto" / "resnet50_ddp_2xA100_rank0.json.gz"
DLRM = TRACES / "kineto" / "dlrm_8xV100_step12"
CHAKRA = TRACES / "chakra" / "resnet50_ddp_rank0.et"
MARKER = "shared_traces"


def needs(*paths: Path) -> pytest.MarkDecorator:
    """Mark a test as reading these shared traces (files or folders)."""
    return getattr(pytest.mark, MARKER)(*paths)


def missing_reason(paths: tuple[Path, ...]) -> str | None:
    """Why the marked test cannot run here, naming the first missing path and the variable; None if all exist."""
    for p in paths:
        if not Path(p).exists():
            return (f"a shared real trace is missing: {p} (set {VARIABLE} to the folder that holds the traces; "
                    f"the default is ../shared/traces beside the checkout)")
    return None
