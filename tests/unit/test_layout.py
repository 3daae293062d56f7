"""The package's shape: wings by what they serve, and no import cycles.

What sits directly in ``geco/`` is what every wing shares (configuration, logging,
errors, units, atomic files, the /proc reader, the CLI); everything else lives in the
wing it serves: a job's life (``job``), the node's resources (``node``), ssh
(``ssh``), the wire between preload, gecod and hosts (``wire``), Grid Engine's texts
(``sge``), cgroups (``cgroup``), gecod (``daemon``), the hooks (``hooks``), OOM
reports (``oom``). The private ``_*`` modules are cffi builders and their helpers.

No module imports itself back through another at load time.

An import cycle makes a module's names depend on which of the two was imported
first (a half-initialised module), and makes the code hard to walk. Imports
inside functions (done on call, to keep start-up light) are not load-time edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "geco"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def load_time_imports() -> dict[str, set[str]]:
    """``{module: the geco modules it imports at load time}`` (top level and class bodies,
    not function bodies; ``if TYPE_CHECKING:`` blocks are not run)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        todo: list[ast.stmt] = list(tree.body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                todo.extend(node.orelse)
                continue
            if isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []):
                        todo.extend(child.body if isinstance(child, ast.ExceptHandler)
                                    else [child])
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_geco_imports_itself_back_at_load_time() -> None:
    graph = load_time_imports()
    assert "geco.sge.v1format" in graph and "geco.job.resourceset" in graph
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


SHARED = {"atomicfile", "cli", "config", "configcache", "errors", "log", "log_handlers",
          "preload_config", "procfs", "rootlock", "terminal", "units"}
WINGS = {"cgroup", "daemon", "hooks", "job", "node", "oom", "sge", "ssh", "wire"}


def test_the_flat_street_holds_only_what_every_wing_shares() -> None:
    flat = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    wings = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert (flat, wings) == (SHARED, WINGS)


def test_a_new_wing_costs_a_hook_nothing_to_enter() -> None:
    """job, node, ssh and wire are only directories: importing one module of theirs
    loads no other (the hooks' start-up budget, tests/unit/test_hook_imports.py)."""
    graph = load_time_imports()
    assert {wing: graph[f"geco.{wing}"] for wing in ("job", "node", "ssh", "wire")} == {
        "job": set(), "node": set(), "ssh": set(), "wire": set()}
    assert all(ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text()))
               for wing in ("job", "node", "ssh", "wire"))
