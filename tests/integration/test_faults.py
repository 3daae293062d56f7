"""Faults on the real Grid Engine: a node's trouble gives a defined outcome, never a lost job.

Each test breaks one thing a node depends on while real jobs start and end, and asserts
what a user and an admin see afterwards: every job ran once contained (or waits
re-queued), no core was given to two jobs at once, nothing of a job is left, no queue
instance is in error state, and the journal says what happened in one clear entry.

1. the qmaster stopped while a job's prolog is about to ask it (a queue whose prolog
   waits at a gate, then runs geco's): the job is re-queued and runs, with its memory
   limit, once the qmaster is back;
2. the state directory full, then read-only (a small tmpfs of the test's, named in the
   site configuration): the job runs contained, or is re-queued until the directory is
   usable again, with one clear journaled error and no traceback;
3. gecod killed with SIGKILL at random moments while 50 short jobs start and end (the
   exec() preload deployment: gecod alone contains and tears down), restarted each time;
4. a resource file that turns to garbage: before the job's shepherd starts, and while
   the job runs: read again from qstat, and journaled.

Tests 1 and 2 run on execd without the preload (the hooks alone); 3 and 4 with it (the
module's ``gecod`` fixture, which the first of them starts). pytest runs them in this
order. ``GECO_TEST_SEED`` repeats test 3's kill moments.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.livekit import no_queue_in_error, site_settings, wait_until
from tests.integration.soakkit import RESOURCES, Batch, sh

pytestmark = pytest.mark.sge

M = 1 << 20
LIBEXEC = Path("/usr/libexec/geco")
PROLOG = f"root@{LIBEXEC}/prolog $job_id $ja_task_id"
EPILOG = f"root@{LIBEXEC}/epilog $job_id $ja_task_id"
STARTER = str(LIBEXEC / "starter")
SPOOL = Path("/var/spool/gridengine")
QMASTER_PID = SPOOL / "qmaster" / "qmaster.pid"
SYSTEMD = Path("/run/systemd/system")
PROBE = "exec /usr/bin/python3 probe.py\n"


def accounting(sge: Any, job: int) -> list[tuple[str, str]]:
    """``(failed, exit_status)`` of every record of the job (a re-queued start has one too)."""
    return [(r.get("failed", "?"), r.get("exit_status", "?")) for r in sge.accounting(job)]


def probe_starts(job_dir: Any, name: str, job: int) -> list[dict[str, Any]]:
    """What probe.py reported from inside the job at its start (one per process)."""
    return [r for r in job_dir.reports(name, job) if "cgroups" in r]


def tracebacks(journal: Any, job: int) -> list[str]:
    """The job's journal messages that carry a Python traceback."""
    return [e["MESSAGE"] for e in journal.entries(JOB_ID=str(job))
            if "Traceback" in str(e.get("MESSAGE", ""))]


# ---------------------------------------------------------------------------
# 1. the qmaster stopped at a job's start
# ---------------------------------------------------------------------------

def qmaster_pid() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        pid = int(QMASTER_PID.read_text().strip())
        if Path(f"/proc/{pid}/comm").read_text().strip() == "sge_qmaster":
            return pid
    return None


def start_qmaster() -> None:
    """Start sge_qmaster the way integration/sge/setup.sh does, and wait until it answers."""
    if SYSTEMD.is_dir():
        sh(["systemctl", "start", "sgemaster.service"])
    else:
        subprocess.run(["setsid", "/usr/sbin/sge_qmaster"], cwd="/", check=True, timeout=60,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    wait_until(lambda: sh(["qconf", "-sh"], check=False).returncode == 0, 90,
               "sge_qmaster to answer qconf")


@contextlib.contextmanager
def qmaster_stopped() -> Iterator[None]:
    """The qmaster shut down (``qconf -km``) for the block, started again afterwards."""
    pid = qmaster_pid()
    assert pid is not None, "no sge_qmaster runs"
    sh(["qconf", "-km"])
    try:
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 60, "sge_qmaster to exit")
        yield
    finally:
        if qmaster_pid() is None:
            start_qmaster()


@pytest.fixture
def gated_queue(sge: Any, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A queue whose prolog (root) waits until ``<dir>/open`` exists, then runs geco's; it
    touches ``<dir>/waiting.<job>`` while it waits. Returns the queue and the dir."""
    gate = Path(tempfile.mkdtemp(prefix="geco-test-gate-"))
    wrapper = gate / "prolog"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'touch "{gate}/waiting.$1"\n'
        "i=0\n"
        f'while [ ! -e "{gate}/open" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n'
        # what qstat says of the job at each start (shown when the test fails)
        f'qstat -xml -j "$1" > "{gate}/qstat.$1.$$" 2>&1\n'
        f'exec {LIBEXEC}/prolog "$@"\n')
    wrapper.chmod(0o755)
    try:
        with sge.temporary_queue("geco-test-gated.q", prolog=f"root@{wrapper} $job_id "
                                 "$ja_task_id", epilog=EPILOG, starter_method=STARTER,
                                 slots="1") as queue:
            yield queue, gate
    finally:
        shutil.rmtree(gate, ignore_errors=True)


def test_a_job_whose_start_finds_the_qmaster_stopped_is_requeued_and_runs_once_it_is_back(
        sge: Any, job_dir: Any, journal: Any, gated_queue: tuple[str, Path]) -> None:
    """Given a job with m_mem_free=150M whose prolog is about to ask qstat, when the qmaster
    has been stopped just then, then the prolog re-queues the job (no queue instance in
    error state, the job not held in error), and once the qmaster is back the job runs
    with its memory limit: never without it."""
    queue, gate = gated_queue
    # one qstat try: the prolog gives up on the stopped qmaster at once, not after ~7 s
    settings = {("qstat", "retries"): 0, ("qstat", "timeout"): 10.0}
    with site_settings(settings):
        job = job_dir.submit("qmdown", "-q", queue, "-l", "m_mem_free=150M", script=PROBE)
        wait_until(lambda: (gate / f"waiting.{job}").exists(), 60, "the job's prolog")
        with qmaster_stopped():
            (gate / "open").touch()
            # the prolog has met the stopped qmaster
            journal.wait_for(60, JOB_ID=str(job), GECO_EVENT="prolog-done")
        try:
            records = sge.wait_finished(job, timeout=150)
        except RuntimeError as exc:
            seen = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}"
                             for p in sorted(gate.glob(f"qstat.{job}.*")))
            pytest.fail(f"{exc}\nqstat -xml -j {job} at each start of the prolog:\n{seen}")
    reports = probe_starts(job_dir, "qmdown", job)

    assert no_queue_in_error(sge) == {}
    assert [r["exit_status"] for r in records if r["failed"] == "0"] == ["0"], records
    assert len(records) >= 2, f"the job was not re-queued: {records}"
    assert len(reports) == 1, reports
    assert reports[0]["cgroups"]["memory"] == f"/GECO/{job}.1"
    assert int(reports[0]["memory_limit"]) == 150 * M
    assert tracebacks(journal, job) == []


# ---------------------------------------------------------------------------
# 2. the state directory full, then read-only
# ---------------------------------------------------------------------------

@pytest.fixture
def small_state_dir() -> Iterator[Path]:
    """A 256 KiB tmpfs of its own (``/run/geco-test-state-<pid>``), unmounted afterwards."""
    path = Path(f"/run/geco-test-state-{os.getpid()}")
    path.mkdir(mode=0o755, exist_ok=True)
    sh(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "geco-test-state", str(path)])
    try:
        yield path
    finally:
        sh(["umount", "-l", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.rmdir()


def fill(directory: Path) -> None:
    """Write ``<directory>/filler`` until the file system is full."""
    with contextlib.suppress(OSError), (directory / "filler").open("wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def test_a_full_or_read_only_state_directory_gives_a_contained_or_requeued_job_and_one_error(
        sge: Any, job_dir: Any, journal: Any, small_state_dir: Path) -> None:
    """Given the site's state_dir on a file system that is full, when a job with
    m_mem_free=150M starts, then it runs contained with its limit and the journal names the
    problem (No space left on device) once. Given it read-only, the job's start either runs
    it contained or re-queues it with one journaled error naming the directory and the
    cause (a job put back in the queue, never run uncontained). No traceback anywhere, no
    queue instance in error state."""
    cores_lock = small_state_dir / "cores.lock"
    with site_settings({("paths", "state_dir"): str(small_state_dir)}):
        fill(small_state_dir)
        full = job_dir.submit("full", "-q", sge.queue, "-l", "m_mem_free=150M", script=PROBE)
        [full_record] = sge.wait_finished(full, timeout=90)
        full_errors = [e for e in journal.entries(JOB_ID=str(full))
                       if int(e.get("PRIORITY", 6)) <= 4]

        (small_state_dir / "filler").unlink()
        cores_lock.touch()
        sh(["mount", "-o", "remount,ro", str(small_state_dir)])
        readonly = job_dir.submit("readonly", "-q", sge.queue, "-l", "m_mem_free=150M",
                                  script=PROBE)
        [done] = journal.wait_for(90, JOB_ID=str(readonly), GECO_EVENT="prolog-done")
        # Grid Engine's record of how that start ended; a re-queued job would start again
        # only a minute or more later (Grid Engine's pace, not geco's): deleted instead
        wait_until(lambda: bool(sge.accounting(readonly)), 60, "the start's record")
        pending = sge.is_known(readonly)
        sh(["qdel", "-f", str(readonly)], check=False)
        [record] = sge.accounting(readonly)
        refused = journal.entries(JOB_ID=str(readonly), GECO_EVENT="prolog-failed")

    [full_report] = probe_starts(job_dir, "full", full)
    assert full_record["exit_status"] == "0"
    assert full_report["cgroups"]["memory"] == f"/GECO/{full}.1"
    assert int(full_report["memory_limit"]) == 150 * M
    assert len(full_errors) == 1, [e["MESSAGE"] for e in full_errors]
    assert "No space left on device" in full_errors[0]["MESSAGE"]
    assert str(small_state_dir) in full_errors[0]["MESSAGE"]

    if done["EXIT_STATUS"] == "0":  # ran contained after all
        [report] = probe_starts(job_dir, "readonly", readonly)
        assert report["cgroups"]["memory"] == f"/GECO/{readonly}.1"
        assert int(report["memory_limit"]) == 150 * M
    else:  # re-queued, saying why in one error
        assert done["EXIT_STATUS"] == "99"
        assert pending
        assert record["failed"].startswith("25"), record  # "25 : rescheduling"
        [error] = refused
        assert error["PRIORITY"] == "3"
        assert "Read-only file system" in error["MESSAGE"], error["MESSAGE"]
        assert str(small_state_dir) in error["MESSAGE"]
        assert error["MESSAGE"].endswith("re-queueing the job")
        assert probe_starts(job_dir, "readonly", readonly) == []

    assert tracebacks(journal, full) == tracebacks(journal, readonly) == []
    assert "Traceback" not in job_dir.output("full", full, stream="e")
    assert "Traceback" not in (job_dir.path / f"readonly.e{readonly}").read_text()
    assert no_queue_in_error(sge) == {}


# ---------------------------------------------------------------------------
# 3. gecod killed at random moments while 50 jobs start and end
# ---------------------------------------------------------------------------

FAULT_TASKS = 50
MAX_KILLS = 8


class Killer(threading.Thread):
    """SIGKILLs gecod after a random 0.3-3 s, restarts it at once, again and again (at most
    ``MAX_KILLS`` times) until told to stop."""

    def __init__(self, gecod: Any, seed: int) -> None:
        super().__init__(daemon=True)
        self.gecod = gecod
        self.rng = random.Random(seed)
        self.done = threading.Event()
        self.kills: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while len(self.kills) < MAX_KILLS and not self.done.wait(self.rng.uniform(0.3, 3)):
                self.gecod.kill9()
                self.kills.append(time.time())
                self.gecod.start()
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.fixture
def preload_queue(sge: Any) -> Iterator[str]:
    """The exec() preload deployment's queue: geco's starter, no prolog or epilog."""
    with sge.temporary_queue("geco-test-faults.q", prolog="NONE", epilog="NONE",
                             starter_method=STARTER, slots="2") as queue:
        yield queue


def test_gecod_killed_at_random_moments_while_fifty_jobs_run_loses_no_containment(
        sge: Any, gecod: Any, job_dir: Any, journal: Any, preload_queue: str) -> None:
    """Given the preload deployment (gecod contains each job at its shepherd's exec and
    tears it down when the shepherd exits), when gecod is killed with SIGKILL at random
    moments and restarted at once while 50 short job tasks (serial jobs and array tasks)
    start and end, then every task ran in its job's cgroups, no two jobs held a core at the
    same time, and after the last restart no job cgroup, resource file or process of the
    jobs is left, and no queue instance or job is in error state. (A job Grid Engine
    re-queued because its start met no gecod is fine once it ran contained.)"""
    seed = int(os.environ.get("GECO_TEST_SEED", time.time_ns() % 2**32))
    with site_settings({("gecod", "reaper_interval"): 1.0}, gecod):
        batch = Batch(sge, job_dir, preload_queue, "killed")
        killer = Killer(gecod, seed)
        killer.start()
        try:
            kinds = ["serial", "serial", "array"]
            while batch.task_count() < FAULT_TASKS:
                batch.submit(kinds[len(batch.jobs) % len(kinds)])
            held = batch.wait(timeout=150)
        finally:
            killer.done.set()
            killer.join(timeout=60)
        found = batch.check(journal)

    assert killer.error is None, f"seed {seed}: {killer.error!r}"
    assert killer.kills, f"seed {seed}: the jobs ended before gecod was killed once"
    assert batch.task_count() == FAULT_TASKS
    assert held == [], f"seed {seed}"
    assert found.problems() == {}, f"seed {seed}, kills at {killer.kills}"
    assert sum(found.tasks.values()) == FAULT_TASKS, f"seed {seed}"


# ---------------------------------------------------------------------------
# 4. a resource file that turns to garbage
# ---------------------------------------------------------------------------

GARBAGE = b"GECOResourceSet_v1{li\xff\xfe garbage"


def resource_file_of(job: int) -> Path:
    return RESOURCES / f"{job}.1"


def test_a_corrupt_resource_file_before_the_shepherd_starts_is_read_again_from_qstat(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given garbage in a held job's resource file, when the job is released and its
    shepherd starts, then gecod journals that it ignores the unusable file (naming it),
    asks qstat, and the job runs contained with its memory limit; no traceback, no queue
    instance in error state."""
    job = job_dir.submit("early", "-q", sge.queue, "-h", "-l", "m_mem_free=150M",
                         script=PROBE)
    RESOURCES.mkdir(parents=True, exist_ok=True)
    resource_file_of(job).write_bytes(GARBAGE)
    sh(["qrls", str(job)])
    [record] = sge.wait_finished(job, timeout=90)
    [report] = probe_starts(job_dir, "early", job)
    warnings = [e for e in journal.entries(JOB_ID=str(job)) if e.get("PRIORITY") == "4"
                and "unusable resource file" in e.get("MESSAGE", "")]

    assert record["exit_status"] == "0"
    assert report["cgroups"]["memory"] == f"/GECO/{job}.1"
    assert int(report["memory_limit"]) == 150 * M
    assert [w["SYSLOG_IDENTIFIER"] for w in warnings] == ["gecod"], warnings
    assert str(resource_file_of(job)) in warnings[0]["MESSAGE"]
    assert tracebacks(journal, job) == []
    assert not resource_file_of(job).exists()
    assert no_queue_in_error(sge) == {}


def test_a_resource_file_corrupted_while_the_job_runs_is_read_again_and_journaled(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given a running two-slot job (-pe mpi 2) whose resource file turns to garbage, when a
    second process of the job joins it (qrsh -inherit) and gecod's reaper looks at the
    running job, then the file is written again from qstat (it names the job again), the
    journal names the unusable file once, the task runs in the job's cgroups, and the job
    ends with nothing left and no queue instance in error state."""
    script = ('/usr/bin/python3 probe.py\n'
              'while [ ! -e go.$JOB_ID ]; do sleep 0.1; done\n'
              'qrsh -inherit "$HOSTNAME" /usr/bin/python3 "$PWD/probe.py"\n'
              'while [ ! -e end.$JOB_ID ]; do sleep 0.1; done\n')
    with site_settings({("gecod", "reaper_interval"): 1.0}, gecod):
        job = job_dir.submit("late", "-q", sge.queue, "-pe", "mpi", "2",
                             "-l", "m_mem_free=100M", script=script)
        out = job_dir.path / f"late.o{job}"
        wait_until(lambda: out.exists() and "cgroups" in out.read_text(), 90,
                   "the job's first report")
        since = time.time()
        resource_file_of(job).write_bytes(GARBAGE)
        (job_dir.path / f"go.{job}").touch()
        wait_until(lambda: out.read_text().count('"cgroups"') == 2, 60, "the task's report")
        wait_until(lambda: resource_file_of(job).read_bytes().startswith(
            f"GECOResourceSet_v1{{li{job},".encode()), 15,
            "the resource file to be written again")
        noticed = [e for e in journal.entries(since, JOB_ID=str(job))
                   if e.get("GECO_EVENT", "").startswith("resource-file-")]
        (job_dir.path / f"end.{job}").touch()
        [record] = sge.wait_finished(job, timeout=90)
    reports = probe_starts(job_dir, "late", job)

    assert record["exit_status"] == "0"
    assert len(reports) == 2
    for report in reports:
        assert report["cgroups"]["memory"] == f"/GECO/{job}.1"
    assert [e["GECO_EVENT"] for e in noticed] == ["resource-file-rewritten"], noticed
    assert str(resource_file_of(job)) in noticed[0]["MESSAGE"]
    assert tracebacks(journal, job) == []
    assert not resource_file_of(job).exists()
    assert no_queue_in_error(sge) == {}
