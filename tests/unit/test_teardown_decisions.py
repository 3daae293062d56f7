"""geco.job.teardown's decisions and records, on a stand-in backend, a fake /proc and a fake qmod.

The kernel side (real cgroups, real stuck processes, journald) is in
tests/system/test_teardown.py; here every branch a real machine rarely
shows: a removal the kernel refuses with no process left, qmod failing,
hanging or missing, the once-per-job queue marker, and the /proc readers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from geco import procfs
from geco.accounting import Accounting
from geco.cgroup import Backend, check_key
from geco.config import Config
from geco.errors import CgroupError
from geco.job.ending import Ender, end_job
from geco.job.teardown import StuckProcess, Teardown, tear_down
from geco.resourceset import short_hostname
from geco.sge import execd
from geco.sge.execd import JobRef
from geco.sge.siteenv import discover
from tests.logkit import RecordingHandler, handler_on
from tests.qmodkit import recording_qmod

# the site's fixed PATH of root's Grid Engine commands on this machine (geco.sge.siteenv)
SAFE_PATH = discover(Config()).path
USAGE = {"memory_peak": 3 << 30, "oom_kill": 1, "cpu_user_usec": 12_345_678,
         "cpu_system_usec": 400_000}


@dataclasses.dataclass
class FakeBackend:
    """What tear_down uses of a backend, with the answers a test sets."""

    proc: Path
    exists_: bool = True
    left: list[int] = dataclasses.field(default_factory=list)
    killed: int = 3
    destroy_error: CgroupError | None = None
    where: str | None = "stuck"
    calls: list[str] = dataclasses.field(default_factory=list)
    version: int = 2  # no v1 freezer to ask whether the sub-cgroup is frozen

    def exists(self, key: str) -> bool:
        return self.exists_

    def usage(self, key: str) -> dict[str, int]:
        self.calls.append("usage")
        return dict(USAGE)

    def kill(self, key: str) -> int:
        self.calls.append("kill")
        return self.killed

    def wait_empty(self, key: str, timeout: float, *, kill_late: bool = False) -> bool:
        self.calls.append(f"wait {timeout:g}")
        return not self.left

    def pids(self, key: str) -> list[int]:
        return list(self.left)

    def destroy(self, key: str) -> None:
        self.calls.append("destroy")
        if self.destroy_error is not None:
            raise self.destroy_error

    def relative_cgroup(self, key: str, pid: int) -> str | None:
        return self.where


def fake_proc(tmp_path: Path, pid: int, state: str, comm: str, wchan: str) -> Path:
    proc = tmp_path / "proc"
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_bytes(f"Name:\t{comm}\nUmask:\t0022\nState:\t{state}\nTgid:\t{pid}\n"
                               .encode())
    (d / "comm").write_bytes(comm.encode() + b"\n")
    (d / "wchan").write_bytes(wchan.encode())
    (proc / "stat").write_bytes(b"cpu  1 2 3 4\nbtime 1000\nprocesses 9\n")
    return proc


class Records(RecordingHandler):
    """The records of the teardown and of the job's end (its ``job-end``), whatever the geco
    logger's own setup."""

    def events(self) -> list[tuple[str, str, dict[str, str]]]:
        """(level, message, journal fields) of each record that names a GECO_EVENT."""
        out = []
        for r in self.records:
            fields = dict(getattr(r, "geco_fields", {}))
            if "GECO_EVENT" in fields:
                out.append((r.levelname, r.getMessage(), fields))
        return out


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    with handler_on("geco.job.teardown", handler), handler_on("geco.job.ending", handler):
        yield handler


@pytest.fixture
def qmod(tmp_path: Path) -> tuple[Path, Path]:
    """A qmod stand-in that records its arguments (one line per run) and succeeds."""
    return recording_qmod(tmp_path)


def cfg(tmp_path: Path, **changes: Any) -> Config:
    return Config()._replace(**{"state_dir": tmp_path / "state", "kill_timeout": 2.0,
                                            "qstat_timeout": 5.0, **changes})


def backend_of(fake: FakeBackend) -> Backend:
    return cast(Backend, fake)


def end(key: str, fake: FakeBackend, config: Config, *, cleaned_by: str,
        queue_instance: str | None) -> Teardown:
    """End the job as every caller does (geco.job.ending.end_job, which journals job-end),
    with no resource set and no spool, and no look for strays."""
    job = check_key(key)
    ended = end_job(JobRef(job.job, job.task, config.state_dir / "no-spool"), config,
                    backend_of(fake), Ender(cleaned_by, queue_instance=queue_instance),
                    resources=None)
    assert ended is not None
    return ended.teardown


def stuck_backend(tmp_path: Path) -> FakeBackend:
    return FakeBackend(fake_proc(tmp_path, 4242, "D (disk sleep)", "nfs-reader",
                                 "nfs_wait_bit_killable"), left=[4242])


# -- a clean end --------------------------------------------------------------


def test_given_a_job_that_empties_then_its_counters_are_read_first_and_job_end_is_journaled(
        tmp_path: Path, records: Records, qmod: tuple[Path, Path]) -> None:
    fake = FakeBackend(tmp_path)
    result = end("42.1", fake, cfg(tmp_path), queue_instance="all.q@n1", cleaned_by="epilog")
    accounting = Accounting.from_usage(USAGE)
    assert result == Teardown("42.1", 3, (), accounting, None)
    assert result.clean
    assert fake.calls == ["usage", "kill", "wait 2", "destroy"]
    [(level, message, fields)] = records.events()
    assert level == "INFO" and message.startswith(f"job 42.1 ended: {accounting.describe()}")
    assert message.endswith("; cgroups removed, 3 leftover process(es) killed")
    assert fields.items() >= {
        "JOB_ID": "42", "SGE_TASK_ID": "1", "GECO_EVENT": "job-end", "KILLED": "3",
        "CLEANED_BY": "epilog",
        **{k: str(v) for k, v in accounting.journal_fields().items()}}.items()
    assert {"MEMORY_PEAK", "OOM_KILLS", "CPU_USER_SEC", "CPU_SYSTEM_SEC", "WALL_SEC"} \
        <= set(fields)
    assert not qmod[1].exists()


def test_given_no_cgroups_then_the_end_is_journaled_without_figures(
        tmp_path: Path, records: Records) -> None:
    fake = FakeBackend(tmp_path, exists_=False)
    result = end("42.2", fake, cfg(tmp_path), queue_instance=None, cleaned_by="epilog")
    assert result == Teardown("42.2", 0, (), Accounting(), None, had_cgroups=False)
    assert fake.calls == []
    assert records.events() == [("INFO", "job 42.2 ended: it has no cgroups on this node",
                                 {"JOB_ID": "42", "SGE_TASK_ID": "2", "GECO_EVENT": "job-end",
                                  "KILLED": "0", "CLEANED_BY": "epilog"})]


def test_given_a_bad_key_then_it_is_refused_before_anything_is_touched(tmp_path: Path) -> None:
    fake = FakeBackend(tmp_path)
    with pytest.raises(CgroupError) as err:
        tear_down("../42", backend_of(fake), cfg(tmp_path), queue_instance=None,
                  cleaned_by="epilog")
    assert str(err.value) == ("a job cgroup key must be <job>.<task> in decimal digits "
                              "without leading zeros (e.g. 42.1), got '../42'")
    assert fake.calls == []


# -- stuck --------------------------------------------------------------------


def test_given_a_process_that_does_not_die_then_it_is_reported_and_the_queue_disabled(
        tmp_path: Path, records: Records, qmod: tuple[Path, Path]) -> None:
    fake = stuck_backend(tmp_path)
    result = tear_down("42.1", backend_of(fake), cfg(tmp_path), queue_instance="all.q@n1",
                       cleaned_by="reaper", qmod=str(qmod[0]))
    stuck = StuckProcess(4242, "D (disk sleep)", "nfs-reader", "nfs_wait_bit_killable", "stuck")
    assert result == Teardown("42.1", 3, (stuck,), Accounting.from_usage(USAGE), "all.q@n1")
    assert not result.clean
    assert "destroy" not in fake.calls
    assert qmod[1].read_text() == "-d all.q@n1\n"
    assert records.events() == [
        ("ERROR", "job 42.1: 1 process(es) still alive 2 s after SIGKILL: pid 4242 (nfs-reader) "
                  "D (disk sleep) in nfs_wait_bit_killable, cgroup stuck; cgroups kept, "
                  "gecod's reaper tries again",
         {"JOB_ID": "42", "SGE_TASK_ID": "1", "GECO_EVENT": "cleanup-stuck", "PIDS": "4242",
          "STATES": "4242:D:nfs_wait_bit_killable", "KILLED": "3", "CLEANED_BY": "reaper"}),
        ("ERROR", "job 42.1: disabled the queue instance all.q@n1 (qmod -d) so that no new job "
                  "starts on this node while processes of this job cannot be killed; enable it "
                  "again with qmod -e all.q@n1 once the node is healthy",
         {"JOB_ID": "42", "SGE_TASK_ID": "1", "GECO_EVENT": "queue-disabled",
          "QUEUE_INSTANCE": "all.q@n1", "CLEANED_BY": "reaper"})]


def test_given_no_queue_instance_then_every_queue_on_this_host_is_disabled(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    result = tear_down("42.1", backend_of(stuck_backend(tmp_path)), cfg(tmp_path),
                       queue_instance=None, cleaned_by="reaper", qmod=str(qmod[0]))
    assert result.queue_disabled == f"*@{short_hostname()}"
    assert qmod[1].read_text() == f"-d *@{short_hostname()}\n"


def test_given_the_jobs_hostile_environment_then_qmod_runs_with_the_sites(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The epilog inherits the job's environment (qsub -v): qmod, found next to the
    configured qstat, gets the site's SGE_* and PATH (geco.sge.siteenv), none of the job's."""
    (tmp_path / "bin").mkdir()
    dump = tmp_path / "qmod.env"
    (tmp_path / "bin" / "qmod").write_text(f"#!/bin/sh\nenv > {dump}\n")
    (tmp_path / "bin" / "qmod").chmod(0o755)
    for name, value in {"SGE_ROOT": "/tmp", "SGE_CELL": "x", "SGE_QMASTER_PORT": "1",
                        "PATH": "/tmp/evil", "LD_PRELOAD": "/tmp/evil.so"}.items():
        monkeypatch.setenv(name, value)
    config = cfg(tmp_path, qstat=str(tmp_path / "bin" / "qstat"))
    result = tear_down("42.1", backend_of(stuck_backend(tmp_path)), config,
                       queue_instance="all.q@n1", cleaned_by="epilog")
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert result.queue_disabled == "all.q@n1"
    assert {k: v for k, v in env.items() if k.startswith("SGE_")} == discover(config).values
    assert (env["PATH"], "LD_PRELOAD" in env) == (SAFE_PATH, False)


def test_given_queue_disabling_off_then_qmod_is_not_run(
        tmp_path: Path, records: Records, qmod: tuple[Path, Path]) -> None:
    result = tear_down("42.1", backend_of(stuck_backend(tmp_path)),
                       cfg(tmp_path, disable_queue_on_stuck=False), queue_instance="all.q@n1",
                       cleaned_by="epilog", qmod=str(qmod[0]))
    assert (result.clean, result.queue_disabled) == (False, None)
    assert not qmod[1].exists()
    assert [e[2]["GECO_EVENT"] for e in records.events()] == ["cleanup-stuck"]


def test_given_a_stuck_job_torn_down_again_then_the_queue_is_disabled_only_once(
        tmp_path: Path, records: Records, qmod: tuple[Path, Path]) -> None:
    """An admin who looked and enabled the queue again is not overruled every reaper round;
    once the job's cgroups are gone, its marker goes too."""
    fake = stuck_backend(tmp_path)
    config = cfg(tmp_path)
    marker = config.state_dir / "stuck" / "42.1"
    first = tear_down("42.1", backend_of(fake), config, queue_instance="all.q@n1",
                      cleaned_by="epilog", qmod=str(qmod[0]))
    assert marker.read_text() == "all.q@n1\n"
    second = tear_down("42.1", backend_of(fake), config, queue_instance=None,
                       cleaned_by="reaper", qmod=str(qmod[0]))
    assert (first.queue_disabled, second.queue_disabled) == ("all.q@n1", None)
    assert qmod[1].read_text() == "-d all.q@n1\n"
    assert records.records[-1].getMessage() == (
        f"job 42.1: the queue instance all.q@n1 was disabled for it already ({marker}); "
        "not again")
    fake.left.clear()
    assert end("42.1", fake, config, queue_instance=None, cleaned_by="reaper").clean
    assert not marker.exists()


def test_given_a_marker_from_before_the_boot_then_the_queue_is_disabled_again(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    config = cfg(tmp_path)
    marker = config.state_dir / "stuck" / "42.1"
    marker.parent.mkdir(parents=True)
    marker.write_text("all.q@old\n")
    os.utime(marker, (procfs.boot_time() - 60, procfs.boot_time() - 60))
    result = tear_down("42.1", backend_of(stuck_backend(tmp_path)), config,
                       queue_instance="all.q@n1", cleaned_by="reaper", qmod=str(qmod[0]))
    assert result.queue_disabled == "all.q@n1"
    assert marker.read_text() == "all.q@n1\n"


def test_given_a_full_qstat_path_then_qmod_is_taken_from_its_directory(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    config = cfg(tmp_path, qstat=str(qmod[0].parent / "qstat"))
    result = tear_down("42.1", backend_of(stuck_backend(tmp_path)), config,
                       queue_instance="all.q@n1", cleaned_by="epilog")
    assert result.queue_disabled == "all.q@n1"
    assert qmod[1].read_text() == "-d all.q@n1\n"


@pytest.mark.parametrize(("script", "timeout", "reason"), [
    ("echo 'denied: host \"n1\" is no admin host' >&2\nexit 1", 5.0,
     "exit status 1, stderr: denied: host \"n1\" is no admin host"),
    ("exec sleep 30", 0.3, "timed out after 0.3 s"),
], ids=["refused", "hangs"])
def test_given_qmod_fails_then_the_failure_is_journaled_and_nothing_raises(
        tmp_path: Path, records: Records, script: str, timeout: float, reason: str) -> None:
    qmod = tmp_path / "qmod"
    qmod.write_text(f"#!/bin/sh\n{script}\n")
    qmod.chmod(0o755)
    config = cfg(tmp_path, qstat_timeout=timeout)
    result = tear_down("42.1", backend_of(stuck_backend(tmp_path)), config,
                       queue_instance="all.q@n1", cleaned_by="epilog", qmod=str(qmod))
    assert (result.clean, result.queue_disabled) == (False, None)
    assert not (config.state_dir / "stuck" / "42.1").exists()  # tried again next round
    assert records.events()[-1] == (
        "ERROR", f"job 42.1: cannot disable the queue instance all.q@n1: qmod -d failed: {reason}",
        {"JOB_ID": "42", "SGE_TASK_ID": "1", "GECO_EVENT": "queue-disable-failed",
         "REASON": reason, "QUEUE_INSTANCE": "all.q@n1", "CLEANED_BY": "epilog"})


@pytest.mark.parametrize(("name", "reason"), [
    ("geco-test-no-such-qmod",
     f"qmod command 'geco-test-no-such-qmod' not found in {SAFE_PATH}; set [qstat] command in "
     "geco.toml to the full path of qstat: qmod is taken from the same directory "
     "(command=geco-test-no-such-qmod)"),
    ("/nonexistent/qmod", "cannot execute it: No such file or directory"),
], ids=["not-in-path", "no-such-file"])
def test_given_no_qmod_then_the_reason_is_journaled(
        tmp_path: Path, records: Records, name: str, reason: str) -> None:
    result = tear_down("42.1", backend_of(stuck_backend(tmp_path)), cfg(tmp_path),
                       queue_instance="all.q@n1", cleaned_by="epilog", qmod=name)
    assert result.queue_disabled is None
    level, message, fields = records.events()[-1]
    assert (level, fields["GECO_EVENT"], fields["REASON"]) == ("ERROR", "queue-disable-failed",
                                                               reason)
    assert message == (f"job 42.1: cannot disable the queue instance all.q@n1: qmod -d failed: "
                       f"{reason}")


def test_given_the_kernel_refuses_the_removal_with_no_process_left_then_it_is_not_clean(
        tmp_path: Path, records: Records, qmod: tuple[Path, Path]) -> None:
    refusal = CgroupError("cannot remove the cgroup of job 42.1: the kernel says it is busy "
                          "although it lists no process", key="42.1")
    fake = FakeBackend(tmp_path, destroy_error=refusal)
    result = tear_down("42.1", backend_of(fake), cfg(tmp_path), queue_instance="all.q@n1",
                       cleaned_by="epilog", qmod=str(qmod[0]))
    assert (result.clean, result.stuck, result.killed) == (False, (), 0)
    assert result.error == str(refusal)
    assert result.accounting == Accounting.from_usage(USAGE)
    level, message, fields = records.events()[0]
    assert (level, fields["GECO_EVENT"], fields["REASON"]) == ("ERROR", "cleanup-stuck",
                                                               str(refusal))
    assert message == (f"job 42.1: no process is left, but the cgroups could not be removed "
                       f"({refusal}); cgroups kept, gecod's reaper tries again")
    assert "PIDS" in fields and fields["PIDS"] == ""
    assert result.queue_disabled == "all.q@n1"


def test_given_the_cgroups_removed_meanwhile_by_someone_else_then_the_end_is_clean(
        tmp_path: Path, records: Records, qmod: tuple[Path, Path]) -> None:
    """A second teardown (the epilog while gecod ends the job, an admin's cleanup) removing
    the cgroups under this one is no stuck job: nothing is left, no queue is disabled."""
    class Vanishing(FakeBackend):
        def destroy(self, key: str) -> None:
            self.exists_ = False
            raise CgroupError(f"cannot remove the cgroup of job {key}: no such directory")

    fake = Vanishing(tmp_path)
    result = end("42.1", fake, cfg(tmp_path), queue_instance="all.q@n1", cleaned_by="gecod")
    assert (result.clean, result.error, result.queue_disabled) == (True, "", None)
    assert [f["GECO_EVENT"] for _, _, f in records.events()] == ["job-end"]
    assert not qmod[1].exists()


def test_given_a_process_gone_by_the_time_it_is_described_then_it_reads_as_gone(
        tmp_path: Path) -> None:
    fake = FakeBackend(tmp_path / "empty-proc", left=[777], where=None)
    result = tear_down("42.1", backend_of(fake), cfg(tmp_path, disable_queue_on_stuck=False),
                       queue_instance=None, cleaned_by="reaper")
    [gone] = result.stuck
    assert gone == StuckProcess(777, "", "", "", "")
    assert (gone.brief, gone.describe()) == ("777:?:?", "pid 777 (?) gone")


# -- /proc readers ------------------------------------------------------------


def test_procfs_reads_state_command_and_wait_channel(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 9, "Z (zombie)", "odd name) x", "0")
    assert procfs.state(9, proc) == "Z (zombie)"
    assert procfs.comm(9, proc) == "odd name) x"
    assert procfs.wchan(9, proc) == ""  # running (or zombie): the kernel says 0
    assert procfs.boot_time(proc) == 1000.0
    assert (procfs.state(10, proc), procfs.comm(10, proc), procfs.wchan(10, proc)) \
        == ("", "", "")


def test_procfs_on_this_process_agrees_with_the_kernel() -> None:
    assert procfs.state(os.getpid()) == "R (running)"
    assert procfs.comm(os.getpid()) == Path("/proc/self/comm").read_text().strip()
    assert 0 < procfs.boot_time() < os.stat("/proc/self").st_mtime + 1


# -- the epilog's queue instance ----------------------------------------------


def test_the_queue_instance_comes_from_the_spooled_config_not_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The epilog and gecod disable <queue>@<host> from the job's spooled config when its
    teardown is stuck, never $QUEUE/$HOSTNAME (the job's owner sets those)."""
    monkeypatch.setenv("QUEUE", "evil.q")
    monkeypatch.setenv("HOSTNAME", "elsewhere")
    spool = tmp_path / "42.1"
    spool.mkdir()
    (spool / "config").write_bytes(b"job_id=42\nqueue=all.q\nhost=node7\nqueue_tmpdir=/tmp\n")
    assert execd.queue_instance(spool) == "all.q@node7"
    (spool / "config").write_bytes(b"job_id=42\nqueue=all.q\n")
    assert execd.queue_instance(spool) is None
    (spool / "config").unlink()
    assert execd.queue_instance(spool) is None
