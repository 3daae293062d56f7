"""The ``journal`` fixture gives a real journald whose entries tests can query by field."""

from __future__ import annotations

import uuid

from systemd import journal as sd_journal

from geco import log as geco_log

# restored_geco_logger: tests/conftest.py


def test_entry_sent_with_systemd_python_is_found_by_its_job_id(journal):
    """Given the running journald,
    when systemd.journal.send("x...", JOB_ID="42") is called,
    then journalctl JOB_ID=42 returns that entry with its message and fields."""
    text = f"x geco-test {uuid.uuid4()}"

    sd_journal.send(text, JOB_ID="42", GECO_EVENT="fixture-probe")

    found = [e for e in journal.entries(JOB_ID="42") if e["MESSAGE"] == text]
    assert [(e["JOB_ID"], e["GECO_EVENT"]) for e in found] == [("42", "fixture-probe")]


def test_geco_log_record_with_job_fields_is_found_by_its_job_id(journal, restored_geco_logger):
    """Given geco.log set up with the journal (stderr level quiet),
    when an info record tagged with job_fields(42, 3, "cgroup-created", cgroup=...) is logged,
    then journalctl JOB_ID=42 returns it with the job's fields, priority 6 (info)
    and geco's identifier."""
    text = f"created cgroup for geco-test {uuid.uuid4()}"
    geco_log.setup("quiet", identifier="geco-test")

    geco_log.get("test").info(text, extra=geco_log.job_fields(
        42, 3, "cgroup-created", cgroup="/sys/fs/cgroup/cpuset/geco-test"))

    found = [e for e in journal.entries(JOB_ID="42") if e["MESSAGE"] == text]
    assert [(e["JOB_ID"], e["SGE_TASK_ID"], e["GECO_EVENT"], e["CGROUP"], e["PRIORITY"],
             e["SYSLOG_IDENTIFIER"]) for e in found] == [
        ("42", "3", "cgroup-created", "/sys/fs/cgroup/cpuset/geco-test", "6", "geco-test")]


def test_entries_filter_on_every_given_field(journal):
    """Given two entries of job 42 that differ in GECO_EVENT,
    when entries() is asked for JOB_ID=42 and one GECO_EVENT,
    then only the entry with that event comes back."""
    tag = str(uuid.uuid4())
    sd_journal.send("first", JOB_ID="42", GECO_EVENT="one", GECO_TEST_TAG=tag)
    sd_journal.send("second", JOB_ID="42", GECO_EVENT="two", GECO_TEST_TAG=tag)

    found = journal.entries(JOB_ID="42", GECO_EVENT="two", GECO_TEST_TAG=tag)

    assert [e["MESSAGE"] for e in found] == ["second"]
