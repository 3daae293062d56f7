"""The tests' and benches' shape: kits are modules, imported normally.

What several test modules share lives in a kit (``tests/*kit.py``,
``tests/integration/livekit.py``, ...), never in a test module or a conftest that others
import: a test module imported by another runs its module-level code twice under two
names, and a conftest imported as a module is a second copy of the one pytest loaded.
Fixtures shared across directories sit in the nearest common conftest.

Nothing edits ``sys.path``: pytest puts the repo root there (pyproject's ``pythonpath``),
a bench runs as ``python -m bench.<script>``, and a child process gets the checkout
through ``PYTHONPATH``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# one line that must edit sys.path: bench_hooks times the import as the installed hook
# (sge_hooks/geco-hook, run with -I -S) does it, venv's site-packages appended by hand
MIMICS_THE_INSTALLED_HOOK = {"bench/bench_hooks.py": "site-packages"}
# spelled in pieces, so this file does not match itself
PATH_EDIT = re.compile(r"\bsys\.path\s*(\.\s*(insert|append|extend)\b|\[|\+=|=[^=])")


def sources() -> list[Path]:
    """Every Python file of tests/ and bench/ (bench/run is a Python script too)."""
    return sorted([*REPO.glob("tests/**/*.py"), *REPO.glob("bench/*.py"), REPO / "bench" / "run"])


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports by name (``from a.b import c``: a.b and a.b.c)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def test_no_test_module_or_conftest_is_imported() -> None:
    """Given every file of tests/ and bench/, then none imports a test module
    (``test_*``) or a conftest: what is shared lives in a kit module."""
    found = [f"{path.relative_to(REPO)}: {name}" for path in sources()
             for name in imported_modules(path)
             if re.match(r"(test_|conftest$)", name.rpartition(".")[2])]
    assert found == []


def test_nothing_in_tests_or_bench_edits_sys_path() -> None:
    """Given every file of tests/ and bench/, then no line edits ``sys.path`` (but the
    bench line that imports as the installed hook does)."""
    found = []
    for path in sources():
        where = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            allowed = MIMICS_THE_INSTALLED_HOOK.get(where)
            if PATH_EDIT.search(line) and not (allowed and allowed in line):
                found.append(f"{where}:{number}: {line.strip()}")
    assert found == []


def test_bench_imports_no_fixture_module() -> None:
    """Given bench/, then it uses the tests' kits, never a conftest (a plugin of pytest's,
    with fixtures and hooks that only mean something inside a test session)."""
    found = [f"{path.relative_to(REPO)}: {name}" for path in sources()
             if path.parts[-2] == "bench" for name in imported_modules(path)
             if "conftest" in name.split(".")]
    assert found == []
