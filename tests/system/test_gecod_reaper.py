"""gecod's reaper and walltime backstop as a real process: real cgroup v1, real kills, journald.

gecod is started with :mod:`tests.gecodkit` (its :class:`Node` and
:func:`start_gecod`): a test directory under /tmp with a fake execd
spool tree, the cgroup parent ``geco-test-<pid>-reaper``, and here a reaper
round every second (``[gecod] reaper_interval = 1``, so cgroups are judged
once they are 2 s old), ``walltime_grace = 1``, a trace dir of its own, and
``disable_queue_on_stuck = false`` (this machine's Grid Engine is not ours to
disable). A job's processes are put into its cgroups by gecod itself
(JOB_STARTED from the job's spool dir).

qstat is a small script standing in for the qmaster: it prints what Son of
Grid Engine 8.1.9 prints for a job it does not know (the recorded
``tests/fixtures/qstat/unknown_job.xml``, exit 0) or fails as qstat does when
qmaster is down, and logs its arguments. The real qstat against a real
qmaster is ``tests/integration``'s business.

What is checked is the kernel's word (the processes' fate, the cgroup
directories) and journald's entries; what a test makes is removed with plain
syscalls afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from geco import jobfiles
from geco.jobkey import JobKey
from geco.sge import resourcefile
from tests import gecodkit
from tests.gecodkit import (
    CONTROLLERS,
    MARKS,
    Gecod,
    JobProcess,
    Node,
    end_jobs,
    logged,
    start_gecod,
    status,
)

pytestmark = MARKS

REPO = Path(__file__).resolve().parents[2]
UNKNOWN_JOB_XML = REPO / "tests" / "fixtures" / "qstat" / "unknown_job.xml"
NOBODY = 65534
INTERVAL = 1  # [gecod] reaper_interval of every gecod here
WAIT = 30.0   # seconds any single expectation may take (many rounds)
# What qstat prints when qmaster is down (the first line becomes the reason).
QMASTER_DOWN = ("error: commlib error: got select error (Connection refused)\n"
                "error: unable to send message to qmaster using port 6444 on host \"vm\": "
                "got send error\n")

_jobs = iter(range(9700, 9999))


def new_job() -> int:
    return next(_jobs)


@dataclass
class ReaperNode(Node):
    """gecodkit's node, with the [epilog] settings the reaper reads."""

    @property
    def trace_dir(self) -> Path:
        return self.base / "trace"  # what gecodkit's configuration sets (trace_keep_days 14)

    @property
    def qstat_log(self) -> Path:
        return self.base / "qstat.log"

    def write_config(self, tag: str = "gecod", sock: str | None = None, qstat: str = "",
                     kill_timeout: float | None = 5.0, **gecod: str) -> Path:
        return super().write_config(tag, sock, qstat, kill_timeout, **gecod)

    def qstat_script(self, name: str, body: str) -> str:
        """An executable qstat stand-in that logs its arguments, then runs ``body``."""
        path = self.base / name
        path.write_text(f'#!/bin/sh\necho "$*" >> {self.qstat_log}\n{body}')
        path.chmod(0o755)
        return str(path)

    def unknown_job_qstat(self) -> str:
        """Answers ``qstat -xml -j <job>`` as SGE does for a job it does not know."""
        return self.qstat_script("qstat-unknown", (
            f'sed "s|<ST_name>1</ST_name>|<ST_name>$3</ST_name>|" {UNKNOWN_JOB_XML}\n'))

    def qmaster_down_qstat(self) -> str:
        return self.qstat_script("qstat-down", f"cat >&2 <<'EOF'\n{QMASTER_DOWN}EOF\nexit 1\n")

    def qstat_calls(self) -> list[str]:
        try:
            return self.qstat_log.read_text().splitlines()
        except FileNotFoundError:
            return []

    def start(self, tag: str, qstat: str) -> Gecod:
        return start_gecod(self, tag, qstat=qstat, reaper_interval=str(INTERVAL),
                           walltime_grace="1")

    def only_in_cgroups(self, key: str, pid: int) -> bool:
        """True when ``pid`` is the one process in the job's cgroup in every controller."""
        return self.in_cgroups(key) == {c: {pid} for c in CONTROLLERS}

    def in_cgroups(self, key: str) -> dict[str, set[int]]:
        """Controller -> the pids in the job's cgroup; {} for a controller without one."""
        out = {}
        for c in CONTROLLERS:
            procs = self.cgroup(c, key) / "cgroup.procs"
            with contextlib.suppress(FileNotFoundError):
                out[c] = {int(p) for p in procs.read_text().split()}
        return out

    def join(self, key: str, pid: int) -> None:
        """Put ``pid`` into the job's cgroups with plain writes (a process gecod never saw)."""
        for c in CONTROLLERS:
            (self.cgroup(c, key) / "cgroup.procs").write_text(str(pid))

    def fake_shepherd(self, *, user: int | None = None) -> subprocess.Popen[str]:
        """A process whose comm is ``sge_shepherd`` (a copy of /bin/sleep), as root or ``user``."""
        binary = self.base / "bin" / "sge_shepherd"
        if not binary.exists():
            binary.parent.mkdir(mode=0o755, exist_ok=True)
            shutil.copy("/bin/sleep", binary)
        proc = subprocess.Popen([str(binary), "300"], text=True, user=user,
                                group=user, extra_groups=[] if user is not None else None,
                                stdin=subprocess.DEVNULL)
        self.processes.append(proc)
        return proc


def make_node(tag: str) -> contextlib.AbstractContextManager[ReaperNode]:
    """A node of its own: directory, key, and the cgroup parent ``geco-test-<pid>-<tag>``.
    Its cgroups may vanish while they are removed afterwards: a gecod may be reaping them."""
    return gecodkit.make_node(ReaperNode, tag, f"geco-test-{os.getpid()}-{tag}")


@pytest.fixture(scope="module")
def node() -> Iterator[ReaperNode]:
    """The node of the module's gecod."""
    with make_node("reaper") as n:
        yield n


@pytest.fixture
def lone_node() -> Iterator[ReaperNode]:
    """A node no other gecod reaps: the module's gecod (qstat knowing no job) would remove
    the jobs a test with another qstat wants kept."""
    with make_node("reaper-lone") as n:
        yield n


@pytest.fixture(autouse=True)
def _clean_jobs(node: ReaperNode) -> Iterator[None]:
    """After each test: its processes end, its job cgroups, spool dirs and traces go."""
    yield
    end_jobs(node)
    shutil.rmtree(node.trace_dir, ignore_errors=True)
    node.qstat_log.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def gecod(node: ReaperNode, journal: Any) -> Iterator[Gecod]:
    """One gecod for the module: a round every second, qstat knowing no job."""
    g = node.start("reaper", node.unknown_job_qstat())
    try:
        yield g
    finally:
        code = g.stop()
        assert code == 0, g.output()
        assert "Traceback" not in g.output(), g.output()


def wait_until(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.1)


def wait_logged(journal: Any, since: float, count: int = 1,
                **match: str) -> list[dict[str, Any]]:
    """Journal entries after ``since`` matching ``match``, once there are ``count`` of them."""
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        found[:] = logged(journal, since, **match)
        return len(found) >= count

    wait_until(enough, f"{count} journal entr(ies) with {match}")
    return found


def contained_job(node: ReaperNode, g: Gecod, job: int) -> JobProcess:
    """A spooled job with a resource file, and one process gecod put into its cgroups."""
    node.make_job(job)
    p = node.job_process(job, sock=g.sock)
    assert p.answer() == "OK"
    return p


def gone(proc: subprocess.Popen[Any]) -> Callable[[], bool]:
    return lambda: proc.poll() is not None


# -- gone jobs -------------------------------------------------------------------------


def test_a_job_gone_from_the_spool_and_unknown_to_qstat_is_killed_removed_and_journaled(
        node: ReaperNode, gecod: Gecod, journal: Any) -> None:
    """Given a contained job with a live process, when its spool dir disappears (the job
    ended, its epilog never ran) and qstat does not know it, then once its cgroups are
    2 s old the reaper kills the process (SIGKILL), removes its cgroups (no directory of
    the job is left in any hierarchy) and its resource file, and journals job-end and
    reaped, both CLEANED_BY reaper."""
    since = time.time()
    job = new_job()
    p = contained_job(node, gecod, job)
    contained_at = time.time()
    shutil.rmtree(node.job_dir(job))

    wait_until(gone(p.proc), f"job {job}'s process killed")
    # in every hierarchy mounted here, devices too (gecodkit's CONTROLLERS once missed it)
    wait_until(lambda: not node.job_cgroups_left(f"{job}.1"), f"job {job}'s cgroups removed")

    assert p.proc.returncode == -signal.SIGKILL
    [reaped] = wait_logged(journal, since, GECO_EVENT="reaped", JOB_ID=str(job),
                           _PID=str(gecod.pid))
    assert (reaped["SGE_TASK_ID"], reaped["KILLED"], reaped["CGROUPS_REMOVED"],
            reaped["CLEANED_BY"], reaped["PRIORITY"]) == ("1", "1", "1", "reaper", "6")
    assert reaped["REASON"] == ("not in the execd spool, and Grid Engine does not know the "
                                "job")
    [end] = logged(journal, since, GECO_EVENT="job-end", JOB_ID=str(job))
    assert (end["CLEANED_BY"], end["KILLED"]) == ("reaper", "1")
    assert int(reaped["__REALTIME_TIMESTAMP"]) >= (contained_at + 2 * INTERVAL - 0.5) * 1e6
    assert resourcefile.read(node.state_dir / "resources", JobKey(job, 1)) is None
    assert f"-xml -j {job}" in node.qstat_calls()


def test_a_job_still_in_the_spool_is_left_alone_round_after_round(
        node: ReaperNode, gecod: Gecod, journal: Any) -> None:
    """Given a contained job that is in the spool, and a second one (made after it) whose
    spool dir is gone, when the second one has been reaped -- so the reaper has judged the
    first at an age where it would reap -- and three more rounds have passed, then the
    first's process and cgroups are untouched, nothing is journaled for it, and qstat was
    never asked about it."""
    alive, witness = new_job(), new_job()
    p = contained_job(node, gecod, alive)
    w = contained_job(node, gecod, witness)
    since = time.time()
    shutil.rmtree(node.job_dir(witness))

    wait_logged(journal, since, GECO_EVENT="reaped", JOB_ID=str(witness))
    time.sleep(3 * INTERVAL)

    assert p.proc.poll() is None and w.proc.poll() is not None
    assert node.only_in_cgroups(f"{alive}.1", p.pid)
    assert logged(journal, since, JOB_ID=str(alive), _PID=str(gecod.pid)) == []
    assert [c for c in node.qstat_calls() if c.endswith(f" {alive}")] == []


def test_a_gone_job_is_kept_and_warned_about_while_qstat_fails(
        lone_node: ReaperNode, journal: Any) -> None:
    """Given a job gone from the spool and a qstat that cannot reach qmaster, then round
    after round the job's process and cgroups are kept (never kill what may run) and a
    warning names the job and qstat's error."""
    node = lone_node
    g = node.start("qstat-down", node.qmaster_down_qstat())
    try:
        since = time.time()
        job = new_job()
        p = contained_job(node, g, job)
        shutil.rmtree(node.job_dir(job))

        warnings = wait_logged(journal, since, count=2, GECO_EVENT="reaper-qstat-failed",
                               _PID=str(g.pid))

        assert p.proc.poll() is None
        assert node.only_in_cgroups(f"{job}.1", p.pid)
        assert node.qstat_calls()[:2] == [f"-xml -j {job}"] * 2
        assert {w["JOBS"] for w in warnings} == {f"{job}.1"}
        assert {w["PRIORITY"] for w in warnings} == {"4"}
        assert warnings[0]["REASON"].endswith(
            "failed 1 time(s); last: exit status 1, stderr: error: commlib error: got select "
            "error (Connection refused) (attempts=1 exit_status=1)")
        assert logged(journal, since, GECO_EVENT="reaped", JOB_ID=str(job)) == []
    finally:
        assert g.stop() == 0, g.output()


# -- walltime ----------------------------------------------------------------------------


def test_past_h_rt_and_grace_every_process_but_the_shepherd_is_killed_once(
        node: ReaperNode, gecod: Gecod, journal: Any) -> None:
    """Given a running job -- its sge_shepherd (root, moved in by JOB_STARTED from the job's
    spool dir), the job's process, and an impostor named sge_shepherd running as nobody, in
    its cgroups -- when its resource file says h_rt=2 and its spool config was written
    700 s ago (grace 1 s), then the job's process and the impostor are killed, the shepherd
    lives on in the job's cgroups (so gecod does not end the job: Grid Engine will),
    walltime-kill is journaled once (KILLED=2, H_RT, RUNNING_FOR, PRIORITY 4) and not again
    in later rounds (only the shepherd is left)."""
    since = time.time()
    job = new_job()
    key = f"{job}.1"
    node.make_job(job)
    shepherd = node.job_process(job, sock=gecod.sock, named_shepherd=True)
    assert shepherd.answer() == "OK"
    worker = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, text=True)
    node.processes.append(worker)
    impostor = node.fake_shepherd(user=NOBODY)
    node.join(key, worker.pid)
    node.join(key, impostor.pid)
    rs = resourcefile.read(node.state_dir / "resources", JobKey(job, 1))
    assert rs is not None
    resourcefile.write(node.state_dir / "resources", rs.replace(runtime_limit=2.0))
    started = time.time() - 700
    os.utime(node.job_dir(job) / "config", (started, started))

    wait_until(gone(worker), "the job's process killed")
    wait_until(gone(impostor), "the impostor killed")
    [kill] = wait_logged(journal, since, GECO_EVENT="walltime-kill", JOB_ID=str(job),
                         _PID=str(gecod.pid))
    time.sleep(3 * INTERVAL)

    assert (worker.returncode, impostor.returncode) == (-signal.SIGKILL, -signal.SIGKILL)
    assert shepherd.proc.poll() is None
    assert node.only_in_cgroups(key, shepherd.pid)
    assert (kill["KILLED"], kill["H_RT"], kill["WALLTIME_GRACE"], kill["PRIORITY"]) == \
        ("2", "2", "1", "4")
    assert 700 <= int(kill["RUNNING_FOR"]) < 700 + WAIT
    assert len(logged(journal, since, GECO_EVENT="walltime-kill", JOB_ID=str(job))) == 1


def test_sighup_turns_the_backstop_on_and_shortens_the_interval(
        lone_node: ReaperNode, journal: Any) -> None:
    """Given gecod with a round every 2 s and the walltime backstop off, and a job long past
    its h_rt, when a round has passed, then its process lives; when the configuration says
    backstop on, a round every second, and gecod gets SIGHUP, then the process is killed
    and the new interval is logged."""
    node = lone_node
    qstat = node.unknown_job_qstat()
    g = start_gecod(node, "hup", qstat=qstat, reaper_interval="2", walltime_backstop="false",
                    walltime_grace="1")
    try:
        since = time.time()
        job = new_job()
        p = contained_job(node, g, job)
        rs = resourcefile.read(node.state_dir / "resources", JobKey(job, 1))
        assert rs is not None
        resourcefile.write(node.state_dir / "resources", rs.replace(runtime_limit=2.0))
        started = time.time() - 700
        os.utime(node.job_dir(job) / "config", (started, started))
        time.sleep(3)
        assert p.proc.poll() is None

        node.write_config("hup", qstat=qstat, reaper_interval="1", walltime_backstop="true",
                          walltime_grace="1")
        g.proc.send_signal(signal.SIGHUP)

        wait_until(gone(p.proc), "the job's process killed after SIGHUP")
        wait_logged(journal, since, GECO_EVENT="walltime-kill", JOB_ID=str(job), _PID=str(g.pid))
        faster = "reaper: a round every 1 s now (was 2 s)"
        assert faster in g.output_with(faster)
    finally:
        assert g.stop() == 0, g.output()


def test_a_garbage_resource_file_is_warned_about_and_gecod_serves_on(
        node: ReaperNode, gecod: Gecod, journal: Any) -> None:
    """Given a running job whose resource file is garbage, then the reaper journals one
    warning naming the file, leaves the job alone, and gecod still answers STATUS."""
    since = time.time()
    job = new_job()
    p = contained_job(node, gecod, job)
    path = jobfiles.resource_file(node.state_dir / "resources", JobKey(job, 1))
    path.write_bytes(b"GECOResourceSet_v1{li" + str(job).encode() + b",li1,lf")

    [warning] = wait_logged(journal, since, GECO_EVENT="resource-file-unusable",
                            JOB_ID=str(job), _PID=str(gecod.pid))
    time.sleep(2 * INTERVAL)

    assert warning["PATH"] == str(path)
    assert warning["PRIORITY"] == "4"
    assert warning["MESSAGE"].startswith(f"job {job}.1: the walltime backstop cannot use the "
                                         f"resource file {path}: ")
    assert len(logged(journal, since, GECO_EVENT="resource-file-unusable",
                      JOB_ID=str(job))) == 1
    assert p.proc.poll() is None
    assert status(node, gecod.sock)["pid"] == gecod.pid


def test_without_an_h_rt_a_long_running_job_is_left_alone(
        node: ReaperNode, gecod: Gecod, journal: Any) -> None:
    since = time.time()
    job = new_job()
    p = contained_job(node, gecod, job)
    started = time.time() - 10 * 86400
    os.utime(node.job_dir(job) / "config", (started, started))
    rs = resourcefile.read(node.state_dir / "resources", JobKey(job, 1))
    assert rs is not None and rs.runtime_limit == 0  # no h_rt

    time.sleep(4 * INTERVAL)

    assert p.proc.poll() is None
    assert logged(journal, since, GECO_EVENT="walltime-kill", JOB_ID=str(job)) == []


# -- trace files -------------------------------------------------------------------------


def test_trace_files_older_than_the_keep_time_are_removed_and_newer_ones_kept(
        node: ReaperNode, gecod: Gecod, journal: Any) -> None:
    """Given trace files of 15 and 13 days (trace_keep_days = 14) and a symbolic link to an
    old file outside the trace dir, then the reaper removes the 15-day one only."""
    since = time.time()
    node.trace_dir.mkdir()
    outside = node.base / "elsewhere.trace"
    outside.write_text("keep me")
    files = {"9701.1.trace": 15, "9702.1.trace": 13}
    for name in files:
        (node.trace_dir / name).write_text(name)
    (node.trace_dir / "9703.1.trace").symlink_to(outside)
    for name, days in [*files.items(), ("elsewhere", 30)]:
        then = time.time() - days * 86400
        target = outside if name == "elsewhere" else node.trace_dir / name
        os.utime(target, (then, then))
    os.utime(node.trace_dir / "9703.1.trace", (time.time() - 30 * 86400,) * 2,
             follow_symlinks=False)

    wait_until(lambda: not (node.trace_dir / "9701.1.trace").exists(), "the old trace removed")

    assert sorted(p.name for p in node.trace_dir.iterdir()) == ["9702.1.trace", "9703.1.trace"]
    assert outside.read_text() == "keep me"
    [pruned] = wait_logged(journal, since, GECO_EVENT="traces-pruned", _PID=str(gecod.pid))
    assert pruned["COUNT"] == "1"
