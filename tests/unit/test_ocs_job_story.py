"""A job's story is that job's (issue 38): Grid Engine reuses job numbers, geco tells them apart.

Which job of its number a job is (the cluster, ``SGE_CLUSTER``, and its submission time,
``JOB_SUBMITTED``) is read from its execd spool dir: a real Son of Grid Engine 8.1.9
spool (tests/fixtures/hooks, seconds) and one shaped as Open Cluster Scheduler 9.1.4
writes it (microseconds; its cell ``ocs`` under ``/opt/ocs``, as in the recorded OCS
job environment). It travels in the job's resource set (the resource file, a parallel
job's PREPARE), every record geco writes of the job while that file is unchanged
carries it, and ``geco journal`` shows one job of a number unless asked for all,
read back from the session's real journald (tests/conftest.py's ``journal``).

Job numbers in the journald test are random 9-digit ones, as in
tests/system/test_job_cli.py: the journal is shared with every other test and with the
real Grid Engine jobs of this machine, whose numbers start at 1 again each install.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco import log
from geco.config import Config
from geco.errors import ResourceFormatError
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import execd, jobinstance, lookup, resourcefile, v1format
from tests.logkit import RecordingHandler, handler_on

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/opt/geco-dev/venv/bin/python"
FIXTURES = REPO / "tests" / "fixtures"
SOGE_JOB_1 = FIXTURES / "hooks" / "epilog.1.undefined.txt"  # job 1, submission_time=1795303008
COMMLIB = "error: commlib error: can't connect to service (Connection refused)"


@pytest.fixture(autouse=True)
def known(monkeypatch: pytest.MonkeyPatch) -> None:
    """No job instance known to this process at the start of a test (geco.log keeps one
    table per process; each test here starts as a new hook would)."""
    monkeypatch.setattr(log, "_instances", {})


def dump_section(dump: Path, title: str) -> bytes:
    """One ``### <title>`` section of a recorded hook dump, as the file's bytes."""
    lines = dump.read_bytes().split(b"\n")
    start = lines.index(b"### " + title.encode()) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(b"###"))
    return b"\n".join(lines[start:end]) + b"\n"


def soge_spool(spool: Path, sge_root: Path) -> Path:
    """Job 1's execd spool dir as Son of Grid Engine 8.1.9 wrote it, its SGE_ROOT moved to
    ``sge_root`` (so the test decides whether the cell has a ``cluster_name``)."""
    spool.mkdir(parents=True)
    for name in ("config", "pe_hostfile"):
        (spool / name).write_bytes(dump_section(SOGE_JOB_1, f"SGE_JOB_SPOOL_DIR file: {name}"))
    env = dump_section(SOGE_JOB_1, "SGE_JOB_SPOOL_DIR file: environment")
    assert b"\nSGE_ROOT=/var/lib/gridengine\n" in env
    (spool / "environment").write_bytes(
        env.replace(b"\nSGE_ROOT=/var/lib/gridengine\n", b"\nSGE_ROOT=%s\n" % bytes(sge_root)))
    return spool


def ocs_spool(spool: Path, sge_root: Path, submitted_usec: int) -> Path:
    """An execd spool dir as Open Cluster Scheduler 9.1.4 writes one: ``submission_time`` in
    microseconds (exec_job.cc prints JB_submission_time, a 64-bit microsecond time),
    SGE_ROOT and SGE_CELL as execd sets them (cell ``ocs``)."""
    spool.mkdir(parents=True)
    (spool / "config").write_text(f"job_name=gpu1\njob_id=1\nja_task_id=0\naccount=sge\n"
                                  f"submission_time={submitted_usec}\nnotify=0\n")
    (spool / "environment").write_text(f"JOB_ID=1\nSGE_CELL=ocs\nSGE_TASK_ID=undefined\n"
                                       f"SGE_ROOT={sge_root}\nSGE_CLUSTER_NAME=users-own\n")
    return spool


def cell(sge_root: Path, name: str, cluster_name: str | None) -> Path:
    """``$SGE_ROOT/<name>/common``, with ``cluster_name`` holding the given text."""
    common = sge_root / name / "common"
    common.mkdir(parents=True)
    if cluster_name is not None:
        (common / "cluster_name").write_text(cluster_name + "\n")
    return sge_root


# -- where the two come from: the spool -------------------------------------------------


def test_a_soge_job_is_its_cells_root_and_cell_without_a_cluster_name(tmp_path: Path) -> None:
    """Given a real SoGE 8.1.9 spool (submission_time in seconds) whose cell has no
    cluster_name (Debian's packages write none), then the job is <SGE_ROOT>/<SGE_CELL>,
    submitted at 1795303008 s."""
    root = cell(tmp_path / "sge", "default", None)
    spool = soge_spool(tmp_path / "active_jobs" / "1.1", root)
    assert jobinstance.from_spool(spool) == jobinstance.JobInstance(
        f"{root}/default", 1795303008.0, spool / "config")


def test_an_ocs_job_is_its_cluster_name_and_submission_to_the_microsecond(
        tmp_path: Path) -> None:
    """Given an OCS 9.1.4 spool (microseconds) whose cell has the cluster_name its installer
    writes (p<qmaster port>), then the job is cluster p7444, submitted at
    1795318290.311469 s; the owner's own SGE_CLUSTER_NAME in the job's environment is
    not what names the cluster."""
    root = cell(tmp_path / "opt-ocs", "ocs", "p7444")
    spool = ocs_spool(tmp_path / "active_jobs" / "1.1", root, 1795318290311469)
    found = jobinstance.from_spool(spool)
    assert found is not None
    assert (found.cluster, log.submitted_text(found.submitted)) == ("p7444", "1795318290.311469")


@pytest.mark.parametrize("text", ["", "bad name with spaces", "x" * 200])
def test_a_cluster_name_geco_cannot_use_falls_back_to_root_and_cell(tmp_path: Path,
                                                                    text: str) -> None:
    root = cell(tmp_path / "opt-ocs", "ocs", text)
    spool = ocs_spool(tmp_path / "active_jobs" / "1.1", root, 1)
    found = jobinstance.from_spool(spool)
    assert found is not None and found.cluster == f"{root}/ocs"


def test_a_pe_tasks_config_or_no_config_gives_no_submission_time(tmp_path: Path) -> None:
    """Given a spool dir without config (a slave host's job dir: only its PE task dirs have
    one), then nothing is known; given a PE task's config (pe_task_id, the task's own
    time), then the cluster is known and the submission time is not."""
    root = cell(tmp_path / "sge", "default", "p6444")
    assert jobinstance.from_spool(tmp_path) is None
    assert jobinstance.from_spool(None) is None
    spool = soge_spool(tmp_path / "active_jobs" / "1.1", root)
    config = spool / "config"
    config.write_bytes(config.read_bytes() + b"pe_task_id=1.vm\n")
    assert jobinstance.from_spool(spool) == jobinstance.JobInstance("p6444", 0.0, config)


# -- carried by the resource set --------------------------------------------------------

SET = ResourceSet(42, 1, owner="alice", nodes=(NodeResources("n001", slots=2),
                                               NodeResources("n002", is_slave=True)))
OLD_TEXT = (b"GECOResourceSet_v1{li42,li1,lf0,b0,lf0,i0,i2,b0,b0,s0:,s5:alice,s0:,s0:,"
            b"s4:n001{b0,i2,lf0,lf0,s0:,s0:},s4:n002{b1,i1,lf0,lf0,s0:,s0:}}")


def test_a_set_that_knows_its_job_writes_an_instance_section_after_its_nodes() -> None:
    """Given job 42.1's set with cluster p6444 and submission 1795318290.311469, then its v1
    text is an older geco's with ',instance{s5:p6444,lf1795318290.311469}' before the last
    '}', and it reads back equal (as a slave host reads its PREPARE)."""
    known = SET.replace(cluster="p6444", submitted=1795318290.311469)
    text = v1format.serialize(known)
    assert text == OLD_TEXT[:-1] + b",instance{s5:p6444,lf1795318290.311469}}"
    assert v1format.parse(text) == known


def test_an_older_gecos_text_reads_as_not_knowing_and_writes_back_unchanged() -> None:
    assert v1format.parse(OLD_TEXT) == SET
    assert (SET.cluster, SET.submitted) == ("", 0.0)
    assert v1format.serialize(v1format.parse(OLD_TEXT)) == OLD_TEXT


AT = len(OLD_TEXT) - 1  # where an instance section starts: before the last '}'


@pytest.mark.parametrize(("tail", "offset", "message"), [
    (b",instance{s5:p6444}}", AT + 18, "expected ',' after the cluster at byte {}, got '}}'"),
    (b",instance{s5:p6444,lf-1}}", AT + 21,
     "the submission time at byte {} must be a finite number of seconds >= 0, got -1"),
    (b",instance{s5:p6444,lf1}", AT + 23,
     "expected '}}' after the instance section at byte {}, got end of input"),
    (b",instanc{s0:,lf1}}", AT, "expected '}}' after node 2 of 2 at byte {}, got ','"),
])
def test_a_broken_instance_section_is_refused_where_it_breaks(tail: bytes, offset: int,
                                                             message: str) -> None:
    """Given an older geco's text with a broken instance section before its last '}', then
    the error names the byte where it breaks and what was expected there; a ',' that starts
    no instance section is reported as an older geco reports it."""
    with pytest.raises(ResourceFormatError) as info:
        v1format.parse(OLD_TEXT[:-1] + tail)
    assert (info.value.msg, info.value.offset) == (message.format(offset), offset)


def test_a_tasks_records_say_which_job_once_its_resource_file_is_read_and_not_after_it_goes(
        tmp_path: Path) -> None:
    """Given job 42.1's resource file written by another process (the prolog), when this
    process (gecod) reads it, then its records of the job carry SGE_CLUSTER and
    JOB_SUBMITTED; once the file is removed (the job ended) they do not."""
    resources = tmp_path / "resources"
    resourcefile.write(resources, SET.replace(cluster="p6444", submitted=1795318290.0))
    log._instances.clear()  # the writer's table; this "process" only reads
    assert "SGE_CLUSTER" not in log.job_fields(42, 1)["geco_fields"]

    resourcefile.read(resources, SET.key)

    assert {k: v for k, v in log.job_fields(42, 1)["geco_fields"].items()
            if k in ("SGE_CLUSTER", "JOB_SUBMITTED")} == {
        "SGE_CLUSTER": "p6444", "JOB_SUBMITTED": "1795318290"}
    resourcefile.remove(resources, SET.key)
    assert log.job_fields(42, 1)["geco_fields"] == {"JOB_ID": "42", "SGE_TASK_ID": "1"}


# -- stamped where the set is made: lookup.find ------------------------------------------


def fake_qstat(directory: Path, body: str) -> Path:
    path = directory / "qstat"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_a_set_qstat_gave_says_which_job_in_its_file_and_in_the_records_after(
        tmp_path: Path) -> None:
    """Given SoGE job 1's spool (cell with cluster_name p6444) and a qstat that prints what
    SoGE printed for it, when lookup.find makes the job's set, then the set, its resource
    file and the job's records from then on say cluster p6444, submitted 1795303008."""
    spool = soge_spool(tmp_path / "active_jobs" / "1.1", cell(tmp_path / "sge", "default",
                                                              "p6444"))
    qstat = fake_qstat(tmp_path, f"cat {FIXTURES / 'qstat' / 'serial.xml'}\n")
    cfg = Config(qstat=str(qstat), qstat_retries=0, state_dir=tmp_path / "state")

    found = lookup.find(execd.JobRef(1, 1, spool), cfg)

    assert found.source == "qstat"
    assert (found.resources.cluster, found.resources.submitted) == ("p6444", 1795303008.0)
    assert resourcefile.read(cfg.resources_dir, found.resources.key) == found.resources
    fields = log.job_fields(1, 1)["geco_fields"]
    assert (fields["SGE_CLUSTER"], fields["JOB_SUBMITTED"]) == ("p6444", "1795303008")


def test_without_a_qmaster_the_set_from_the_spool_and_the_warning_say_which_job(
        tmp_path: Path) -> None:
    """Given an unreachable qmaster and a site that runs jobs anyway (no memory limits),
    then the set made from the spool says which job, and so does the warning journaled
    before it (degraded-containment)."""
    spool = soge_spool(tmp_path / "active_jobs" / "1.1", cell(tmp_path / "sge", "default",
                                                              "p6444"))
    qstat = fake_qstat(tmp_path, f"echo \"{COMMLIB}\" >&2\nexit 1\n")
    cfg = Config(qstat=str(qstat), qstat_retries=0, state_dir=tmp_path / "state",
                 run_without_memory_limits=True)
    records = RecordingHandler()

    with handler_on("geco", records):
        found = lookup.find(execd.JobRef(1, 1, spool), cfg)

    assert found.source == "spool"
    assert (found.resources.cluster, found.resources.submitted) == ("p6444", 1795303008.0)
    [warning] = [r for r in records.records
                 if getattr(r, "geco_fields", {}).get("GECO_EVENT") == "degraded-containment"]
    assert {k: warning.geco_fields[k] for k in ("JOB_ID", "SGE_CLUSTER",  # type: ignore[attr-defined]
                                                "JOB_SUBMITTED")} == {
        "JOB_ID": "1", "SGE_CLUSTER": "p6444", "JOB_SUBMITTED": "1795303008"}


# -- geco journal on a real journal -----------------------------------------------------


def geco(*args: str) -> subprocess.CompletedProcess[str]:
    """``geco ARGS`` from this working tree, as root, in UTC."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "TZ": "UTC",
           "PYTHONPATH": str(REPO)}
    return subprocess.run([PYTHON, "-m", "geco.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def entry_lines(entries: list[dict[str, Any]]) -> list[str]:
    """How `geco journal` prints journalctl's entries of one task (columns as wide as needed)."""
    ident = max(len(e["SYSLOG_IDENTIFIER"]) for e in entries)
    event = max(len(e["GECO_EVENT"]) for e in entries)
    return [f"{utc(int(e['__REALTIME_TIMESTAMP']) / 1e6)}  {e['SYSLOG_IDENTIFIER']:<{ident}}  "
            f"{e['GECO_EVENT']:<{event}}  {e['MESSAGE']}" for e in entries]


@pytest.fixture
def two_jobs(journal: Any, restored_geco_logger: Any, tmp_path: Path) -> Iterator[int]:
    """Two jobs of one number through their life on this node, journaled as geco does: job
    A of a SoGE cluster (its prolog, its starter, which reads no resource file, its
    epilog's end) and job B of an OCS cluster (its prolog, an OOM kill seen by gecod);
    each prolog wrote the job's resource file from the job's spool."""
    job = random.randrange(10**8, 10**9)
    resources = tmp_path / "resources"
    for name, spool, events in [
        ("a", soge_spool(tmp_path / "a" / f"{job}.1", cell(tmp_path / "sge", "default",
                                                             None)),
         [("geco-prolog", "job-contained", True), ("geco-starter", "job-started", False),
          ("geco-epilog", "job-end", True)]),
        ("b", ocs_spool(tmp_path / "b" / f"{job}.1",
                        cell(tmp_path / "opt-ocs", "ocs", "p7444"), 1795318290311469),
         [("geco-prolog", "job-contained", True), ("gecod", "oom", True)]),
    ]:
        instance = jobinstance.from_spool(spool)
        assert instance is not None
        resourcefile.write(resources, instance.stamp(ResourceSet(job, 1, owner="alice")))
        for identifier, event, reads_the_file in events:
            log._instances.clear()  # each record from a process of its own
            if reads_the_file:
                resourcefile.read(resources, JobKey(job, 1))
            log.setup("quiet", identifier=identifier)
            log.get("test").info("job %s.1 of %s: %s", job, name, event,
                                 extra=log.job_fields(job, 1, event))
    journal.wait_for(JOB_ID=str(job), GECO_EVENT="oom")
    yield job


@pytest.mark.root
def test_geco_journal_shows_the_newest_job_of_a_number_and_all_when_asked(
        two_jobs: int, journal: Any) -> None:
    """Given jobs A (SoGE, submitted 1795303008) and B (OCS, submitted 1795318290.311469)
    numbered N in the journal, when `geco journal N` runs, then it shows B alone, under a
    heading naming B's submission time and cluster, then B's summary, then a line saying 1
    earlier job numbered N is in the journal; --all shows A (with its starter's entry,
    which names no job) then B; --earlier 1 shows A and says a later job is there; --json
    gives B's entries only, the note on stderr; --earlier 2 is one line, exit 1."""
    job = two_jobs
    seen = journal.entries(0, JOB_ID=str(job))
    a = [e for e in seen if e["MESSAGE"].startswith(f"job {job}.1 of a:")]
    b = [e for e in seen if e["MESSAGE"].startswith(f"job {job}.1 of b:")]
    assert [e["GECO_EVENT"] for e in a] == ["job-contained", "job-started", "job-end"]
    assert "SGE_CLUSTER" not in a[1]  # the starter's: it read no resource file
    a_title = f"-- job {job} submitted {utc(1795303008)}, cluster {a[0]['SGE_CLUSTER']} --"
    b_title = f"-- job {job} submitted {utc(1795318290)}, cluster p7444 --"
    a_story = [a_title, *entry_lines(a),
               f"job {job}.1 ended {utc(int(a[-1]['__REALTIME_TIMESTAMP']) / 1e6)}: "
               f"no accounting recorded"]
    b_story = [b_title, *entry_lines(b), f"job {job}.1: no job-end entry yet (still running?)"]

    newest = geco("journal", str(job))

    assert (newest.returncode, newest.stderr) == (0, "")
    assert newest.stdout.splitlines() == [
        *b_story, f"1 earlier job numbered {job} is in this journal: --all shows them"]

    every = geco("journal", str(job), "--all")

    assert (every.returncode, every.stderr) == (0, "")
    assert every.stdout.splitlines() == [*a_story, "", *b_story]

    before = geco("journal", f"{job}.1", "--earlier", "1")

    assert (before.returncode, before.stderr) == (0, "")
    assert before.stdout.splitlines() == [
        *a_story, f"1 later job numbered {job} is in this journal: --all shows them"]

    as_json = geco("journal", str(job), "--json")

    assert as_json.returncode == 0
    assert [json.loads(line)["MESSAGE"] for line in as_json.stdout.splitlines()] == [
        e["MESSAGE"] for e in b]
    assert {json.loads(line)["SGE_CLUSTER"] for line in as_json.stdout.splitlines()} == {
        "p7444"}
    assert as_json.stderr == (f"geco journal: 1 earlier job numbered {job} is in this journal: "
                              f"--all shows them\n")

    too_far = geco("journal", str(job), "--earlier", "2")

    assert (too_far.returncode, too_far.stdout, too_far.stderr) == (
        1, "", f"geco journal: this node's journal holds 1 earlier job numbered {job} "
               f"(--earlier 2)\n")


def test_all_and_earlier_go_alone_and_earlier_counts_from_1() -> None:
    """Given --all with --earlier, or --earlier 0, then one usage line, exit 2."""
    both = geco("journal", "42", "--all", "--earlier", "1")
    assert (both.returncode, both.stdout, both.stderr) == (
        2, "", "geco journal: argument --earlier: not allowed with argument --all\n")
    zero = geco("journal", "42", "--earlier", "0")
    assert (zero.returncode, zero.stderr) == (
        2, "geco journal: argument --earlier: N must be a number from 1 up, got '0'\n")
