"""Shared test set-up. The markers (`emulation`, `unit`, `fabric`), the CI gate (an emulation test
that cannot run fails when CI=true instead of skipping) and the fixtures (`lab`, `probe`, `faults`,
`lab_factory`) come from fabriclab's pytest plugin (`fabriclab/pytest_plugin.py`), which the package
registers, so users' own suites get the same."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The shared real traces (read-only), located by FABRICLAB_TRACES, default ../shared/traces.
TRACES = Path(os.environ.get("FABRICLAB_TRACES", ROOT.parent / "shared" / "traces"))
