"""Fixtures shared by the tests/system modules: children forked into job cgroups.

Their helpers are in ``tests/cgroup_testkit.py``; ``tests/vm`` uses the same
helpers but runs in the QEMU machine with ``--noconftest``, so it has its own
fixtures. Not to be imported: pytest finds these by name (``import conftest``
would give whichever conftest.py was loaded last).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cgroup_testkit import forked_children
from tests.preloadkit import Built, build
from tests.system import vmrun


@pytest.fixture
def children() -> Iterator[list[int]]:
    """The pids the test forked (a cgroup_testkit.Child adds its own); each one still
    there is SIGKILLed and reaped afterwards."""
    with forked_children() as pids:
        yield pids


@pytest.fixture(scope="session")
def built() -> Iterator[Built]:
    """The preload library and its test programs (tests/preloadkit.py), built once."""
    with build() as b:
        yield b


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The VM tests last (in their order): each waits for its boot, so a host test after
    one waits with it; run last, the host tests all run while the boots do."""
    items.sort(key=lambda item: item.get_closest_marker("vm") is not None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the VM boots of the collected ``vm`` tests now, in the background (the longest
    first): they run while the host tests do, and each VM test waits for its own result."""
    if session.config.option.collectonly:
        return
    boots = {item.module.BOOT for item in session.items
             if item.get_closest_marker("vm") and isinstance(item, pytest.Function)
             and isinstance(getattr(item.module, "BOOT", None), vmrun.Boot)}
    for boot in sorted(boots, key=lambda boot: -boot.timeout):
        vmrun.start(boot)


def pytest_sessionfinish() -> None:
    vmrun.stop()
