"""The journal of gecod's requests: each refusal and success, within their budgets.

Every refusal is journaled as ``GECO_EVENT=quarantine-refused`` (on the cluster lane
``cluster-refused``; priority warning) with the peer's pid and uid as the kernel gave
them (its address over TCP), the claimed job, task and pid (as ``JOB_ID`` only when
the frame passed its MAC with a secret key, else as ``CLAIMED_JOB_ID``: a stranger
never writes into a job's story), and the reason; every success of the quarantine as
``GECO_EVENT=quarantined`` (``ELAPSED_MS``: from the connection's accept to the
answer); both with ``LANE`` and with ``PEERCRED=1`` when the frame was
peer-credentialed. A peer gets a few refusal records per window, then one summary
(``GECO_EVENT=quarantine-refused-summary``), and a job a few hundred successes, then
one summary (``GECO_EVENT=quarantined-summary``; :mod:`geco.daemon.ratelimit`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from geco import log
from geco.daemon.context import Outcome
from geco.daemon.lanes import Connection, Lane, Who, pid_of
from geco.daemon.ratelimit import (
    OTHERS,
    REFUSAL_BURST,
    SUCCESS_BURST,
    JournalBudget,
    describe_refusals,
)
from geco.jobkey import JobKey
from geco.wire.frame import Frame
from geco.wire.messages import AckStatus

__all__ = ["RequestLog"]

_log = log.get("daemon.requestlog")


class RequestLog:
    """Journals gecod's answers within the budgets of :mod:`geco.daemon.ratelimit`; the
    server calls :meth:`end_window` every :attr:`window` seconds."""

    def __init__(self) -> None:
        self.refused = 0  # refusals, journaled or held back
        # peers are anyone's to make (TCP addresses): past MAX_KEYS a window counts the rest
        # as one (OTHERS); jobs only root's verified frames name
        self.refusals = JournalBudget[Who](REFUSAL_BURST, exempt=(0,), others=OTHERS)
        self.successes = JournalBudget[JobKey](SUCCESS_BURST)

    @property
    def window(self) -> float:
        """Seconds between summaries."""
        return self.refusals.window

    def success(self, conn: Connection, got: Frame, outcome: Outcome) -> None:
        """A process went into its job (JOB_STARTED, QUARANTINE_SELF): one record, unless
        the job spent its budget of the window."""
        job, task, pid = conn.claimed
        if job is not None and task is not None \
                and not self.successes.allow(JobKey(job, task), "python"):
            return
        limits, found = outcome.limits, outcome.found
        _log.info("quarantined process %s into job %s.%s (%s)%s", pid, job, task,
                  conn.describe(), "; created its cgroups" if outcome.created else "",
                  extra=log.job_fields(
                      job, task, "quarantined", PID=pid, PEER_PID=pid_of(conn),
                      PEER_UID=conn.uid, REQUEST=got.type.name, LANE=conn.lane.name,
                      ELAPSED_MS=round((time.monotonic() - conn.accepted) * 1000, 1),
                      PEERCRED=1 if got.peercred else None,
                      CGROUP_CREATED=int(outcome.created),
                      # Grid Engine's share of ELAPSED_MS (qstat), apart from geco's
                      RESOURCES=found.source if found else None,
                      LOOKUP_MS=round(found.seconds * 1000, 1) if found else None,
                      **(limits.journal_fields() if limits else {})))

    def refusal(self, conn: Connection, reason: str, text: str, status: AckStatus | None,
                request: str | None = None) -> None:
        """A request was refused (or its client dropped): one record, unless the peer spent
        its budget of the window."""
        self.refused += 1
        if not self.refusals.allow(conn.who, reason):
            return  # counted into the peer's summary at the end of the window
        job, task, pid = conn.claimed
        # the job a frame names is journaled as its JOB_ID only when the frame was MAC'd with
        # a secret key: otherwise anyone could put records into another user's job's story
        # (geco journal, its trace file) and choose which job they seem to be about
        ids = (log.job_fields(job, task) if conn.verified
               else log.job_fields(None, None, CLAIMED_JOB_ID=job, CLAIMED_TASK_ID=task))
        claim = f"job {job}.{task} pid {pid}" if job is not None else "no readable claim"
        if not conn.verified and job is not None:
            claim = f"claims {claim}"
        cluster = conn.lane.channel is not None
        fields = log.job_fields(
            None, None, "cluster-refused" if cluster else "quarantine-refused", PID=pid,
            PEER_PID=pid_of(conn), PEER_UID=conn.uid,
            PEER=f"{conn.host}:{conn.port}" if conn.host is not None else None,
            REASON=reason, REQUEST=request, LANE=conn.lane.name,
            PEERCRED=1 if conn.peercred else None,
            ACK_STATUS=status.name if status else "none")
        fields[log.FIELDS_ATTR].update(ids[log.FIELDS_ATTR])
        _log.warning("refused %s from %s (%s): %s",
                     request or ("a cluster request" if cluster else "a request"),
                     conn.describe(), claim, text, extra=fields)

    def end_window(self, lanes: Iterable[Lane]) -> None:
        """Journal what the window's budgets held back: one summary per peer and per job
        (the fast lanes' held-back successes too)."""
        window = self.window
        for held in self.refusals.end_window():
            event = ("cluster-refused-summary" if isinstance(held.key, str)
                     else "quarantine-refused-summary")
            _log.warning("%s", describe_refusals(held, window),
                         extra=log.job_fields(None, None, event,
                                              PEER_UID=held.key if isinstance(held.key, int)
                                              else None,
                                              PEER=held.key if isinstance(held.key, str)
                                              and held.key != OTHERS else None,
                                              REFUSED=held.count, WINDOW_S=window,
                                              REASONS=",".join(f"{r}:{n}" for r, n in
                                                               held.reasons.items())))
        for lane in lanes:
            if lane.fast is not None:
                for key, count in lane.fast.held().items():
                    self.successes.hold(key, "lane", count)
        for job in self.successes.end_window():
            key = job.key
            _log.info("job %s: %s more processes quarantined in %g s (a job's first %d a "
                      "window are journaled one by one)", key, f"{job.count:,}", window,
                      self.successes.burst,
                      extra=log.job_fields(key.job, key.task, "quarantined-summary",
                                           QUARANTINED=job.count, WINDOW_S=window))
