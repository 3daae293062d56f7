"""Issue 37, points 1 and 2 (:mod:`geco.node.health`): a node that fails to contain jobs
``[health] sick_after`` times in a row for a cause of its own, of two jobs at least (one
job failing again and again may be its own doing), disables its queue instance once,
with the reason; a job's own fault never counts; a job contained ends the streak. A
parallel job whose other hosts keep failing is re-queued ``[health] requeue_limit`` times,
then held in error with the reason."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from geco.config import Config
from geco.errors import CgroupError, CoresUnavailable, GecoError, QstatError, ResourceFormatError
from geco.hooks import Exit, prolog
from geco.node import gpus, health
from geco.sge.execd import JobRef
from tests.logkit import RecordingHandler, handler_on
from tests.qmodkit import recording_qmod

INSTANCE = "all.q@node1"
ROFS = CgroupError("cannot create the cgroup: Read-only file system", errno="EROFS")


@pytest.fixture
def qmod(tmp_path: Path) -> tuple[Path, Path]:
    """A qmod stand-in that records its arguments (one line per run) and succeeds."""
    return recording_qmod(tmp_path)


def _cfg(tmp_path: Path, **changes: Any) -> Config:
    return Config()._replace(**{"state_dir": tmp_path / "state", "qstat_timeout": 5.0,
                                **changes})


def _runs(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


def _fail(cfg: Config, qmod: tuple[Path, Path], job: int, error: GecoError = ROFS,
          task: int = 1) -> None:
    """Job ``<job>.<task>``, spooled here by Grid Engine for INSTANCE, not contained."""
    spool = cfg.state_dir.parent / "spool" / f"{job}.{task}"
    spool.mkdir(parents=True, exist_ok=True)
    queue, host = INSTANCE.split("@")
    (spool / "config").write_text(f"queue={queue}\nhost={host}\n")
    health.failed(cfg, JobRef(job, task, spool), error, qmod=str(qmod[0]))


def test_three_different_jobs_failing_for_the_node_disable_its_queue_once_with_why(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    """Given sick_after = 3 (the default), when jobs 1 and 2 fail here for a cgroup the
    kernel refuses, then nothing is disabled; when job 3 does too, its queue instance is
    disabled once, journaled as node-sick naming the three jobs and the reason, and geco
    check says so; a fourth failing job does not run qmod again."""
    cfg = _cfg(tmp_path)
    records = RecordingHandler()
    with handler_on("geco.node.health", records):
        _fail(cfg, qmod, 1)
        _fail(cfg, qmod, 2)
        assert _runs(qmod[1]) == []
        assert "2 failure(s) in a row" in health.describe(cfg)
        _fail(cfg, qmod, 3)
        assert _runs(qmod[1]) == [f"-d {INSTANCE}"]
        _fail(cfg, qmod, 4)
    assert _runs(qmod[1]) == [f"-d {INSTANCE}"]
    sick = [r for r in records.records if r.geco_fields.get("GECO_EVENT") == "node-sick"]
    assert [r.levelno for r in sick] == [logging.ERROR, logging.ERROR]
    fields = sick[0].geco_fields
    assert fields["JOBS"] == "1 2 3" and fields["QUEUE_INSTANCE"] == INSTANCE
    assert "Read-only file system" in fields["REASON"]
    assert f"disabled the queue instance {INSTANCE} (qmod -d)" in sick[0].getMessage()
    assert f"qmod -e {INSTANCE}" in sick[0].getMessage()
    assert "disabled already" in sick[1].getMessage()
    line = health.describe(cfg)
    assert "3 failure(s) in a row" in line and f"disabled {INSTANCE}" in line, line


def test_two_jobs_brought_back_in_turn_make_the_node_sick(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    """Grid Engine brings a re-queued job back first: on a two-slot node the same two jobs
    fail in turn, and that is enough (three failures, two jobs)."""
    cfg = _cfg(tmp_path)
    _fail(cfg, qmod, 1)
    _fail(cfg, qmod, 2)
    _fail(cfg, qmod, 1)
    assert _runs(qmod[1]) == [f"-d {INSTANCE}"]


def test_one_job_failing_again_and_again_never_makes_the_node_sick(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    """Given one job (an array of 20 tasks) that fails here each time Grid Engine brings it
    back, then it counts once: no queue is disabled, whatever its fault."""
    cfg = _cfg(tmp_path)
    for _ in range(3):
        for task in range(1, 21):
            _fail(cfg, qmod, 7, task=task)
    assert _runs(qmod[1]) == []
    assert "3 failure(s) in a row" in health.describe(cfg)


@pytest.mark.parametrize("error", [
    ResourceFormatError("not a resource set", offset=0, expected="GECOResourceSet_v1{"),
    QstatError("qstat did not answer in 30 s: the qmaster may be down"),
    CoresUnavailable("the job needs 2 cores here, but 1 is free"),
    GecoError("job 5.1 has no slots on this host (node1)")], ids=type)
def test_a_failure_that_is_not_the_nodes_own_never_counts(
        tmp_path: Path, qmod: tuple[Path, Path], error: GecoError) -> None:
    cfg = _cfg(tmp_path)
    for job in range(1, 6):
        _fail(cfg, qmod, job, error)
    assert _runs(qmod[1]) == []
    assert health.describe(cfg) == "no failure to contain a job since the last one contained"


def test_a_job_contained_ends_the_streak(tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    cfg = _cfg(tmp_path)
    _fail(cfg, qmod, 1)
    _fail(cfg, qmod, 2)
    health.contained(cfg)
    assert health.describe(cfg) == "no failure to contain a job since the last one contained"
    _fail(cfg, qmod, 3)
    _fail(cfg, qmod, 4)
    assert _runs(qmod[1]) == []
    _fail(cfg, qmod, 5)
    assert _runs(qmod[1]) == [f"-d {INSTANCE}"]


def test_on_sick_journal_only_says_so_and_sick_after_0_never_counts(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    records = RecordingHandler()
    said = _cfg(tmp_path, health_on_sick="journal")
    with handler_on("geco.node.health", records):
        for job in range(1, 4):
            _fail(said, qmod, job)
    [sick] = [r for r in records.records if r.geco_fields.get("GECO_EVENT") == "node-sick"]
    assert 'on_sick = "journal": its queues stay open' in sick.getMessage()
    never = _cfg(tmp_path / "never", health_sick_after=0)
    for job in range(1, 10):
        _fail(never, qmod, job)
    assert _runs(qmod[1]) == []
    assert health.describe(never) == "no failure to contain a job since the last one contained"


def test_a_qmod_that_fails_is_journaled_and_tried_again_at_the_next_failure(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    cfg = _cfg(tmp_path)
    qmod[0].write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {qmod[1]}\n"
                       "echo 'error: no qmaster' >&2\nexit 1\n")
    records = RecordingHandler()
    with handler_on("geco.node.health", records):
        for job in range(1, 5):
            _fail(cfg, qmod, job)
    assert _runs(qmod[1]) == [f"-d {INSTANCE}"] * 2
    failed = [r.geco_fields for r in records.records if "QMOD_ERROR" in r.geco_fields]
    assert len(failed) == 2 and "no qmaster" in failed[0]["QMOD_ERROR"], failed
    assert "disabled" not in health.describe(cfg)


def test_a_parallel_job_is_requeued_up_to_the_limit_then_held_with_why(
        tmp_path: Path) -> None:
    """Given requeue_limit = 2, when job 9's other hosts fail to prepare it three times on
    this master, then it is re-queued twice and held in error the third time, journaled
    as job-held with the host's reason; counted afresh after that (qmod -cj)."""
    cfg = _cfg(tmp_path, health_requeue_limit=2)
    job = JobRef(9, 1, None)
    why = "host node3 did not prepare it: unreachable"
    logger = prolog.log.get("hooks.prolog")
    records = RecordingHandler()
    with handler_on("geco.hooks.prolog", records):
        codes = [prolog._requeue_or_hold(job, cfg, why, logger) for _ in range(4)]
    assert codes == [Exit.REQUEUE, Exit.REQUEUE, Exit.JOB_ERROR, Exit.REQUEUE]
    [held] = [r for r in records.records if r.geco_fields.get("GECO_EVENT") == "job-held"]
    assert held.geco_fields["REASON"] == why and held.geco_fields["REQUEUES"] == "2"
    assert "re-queued 2 times" in held.getMessage() and "qmod -cj 9" in held.getMessage()
    zero = _cfg(tmp_path / "zero", health_requeue_limit=0)
    assert prolog._requeue_or_hold(job, zero, why, logger) == Exit.JOB_ERROR


def test_gpus_granted_that_the_node_lacks_are_the_nodes_failure_busy_ones_are_not(
        tmp_path: Path, qmod: tuple[Path, Path]) -> None:
    """A count of GPUs above what the node has at all (its complex_values say more than
    geco finds) counts towards the node's sickness; GPUs merely busy do not."""
    table = (gpus.Gpu(0, "/dev/nvidia0", 195, 0),)
    with pytest.raises(gpus.GpusMissing) as missing:
        gpus.pick(table, 2, busy=())
    assert "granted 2 GPU(s) here, but geco finds 1" in str(missing.value)
    with pytest.raises(gpus.GpusUnavailable) as busy:
        gpus.pick(table, 1, busy=(0,))
    assert not isinstance(busy.value, gpus.GpusMissing)
    cfg = _cfg(tmp_path)
    for job in (1, 2, 3):
        _fail(cfg, qmod, job, busy.value)
    assert _runs(qmod[1]) == []
    for job in (4, 5, 6):
        _fail(cfg, qmod, job, missing.value)
    assert _runs(qmod[1]) == [f"-d {INSTANCE}"]
