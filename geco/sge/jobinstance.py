"""Which job a job number means: the cluster it ran in and the time it was submitted.

Grid Engine reuses job numbers: a cluster after they wrap around (Son of Grid
Engine at 9999999 by default) and after its qmaster is installed anew, and a
node may run jobs of another cluster later (a test machine that had Son of Grid
Engine and then Open Cluster Scheduler). Two jobs of one number never share both
the cluster and the submission time, so these two are what a job's records say
beside ``JOB_ID`` (``SGE_CLUSTER``, ``JOB_SUBMITTED``: :func:`geco.log.job_instance`)
and what ``geco journal`` tells them apart by (:mod:`geco.reports.journalview`).

Both are read once per job, from its execd spool dir on its master host, which
execd writes before anything of the job starts (no qstat needed), and then travel
in the job's resource set (:class:`~geco.resourceset.ResourceSet` ``cluster`` and
``submitted``; the resource file, a parallel job's PREPARE to its other hosts):

* the cluster: ``$SGE_ROOT/$SGE_CELL/common/cluster_name`` (the cluster's name,
  which the cell's ``settings.sh`` exports as ``SGE_CLUSTER_NAME``), else
  ``$SGE_ROOT/$SGE_CELL`` (Debian's packages write no ``cluster_name``);
  ``SGE_ROOT`` and ``SGE_CELL`` as execd set them in the job's spooled
  ``environment`` (it overwrites what the owner passed with ``qsub -v``; the
  owner's own ``SGE_CLUSTER_NAME`` there is not used);
* the submission time: the spooled ``config``'s ``submission_time`` (Son of Grid
  Engine 8.1: seconds; Open Cluster Scheduler 9: microseconds since the epoch).

The submission time, not a start: every task of an array job shares it, so
``geco journal 42`` shows the whole array as one job; a job a hook re-queued
(exit 99) keeps it, so its runs are one story.
"""

from __future__ import annotations

import re
from pathlib import Path

from geco._tuple import NamedTuple
from geco.errors import GecoError
from geco.resourceset import ResourceSet
from geco.sge import execd

__all__ = ["JobInstance", "from_spool"]

# a cluster name as Grid Engine's install script allows it (and geco.sge.siteenv reads it)
_CLUSTER_NAME = re.compile(rb"[A-Za-z0-9_.+-]{1,128}")
# above this a submission time is microseconds (Grid Engine 9); as seconds it is year 33658
_MICROSECONDS = 10**12


class JobInstance(NamedTuple):
    """Which job of its number a job is.

    Attributes
    ----------
    cluster: ``SGE_CLUSTER`` ("" = not known).
    submitted: seconds since the epoch (0 = not known).
    source: the spooled ``config`` it was read from.
    """

    cluster: str
    submitted: float
    source: Path

    def stamp(self, rs: ResourceSet) -> ResourceSet:
        """``rs`` with what it does not know yet of the two."""
        return rs.replace(cluster=rs.cluster or self.cluster,
                          submitted=rs.submitted or self.submitted)


def _cluster(env: dict[bytes, bytes]) -> str:
    root = env.get(b"SGE_ROOT", b"")
    if not root.startswith(b"/"):
        return ""
    cell = env.get(b"SGE_CELL") or b"default"
    try:
        with open(Path(root.decode(errors="surrogateescape"),
                       cell.decode(errors="surrogateescape"), "common", "cluster_name"),
                  "rb") as f:
            name = f.read(256).strip()
    except (OSError, ValueError):  # none (Debian), or a NUL in the spooled values
        name = b""
    if _CLUSTER_NAME.fullmatch(name):
        return name.decode()
    return (root.rstrip(b"/") + b"/" + cell).decode(errors="replace")


def _submitted(config: dict[str, str]) -> float:
    text = config.get("submission_time", "")
    if "pe_task_id" in config or not text.isdigit():
        return 0.0  # a PE task's config holds the task's own time, not the job's
    value = int(text)
    return value / 1e6 if value >= _MICROSECONDS else float(value)


def from_spool(spool_dir: Path | None) -> JobInstance | None:
    """Read which job this is from its execd spool dir ``active_jobs/<job>.<task>``.

    Returns
    -------
    JobInstance | None
        None when the dir is not known or holds no ``config`` (a slave host: there
        only the job's PE task dirs have one, with the task's own times), or when
        neither value can be read. Never raises.
    """
    if spool_dir is None:
        return None
    try:
        config = execd.read_config(spool_dir)
        env = execd.parse_key_values((spool_dir / "environment").read_bytes())
    except (GecoError, OSError):
        return None
    found = JobInstance(_cluster(env), _submitted(config), spool_dir / "config")
    return found if found.cluster or found.submitted else None
