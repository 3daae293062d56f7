"""A job's one way out on this node: :func:`end_job`, the mirror of the way in
(:func:`geco.job.containment.contain_job`).

Each way a job ends decides only that it has ended, and calls :func:`end_job`, saying
who it is (:class:`Ender`):

* the epilog (:func:`geco.hooks.epilog.end`, run by Grid Engine, or by gecod for it);
* gecod's shepherd watch (:mod:`geco.daemon.shepherdwatch`): the job's master shepherd exited;
* gecod's reaper (:mod:`geco.daemon.reaper`): the job no longer runs on this node;
* a slave host's release (:mod:`geco.daemon.clusterserve`): the job's master ended it.

The steps, in order:

1. The job's end has begun: no new ssh session goes into it (``gate.ending``, read by
   :mod:`geco.daemon.sshlogin`); then its lock is taken (``gate.job_lock``). The gate is
   gecod's; the Python epilog, outside gecod, has none.
2. Under the lock the caller confirms that the job has ended (it may have started again,
   or been ended by someone else meanwhile) and readies it (the epilog steps out of its
   cgroups). Not confirmed: nothing is done.
3. The job's resource set is read once (or taken from a caller that read it): its GPUs
   here, its other hosts, its owner all come from it. So are its journal fields (which
   job of its number it is, :class:`geco.log.JobFields`), found once and handed to each
   step that journals.
4. A parallel job's master (the epilog) tells the job's other hosts to end it
   (:func:`geco.wire.cluster.release`); their figures join this host's in one record.
5. :func:`geco.job.teardown.tear_down`: freeze, kill, remove the cgroups (a process held
   by a FUSE daemon freed by aborting the owner's connection; or journal ``cleanup-stuck``,
   and the queue disabled).
6. Its cgroups gone: the :class:`Ended` record is journaled (``job-end``: who ended the
   job, its figures, its other hosts'); what of its owner's other jobs holds one of its
   GPUs open is killed (:func:`geco.job.gpufds.revoke`: the kernel checks a device at
   open only); the job's files are forgotten (:func:`geco.jobfiles.forget`). A job
   that is stuck keeps its files: the reaper's next try needs them.

It returns the :class:`Ended` record, with the look for its owner's strays
(:func:`geco.job.strays.after_job`) for the caller to run when it suits it.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Callable, Iterator

from geco import gpushare, jobfiles, log
from geco._tuple import NamedTuple
from geco.accounting import Accounting
from geco.cgroup import Backend
from geco.config import Config
from geco.errors import GecoError
from geco.job import strays, teardown
from geco.job.teardown import Teardown
from geco.jobkey import JobKey
from geco.node import gpus
from geco.sge import resourcefile
from geco.units import format_memory

TYPE_CHECKING = False
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Protocol

    from geco.job.privatetmp import Freed
    from geco.resourceset import ResourceSet
    from geco.sge.execd import JobRef
    from geco.wire.cluster import Answer, WholeJob

    class Gate(Protocol):
        """What gecod lends a job's end (its :class:`geco.daemon.context.GecodContext`)."""

        ending: set[JobKey]  # the jobs whose end has begun: no ssh session goes in

        def job_lock(self, key: JobKey) -> AbstractContextManager[None]: ...

__all__ = ["UNREAD", "Ended", "Ender", "Unread", "end_job"]

_log = log.get("job.ending")

class Unread(enum.Enum):
    """The type of :data:`UNREAD`."""

    UNREAD = "unread"


# ``resources`` of a caller that has not read the job's resource set: end_job reads it.
UNREAD = Unread.UNREAD


class Ender(NamedTuple):
    """Who ends a job here, and what only that caller lends its end.

    Attributes
    ----------
    name: ``epilog`` (a parallel job's master: it tells the job's other hosts to end it,
        and their figures join its record), ``gecod`` (its shepherd watch), ``reaper``
        or ``master`` (a slave host's end, asked by the job's master: its record is
        ``job-end-slave``, and its owner's strays are the master's to look for), journaled
        as ``CLEANED_BY``.
    gate: gecod's per-job lock and set of ending jobs; None outside gecod.
    confirm: called under the lock: False leaves the job alone (it started again, or
        someone else ended it); it may ready the job for its end.
    queue_instance: ``<queue>@<host>`` to disable when the job is stuck (None: every
        queue of this host).
    logger: what the other hosts' failures are journaled through (the epilog's).
    """

    name: str
    gate: Gate | None = None
    confirm: Callable[[], bool] | None = None
    queue_instance: str | None = None
    logger: log.Logger | None = None

    @property
    def event(self) -> str:
        """The record's ``GECO_EVENT``."""
        return "job-end-slave" if self.name == "master" else "job-end"


class Ended(NamedTuple):
    """What :func:`end_job` did for one job.

    Attributes
    ----------
    key: ``<job>.<task>``.
    cleaned_by: who ended it (``epilog``, ``gecod``, ``reaper``, ``master``), journaled
        as ``CLEANED_BY``.
    teardown: its figures and leftovers (:class:`~geco.job.teardown.Teardown`).
    owner: its owner's user name, None when nothing says.
    gpus: the GPU ids it held here.
    whole: a parallel job's master: every host's figures (:func:`geco.wire.cluster.whole_job`).
    tmp: what its private /tmp and /dev/shm held when they were removed (None: it had none
        here, or they could not be removed: then the reaper tries again).
    strays: the look for its owner's strays (:func:`geco.job.strays.after_job`), for the
        caller to run when it suits it: at once (the epilog), after its own record (the
        reaper), once the job's clients have seen its end (gecod's shepherd watch); None
        when there is none to run (not clean, ``[strays] kill`` off, a slave host's end).
    """

    key: JobKey
    cleaned_by: str
    teardown: Teardown
    owner: str | None
    gpus: tuple[int, ...] = ()
    whole: WholeJob | None = None
    tmp: Freed | None = None
    strays: Callable[[], object] | None = None

    @property
    def clean(self) -> bool:
        """True when the job's cgroups are gone (and its files forgotten)."""
        return self.teardown.clean


def end_job(job: JobRef, cfg: Config, backend: Backend, by: Ender, *,
            resources: ResourceSet | Unread | None = UNREAD) -> Ended | None:
    """End ``job`` on this node (see the module docstring for the steps).

    Parameters
    ----------
    job: the job task; its execd spool dir, where given, is where its owner is read when
        its resource set names none (default: looked up).
    cfg: the configuration.
    backend: this node's cgroup backend.
    by: who ends it (:class:`Ender`).
    resources: the job's resource set when the caller read it already (None: it has
        none); :data:`UNREAD`: read here. None or unusable: the job is ended with what is
        known (no GPUs, no other hosts, its owner from its spool).

    Returns
    -------
    What was done; None when ``by.confirm`` left the job alone.

    Raises
    ------
    GecoError, OSError
        from ``by.confirm``, or when the job's key is no job key; the teardown's own
        problems are journaled and returned.
    """
    key = job.key
    with _ending(by.gate, key):
        if by.confirm is not None and not by.confirm():
            return None
        rs = (resourcefile.read_usable(cfg.resources_dir, key)
              if isinstance(resources, Unread) else resources)
        owner = strays.owner_in(rs, cfg, key, job.spool_dir)
        journal = log.JobFields(key.job, key.task)  # after the read, which names its instance
        answers = _release(rs, cfg, by.logger) if by.name == "epilog" else None
        done = teardown.tear_down(key, backend, cfg, queue_instance=by.queue_instance,
                                  cleaned_by=by.name, journal=journal, resources=rs,
                                  owner=owner)
        if rs is not None and answers:
            _gather(cfg, key, rs, answers, journal)
        ended = Ended(key, by.name, done, owner, _gpus_held(cfg, key, rs),
                      _whole(rs, done.accounting, answers),
                      _free_tmp(cfg, key, journal) if done.clean else None)
        if ended.clean:
            _journal(ended, by.event, journal, cfg)
            if ended.gpus:
                from geco.job import gpufds  # a GPU job's end only

                gpufds.revoke(cfg, backend, key, ended.gpus, owner, journal=journal)
    if not ended.clean:
        return ended
    jobfiles.forget(cfg, key)
    if by.name == "master" or not cfg.strays_kill:
        return ended
    return ended._replace(strays=lambda: strays.after_job(cfg, backend, key, owner,
                                                          cleaned_by=by.name))


@contextlib.contextmanager
def _ending(gate: Gate | None, key: JobKey) -> Iterator[None]:
    """Steps 1 and 2's frame: the job's end has begun (no ssh session goes into it) and its
    lock is held, until the steps under it are done; outside gecod (no gate), neither."""
    if gate is None:
        yield
        return
    gate.ending.add(key)  # before the lock: a login waiting for it is refused once it has it
    try:
        with gate.job_lock(key):
            yield
    finally:
        gate.ending.discard(key)


def _gpus_held(cfg: Config, key: JobKey, rs: ResourceSet | None) -> tuple[int, ...]:
    """The job's GPU ids here (its ``GECO_GPUS``); () on a node without GPUs, or when its
    resource set names none."""
    try:
        return gpus.held(cfg, key, rs)
    except GecoError as exc:  # [gpu] devices unusable: geco check says so
        _log.warning("job %s: which GPUs it held here is not known: %s", key, exc)
        return ()


def _release(rs: ResourceSet | None, cfg: Config, logger: log.Logger | None
             ) -> list[Answer] | None:
    """Tell a parallel job's other hosts to end it (all at once); their answers, with their
    figures, join this host's ``job-end`` record. None for a job of one host (or with no
    resource set: then the slaves' reapers end it there)."""
    if rs is None or len(rs.nodes) < 2:
        return None
    from geco.wire import cluster  # a parallel job's master only

    return cluster.release(rs, cfg, logger)


def _whole(rs: ResourceSet | None, figures: Accounting, answers: list[Answer] | None
           ) -> WholeJob | None:
    """Every host's figures of a parallel job whose master ends it, else None."""
    if rs is None or answers is None:
        return None
    from geco.wire import cluster

    node = rs.node()
    return cluster.whole_job(node.name if node is not None else os.uname().nodename,
                             figures, answers)


def _gather(cfg: Config, key: JobKey, rs: ResourceSet, answers: list[Answer],
            journal: log.JobFields) -> None:
    """Keep the samples each other host of a parallel job sent with its answer (under
    this job's number and owner, whatever a host's header says), for ``geco usage`` and
    the job's end record here."""
    import base64

    from geco.resourceset import short_hostname
    from geco.usage import samples  # a parallel job's master only

    for a in answers:
        text = a.document.get("usage") if a.status == "released" else None
        if not isinstance(text, str):
            continue
        try:
            got = samples.load(base64.b64decode(text, validate=True), f"{a.host}'s samples")
            header = got.header._replace(job_id=key.job, task_id=key.task, owner=rs.owner,
                                         host=short_hostname(a.host))
            samples.keep_copy(cfg.usage_dir, samples.Series(header, got.samples),
                              cfg.usage_readers)
        except (GecoError, ValueError) as exc:  # ValueError: not base64
            _log.warning("job %s: the usage samples of %s are not kept: %s", key, a.host,
                         exc, extra=journal.event("usage-sample-failed", NODE=a.host))


def _free_tmp(cfg: Config, key: JobKey, journal: log.JobFields) -> Freed | None:
    from geco.job import privatetmp  # not at load: the epilog's start-up

    return privatetmp.free(cfg, key, journal)


def _journal(ended: Ended, event: str, journal: log.JobFields, cfg: Config) -> None:
    """Journal a clean end: ``job-end`` (``job-end-slave`` on a slave host) with who ended
    it, its figures, the GPUs it held here and, for a parallel job's master, every host's."""
    done, key, whole = ended.teardown, ended.key, ended.whole
    others = f"; {whole.text}" if whole else ""
    shown = gpushare.format_ids(ended.gpus)
    fields = {"KILLED": done.killed, "CLEANED_BY": ended.cleaned_by,
              **(whole.fields if whole else {})}
    if ended.tmp is not None:  # what the job left in its private /tmp and /dev/shm
        others = (f", its private /tmp held {format_memory(ended.tmp.tmp)} and /dev/shm "
                  f"{format_memory(ended.tmp.shm)} (freed){others}")
        fields |= {"TMP_FREED": ended.tmp.tmp, "SHM_FREED": ended.tmp.shm}
    if not done.had_cgroups:
        _log.info("job %s ended: it has no cgroups on this node%s", key, others,
                  extra=journal.event(event, **fields))
        return
    seff, seff_fields = _efficiency(key, cfg)
    _log.info("job %s ended: %s%s%s; cgroups removed, %d leftover process(es) killed%s",
              key, done.accounting.describe(), f", GPUs {shown}" if shown else "", seff,
              done.killed, others,
              extra=journal.event(event, GPUS=shown or None, **fields, **seff_fields,
                                  **done.accounting.journal_fields()))


def _efficiency(key: JobKey, cfg: Config) -> tuple[str, dict[str, object]]:
    """The job's efficiency from its samples (:mod:`geco.usage.efficiency`; a parallel job's
    master: over every host's), for the record: words for its message and its fields;
    nothing when it has no samples here."""
    from geco.usage import efficiency, samples

    try:
        series = samples.read_job(cfg.usage_dir, key)
    except GecoError as exc:
        _log.debug("job %s: no efficiency in its end record: %s", key, exc)
        return "", {}
    if not series:
        return "", {}
    reports = [efficiency.report(s, running=False) for s in series]
    w = efficiency.whole(reports)
    words = "".join(f", {what} efficiency {value:.1f}%" for what, value in
                    (("CPU", w.cpu_efficiency), ("memory", w.memory_efficiency))
                    if value is not None)
    return words, {"WALL_SEC": f"{max(r.wall for r in reports):.1f}",
                   "CPU_EFFICIENCY": w.cpu_efficiency,
                   "MEMORY_EFFICIENCY": w.memory_efficiency,
                   "ADVICE": "; ".join(w.advice) or None}
