"""`geco status --job` on real cgroups and `geco journal` on a real journal, as the commands run.

The commands run as subprocesses (``python -m geco.cli`` of this working tree),
as root and as the unprivileged user ``nobody``, the way an admin and a job
owner would type them.

``status --job``: a job cgroup is made with the cgroup v1 backend under a test
parent ``geco-test-<pid>-<n>`` (a config file names it), a process is moved
in, a resource file and a spooled ``config`` are written; the command must
show the kernel's cpus, limits, the process and the running time, and say in
one line when the cgroups are gone. The parent is removed afterwards with
plain syscalls (tests/cgroup_testkit.py), whatever the code under test did.

``journal``: events of a made-up job (a random 9-digit id, so runs do not
see each other's entries) are logged through geco.log as the hooks and gecod
do, into the session's journald (the ``journal`` fixture); the command must
print them in order, as journalctl sees them, and the job-end summary.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco import log
from geco.accounting import Accounting
from geco.cgroup import Limits, V1Backend, find_hierarchies, parse_mountinfo
from geco.reports.journalview import JOURNAL_DIRS
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from tests.cgroup_testkit import (
    parse_list,
    reap,
    start_in,
    usable_v1_hierarchies,
    v1_backend,
)

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/opt/geco-dev/venv/bin/python"
HOST = short_hostname()
MiB = 1 << 20
MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
if not WHY_NOT and HIER["cpuset"] != MOUNTED["cpuset"]:
    # the command finds its cgroups where detect() does: at the top of each hierarchy
    WHY_NOT = (f"an idle cpu_exclusive cpuset ({HIER['cpuset'].mount_point}) holds this "
               f"machine's cpus, so no top-level test cpuset can get one")
needs_cgroups = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
NO_CGROUPS = "has no cgroups on {host} (not running here, or already ended)"
CANNOT_READ = ("geco journal: cannot read the journal: add yourself to the systemd-journal "
               "group or ask an admin")


def geco(*args: str, config: Path | None = None, user: str | None = None,
         tz: str = "UTC") -> subprocess.CompletedProcess[str]:
    """Run ``geco ARGS`` from this working tree with a clean environment (as ``user``)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "TZ": tz,
           "PYTHONPATH": str(REPO)}
    if config is not None:
        env["GECO_CONFIG"] = str(config)
    argv = [PYTHON, "-m", "geco.cli", *args]
    if user is not None:
        argv = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items()),
                *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env,
                          check=False)


def nobody_can(*argv: str) -> bool:
    """True when the command succeeds as user nobody."""
    return subprocess.run(["runuser", "-u", "nobody", "--", *argv], capture_output=True,
                          timeout=30, check=False).returncode == 0


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A fresh directory every user may read (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="geco-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------
# geco status --job
# ---------------------------------------------------------------------------


@pytest.fixture
def backend(children: list[int]) -> Iterator[V1Backend]:
    """A v1 backend on a fresh geco-test-* parent, removed with plain syscalls afterwards
    (``children``: tests/system/conftest.py)."""
    with v1_backend(MOUNTED, exclusive_cpus=False) as b:
        yield b


def sleeper(out: int) -> None:
    os.close(out)
    os.execvp("sleep", ["sleep", "300"])


@pytest.mark.root
@needs_cgroups
def test_status_of_a_running_job_shows_the_kernels_figures_then_one_line_when_gone(
        backend: V1Backend, children: list[int], world_dir: Path) -> None:
    """Given job <id>.1 with a cgroup (one cpu, 256M RAM, 512M RAM+swap), a sleeping process
    in it, a resource file (owner alice, h_rt 1 h) and a spooled config 90 s old,
    when `geco status --job <id>.1 -v` runs as root, then it shows those cpus, limits, the
    process with its command, and ~90 s of the h_rt; as nobody, --json says the same;
    and once the process is gone and the cgroups removed, it says so in one line, exit 1."""
    job = random.randrange(10**8, 10**9)
    key = f"{job}.1"
    cpu = str(max(parse_list(backend.available_cpus())))
    backend.create(key, Limits(cpus=cpu, memory=256 * MiB, memory_swap=512 * MiB, pids=64))
    child = start_in(backend, key, sleeper, children)
    state, spool = world_dir / "state", world_dir / "spool"
    config = world_dir / "geco.toml"
    config.write_text(f'[paths]\nstate_dir = "{state}"\nexecd_spool_dir = "{spool}"\n'
                      f'[cgroup]\nname = "{backend.name}"\nversion = "1"\n')
    resourcefile.write(state / "resources", ResourceSet(
        job_id=job, task_id=1, runtime_limit=3600.0, owner="alice", job_name="sim.sh",
        nodes=(NodeResources(HOST, slots=1),)))
    spooled = spool / HOST / "active_jobs" / key / "config"
    spooled.parent.mkdir(parents=True)
    spooled.write_text(f"job_id={job}\n")
    started = time.time() - 90
    os.utime(spooled, (started, started))
    # the child execs sleep after it was moved in; wait until /proc says so
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/comm").read_text().strip() != "sleep":
        assert time.monotonic() < deadline, "the test child never became sleep"
        time.sleep(0.01)
    cpu_counted = "cpu_user_usec" in backend.usage(key)

    shown = geco("status", "--job", key, "-v", config=config)

    assert (shown.returncode, shown.stderr) == (0, "")
    lines = shown.stdout.split("\n")
    mems = (backend.paths(key)["cpuset"] / "cpuset.mems").read_text().strip()
    assert lines[:5] == [f"job {key} on {HOST}", "  owner        alice", "  name         sim.sh",
                         f"  cores        {cpu}", f"  NUMA nodes   {mems}"]
    assert re.fullmatch(r"  memory       \S+ now, peak \S+, limit 256M", lines[5]), lines[5]
    assert lines[6] == "  memory+swap  limit 512M"
    if cpu_counted:
        assert re.fullmatch(r"  CPU          \d+\.\d s user \+ \d+\.\d s system", lines[7])
    else:
        assert lines[7] == ("  CPU          not accounted on this node (no cpuacct cgroup "
                            "for the job)")
    assert lines[8] == "  OOM kills    0"
    assert re.fullmatch(r"  tasks        1 now, (peak 1, )?limit 64", lines[9]), lines[9]
    assert lines[10:12] == ["  processes    1", f"  {'':11}    {child.pid}  sleep"]
    assert re.fullmatch(r"  running for  0:01:3\d of h_rt 1:00:00 \(3%\)", lines[12]), lines[12]
    assert lines[13:] == [""]

    as_nobody = geco("status", "--job", str(job), "--json", config=config, user="nobody")

    assert (as_nobody.returncode, as_nobody.stderr) == (0, "")
    doc = json.loads(as_nobody.stdout)
    assert doc["host"] == HOST
    [st] = doc["jobs"]
    assert (st["key"], st["owner"], st["cpus"], st["memory_limit"], st["memory_swap_limit"],
            st["processes"], st["oom_kills"], st["runtime_limit"]) == (
        key, "alice", cpu, 256 * MiB, 512 * MiB, [{"pid": child.pid, "command": "sleep"}], 0,
        3600.0)
    assert 0 < st["memory_current"] <= st["memory_peak"]
    assert 90 <= st["running_for"] < 150
    assert (st["cpu_user"] is not None) == cpu_counted
    assert (st["pids_limit"], st["pids_current"]) == (64, 1)

    reap([child.pid])
    assert backend.wait_empty(key, 10)
    backend.destroy(key)
    gone = geco("status", "--job", key, config=config)
    assert (gone.returncode, gone.stdout, gone.stderr) == (
        1, "", f"geco status: job {key} {NO_CGROUPS.format(host=HOST)}\n")
    gone_job = geco("status", "--job", str(job), config=config, user="nobody")
    assert (gone_job.returncode, gone_job.stdout, gone_job.stderr) == (
        1, "", f"geco status: job {job} {NO_CGROUPS.format(host=HOST)}\n")


def test_status_without_job_still_asks_gecod(world_dir: Path) -> None:
    """Given a gecod socket path where nothing listens, when `geco status` runs without
    --job, then it fails asking gecod (exit 1, one line), not reading cgroups."""
    config = world_dir / "geco.toml"
    config.write_text(f'[gecod]\nsocket = "path:{world_dir}/none.sock"\n')
    proc = geco("status", config=config)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", f"geco status: gecod is not running (no socket at {world_dir}/none.sock)\n")


def test_verbose_without_job_is_a_usage_error() -> None:
    proc = geco("status", "-v")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", "geco status: -v goes with --job\n")


# ---------------------------------------------------------------------------
# geco journal
# ---------------------------------------------------------------------------


def log_job_story(job: int) -> None:
    """Journal a job's life the way the prolog, gecod and the epilog do (task 1), plus one
    entry of task 2."""
    log.setup("quiet", identifier="geco-prolog")
    log.get("prolog").info(
        "job %s.1 contained on %s: cores 0, NUMA nodes 0, memory 256M", job, HOST,
        extra=log.job_fields(job, 1, "job-contained", CPUS="0", MEMS="0",
                             MEMORY_LIMIT=256 * MiB, OWNER="alice"))
    log.setup("quiet", identifier="gecod")
    log.get("oom").warning(
        "job %s.1 on %s: the kernel killed process 4242 (python) for using 256M", job, HOST,
        extra=log.job_fields(job, 1, "oom", LIMIT=256 * MiB, PEAK=256 * MiB, PID=4242,
                             COMMAND="python", OOM_KILLS=1))
    log.get("quarantine").info("quarantined process 4343 into job %s.2", job,
                               extra=log.job_fields(job, 2, "quarantined", PID=4343))
    log.setup("quiet", identifier="geco-epilog")
    acc = Accounting(memory_peak=3 << 29, cpu_user=12.345, cpu_system=0.4, oom_kills=1)
    log.get("teardown").info(
        "job %s.1 ended: %s; cgroups removed, 2 leftover process(es) killed", job,
        acc.describe(), extra=log.job_fields(job, 1, "job-end", KILLED=2, CLEANED_BY="epilog",
                                             **acc.journal_fields()))


def utc(usec: str) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(usec) / 1e6))


def story_columns(stdout: str) -> list[list[str]]:
    """The entry lines of `geco journal` as [date, time, (key,) identifier, event, message]."""
    return [line.split(None, 5 if re.match(r"\S+ \S+  \d+\.\d+  ", line) else 4)
            for line in stdout.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", line)]


@pytest.mark.root
def test_journal_tells_the_story_in_order_as_journalctl_sees_it(
        journal: Any, restored_geco_logger: None) -> None:
    """Given prolog, gecod and epilog entries of a made-up job (task 1, one of task 2), when
    `geco journal <id>.1` runs, then it prints each task-1 entry (UTC time, identifier, event,
    message) in journalctl's order, then the job-end summary; `geco journal <id>` shows task 2
    too, with the task on each line; --json gives journalctl's values."""
    job = random.randrange(10**8, 10**9)
    log_job_story(job)
    journal.wait_for(JOB_ID=str(job), GECO_EVENT="job-end")
    seen = journal.entries(0, JOB_ID=str(job))  # journalctl -o json, oldest first
    task1 = [e for e in seen if e["SGE_TASK_ID"] == "1"]
    assert [e["GECO_EVENT"] for e in task1] == ["job-contained", "oom", "job-end"]

    one = geco("journal", f"{job}.1")

    assert (one.returncode, one.stderr) == (0, "")
    assert story_columns(one.stdout) == [
        [*utc(e["__REALTIME_TIMESTAMP"]).split(), e["SYSLOG_IDENTIFIER"], e["GECO_EVENT"],
         e["MESSAGE"]] for e in task1]
    assert one.stdout.splitlines()[-1] == (
        f"job {job}.1 ended {utc(task1[-1]['__REALTIME_TIMESTAMP'])}: peak memory 1.5G, "
        f"CPU 12.3 s user + 0.4 s system, 1 OOM kill, 2 processes killed at cleanup "
        f"(by epilog)")
    assert len(one.stdout.splitlines()) == len(task1) + 1

    both = geco("journal", str(job))

    assert both.returncode == 0
    assert story_columns(both.stdout) == [
        [*utc(e["__REALTIME_TIMESTAMP"]).split(), f"{job}.{e['SGE_TASK_ID']}",
         e["SYSLOG_IDENTIFIER"], e["GECO_EVENT"], e["MESSAGE"]] for e in seen]
    assert both.stdout.splitlines()[-1] == f"job {job}.2: no job-end entry yet (still running?)"

    as_json = geco("journal", f"{job}.1", "--json")

    assert as_json.returncode == 0
    docs = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [{k: e[k] for k in d} for d, e in zip(docs, task1, strict=True)] == docs
    assert "_PID" not in docs[0] and "_PID" in json.loads(
        geco("journal", f"{job}.1", "--json", "--all-fields").stdout.splitlines()[0])


def test_a_job_the_journal_never_saw_is_one_line_exit_1(journal: Any) -> None:
    job = random.randrange(10**8, 10**9)
    proc = geco("journal", f"{job}.3")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", f"geco journal: the journal on {HOST} has no entry of job {job}.3\n")


@pytest.mark.root
def test_journal_as_nobody_shows_what_the_journal_files_let_nobody_see(
        journal: Any, restored_geco_logger: None) -> None:
    """Given the session's journald (started by hand here: its files are root's, 0640, in a
    0750 directory; a distribution's journald adds the systemd-journal group and ACLs), when
    nobody runs `geco journal <id>`, then nobody gets the one-line "cannot read" sentence
    naming a journal path nobody indeed cannot read, exit 1 -- or, where the files are
    world-readable, the same story root sees."""
    job = random.randrange(10**8, 10**9)
    log_job_story(job)
    journal.wait_for(JOB_ID=str(job), GECO_EVENT="job-end")

    proc = geco("journal", str(job), user="nobody")

    stores = [d for d in JOURNAL_DIRS if d.is_dir()]
    files = sorted(str(p) for d in stores for p in d.glob("*/system*.journal"))
    if files and not any(nobody_can("test", "-r", f) for f in files):
        found = re.fullmatch(re.escape(CANNOT_READ) + r" \(path=(\S+)\)\n", proc.stderr)
        assert found, proc.stderr
        assert (proc.returncode, proc.stdout) == (1, "")
        named = found.group(1)
        assert named.startswith(tuple(f"{d}/" for d in stores))
        assert not nobody_can("test", "-r", named) or not nobody_can("ls", named)
    else:
        assert (proc.returncode, proc.stderr) == (0, "")
        assert proc.stdout == geco("journal", str(job)).stdout


# -- check_access on made-up journal stores, as nobody ------------------------


def check_access_as_nobody(store: Path) -> tuple[int, str]:
    """Run journalview.check_access([store's parent], machine id "m") as nobody."""
    code = ("import sys\nfrom pathlib import Path\nfrom geco.reports import journalview\n"
            "from geco.errors import GecoError\n"
            f"try:\n    print(journalview.check_access([Path({str(store.parent)!r})], 'm'))\n"
            "except GecoError as exc:\n    print(exc)\n    sys.exit(1)\n")
    proc = subprocess.run(["runuser", "-u", "nobody", "--", "env", f"PYTHONPATH={REPO}",
                           PYTHON, "-c", code], capture_output=True, text=True, timeout=30,
                          check=False)
    return proc.returncode, proc.stdout.strip() + proc.stderr.strip()


@pytest.fixture
def store(world_dir: Path) -> Path:
    path = world_dir / "journal" / "m"
    path.mkdir(parents=True)
    path.parent.chmod(0o755)
    return path


def journal_file(store: Path, name: str, mode: int) -> Path:
    path = store / name
    path.write_bytes(b"LPKSHHRH")
    path.chmod(mode)
    return path


@pytest.mark.root
@pytest.mark.parametrize("store_mode", [0o750, 0o700], ids=["0750", "0700"])
def test_a_store_nobody_may_not_list_is_named(store: Path, store_mode: int) -> None:
    """Given a root-only store directory holding system.journal, then nobody is told that
    the journal cannot be read, naming the directory."""
    journal_file(store, "system.journal", 0o640)
    store.chmod(store_mode)
    assert check_access_as_nobody(store) == (
        1, f"{CANNOT_READ.removeprefix('geco journal: ')} (path={store})")


@pytest.mark.root
def test_unreadable_system_files_are_named_the_first_in_order(store: Path) -> None:
    """Given a listable store whose system.journal and archive are 0640 root, then the
    sentence names system.journal (the first in name order)."""
    journal_file(store, "system@0001-0002.journal", 0o640)
    first = journal_file(store, "system.journal", 0o640)
    store.chmod(0o755)
    assert check_access_as_nobody(store) == (
        1, f"{CANNOT_READ.removeprefix('geco journal: ')} (path={first})")


@pytest.mark.root
def test_some_readable_files_let_it_read_and_list_the_others(store: Path) -> None:
    """Given a readable system.journal and an unreadable archive, then reading goes on and
    the unreadable archive is returned (the CLI warns that entries may be missing); a user's
    own journal files do not count."""
    journal_file(store, "system.journal", 0o644)
    archive = journal_file(store, "system@0001-0002.journal~", 0o600)
    journal_file(store, "user-1000.journal", 0o600)
    store.chmod(0o755)
    assert check_access_as_nobody(store) == (0, f"[PosixPath('{archive}')]")


@pytest.mark.root
def test_no_journal_files_is_not_an_access_problem(store: Path) -> None:
    store.chmod(0o755)
    assert check_access_as_nobody(store) == (0, "[]")
