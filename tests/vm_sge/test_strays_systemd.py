"""The systemd door out of a job, tried on the modern node: linger and ``systemd-run --user``.

Runs INSIDE the QEMU machine, after tests/vm_sge/test_sge_systemd.py (same boot,
same Grid Engine with geco's starter only: gecod ends each job when its shepherd
exits). With linger on for a user, their own systemd manager (``user@UID.service``)
runs whatever they ask of it, outside every job, for as long as it likes: a job
can leave a process behind with ``systemd-run --user``. Only a machine with systemd
as PID 1 has this door; the host's suite tries ``at`` and ``crontab``
(tests/integration/test_strays_live.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.integration import livekit as kit
from tests.jobdirkit import JobDir

SLOW = 300.0  # the emulated machine is ~8x slower than the host
GECO = "/usr/bin/geco"
# up to 300 s; a sleep each 2 s (each is a fork and an exec: ~55 ms of the emulated CPU)
WAIT_FOR = "i=0; while [ ! -s {0} ] && [ $i -lt 150 ]; do sleep 2; i=$((i+1)); done\n"


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_a_process_a_job_starts_with_systemd_run_user_under_linger_dies_with_the_job(
        sge: Any, job_dir: JobDir, journal: Any) -> None:
    """Given linger on for a job's owner (``geco check`` names the door), when their job
    starts ``sleep 600`` through ``systemd-run --user`` and ends, then that process ran in
    the user's manager (outside the job), and gecod kills it after the job and journals
    strays-killed naming it."""
    owner = job_dir.owner
    manager = f"user@{owner.uid}.service"
    pidfile, go = job_dir.path / "door.pid", job_dir.path / "door.go"
    # the job runs before linger is on: a job of the owner's that ended just before (an
    # earlier test's) has its stray pass [strays] delay later, which spares a user who has
    # a job running but would end a manager that linger had started by then
    job = job_dir.submit("door", script=(
        WAIT_FOR.format(go) + "export XDG_RUNTIME_DIR=/run/user/$(id -u)\n"
        # systemd expands a unit's command line: "$$$$" reaches sh as "$$"
        f"systemd-run --user --quiet --collect sh -c 'echo $$$$ > {pidfile}; exec sleep 600'\n"
        + WAIT_FOR.format(pidfile)))
    kit.wait_for_cgroups(f"{job}.1", timeout=SLOW)
    subprocess.run(["loginctl", "enable-linger", owner.name], check=True)
    try:
        kit.wait_until(lambda: subprocess.run(
            ["systemctl", "is-active", "--quiet", manager], check=False).returncode == 0,
            SLOW, f"{manager} started by linger")
        check = subprocess.run([GECO, "check"], capture_output=True, text=True, check=False)
        go.write_text("go\n")
        try:
            kit.wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), SLOW,
                           "the door's pid written")
        except AssertionError as late:
            errors = job_dir.path / f"door.e{job}"
            raise AssertionError(f"{late}; the job's stderr: "
                                 f"{errors.read_text() if errors.exists() else '-'}") from None
        pid = int(pidfile.read_text())
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        [record] = sge.wait_finished(job, timeout=SLOW)
        try:
            [entry] = journal.wait_for(SLOW, JOB_ID=str(job), GECO_EVENT="strays-killed")
        except TimeoutError:  # say what happened instead: kept (why), or killed for another job
            story = [f"{e.get('GECO_EVENT')}: {e.get('MESSAGE')}"
                     for e in journal.entries(JOB_ID=str(job))]
            others = [f"job {e.get('JOB_ID')}: {e.get('MESSAGE')}"
                      for e in journal.entries(GECO_EVENT="strays-killed", USER=owner.name)]
            raise AssertionError(f"no strays-killed for job {job}; its journal: {story}; "
                                 f"strays-killed of {owner.name}: {others}") from None
        kit.wait_until(lambda: not alive(pid), SLOW, f"the door's process {pid} gone")
    finally:
        subprocess.run(["loginctl", "disable-linger", owner.name], check=False)
    assert check.returncode == 1, check.stdout
    assert any(line.startswith("open  systemd linger is on for ") and owner.name in line
               for line in check.stdout.splitlines()), check.stdout
    assert f"/user.slice/user-{owner.uid}.slice/{manager}/" in cgroup, cgroup
    assert "geco-jobs.service" not in cgroup
    assert record["exit_status"] == "0"
    assert (entry["USER"], entry["CLEANED_BY"]) == (owner.name, "gecod")
    assert f"{pid}:sleep" in entry["COMMANDS"].split(), entry["COMMANDS"]
