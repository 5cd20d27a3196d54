"""A user's plain clone has no `../shared` beside it: the tests that read the shared real traces skip there,
naming the missing file and the variable that sets it, and the same tests fail when CI=true (tests/real_traces.py).

The repository is cloned into a temporary folder (with this checkout's uncommitted edits copied over, so a
developer tests what they are about to commit), and pytest runs a trace-reading test file inside the clone, in a
fresh interpreter that imports the clone's code. The tests expected to need the traces are counted from the
file's own decorators, not from pytest's output.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILE = "tests/test_traces.py"


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=120).stdout


def _clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to clone")
    dest = tmp_path / "users" / "fabriclab"  # ../shared would be tmp_path/users/shared: never there
    _git("clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest), cwd=tmp_path)
    for name in _git("ls-files", "--modified", "--others", "--exclude-standard", "-z").split("\0"):
        if name and (ROOT / name).is_file():  # uncommitted edits and new files, as they are in this checkout
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    for name in _git("ls-files", "--deleted", "-z").split("\0"):
        if name:
            (dest / name).unlink(missing_ok=True)
    assert not (dest.parent / "shared").exists()
    return dest


def _marked(path: Path) -> int:
    """How many tests of the file are decorated `@needs(...)` (parametrized ones counted once per case)."""
    count = 0
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            names = [ast.unparse(d) for d in node.decorator_list]
            if any(n.startswith("needs(") for n in names):
                cases = [d for d in node.decorator_list if ast.unparse(d).startswith("pytest.mark.parametrize")]
                count += len(cases[0].args[1].elts) if cases else 1  # type: ignore[attr-defined]
    return count


def _pytest(clone: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "FABRICLAB_TRACES", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(clone)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", FILE],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=600)


def _count(out: str, what: str) -> int:
    m = re.search(rf"(\d+) {what}", out.strip().splitlines()[-1])
    return int(m.group(1)) if m else 0


def test_a_plain_clone_skips_the_trace_tests_naming_the_path_and_ci_fails_them(tmp_path: Path) -> None:
    clone = _clone(tmp_path)
    expected = _marked(clone / FILE)
    assert expected >= 10
    missing = str(clone.parent / "shared" / "traces" / "kineto" / "resnet50_ddp_2xA100_rank0.json.gz")

    user = _pytest(clone, ci=False)
    out = user.stdout + user.stderr
    assert user.returncode == 0, out
    assert _count(out, "failed") == 0 and _count(out, "skipped") == expected and _count(out, "passed") > 0, out
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) >= 1 and all("FABRICLAB_TRACES" in s for s in skips), skips
    assert any(missing in s for s in skips), (missing, skips)

    ci = _pytest(clone, ci=True)
    out = ci.stdout + ci.stderr
    assert ci.returncode == 1, out
    # failed in set-up, before the test's body: pytest counts those as errors (exit status 1 all the same)
    assert _count(out, "failed") + _count(out, "errors?") == expected and _count(out, "skipped") == 0, out
    assert missing in out and "FABRICLAB_TRACES" in out
