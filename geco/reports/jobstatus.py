"""One job's live figures, read straight from the kernel: ``geco status --job N[.T]``.

No gecod is asked: the job's cgroup files (world-readable) and its resource
file (``<state_dir>/resources/<job>.<task>``, 0644) say everything, so any
user can look at any job on the node, also while gecod is down.

What is shown, and where it comes from:

* cores and NUMA nodes, memory and memory+swap limits, the task limit
  (``pids.max``): the backend's :meth:`~geco.cgroup.Backend.read_limits` (what
  the kernel enforces, not what was asked for);
* tasks now, at their peak and forks refused at the limit: the backend's
  :meth:`~geco.cgroup.Backend.usage` (pids controller);
* current and peak memory, CPU user/system time, OOM kills: the backend's
  :meth:`~geco.cgroup.Backend.usage`, through :class:`~geco.accounting.Accounting`
  -- the same record the job-end journal entry gets;
* processes: the pids in the job's cgroups with their ``comm``;
* owner, job name and ``h_rt``: the resource file, when there is one;
* GPUs (on a node with GPUs): this node's ids in the resource file;
* running time: from the mtime of the job's spooled ``config`` (Grid Engine
  writes it when it starts the job), else of the resource file (the prolog's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from geco import gpushare, jobfiles, procfs
from geco.accounting import Accounting
from geco.cgroup import Backend, check_key
from geco.config import Config
from geco.errors import CgroupError, GecoError
from geco.jobkey import JobKey
from geco.node import gpus
from geco.node.limits import PidsLimit, pids_unenforced
from geco.resourceset import ResourceSet, short_hostname
from geco.sge import execd, resourcefile
from geco.terminal import printable
from geco.units import format_memory

__all__ = ["JobStatus", "Process", "format_duration", "format_table", "from_dict", "keys_of_job",
           "not_here", "read", "to_dict"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Process:
    """One process in a job's cgroups."""

    pid: int
    command: str  # its ``comm`` ("" when it could not be read: gone, or /proc hides it)


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What one job task is and uses on this node right now.

    Attributes
    ----------
    key: ``<job>.<task>``.
    host: this node's short name.
    owner, job_name: from the resource file ("" when there is none).
    cpus, mems: the job's cpuset, in kernel list syntax.
    memory_limit, memory_swap_limit: bytes, 0 = no limit.
    memory_current, memory_peak: bytes; None when this kernel does not report it.
    cpu_user, cpu_system: CPU seconds; None when this node does not account CPU per cgroup.
    oom_kills: processes the OOM killer ended in the job; None when the kernel
        does not count them (v1 before Linux 4.13).
    pids_limit: the job's task limit (``pids.max``: processes and threads), 0 = none.
    pids_current, pids_peak: its tasks now and at most; None when not reported (no
        pids controller; ``pids.peak`` needs a newer kernel).
    pids_refused: forks and thread starts the limit refused; None when not reported.
    processes: the job's processes, by pid.
    running_for: seconds since the job started here; None when unknown.
    runtime_limit: ``h_rt`` in seconds, 0 = none (or no resource file).
    notes: things that could not be read, one sentence each.
    hosts: every host of the job as the resource file names them (this one included;
        more than one for a parallel job over several hosts), () when unknown.
    gpus: its GPU ids on this node (``"1,3"``, "" = none); None on a node without GPUs.
    """

    key: JobKey
    host: str
    owner: str
    job_name: str
    cpus: str
    mems: str
    memory_limit: int
    memory_swap_limit: int
    memory_current: int | None
    memory_peak: int | None
    cpu_user: float | None
    cpu_system: float | None
    oom_kills: int | None
    pids_limit: int
    pids_current: int | None
    pids_peak: int | None
    pids_refused: int | None
    processes: tuple[Process, ...]
    running_for: float | None
    runtime_limit: float
    notes: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    gpus: str | None = None

    @property
    def accounting(self) -> Accounting:
        """The figures as the job-end record holds them (unknown counts as 0)."""
        return Accounting(memory_peak=self.memory_peak or 0, cpu_user=self.cpu_user,
                          cpu_system=self.cpu_system, oom_kills=self.oom_kills or 0)


def keys_of_job(backend: Backend, job: int) -> list[JobKey]:
    """Return the keys of job ``job``'s tasks that have cgroups on this node, by task.

    Raises
    ------
    CgroupError
        when the job cgroups cannot be listed.
    """
    return [k for k in map(check_key, backend.job_keys()) if k.job == job]


def not_here(job: str, host: str | None = None) -> CgroupError:
    """Return the error for a job (``"42"``) or task (``"42.1"``) without cgroups on this node.

    Its text is the whole sentence the user sees: ``job 42.1 has no cgroups on
    n001 (not running here, or already ended)`` (no key=value fields).
    """
    where = host or short_hostname()
    return CgroupError(f"job {job} has no cgroups on {where} (not running here, "
                       f"or already ended)")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _resources(cfg: Config, key: JobKey) -> tuple[ResourceSet | None, str]:
    """The job's resource file and, when it cannot be used, why (one sentence)."""
    try:
        rs = resourcefile.read(cfg.resources_dir, key)
    except GecoError as exc:
        return None, f"the resource file is unusable: {exc}"
    if rs is None:
        path = jobfiles.resource_file(cfg.resources_dir, key)
        return None, f"no resource file {path} (owner, name and h_rt unknown)"
    return rs, ""


def read(cfg: Config, backend: Backend, key: JobKey, *, now: float | None = None) -> JobStatus:
    """Return the live status of job task ``key`` on this node.

    Parameters
    ----------
    cfg: the configuration (state dir for the resource file, execd spool dir
        for the start time).
    backend: the node's cgroup backend (:func:`geco.cgroup.for_config`).
    key: ``<job>.<task>``.
    now: the epoch time "running for" is measured to (default: now).

    Returns
    -------
    JobStatus
        with ``notes`` naming what could not be read (the resource file, a
        start time); those figures are left empty rather than guessed.

    Raises
    ------
    CgroupError
        when the key is not ``<job>.<task>``; when the job has no cgroups on
        this node (also when they vanish while being read: the job just
        ended), with the message ``job <key> has no cgroups on <host> (not
        running here, or already ended)``; or when a cgroup file cannot be read.
    """
    key = check_key(key)
    host = short_hostname()
    if not backend.exists(key):
        raise not_here(key, host)
    try:
        limits = backend.read_limits(key)
        usage = backend.usage(key)
        pids = backend.pids(key)
    except CgroupError:
        # the job ended between exists() and here: that is "not here", not a failure
        if not backend.exists(key):
            raise not_here(key, host) from None
        raise
    rs, why = _resources(cfg, key)
    notes = [why] if why else []
    unenforced = pids_unenforced(backend, PidsLimit.from_config(cfg))
    if unenforced:
        notes.append(unenforced)
    spool = execd.find_spool_dir(cfg.execd_spool_dir, key, host)
    config = spool / "config" if spool is not None else None
    started = _mtime(config) if config else None
    if started is None and rs is not None:
        started = _mtime(jobfiles.resource_file(cfg.resources_dir, rs.key))
    if started is None:
        notes.append("start time unknown: no spooled job config and no resource file")
    now = time.time() if now is None else now
    acc = Accounting.from_usage(usage)
    return JobStatus(
        key=key, host=host, owner=rs.owner if rs else "", job_name=rs.job_name if rs else "",
        cpus=limits.cpus, mems=limits.mems, memory_limit=limits.memory,
        memory_swap_limit=limits.memory_swap,
        memory_current=usage.get("memory_current"),
        memory_peak=acc.memory_peak if "memory_peak" in usage else None,
        cpu_user=acc.cpu_user, cpu_system=acc.cpu_system,
        oom_kills=acc.oom_kills if "oom_kill" in usage else None,
        pids_limit=limits.pids, pids_current=usage.get("pids_current"),
        pids_peak=usage.get("pids_peak"), pids_refused=usage.get("pids_max_events"),
        processes=tuple(Process(pid, procfs.comm(pid)) for pid in pids),
        running_for=None if started is None else max(0.0, now - started),
        runtime_limit=rs.runtime_limit if rs else 0.0, notes=tuple(notes),
        hosts=tuple(n.name for n in rs.nodes) if rs else (), gpus=_gpus(cfg, rs))


def _gpus(cfg: Config, rs: ResourceSet | None) -> str | None:
    """The job's GPU ids here from its resource file; None on a node without GPUs."""
    try:
        if not gpus.node_table(cfg.gpu_devices):
            return None
        node = rs.node() if rs is not None else None
        return gpushare.format_ids(gpushare.parse_share(node.gpus).ids) if node is not None else ""
    except GecoError:
        return ""


def format_duration(seconds: float) -> str:
    """Return seconds as Grid Engine writes ``h_rt``: ``h:mm:ss`` (hours unbounded)."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _memory(n: int | None, *, unknown: str = "not reported by this kernel") -> str:
    return unknown if n is None else format_memory(n)


def _limit(n: int) -> str:
    return "none" if n == 0 else format_memory(n)


def _running(st: JobStatus) -> str:
    if st.running_for is None:
        return "unknown"
    text = format_duration(st.running_for)
    if st.runtime_limit <= 0:
        return f"{text} (no h_rt)"
    limit = format_duration(st.runtime_limit)
    if st.running_for > st.runtime_limit:
        return f"{text}, past h_rt {limit} by {format_duration(st.running_for - st.runtime_limit)}"
    return f"{text} of h_rt {limit} ({st.running_for / st.runtime_limit:.0%})"


def _cpu(st: JobStatus) -> str:
    if st.cpu_user is None or st.cpu_system is None:
        return "not accounted on this node (no cpuacct cgroup for the job)"
    return f"{st.cpu_user:.1f} s user + {st.cpu_system:.1f} s system"


def _tasks(st: JobStatus) -> str:
    if st.pids_current is None:
        return "not counted, no limit (the job has no pids cgroup on this node)"
    parts = [f"{st.pids_current} now"]
    if st.pids_peak is not None:
        parts.append(f"peak {st.pids_peak}")
    parts.append(f"limit {st.pids_limit or 'none'}")
    text = ", ".join(parts)
    if st.pids_refused:
        text += f"; {st.pids_refused} fork(s) refused at the limit"
    return text


def format_table(st: JobStatus, *, verbose: bool = False) -> str:
    """Return the status for people: a title line and one ``label  value`` line per figure.

    Parameters
    ----------
    st: the status.
    verbose: also list every process (pid and command) under ``processes``.

    Returns
    -------
    str
        Lines ending in ``\\n``, for example::

            job 42.1 on n001
              owner        alice
              name         sim.sh
              cores        0-1
              NUMA nodes   0
              memory       1.2G now, peak 1.5G, limit 2G
              memory+swap  limit 3G
              CPU          12.3 s user + 0.4 s system
              OOM kills    0
              tasks        7 now, peak 9, limit 4096
              processes    3
              running for  1:02:03 of h_rt 2:00:00 (52%)

        ``tasks`` counts processes and threads, as the kernel's task limit
        (``pids.max``) does.
    """
    rows = [  # the owner chose the job's name and its processes' names: escaped
        ("owner", printable(st.owner) or "unknown"),
        ("name", printable(st.job_name) or "unknown"),
        ("cores", st.cpus or "all"),
        ("NUMA nodes", st.mems or "all"),
        ("memory", f"{_memory(st.memory_current)} now, peak {_memory(st.memory_peak)}, "
                   f"limit {_limit(st.memory_limit)}"),
        ("memory+swap", f"limit {_limit(st.memory_swap_limit)}"),
        ("CPU", _cpu(st)),
        ("OOM kills", "not counted by this kernel" if st.oom_kills is None
         else str(st.oom_kills)),
        ("tasks", _tasks(st)),
        ("processes", str(len(st.processes))),
    ]
    if st.gpus is not None:
        rows.insert(4, ("GPUs", st.gpus or "none"))
    if len(st.hosts) > 1:
        rows.insert(2, ("hosts", f"{len(st.hosts)}: {', '.join(st.hosts)}"))
    width = max(len(label) for label, _ in [*rows, ("running for", "")])
    lines = [f"job {st.key} on {st.host}"]
    lines += [f"  {label.ljust(width)}  {value}" for label, value in rows]
    if verbose:
        pid_width = max((len(str(p.pid)) for p in st.processes), default=0)
        lines += [f"  {'':{width}}    {str(p.pid).rjust(pid_width)}  "
                  f"{printable(p.command) or '?'}"
                  for p in st.processes]
    lines.append(f"  {'running for'.ljust(width)}  {_running(st)}")
    lines += [f"  note: {note}" for note in st.notes]
    return "\n".join(lines) + "\n"


def to_dict(st: JobStatus) -> Mapping[str, object]:
    """Return the ``--json`` form: bytes, seconds, null for "not known"."""
    job, task = st.key.job, st.key.task
    return {
        "key": st.key, "job_id": job, "task_id": task, "host": st.host,
        "owner": st.owner, "job_name": st.job_name, "cpus": st.cpus, "mems": st.mems,
        "memory_limit": st.memory_limit, "memory_swap_limit": st.memory_swap_limit,
        "memory_current": st.memory_current, "memory_peak": st.memory_peak,
        "cpu_user": st.cpu_user, "cpu_system": st.cpu_system, "oom_kills": st.oom_kills,
        "pids_limit": st.pids_limit, "pids_current": st.pids_current,
        "pids_peak": st.pids_peak, "pids_refused": st.pids_refused,
        "processes": [{"pid": p.pid, "command": p.command} for p in st.processes],
        "running_for": st.running_for, "runtime_limit": st.runtime_limit,
        "notes": list(st.notes), "hosts": list(st.hosts), "gpus": st.gpus,
    }


def from_dict(doc: Mapping[str, Any]) -> JobStatus:
    """Return the status :func:`to_dict` made (another host's, from its NODE_STATUS answer).

    Raises
    ------
    GecoError
        when ``doc`` is not such a document.
    """
    try:
        return JobStatus(
            key=JobKey.parse(str(doc["key"])), host=str(doc["host"]), owner=str(doc["owner"]),
            job_name=str(doc["job_name"]), cpus=str(doc["cpus"]), mems=str(doc["mems"]),
            memory_limit=int(doc["memory_limit"]),
            memory_swap_limit=int(doc["memory_swap_limit"]),
            memory_current=_maybe(int, doc["memory_current"]),
            memory_peak=_maybe(int, doc["memory_peak"]),
            cpu_user=_maybe(float, doc["cpu_user"]), cpu_system=_maybe(float, doc["cpu_system"]),
            oom_kills=_maybe(int, doc["oom_kills"]), pids_limit=int(doc["pids_limit"]),
            pids_current=_maybe(int, doc["pids_current"]),
            pids_peak=_maybe(int, doc["pids_peak"]),
            pids_refused=_maybe(int, doc["pids_refused"]),
            processes=tuple(Process(int(p["pid"]), str(p["command"]))
                            for p in doc["processes"]),
            running_for=_maybe(float, doc["running_for"]),
            runtime_limit=float(doc["runtime_limit"]),
            notes=tuple(map(str, doc["notes"])), hosts=tuple(map(str, doc.get("hosts", ()))),
            gpus=_maybe(str, doc.get("gpus")))
    except (KeyError, TypeError, ValueError) as exc:
        raise GecoError(f"not a job status document: {type(exc).__name__}: {exc}") from None


def _maybe(kind: Callable[[Any], T], value: object) -> T | None:
    return None if value is None else kind(value)

