"""Shared test set-up. Emulation tests need root and a running Open vSwitch; where those are
missing they skip, except in CI (CI=true), where a skip would hide a failure, so they fail."""
from __future__ import annotations

import os
import subprocess

import pytest


def _emulation_blocker() -> str | None:
    if os.geteuid() != 0:
        return "emulation tests need root (run: sudo .venv/bin/pytest)"
    try:
        res = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return "Open vSwitch is not installed (run scripts/setup.sh)"
    if res.returncode != 0:
        return f"Open vSwitch is not running ({res.stderr.strip()}); run scripts/setup.sh"
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "Mininet is not importable (use the .venv made by scripts/setup.sh)"
    return None


@pytest.fixture(autouse=True)
def _emulation_gate(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("emulation") is None:
        return
    why = _emulation_blocker()
    if why is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run emulation tests, but: {why}")
    pytest.skip(why)
