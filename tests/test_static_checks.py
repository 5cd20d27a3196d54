"""The library is typed (mypy, untyped defs disallowed) and free of pyflakes-class errors (ruff)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_library():
    res = subprocess.run([sys.executable, "-m", "mypy", "fabric", "controller", "traffic", "fabriclab"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_pyflakes_and_bugbear():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F,E9,B007,B006",
                          "fabric", "controller", "traffic", "fabriclab", "tests", "benchmarks"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
