"""Fixtures shared by the tests/system modules: children forked into job cgroups.

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


@pytest.fixture
def children() -> Iterator[list[int]]:
    """The pids the test forked (a cgroup_testkit.Child adds its own); each one still
    there is SIGKILLed and reaped afterwards."""
    with forked_children() as pids:
        yield pids
