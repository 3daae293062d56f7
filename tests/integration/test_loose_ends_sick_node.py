"""Issue 37, point 1, on the real Grid Engine: a node whose cgroups cannot be made takes
itself out instead of re-queueing every job that lands there.

The node's cgroup parent in the memory hierarchy (``[cgroup] name``, a test one) is made
read-only with a read-only bind mount: the kernel refuses every job's cgroup there
(EROFS), as on a node whose cgroup file system went wrong. Jobs go to a queue of their
own on this host (a copy of the test queue), so the queue geco disables is that one.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.livekit import no_queue_in_error, site_settings, wait_until

pytestmark = pytest.mark.sge

NAME = "geco-test-sick"
QUEUE = "geco-test-sick.q"
CGROUPS = Path("/sys/fs/cgroup")
PARENT = CGROUPS / "memory" / NAME
WAIT = 180.0
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=CLEAN_ENV, timeout=60,
                          check=False)


@contextlib.contextmanager
def read_only_parent() -> Iterator[None]:
    """The memory hierarchy's ``geco-test-sick`` parent, read-only while the block runs."""
    PARENT.mkdir(exist_ok=True)
    for argv in (["mount", "--bind", str(PARENT), str(PARENT)],
                 ["mount", "-o", "remount,bind,ro", str(PARENT)]):
        done = _sh(*argv)
        assert done.returncode == 0, (argv, done.stderr)
    try:
        yield
    finally:
        _sh("umount", str(PARENT))


def _remove_parents() -> None:
    """The test parents in every hierarchy, once the jobs' cgroups in them are gone."""
    for parent in CGROUPS.glob(f"*/{NAME}"):
        if parent.is_dir() and not parent.is_symlink():
            for child in sorted(parent.rglob("*"), key=lambda p: -len(p.parts)):
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                parent.rmdir()


def _check_health() -> str:
    done = _sh("/usr/bin/geco", "check")
    return next((line for line in done.stdout.splitlines() if "health" in line),
                done.stdout + done.stderr)


def test_a_node_whose_cgroups_are_refused_disables_its_queue_and_runs_again_once_mended(
        sge: Any, gecod: Any, journal: Any, job_dir: Any) -> None:
    """Given the node's cgroup parent read-only, when three jobs are submitted to a queue
    of this host, then none runs: after three failures of two jobs or more the queue
    instance is disabled (qmod -d), journaled as node-sick with the kernel's reason and the
    jobs, `geco check` says so, the jobs wait (qw), nothing loops and no queue is in error.
    Once the parent is writable and the instance enabled, every job runs and the streak is
    over."""
    instance = f"{QUEUE}@{sge.host}"
    jobs: list[int] = []
    with sge.temporary_queue(QUEUE), site_settings({("cgroup", "name"): NAME}, gecod):
        try:
            with read_only_parent():
                for n in range(3):
                    jobs.append(job_dir.submit(f"sick{n}", "-q", QUEUE,
                                               script="echo ran\n"))
                # the first says it disabled the instance; a job dispatched just before
                # may fail after it ("disabled already")
                sick = journal.wait_for(WAIT, GECO_EVENT="node-sick",
                                        QUEUE_INSTANCE=instance)[0]
                wait_until(lambda: "d" in sge.queue_states().get(instance, ""), WAIT,
                           f"{instance} disabled")
                health = _check_health()
                # a job dispatched before the qmod -d fails its start too, then waits
                wait_until(lambda: all(_state(job) == "qw" for job in jobs), WAIT,
                           "every job waiting (qw)")
                in_error = no_queue_in_error(sge)
            assert "Read-only file system" in sick["REASON"], sick
            assert set(sick["JOBS"].split()) <= {str(j) for j in jobs}, sick
            assert len(set(sick["JOBS"].split())) >= 2, sick
            assert f"disabled the queue instance {instance} (qmod -d)" in sick["MESSAGE"], sick
            assert in_error == {}, in_error
            assert f"disabled {instance}" in health, health
            assert not any((job_dir.path / f"sick{n}.o{job}").exists()
                           for n, job in enumerate(jobs))
            enabled = _sh("qmod", "-e", instance)
            assert enabled.returncode == 0, enabled.stderr
            refused = 0
            for n, job in enumerate(jobs):
                *failed, record = sge.wait_finished(job, timeout=WAIT)  # qacct's, in order
                assert record["exit_status"] == "0" and record["failed"] == "0", record
                assert job_dir.output(f"sick{n}", job) == "ran\n"
                refused += len(failed)
            # nothing looped: the three failures that made the node sick, and at most one
            # start per slot already dispatched when qmod -d came
            assert 3 <= refused <= 3 + int(sge.queue_config()["slots"]), refused
            assert "no failure to contain a job" in _check_health()
        finally:
            _sh("qmod", "-e", instance)
            for job in jobs:
                _sh("qdel", "-f", str(job))
    _remove_parents()


def _state(job: int) -> str:
    for line in _sh("qstat", "-u", "*").stdout.splitlines():
        cols = line.split()
        if cols[:1] == [str(job)]:
            return cols[4]
    return ""

