"""The exec() preload stays in sge_execd: a real job never carries it.

For this module sge_execd runs with ``LD_PRELOAD=/usr/lib/geco/libgeco_preload.so``
and a real gecod serves the site configuration's socket (the ``gecod`` fixture).
The preload holds the quarantine key, so it must live only where it is meant to:
the shepherd's exec drops geco's entry from ``LD_PRELOAD`` (Open Cluster
Scheduler's execd passes its own environment on: tests/system/test_ocs_preload.py
shows that way; Son of Grid Engine's job gets none), and the library itself does
nothing in a program other than sge_execd or sshd (tests/system/test_preload.py
shows that part without Grid Engine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from geco import config
from tests.cleanslate import SITE_CONFIG

pytestmark = pytest.mark.sge

LIBRARY = "libgeco_preload.so"


def execd_pid(host: str) -> int:
    """The running sge_execd, from its pid file in the execd spool dir."""
    spool = config.load(SITE_CONFIG).execd_spool_dir
    return int((Path(spool) / host / "execd.pid").read_text())


def test_a_job_has_no_geco_library_mapped_while_execd_has(
        sge: Any, gecod: Any, job_dir: Any) -> None:
    """Given sge_execd running with the preload (its /proc/<pid>/maps lists it), when a job
    runs, then the job's own /proc/self/maps has no geco library and its environment no
    LD_PRELOAD."""
    maps = Path(f"/proc/{execd_pid(sge.host)}/maps").read_text()
    assert LIBRARY in maps, "sge_execd runs without the preload: the test would prove nothing"
    job = job_dir.submit("maps", script='grep -c geco /proc/self/maps\n'
                                        'echo "LD_PRELOAD=${LD_PRELOAD-unset}"\n')
    [record] = sge.wait_finished(job, timeout=120)
    assert record["exit_status"] == "0"
    assert job_dir.output("maps", job).splitlines() == ["0", "LD_PRELOAD=unset"]


def test_a_job_that_loads_the_preload_itself_gets_an_inert_library(
        sge: Any, gecod: Any, job_dir: Any) -> None:
    """Given a job submitted with -v LD_PRELOAD=<the geco library> (Son of Grid Engine 8.1.9
    passes it to the job: it is the owner's own process), when the job's shell runs a
    program called sge_shepherd, then the library is mapped but does nothing: the program
    runs, and no "geco:" line (no config, no key, no quarantine attempt) reaches the job's
    stderr."""
    job = job_dir.submit("inert", "-v", f"LD_PRELOAD=/usr/lib/geco/{LIBRARY}",
                         script="cp /bin/echo ./sge_shepherd\n./sge_shepherd ran\n"
                                f"grep -q {LIBRARY} /proc/self/maps && echo mapped\n")
    [record] = sge.wait_finished(job, timeout=120)
    assert record["exit_status"] == "0"
    assert job_dir.output("inert", job).splitlines() == ["ran", "mapped"]
    assert job_dir.output("inert", job, stream="e") == ""
