"""The clean slate's last step (tests/cleanslate.py): the cgroup parents a test makes
(``geco-test-<pid>[-<n>]``, named after its session's pid) outlive a session that was
killed outright, with whatever the test had put in them, frozen or not. The next
session removes them, and leaves those of a session that still runs alone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cgroup_testkit import raw_cleanup
from tests.cleanslate import remove_orphaned_test_cgroups

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: makes cgroups"),
]

CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def hierarchy(controller: str) -> Path:
    """The v1 mount point of ``controller`` (this machine's layout: cgroup v1)."""
    from geco.cgroup import parse_mountinfo

    for mount in parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()):
        if mount.fstype == "cgroup" and controller in mount.super_options:
            return mount.mount_point
    pytest.fail(f"no cgroup v1 {controller} hierarchy is mounted")


def gone_pid() -> int:
    """The pid of a process that has exited (a killed session's)."""
    child = subprocess.Popen(["true"], env=CLEAN_ENV)
    child.wait()
    return child.pid


@pytest.fixture
def parents() -> Iterator[list[Path]]:
    """The parents a test makes here, removed afterwards whatever happened."""
    made: list[Path] = []
    yield made
    raw_cleanup(made)


def test_a_gone_sessions_parents_are_removed_with_their_frozen_process(
        parents: list[Path]) -> None:
    """Given a gone session's two parents, one holding a sleeping process that is frozen,
    and a live session's parent, when the clean slate runs, then the gone session's are
    removed, the process is dead, and the live session's parent is still there."""
    freezer, pids = hierarchy("freezer"), hierarchy("pids")
    dead = gone_pid()
    mine = freezer / f"geco-test-{os.getpid()}-cleanslate"
    stale = [freezer / f"geco-test-{dead}-1", pids / f"geco-test-{dead}-1",
             freezer / f"geco-test-{dead}"]
    for path in [*stale, mine]:
        path.mkdir()
        parents.append(path)
    sleeper = subprocess.Popen(["sleep", "600"], env=CLEAN_ENV)
    try:
        for path in stale[:2]:
            (path / "cgroup.procs").write_text(str(sleeper.pid))
        (stale[0] / "freezer.state").write_text("FROZEN")

        done = remove_orphaned_test_cgroups()

        assert sleeper.wait(timeout=10) == -9
    finally:
        sleeper.kill()
        sleeper.wait()
    assert [p for p in stale if p.exists()] == []
    assert mine.is_dir()
    assert done == [f"removed 2 test cgroup parents of sessions that are gone "
                    f"(geco-test-{dead} geco-test-{dead}-1)"]


def test_without_a_gone_sessions_parent_there_is_nothing_to_say(parents: list[Path]) -> None:
    """Given only a live session's parent, then the step does and says nothing."""
    mine = hierarchy("freezer") / f"geco-test-{os.getpid()}-quiet"
    mine.mkdir()
    parents.append(mine)
    assert remove_orphaned_test_cgroups() == []
    assert mine.is_dir()
