"""What a user can touch never steers root (issue 48, points 1 and 4; README, "What a user
can touch never steers root").

* A lock a user holds on a file they can read (their job's usage samples, the node's
  health ledgers: ``flock`` grants ``LOCK_EX`` on a read-only descriptor) stalls none
  of root's readers or writers: the holder here is a real process of another uid.
* What a user chose (a job's name, a process's comm) reaches an admin's terminal as
  text: ``geco status --job -v`` and ``geco usage`` escape it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from geco import jobfiles
from geco.config import Config
from geco.errors import CgroupError
from geco.jobkey import JobKey
from geco.node import health
from geco.reports.jobstatus import JobStatus, Process, format_table
from geco.sge.execd import JobRef
from geco.terminal import printable
from geco.usage import samples
from geco.usage.efficiency import render, report
from geco.usage.samples import Header, Sample

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root's files, another uid's lock")

NOBODY = 65534
KEY = JobKey(42, 1)
# Seconds a root step may take while the user holds the lock (it takes milliseconds; it
# would wait for ever before)
BOUND = 30.0
HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory of root's that every uid may walk (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="geco-test-stall-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@contextlib.contextmanager
def held_by_nobody(path: Path) -> Iterator[None]:
    """``path`` opened for reading and locked exclusively by a process of uid nobody,
    until the with-block ends."""
    def drop() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    holder = subprocess.Popen(["/usr/bin/python3", "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, preexec_fn=drop)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.kill()
        holder.wait(timeout=30)


def _within(step: Callable[[], object]) -> float:
    """Seconds ``step`` took, run in a thread: never more than BOUND (a test that would
    hang for ever fails instead)."""
    done = threading.Event()
    started = time.monotonic()
    def run() -> None:
        step()
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    assert done.wait(BOUND), f"still waiting after {BOUND:g} s"
    return time.monotonic() - started


def test_a_usage_file_its_reader_holds_is_read_and_written_by_root_at_once(
        shared_dir: Path) -> None:
    """Given a job's samples file readable by all (as its owner's group reads it) and held
    LOCK_EX by uid nobody, then root's read (every job end's efficiency, a slave's
    RELEASE, root's `geco usage`) and a last sample are done at once; the writers' own
    lock is root's, 0600, and nobody cannot open it."""
    d = shared_dir / "usage"
    header = Header(42, 1, owner="nobody", started=1000.0)
    samples.append(d, header, Sample(1000.0), max_samples=10)
    jobfiles.samples(d, KEY).chmod(0o644)
    with held_by_nobody(jobfiles.samples(d, KEY)):
        took = _within(lambda: samples.append(d, header, Sample(1001.0), max_samples=10,
                                              wait=1.0))
        took += _within(lambda: samples.read_job(d, KEY))
    series = samples.read(d, KEY)
    assert series is not None and [s.time for s in series.samples] == [1000.0, 1001.0]
    print(f"root's last sample and read with nobody holding the file: {took * 1000:.1f} ms")
    assert (os.stat(d / ".lock").st_mode & 0o777) == 0o600
    refused = subprocess.run(["/usr/bin/python3", "-c", f"open({str(d / '.lock')!r})"],
                             capture_output=True, text=True, user=NOBODY, group=NOBODY,
                             extra_groups=[], check=False)
    assert "PermissionError" in refused.stderr


def test_the_health_ledgers_a_user_holds_stall_no_job_start_and_no_check(
        shared_dir: Path) -> None:
    """Given the node's failure streak (0644, as earlier geco versions left it) held
    LOCK_EX by uid nobody, then root counts a failure (each job start that fails for the
    node) and `geco check` describes the streak at once."""
    cfg = Config()._replace(state_dir=shared_dir / "state", health_on_sick="journal")
    job = JobRef(7, 1, None)
    error = CgroupError("cannot create the cgroup: Read-only file system", errno="EROFS")
    health.failed(cfg, job, error)
    streak = cfg.state_dir / "health" / "streak"
    streak.chmod(0o644)
    with held_by_nobody(streak):
        took = _within(lambda: health.failed(cfg, JobRef(8, 1, None), error))
        took += _within(lambda: health.describe(cfg))
    print(f"root's count and check with nobody holding the streak: {took * 1000:.1f} ms")
    assert "2 failure(s) in a row" in health.describe(cfg)


def test_a_job_name_and_process_names_reach_the_terminal_as_text() -> None:
    """Given a job whose name, owner and processes' comms hold escape sequences, a newline
    and a bidi override, then `geco status --job -v`'s table and `geco usage`'s report
    print each as a visible escape, one line each."""
    evil = "x\x1b]0;owned\x07\nfake line\u202e"
    status = JobStatus(
        key=KEY, host="n001", owner="alice", job_name=evil, cpus="0", mems="0",
        memory_limit=1 << 30, memory_swap_limit=2 << 30, memory_current=1, memory_peak=1,
        cpu_user=0.0, cpu_system=0.0, oom_kills=0, pids_limit=4096, pids_current=1,
        pids_peak=1, pids_refused=0, processes=(Process(101, evil),), running_for=1.0,
        runtime_limit=7200.0)
    table = format_table(status, verbose=True)
    series = samples.Series(Header(42, 1, owner="alice", job_name=evil, host="n001",
                                   started=1000.0),
                            (Sample(1000.0), Sample(1060.0)))
    text = render(report(series, running=False))
    for shown in (table, text):
        assert printable(evil) in shown and "fake line" not in shown.replace(
            printable(evil), "")
        assert not [c for c in shown if (ord(c) < 32 and c != "\n") or c == "\u202e"]
    assert dataclasses.replace(status, job_name="plain").job_name == "plain"
