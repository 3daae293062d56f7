"""The package's shape: wings by what they serve, on floors, and no import circles.

What sits directly in ``geco/`` is the shared street, what every wing speaks: configuration,
logging, errors, units, atomic files, the /proc reader, and a job's words (its key,
resource set, accounting, GPU share, cpu lists). Everything else lives in the wing it
serves: cgroups (``cgroup``), Grid Engine's texts (``sge``), the node's resources
(``node``), the wire between preload, gecod and hosts (``wire``), OOM reports (``oom``),
ssh (``ssh``), what a job used (``usage``), a job's life (``job``), read-only views
(``reports``), the hooks (``hooks``), gecod (``daemon``) and the command line (``cli``).
The private ``_*`` modules are cffi builders and their helpers.

The wings stand on floors, and an import runs down a floor or stays on its own, never up:
a wing that reached up would need the floor above it to be understood, tested or loaded.
Every import counts, those inside functions (done on call, to keep start-up light) and
under ``TYPE_CHECKING`` too: each is a dependency of the code, run or not. The few that
still run up are named in :data:`UPWARD`, each with why.

No module imports itself back through another: an import circle makes a module's names
depend on which of the two was imported first (a half-initialised module), and makes the
code hard to walk. The one circle is logging's (:data:`CIRCLE`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "geco"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph(statements: Callable[[ast.Module], Iterable[ast.AST]], *,
           package_too: bool) -> dict[str, set[str]]:
    """``{module: the geco modules its import statements among ``statements`` name}``.
    ``package_too``: ``from package import module`` names the package as well (its face
    is loaded first)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in statements(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                inner = [t for t in (f"{node.module}.{a.name}" for a in node.names)
                         if t in modules]
                targets = [node.module, *inner] if package_too or not inner else inner
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _run_at_load(tree: ast.Module) -> Iterator[ast.stmt]:
    """The statements run when the module is loaded: top level and class bodies, not
    function bodies; ``if TYPE_CHECKING:`` blocks are not run."""
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
        else:
            yield node


def load_time_imports() -> dict[str, set[str]]:
    """``{module: the geco modules it imports at load time}``."""
    return _graph(_run_at_load, package_too=True)


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


def all_imports() -> dict[str, set[str]]:
    """``{module: every geco module it imports}``: anywhere in it, run or not.
    ``from package import module`` is an import of the module alone: the package's face
    is loaded, but what its functions import is not."""
    return _graph(ast.walk, package_too=False)


def test_no_module_of_geco_imports_itself_back_at_load_time() -> None:
    graph = load_time_imports()
    assert "geco.sge.v1format" in graph and "geco.resourceset" in graph
    assert cycles(graph) == []


# logging's pair: the handlers need the record's words, and the logger starts the
# handlers on first use (in a function: a hook that logs nothing loads no handler)
CIRCLE = ["geco.log", "geco.log_handlers"]


def test_no_circle_but_loggings_even_through_imports_inside_functions() -> None:
    assert cycles(all_imports()) == [CIRCLE]


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The floors, lowest first. "street" is geco/*.py but the command line.
FLOORS = (("street",), ("cgroup", "sge"), ("node",), ("wire",), ("oom", "ssh", "usage"),
          ("job",), ("reports", "hooks"), ("daemon",), ("cli",))
# The imports that still run up, each with why it is not yet mended.
UPWARD = {
    # geco check's line on the metrics endpoint: the daemon's own reading of [metrics]
    ("geco.reports.nodeview", "geco.daemon.metrics"),
}


def floor_of(module: str) -> int:
    """The floor of a module of geco (:data:`FLOORS`)."""
    parts = module.split(".")
    wing = parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else \
        "cli" if module == "geco.cli" else "street"
    return next(i for i, wings in enumerate(FLOORS) if wing in wings)


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The imports of ``graph`` that run up a floor."""
    return {(m, t) for m, targets in graph.items() for t in targets
            if floor_of(t) > floor_of(m)}


def test_every_import_runs_down_a_floor_or_stays_on_its_own() -> None:
    assert upward(all_imports()) == UPWARD
    assert len(UPWARD) <= 3


def test_the_floor_finder_sees_an_import_that_runs_up() -> None:
    assert upward({"geco.sge.lookup": {"geco.job.containment", "geco.jobkey"},
                   "geco.cli": {"geco.daemon"}}) == {("geco.sge.lookup", "geco.job.containment")}


SHARED = {"accounting", "atomicfile", "cli", "config", "configcache", "cpulist", "errors",
          "gpushare", "jobfiles", "jobkey", "log", "log_handlers", "ownerread", "pools",
          "procfs", "resourceset", "rootlock", "terminal", "units"}
WINGS = {"cgroup", "daemon", "hooks", "job", "node", "oom", "reports", "sge", "ssh", "usage",
         "wire"}


def test_the_flat_street_holds_only_what_every_wing_shares() -> None:
    flat = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    wings = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert (flat, wings) == (SHARED, WINGS)
    assert {w for floor in FLOORS for w in floor} == WINGS | {"street", "cli"}


def test_a_new_wing_costs_a_hook_nothing_to_enter() -> None:
    """job, node, ssh, wire, usage and reports are only directories: importing one module
    of theirs loads no other (the hooks' start-up budget, tests/unit/test_hook_imports.py)."""
    plain = ("job", "node", "ssh", "wire", "usage", "reports")
    graph = load_time_imports()
    assert {wing: graph[f"geco.{wing}"] for wing in plain} == {wing: set() for wing in plain}
    assert all(ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text()))
               for wing in plain)


def test_each_logger_is_named_after_its_module() -> None:
    """A module's logger is ``geco.<its path>``: a test or a trace that listens to one
    module's records names it as the code is laid out."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_log":
                assert ast.unparse(node.value) == f"log.get({_module_name(path)[5:]!r})", path
