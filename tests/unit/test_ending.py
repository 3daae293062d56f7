"""geco.job.ending.end_job: every way a job ends reads its resource file once, and forgets it.

A job's end needs its resource set four times over (its GPUs here, its other hosts, its
owner, and gecod's hook check); these tests count the reads of ``geco.sge.resourcefile``
on a stand-in backend, for an epilog's end, a gecod-served epilog's and the shepherd
watch's, and check what a user sees afterwards: the job's files are gone, one ``job-end``
record, and no ssh session is let in while the job's end runs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from geco import jobfiles, log
from geco.cgroup import Backend
from geco.config import Config
from geco.daemon.context import GecodContext, Shepherd
from geco.daemon.shepherdwatch import ShepherdWatch
from geco.hooks import Exit, epilog
from geco.job import ending
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import execd, resourcefile

KEY = JobKey(7001, 1)


@dataclasses.dataclass
class FakeBackend:
    """A job's cgroups that empty at the first kill; records what the end did."""

    proc: Path
    alive: set[JobKey] = dataclasses.field(default_factory=lambda: {KEY})
    calls: list[str] = dataclasses.field(default_factory=list)
    seen_ending: list[bool] = dataclasses.field(default_factory=list)
    ctx: GecodContext | None = None  # when set: whether the job was ending at its kill
    version: int = 2

    def exists(self, key: JobKey) -> bool:
        return key in self.alive

    def usage(self, key: JobKey) -> dict[str, int]:
        return {"memory_peak": 1 << 30}

    def kill(self, key: JobKey) -> int:
        self.calls.append("kill")
        if self.ctx is not None:
            self.seen_ending.append(key in self.ctx.ending)
        return 2

    def wait_empty(self, key: JobKey, timeout: float, *, kill_late: bool = False) -> bool:
        return True

    def pids(self, key: JobKey) -> list[int]:
        return []

    def destroy(self, key: JobKey) -> None:
        self.calls.append("destroy")
        self.alive.discard(key)

    def move_to_cgroups_of(self, pid: int, other: int) -> None:
        self.calls.append(f"move {pid}")


class Loop:
    """gecod's runloop as the shepherd watch uses it: a source fired by the test."""

    def __init__(self) -> None:
        self.sources: dict[int, Callable[[int, int], None]] = {}
        self.posted: list[Callable[[], None]] = []
        self.timers: list[float] = []

    def add_source(self, fd: int, events: int, callback: Callable[[int, int], None]) -> None:
        self.sources[fd] = callback

    def remove_source(self, fd: int) -> None:
        self.sources.pop(fd, None)

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        self.posted.append(callback)

    def add_timer(self, delay: float, callback: Callable[[], None]) -> None:
        self.timers.append(delay)


class Pool:
    """A pool that runs each work at once, in the caller's thread."""

    def submit_for(self, keys: object, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(fn())
        return future


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[JobKey]:
    """How often each job's resource file is read."""
    counted: Counter[JobKey] = Counter()
    real = resourcefile.read

    def read(directory: Path, key: JobKey) -> ResourceSet | None:
        counted[key] += 1
        return real(directory, key)

    monkeypatch.setattr(resourcefile, "read", read)
    return counted


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every geco record with a GECO_EVENT during the test."""
    found: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "GECO_EVENT" in getattr(record, "geco_fields", {}):
                found.append(record)

    handler = Keep(logging.DEBUG)
    logger = logging.getLogger("geco")
    old = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def node(tmp_path: Path, *hosts: str) -> Config:
    """A node whose job KEY ran on ``hosts`` (this one first), owned by a user unknown here
    (so its strays are not looked for among this machine's processes); no cluster key."""
    cfg = Config()._replace(state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool",
                            cluster_key_file=tmp_path / "no-cluster.key", kill_timeout=1.0)
    resourcefile.write(cfg.resources_dir, ResourceSet(
        KEY.job, KEY.task, owner="geco-test-nobody",
        nodes=tuple(NodeResources(h) for h in (short_hostname(), *hosts))))
    oom = cfg.state_dir / "oom" / KEY
    oom.parent.mkdir(parents=True)
    oom.write_bytes(b"geco-oom-v1 incarnation=x reported=1\n")
    return cfg


def events(records: list[logging.LogRecord]) -> list[str]:
    return [getattr(r, "geco_fields", {})["GECO_EVENT"] for r in records]


def forgotten(cfg: Config) -> bool:
    return not jobfiles.resource_file(cfg.resources_dir, KEY).exists() \
        and not (cfg.state_dir / "oom" / KEY).exists()


def test_an_epilog_end_of_a_parallel_job_reads_its_resource_file_once(
        tmp_path: Path, reads: Counter[JobKey], records: list[logging.LogRecord]) -> None:
    """Given a job of two hosts whose epilog runs (its other host cannot be asked: no
    cluster key), when the epilog ends it, then the job's resource file was read once
    (its GPUs, its other host and its owner from that one read), its cgroups are gone,
    its files forgotten, and one job-end record is journaled."""
    cfg = node(tmp_path, "other-host")
    backend = FakeBackend(tmp_path / "proc")
    spool = tmp_path / "spool" / "active_jobs" / str(KEY)
    spool.mkdir(parents=True)
    job = execd.JobRef(KEY.job, KEY.task, spool)

    code = epilog.end(job, os.getpid(), os.getpid(), cfg, log.get("epilog"),
                      cast(Backend, backend))

    assert code is Exit.OK
    assert reads[KEY] == 1
    assert backend.calls[-2:] == ["kill", "destroy"] and forgotten(cfg)
    assert events(records).count("job-end") == 1


def test_a_gecod_served_epilog_end_reads_it_once_and_refuses_logins_meanwhile(
        tmp_path: Path, reads: Counter[JobKey], records: list[logging.LogRecord]) -> None:
    """Given gecod serving a job's epilog, which read the job's resource file for its own
    check, when the epilog ends the job with gecod's gate, then the file was read that
    one time only, the job was ending (no ssh session goes in) when it was killed, and
    is no longer afterwards."""
    cfg = node(tmp_path)
    backend = FakeBackend(tmp_path / "proc")
    ctx = backend.ctx = GecodContext(cfg, cast(Backend, backend))
    rs = resourcefile.read(cfg.resources_dir, KEY)  # hookserve's own read

    epilog.end(execd.JobRef(KEY.job, KEY.task, None), os.getpid(), os.getpid(), cfg,
               log.get("epilog"), cast(Backend, backend), gate=ctx, resources=rs)

    assert reads[KEY] == 1
    assert backend.seen_ending == [True] and ctx.ending == set()
    assert forgotten(cfg) and events(records).count("job-end") == 1


def test_the_shepherd_watchs_end_reads_the_resource_file_once(
        tmp_path: Path, reads: Counter[JobKey], records: list[logging.LogRecord]) -> None:
    """Given gecod watching a job's master shepherd, when the shepherd exits, then gecod
    ends the job reading its resource file once, forgets its files, and tells the loop
    the job ended."""
    cfg = node(tmp_path)
    backend = FakeBackend(tmp_path / "proc")
    ctx = GecodContext(cfg, cast(Backend, backend))
    loop, ended = Loop(), []
    watch = ShepherdWatch(loop, ctx, Pool(), on_ended=ended.append)  # type: ignore[arg-type]
    fd = os.open(os.devnull, os.O_RDONLY)
    watch.watch(Shepherd(KEY, 4242, "all.q@here"), fd)

    loop.sources[fd](fd, 1)  # the shepherd exited
    for callback in loop.posted:
        callback()

    assert reads[KEY] == 1
    assert backend.calls == ["kill", "destroy"] and forgotten(cfg)
    assert ended == [KEY] and ctx.ending == set()
    assert loop.timers == [cfg.strays_delay]  # its owner's strays: looked for later
    assert events(records).count("job-end") == 1


def test_an_end_the_caller_takes_back_under_the_lock_does_nothing(
        tmp_path: Path, reads: Counter[JobKey]) -> None:
    """Given a job that started again before its end got the lock, when end_job runs,
    then nothing is read, killed or forgotten, and the job takes logins again."""
    cfg = node(tmp_path)
    backend = FakeBackend(tmp_path / "proc")
    ctx = GecodContext(cfg, cast(Backend, backend))

    ended = ending.end_job(execd.JobRef(KEY.job, KEY.task), cfg, cast(Backend, backend),
                           ending.Ender("gecod", ctx, lambda: False))

    assert ended is None and reads[KEY] == 0 and backend.calls == []
    assert not forgotten(cfg) and ctx.ending == set()


def test_the_job_end_record_is_written_from_what_end_job_returns(
        tmp_path: Path, records: list[logging.LogRecord]) -> None:
    """Given a job whose cgroups held a process and a stuck marker from an earlier round,
    when the reaper ends it, then its one job-end record says what the returned record
    says (who ended it, the processes killed, its figures), and the marker is forgotten
    with its other files."""
    cfg = node(tmp_path)
    backend = FakeBackend(tmp_path / "proc")
    marker = cfg.state_dir / "stuck" / KEY
    marker.parent.mkdir(parents=True)
    marker.write_text("all.q@here\n")

    ended = ending.end_job(execd.JobRef(KEY.job, KEY.task), cfg, cast(Backend, backend),
                           ending.Ender("reaper"))

    assert ended is not None and ended.clean and (ended.cleaned_by, ended.owner) == (
        "reaper", "geco-test-nobody")
    [record] = [r for r in records if events([r]) == ["job-end"]]
    figures = ended.teardown.accounting
    fields = getattr(record, "geco_fields", {})
    assert fields.items() >= {
        "JOB_ID": str(KEY.job), "SGE_TASK_ID": str(KEY.task), "GECO_EVENT": "job-end",
        "KILLED": str(ended.teardown.killed), "CLEANED_BY": "reaper",
        **{k: str(v) for k, v in figures.journal_fields().items()}}.items()
    # and seff's, from the usage samples the teardown's last one made
    assert "WALL_SEC" in fields and set(fields) - {
        "JOB_ID", "SGE_TASK_ID", "GECO_EVENT", "KILLED", "CLEANED_BY",
        *figures.journal_fields()} <= {"WALL_SEC", "CPU_EFFICIENCY", "MEMORY_EFFICIENCY",
                                       "ADVICE"}
    message = record.getMessage()
    assert message.startswith(f"job {KEY} ended: {figures.describe()}")
    assert message.endswith("; cgroups removed, 2 leftover process(es) killed")
    assert forgotten(cfg) and not marker.exists()


def test_every_record_of_an_epilogs_end_names_which_job_of_its_number_it_is(
        tmp_path: Path, records: list[logging.LogRecord],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a job whose resource file names its cluster and submission time, and an
    epilog process that knew nothing of the job before it read that file, when the
    epilog ends the job, then its job-end record says which job of its number it was."""
    cfg = node(tmp_path)
    resourcefile.write(cfg.resources_dir, ResourceSet(
        KEY.job, KEY.task, owner="geco-test-nobody", cluster="geco-test",
        submitted=1795303085.25, nodes=(NodeResources(short_hostname()),)))
    monkeypatch.setattr(log, "_instances", {})  # a fresh epilog has read nothing yet
    backend = FakeBackend(tmp_path / "proc")

    epilog.end(execd.JobRef(KEY.job, KEY.task, None), os.getpid(), os.getpid(), cfg,
               log.get("epilog"), cast(Backend, backend))

    [record] = [r for r in records if events([r]) == ["job-end"]]
    fields = getattr(record, "geco_fields", {})
    assert (fields["SGE_CLUSTER"], fields["JOB_SUBMITTED"]) == ("geco-test", "1795303085.25")
