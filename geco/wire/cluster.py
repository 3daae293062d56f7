"""A parallel job's hosts, all set up at once or none: the master's side of the barrier.

The master host's prolog knows the whole job (one qstat, or the resource file);
each slave host learns it from the master, never from the qmaster. The prolog
sends every slave's gecod a PREPARE carrying the job's ``GECOResourceSet_v1``
(all asked at once, each over its own TCP connection to ``[cluster] address``);
each makes the job's cgroups for its share and answers ``ready``
(:mod:`geco.daemon.clusterserve`). All ready: the prolog exits 0, the release of
DUROC's start barrier. Any host refusing, unreachable or silent past ``[cluster]
timeout``: the hosts that may have prepared get an ABORT, and the job is
re-queued. At the job's end the epilog sends RELEASE and gathers every host's
accounting into one record. Meanwhile ``geco status --job`` on any host of the job
asks the others for their live figures (NODE_STATUS), a slave tells the master
of an OOM kill (OOM_REPORT), whose gecod writes it once to the owner's stderr file,
and a host an ssh login reached asks the host it came from whether a process of the
user's job there made it (CALLERID, Slurm's callerid).

A request is a protocol-1 frame (``docs/wire-format.md``) MAC'd with the cluster
key (``[cluster] key_file``, the same file on every host), bound to the host it
is for (its payload names it) and to its own nonce (the reply quotes it); the
receiver checks the clock and keeps a replay cache, as on the local socket.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import time
from collections.abc import Iterable, Sequence
from typing import Any

from geco import log
from geco._tuple import NamedTuple
from geco.accounting import Accounting
from geco.cgroup import Limits
from geco.config import Config
from geco.errors import CgroupError, ConfigError, GecoError, ProtocolError
from geco.jobkey import JobKey
from geco.resourceset import ResourceSet, short_hostname
from geco.units import format_memory
from geco.wire import address, keys
from geco.wire.frame import decode, encode, nonce_of
from geco.wire.messages import CLUSTER_MAX_PAYLOAD, MsgType, NodeRequest, StatusReply
from geco.wire.reader import read_frame

__all__ = ["Answer", "WholeJob", "abort", "ask", "ask_all", "caller", "load_key", "master",
           "other_hosts", "port", "prepare", "release", "report_oom", "show", "whole_job"]

_log = log.get("wire.cluster")
# A reply's ``status`` when the request was done.
DONE = frozenset({"ready", "aborted", "released", "shown", "reported", "found"})
# An ABORT is sent when the job cannot start anyway, and a status is looked at by someone
# waiting: they get less time than a PREPARE.
_SHORT_TIMEOUT = 3.0


def port(cfg: Config) -> int:
    """The cluster channel's TCP port (``[cluster] address``: ``port:<n>``, ``service:..``).

    Raises
    ------
    ConfigError
        naming the setting, when it is not a TCP port.
    """
    where = address.parse(cfg.cluster_address)
    if where.port is None:
        raise ConfigError(f"[cluster] address must be a TCP port (port:<n> or "
                          f"service:<name>), got {cfg.cluster_address!r}")
    return where.port


def load_key(cfg: Config) -> bytes:
    """The cluster key (raises :class:`~geco.errors.KeyFileError` saying what to fix)."""
    return keys.load_key(cfg.cluster_key_file, "cluster key")


class Answer(NamedTuple):
    """One host's answer to one request.

    Attributes
    ----------
    host: the host asked.
    status: ``ready``, ``aborted``, ``released``, ``shown``, ``reported`` or ``found``
        when done;
        ``refused`` or ``failed``
        (the host said why); ``unreachable`` (no connection) or ``no-answer`` (no valid
        reply in time): then the host may or may not have done it.
    reason: the host's words, or ours.
    document: the whole reply (limits, accounting figures), ``{}`` without one.
    seconds: the round trip.
    """

    host: str
    status: str
    reason: str = ""
    document: dict[str, Any] = {}  # noqa: RUF012 (a NamedTuple default is never mutated)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """The host did what it was asked."""
        return self.status in DONE


def other_hosts(rs: ResourceSet, here: str | None = None) -> tuple[str, ...]:
    """The job's hosts other than this one (on the master: its slaves), as Grid Engine
    names them."""
    me = short_hostname(here)
    return tuple(n.name for n in rs.nodes if short_hostname(n.name) != me)


def master(rs: ResourceSet, here: str | None = None) -> str | None:
    """The job's master host when it is another host than this one (this is a slave),
    else None."""
    me = short_hostname(here)
    node = rs.node(me)
    if node is None or not node.is_slave:
        return None
    return next((n.name for n in rs.nodes if not n.is_slave), None)


def ask(host: str, kind: MsgType, request: NodeRequest, key: bytes, port: int,
        timeout: float) -> Answer:
    """Send one request to ``host``'s gecod and return its answer; never raises."""
    started = time.monotonic()
    deadline = started + timeout
    frame = encode(kind, request, key, max_payload=CLUSTER_MAX_PAYLOAD)
    nonce = nonce_of(frame)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(frame)
            raw = read_frame(sock, deadline, CLUSTER_MAX_PAYLOAD)
    except ProtocolError as exc:
        return Answer(host, "no-answer", exc.msg, {}, time.monotonic() - started)
    except TimeoutError:
        return Answer(host, "no-answer", f"no answer within {timeout:g} s", {},
                      time.monotonic() - started)
    except OSError as exc:
        return Answer(host, "unreachable", f"cannot reach its gecod on port {port}: "
                      f"{exc.strerror or exc}", {}, time.monotonic() - started)
    took = time.monotonic() - started
    try:
        got = decode(raw, key, peercred=False, max_payload=CLUSTER_MAX_PAYLOAD)
        if got.type is not MsgType.NODE_REPLY:
            raise ProtocolError(f"the reply must be a NODE_REPLY, got {got.type.name}",
                                reason="type")
        assert isinstance(got.message, StatusReply)  # decode unpacked it
        doc = got.message.document
        if doc.get("request") != nonce.hex():
            raise ProtocolError("the reply answers another request", reason="nonce")
    except ProtocolError as exc:
        return Answer(host, "no-answer", f"its reply is not valid: {exc.msg}", {}, took)
    status = str(doc.get("status", ""))
    return Answer(host, status if status else "no-answer", str(doc.get("reason", "")), doc,
                  took)


def ask_all(hosts: Sequence[str], kind: MsgType, job: int, task: int, key: bytes,
            cfg: Config, *, body: bytes = b"", timeout: float | None = None
            ) -> list[Answer]:
    """Send one request to every host at once; their answers, in the order of ``hosts``."""
    if not hosts:
        return []
    wait = cfg.cluster_timeout if timeout is None else timeout
    where = port(cfg)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(hosts), 64)) as pool:
        return list(pool.map(lambda h: ask(h, kind, NodeRequest(job, task, h, body), key,
                                           where, wait), hosts))


def prepare(rs: ResourceSet, cfg: Config, logger: log.Logger | None = None) -> list[Answer]:
    """Have every slave host of the job make its cgroups; the hosts that did not.

    On any failure, every host that may have prepared is sent an ABORT before this
    returns, so that nothing of the job is left anywhere once the prolog re-queues it.
    Each failure and the whole outcome are journaled (``barrier-failed``,
    ``job-prepared``).

    Raises
    ------
    GecoError
        when the cluster key or ``[cluster] address`` is unusable (nothing was sent).
    """
    logger = logger or _log
    hosts = other_hosts(rs)
    if not hosts:
        return []
    from geco.sge import v1format

    started = time.monotonic()
    key = load_key(cfg)
    answers = ask_all(hosts, MsgType.PREPARE, rs.job_id, rs.task_id, key, cfg,
                      body=v1format.serialize(rs))
    failed = [a for a in answers if not a.ok]
    took = time.monotonic() - started
    if not failed:
        logger.info("job %s: all %d slave hosts prepared in %.3f s: %s", rs.key, len(hosts),
                    took, ", ".join(hosts),
                    extra=log.job_fields(rs.job_id, rs.task_id, "job-prepared",
                                         NODES=len(hosts) + 1, SLAVE_HOSTS=" ".join(hosts),
                                         BARRIER_SEC=f"{took:.3f}",
                                         NODE_LIMITS=_limits_made(answers)))
        return []
    for a in failed:
        logger.error("job %s cannot start: host %s did not prepare it: %s (%s); the job is "
                     "re-queued", rs.key, a.host, a.reason or a.status, a.status,
                     extra=log.job_fields(rs.job_id, rs.task_id, "barrier-failed",
                                          NODE=a.host, STATUS=a.status, REASON=a.reason))
    # a host that said no undid its own work; any other may have prepared
    undo = [a.host for a in answers if a.status not in ("refused", "failed", "unreachable")]
    abort(rs, undo, key, cfg, logger)
    return failed


def _limits_made(answers: Sequence[Answer]) -> str:
    """Each slave host's limits as its READY reply gave them (``NODE_LIMITS``: JSON, one
    :meth:`~geco.cgroup.Limits.as_json` per host); a reply whose limits do not read (a
    field of the wrong kind) leaves its host out: the job runs all the same."""
    made = {}
    for a in answers:
        with contextlib.suppress(CgroupError):
            made[a.host] = Limits.from_json(a.document).as_json()
    return _per_host(made)


def _per_host(figures: dict[str, dict[str, Any]]) -> str:
    """A record's per-host field (``NODE_LIMITS``, ``NODE_FIGURES``): compact JSON."""
    import json

    return json.dumps(figures, sort_keys=True, separators=(",", ":"))


def abort(rs: ResourceSet, hosts: Iterable[str], key: bytes, cfg: Config,
          logger: log.Logger) -> None:
    """Tell ``hosts`` to undo the job (an ABORT each, at once); journal those that did not
    answer (their reaper removes what is left once Grid Engine drops the job there)."""
    for a in ask_all(list(hosts), MsgType.ABORT, rs.job_id, rs.task_id, key, cfg,
                     timeout=min(cfg.cluster_timeout, _SHORT_TIMEOUT)):
        if not a.ok:
            logger.warning("job %s: host %s did not confirm the abort: %s", rs.key, a.host,
                           a.reason or a.status,
                           extra=log.job_fields(rs.job_id, rs.task_id, "abort-unconfirmed",
                                                NODE=a.host, REASON=a.reason))


def release(rs: ResourceSet, cfg: Config, logger: log.Logger | None = None) -> list[Answer]:
    """The job ended: have every slave host tear it down; their answers (with figures).

    A host that cannot be asked (no cluster key here, no answer) is journaled; its
    reaper removes what is left there once Grid Engine drops the job.
    """
    logger = logger or _log
    hosts = other_hosts(rs)
    if not hosts:
        return []
    try:
        key = load_key(cfg)
    except GecoError as exc:
        return [Answer(h, "unreachable", str(exc)) for h in hosts]
    answers = ask_all(hosts, MsgType.RELEASE, rs.job_id, rs.task_id, key, cfg)
    for a in answers:
        if not a.ok:
            logger.warning("job %s: host %s did not report its end: %s (its reaper cleans up "
                           "there)", rs.key, a.host, a.reason or a.status,
                           extra=log.job_fields(rs.job_id, rs.task_id, "release-unconfirmed",
                                                NODE=a.host, REASON=a.reason))
    return answers


def show(job: JobKey, hosts: Sequence[str], cfg: Config) -> list[Answer]:
    """Each host's live figures of job task ``job`` (``document["jobs"]``: its
    :func:`geco.reports.jobstatus.to_dict` there), all asked at once.

    Raises
    ------
    GecoError
        when the cluster key cannot be read here (only root and whom the admin lets read
        ``[cluster] key_file`` may ask) or ``[cluster] address`` is unusable.
    """
    key = load_key(cfg)
    return ask_all(hosts, MsgType.NODE_STATUS, job.job, job.task, key, cfg,
                   timeout=min(cfg.cluster_timeout, _SHORT_TIMEOUT))


def report_oom(host: str, job: JobKey, text: str, cfg: Config) -> None:
    """Send the owner's words about an OOM kill here to the job's master ``host``, whose
    gecod appends them to the job's stderr file (this host has none: a slave's tasks
    write through the master's).

    Raises
    ------
    GecoError
        naming the master and why it did not take the report.
    """
    request = NodeRequest(job.job, job.task, host, text.encode("utf-8", "surrogateescape"))
    answer = ask(host, MsgType.OOM_REPORT, request, load_key(cfg), port(cfg),
                 cfg.cluster_timeout)
    if not answer.ok:
        raise GecoError(f"the job's master host {host} did not take it: "
                        f"{answer.reason or answer.status}")


def caller(host: str, job: JobKey, ends: tuple[str, int, str, int], uid: int,
           cfg: Config, *, timeout: float = _SHORT_TIMEOUT) -> bool:
    """Whether a process of ``uid`` in job ``job`` on ``host`` made the TCP connection
    ``ends`` (source, port, destination, port), as that host's gecod finds it, within
    ``timeout`` seconds (a login's budget). Any failure to ask (no key here, no answer) is
    a no, logged: the login then follows the other rules."""
    body = " ".join(map(str, (*ends, uid))).encode("ascii")
    try:
        answer = ask(host, MsgType.CALLERID, NodeRequest(job.job, job.task, host, body),
                     load_key(cfg), port(cfg),
                     max(0.001, min(cfg.cluster_timeout, _SHORT_TIMEOUT, timeout)))
    except GecoError as exc:
        answer = Answer(host, "unreachable", str(exc))
    if answer.status not in ("found", "refused"):
        _log.warning("job %s: cannot ask %s whose ssh connection this is: %s", job, host,
                     answer.reason or answer.status,
                     extra=log.job_fields(job.job, job.task, "callerid-failed", NODE=host,
                                          REASON=answer.reason))
    return answer.ok


class WholeJob(NamedTuple):
    """The job-end figures of every host of a job, for its one ``job-end`` record.

    Attributes
    ----------
    text: one phrase for people.
    fields: journal fields: ``NODES``, ``JOB_MEMORY_PEAK_MAX`` (the largest host's peak),
        ``JOB_CPU_USER_SEC`` / ``JOB_CPU_SYSTEM_SEC`` (sums), ``JOB_OOM_KILLS`` (sum),
        ``NODES_MISSING`` (hosts whose figures did not come back) and ``NODE_FIGURES``
        (JSON: each host's figures).
    """

    text: str
    fields: dict[str, object]


def whole_job(here: str, figures: Accounting, answers: Sequence[Answer]) -> WholeJob:
    """Merge this host's ``figures`` with the slaves' RELEASE answers."""
    per_host: dict[str, dict[str, Any]] = {here: figures._asdict()}
    missing = []
    for a in answers:
        got = a.document.get("accounting") if a.status == "released" else None
        if isinstance(got, dict):
            per_host[a.host] = got
        else:
            missing.append(a.host)
    peak = max(int(f.get("memory_peak") or 0) for f in per_host.values())
    user = sum(float(f.get("cpu_user") or 0.0) for f in per_host.values())
    system = sum(float(f.get("cpu_system") or 0.0) for f in per_host.values())
    ooms = sum(int(f.get("oom_kills") or 0) for f in per_host.values())
    nodes = len(per_host) + len(missing)
    text = (f"on its {nodes} hosts: largest peak memory {format_memory(peak)}, CPU "
            f"{user:.1f} s user + {system:.1f} s system, {ooms} OOM kill(s)")
    if missing:
        text += f"; no figures from {', '.join(missing)}"
    fields: dict[str, object] = {
        "NODES": nodes, "JOB_MEMORY_PEAK_MAX": peak, "JOB_CPU_USER_SEC": f"{user:.3f}",
        "JOB_CPU_SYSTEM_SEC": f"{system:.3f}", "JOB_OOM_KILLS": ooms,
        "NODE_FIGURES": _per_host(per_host),
        "NODES_MISSING": " ".join(missing) or None}
    return WholeJob(text, fields)
