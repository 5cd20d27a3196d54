"""The top floor stays small (issue 40): a command module and compare's driver under 400 lines, and no function in
`fabriclab/` or `traffic/llm/` over 80 lines (a longer one holds more than one concept: split it)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = {"fabriclab/commands.py": 400, "fabriclab/compare.py": 400}
MAX_FUNCTION_LINES = 80


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'path:line name (N lines)' for each function (nested ones included) longer than `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > limit:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_the_command_and_compare_modules_are_under_400_lines() -> None:
    for name, limit in MAX_MODULE_LINES.items():
        lines = len((ROOT / name).read_text().splitlines())
        assert lines < limit, f"{name}: {lines} lines (at most {limit - 1})"


def test_no_function_of_the_top_floor_or_the_llm_generator_is_over_80_lines() -> None:
    files = sorted([*(ROOT / "fabriclab").rglob("*.py"), *(ROOT / "traffic" / "llm").rglob("*.py")])
    assert len(files) > 20
    assert [f for p in files for f in long_functions(p)] == []


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (tmp_path / "long.py").write_text(f"def f():\n{body}\n\n\ndef g():\n    return 1\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert long_functions(tmp_path / "long.py") == ["long.py:1 f (86 lines)"]
    finally:
        ROOT = saved
