"""Log lines in the original GECO's format, with its five levels."""

from __future__ import annotations

import io
import logging
import re

import pytest

from geco import log

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


def test_the_native_journal_entry_carries_newlines_safely() -> None:
    """journald's protocol: KEY=value lines, or KEY\\n<le64 length><data>\\n for data with
    a newline, so a job name with a newline cannot inject a field."""
    entry = log._native_entry({"MESSAGE": "a\nJOB_ID=666", "JOB_ID": "42"})
    assert entry == (b"MESSAGE\n" + (12).to_bytes(8, "little") + b"a\nJOB_ID=666\n"
                     b"JOB_ID=42\n")
