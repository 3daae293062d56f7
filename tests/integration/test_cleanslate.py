"""The clean slate a test session starts from (tests/cleanslate.py), given the leftovers
that made whole modules fail: demo.sh's gecod on the site socket, a site configuration a
killed session left rewritten, jobs, a queue and a job cgroup with a frozen process."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from geco import cgroup, config
from geco.cgroup import Limits
from tests.cleanslate import (
    SITE_CONFIG,
    SITE_CONFIG_SAVED,
    SITE_SOCKET,
    alive,
    clean_slate,
    is_geco_daemon,
    listener_pid,
    report_line,
    stop_process,
)

pytestmark = pytest.mark.sge

REPO = Path(__file__).resolve().parents[2]
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# a session killed while a test had the site configuration rewritten
KILLED_INSIDE_SITE_SETTINGS = """
import time
from tests.integration.livekit import site_settings
with site_settings({("gecod", "reaper_interval"): 7.0}):
    print("inside", flush=True)
    time.sleep(600)
"""


def sh(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=CLEAN_ENV,
                          check=check)


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.1)


def kill_a_session_inside_site_settings() -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILLED_INSIDE_SITE_SETTINGS],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(CLEAN_ENV, PYTHONPATH=str(REPO)))
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "inside\n"
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def start_gecod_as_demo_does(log: Path) -> int:
    """``geco daemon`` as demo.sh starts it: env -i, setsid, from /, orphaned (not ours to
    reap); return its pid, as the kernel names the socket's listener."""
    sh(["sh", "-c", "(cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin setsid "
        f"/usr/bin/geco daemon </dev/null >>{log} 2>&1 &)"])
    wait_until(lambda: listener_pid() is not None, 30, f"gecod serving {SITE_SOCKET}")
    pid = listener_pid()
    assert pid is not None
    return pid


def test_demo_gecod_and_a_rewritten_site_config_are_undone_and_said_in_one_line(
        sge: Any, tmp_path: Path) -> None:
    """Given the gecod demo.sh leaves serving the site socket and a session SIGKILLed
    while it had /etc/geco/geco.toml rewritten, when the clean slate runs, then that gecod
    is gone, nothing serves the socket, the file is back byte for byte without its backup,
    and one line says both; a second clean slate has nothing to do and says nothing."""
    assert listener_pid() is None, f"something serves {SITE_SOCKET} already"
    original = SITE_CONFIG.read_bytes()
    kill_a_session_inside_site_settings()
    left = SITE_CONFIG.read_bytes(), SITE_CONFIG_SAVED.exists()
    pid = start_gecod_as_demo_does(tmp_path / "gecod.log")
    try:
        daemon = is_geco_daemon(pid)
        line = report_line(clean_slate())
        gone, serving = not alive(pid), listener_pid()
        restored, backup_left = SITE_CONFIG.read_bytes(), SITE_CONFIG_SAVED.exists()
        again = clean_slate()
    finally:
        if alive(pid) and is_geco_daemon(pid):
            stop_process(pid)
        if SITE_CONFIG.read_bytes() != original:
            SITE_CONFIG.write_bytes(original)
        SITE_CONFIG_SAVED.unlink(missing_ok=True)

    assert left[0] != original and b"reaper_interval = 7.0" in left[0] and left[1]
    assert daemon
    assert gone and serving is None
    assert restored == original and not backup_left
    assert line.startswith("geco tests: ") and "\n" not in line
    assert (f"stopped gecod pid {pid} left serving {SITE_SOCKET} (by demo.sh or an "
            "interrupted run)") in line
    assert f"restored {SITE_CONFIG}" in line
    assert again == [] and report_line(again) == ""


def test_jobs_a_test_queue_and_a_stale_job_cgroup_with_a_frozen_process_are_removed(
        sge: Any, job_owner: Any) -> None:
    """Given a held job of the test user, a queue named geco-test-* and the cgroups of a
    job Grid Engine does not run, holding a process in a frozen geco-test-* freezer
    sub-cgroup (what a session killed in the unkillable-member test leaves), when the clean
    slate runs, then the job and the queue are deleted, the process is dead and the job's
    cgroups are gone, and the line names each."""
    backend = cgroup.for_config(config.load(SITE_CONFIG))
    job = sge.submit("-h", "-b", "y", "/bin/true")
    queue = "geco-test-leftover.q"
    key = f"{job}.1"  # a job that never ran here: no execd spool dir, and soon deleted
    conf = {**sge.queue_config(), "qname": queue, "slots": "1"}
    path = Path(f"/tmp/{queue}")
    path.write_text("".join(f"{k} {v}\n" for k, v in conf.items()))
    sh(["qconf", "-Aq", str(path)])
    backend.create(key, Limits())
    frozen = backend.paths(key)["freezer"] / "geco-test-frozen"
    stray = subprocess.Popen(["sleep", "300"], start_new_session=True, env=CLEAN_ENV)
    try:
        backend.add_pid(key, stray.pid)
        frozen.mkdir()
        (frozen / "cgroup.procs").write_text(str(stray.pid))
        (frozen / "freezer.state").write_text("FROZEN")
        wait_until(lambda: (frozen / "freezer.state").read_text().strip() == "FROZEN", 10,
                   "the freezer")
        time.sleep(2.5)  # the reaper judges only cgroups older than two of its rounds
        line = report_line(clean_slate())
        status = stray.wait(timeout=30)
        left = backend.exists(key)
        queues = sh(["qconf", "-sql"]).stdout.split()
        known = sge.is_known(job)
    finally:
        with contextlib.suppress(OSError):
            (frozen / "freezer.state").write_text("THAWED")
        stray.kill()
        stray.wait(timeout=30)
        with contextlib.suppress(OSError):
            frozen.rmdir()
        with contextlib.suppress(Exception):
            backend.destroy(key)
        sh(["qdel", "-f", str(job)], check=False)
        sh(["qconf", "-dq", queue], check=False)
        path.unlink()

    assert status == -signal.SIGKILL
    assert not left
    assert queue not in queues
    assert not known
    assert f"deleted 1 leftover job of {job_owner.name} ({job})" in line
    assert f"removed the leftover queue {queue}" in line
    assert f"removed 1 stale job cgroup ({key})" in line
