"""A job's granted resources, the way every geco component gets them.

The prolog and gecod both need one task's :class:`~geco.resourceset.ResourceSet`
before they can build its cgroups, and must get it the same way, in this order:

1. the resource file ``<state_dir>/resources/<job>.<task>`` (an earlier hook or
   gecod already asked Grid Engine), so the qmaster is asked once per job;
2. else one ``qstat -xml -j`` (:func:`geco.sge.qstat.fetch`, placement from the
   spooled ``pe_hostfile``), saved to the resource file for everyone after us;
3. else, when the qmaster cannot be reached: by default the job is not
   started (a :class:`~geco.errors.QstatError`: the prolog re-queues it, gecod
   refuses the shepherd's exec, and Grid Engine reschedules it), because the
   node alone cannot know its memory limits. A site that sets ``[qstat]
   run_without_memory_limits = true`` gets what the node itself knows from the
   execd spool (owner, name, hosts and slots) instead: the job is contained
   with its cores only. Journaled either way (``degraded-containment-refused``
   or ``degraded-containment``); never uncontained without a warning.

A set made here (2 or 3) also says which job of its number it is, read from the
spool (:mod:`geco.sge.jobinstance`), and so do the job's records from then on.

Grid Engine answering that the task is not running (:class:`TaskNotRunning`)
or that the job does not exist (:class:`~geco.errors.JobNotFound`) is passed on:
that is a race or a bogus request, not a reason to guess.
"""

from __future__ import annotations

import time
from pathlib import Path

from geco import gpushare, log
from geco._tuple import NamedTuple
from geco.config import Config
from geco.errors import GecoError, QstatError, TaskNotRunning
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import execd, jobinstance, resourcefile

__all__ = ["Found", "find", "from_spool"]

_log = log.get("sge.lookup")


def from_spool(job: execd.JobRef, gpu_complex: str = "gpu") -> ResourceSet:
    """Build what the node itself knows about the job: owner, name, hosts and slots, and
    on the master node the GPU ids Grid Engine granted there (an RSMAP's
    ``SGE_HGR_<complex>`` in the job's spooled environment, ids separated by spaces, mapped
    to the node's GPUs at containment: :func:`geco.node.gpus.map_share`). A count without ids
    (Son of Grid Engine, an INT consumable) is not known here: no GPU, never a guess.

    Parameters
    ----------
    job: the job, with ``spool_dir`` = its execd ``active_jobs/<job>.<task>`` directory.
    gpu_complex: ``[gpu] complex``.

    Raises
    ------
    GecoError
        when the job has no spool dir, or its ``config`` or ``pe_hostfile`` cannot be read.
    QstatParseError
        when the ``pe_hostfile`` is malformed.
    """
    if job.spool_dir is None or job.pe_hostfile is None:
        raise GecoError("the job's execd spool dir is not known", job=job.key)
    from geco.sge.pe_hostfile import parse_pe_hostfile  # only when qstat cannot answer

    conf = execd.read_config(job.spool_dir)
    try:
        hostfile = job.pe_hostfile.read_bytes()
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the job's pe_hostfile", exc,
                                     path=job.pe_hostfile) from exc
    granted = _granted_gpus(job.spool_dir, gpu_complex)
    nodes = tuple(NodeResources(p.host, is_slave=not p.is_master, slots=p.slots,
                                gpus=granted if p.is_master else "")
                  for p in parse_pe_hostfile(hostfile))
    return ResourceSet(job.job_id, job.task_id, job_name=conf.get("job_name", ""),
                       owner=conf.get("job_owner", ""), cwd=conf.get("cwd", ""), nodes=nodes)


def _granted_gpus(spool_dir: Path, gpu_complex: str) -> str:
    """``SGE_HGR_<complex>`` from the job's spooled environment as an id list ("" = none)."""
    try:
        env = execd.parse_key_values((spool_dir / "environment").read_bytes())
    except OSError:
        return ""
    return gpushare.from_hgr(env.get(f"SGE_HGR_{gpu_complex}".encode(), b"").decode(
        errors="replace"))


class Found(NamedTuple):
    """A job's resource set, where it came from, and how long getting it took.

    Attributes
    ----------
    resources: the resource set.
    source: ``file`` (the resource file), ``qstat`` (asked now, and saved), or
        ``spool`` (the qmaster could not be reached and the site runs such jobs with
        what the node knows: no memory limits).
    seconds: the time it took.
    """

    resources: ResourceSet
    source: str
    seconds: float


def find(job: execd.JobRef, cfg: Config, logger: log.Logger | None = None, *,
         prepared_only: bool = False) -> Found:
    """Return the job's resource set: the resource file, else qstat (then saved), else (when
    the site allows it) the node's spool; and which of them it came from.

    Blocks for as long as qstat takes (its timeout x retries): gecod calls it
    from a worker thread, never from its loop.

    Parameters
    ----------
    job: the job task, with its execd spool dir when known (for the pe_hostfile).
    cfg: settings (state dir, qstat command, timeout and retries,
        ``run_without_memory_limits``).
    logger: where warnings go (default ``geco.sge.lookup``).
    prepared_only: the resource file only (a parallel job's task on a slave host where
        ``[cluster] slaves = "strict"``: the file its master's PREPARE wrote), never qstat.

    Raises
    ------
    TaskNotRunning, JobNotFound
        when Grid Engine says the task is not running or the job does not exist.
    QstatParseError
        when qstat's answer is malformed.
    QstatError
        when the qmaster is unreachable and the site does not run jobs without
        memory limits (a transient problem: re-queue).
    GecoError
        when ``prepared_only`` and there is no usable resource file.
    GecoError
        when the qmaster is unreachable and the spool cannot be read either.
    """
    logger = logger or _log
    started = time.monotonic()
    fields = log.job_fields(job.job_id, job.task_id)
    try:
        saved = resourcefile.read(cfg.resources_dir, job.key)
    except GecoError as exc:
        logger.warning("ignoring unusable resource file: %s", exc, extra=fields)
        saved = None
    if saved is not None:
        return Found(saved, "file", time.monotonic() - started)
    if prepared_only:
        raise GecoError(f"job {job.key} was not prepared on this host ({short_hostname()}) "
                        "by its master host's prolog, so its tasks are refused here "
                        "([cluster] slaves = \"strict\"): is geco's prolog set in the job's "
                        "queue, and do its hosts share the cluster key?")
    from geco.sge import qstat  # lxml and subprocess: only when no hook or gecod asked yet

    instance = jobinstance.from_spool(job.spool_dir)
    if instance is not None:  # qstat's retries, a refusal: the job's records say which job
        log.job_instance(job.job_id, job.task_id, instance.cluster, instance.submitted,
                         instance.source)
    try:
        rs = qstat.fetch(job.job_id, job.task_id, cfg, pe_hostfile=job.pe_hostfile)
    except TaskNotRunning:
        raise  # Grid Engine answered: a race at start-up; re-queue rather than guess
    except QstatError as exc:
        if not cfg.run_without_memory_limits:
            logger.warning("qmaster not reachable (%s): job %s is not started with its cores "
                           "only and no memory limits; Grid Engine starts it again later "
                           "([qstat] run_without_memory_limits = false)", exc, job.key,
                           extra=log.job_fields(job.job_id, job.task_id,
                                                "degraded-containment-refused"))
            raise
        logger.warning("qmaster not reachable (%s): job %s is contained with its cores only, "
                       "WITHOUT memory limits", exc, job.key,
                       extra=log.job_fields(job.job_id, job.task_id, "degraded-containment"))
        rs = from_spool(job, cfg.gpu_complex)
        return Found(instance.stamp(rs) if instance else rs, "spool",
                     time.monotonic() - started)
    if instance is not None:
        rs = instance.stamp(rs)
    try:  # in place of a missing or unusable file: GPUs geco picked here are kept
        rs = resourcefile.rewrite(cfg.resources_dir, rs)
    except GecoError as exc:  # a full disk must not stop the job; later hooks ask qstat again
        logger.warning("%s", exc, extra=fields)
    return Found(rs, "qstat", time.monotonic() - started)
