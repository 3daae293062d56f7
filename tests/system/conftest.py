"""Fixtures shared by the tests/system modules: children forked into job cgroups, and
figures a test measured (VM boot and run times, hook times) printed at the end of the run.

Their helpers are in ``tests/cgroup_testkit.py``; ``tests/vm`` uses the same
helpers but runs in the QEMU machine with ``--noconftest``, so it has its own
fixtures. Not to be imported: pytest finds these by name (``import conftest``
would give whichever conftest.py was loaded last).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cgroup_testkit
from cgroup_testkit import forked_children

_FIGURES: list[str] = []


@pytest.fixture
def figures() -> list[str]:
    """Lines a test appends to be printed under "figures" at the end of the run (pytest's
    own output of a passing test is hidden)."""
    return _FIGURES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES:
        terminalreporter.section("figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
def children() -> Iterator[list[int]]:
    """The pids the test forked (a cgroup_testkit.Child adds its own); each one still
    there is SIGKILLed and reaped afterwards."""
    with forked_children() as pids:
        yield pids
