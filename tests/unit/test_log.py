"""Log lines in the original GECO's format, with its five levels."""

from __future__ import annotations

import io
import logging
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from geco import log
from tests.logkit import RecordingHandler

REPO = Path(__file__).resolve().parents[2]

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} "
                  r"\[(\d+)\|(ERROR|WARN |INFO |DEBUG)\]: ")


@pytest.fixture
def stream(restored_geco_logger: logging.Logger) -> io.StringIO:
    """Where geco.log.setup() is to write; the ``geco`` logger is restored afterwards
    (``restored_geco_logger``: tests/conftest.py)."""
    return io.StringIO()


def emit_all(level: str, out: io.StringIO) -> list[str]:
    log.setup(level, stream=out, journal=False)
    lg = log.get("test")
    lg.debug("d")
    lg.info("i")
    lg.warning("!! All resource information must be pre-populated !!")
    lg.error("e")
    return out.getvalue().splitlines()


def test_lines_have_the_seed_format_with_pid_and_padded_label(stream: io.StringIO) -> None:
    """Given level debug, then every line reads '<ISO time+offset> [<pid>|<LABEL>]: text',
    labels padded to five characters, info/debug prefixed with their source location."""
    lines = emit_all("debug", stream)
    labels = [m.group(2) if (m := LINE.match(x)) else x for x in lines]
    assert labels == ["DEBUG", "INFO ", "WARN ", "ERROR"]
    assert lines[2].endswith("]: !! All resource information must be pre-populated !!")
    assert re.search(r"\]: \(test_log\.py:\d+\) i$", lines[1])
    assert lines[3].endswith("]: e")


@pytest.mark.parametrize(("level", "count"), [("quiet", 0), ("error", 1), ("warn", 2),
                                              ("info", 3), ("debug", 4)])
def test_each_level_shows_itself_and_everything_less_verbose(stream: io.StringIO, level: str,
                                                             count: int) -> None:
    assert len(emit_all(level, stream)) == count


def test_job_fields_become_upper_case_journal_fields() -> None:
    fields = log.job_fields(42, 1, "job-contained", cpus="0-3", shepherd_pid=77, nothing=None)
    assert fields == {"geco_fields": {"JOB_ID": "42", "SGE_TASK_ID": "1",
                                      "GECO_EVENT": "job-contained", "CPUS": "0-3",
                                      "SHEPHERD_PID": "77"}}


# -- which job of its number a record is about -------------------------------


@pytest.fixture
def known(monkeypatch: pytest.MonkeyPatch) -> None:
    """No job instance known at the start of the test (geco.log keeps them per process)."""
    monkeypatch.setattr(log, "_instances", {})


def test_a_tasks_records_say_which_job_while_the_file_it_was_read_from_is_unchanged(
        tmp_path: Path, known: None) -> None:
    """Given job 42.1 known as submitted at 1795303085.311469 to cluster p6444 from its
    resource file, then its records carry SGE_CLUSTER and JOB_SUBMITTED after GECO_EVENT
    and before their own fields, and so do records of job 42 that name no task; other
    tasks and jobs do not; once the file is replaced (a new job of the number), none does."""
    path = tmp_path / "42.1"
    path.write_text("job A")
    log.job_instance(42, 1, "p6444", 1795303085.311469, path)

    fields = log.job_fields(42, 1, "job-end", cpus="0")["geco_fields"]

    assert list(fields.items()) == [
        ("JOB_ID", "42"), ("SGE_TASK_ID", "1"), ("GECO_EVENT", "job-end"),
        ("SGE_CLUSTER", "p6444"), ("JOB_SUBMITTED", "1795303085.311469"), ("CPUS", "0")]
    assert log.job_fields("42", None)["geco_fields"]["JOB_SUBMITTED"] == "1795303085.311469"
    assert "SGE_CLUSTER" not in log.job_fields(42, 2)["geco_fields"]
    assert "SGE_CLUSTER" not in log.job_fields(43, 1)["geco_fields"]
    (tmp_path / "new").write_text("job B")
    (tmp_path / "new").replace(path)
    assert log.job_fields(42, 1)["geco_fields"] == {"JOB_ID": "42", "SGE_TASK_ID": "1"}


def test_a_removed_file_or_an_instance_not_known_forgets_the_task(tmp_path: Path,
                                                                  known: None) -> None:
    """Given job 7.1 known from a file, then a set that knows neither value (an older geco's
    file) forgets it; and known again, removing the file forgets it too."""
    path = tmp_path / "7.1"
    path.write_text("x")
    log.job_instance(7, 1, "c", 1.0, path)
    log.job_instance(7, 1, "", 0.0, path)
    assert "SGE_CLUSTER" not in log.job_fields(7, 1)["geco_fields"]
    log.job_instance(7, 1, "c", 0.0, path)
    assert log.job_fields(7, 1)["geco_fields"]["SGE_CLUSTER"] == "c"
    assert "JOB_SUBMITTED" not in log.job_fields(7, 1)["geco_fields"]
    path.unlink()
    assert "SGE_CLUSTER" not in log.job_fields(7, 1)["geco_fields"]


def test_the_oldest_known_task_goes_first_past_the_limit(tmp_path: Path, known: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Given room for 2 tasks, when 1.1, 2.1, then 1.1 again and 3.1 are made known, then
    2.1 (the least recently known) is forgotten, 1.1 and 3.1 kept."""
    monkeypatch.setattr(log, "_MAX_INSTANCES", 2)
    path = tmp_path / "f"
    path.write_text("x")
    for job in (1, 2, 1, 3):
        log.job_instance(job, 1, f"c{job}", 0.0, path)
    assert [log.job_fields(j, 1)["geco_fields"].get("SGE_CLUSTER") for j in (1, 2, 3)] == [
        "c1", None, "c3"]


@pytest.mark.parametrize(("seconds", "text"), [
    (1795303085.0, "1795303085"),
    (1795303085311469 / 1e6, "1795303085.311469"),  # Open Cluster Scheduler: microseconds
    (1795303085.3114691, "1795303085.311469"),  # any rounding to the same microsecond
    (0.5, "0.5"),
])
def test_job_submitted_is_seconds_to_the_microsecond(seconds: float, text: str) -> None:
    assert log.submitted_text(seconds) == text


def test_the_native_journal_entry_carries_newlines_safely() -> None:
    """journald's protocol: KEY=value lines, or KEY\\n<le64 length><data>\\n for data with
    a newline, so a job name with a newline cannot inject a field."""
    entry = log._native_entry({"MESSAGE": "a\nJOB_ID=666", "JOB_ID": "42"})
    assert entry == (b"MESSAGE\n" + (12).to_bytes(8, "little") + b"a\nJOB_ID=666\n"
                     b"JOB_ID=42\n")


# A hook's logging, in a process of its own as Grid Engine starts one: python -S, isolated
# as -I isolates it (-s -P, an environment of its own) but with the checkout on PYTHONPATH
# (which -I ignores), records to stderr and to a journal socket of the test's.
HOOK_LOGGING = r"""
import sys
from geco import log
log._JOURNAL_SOCKET = sys.argv[1]
logger = log.setup_hook("warn", identifier="geco-prolog")
log.get("prolog").info("only to the journal")
log.get("prolog").warning("job %s.%s: %s", 42, 1, "slow qmaster",
                          extra=log.job_fields(42, 1, "qstat-retried", TRIES=2))
log.close()
print(sorted(m for m in ("logging", "socket", "dataclasses") if m in sys.modules))
"""


def test_a_hook_logs_to_stderr_and_the_journal_without_the_standard_librarys_logging(
        tmp_path: Path) -> None:
    """Given a hook's logging at level warn, then a warning is one seed line on stderr and
    one journal entry with the job's fields, priority and identifier; an info record reaches
    the journal only; and neither logging nor socket was imported (a hook's start-up)."""
    sock_path = str(tmp_path / "journal.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.bind(sock_path)
        journal.settimeout(10)
        out = subprocess.run([sys.executable, "-S", "-s", "-P", "-c", HOOK_LOGGING, sock_path],
                             env={"PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                             timeout=60)
        entries = [journal.recv(65536).decode().splitlines() for _ in range(2)]
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    [line] = out.stderr.splitlines()
    assert LINE.match(line) and line.endswith("]: job 42.1: slow qmaster"), line
    info, warning = (dict(f.split("=", 1) for f in e) for e in entries)
    assert (info["MESSAGE"], info["PRIORITY"]) == ("only to the journal", "6")
    assert {k: warning[k] for k in ("MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "JOB_ID",
                                    "SGE_TASK_ID", "GECO_EVENT", "TRIES", "CODE_LINE")} == {
        "MESSAGE": "job 42.1: slow qmaster", "PRIORITY": "4",
        "SYSLOG_IDENTIFIER": "geco-prolog", "JOB_ID": "42", "SGE_TASK_ID": "1",
        "GECO_EVENT": "qstat-retried", "TRIES": "2", "CODE_LINE": "7"}
    assert warning["CODE_FILE"] == "<string>"


def test_records_of_a_hook_reach_a_standard_library_handler_only_when_one_listens(
        restored_geco_logger: logging.Logger, capsys: pytest.CaptureFixture[str]) -> None:
    """Given a hook's logging, when a handler is on the stdlib ``geco`` logger (a job's
    trace, a test), then it gets the records too, with their fields; none before."""
    log.setup_hook("quiet")
    try:
        log.get("x").warning("before")
        records = RecordingHandler()
        restored_geco_logger.addHandler(records)
        restored_geco_logger.setLevel(logging.DEBUG)
        log.get("x").debug("after %d", 1, extra=log.job_fields(7, 1, "e"))
    finally:
        log.close()
    assert [(r.name, r.getMessage(), r.geco_fields) for r in records.records] == [  # type: ignore[attr-defined]
        ("geco.x", "after 1", {"JOB_ID": "7", "SGE_TASK_ID": "1", "GECO_EVENT": "e"})]
    assert capsys.readouterr().err == ""
