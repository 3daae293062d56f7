"""No dead dependency: every runtime dependency in ``pyproject.toml`` is imported by geco.

A dependency nothing imports still costs every install (scripts/install.sh takes the
list from pyproject.toml) and tells a reader geco uses it. psutil was one (issue 33):
geco reads processes through ``geco/procfs.py`` alone (README, Layout, says why).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_top_names() -> set[str]:
    """The top-level names of every module geco's code imports, also inside functions."""
    names: set[str] = set()
    for path in [*(REPO / "geco").rglob("*.py"), REPO / "setup.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def test_every_runtime_dependency_is_imported_by_geco() -> None:
    """Given pyproject.toml's dependencies, then each one's distribution provides a module
    that geco's code imports (none is installed for nothing)."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = {re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower()
              for req in meta["project"]["dependencies"]}
    provided: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            provided.setdefault(dist.lower(), set()).add(module.split("/")[0])
    imported = imported_top_names()
    assert {dist for dist in wanted if not provided.get(dist, set()) & imported} == set()
