"""gecod samples every running job, the job's end adds the last sample, `geco usage` reads them.

A real gecod (:mod:`tests.gecodkit`: real cgroup v1, journald) sampling every 0.2 s; the
job's shepherd is a process named sge_shepherd that gecod contains, so its exit ends the
job through gecod's own teardown. `geco usage` runs as the job's owner (the test user,
whose primary group is theirs alone) and as nobody.
"""

from __future__ import annotations

import fcntl
import grp
import json
import os
import subprocess
import sys
import time
from typing import Any

from geco.jobkey import JobKey
from geco.usage import samples
from tests.gecodkit import (
    MARKS,
    REPO,
    MiB,
    Node,
    new_job,
    start_gecod,
    wait_gone,
    with_unit_capabilities,
)
from tests.gecodkit import _clean_jobs as _clean_jobs  # after each test, on this module's node
from tests.gecodkit import node as node  # this module's node

pytestmark = MARKS

NOBODY = 65534
WAIT = 60.0
USAGE = "[usage]\ninterval = 0.2\nmax_samples = 16\n"


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT:g} s: {what}"
        time.sleep(0.05)


def _geco_usage(node: Node, config: str, job: int, uid: int, gid: int,
                groups: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    def drop() -> None:
        os.setgroups(list(groups))
        os.setgid(gid)
        os.setuid(uid)

    return subprocess.run([sys.executable, "-m", "geco.cli", "usage", str(job), "--json"],
                          cwd="/", capture_output=True, text=True, timeout=WAIT,
                          preexec_fn=drop,
                          env={"PYTHONPATH": str(REPO), "GECO_CONFIG": config,
                               "PATH": "/usr/bin:/bin"})


def _count(node: Node, key: JobKey) -> int:
    series = samples.read(node.state_dir / "usage", key)
    return len(series.samples) if series else 0


def _sampled_job(node: Node, g: Any, owner: Any, count: int) -> tuple[int, JobKey, Any]:
    """A job of ``owner`` contained by gecod ``g`` (its shepherd), once it has ``count``
    samples."""
    job = new_job()
    key = JobKey(job, 1)
    node.make_job(job, owner=owner.name)
    shepherd = node.job_process(job, sock=g.sock, named_shepherd=True)
    assert shepherd.answer() == "OK"
    _until(lambda: _count(node, key) >= count, f"{count} samples")
    return job, key, shepherd


def test_a_running_job_is_sampled_and_its_owner_alone_reads_what_it_used(
        node: Node, job_owner: Any) -> None:
    """Given gecod sampling every 0.2 s and a job of the test user contained, then its
    samples file grows, bounded (16 samples at most), `geco usage` as its owner reports it
    running with its grant (1 core, 256M) and what it used, as nobody it says the job is
    not theirs to read (exit 1, one line); when the shepherd exits, gecod's teardown adds
    the last sample and the report says ended."""
    g = start_gecod(node, "usage", sections=USAGE)
    config = node.base / "usage.toml"
    try:
        job, key, shepherd = _sampled_job(node, g, job_owner, 10)
        assert _count(node, key) <= 16

        mine = _geco_usage(node, str(config), job, job_owner.uid, job_owner.gid)
        assert mine.returncode == 0, mine.stderr
        [doc] = json.loads(mine.stdout)
        assert (doc["job"], doc["owner"], doc["running"]) == (str(key), job_owner.name, True)
        assert (doc["cores"], doc["memory_requested"]) == (1, 256 * MiB)
        assert doc["memory_peak"] > 0 and doc["cpu_seconds"] >= 0, doc

        theirs = _geco_usage(node, str(config), job, NOBODY, NOBODY)
        assert (theirs.returncode, theirs.stdout) == (1, "")
        assert theirs.stderr == (f"geco usage: job {key}'s usage is not yours to read "
                                 f"({node.state_dir / 'usage' / key})\n")

        before = samples.read(node.state_dir / "usage", key)
        assert before is not None
        shepherd.exit()
        wait_gone(node, str(key))
        after = samples.read(node.state_dir / "usage", key)
        assert after is not None and after.samples[-1].time > before.samples[-1].time
        ended = _geco_usage(node, str(config), job, job_owner.uid, job_owner.gid)
        assert ended.returncode == 0 and json.loads(ended.stdout)[0]["running"] is False
    finally:
        assert g.stop() == 0, g.output()


def test_the_groups_the_config_names_read_every_jobs_usage_and_no_other_user_does(
        node: Node, job_owner: Any) -> None:
    """Given [usage] readers = ["staff"], when a job of the test user is sampled, then
    nobody as a member of staff reads its report, nobody without it is refused in one line,
    and the owner still reads it."""
    g = start_gecod(node, "usage-readers", sections=USAGE + 'readers = ["staff"]\n')
    config = node.base / "usage-readers.toml"
    staff = grp.getgrnam("staff").gr_gid
    try:
        job, key, shepherd = _sampled_job(node, g, job_owner, 2)

        support = _geco_usage(node, str(config), job, NOBODY, NOBODY, groups=(staff,))
        assert support.returncode == 0, support.stderr
        assert json.loads(support.stdout)[0]["owner"] == job_owner.name
        other = _geco_usage(node, str(config), job, NOBODY, NOBODY)
        assert (other.returncode, other.stdout) == (1, ""), other.stderr
        assert "is not yours to read" in other.stderr
        mine = _geco_usage(node, str(config), job, job_owner.uid, job_owner.gid)
        assert mine.returncode == 0, mine.stderr
        shepherd.exit()
        wait_gone(node, str(key))
    finally:
        assert g.stop() == 0, g.output()


def test_a_job_whose_file_its_owner_holds_locked_is_sampled_all_the_same(
        node: Node, job_owner: Any) -> None:
    """Given two jobs sampled and the owner of one holding its samples file locked
    exclusively (flock grants LOCK_EX on a descriptor open for reading), then both jobs'
    samples keep coming and gecod still answers: its writers lock a file no user opens."""
    g = start_gecod(node, "usage-lock", sections=USAGE)
    try:
        held, free = new_job(), new_job()
        for job in (held, free):
            node.make_job(job, owner=job_owner.name)
            assert node.job_process(job, sock=g.sock).answer() == "OK"
        _until(lambda: _count(node, JobKey(held, 1)) >= 1, "the held job's first sample")
        with open(node.state_dir / "usage" / f"{held}.1", "rb") as reader:
            fcntl.flock(reader, fcntl.LOCK_EX)
            count, held_count = _count(node, JobKey(free, 1)), _count(node, JobKey(held, 1))
            _until(lambda: _count(node, JobKey(free, 1)) >= count + 5 and
                   _count(node, JobKey(held, 1)) >= held_count + 5, "both jobs sampled on")
        assert "no usage sample" not in g.output()
    finally:
        assert g.stop() == 0, g.output()


def test_with_only_the_units_capabilities_gecod_gives_the_file_to_its_owners_group(
        node: Node, job_owner: Any) -> None:
    """Given gecod with only conf/gecod.service's CapabilityBoundingSet (setpriv), when it
    samples a job of the test user, then the file is root's with the user's private group,
    mode 0640 (giving a file a group root is not in takes CAP_CHOWN: the unit grants it)."""
    g = start_gecod(node, "usage-caps", prefix=with_unit_capabilities(), sections=USAGE)
    try:
        job = new_job()
        node.make_job(job, owner=job_owner.name)
        assert node.job_process(job, sock=g.sock).answer() == "OK"
        _until(lambda: _count(node, JobKey(job, 1)) >= 1, "a sample")
        st = (node.state_dir / "usage" / f"{job}.1").stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, job_owner.gid, 0o640)
        assert "no usage sample" not in g.output()
    finally:
        assert g.stop() == 0, g.output()
