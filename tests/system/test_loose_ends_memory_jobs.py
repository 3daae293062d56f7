"""Issue 37, point 7: gecod forgets a job once it has ended, however it ended.

Real cgroup v1 job cgroups (a fresh ``geco-test-*`` parent) and gecod's own
:class:`~geco.daemon.context.GecodContext`: each job goes in the way gecod's quarantine
records it (under the job's lock, its cgroups' identity and limits in ``ready``) and ends
the way every end does (:func:`geco.job.ending.end_job` with the context as its gate).
After many jobs have come and gone the context holds none of them, nor any lock; a job
whose cgroups are still there is kept. (gecod's RSS over 10,000 such jobs:
``bench/bench_gecod_memory.py``.)
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from geco.cgroup import Limits, V1Backend, find_hierarchies, parse_mountinfo
from geco.config import Config
from geco.daemon.context import GecodContext
from geco.job.ending import Ender, end_job
from geco.jobkey import JobKey
from geco.sge.execd import JobRef
from tests.cgroup_testkit import usable_v1_hierarchies, v1_fixtures

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]

JOBS = 40  # more jobs than a test needs to tell "forgets" from "keeps a few"
_ids = itertools.count(1)

children, backend = v1_fixtures(HIER)


def _job() -> JobKey:
    return JobKey(8_000_000 + os.getpid() % 10_000 * 100 + next(_ids), 1)


def _contained(ctx: GecodContext, key: JobKey) -> None:
    """The job's cgroups made and recorded as gecod's quarantine records a job's first
    process going in (under its lock, moves only)."""
    limits = Limits(cpus="0", mems="0", memory=64 << 20)
    ctx.backend.create(key, limits)
    with ctx.job_lock(key, moves=True):
        identity = ctx.backend.identity(key)
        assert identity is not None
        ctx.ready[key] = (identity, limits)


def _context(tmp_path: Path, backend: V1Backend) -> GecodContext:
    cfg = Config()._replace(state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool",
                            kill_timeout=5.0, strays_kill=False)
    return GecodContext(cfg, backend)


def test_ended_jobs_leave_gecods_tables(tmp_path: Path, backend: V1Backend) -> None:
    ctx = _context(tmp_path, backend)
    keys = [_job() for _ in range(JOBS)]
    for key in keys:
        _contained(ctx, key)
    assert set(ctx.ready) == set(keys)
    for key in keys:
        ended = end_job(JobRef(key.job, key.task), ctx.config, backend, Ender("gecod", ctx))
        assert ended is not None and ended.clean, key
    assert not backend.job_keys()
    # every job came and went: gecod's tables hold none of them
    assert not ctx.ready
    assert not ctx.ending
    assert not ctx._locks  # the lock table: nobody holds or waits for a lock


def test_a_job_still_there_is_kept(tmp_path: Path, backend: V1Backend) -> None:
    """A holder of the lock that leaves the cgroups in place (a prolog, a reaper round that
    found the job running) does not make gecod forget the job."""
    ctx = _context(tmp_path, backend)
    running, ended = _job(), _job()
    for key in (running, ended):
        _contained(ctx, key)
    with ctx.job_lock(running):
        pass
    end_job(JobRef(ended.job, ended.task), ctx.config, backend, Ender("gecod", ctx))
    assert set(ctx.ready) == {running}
