"""What the fault and soak tests share: many short jobs of several kinds, and the proof that
they all ran contained, shared no core and left nothing behind.

A batch (:class:`Batch`) is a list of submissions made in a job directory holding
probe.py (the ``job_dir`` fixture): each job task runs probe.py, which prints from
inside the job the cgroups it is in, its cpus and the time it started (and ended,
unless it is OOM-killed). Kinds (:data:`KINDS`):

``serial``  one task, one slot;
``array``   ``-t 1-4``, each task one slot;
``smp``     ``-pe smp 2`` (both cores of this machine);
``mpi``     ``-pe mpi 2``: the master task runs probe.py, then starts a second one with
            ``qrsh -inherit`` (a second process of the job joining its cgroups);
``oom``     ``-l m_mem_free=64M``, touches 200 MiB: the kernel kills it.

When a batch has finished (:meth:`Batch.wait`) :meth:`Batch.check` gathers what a user and
an admin would look at into a :class:`Findings`: job tasks that ran uncontained or not at
all, cores two jobs held at once, job cgroups, resource files and processes left behind,
queue instances in error state, jobs held in error state, and how often each OOM kill was
journaled. The tests assert on it; ``bench/soak.py`` prints it as figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.livekit import job_cgroups

KINDS = ("serial", "array", "smp", "mpi", "oom")
ARRAY_TASKS = 4
RESOURCES = Path("/var/lib/geco/resources")
OOM_STATE = Path("/var/lib/geco/oom")
ACCOUNTING = Path("/var/lib/gridengine/default/common/accounting")
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# accounting file columns (accounting(5)), 0-based
_JOB, _FAILED, _EXIT, _TASK, _PE_TASK = 5, 11, 12, 35, 41

SCRIPTS = {
    "serial": "exec /usr/bin/python3 probe.py\n",
    "array": "exec /usr/bin/python3 probe.py\n",
    "smp": "exec /usr/bin/python3 probe.py\n",
    # the task's probe.py by its full path: a qrsh -inherit task starts in the home dir
    "mpi": ('/usr/bin/python3 probe.py\n'
            'qrsh -inherit "$HOSTNAME" /usr/bin/python3 "$PWD/probe.py"\n'),
    "oom": "exec /usr/bin/python3 probe.py --alloc 200\n",
}
OPTIONS = {
    "serial": (), "array": ("-t", f"1-{ARRAY_TASKS}"), "smp": ("-pe", "smp", "2"),
    "mpi": ("-pe", "mpi", "2"), "oom": ("-l", "m_mem_free=64M"),
}
# reports probe.py prints per task: the mpi job's master and its qrsh -inherit task
REPORTS = {"mpi": 2}


def sh(argv: Sequence[str], check: bool = True,
       timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                          timeout=timeout, env=CLEAN_ENV)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def mix(total: int) -> list[str]:
    """The kinds of ``total`` job tasks in submission order: per ten tasks three serial
    jobs, one array job of four tasks, one smp, one mpi and one OOM job, interleaved."""
    block = ["serial", "array", "smp", "serial", "oom", "mpi", "serial"]
    kinds: list[str] = []
    tasks = 0
    while tasks < total:
        for kind in block:
            size = ARRAY_TASKS if kind == "array" else 1
            if tasks + size > total:
                kind, size = "serial", 1
            kinds.append(kind)
            tasks += size
            if tasks >= total:
                break
    return kinds


@dataclass
class Job:
    """One submission: its id, kind and tasks."""

    job_id: int
    kind: str
    name: str

    @property
    def tasks(self) -> tuple[int, ...]:
        return tuple(range(1, ARRAY_TASKS + 1)) if self.kind == "array" else (1,)

    def task_keys(self) -> list[str]:
        return [f"{self.job_id}.{task}" for task in self.tasks]


@dataclass
class Findings:
    """What a batch left: every list empty and every count as expected means all is well.

    Attributes
    ----------
    tasks: job tasks that ran, per kind.
    uncontained: ``"<key>: <why>"`` for a task that reported itself outside its job's
        cgroups (cpuset, memory, freezer), or never reported.
    shared_cores: ``"<key> and <key>: cpus ..."`` for two jobs that held a core at once.
    leaked_cgroups, leaked_files: job cgroups and resource / OOM-count files left.
    leftover_processes: ``"<pid> (<comm>) of job <id>"`` still alive.
    queue_errors: queue instances in error state, with their state letters.
    held: jobs Grid Engine holds in error state, with qstat's reason.
    oom_events: per OOM job, how many ``GECO_EVENT=oom`` entries the journal has.
    stray_oom_events: OOM entries for jobs that were not meant to run out of memory.
    failed: accounting records with ``failed`` != 0 (a re-queued start, a hook's 99), OOM
        jobs left out (a job killed by a signal is ``failed 100`` in plain Grid Engine too).
    """

    tasks: Counter[str] = field(default_factory=Counter)
    uncontained: list[str] = field(default_factory=list)
    shared_cores: list[str] = field(default_factory=list)
    leaked_cgroups: list[str] = field(default_factory=list)
    leaked_files: list[str] = field(default_factory=list)
    leftover_processes: list[str] = field(default_factory=list)
    queue_errors: dict[str, str] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)
    oom_events: dict[int, int] = field(default_factory=dict)
    stray_oom_events: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def problems(self) -> dict[str, Any]:
        """Everything that is wrong, by name (empty when the batch is clean)."""
        wrong: dict[str, Any] = {name: getattr(self, name) for name in (
            "uncontained", "shared_cores", "leaked_cgroups", "leaked_files",
            "leftover_processes", "queue_errors", "held", "stray_oom_events")
            if getattr(self, name)}
        not_once = {job: n for job, n in self.oom_events.items() if n != 1}
        if not_once:
            wrong["oom_not_relayed_once"] = not_once
        return wrong


class Batch:
    """Jobs submitted from one job directory (a :class:`tests.jobdirkit.JobDir`) to one queue."""

    def __init__(self, sge: Any, job_dir: Any, queue: str, tag: str) -> None:
        self.sge = sge
        self.job_dir = job_dir
        self.queue = queue
        self.tag = tag
        self.jobs: list[Job] = []
        self.started = time.time()
        for kind, body in SCRIPTS.items():
            job_dir.script(f"{tag}-{kind}", body)

    def submit(self, kind: str) -> Job:
        name = f"{self.tag}-{kind}"
        job_id = self.sge.submit("-cwd", "-N", name, "-q", self.queue, *OPTIONS[kind],
                                 f"{name}.sh", cwd=self.job_dir.path)
        job = Job(job_id, kind, name)
        self.jobs.append(job)
        return job

    def submit_mix(self, total: int) -> None:
        """Submit :func:`mix` (``total`` job tasks)."""
        for kind in mix(total):
            self.submit(kind)

    @property
    def ids(self) -> set[int]:
        return {job.job_id for job in self.jobs}

    def task_count(self) -> int:
        return sum(len(job.tasks) for job in self.jobs)

    # -- waiting ------------------------------------------------------------------

    def listed(self) -> dict[int, set[str]]:
        """The batch's jobs qstat still lists, with their state letters."""
        return listed(self.sge.owner.name, self.ids)

    def wait(self, timeout: float) -> list[str]:
        """Wait until Grid Engine lists none of the batch's jobs; return the jobs it held in
        error state instead (deleted at once, with qstat's reason: they could never finish)
        and those still listed after ``timeout`` seconds (deleted too)."""
        deadline = time.monotonic() + timeout
        reasons: list[str] = []
        given_up: set[int] = set()
        while listed := {j: s for j, s in self.listed().items() if j not in given_up}:
            late = time.monotonic() > deadline
            stuck = list(listed) if late else [
                job for job, states in listed.items() if any("E" in s for s in states)]
            given_up.update(stuck)
            for job in stuck:
                reasons.append(f"{job} ({'/'.join(sorted(listed[job]))}"
                               f"{f', still listed after {timeout:.0f} s' if late else ''}): "
                               f"{self._error_reason(job)}")
            if stuck:
                sh(["qdel", "-f", *map(str, stuck)], check=False)
            if late:
                break
            time.sleep(0.5)
        return reasons

    @staticmethod
    def _error_reason(job: int) -> str:
        out = sh(["qstat", "-j", str(job)], check=False).stdout
        return " | ".join(re.findall(r"^error reason.*$", out, re.MULTILINE)) or "no reason"

    # -- what is left -------------------------------------------------------------

    def reports(self, job: Job, task: int) -> list[dict[str, Any]]:
        suffix = f".{task}" if job.kind == "array" else ""
        path = self.job_dir.path / f"{job.name}.o{job.job_id}{suffix}"
        try:
            text = path.read_text()
        except FileNotFoundError:
            return []
        found = []
        for line in text.splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # the OOM-killed probe's half line, qrsh's own words
        mtime = path.stat().st_mtime
        starts = [r for r in found if "cgroups" in r]
        ends = [r["done"] for r in found if "done" in r]
        for i, report in enumerate(starts):
            report["end"] = ends[i] if i < len(ends) else mtime
        return starts

    def check(self, journal: Any, *, settle: float = 30.0) -> Findings:
        """Everything :class:`Findings` names, for the batch's jobs (which have finished).

        Cgroups, files and processes are given ``settle`` seconds to go: with the
        preload gecod tears a job down when its shepherd has exited, which may be just
        after Grid Engine has let the job go; OOM entries the same time to arrive.
        """
        found = Findings()
        intervals: list[tuple[str, float, float, frozenset[int]]] = []
        for job in self.jobs:
            for task in job.tasks:
                key = f"{job.job_id}.{task}"
                reports = self.reports(job, task)
                if len(reports) < REPORTS.get(job.kind, 1):
                    found.uncontained.append(f"{key}: {len(reports)} of "
                                             f"{REPORTS.get(job.kind, 1)} reports")
                    continue
                found.tasks[job.kind] += 1
                for report in reports:
                    wrong = {c: report["cgroups"].get(c) for c in ("cpuset", "memory",
                                                                   "freezer")
                             if report["cgroups"].get(c) != f"/GECO/{key}"}
                    if wrong:
                        found.uncontained.append(f"{key}: pid {report['pid']} in {wrong}")
                    intervals.append((key, report["start"], report["end"],
                                      frozenset(report["cpus"])))
        found.shared_cores = shared_cores(intervals)
        keys = [key for job in self.jobs for key in job.task_keys()]
        deadline = time.monotonic() + settle
        while True:
            found.leaked_cgroups = [f"{key}: {sorted(dirs)}" for key in keys
                                    if (dirs := job_cgroups(key))]
            found.leaked_files = [str(p) for key in keys for p in (RESOURCES / key,
                                                                   OOM_STATE / key)
                                  if p.exists()]
            found.leftover_processes = leftover_processes(self.sge.owner.uid, self.ids)
            if not (found.leaked_cgroups or found.leaked_files or found.leftover_processes) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        found.queue_errors = {q: s for q, s in self.sge.queue_states().items() if "E" in s}
        found.oom_events, found.stray_oom_events = self.oom_counts(journal, settle)
        found.failed = self.failed_records()
        return found

    def oom_counts(self, journal: Any, settle: float) -> tuple[dict[int, int], list[int]]:
        """Per OOM job, its ``GECO_EVENT=oom`` entries; and jobs of other kinds that have one.
        Waits (at most ``settle`` s) until every OOM job has one, then a second more: a
        second entry for a kill would come right after the first."""
        ooms = [job.job_id for job in self.jobs if job.kind == "oom"]
        deadline = time.monotonic() + settle
        while True:
            per_job = Counter(int(e["JOB_ID"]) for e in journal.entries(
                self.started, GECO_EVENT="oom") if int(e.get("JOB_ID", 0)) in self.ids)
            if all(per_job[j] for j in ooms) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(1)
        per_job = Counter(int(e["JOB_ID"]) for e in journal.entries(
            self.started, GECO_EVENT="oom") if int(e.get("JOB_ID", 0)) in self.ids)
        return {j: per_job[j] for j in ooms}, sorted(j for j in per_job if j not in ooms)

    def failed_records(self) -> list[str]:
        """Accounting records of the batch's jobs with ``failed`` != 0 (one read of the file),
        but for OOM jobs: Grid Engine records a job killed by a signal as ``failed 100``."""
        ids = {job.job_id for job in self.jobs if job.kind != "oom"}
        bad = []
        with ACCOUNTING.open(errors="replace") as f:
            for line in f:
                cols = line.rstrip("\n").split(":")
                if len(cols) <= _PE_TASK or not cols[_JOB].isdigit():
                    continue
                if int(cols[_JOB]) in ids and cols[_FAILED] != "0":
                    bad.append(f"{cols[_JOB]}.{cols[_TASK]} failed {cols[_FAILED]}")
        return bad


def listed(owner: str, jobs: set[int]) -> dict[int, set[str]]:
    """Which of ``jobs`` (of user ``owner``) qstat lists, with their state letters."""
    states: dict[int, set[str]] = {}
    for line in sh(["qstat", "-u", owner], check=False).stdout.splitlines():
        cols = line.split()
        if len(cols) > 4 and cols[0].isdigit() and int(cols[0]) in jobs:
            states.setdefault(int(cols[0]), set()).add(cols[4])
    return states


def shared_cores(intervals: Iterable[tuple[str, float, float, frozenset[int]]]) -> list[str]:
    """Pairs of different jobs that ran at the same time on a common cpu."""
    ordered = sorted(intervals, key=lambda i: i[1])
    clashes = []
    for i, (key, start, end, cpus) in enumerate(ordered):
        for other, ostart, oend, ocpus in ordered[i + 1:]:
            if ostart >= end:
                break
            if other.split(".")[0] != key.split(".")[0] and cpus & ocpus and oend > start:
                clashes.append(f"{key} and {other}: cpus {sorted(cpus & ocpus)} "
                               f"at {max(start, ostart):.3f}")
    return clashes


def leftover_processes(uid: int, jobs: set[int]) -> list[str]:
    """Processes of ``uid`` whose environment names one of ``jobs`` (``JOB_ID=``)."""
    markers = {f"JOB_ID={job}\0".encode(): job for job in jobs}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            environ = b"\0" + (entry / "environ").read_bytes()
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        for marker, job in markers.items():
            if b"\0" + marker in environ:
                found.append(f"{entry.name} ({comm}) of job {job}")
    return found


def rss_kib(pid: int) -> int:
    """A process's resident set (``VmRSS`` of /proc/<pid>/status) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"/proc/{pid}/status has no VmRSS line")


def bare_turnaround(sge: Any, queue: str, count: int, timeout: float = 120) -> float:
    """Seconds from submitting ``count`` ``qsub -b y true`` jobs to ``queue`` until Grid
    Engine has let the last one go: the machine's floor for a batch of that size."""
    started = time.monotonic()
    ids = {sge.submit("-q", queue, "-b", "y", "-o", "/dev/null", "-e", "/dev/null",
                      "/bin/true") for _ in range(count)}
    deadline = time.monotonic() + timeout
    while left := listed(sge.owner.name, ids):
        if time.monotonic() > deadline:
            sh(["qdel", "-f", *map(str, left)], check=False)
            raise TimeoutError(f"{len(left)} bare jobs not done after {timeout} s")
        time.sleep(0.2)
    return time.monotonic() - started


def write_figures(name: str, figures: dict[str, Any]) -> Path | None:
    """Write ``figures`` as ``$GECO_FIGURES_DIR/<name>.json`` when that variable is set."""
    where = os.environ.get("GECO_FIGURES_DIR")
    if not where:
        return None
    path = Path(where) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return path
