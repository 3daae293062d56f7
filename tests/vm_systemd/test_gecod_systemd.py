"""gecod as a real systemd service on cgroup v2: notify, watchdog, and jobs that outlive gecod.

Runs INSIDE the QEMU machine (systemd as PID 1, pure cgroup v2) as root, from
the guest's own copy of the repository (``/root/geco``, with the hwloc bridge
built there): ``tests/system/test_gecod_systemd_vm.py`` boots it and runs
``python3 -m pytest ... tests/vm_systemd`` there. The tests install the units
of ``conf/`` as they ship (gecod.service with only ``ExecStart=`` pointing at
a venv over this copy), a key from ``geco keygen`` and a geco.toml with
``[cgroup] v2_base`` in geco-jobs.service, then drive everything with
systemctl and read the results from the kernel (``/proc/<pid>/cgroup``, the
cgroup files) and from journald.

The tests form one story, in file order: gecod starts (active only after
READY=1), contains a job process, survives past its watchdog period, lets the
OOM killer take one job without the rest, is restarted, killed (systemd starts it
again) and stopped while a job runs (the job stays, in its cgroup), and refuses two
wrong layouts with one line each. A job here is a Python process working in a fake execd spool
dir ``<spool>/<host>/active_jobs/<job>.1`` (``environment`` file, and a
resource file written with :mod:`geco.sge.resourcefile`, so no qstat is needed) that
sends JOB_STARTED for itself with the key, as the preload does.

They rewrite /etc/geco and /etc/systemd/system, so they run only in the
throw-away VM (``RUNINVM=1``, set by run-in-vm.sh).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from geco import config
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.wire import client

REPO = Path(__file__).resolve().parents[2]
MOUNT = Path("/sys/fs/cgroup")
JOBS_UNIT = "geco-jobs.service"
UNIT_CGROUP = MOUNT / "system.slice" / JOBS_UNIT
V2_BASE = UNIT_CGROUP / "jobs"
GECOD_CGROUP = MOUNT / "system.slice" / "gecod.service"
UNIT_DIR = Path("/etc/systemd/system")
VENV = Path("/root/geco-venv")
CONFIG = Path("/etc/geco/geco.toml")
KEY = Path("/etc/geco/quarantine.key")
SOCKET = "path:/run/geco/gecod.sock"
# not below /tmp, which systemd-tmpfiles cleans by age
SPOOL = Path("/var/spool/geco-vmtest")
RESOURCES = config.Config().resources_dir  # /var/lib/geco: gecod's StateDirectory=
HOST = short_hostname()
MiB = 1 << 20
CONTROLLERS = {"cpuset", "memory", "pids"}
# slow emulated machine: generous limits for anything systemd or Python does
SLOW = 180.0


def _why_not() -> str:
    if os.environ.get("RUNINVM") != "1":
        return ("these tests install systemd units and rewrite /etc/geco: they run only in "
                "the throw-away VM (tests/system/test_gecod_systemd_vm.py)")
    if os.geteuid() != 0:
        return "installing units and writing cgroups needs root"
    if Path("/proc/1/comm").read_text().strip() != "systemd":
        return "systemd is not PID 1 here"
    controllers = (MOUNT / "cgroup.controllers").read_text().split() \
        if (MOUNT / "cgroup.controllers").exists() else []
    if not {"cpuset", "memory"} <= set(controllers):
        return f"{MOUNT} is no cgroup2 with cpuset and memory"
    return ""


pytestmark = [pytest.mark.vm, pytest.mark.skipif(bool(_why_not()), reason=_why_not())]

# The job process: JOB_STARTED for itself with the key (as the preload sends it), print
# the ACK's status, then optionally fill memory, then wait until stdin closes.
CLIENT = r"""
import os, sys
from geco.wire import address, client
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import JobStarted, MsgType
key = open(sys.argv[1], "rb").read()
job, hog = int(sys.argv[2]), int(sys.argv[3])
frame = encode(MsgType.JOB_STARTED, JobStarted(job, 1, os.getpid()), key)
reply = client.request(address.parse(sys.argv[4]), frame, 60)
status = decode_ack(reply, key, frame[12:28]).status.name
print(status, flush=True)
if hog and status == "OK":
    filled = bytearray(b"\x01") * hog  # every page written: only the job's limit stops it
sys.stdin.read()
"""


# -- the machine ----------------------------------------------------------------


def sh(*argv: str, check: bool = True, timeout: float = SLOW) -> subprocess.CompletedProcess[str]:
    """Run a command; with ``check``, fail with its output and gecod's journal tail."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}"
                             f"{proc.stderr}\n--- journal:\n{journal_tail()}")
    return proc


def journal_tail() -> str:
    return subprocess.run(["journalctl", "-u", "gecod", "-u", JOBS_UNIT, "-n", "40",
                           "--no-pager"], capture_output=True, text=True, check=False).stdout


def show(unit: str, *props: str) -> dict[str, str]:
    """``systemctl show -p ...`` as a dict."""
    out = sh("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def is_active(unit: str) -> str:
    return sh("systemctl", "is-active", unit, check=False).stdout.strip()


def journal(since: float, *matches: str) -> list[dict[str, Any]]:
    """Journal entries matching ``matches`` (``FIELD=value``) received after ``since``."""
    out = sh("journalctl", "--no-pager", "-o", "json", f"--since=@{int(since)}", *matches).stdout
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [e for e in entries if int(e["__REALTIME_TIMESTAMP"]) >= since * 1e6]


def read(path: Path) -> str:
    return path.read_text().strip()


def status() -> dict[str, Any]:
    """gecod's STATUS document, asked once (no retry: gecod must be serving now)."""
    cfg = config.Config(gecod_socket=SOCKET)
    return client.status(cfg, timeout=30)


def write_config(v2_base: Path | str) -> None:
    CONFIG.parent.mkdir(mode=0o755, exist_ok=True)
    CONFIG.write_text(f'[paths]\nexecd_spool_dir = "{SPOOL}"\n'
                      f'[cgroup]\nversion = "2"\nv2_base = "{v2_base}"\n'
                      '[qstat]\ncommand = "/bin/false"\nretries = 0\n')


def start_failure(since: float) -> dict[str, Any]:
    """The one line a refused gecod wrote to stderr (the journal), after ``since``."""
    lines = [e for e in journal(since, "_SYSTEMD_UNIT=gecod.service")
             if str(e.get("MESSAGE", "")).startswith("gecod: ")]
    assert lines, f"gecod logged no refusal:\n{journal_tail()}"
    return lines[0]


def refused_start(base: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Restart gecod with [cgroup] v2_base = ``base``; return the restart and gecod's one-line
    refusal, then put the good configuration back (gecod stays stopped)."""
    write_config(base)
    since = time.time()
    try:
        failed = sh("systemctl", "restart", "gecod", check=False)
        entry = start_failure(since)
    finally:
        sh("systemctl", "stop", "gecod")
        sh("systemctl", "reset-failed", "gecod", check=False)
        write_config(V2_BASE)
    return failed, entry


# -- jobs -------------------------------------------------------------------------


@dataclass
class Job:
    """A job process working in its spool dir."""

    job: int
    proc: subprocess.Popen[str]

    @property
    def key(self) -> str:
        return f"{self.job}.1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def answer(self, timeout: float = SLOW) -> str:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.proc.kill()
            raise AssertionError(f"job {self.key} got no ACK\n{journal_tail()}")
        line = self.proc.stdout.readline().strip()
        if not line:
            raise AssertionError(f"job {self.key} died: {self.proc.stderr.read()}")
        return line

    def cgroup(self) -> str:
        """The cgroup2 path from /proc/<pid>/cgroup."""
        return Path(f"/proc/{self.pid}/cgroup").read_text().strip().removeprefix("0::")

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Story:
    """What the tests share: the jobs started so far and gecod's first start."""

    jobs: dict[str, Job] = field(default_factory=dict)
    started: float = 0.0

    def start_job(self, job: int, memory: int, hog: int = 0) -> Job:
        d = SPOOL / HOST / "active_jobs" / f"{job}.1"
        d.mkdir(parents=True)
        (d / "environment").write_text(f"JOB_ID={job}\nSGE_TASK_ID=undefined\nJOB_NAME=t\n")
        (d / "config").write_text(f"job_owner=root\njob_name=t\njob_id={job}\n")
        (d / "pe_hostfile").write_text(f"{HOST} 1 all.q@{HOST} UNDEFINED\n")
        resourcefile.write(RESOURCES, ResourceSet(
            job, 1, job_name="t", owner="root",
            nodes=(NodeResources(HOST, slots=1, memory_limit=memory),)))
        proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(KEY), str(job), str(hog), SOCKET], cwd=d,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        j = Job(job, proc)
        self.jobs[j.key] = j
        return j


def _install() -> None:
    """A venv over the guest's copy, the key, the config, the units as conf/ ships them."""
    if not VENV.exists():
        sh(sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(VENV))
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (VENV / "lib" / pyver / "site-packages" / "geco.pth").write_text(f"{REPO}\n")
    script = VENV / "bin" / "geco"  # what pip makes of [project.scripts] geco
    script.write_text(f"#!{VENV}/bin/python3\nimport sys\nfrom geco.cli import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    KEY.parent.mkdir(mode=0o755, exist_ok=True)
    sh(str(script), "keygen", "--force", str(KEY))
    write_config(V2_BASE)
    SPOOL.mkdir(mode=0o755, parents=True, exist_ok=True)
    shutil.copy(REPO / "conf" / JOBS_UNIT, UNIT_DIR / JOBS_UNIT)
    lines = (REPO / "conf" / "gecod.service").read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("ExecStart=")]
    assert len(starts) == 1, starts
    lines[starts[0]] = f"ExecStart={script} daemon"
    (UNIT_DIR / "gecod.service").write_text("\n".join(lines) + "\n")
    sh("systemctl", "daemon-reload")


@pytest.fixture(scope="module")
def story() -> Iterator[Story]:
    _install()
    s = Story()
    try:
        yield s
    finally:
        for j in s.jobs.values():
            j.proc.kill()
            j.proc.wait()
        sh("systemctl", "stop", "gecod", JOBS_UNIT, check=False)


# -- the story --------------------------------------------------------------------


def test_given_the_units_when_gecod_starts_then_it_is_active_only_once_it_serves(
        story: Story) -> None:
    """Given the shipped units (Type=notify), when gecod starts, then systemctl reports
    activating until gecod sent READY=1 and active from then on, and the first moment it
    says active gecod already answers STATUS; gecod stays in its own cgroup, geco-jobs'
    placeholder was moved into <unit>/holder, and cpuset, memory, pids reach the base."""
    assert show("gecod", "Type", "NotifyAccess") == {"Type": "notify", "NotifyAccess": "all"}
    story.started = time.time()
    sh("systemctl", "start", "--no-block", "gecod")
    seen: list[str] = []
    deadline = time.monotonic() + SLOW
    while not seen or seen[-1] != "active":
        state = is_active("gecod")
        if not seen or seen[-1] != state:
            seen.append(state)
        failed = state == "failed" or (state == "inactive" and "activating" in seen)
        assert not failed, (seen, journal_tail())
        assert time.monotonic() < deadline, (seen, journal_tail())
        time.sleep(0.02)
    doc = status()

    assert seen[-2:] == ["activating", "active"], seen
    assert doc["pid"] == int(show("gecod", "MainPID")["MainPID"])
    assert Path(f"/proc/{doc['pid']}/cgroup").read_text() == "0::/system.slice/gecod.service\n"
    holder = int(show(JOBS_UNIT, "MainPID")["MainPID"])
    assert read(UNIT_CGROUP / "cgroup.procs") == ""
    assert read(UNIT_CGROUP / "holder" / "cgroup.procs") == str(holder)
    for d in (UNIT_CGROUP, V2_BASE):
        assert set(read(d / "cgroup.subtree_control").split()) >= CONTROLLERS, d


def test_given_a_job_process_when_it_sends_job_started_then_it_is_in_its_cgroup_under_v2_base(
        story: Story) -> None:
    """Given a spooled job with a 256 MiB resource file, when its process sends JOB_STARTED
    for itself, then the ACK is OK, the kernel shows it in <v2_base>/<job>.1 with one cpu
    and memory.max 256 MiB, and gecod's journal has the quarantine with its JOB_ID."""
    job = story.start_job(4201, 256 * MiB)

    assert job.answer() == "OK"
    assert job.cgroup() == f"/system.slice/{JOBS_UNIT}/jobs/4201.1"
    d = V2_BASE / job.key
    cpus = read(d / "cpuset.cpus")
    assert cpus in {str(c) for c in os.sched_getaffinity(0)}, cpus
    assert read(d / "memory.max") == str(256 * MiB)
    [entry] = journal(story.started, "_SYSTEMD_UNIT=gecod.service", "GECO_EVENT=quarantined",
                      "JOB_ID=4201")
    assert (entry["SGE_TASK_ID"], entry["PID"], entry["_SYSTEMD_UNIT"]) == \
        ("1", str(job.pid), "gecod.service")


def test_given_two_jobs_when_one_overruns_its_memory_then_only_it_is_killed(
        story: Story) -> None:
    """Given job 4201 running, when job 4202 fills 200 MiB against its 64 MiB limit, then
    the OOM killer takes 4202 alone: geco-jobs.service stays active (OOMPolicy=continue;
    systemd's default would stop the unit and kill every job) and 4201 runs on. 4202's
    process is the one gecod moved in from the job's spool dir (its shepherd, to gecod),
    so gecod ends that job when it dies, counting the kill (job-end OOM_KILLS)."""
    before = show(JOBS_UNIT, "MainPID", "ActiveEnterTimestampMonotonic")
    hog = story.start_job(4202, 64 * MiB, hog=200 * MiB)

    assert hog.answer() == "OK"
    assert hog.proc.wait(SLOW) == -9
    deadline = time.monotonic() + SLOW
    while not (ends := journal(story.started, "_SYSTEMD_UNIT=gecod.service",
                               "GECO_EVENT=job-end", "JOB_ID=4202")):
        assert time.monotonic() < deadline, f"gecod never ended job 4202:\n{journal_tail()}"
        time.sleep(0.5)
    assert (ends[0]["OOM_KILLS"], ends[0]["CLEANED_BY"]) == ("1", "gecod")
    assert not (V2_BASE / hog.key).exists()
    time.sleep(2)  # systemd reacts to memory.events asynchronously
    assert is_active(JOBS_UNIT) == "active"
    assert show(JOBS_UNIT, "MainPID", "ActiveEnterTimestampMonotonic") == before
    assert story.jobs["4201.1"].alive()


def test_given_gecod_running_when_a_watchdog_period_and_a_half_passed_then_it_was_never_killed(
        story: Story) -> None:
    """Given WatchdogSec= from the unit, when 1.5 periods have passed since gecod became
    active, then it is the same process, never restarted, and its last WATCHDOG=1 came
    after the first period had half passed twice (the loop's timer pings at half of it)."""
    unit_text = (REPO / "conf" / "gecod.service").read_text()
    period = int(next(line for line in unit_text.splitlines()
                      if line.startswith("WatchdogSec=")).split("=")[1])
    first = show("gecod", "WatchdogUSec", "MainPID", "ActiveEnterTimestampMonotonic")
    assert first["WatchdogUSec"] == f"{period}s"
    entered = int(first["ActiveEnterTimestampMonotonic"]) / 1e6
    time.sleep(max(0.0, entered + 1.5 * period - time.monotonic()))

    now = show("gecod", "MainPID", "ActiveState", "NRestarts", "WatchdogTimestampMonotonic")
    assert (now["MainPID"], now["ActiveState"], now["NRestarts"]) == \
        (first["MainPID"], "active", "0")
    last_ping = int(now["WatchdogTimestampMonotonic"]) / 1e6
    assert last_ping - entered >= 0.9 * period, (last_ping, entered)


def test_given_a_running_job_when_gecod_restarts_then_the_job_stays_and_gecod_lists_it(
        story: Story) -> None:
    """Given job 4201 contained, when `systemctl restart gecod`, then a new gecod is active,
    the job process lives on in the same cgroup with the same limits, the new gecod
    rebuilt it from the cgroup tree (journal) and lists it in STATUS."""
    job = story.jobs["4201.1"]
    d = V2_BASE / job.key
    limits = (read(d / "cpuset.cpus"), read(d / "memory.max"))
    old = show("gecod", "MainPID")["MainPID"]
    since = time.time()

    sh("systemctl", "restart", "gecod")

    new = show("gecod", "MainPID", "ActiveState")
    assert new["ActiveState"] == "active" and new["MainPID"] != old
    assert job.alive() and job.cgroup() == f"/system.slice/{JOBS_UNIT}/jobs/4201.1"
    assert (read(d / "cpuset.cpus"), read(d / "memory.max")) == limits
    [rebuilt] = journal(since, "_SYSTEMD_UNIT=gecod.service", "GECO_EVENT=gecod-state-rebuilt")
    assert rebuilt["_PID"] == new["MainPID"] and "4201.1" in rebuilt["JOBS"].split(",")
    jobs = {j["key"]: j for j in status()["jobs"]}
    assert jobs["4201.1"]["cpus"] == limits[0]
    assert jobs["4201.1"]["pids"] == 1


def test_given_a_running_job_when_gecod_is_killed_then_systemd_starts_it_again_and_it_lists_it(
        story: Story) -> None:
    """Given job 4201 contained, when gecod dies of SIGKILL (`systemctl kill -s KILL
    gecod`), then systemd starts it again (Restart=on-failure), geco-jobs.service is
    untouched, and the job lives on in the same cgroup with the same limits, listed by the
    new gecod with its cpus."""
    job = story.jobs["4201.1"]
    d = V2_BASE / job.key
    limits = (read(d / "cpuset.cpus"), read(d / "memory.max"))
    holder = show(JOBS_UNIT, "MainPID", "ActiveEnterTimestampMonotonic")
    old = show("gecod", "MainPID")["MainPID"]

    sh("systemctl", "kill", "-s", "KILL", "gecod")

    deadline = time.monotonic() + SLOW
    while not ((now := show("gecod", "MainPID", "ActiveState"))["MainPID"] not in ("0", old)
               and now["ActiveState"] == "active"):
        assert time.monotonic() < deadline, (now, journal_tail())
        time.sleep(0.2)
    assert show(JOBS_UNIT, "MainPID", "ActiveEnterTimestampMonotonic") == holder
    assert job.alive() and job.cgroup() == f"/system.slice/{JOBS_UNIT}/jobs/4201.1"
    assert (read(d / "cpuset.cpus"), read(d / "memory.max")) == limits
    jobs = {j["key"]: j for j in status()["jobs"]}
    assert jobs["4201.1"]["cpus"] == limits[0]


def test_given_a_running_job_when_gecod_stops_then_the_job_stays_and_a_new_gecod_lists_it(
        story: Story) -> None:
    """Given job 4201 contained, when `systemctl stop gecod`, then gecod is inactive, its
    stop is journaled, the job runs on in its cgroup and geco-jobs.service is untouched;
    `systemctl start gecod` returns once gecod serves, and it lists the job."""
    job = story.jobs["4201.1"]
    holder = show(JOBS_UNIT, "MainPID", "ActiveEnterTimestampMonotonic")
    since = time.time()

    sh("systemctl", "stop", "gecod")

    assert is_active("gecod") == "inactive"
    assert job.alive() and job.cgroup() == f"/system.slice/{JOBS_UNIT}/jobs/4201.1"
    assert show(JOBS_UNIT, "MainPID", "ActiveEnterTimestampMonotonic") == holder
    [stopping] = journal(since, "_SYSTEMD_UNIT=gecod.service", "GECO_EVENT=gecod-stopping")
    assert stopping["SIGNAL"] == "SIGTERM"
    sh("systemctl", "start", "gecod")
    assert "4201.1" in {j["key"] for j in status()["jobs"]}


def test_given_running_jobs_when_systemd_reloads_then_the_delegated_tree_is_left_alone(
        story: Story) -> None:
    """Given the job tree, when `systemctl daemon-reload`, then geco-jobs' cgroup still
    passes cpuset, memory, pids down and the job keeps its cpus (systemd drops controllers
    it thinks are its own on a reload, never in a delegated subtree)."""
    d = V2_BASE / "4201.1"
    cpus = read(d / "cpuset.cpus")

    sh("systemctl", "daemon-reload")

    for top in (UNIT_CGROUP, V2_BASE):
        assert set(read(top / "cgroup.subtree_control").split()) >= CONTROLLERS, top
    assert read(d / "cpuset.cpus") == cpus
    assert story.jobs["4201.1"].alive()


def test_given_v2_base_inside_gecods_own_cgroup_when_it_starts_then_it_refuses_in_one_line(
        story: Story) -> None:
    """Given [cgroup] v2_base in gecod.service's own cgroup, when gecod starts, then it exits
    with one line saying why (a restart would fail with 219/CGROUP) and what to use instead,
    and creates nothing there."""
    base = GECOD_CGROUP / "jobs"
    failed, entry = refused_start(base)

    assert failed.returncode != 0
    assert entry["MESSAGE"] == (
        f"gecod: [cgroup] v2_base {base} lies in the cgroup of gecod.service, and this "
        f"process (pid {entry['_PID']}) runs in that cgroup itself: {GECOD_CGROUP} must pass "
        "controllers down, so it may hold no process, and systemd could not start "
        "gecod.service again while jobs run below it (status 219/CGROUP); keep job cgroups "
        "in a unit of their own (geco-jobs.service), or have systemd start gecod.service in "
        "a sub-cgroup (DelegateSubgroup=, systemd 254 or later) "
        f"(path={GECOD_CGROUP})")
    assert not base.exists()


def test_given_v2_base_in_a_unit_without_delegate_when_gecod_starts_then_it_names_the_fix(
        story: Story) -> None:
    """Given [cgroup] v2_base in a running unit without Delegate=yes, when gecod starts,
    then it exits with one line naming that unit and Delegate=yes, and writes nothing into
    the cgroups systemd owns; with v2_base back, gecod serves and the job ran throughout."""
    unit = "geco-nodeleg.service"
    (UNIT_DIR / unit).write_text("[Service]\nExecStart=/bin/sleep infinity\n")
    sh("systemctl", "daemon-reload")
    sh("systemctl", "start", unit)
    cgroup = MOUNT / "system.slice" / unit
    base = cgroup / "jobs"
    failed, entry = refused_start(base)

    assert failed.returncode != 0
    assert entry["MESSAGE"] == (
        f"gecod: [cgroup] v2_base {base} lies in the cgroup of {unit}, which systemd does "
        f"not delegate (it would undo geco's settings there): set Delegate=yes in {unit} "
        f"(path={cgroup})")
    assert not base.exists() and read(cgroup / "cgroup.subtree_control") == ""
    sh("systemctl", "start", "gecod")
    assert "4201.1" in {j["key"] for j in status()["jobs"]}
    assert story.jobs["4201.1"].alive()


def test_given_a_running_job_when_the_placeholder_is_killed_then_the_job_runs_on(
        story: Story) -> None:
    """Given job 4201 in geco-jobs.service, when its placeholder dies of SIGKILL, then the
    unit stays active (exited) rather than stopping, so the job is neither killed nor
    moved, and gecod still serves it (RemainAfterExit=, SuccessExitStatus=SIGKILL)."""
    job = story.jobs["4201.1"]
    holder = int(show(JOBS_UNIT, "MainPID")["MainPID"])

    os.kill(holder, signal.SIGKILL)

    deadline = time.monotonic() + SLOW
    while show(JOBS_UNIT, "MainPID")["MainPID"] != "0":
        assert time.monotonic() < deadline, journal_tail()
        time.sleep(0.1)
    time.sleep(1)  # anything systemd does about it has been done
    assert show(JOBS_UNIT, "ActiveState", "SubState") == \
        {"ActiveState": "active", "SubState": "exited"}
    assert job.alive() and job.cgroup() == f"/system.slice/{JOBS_UNIT}/jobs/4201.1"
    assert is_active("gecod") == "active"
    assert "4201.1" in {j["key"] for j in status()["jobs"]}


def test_given_the_default_base_under_systemd_when_gecod_starts_then_it_warns_with_the_fix(
        story: Story) -> None:
    """Given no [cgroup] v2_base on this systemd machine, when gecod starts, then it serves
    (job cgroups in /sys/fs/cgroup/GECO, as without systemd) and journals a warning that
    systemd owns that part of the tree, naming geco-jobs.service and the v2_base to set."""
    write_config("")
    since = time.time()
    try:
        sh("systemctl", "restart", "gecod")
        [entry] = journal(since, "_SYSTEMD_UNIT=gecod.service",
                          "GECO_EVENT=cgroup-base-not-delegated")
    finally:
        write_config(V2_BASE)
        sh("systemctl", "restart", "gecod")

    assert (entry["MESSAGE"], entry["PRIORITY"], entry["CGROUP"]) == (
        f"job cgroups live in {MOUNT}/GECO, outside any delegated systemd unit: systemd owns "
        "that part of the tree and may undo geco's settings there (drop +cpuset on a "
        "daemon-reload); install conf/geco-jobs.service and set [cgroup] v2_base = "
        f'"{V2_BASE}"', "4", f"{MOUNT}/GECO")
    assert "4201.1" in {j["key"] for j in status()["jobs"]}
