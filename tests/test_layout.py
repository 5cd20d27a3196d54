"""The layout's import rules (docs/architecture.md): every arrow points down.

    fabriclab (session + CLI) -> controller, traffic -> fabric

`fabric` imports no other project package; `controller` and `traffic` import only `fabric` (and
never each other); nothing imports `fabriclab`; only `fabric/emulation/net.py` imports Mininet; and
there is no import circle between modules. Read from the source with `ast`, so a lazy import inside
a function counts too."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fabriclab", "fabric", "controller", "traffic")
ALLOWED = {
    "fabric": set(),
    "controller": {"fabric"},
    "traffic": {"fabric"},
    "fabriclab": {"fabric", "controller", "traffic"},
}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """Project modules (and third-party top-level names) a module imports, anywhere in its body."""
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = name.split(".")[: -node.level] if not path.name == "__init__.py" else name.split(".")
                if path.name == "__init__.py" and node.level > 1:
                    base = base[: -(node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return found


def project_graph() -> nx.DiGraph:
    mods = modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for imp in imports(name, path):
            # the longest project module that `imp` names (a package, a module or a name in it)
            parts = imp.split(".")
            for k in range(len(parts), 0, -1):
                cand = ".".join(parts[:k])
                if cand in mods:
                    if cand != name and not name.startswith(cand + "."):
                        g.add_edge(name, cand)
                    break
    return g


def test_every_import_arrow_points_down():
    g = project_graph()
    bad = []
    for a, b in g.edges:
        pa, pb = a.split(".")[0], b.split(".")[0]
        if pa != pb and pb not in ALLOWED[pa]:
            bad.append(f"{a} -> {b}")
    assert not bad, "imports against the layout:\n" + "\n".join(sorted(bad))


def test_no_import_circle_between_modules():
    g = project_graph()
    cycles = list(nx.simple_cycles(g))
    assert not cycles, cycles[:5]


def test_only_the_mininet_adapter_imports_mininet():
    users = sorted(name for name, path in modules().items()
                   if any(i == "mininet" or i.startswith("mininet.") for i in imports(name, path)))
    assert users == ["fabric.emulation.net"]


def test_the_checker_sees_imports_inside_functions(tmp_path):
    # the rules must be able to fail: a lazy import in a function body counts like any other
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from controller import core\n    import mininet.net\n")
    assert {"controller", "controller.core", "mininet.net"} <= imports("fabric.probe", path)
