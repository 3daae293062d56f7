"""What a hook learns from Grid Engine on the node: ids, the spool dir, the shepherd.

Grid Engine hands its hooks the job in three places (see ``sge_shepherd(8)``
and the recorded dumps in ``tests/fixtures/hooks``):

* the command line configured in the queue (``$job_id $ja_task_id``);
* the job environment (``JOB_ID``, ``SGE_TASK_ID`` = ``undefined`` for
  non-array jobs, ``SGE_JOB_SPOOL_DIR``);
* files in the job's execd spool dir ``active_jobs/<job>.<task>``: ``config``
  (key=value), ``pe_hostfile`` (present for every job, serial ones too),
  ``pid`` (the shepherd's pid), ``environment``.

Non-array jobs are task 1 everywhere geco names them (SGE itself says
``ja_task_id=0`` and ``SGE_TASK_ID=undefined`` but spools them as ``<job>.1``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from geco import procfs
from geco._tuple import NamedTuple
from geco.errors import GecoError, JobKeyError
from geco.jobkey import JobKey

__all__ = ["JobRef", "find_shepherd", "find_spool_dir", "is_job_shepherd", "job_dir_in",
           "job_dir_of", "job_from_hook", "job_start_dir", "job_started", "key_of_environment",
           "parse_key_values", "read_config"]


class JobRef(NamedTuple):
    """One task of one job, as a hook sees it."""

    job_id: int
    task_id: int
    spool_dir: Path | None = None

    @property
    def key(self) -> JobKey:
        """``<job>.<task>``: the name of the job's cgroups and resource file."""
        return JobKey(self.job_id, self.task_id)

    @property
    def pe_hostfile(self) -> Path | None:
        """The spooled ``pe_hostfile`` (it lists this job's hosts and slots)."""
        return self.spool_dir / "pe_hostfile" if self.spool_dir else None


def job_from_hook(argv: Sequence[str], env: Mapping[str, str]) -> JobRef:
    """Return the job a hook runs for.

    Parameters
    ----------
    argv: the hook's arguments: ``[job_id [ja_task_id]]`` (the queue's ``$job_id $ja_task_id``);
        empty means "from the environment".
    env: the hook's environment (``JOB_ID``, ``SGE_TASK_ID``, ``SGE_JOB_SPOOL_DIR``).

    Raises
    ------
    GecoError
        when no job id can be found; JobKeyError (a GecoError) when an id is not one
        Grid Engine writes (:meth:`JobKey.from_sge`).
    """
    job_text = argv[0] if argv else env.get("JOB_ID", "")
    if not job_text:
        raise GecoError("no job id: give $job_id as the first argument or run under Grid Engine")
    key = JobKey.from_sge(job_text, argv[1] if len(argv) > 1 else env.get("SGE_TASK_ID"))
    spool = env.get("SGE_JOB_SPOOL_DIR")
    return JobRef(key.job, key.task, Path(spool) if spool else None)


def parse_key_values(data: bytes) -> dict[bytes, bytes]:
    """Parse the ``key=value`` lines of a spooled ``config`` or ``environment`` file.

    Lines without ``=`` are skipped; a later line wins, as in the shepherd.
    """
    out: dict[bytes, bytes] = {}
    for line in data.split(b"\n"):
        key, sep, value = line.partition(b"=")
        if sep:
            out[key] = value
    return out


def key_of_environment(data: bytes) -> JobKey:
    """Return the job a spooled ``environment`` file names: its last ``JOB_ID=`` and
    ``SGE_TASK_ID=`` lines (none: task 1), read by :meth:`JobKey.from_sge`
    (``libgeco/geco_job.c`` reads it the same way).

    Raises
    ------
    JobKeyError
        when it has no ``JOB_ID=`` line or an id is not one Grid Engine writes.
    """
    env = parse_key_values(data)
    if b"JOB_ID" not in env:
        raise JobKeyError("it has no JOB_ID= line")
    return JobKey.from_sge(env[b"JOB_ID"], env.get(b"SGE_TASK_ID"))


def read_config(spool_dir: Path) -> dict[str, str]:
    """Parse the spooled ``config`` file (``key=value`` lines) of a job."""
    try:
        data = (spool_dir / "config").read_bytes()
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the job's spooled config", exc,
                                     path=spool_dir / "config") from exc
    return {k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
            for k, v in parse_key_values(data).items()}


def queue_instance(spool_dir: Path) -> str | None:
    """``<queue>@<host>`` from a job's spooled config; None when it is unreadable or silent.

    Never from ``$QUEUE``/``$HOSTNAME``: root hooks run with the job's environment,
    which its owner controls.
    """
    try:
        config = read_config(spool_dir)
    except GecoError:
        return None
    queue, host = config.get("queue", ""), config.get("host", "")
    return f"{queue}@{host}" if queue and host else None


def is_job_shepherd(pid: int) -> bool:
    """True for a Grid Engine ``sge_shepherd`` process: spared when geco kills a job's
    processes itself (OOM ``kill-job``, the walltime backstop), so that Grid Engine
    sees the job end and runs its epilog.

    The process must also run with real uid 0, as every shepherd does (sge_execd,
    running as root, forks it): a job's own process may call itself
    ``sge_shepherd`` (``prctl(PR_SET_NAME)``, a renamed binary), but it cannot
    become root, so naming itself does not let it survive.
    """
    return procfs.comm(pid).startswith("sge_shepherd") and procfs.real_uid(pid) == 0


def job_dir_of(cwd: Path, spool_root: Path, key: JobKey) -> Path | None:
    """Return the job's ``active_jobs/<job>.<task>`` dir when ``cwd`` is it or a PE task dir.

    ``<spool_root>/<host>/active_jobs/<job>.<task>[/<pe task>]``; the host part
    is not compared with this host's name: Grid Engine may spell it another way
    (host_aliases, a domain), and only the execd user can create it anyway.
    """
    found = job_dir_in(str(cwd), str(spool_root), key)
    return None if found is None else Path(found)


def job_dir_in(cwd: str, spool_root: str, key: JobKey) -> str | None:
    """:func:`job_dir_of` on the kernel's own spelling of paths (readlink of /proc/<pid>/cwd:
    no "//", ".", ".." or trailing "/"), in strings: gecod does this for every request."""
    prefix = spool_root.rstrip("/") + "/"
    if not cwd.startswith(prefix):
        return None
    parts = cwd[len(prefix):].split("/")
    if len(parts) not in (3, 4) or "" in parts or parts[1] != "active_jobs" \
            or parts[2] != key:
        return None
    return prefix + "/".join(parts[:3])


def job_start_dir(key: JobKey, pid: int, spool_root: Path, *,
                  or_forking: bool = False) -> Path | None:
    """The job's own spool dir when ``pid`` is a start of job ``key`` on this node: its master
    shepherd (an ``sge_shepherd`` of real uid 0, see :func:`is_job_shepherd`), or, with
    ``or_forking``, sge_execd's child on its way to become it; None otherwise. Either works in
    the job's own dir: a ``qrsh -inherit`` task's shepherd, in a PE task dir below it, ends
    with the job and is no start of it.
    """
    comm = procfs.comm(pid)
    if not (comm.startswith("sge_shepherd") or (or_forking and comm == "sge_execd")) \
            or procfs.real_uid(pid) != 0:
        return None
    try:
        cwd = Path(procfs.cwd(pid))
    except OSError:
        return None
    return cwd if job_dir_of(cwd, spool_root, key) == cwd else None


def find_spool_dir(execd_spool_dir: Path, key: JobKey, node: str) -> Path | None:
    """Return ``<execd_spool_dir>/<node>/active_jobs/<key>``, or None while there is none.

    ``<node>`` (this host's short name) is tried first, then this host under another
    spelling Grid Engine may use (with its domain, in other letter case); never another
    host's: hosts that share a spool file system (NFS, the emulated cluster) each have a
    job of the same number there, and theirs is not this host's. ``key`` must be a
    checked ``<job>.<task>`` (no path separators).
    """
    first = execd_spool_dir / node / "active_jobs" / key
    if first.is_dir():
        return first
    me = node.split(".", 1)[0].lower()
    try:
        found = sorted(d for d in execd_spool_dir.glob(f"*/active_jobs/{key}")
                       if d.parent.parent.name.split(".", 1)[0].lower() == me)
    except OSError:
        return None
    return found[0] if found else None


def find_shepherd(job: JobRef, pid: int | None = None) -> int:
    """Return the pid of this job's ``sge_shepherd``, verified through /proc.

    The hook's parent must be an ``sge_shepherd`` whose working directory is
    this job's spool dir and whose pid is the one SGE spooled in ``pid``;
    anything else (a hook run by hand, a foreign parent) is refused, because
    the caller is about to put that process into the job's cgroups.

    Raises
    ------
    GecoError
        naming the parent and the check it failed.
    """
    parent = procfs.ppid(pid or os.getpid())
    comm = procfs.comm(parent)
    if not comm.startswith("sge_shepherd"):
        raise GecoError("the hook's parent is not an sge_shepherd", ppid=parent, comm=comm,
                        job=job.key)
    if job.spool_dir is None:
        raise GecoError("SGE_JOB_SPOOL_DIR is not set; cannot verify the shepherd", job=job.key)
    try:
        cwd = Path(procfs.cwd(parent))
        spooled = int((job.spool_dir / "pid").read_bytes().strip() or b"0")
    except (OSError, ValueError) as exc:
        raise GecoError("cannot verify the shepherd through /proc and the spool dir",
                        ppid=parent, job=job.key, error=exc) from exc
    # the spool dir comes from the job's environment, which its owner can set: only
    # trust it when it is named after this job and it is where the shepherd runs
    if job.spool_dir.name != job.key or cwd != job.spool_dir.resolve() or spooled != parent:
        raise GecoError("the hook's parent is not this job's shepherd", ppid=parent,
                        shepherd_cwd=cwd, spool_dir=job.spool_dir, spooled_pid=spooled,
                        job=job.key)
    return parent


def job_started(spool_dir: Path | None, resource_file: Path) -> float | None:
    """When the job started, as epoch seconds (the walltime backstop, usage samples).

    The mtime of the spool dir's ``config`` (sge_execd writes it just before
    it starts the shepherd; a re-run job gets a new one), else the mtime of
    the job's resource file (written by the prolog or gecod at the start, and
    the only clue on a node where the spool dir is gone), else None.
    """
    candidates = ([spool_dir / "config"] if spool_dir is not None else []) + [resource_file]
    for path in candidates:
        try:
            return os.stat(path).st_mtime
        except OSError:
            continue
    return None
