"""OOM kills on the real Grid Engine, as the job's owner and the admin see them.

gecod serves and sge_execd runs with the preload (as in test_quarantine.py), so
gecod creates each job's cgroups and watches them for OOM kills from the start.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cleanslate import site_config_rewritten

pytestmark = pytest.mark.sge

M = 1 << 20
HOG = "/usr/bin/python3 probe.py --alloc 400\necho \"probe exit $?\"\n"


def reload(gecod: Any, journal: Any) -> None:
    """SIGHUP gecod and wait until it journals that it re-read the configuration."""
    since = time.time()
    gecod.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while not journal.entries(since, GECO_EVENT="gecod-reloaded", _PID=str(gecod.proc.pid)):
        assert time.monotonic() < deadline, "gecod did not re-read its configuration"
        time.sleep(0.2)


@pytest.fixture
def kill_job_policy(gecod: Any, journal: Any) -> Iterator[None]:
    """[gecod] oom = "kill-job" in the site configuration, applied with SIGHUP."""
    try:
        with site_config_rewritten(lambda text: with_oom_policy(text, "kill-job")):
            reload(gecod, journal)
            yield
    finally:
        reload(gecod, journal)


def with_oom_policy(toml: str, policy: str) -> str:
    """The configuration text with [gecod] oom set to ``policy`` (replaced, or added)."""
    line = f'oom = "{policy}"'
    if re.search(r"^oom\s*=", toml, re.MULTILINE):
        return re.sub(r"^oom\s*=.*$", line, toml, count=1, flags=re.MULTILINE)
    if re.search(r"^\[gecod\]", toml, re.MULTILINE):
        return re.sub(r"^\[gecod\]$", f"[gecod]\n{line}", toml, count=1, flags=re.MULTILINE)
    return f"{toml}\n[gecod]\n{line}\n"


def oom_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("geco: job ")]


def test_the_owner_reads_what_happened_and_what_to_request_and_the_journal_has_it(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given a job with m_mem_free=200M that touches 400M, then its stderr file says, in one
    plain paragraph, that the kernel stopped its process for using more than requested,
    with the limit, the peak and a larger -l m_mem_free to resubmit with; the journal has a
    GECO_EVENT=oom entry with the job's fields at warning priority; the job's shell
    survived (policy kernel)."""
    job = job_dir.submit("hog", "-l", "m_mem_free=200M", script=HOG)
    [record] = sge.wait_finished(job, timeout=120)
    [entry] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="oom")
    [message] = oom_lines(job_dir.output("hog", job, stream="e"))

    assert job_dir.output("hog", job).splitlines()[-1] == "probe exit 137"
    assert record["failed"] == "0"
    assert message.startswith(f"geco: job {job} on node {sge.host} used more memory than it "
                              "requested and the kernel stopped process ")
    assert "(python3). Memory limit: 200M (-l m_mem_free=200M per slot x 1 slot); peak use: " \
        in message
    suggested = re.search(r"for example -l m_mem_free=(\d+)M\.$", message)
    assert suggested and int(suggested.group(1)) > 200
    assert (entry["PRIORITY"], entry["SGE_TASK_ID"], entry["LIMIT"]) == ("4", "1", str(200 * M))
    assert entry["COMMAND"] == "python3" and int(entry["PID"]) > 0


def test_twenty_concurrent_oom_jobs_get_exactly_twenty_messages(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given 20 jobs over their limits at once (as many as the node runs at a time), then
    each job's stderr file has exactly one geco message and the journal exactly 20 oom
    entries, one per job: every kill counted once."""
    jobs = [job_dir.submit(f"many{i}", "-l", "m_mem_free=64M",
                           script="/usr/bin/python3 probe.py --alloc 200\n") for i in range(20)]
    for job in jobs:
        sge.wait_finished(job, timeout=240)

    def counted() -> tuple[dict[int, int], list[dict[str, Any]]]:
        return ({j: len(oom_lines(job_dir.output(f"many{i}", j, stream="e")))
                 for i, j in enumerate(jobs)},
                [e for j in jobs for e in journal.entries(JOB_ID=str(j), GECO_EVENT="oom")])
    # gecod writes the message and the entry when the kernel reports the kill, which may
    # be after the job's end: wait until every job has at least one, however slow
    deadline = time.monotonic() + 30
    while (not all((found := counted())[0].values()) or len(found[1]) < 20) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)  # a second message for a job would come as soon as its first
    per_job, entries = counted()

    assert per_job == {j: 1 for j in jobs}
    assert len(entries) == 20


def test_with_policy_kill_job_the_first_kill_ends_the_whole_job(
        sge: Any, gecod: Any, job_dir: Any, journal: Any, kill_job_policy: None) -> None:
    """Given oom = "kill-job", when one process of a job is OOM-killed, then the rest of the
    job (its shell, which would otherwise go on) is ended too, the owner is told, and Grid
    Engine's shepherd is spared: it reports the job's end and runs geco's epilog."""
    job = job_dir.submit("killjob", "-l", "m_mem_free=200M",
                         script=HOG + "sleep 30\necho survived\n")
    [record] = sge.wait_finished(job, timeout=120)
    out = job_dir.output("killjob", job)

    assert "survived" not in out
    assert record["exit_status"] != "0"
    assert len(oom_lines(job_dir.output("killjob", job, stream="e"))) == 1
    assert journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="oom")
    assert journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-end")  # the epilog ran
    assert not Path(f"/sys/fs/cgroup/memory/GECO/{job}.1").exists()
