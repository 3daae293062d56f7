"""A job's environment cannot steer what root runs of Grid Engine's (issue 11, hole 2).

Grid Engine hands the root prolog and epilog the job's environment, and ``qsub -v``
puts anything there. Before geco.sge.siteenv, ``-v SGE_QMASTER_PORT=1`` reached the
prolog's qstat, which then could not reach the qmaster, so the job ran without its
memory limit. Here a real job is submitted with a hostile ``SGE_*`` and a ``PATH``
whose first directory holds the user's own ``qstat``, ``qmod`` and friends (each
leaves a marker naming the uid that ran it), in both deployments: the hooks queue
(the prolog asks qstat) and gecod with the exec() preload. The job must get its
memory limit, and no binary of the user's may run as root.

A qmaster that cannot be reached re-queues the job (prolog exit 99, never an error
state): tests/integration/test_faults.py stops the real qmaster at a job's start, and
tests/unit/test_qstat_env.py has qstat's ``<comunication_error>`` end in exit 99.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.livekit import no_queue_in_error

pytestmark = pytest.mark.sge

M = 1 << 20
# commands root might look up in PATH; the user's copies of them only leave a marker
TRAPS = ("qstat", "qmod", "qconf", "qacct", "qdel", "sh", "bash", "python3", "hostname",
         "id", "uname", "cat", "env", "ps", "logger", "systemd-cat")


@pytest.fixture
def evil_path(job_owner: Any) -> Iterator[Path]:
    """A directory of the job owner's holding an executable for each of TRAPS: it writes
    ``<name>.<uid>`` into the directory, then fails."""
    path = Path(tempfile.mkdtemp(prefix="geco-evil-", dir="/tmp"))
    for name in TRAPS:
        trap = path / name
        trap.write_text(f"#!/bin/sh\n: > {path}/{name}.$(/usr/bin/id -u)\nexit 1\n")
        trap.chmod(0o755)
        os.chown(trap, job_owner.uid, job_owner.gid)
    os.chown(path, job_owner.uid, job_owner.gid)
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def markers(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name not in TRAPS)


def test_under_the_hooks_a_job_with_a_hostile_environment_gets_its_limit_and_runs_nothing_as_root(
        sge: Any, job_dir: Any, evil_path: Path) -> None:
    """The hooks queue alone (the prolog asks qstat): see :func:`hostile_job`."""
    hostile_job(sge, job_dir, evil_path, "hooks")


def test_under_gecod_a_job_with_a_hostile_environment_gets_its_limit_and_runs_nothing_as_root(
        sge: Any, gecod: Any, job_dir: Any, evil_path: Path) -> None:
    """gecod with the exec() preload: see :func:`hostile_job`."""
    hostile_job(sge, job_dir, evil_path, "preload")


def hostile_job(sge: Any, job_dir: Any, evil_path: Path, deployment: str) -> None:
    """Given a job submitted with -v SGE_QMASTER_PORT=1,SGE_CELL=x,SGE_ROOT=/tmp and a
    PATH whose first directory holds the user's qstat, qmod, sh, ... and m_mem_free=200M,
    then from inside it the job sees its 200M limit (cgroup and GECO_MEMORY_LIMIT), it
    exits 0, and none of the user's binaries ran as root."""
    hostile = f"SGE_QMASTER_PORT=1,SGE_CELL=x,SGE_ROOT=/tmp,PATH={evil_path}:/usr/bin:/bin"
    name = f"hostile-{deployment}"
    # the spooled environment is what the shepherd gives the root prolog and epilog
    job = job_dir.submit(name, "-v", hostile, "-l", "m_mem_free=200M", script=(
        f'/bin/cat "$SGE_JOB_SPOOL_DIR/environment" > {name}.env\n'
        "exec /usr/bin/python3 probe.py\n"))
    [record] = sge.wait_finished(job, timeout=90)
    [report] = [r for r in job_dir.reports(name, job) if "pid" in r]
    seen = (job_dir.path / f"{name}.env").read_text().splitlines()

    # (Grid Engine itself sets SGE_ROOT and SGE_CELL, and puts $TMPDIR first in PATH)
    assert "SGE_QMASTER_PORT=1" in seen
    assert any(line.startswith("PATH=") and f":{evil_path}:" in line for line in seen)
    assert record["exit_status"] == "0"
    assert report["cgroups"]["memory"] == f"/GECO/{job}.1"
    assert int(report["memory_limit"]) == 200 * M
    assert report["env"]["GECO_MEMORY_LIMIT"] == str(200 * M)
    assert [m for m in markers(evil_path) if m.endswith(".0")] == []
    assert not no_queue_in_error(sge)
