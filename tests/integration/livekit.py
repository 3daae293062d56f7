"""What the Grid Engine tests of a job's end share: site configuration edits, adopted
processes (joined to a job's cgroups from outside Grid Engine, as an ssh session would
be), job cgroup paths, waiting.

Job cgroups are where this machine's geco puts them: this host's v1 hierarchies
(``<controller>/GECO/<job>.<task>``), or, on a pure cgroup v2 under systemd (the QEMU
machine, where some of these tests run too), ``geco-jobs.service``'s subtree.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.cleanslate import site_config_rewritten
from tests.servicekit import POLL

CGROUP_ROOT = Path("/sys/fs/cgroup")
V2 = (CGROUP_ROOT / "cgroup.controllers").exists()  # one unified hierarchy, nothing else
V2_JOBS = CGROUP_ROOT / "system.slice" / "geco-jobs.service" / "jobs"  # install.sh's v2_base
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Python for a job script: verdict(path) is "open", or the errno's name the kernel gave
# (a GPU device node without a driver: ENXIO where the job's cgroup allows it, EPERM where
# it denies it)
OPEN_VERDICT = """import errno, os
def verdict(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return "open"
    except OSError as exc:
        return errno.errorcode[exc.errno]
"""


def sh(argv: list[str], check: bool = True,
       timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a command with a clean environment; raise with its output when check fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=CLEAN_ENV)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(str(value))


def with_setting(toml: str, section: str, key: str, value: object) -> str:
    """The configuration text with ``[section] key = value``: the key replaced where the
    section has it, else added right under the section's header, else a new section
    (never a second copy of a key: that would make the file invalid TOML)."""
    lines = toml.splitlines()
    line = f"{key} = {toml_value(value)}"
    current, header = None, None
    for i, text in enumerate(lines):
        found = re.match(r"^\s*\[([^\]]+)\]\s*(#.*)?$", text)
        if found:
            current = found.group(1).strip()
            if current == section and header is None:
                header = i
            continue
        if current == section and re.match(rf"^\s*{re.escape(key)}\s*=", text):
            lines[i] = line
            return "\n".join(lines) + "\n"
    if header is not None:
        lines.insert(header + 1, line)
        return "\n".join(lines) + "\n"
    return "\n".join([*lines, "", f"[{section}]", line]) + "\n"


@contextlib.contextmanager
def site_settings(settings: Mapping[tuple[str, str], object],
                  gecod: Any = None) -> Iterator[None]:
    """Set ``{(section, key): value}`` in /etc/geco/geco.toml (what hooks and gecod read;
    the hooks never read $GECO_CONFIG) for the with-block, then restore the file byte for
    byte (a session killed meanwhile leaves a backup that the next one's clean slate puts
    back: cleanslate.site_config_rewritten). With *gecod* (a conftest.Gecod), gecod is
    restarted after each change: a restart re-reads everything, including timers a SIGHUP
    would not re-arm."""
    def edit(text: str) -> str:
        for (section, key), value in settings.items():
            text = with_setting(text, section, key, value)
        return text

    try:
        with site_config_rewritten(edit):
            if gecod is not None:
                gecod.stop()
                gecod.start()
            yield
    finally:
        if gecod is not None:
            gecod.stop()
            gecod.start()


def job_cgroups(key: str) -> dict[str, Path]:
    """``{controller: directory}`` of the job's cgroups that exist (v1: one per hierarchy;
    v2: the job's one directory for each controller)."""
    if V2:
        path = V2_JOBS / key
        return dict.fromkeys(("cpuset", "freezer", "memory", "pids"), path) if path.is_dir() \
            else {}
    found = {}
    for hierarchy in sorted(CGROUP_ROOT.iterdir()):
        path = hierarchy / "GECO" / key
        if path.is_dir():
            found[hierarchy.name] = path
    return found


def _paths_in(proc_cgroup: str) -> dict[str, str]:
    """``{controller: path}`` of a ``/proc/<pid>/cgroup`` text (cgroup2: ``unified``)."""
    paths = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else ["unified"]:
            paths[controller] = path
    return paths


def job_of(proc_cgroup: str) -> str:
    """The job (``<job>.<task>``) a ``/proc/<pid>/cgroup`` text places its process in, ""
    when none. On v1 the cpuset and memory hierarchies must name the same job."""
    paths = _paths_in(proc_cgroup)
    if V2:
        base = f"/{V2_JOBS.relative_to(CGROUP_ROOT)}/"
        where = paths.get("unified", "")
        return where.removeprefix(base) if where.startswith(base) else ""
    cpuset, memory = (paths.get(c, "") for c in ("cpuset", "memory"))
    jobs = {path.removeprefix("/GECO/") if path.startswith("/GECO/") else ""
            for path in (cpuset, memory)}
    assert len(jobs) == 1, f"cpuset {cpuset} and memory {memory} differ:\n{proc_cgroup}"
    return jobs.pop()


def outside_the_job(proc_cgroup: str, key: str) -> list[str]:
    """The hierarchies of job ``key`` (every one geco made it a cgroup in; v2: the one)
    where a ``/proc/<pid>/cgroup`` text does not place its process in the job."""
    paths = _paths_in(proc_cgroup)
    if V2:
        where = f"/{(V2_JOBS / key).relative_to(CGROUP_ROOT)}"
        return [] if paths.get("unified") == where else [f"unified: {paths.get('unified')}"]
    return [f"{hierarchy}: {paths.get(controller)}" for hierarchy in sorted(job_cgroups(key))
            for controller in hierarchy.split(",")  # cpu,cpuacct is one hierarchy
            if paths.get(controller) != f"/GECO/{key}"]


def job_cpus(key: str) -> str:
    """The cpu list a job's cpuset gives it (``0`` or ``0-1``)."""
    return (job_cgroups(key)["cpuset"] / "cpuset.cpus").read_text().strip()


def job_memory_limit(key: str) -> int:
    """The job's memory limit in bytes (v1 memory.limit_in_bytes, v2 memory.max)."""
    name = "memory.max" if V2 else "memory.limit_in_bytes"
    return int((job_cgroups(key)["memory"] / name).read_text())


# a shell line printing the memory limit of the cgroup it runs in, as a session sees it
OWN_MEMORY_LIMIT = ("cat /sys/fs/cgroup$(grep ^0:: /proc/self/cgroup | cut -d: -f3)/memory.max"
                    if V2 else "cat /sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | "
                    "cut -d: -f3)/memory.limit_in_bytes")


def wait_for_cgroups(key: str, timeout: float = 60) -> dict[str, Path]:
    """Wait until the job's freezer and memory cgroups exist (made by gecod or the prolog)."""
    deadline = time.monotonic() + timeout
    while True:
        dirs = job_cgroups(key)
        if {"freezer", "memory"} <= set(dirs) and (dirs["memory"] / "cgroup.procs").read_text():
            return dirs
        assert time.monotonic() < deadline, f"job {key} got no populated cgroups in {timeout} s"
        time.sleep(0.1)


@contextlib.contextmanager
def running_job(sge: Any, *qsub_args: str, script: str | None = None, cwd: Path | None = None,
                user: str | None = None) -> Iterator[str]:
    """A job (of the test user, or ``user``), running with its cgroups made: its key. A
    ``sleep 600`` unless ``script`` (written to ``cwd``, the job's working directory).
    Deleted afterwards."""
    if script is not None:
        assert cwd is not None
        path = cwd / "job.sh"
        path.write_text(script)
        os.chown(path, sge.owner.uid, sge.owner.gid)
        job = sge.submit("-cwd", "-o", str(cwd), "-e", str(cwd), *qsub_args, str(path),
                         cwd=cwd, user=user)
    else:
        job = sge.submit("-b", "y", "-o", "/dev/null", "-e", "/dev/null", *qsub_args,
                         "sleep", "600", user=user)
    key = f"{job}.1"
    try:
        wait_for_cgroups(key, timeout=120)
        yield key
    finally:
        subprocess.run(["qdel", "-f", str(job)], capture_output=True, check=False)
        sge.wait_finished(job, timeout=120, accounting=False)


def processes_of(uid: int) -> list[int]:
    """The pids of ``uid``'s processes on this machine."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if p.stat().st_uid == uid:
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def wait_until(condition: Any, timeout: float, what: str, step: float = POLL) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(step)


class Adopted:
    """A process of the job's owner that joins a job's cgroups from outside Grid Engine
    (as an adopted ssh session does): it lacks the job's additional group id, so Grid
    Engine cannot find it. ``runuser`` stays its parent and reaps it when it dies."""

    def __init__(self, owner: Any) -> None:
        self.runuser = subprocess.Popen(
            ["runuser", "-u", owner.name, "--", "setsid", "sleep", "600"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=CLEAN_ENV)
        children = Path(f"/proc/{self.runuser.pid}/task/{self.runuser.pid}/children")
        deadline = time.monotonic() + 10
        # runuser forks once and execs `setsid sleep` (setsid then execs sleep in place)
        while not (children.read_text().split() and self._is_sleep()):
            assert time.monotonic() < deadline, "runuser did not start sleep"
            time.sleep(0.05)
        self.pid = int(children.read_text().split()[0])

    def _is_sleep(self) -> bool:
        kids = Path(f"/proc/{self.runuser.pid}/task/{self.runuser.pid}/children")
        pid = kids.read_text().split()[0]
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"

    def join(self, dirs: Mapping[str, Path]) -> None:
        """Write the process into each of these cgroup directories."""
        for path in dirs.values():
            (path / "cgroup.procs").write_text(str(self.pid))

    def end(self) -> None:
        """Kill it (if still alive) and its runuser parent; reap runuser."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.runuser.kill()
        self.runuser.wait(timeout=30)


def queue_instance(sge: Any) -> str:
    return f"{sge.queue}@{sge.host}"


def rescheduled(job: int) -> bool:
    """Grid Engine put the job back in the queue: qacct has the start its shepherd's exec
    was refused ("failed 1 : assumedly before job")."""
    out = subprocess.run(["qacct", "-j", str(job)], capture_output=True, text=True,
                         env=CLEAN_ENV, timeout=60).stdout
    return re.search(r"^failed\s+1\s*:\s*assumedly before job", out, re.MULTILINE) is not None


def no_queue_in_error(sge: Any) -> dict[str, str]:
    return {q: s for q, s in sge.queue_states().items() if "E" in s}


def events_of(journal: Any, job: int) -> list[str]:
    return [e["GECO_EVENT"] for e in journal.entries(JOB_ID=str(job)) if "GECO_EVENT" in e]


GECO = "/usr/bin/geco"
# the last line of `geco journal N` when the journal holds other jobs numbered N
OTHERS_NOTE = "in this journal: --all shows them"


def journal_story(job: int) -> tuple[list[str], str]:
    """``geco journal <job>``'s lines of the newest job numbered ``job``, and its heading.

    Grid Engine reuses job numbers (this machine's test runs restart at 1): where the
    journal holds other jobs numbered ``job``, the story comes under a ``-- job N
    submitted ... --`` heading and ends with a line saying ``--all`` shows them; both
    are taken off the lines (the heading is returned, "" when there is none)."""
    story = sh([GECO, "journal", str(job)], check=False)
    assert story.returncode == 0, story.stderr
    lines = story.stdout.splitlines()
    if not lines[0].startswith("-- "):
        return lines, ""
    assert lines[-1].endswith(OTHERS_NOTE), story.stdout
    return lines[1:-1], lines[0]
