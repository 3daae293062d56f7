"""Who counts as a stray at a job's end: not a job's process that is exiting.

The kernel takes a task out of its cgroups (to the root) in do_exit(), before it is a
zombie: for that moment a job's ending process (a shell loop's ``sleep``) looks like a
process outside every job. A fresh run's epilog named such a ``sleep`` among the owner's
strays (tests/integration/test_strays_live.py). The scan reads the task's flags in
``/proc/<pid>/stat``: PF_EXITING is a process on its way out, never a stray.

The node is a fixture ``proc`` (tests/nodekit.py) describing a real process of this test:
the scan pins what it finds with a pidfd, which needs a live pid.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from geco.cgroup import Backend
from geco.job import strays
from geco.jobkey import JobKey
from tests.nodekit import process

OWNER = 1002
SLEEPING, EXITING = 0x00400100, 0x00400104  # PF_EXITING is 0x4


class Paths:
    """geco's job cgroups under /GECO (v1): all strays asks the backend for."""

    def cgroup_paths(self, key: JobKey) -> dict[str, str]:
        return {"memory": f"/GECO/{key}", "cpuset": f"/GECO/{key}"}


NODE = cast(Backend, Paths())


@pytest.fixture
def live() -> Iterator[int]:
    with subprocess.Popen(["sleep", "60"]) as child:
        yield child.pid
        child.kill()


def a_sleep_outside_every_job(proc: Path, pid: int, flags: int) -> None:
    process(proc, pid, "sleep", OWNER)
    (proc / str(pid) / "stat").write_bytes(f"{pid} (sleep) S 1 1 1 0 -1 {flags} 0 0".encode())
    (proc / str(pid) / "cgroup").write_bytes(b"6:memory:/\n5:cpuset:/\n")


def test_a_process_of_the_owner_outside_every_job_is_a_stray(tmp_path: Path, live: int) -> None:
    a_sleep_outside_every_job(tmp_path, live, SLEEPING)

    assert strays.find(NODE, OWNER, tmp_path) == [strays.Stray(live, "sleep")]


def test_one_on_its_way_out_of_the_kernel_is_not(tmp_path: Path, live: int) -> None:
    a_sleep_outside_every_job(tmp_path, live, EXITING)

    assert strays.find(NODE, OWNER, tmp_path) == []
