"""A real Grid Engine runs geco on the modern node: systemd as PID 1, pure cgroup v2.

Runs INSIDE the QEMU machine: ``tests/system/test_sge_systemd_vm.py`` boots it,
copies this repository onto the guest's disk, installs geco's package with apt as an
admin would (it enables and starts gecod.service with geco-jobs.service, and its
drop-in makes sge_execd load geco's exec() preload), then this module. Its
``sge`` fixture (tests/conftest.py) brings up a single-host Grid Engine with
``integration/sge/setup.sh``, which under systemd runs the daemons as
sgemaster.service and sgeexecd.service: execd gets the preload from the drop-in,
and the queue only geco's starter (``GECO_TEST_HOOKS=starter``): gecod contains
each job at its shepherd's exec and ends it when the shepherd exits.

Jobs are submitted by an unprivileged user and report from inside (probe.py)
what the kernel says; the tests read the same from the cgroup files, systemd and
the real journal. They form one story in file order (one boot): the install, a batch
job, an OOM kill. A ``-pe`` job and its ``qrsh -inherit`` task are contained through the
package's upgrade (tests/vm_sge/test_package_lifecycle.py): one job there shows both.
gecod restarted, SIGKILLed and stopped and systemd reloaded while a job runs are the v2
boot's (tests/vm_systemd), where what systemd does is shown; the same with Grid Engine's
jobs, the host's (tests/integration/test_faults.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration import livekit as kit
from tests.jobdirkit import JobDir
from tests.unitkit import SLOW, main_pid, systemctl

MOUNT = Path("/sys/fs/cgroup")
JOBS = kit.V2_JOBS
PRELOAD = "/usr/lib/geco/libgeco_preload.so"
M = 1 << 20


def _why_not() -> str:
    if os.environ.get("RUNINVM") != "1":
        return ("these tests install systemd units and a Grid Engine: they run only in the "
                "throw-away VM (tests/system/test_sge_systemd_vm.py)")
    if Path("/proc/1/comm").read_text().strip() != "systemd":
        return "systemd is not PID 1 here"
    if "memory" not in (MOUNT / "cgroup.controllers").read_text().split():
        return f"{MOUNT} is no cgroup2 with memory"
    return ""


pytestmark = [pytest.mark.vm, pytest.mark.skipif(bool(_why_not()), reason=_why_not())]


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text().strip().removeprefix("0::")


def finished(sge: Any, job_dir: JobDir, name: str, job: int) -> dict[str, str]:
    """The job's one accounting record, once it ended with exit 0 and an empty .e file."""
    [record] = sge.wait_finished(job, timeout=SLOW)
    assert (record["exit_status"], record["failed"]) == ("0", "0"), job_dir.output(
        name, job, stream="e")
    assert job_dir.output(name, job, stream="e") == ""
    return record


def test_install_put_gecod_the_job_subtree_and_the_preload_under_systemd(sge: Any) -> None:
    """Given geco's package on a systemd node, then gecod is enabled and running in its
    unit, the jobs' subtree is geco-jobs.service, and sge_execd (sgeexecd.service) runs
    with geco's preload from the drop-in."""
    assert systemctl("is-enabled", "gecod.service") == "enabled"
    assert systemctl("is-active", "gecod.service", "geco-jobs.service").split() == [
        "active", "active"]
    assert cgroup_of(main_pid("gecod.service")) == "/system.slice/gecod.service"
    assert f'v2_base = "{JOBS}"' in Path("/etc/geco/geco.toml").read_text()
    execd = main_pid("sgeexecd.service")
    assert Path(f"/proc/{execd}/comm").read_text().strip() == "sge_execd"
    environ = Path(f"/proc/{execd}/environ").read_bytes().split(b"\0")
    assert f"LD_PRELOAD={PRELOAD}".encode() in environ


def test_a_batch_job_runs_on_one_whole_core_with_its_ram_and_swap_limits(
        sge: Any, job_dir: JobDir, journal: Any) -> None:
    """Given a one-slot job with m_mem_free=300M and h_vmem=400M, then from inside it sees
    its cgroup in geco-jobs.service, one cpu, memory.max 300M and memory.swap.max 100M
    (RAM+swap = h_vmem); it ends normally and its cgroup is gone; and journalctl JOB_ID=N
    tells its story in order."""
    job = job_dir.submit("batch", "-l", "m_mem_free=300M,h_vmem=400M")
    finished(sge, job_dir, "batch", job)
    [report] = [r for r in job_dir.reports("batch", job) if "cgroups" in r]

    assert report["cgroups"] == {"unified": f"/{JOBS.relative_to(MOUNT)}/{job}.1"}
    assert len(report["cpus"]) == 1
    assert report["v2"] == {"cpuset.cpus.effective": str(report["cpus"][0]),
                            "memory.max": str(300 * M), "memory.swap.max": str(100 * M)}
    assert report["env"]["GECO_MEMORY_LIMIT"] == str(300 * M)
    kit.wait_until(lambda: not (JOBS / f"{job}.1").exists(), 60, "the job's cgroup removed")

    story = [e["GECO_EVENT"] for e in journal.entries(JOB_ID=str(job)) if "GECO_EVENT" in e]
    wanted = ["quarantined", "job-started", "job-end"]
    assert [e for e in story if e in wanted] == wanted, story
    assert "prolog-done" not in story and "epilog-done" not in story


def test_a_job_over_its_memory_is_oom_killed_and_told_in_its_e_file_and_the_journal(
        sge: Any, job_dir: JobDir, journal: Any) -> None:
    """Given m_mem_free=100M and a job that fills 300M, then the kernel kills it at its
    limit; gecod finds the kill through memory.events, the owner reads why in the job's
    .e file, and the journal has the oom event and OOM_KILLS=1 in the job's end."""
    job = job_dir.submit("oom", "-l", "m_mem_free=100M", probe="--alloc 300")
    [record] = sge.wait_finished(job, timeout=SLOW)
    assert record["exit_status"].split()[0] == "137", record  # "137 (Killed)": SIGKILL
    stderr = job_dir.output("oom", job, stream="e")
    assert f"geco: job {job} on node" in stderr
    assert "used more memory than it requested" in stderr
    [oom] = journal.wait_for(60, JOB_ID=str(job), GECO_EVENT="oom")
    assert oom["LIMIT"] == str(100 * M)
    [end] = journal.wait_for(60, JOB_ID=str(job), GECO_EVENT="job-end")
    assert end["OOM_KILLS"] == "1"
