"""gecod's reaper (geco.daemon.reaper), its decisions driven through stand-ins.

The cgroup backend, qstat and the teardown are stand-ins here: what is tested
is what the reaper decides from what they say, in which order, and what it
journals. Files it reads (spool dirs, resource files, trace files) and the
ages it judges by are real files in ``tmp_path``. The real thing -- a gecod
process, real cgroups, real processes killed -- is ``tests/system/test_gecod_reaper.py``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from geco import jobfiles
from geco.accounting import Accounting
from geco.cgroup import Backend
from geco.config import Config
from geco.daemon import reaper
from geco.daemon.reaper import Reaper, RoundReport, Verdict
from geco.errors import (
    CgroupError,
    GecoError,
    JobNotFound,
    QstatError,
    QstatParseError,
    TaskNotRunning,
)
from geco.job import teardown
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import execd, resourcefile

HOST = "n001"
OLD = 3600.0  # seconds: a cgroup this old is judged


# -- stand-ins ------------------------------------------------------------------


class FakeBackend:
    """Job cgroups as plain directories (their mtime is their age), processes as a list."""

    version = 1

    def __init__(self, root: Path) -> None:
        self.root = root
        self.members: dict[str, list[int]] = {}
        self.killed: list[tuple[str, Callable[[int], bool]]] = []
        self.broken: set[str] = set()  # keys whose pids() fails (vanished mid-round)

    def add(self, key: str, age: float = OLD, pids: tuple[int, ...] = ()) -> None:
        for d in self.paths(key).values():
            d.mkdir(parents=True)
            then = time.time() - age
            os.utime(d, (then, then))
        self.members[key] = list(pids)

    def remove(self, key: str) -> None:
        for d in self.paths(key).values():
            d.rmdir()
        self.members.pop(key, None)

    def paths(self, key: str) -> dict[str, Path]:
        return {c: self.root / c / key for c in ("cpuset", "memory")}

    last_changed = Backend.last_changed  # the real rule, on these directories

    def job_keys(self) -> list[JobKey]:
        return sorted(map(JobKey.parse, self.members), key=JobKey.order)

    def exists(self, key: str) -> bool:
        return any(d.is_dir() for d in self.paths(key).values())

    def pids(self, key: str) -> list[int]:
        if key in self.broken:
            raise CgroupError(f"cannot read the processes of job {key}", key=key)
        return list(self.members.get(key, []))

    def kill_except(self, key: str, spare: Callable[[int], bool]) -> int:
        self.killed.append((key, spare))
        victims = [p for p in self.members.get(key, []) if not spare(p)]
        self.members[key] = [p for p in self.members.get(key, []) if spare(p)]
        return len(victims)


class ImmediateExecutor(concurrent.futures.Executor):
    """Runs each submitted call at once, in the caller's thread."""

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any,
               **kwargs: Any) -> concurrent.futures.Future[Any]:
        self.submitted += 1
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


class FakeLoop:
    """Records timers; runs posted callbacks when asked."""

    def __init__(self) -> None:
        self.timers: list[FakeTimer] = []
        self.posted: list[Callable[[], None]] = []

    def add_timer(self, delay: float, callback: Callable[[], None],
                  repeat: float | None = None) -> FakeTimer:
        timer = FakeTimer(delay, callback, repeat)
        self.timers.append(timer)
        return timer

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        self.posted.append(callback)

    def run_posted(self) -> None:
        for callback in self.posted:
            callback()
        self.posted.clear()

    def live(self) -> list[tuple[float, float | None]]:
        return [(t.delay, t.repeat) for t in self.timers if not t.cancelled]


@dataclasses.dataclass
class FakeTimer:
    delay: float
    callback: Callable[[], None]
    repeat: float | None
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Qstat:
    """Stands in for geco.sge.qstat.fetch: an answer per job, every call recorded."""

    def __init__(self, answer: Callable[[int, int], ResourceSet]) -> None:
        self.answer = answer
        self.calls: list[tuple[int, int]] = []

    def __call__(self, job: int, task: int, cfg: Config, pe_hostfile: Path | None) -> ResourceSet:
        assert pe_hostfile is None
        self.calls.append((job, task))
        return self.answer(job, task)


def unknown(job: int, task: int) -> ResourceSet:
    raise JobNotFound(f"Grid Engine does not know job {job} (finished, deleted or never "
                      "submitted)", job=job)


def running_on(host: str) -> Callable[[int, int], ResourceSet]:
    return lambda job, task: ResourceSet(job, task, nodes=(NodeResources(host),))


def failing(job: int, task: int) -> ResourceSet:
    raise QstatError("/usr/bin/qstat -xml -j 1 failed 1 time(s); last: exit status 1, "
                     "stderr: error: commlib error: can't connect to service", attempts=1)


@dataclasses.dataclass
class Teardowns:
    """Stands in for geco.job.teardown.tear_down: removes the fake cgroups unless told stuck."""

    backend: FakeBackend
    stuck: set[str] = dataclasses.field(default_factory=set)
    error: str = ""
    calls: list[tuple[str, str | None, str, bool]] = dataclasses.field(default_factory=list)

    def __call__(self, key: str, backend: Any, cfg: Config, *, queue_instance: str | None,
                 cleaned_by: str, **facts: object) -> teardown.Teardown:
        assert backend is self.backend
        self.calls.append((key, queue_instance, cleaned_by, cfg.disable_queue_on_stuck))
        killed = len(self.backend.members.get(key, []))
        if key in self.stuck:
            left = (teardown.StuckProcess(pid=4242, state="D (disk sleep)", command="dd",
                                          wchan="nfs_wait", cgroup=""),)
            return teardown.Teardown(key, killed, left, Accounting(), None)
        if self.error:
            return teardown.Teardown(key, killed, (), Accounting(), None, self.error)
        self.backend.remove(key)
        return teardown.Teardown(key, killed, (), Accounting(), None)


@dataclasses.dataclass
class Node:
    """One test's node: configuration, backend, stand-ins, and the reaper over them."""

    cfg: Config
    backend: FakeBackend
    qstat: Qstat
    teardowns: Teardowns
    loop: FakeLoop
    executor: ImmediateExecutor
    reaper: Reaper
    reaped: list[str]
    now: list[float]

    def spool(self, key: str, config_age: float = 0.0) -> Path:
        d = self.cfg.execd_spool_dir / HOST / "active_jobs" / key
        d.mkdir(parents=True)
        (d / "config").write_text("job_owner=alice\n")
        then = time.time() - config_age
        os.utime(d / "config", (then, then))
        return d

    def resources(self, key: str, runtime_limit: float = 0.0) -> Path:
        job, task = map(int, key.split("."))
        return resourcefile.write(self.cfg.resources_dir, ResourceSet(
            job, task, runtime_limit=runtime_limit, nodes=(NodeResources(HOST),)))

    def oom_state(self, key: str) -> Path:
        path = self.cfg.state_dir / "oom" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"geco-oom-v1 incarnation=x reported=1\n")
        return path

    def round(self) -> RoundReport:
        report = self.reaper.run_round()
        self.loop.run_posted()
        return report


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    cfg = Config()._replace(
        state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool",
        trace_dir=tmp_path / "trace", gecod_reaper_interval=300.0,
        gecod_walltime_grace=600.0)
    (tmp_path / "spool" / HOST / "active_jobs").mkdir(parents=True)
    backend = FakeBackend(tmp_path / "cgroup")
    qstat = Qstat(unknown)
    teardowns = Teardowns(backend)
    monkeypatch.setattr(teardown, "tear_down", teardowns)
    loop, executor = FakeLoop(), ImmediateExecutor()
    reaped: list[str] = []
    now = [time.time()]
    r = Reaper(loop, backend, cfg, executor, node=HOST, clock=lambda: now[0],  # type: ignore[arg-type]
               fetch=qstat, on_reaped=reaped.append)
    return Node(cfg, backend, qstat, teardowns, loop, executor, r, reaped, now)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every record the geco loggers emit during the test (journal fields included)."""
    found: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found.append(record)

    handler = Keep(logging.DEBUG)
    root = logging.getLogger("geco")
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield found
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def journaled(records: list[logging.LogRecord], event: str) -> list[logging.LogRecord]:
    return [r for r in records if fields(r).get("GECO_EVENT") == event]


def fields(record: logging.LogRecord) -> dict[str, str]:
    return dict(getattr(record, "geco_fields", {}))


# -- the minimum age ----------------------------------------------------------------


@pytest.mark.parametrize(("interval", "age"), [(300.0, 60.0), (30.0, 60.0), (10.0, 20.0),
                                               (1.0, 2.0)])
def test_cgroups_are_judged_after_a_minute_or_two_rounds_when_rounds_are_closer(
        interval: float, age: float) -> None:
    assert reaper.min_age(interval) == age


# -- alive or gone ------------------------------------------------------------------


def test_given_a_job_in_the_execd_spool_then_it_is_alive_and_qstat_is_not_asked(
        node: Node) -> None:
    node.backend.add("7.1", pids=(100,))
    node.spool("7.1")

    report = node.round()

    assert report.verdicts == {"7.1": Verdict.ALIVE}
    assert node.qstat.calls == [] and node.teardowns.calls == []
    assert node.backend.exists("7.1")


def test_given_a_job_spooled_under_another_host_name_then_it_is_alive(node: Node) -> None:
    """Grid Engine may spell the host with its domain (host_aliases): execd.find_spool_dir's
    rule."""
    node.backend.add("7.1")
    (node.cfg.execd_spool_dir / f"{HOST}.cluster" / "active_jobs" / "7.1").mkdir(parents=True)

    assert node.round().verdicts == {"7.1": Verdict.ALIVE}
    assert node.qstat.calls == []


def test_given_no_spool_dir_and_an_unknown_job_then_it_is_torn_down_journaled_and_forgotten(
        node: Node, records: list[logging.LogRecord]) -> None:
    """Given job 8.2's cgroups (an hour old, 2 processes), no spool dir, and qstat saying
    <unknown_jobs>, when a round runs, then tear_down runs once for 8.2 (no queue instance
    known, cleaned_by reaper), a reaped record says why with KILLED=2, its resource file and
    OOM count file are gone, and the loop is told."""
    node.backend.add("8.2", pids=(100, 101))
    resource_file = node.resources("8.2")
    count_file = node.oom_state("8.2")

    report = node.round()

    assert report.verdicts == {"8.2": Verdict.GONE}
    assert report.reaped == ("8.2",) and report.stuck == ()
    assert node.qstat.calls == [(8, 2)]
    assert node.teardowns.calls == [("8.2", None, "reaper", True)]
    [record] = journaled(records, "reaped")
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "job 8.2 no longer runs on this node (not in the execd spool, and Grid Engine does "
        "not know the job): its cgroups were removed, 2 leftover process(es) killed")
    assert fields(record) == {"JOB_ID": "8", "SGE_TASK_ID": "2", "GECO_EVENT": "reaped",
                              "KILLED": "2", "CGROUPS_REMOVED": "1", "CLEANED_BY": "reaper",
                              "REASON": "not in the execd spool, and Grid Engine does not "
                                        "know the job"}
    assert not resource_file.exists() and not count_file.exists()
    assert node.reaped == ["8.2"]


def not_running(job: int, task: int) -> ResourceSet:
    raise TaskNotRunning(f"job {job} has no running task (it is pending, or ending)", job=job)


@pytest.mark.parametrize(("answer", "reason"), [
    (not_running, "not in the execd spool, and qstat says the task is not running"),
    (running_on("n002.cluster"),
     f"not in the execd spool, and qstat says the task runs on n002.cluster, not on {HOST}"),
], ids=["task-not-running", "runs-elsewhere"])
def test_given_qstat_says_the_task_does_not_run_here_then_it_is_gone(
        node: Node, records: list[logging.LogRecord],
        answer: Callable[[int, int], ResourceSet], reason: str) -> None:
    node.backend.add("9.1")
    node.qstat.answer = answer

    assert node.round().verdicts == {"9.1": Verdict.GONE}
    [record] = journaled(records, "reaped")
    assert fields(record)["REASON"] == reason


def test_given_qstat_says_the_task_runs_on_this_host_then_it_is_alive(node: Node) -> None:
    """A parallel job's slave node may have no spool dir between its qrsh -inherit tasks."""
    node.backend.add("10.1")
    node.qstat.answer = running_on(f"{HOST}.cluster")

    assert node.round().verdicts == {"10.1": Verdict.ALIVE}
    assert node.teardowns.calls == []


def test_given_a_young_cgroup_without_spool_dir_then_qstat_is_not_asked_until_it_is_a_minute_old(
        node: Node) -> None:
    node.backend.add("11.1", age=0.0)

    assert node.round().verdicts == {"11.1": Verdict.YOUNG}
    assert node.qstat.calls == []
    node.now[0] += 61
    assert node.round().verdicts == {"11.1": Verdict.GONE}


def test_given_qstat_failing_then_every_undecided_job_is_kept_and_one_warning_names_them(
        node: Node, records: list[logging.LogRecord]) -> None:
    """Given two old cgroups without spool dirs and a qstat that cannot reach qmaster, when
    a round runs, then qstat is asked once (not once per job), both are kept (never kill
    what may run), and one warning names them and the reason."""
    node.backend.add("12.1", pids=(100,))
    node.backend.add("13.1", pids=(101,))
    node.qstat.answer = failing

    report = node.round()

    assert report.verdicts == {"12.1": Verdict.UNKNOWN, "13.1": Verdict.UNKNOWN}
    assert node.qstat.calls == [(12, 1)]
    assert node.teardowns.calls == []
    assert node.backend.exists("12.1") and node.backend.exists("13.1")
    [warning] = journaled(records, "reaper-qstat-failed")
    reason = ("/usr/bin/qstat -xml -j 1 failed 1 time(s); last: exit status 1, stderr: error: "
              "commlib error: can't connect to service (attempts=1)")
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (f"reaper: qstat failed ({reason}); keeping the cgroups of "
                                    "2 job(s) without a spool dir until qstat answers: 12.1 "
                                    "13.1")
    assert (fields(warning)["REASON"], fields(warning)["JOBS"]) == (reason, "12.1 13.1")
    assert report.qstat_error == reason


def test_given_qstat_answering_nonsense_then_the_job_is_kept(node: Node) -> None:
    node.backend.add("14.1")

    def nonsense(job: int, task: int) -> ResourceSet:
        raise QstatParseError("qstat -xml -j output is empty; expected XML")

    node.qstat.answer = nonsense
    assert node.round().verdicts == {"14.1": Verdict.UNKNOWN}
    assert node.teardowns.calls == []


def test_given_a_job_back_in_the_spool_by_the_time_qstat_answered_then_it_is_left_alone(
        node: Node) -> None:
    """A job re-run (qmod -rj) and dispatched here again while qstat was being asked."""
    node.backend.add("15.1")

    def redispatched(job: int, task: int) -> ResourceSet:
        node.spool("15.1")
        raise TaskNotRunning("job 15 has no running task")

    node.qstat.answer = redispatched
    node.round()
    assert node.teardowns.calls == []
    assert node.backend.exists("15.1")


def test_given_the_spool_root_missing_then_a_warning_says_so_and_qstat_decides(
        node: Node, records: list[logging.LogRecord]) -> None:
    node.cfg = node.cfg._replace(execd_spool_dir=node.cfg.state_dir / "nope")
    node.reaper.reconfigure(node.cfg)
    node.backend.add("16.1")

    assert node.round().verdicts == {"16.1": Verdict.GONE}
    node.backend.add("16.2")
    node.round()
    [warning] = journaled(records, "reaper-no-spool")  # once, not every round
    assert warning.getMessage() == (
        f"reaper: the execd spool dir {node.cfg.execd_spool_dir} does not exist ([paths] "
        "execd_spool_dir); every job is judged by qstat alone")


# -- stuck cgroups -----------------------------------------------------------------


def test_given_a_cgroup_that_cannot_be_emptied_then_it_is_retried_every_round_until_clean(
        node: Node, records: list[logging.LogRecord]) -> None:
    """Given a gone job whose process is stuck in the kernel, when three rounds run, then
    each round tears it down again (tear_down itself disables the queue once) and journals
    one reaped warning with the stuck pid, and its files stay until it is clean."""
    node.backend.add("17.1", pids=(4242,))
    node.teardowns.stuck.add("17.1")
    resource_file = node.resources("17.1")

    reports = [node.round() for _ in range(3)]

    assert [r.stuck for r in reports] == [("17.1",)] * 3
    assert node.teardowns.calls == [("17.1", None, "reaper", True)] * 3
    warnings = journaled(records, "reaped")
    assert [w.levelno for w in warnings] == [logging.WARNING] * 3
    assert [fields(w)["RETRY"] for w in warnings] == ["0", "1", "1"]
    assert (fields(warnings[0])["PIDS"], fields(warnings[0])["STATES"]) == \
        ("4242", "4242:D:nfs_wait")
    assert fields(warnings[0])["CGROUPS_REMOVED"] == "0"
    assert warnings[0].getMessage() == (
        "job 17.1 no longer runs on this node (not in the execd spool, and Grid Engine does "
        "not know the job), but process(es) 4242 cannot be killed; its cgroups are kept and "
        "tried again in 300 s")
    assert resource_file.exists() and node.reaped == []

    node.teardowns.stuck.clear()
    assert node.round().reaped == ("17.1",)
    assert not resource_file.exists() and node.reaped == ["17.1"]


def test_given_cgroups_the_kernel_will_not_remove_then_the_reason_is_journaled(
        node: Node, records: list[logging.LogRecord]) -> None:
    node.backend.add("27.1")
    node.teardowns.error = "cannot remove the cgroup of job 27.1: Device or resource busy"

    assert node.round().stuck == ("27.1",)
    [warning] = journaled(records, "reaped")
    assert "PIDS" not in fields(warning)
    assert warning.getMessage() == (
        "job 27.1 no longer runs on this node (not in the execd spool, and Grid Engine does "
        "not know the job), but its cgroups cannot be removed (cannot remove the cgroup of "
        "job 27.1: Device or resource busy); its cgroups are kept and tried again in 300 s")


def test_given_a_cgroup_removed_by_the_epilog_while_qstat_was_asked_then_no_teardown_runs(
        node: Node) -> None:
    node.backend.add("18.1")

    def late_epilog(job: int, task: int) -> ResourceSet:
        node.backend.remove("18.1")
        return unknown(job, task)

    node.qstat.answer = late_epilog
    node.round()
    assert node.teardowns.calls == [] and node.reaped == []


def test_given_one_job_failing_mid_round_then_the_others_are_still_looked_at(
        node: Node, records: list[logging.LogRecord]) -> None:
    """A cgroup vanishing while its processes are read (CgroupError) costs that job this
    round only."""
    node.backend.add("19.1", pids=(100,))
    node.backend.add("20.1", pids=(101,))
    for key in ("19.1", "20.1"):
        node.spool(key, config_age=OLD)
        node.resources(key, runtime_limit=60)
    node.backend.broken.add("19.1")

    report = node.round()

    assert report.walltime_killed == (("20.1", 1),)
    [warning] = journaled(records, "reaper-job-failed")
    assert warning.getMessage() == ("reaper: job 19.1 skipped this round: cannot read the "
                                    "processes of job 19.1 (key=19.1)")


def test_a_round_that_fails_as_a_whole_is_logged_and_returns_an_empty_report(
        node: Node, records: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[str]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(node.backend, "job_keys", broken)
    assert node.round() == RoundReport({})
    [error] = journaled(records, "reaper-round-failed")
    assert error.getMessage() == "reaper round failed; the next one comes in 300 s"
    assert error.exc_info is not None


# -- walltime ---------------------------------------------------------------------------


def test_given_a_job_past_h_rt_plus_grace_then_all_but_the_shepherd_are_killed_and_journaled(
        node: Node, records: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a spooled job with h_rt=2 whose config was written 700 s ago and grace 1 s,
    with processes 100 (its shepherd) and 101, 102, when a round runs, then kill_except
    spares what is_job_shepherd keeps, 2 are killed, and walltime-kill is journaled at
    warning with KILLED, H_RT, RUNNING_FOR."""
    node.reaper.reconfigure(node.cfg._replace(gecod_walltime_grace=1.0))
    monkeypatch.setattr(execd, "is_job_shepherd", lambda pid: pid == 100)
    node.backend.add("21.1", pids=(100, 101, 102))
    node.spool("21.1", config_age=700)
    node.resources("21.1", runtime_limit=2)
    node.now[0] = time.time()

    report = node.round()

    assert report.walltime_killed == (("21.1", 2),)
    assert node.backend.members["21.1"] == [100]
    [record] = journaled(records, "walltime-kill")
    assert record.levelno == logging.WARNING
    got = fields(record)
    assert (got["KILLED"], got["H_RT"], got["WALLTIME_GRACE"]) == ("2", "2", "1")
    assert 700 <= int(got["RUNNING_FOR"]) <= 701
    assert record.getMessage() == (
        f"job 21.1 has run {got['RUNNING_FOR']} s, past its h_rt of 2 s plus the 1 s grace: "
        "killed 2 process(es) Grid Engine did not end (its sge_shepherd is spared to end the "
        "job)")

    # only the shepherd is left: nothing more to kill, nothing more journaled
    assert node.round().walltime_killed == ()
    assert len(journaled(records, "walltime-kill")) == 1


@pytest.mark.parametrize(("h_rt", "config_age", "backstop"), [
    (0.0, 10 * OLD, True),     # no h_rt
    (3600.0, 3000.0, True),    # within h_rt
    (3600.0, 4000.0, True),    # past h_rt, within the grace (600 s)
    (2.0, 10 * OLD, False),    # backstop off
], ids=["no-h_rt", "within-h_rt", "within-grace", "backstop-off"])
def test_given_a_job_within_its_walltime_or_the_backstop_off_then_nothing_is_killed(
        node: Node, h_rt: float, config_age: float, backstop: bool) -> None:
    node.reaper.reconfigure(node.cfg._replace(gecod_walltime_backstop=backstop))
    node.backend.add("22.1", pids=(101,))
    node.spool("22.1", config_age=config_age)
    node.resources("22.1", runtime_limit=h_rt)

    assert node.round().walltime_killed == ()
    assert node.backend.killed == []


def test_without_a_spool_config_the_resource_files_mtime_is_the_start(tmp_path: Path) -> None:
    spool, resource_file = tmp_path / "spool", tmp_path / "42.1"
    spool.mkdir()
    assert execd.job_started(spool, resource_file) is None
    resource_file.write_text("x")
    os.utime(resource_file, (1000.0, 1000.0))
    assert execd.job_started(spool, resource_file) == 1000.0
    assert execd.job_started(None, resource_file) == 1000.0
    (spool / "config").write_text("x")
    os.utime(spool / "config", (2000.0, 2000.0))
    assert execd.job_started(spool, resource_file) == 2000.0


def test_given_a_garbage_resource_file_then_one_warning_names_it_until_it_changes(
        node: Node, records: list[logging.LogRecord]) -> None:
    node.backend.add("23.1", pids=(101,))
    node.spool("23.1", config_age=OLD)
    path = node.resources("23.1", runtime_limit=2)
    path.write_bytes(b"GECOResourceSet_v1{li23,li1,lf2")

    node.round()
    node.round()
    [warning] = journaled(records, "resource-file-unusable")
    assert fields(warning)["PATH"] == str(path)
    assert warning.getMessage() == (
        f"job 23.1: the walltime backstop cannot use the resource file {path}: expected ',' "
        f"after the walltime limit at byte 31, got end of input (offset=31 expected=',' "
        f"path={path}); write it again from qstat with: geco rsrcinfo -j 23.1 -s {path}")
    assert node.backend.killed == []

    path.write_bytes(b"garbage, longer than before")
    node.round()
    assert len(journaled(records, "resource-file-unusable")) == 2


# -- trace files ----------------------------------------------------------------------


def age_file(path: Path, days: float, *, link: bool = False) -> None:
    then = time.time() - days * 86400
    os.utime(path, (then, then), follow_symlinks=not link)


def test_trace_files_older_than_the_keep_time_are_removed_and_nothing_else(
        tmp_path: Path) -> None:
    """Given a trace dir with an old and a new trace, an old non-trace file, an old
    directory named like a trace, and an old symbolic link to an old trace outside, when
    pruned with 14 days, then only the old trace is gone."""
    traces, outside = tmp_path / "trace", tmp_path / "outside"
    traces.mkdir()
    outside.mkdir()
    for name, days in (("1.1.trace", 15), ("2.1.trace", 13), ("notes.txt", 30)):
        (traces / name).write_text(name)
        age_file(traces / name, days)
    (traces / "3.1.trace").mkdir()
    age_file(traces / "3.1.trace", 30)
    (outside / "9.1.trace").write_text("not in the trace dir")
    age_file(outside / "9.1.trace", 30)
    (traces / "4.1.trace").symlink_to(outside / "9.1.trace")
    age_file(traces / "4.1.trace", 30, link=True)

    assert reaper.prune_traces(traces, 14) == 1

    assert sorted(p.name for p in traces.iterdir()) == ["2.1.trace", "3.1.trace", "4.1.trace",
                                                        "notes.txt"]
    assert (outside / "9.1.trace").read_text() == "not in the trace dir"


def test_keep_days_0_keeps_every_trace_and_a_missing_dir_is_nothing_to_do(
        tmp_path: Path) -> None:
    (tmp_path / "1.1.trace").write_text("x")
    age_file(tmp_path / "1.1.trace", 1000)
    assert reaper.prune_traces(tmp_path, 0) == 0
    assert (tmp_path / "1.1.trace").exists()
    assert reaper.prune_traces(tmp_path / "missing", 14) == 0


def test_a_trace_dir_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "1.1.trace").write_text("x")
    age_file(real / "1.1.trace", 100)
    (tmp_path / "trace").symlink_to(real)

    with pytest.raises(GecoError) as info:
        reaper.prune_traces(tmp_path / "trace", 14)
    assert str(info.value) == (
        "the trace directory must not be a symbolic link (geco follows none), got one to "
        f"{real} (path={tmp_path / 'trace'})")
    assert (real / "1.1.trace").exists()


def test_a_round_prunes_traces_and_journals_how_many(
        node: Node, records: list[logging.LogRecord]) -> None:
    node.cfg.trace_dir.mkdir()
    (node.cfg.trace_dir / "1.1.trace").write_text("x")
    age_file(node.cfg.trace_dir / "1.1.trace", 15)

    assert node.round().traces_removed == 1
    [record] = journaled(records, "traces-pruned")
    assert record.getMessage() == (f"reaper: removed 1 trace file(s) older than 14 day(s) "
                                   f"from {node.cfg.trace_dir}")


# -- the timer --------------------------------------------------------------------------


def test_start_arms_a_first_round_soon_and_then_one_every_interval(node: Node) -> None:
    node.reaper.start()
    assert node.loop.live() == [(reaper.FIRST_ROUND_DELAY, None), (300.0, 300.0)]


def test_an_interval_shorter_than_the_first_delay_is_the_only_timer(node: Node) -> None:
    node.reaper.reconfigure(node.cfg._replace(gecod_reaper_interval=1.0))
    node.reaper.start()
    assert node.loop.live() == [(1.0, 1.0)]


def test_a_new_interval_from_sighup_re_arms_the_timer_and_close_stops_it(node: Node) -> None:
    node.reaper.start()
    node.reaper.reconfigure(node.cfg._replace(gecod_reaper_interval=60.0))
    assert node.loop.live() == [(reaper.FIRST_ROUND_DELAY, None), (60.0, 60.0)]
    node.reaper.reconfigure(node.reaper.cfg._replace(gecod_walltime_grace=5.0))
    assert len(node.loop.timers) == 3  # nothing re-armed for another setting
    node.reaper.close()
    assert node.loop.live() == []


def test_a_tick_submits_a_round_and_skips_while_the_previous_one_runs(
        node: Node, records: list[logging.LogRecord]) -> None:
    """Given a round still running, when two ticks come, then neither submits a round and
    one info line says so; once it ended, the next tick submits again."""
    node.reaper.start()
    tick = node.loop.timers[1].callback
    tick()
    assert (node.executor.submitted, node.reaper.rounds) == (1, 1)

    pending: concurrent.futures.Future[RoundReport] = concurrent.futures.Future()
    node.reaper._round = pending
    tick()
    tick()
    assert node.executor.submitted == 1
    busy = [r.getMessage() for r in records if "still running" in r.getMessage()]
    assert busy == ["reaper: the previous round is still running; ticks are skipped until it "
                    "ends"]
    pending.set_result(RoundReport({}))
    tick()
    assert node.executor.submitted == 2


def test_after_close_a_tick_submits_nothing_and_a_running_round_stops_at_the_next_job(
        node: Node) -> None:
    node.backend.add("24.1")
    node.backend.add("25.1")

    def close_meanwhile(job: int, task: int) -> ResourceSet:
        node.reaper.close()
        return unknown(job, task)

    node.qstat.answer = close_meanwhile
    report = node.round()
    assert list(report.verdicts) == ["24.1"]  # 25.1 was not looked at
    node.loop.timers.clear()
    node.reaper._tick()
    assert node.executor.submitted == 0


def test_a_tick_after_the_executor_shut_down_is_ignored(node: Node) -> None:
    executor = concurrent.futures.ThreadPoolExecutor(1)
    executor.shutdown()
    node.reaper.executor = executor
    node.reaper._tick()  # no RuntimeError
    assert node.reaper.rounds == 0



# -- the files of jobs gone without their end --------------------------------------


def test_the_files_a_job_outlived_are_forgotten_by_a_round_and_no_others(
        node: Node, records: list[logging.LogRecord]) -> None:
    """Given files a job's end forgets, left by jobs without cgroups here: 9.1's resource
    file, OOM count and stuck marker (an hour old, no spool dir), 9.2's GPU picks alone (an
    hour old, in the spool: its resource file removed by hand), 9.3's resource file of a
    moment ago, 9.4's resource file an hour old in the spool, and 9.5's with cgroups; when
    a round runs, then 9.1's and 9.2's files are gone, one record each, and the others
    are kept."""
    def made(path: Path, age: float) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
        os.utime(path, (time.time() - age, time.time() - age))
        return path

    cfg = node.cfg
    gone = [made(jobfiles.resource_file(cfg.resources_dir, JobKey(9, 1)), OLD),
            made(jobfiles.oom_count(cfg.state_dir, JobKey(9, 1)), OLD),
            made(jobfiles.stuck_marker(cfg.state_dir, JobKey(9, 1)), OLD),
            made(jobfiles.gpu_picks(cfg.resources_dir, JobKey(9, 2)), OLD)]
    node.spool("9.2")
    kept = [made(jobfiles.resource_file(cfg.resources_dir, JobKey(9, 3)), 1.0),
            made(jobfiles.resource_file(cfg.resources_dir, JobKey(9, 4)), OLD),
            made(jobfiles.resource_file(cfg.resources_dir, JobKey(9, 5)), OLD)]
    node.spool("9.4")
    node.backend.add("9.5", pids=(100,))
    node.spool("9.5")

    node.round()

    assert [p for p in gone if p.exists()] == [] and all(p.exists() for p in kept)
    assert sorted(fields(r)["JOB_ID"] + "." + fields(r)["SGE_TASK_ID"]
                  for r in journaled(records, "resource-file-pruned")) == ["9.1", "9.2"]
