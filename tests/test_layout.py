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


#: the emulation's own side of the run pipeline (its agents, its driver and timing types, its measurements)
EMULATOR_SIDE = {"traffic.replay.agent", "traffic.replay.driver", "traffic.replay.emulated", "traffic.replay.place",
                 "fabric.emulation"}
#: what the simulator's side and the shared pipeline are made of
NEUTRAL_OR_SIMULATOR = ("traffic.replay.simulate", "traffic.replay.plan", "traffic.replay.result",
                        "traffic.replay.timings", "fabric.flowsim")


def reached(g: nx.DiGraph, start: str) -> set[str]:
    """Every project module `start` imports, directly or through others."""
    return {start} | nx.descendants(g, start)


def emulator_modules_reached(g: nx.DiGraph) -> dict[str, set[str]]:
    out = {}
    for name in g.nodes:
        if any(name == m or name.startswith(m + ".") for m in NEUTRAL_OR_SIMULATOR):
            hit = {m for m in reached(g, name) if any(m == e or m.startswith(e + ".") for e in EMULATOR_SIDE)}
            if hit:
                out[name] = hit
    return out


def test_the_simulators_side_never_reaches_the_emulators_timing_types():
    # one result builder fed by both backends: the simulator does not fake the emulator's RawRun/CallTiming
    assert emulator_modules_reached(project_graph()) == {}


def test_the_reach_check_can_fail():
    g = project_graph()
    g.add_edge("traffic.replay.simulate", "traffic.replay.driver")
    assert "traffic.replay.driver" in emulator_modules_reached(g)["traffic.replay.simulate"]


def classes_named(name: str, paths: list[Path]) -> list[str]:
    return sorted(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p.name}" for p in paths
                  for n in ast.walk(ast.parse(p.read_text(), str(p))) if isinstance(n, ast.ClassDef) and n.name == name)


def test_one_connection_class():
    # both backends' connections are `fabric.flowsim.connections.Connection`, planned by one rule
    assert classes_named("Connection", list(modules().values())) == ["fabric/flowsim/connections.py"]


def test_the_connection_class_check_can_fail(tmp_path):
    extra = tmp_path / "second.py"
    extra.write_text("class Connection:\n    pass\n")
    assert len(classes_named("Connection", [*modules().values(), extra])) == 2
