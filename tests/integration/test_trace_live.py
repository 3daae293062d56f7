"""Per-job trace files on the real Grid Engine (`-l geco_trace_level=N`).

integration/sge/setup.sh configures the complex geco_trace_level (INT,
requestable) with a global capacity of 4, so a job may ask for levels 1-4. Such
a job gets ``<trace_dir>/<job>.<task>.trace`` ([log] trace_dir of
/etc/geco/geco.toml): what geco's root hooks did for it at that level, root's
file, readable by its owner only (through the owner's private group). A job
that asks for nothing gets no file. Under gecod (last test: gecod and the
exec() preload, as in production) gecod's lines about the job land in the same
file.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import pytest

from geco import config
from tests.cleanslate import SITE_CONFIG
from tests.integration.livekit import sh

pytestmark = pytest.mark.sge

# "<ISO time> <program> [<pid>|<LEVEL>]: <message>": the seed format plus who wrote it
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} (gecod|geco-[a-z]+) "
                  r"\[\d+\|(EMERG|ERROR|WARN |INFO |DEBUG)\]: ")


def trace_dir() -> Path:
    return config.load(SITE_CONFIG).trace_dir


def test_a_job_with_geco_trace_level_4_gets_a_trace_file_only_its_owner_can_read(
        sge: Any, job_dir: Any, job_owner: Any) -> None:
    """Given a job submitted with -l geco_trace_level=4, when it has ended, then
    <trace_dir>/<job>.1.trace exists, is root's with the owner's group and mode 0640, the
    owner can read it, and it has seed-format lines from the prolog and the epilog, debug
    lines included; none from the starter, which runs as the owner and writes no trace."""
    job = job_dir.submit("traced", "-l", "geco_trace_level=4", script="echo traced\n")
    [record] = sge.wait_finished(job, timeout=90)
    path = trace_dir() / f"{job}.1.trace"
    info = path.stat()
    as_owner = sh(["runuser", "-u", job_owner.name, "--", "cat", str(path)], check=False)
    as_other = sh(["runuser", "-u", "nobody", "--", "cat", str(path)], check=False)
    lines = path.read_text().splitlines()

    assert record["exit_status"] == "0"
    assert job_dir.output("traced", job) == "traced\n"
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, job_owner.gid, 0o640)
    assert as_owner.returncode == 0 and as_owner.stdout.splitlines() == lines
    assert as_other.returncode != 0 and "Permission denied" in as_other.stderr
    parsed = [m.groups() for m in map(LINE.match, lines) if m]
    assert LINE.match(lines[0]), lines[0]
    assert {p for p, _ in parsed} == {"geco-prolog", "geco-epilog"}, lines
    assert "DEBUG" in {level for _, level in parsed}
    assert any(f"job {job}.1" in line for line in lines)


def test_a_job_without_geco_trace_level_gets_no_trace_file(sge: Any, job_dir: Any) -> None:
    """Given a job that does not request geco_trace_level, then no trace file is written."""
    job = job_dir.submit("untraced", script="echo untraced\n")
    [record] = sge.wait_finished(job, timeout=90)

    assert record["exit_status"] == "0"
    assert not (trace_dir() / f"{job}.1.trace").exists()


def test_under_gecod_the_trace_also_has_what_gecod_did_for_the_job(
        sge: Any, gecod: Any, job_dir: Any) -> None:
    """Given gecod and the exec() preload, when a job with -l geco_trace_level=4 runs, then its
    trace file also has gecod's lines about it (the shepherd's quarantine), between the
    hooks' lines."""
    job = job_dir.submit("traced-gecod", "-l", "geco_trace_level=4", script="echo traced\n")
    [record] = sge.wait_finished(job, timeout=90)
    lines = (trace_dir() / f"{job}.1.trace").read_text().splitlines()
    parsed = [m.groups() for m in map(LINE.match, lines) if m]

    assert record["exit_status"] == "0"
    assert {"gecod", "geco-prolog", "geco-epilog"} <= {p for p, _ in parsed}
    assert any(m and m.group(1) == "gecod" and f"into job {job}.1" in line
               for line, m in zip(lines, map(LINE.match, lines), strict=True)), lines
