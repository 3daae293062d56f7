"""gecod's cluster channel: a slave host's side of a parallel job's barrier.

A job's master host asks this host's gecod, over TCP on ``[cluster] address``
(``[cluster] bind``: every address of the host by default), to PREPARE the job
(make its cgroups for this host's share, from the resource set the master sends:
no qstat here), to ABORT it (the job could not start on all its hosts) or to
RELEASE it (the job ended: :func:`geco.job.ending.end_job` here, as every way a job
ends, and answer with the figures). Any host of a
job may ask for its live figures here (NODE_STATUS, for ``geco status --job``),
and a slave host tells the job's master of an OOM kill (OOM_REPORT): the master's
gecod appends the words to the job owner's stderr file, as the owner. A host an
ssh login reached asks whether a process of the user's job here made the
connection (CALLERID). :mod:`geco.wire.cluster` is the asking side.

The channel is a lane of gecod's server (:class:`geco.daemon.lanes.Lane`): the
same non-blocking connections on the runloop, deadlines and budgets as the local
sockets, per peer address (a host's users can use its address too, so an idle
connection is closed for that host's next one). Before anything is read, the
peer must be one of the cluster's hosts (:mod:`geco.daemon.allowlist`).
Nothing is believed before its frame passes every check of
:func:`geco.wire.frame.decode` with the cluster key (MAC, clock, a replay cache of
its own) and names *this* host: a frame recorded for another host is refused
here. A refusal is journaled (``cluster-refused``: peer address, the job only
when the frame was the key holder's, reason; within the peer's budget) and
answered with an ACK that says nothing of the job, as on the local socket.

Each kind of request runs in the pool of its kind (:class:`geco.pools.Pools`):
PREPARE with the job starts, ABORT and RELEASE with the job ends, CALLERID and
NODE_STATUS with other hosts' look-ups (per host), OOM_REPORT with the OOM reports
(per job and host). A user's logins or OOM kills on another host never hold up a
job start here.
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from pathlib import Path
from typing import Any

from geco import log
from geco.config import Config
from geco.daemon.allowlist import AllowList
from geco.daemon.context import GecodContext
from geco.daemon.lanes import CLUSTER_BUDGET, Lane
from geco.errors import GecoError, JobKeyError, ProtocolError
from geco.job import containment, ending, privatetmp
from geco.job.undo import undo_job
from geco.jobkey import JobKey
from geco.oom.asowner import stderr_target, tell_owner
from geco.pools import Keys, Pool, Pools
from geco.reports import jobstatus
from geco.resourceset import short_hostname
from geco.sge import execd, lookup, resourcefile, v1format
from geco.ssh import policy as ssh
from geco.usage import samples
from geco.wire import cluster
from geco.wire.frame import Frame
from geco.wire.messages import NODE_REQUESTS, MsgType, NodeRequest
from geco.wire.replay import ReplayCache

__all__ = ["REPLAY_CAPACITY", "ClusterChannel", "listen", "open_channel"]

_log = log.get("daemon.clusterserve")
# Nonces the channel's replay cache holds over its window (2 x max_skew): 8,738 authentic
# requests a second at the default 30 s, where 65,536 refused everything at 1,100 a second
# (logins from other hosts and slaves' OOM reports feed it). Memory only as it fills.
REPLAY_CAPACITY = 1 << 19
# How long a slave's OOM words may take to reach the owner's file here.
_REPORT_TIMEOUT = 10.0


def listen(cfg: Config) -> socket.socket:
    """A socket listening on the channel's port: on ``[cluster] bind`` when set, else on
    every address of this host (IPv6 and IPv4 where the host has IPv6)."""
    port = cluster.port(cfg)
    if cfg.cluster_bind:
        return socket.create_server((cfg.cluster_bind, port), backlog=128)
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, backlog=128,
                                    reuse_port=False, dualstack_ipv6=True)
    return socket.create_server(("", port), backlog=128)


@dataclass(eq=False)
class ClusterChannel:
    """The cluster lane's requests (see the module docstring).

    Parameters
    ----------
    ctx: gecod's context (settings, cgroup backend, topology, job locks).
    key: the cluster key.
    listener: a listening TCP socket (:func:`listen`), served as :attr:`lane`.
    pools: where each kind of request runs.
    allow: who may connect (None: everyone, for a bench on loopback).
    on_change: called (from a worker) after a request made or removed a job's cgroups.
    on_prepared: called (from a worker) with a job's key once PREPARE made its cgroups
        (gecod watches them for OOM kills from then on).
    before_release: called (from a worker) with a job's key before RELEASE tears it down
        (gecod reads its OOM counter one last time, while the cgroup exists).
    """

    ctx: GecodContext
    key: bytes
    listener: InitVar[socket.socket]
    pools: Pools
    _: KW_ONLY
    allow: AllowList | None = None
    on_change: Callable[[], None] | None = None
    on_prepared: Callable[[JobKey], None] | None = None
    before_release: Callable[[JobKey], None] | None = None
    replay: ReplayCache = field(init=False)
    lane: Lane = field(init=False)

    def __post_init__(self, listener: socket.socket) -> None:
        self.replay = ReplayCache.for_skew(self.ctx.config.gecod_max_skew,
                                           capacity=REPLAY_CAPACITY)
        where = listener.getsockname()
        self.lane = Lane("cluster", listener, f"port {where[1]}", CLUSTER_BUDGET, channel=self)

    def start(self) -> None:
        """Start reading the allow-list (the lane is served by gecod's server)."""
        if self.allow is not None:
            self.allow.start()

    def reload(self, cfg: Config) -> None:
        """Read the allow-list again (gecod's SIGHUP: a host added to the cluster)."""
        if self.allow is not None:
            self.allow.reload(cfg)

    def close(self) -> None:
        if self.allow is not None:
            self.allow.close()

    # -- the lane's side ------------------------------------------------------------

    def admits(self, host: str) -> str:
        """"" when ``host`` may connect (see :mod:`geco.daemon.allowlist`)."""
        return self.allow.admits(host) if self.allow is not None else ""

    def accept(self, got: Frame, peer: str) -> tuple[Pool, Keys, Callable[[], object]]:
        """Where a verified frame runs, as which keys, and the work.

        Raises
        ------
        ProtocolError
            when it is not a request of this channel, or names another host.
        """
        if got.type not in NODE_REQUESTS:
            raise ProtocolError(f"{got.type.name} is not a request of the cluster channel "
                                "(PREPARE, ABORT, RELEASE, NODE_STATUS, OOM_REPORT, CALLERID)",
                                reason="type")
        req = got.message
        assert isinstance(req, NodeRequest)
        here = self.ctx.hostname
        if short_hostname(req.host) != short_hostname(here):
            raise ProtocolError(f"the request is for host {req.host}, not this one ({here})",
                                reason="host")
        try:
            key = JobKey(req.job_id, req.task_id)
        except JobKeyError as exc:  # ids past 19 digits: no job Grid Engine could have
            raise ProtocolError(str(exc), reason="payload") from None
        host = peer.rpartition(":")[0]
        kind = got.type
        pool, keys = self._route(kind, key, host)
        return pool, keys, lambda: self._do(kind, req, peer)

    def _route(self, kind: MsgType, key: JobKey, host: str) -> tuple[Pool, Keys]:
        """The pool of a kind of request, and its keys: a job start with the starts, a job's
        end with the ends; look-ups per asking host, OOM words per job and host."""
        pools = self.pools
        if kind is MsgType.PREPARE:
            return pools.starts, {"job": key}
        if kind in (MsgType.ABORT, MsgType.RELEASE):
            return pools.ends, {"job": key}
        if kind is MsgType.OOM_REPORT:
            return pools.reports, {"job": key, "peer": host}
        return pools.lookups, {"peer": host}

    def _do(self, kind: MsgType, req: NodeRequest, peer: str) -> dict[str, Any]:
        key = JobKey(req.job_id, req.task_id)
        started = time.monotonic()
        try:
            if kind is MsgType.NODE_STATUS:
                return self._show(key)  # a look: not journaled, changes nothing
            if kind is MsgType.CALLERID:
                return self._caller(key, req)  # journaled by the host that asks
            if kind is MsgType.OOM_REPORT:
                doc = self._report_oom(key, req)
            elif kind is MsgType.RELEASE:
                doc = self._release(key)  # the job's end takes its lock
            else:
                with self.ctx.job_lock(key):
                    doc = self._prepare(key, req) if kind is MsgType.PREPARE \
                        else self._abort(key)
        except GecoError as exc:
            doc = {"status": "failed", "reason": str(exc)}
        took = time.monotonic() - started
        event = {"ready": "job-prepared", "aborted": "job-aborted", "released": "job-released",
                 "reported": "oom-relayed"}.get(doc["status"], "cluster-request-failed")
        _log.log(log.INFO if event != "cluster-request-failed" else log.WARNING,
                 "job %s: %s from %s: %s%s", key, kind.name, peer, doc["status"],
                 f" ({doc['reason']})" if doc.get("reason") else "",
                 extra=log.job_fields(key.job, key.task, event, PEER=peer, REQUEST=kind.name,
                                      STATUS=doc["status"], REASON=doc.get("reason"),
                                      CPUS=doc.get("cpus"),
                                      ELAPSED_MS=round(took * 1000, 1)))
        if kind is MsgType.PREPARE and doc["status"] == "ready" and self.on_prepared:
            self.on_prepared(key)
        if self.on_change is not None and kind is not MsgType.OOM_REPORT:
            self.on_change()
        return doc

    def _prepare(self, key: JobKey, req: NodeRequest) -> dict[str, Any]:
        """The job's cgroups for this host's share, from the master's resource set."""
        cfg, ctx = self.ctx.config, self.ctx
        rs = v1format.parse(req.body)
        if rs.key != key:
            return {"status": "refused", "reason": f"the resources are job {rs.key}'s"}
        node = rs.node(ctx.hostname)
        if node is None:
            return {"status": "refused",
                    "reason": f"job {key} has no slots on {ctx.hostname}"}
        # saved first: the job's `qrsh -inherit` tasks here read it, never qstat
        resourcefile.write(cfg.resources_dir, rs)
        spool = Path(cfg.execd_spool_dir, ctx.hostname, "active_jobs", key)
        try:
            done = containment.contain_job(
                execd.JobRef(key.job, key.task, spool), cfg, ctx.backend, pid=None,
                found=lookup.Found(rs, "master", 0.0), hostname=ctx.hostname,
                topology=ctx.topology, reclaim=ctx.reclaim)
        except GecoError as exc:
            resourcefile.remove(cfg.resources_dir, key)
            return {"status": "failed", "reason": str(exc)}
        return {"status": "ready", **done.limits.as_json()}

    def _abort(self, key: JobKey) -> dict[str, Any]:
        """Undo a PREPARE: the job will not start (here or anywhere)."""
        done = undo_job(key, self.ctx.config, self.ctx.backend)
        if not done.clean:
            return {"status": "failed",
                    "reason": f"processes {', '.join(map(str, done.remaining))} are left"}
        return {"status": "aborted"}

    def _release(self, key: JobKey) -> dict[str, Any]:
        """The job ended: end it here (its master journals the job's end, with these
        figures) and say what it used."""
        def check_oom() -> bool:  # a kill just before the end is still reported
            if self.before_release is not None:
                self.before_release(key)
            return True

        ended = ending.end_job(execd.JobRef(key.job, key.task), self.ctx.config, self.ctx.backend,
                               ending.Ender("master", self.ctx, check_oom))
        assert ended is not None  # check_oom confirms: the master decided the end
        result = ended.teardown
        return {"status": "released" if result.clean else "failed",
                "reason": result.error or (f"{len(result.stuck)} processes would not die"
                                           if result.stuck else ""),
                "killed": result.killed, "accounting": result.accounting._asdict(),
                **self._usage(key)}

    def _usage(self, key: JobKey) -> dict[str, str]:
        """The job's samples here, for its master to keep (:func:`geco.usage.samples.export`);
        nothing when there are none."""
        try:
            series = samples.read(self.ctx.config.usage_dir, key)
        except GecoError as exc:
            _log.debug("job %s: its usage samples stay here: %s", key, exc)
            return {}
        if series is None:
            return {}
        return {"usage": base64.b64encode(samples.export(series, samples.GATHERED)).decode()}

    def _show(self, key: JobKey) -> dict[str, Any]:
        """The job's live figures here, as ``geco status --job --json`` has them."""
        ctx = self.ctx
        if not ctx.backend.exists(key):
            return {"status": "refused", "reason": str(jobstatus.not_here(key, ctx.hostname))}
        return {"status": "shown",
                "jobs": [dict(jobstatus.to_dict(jobstatus.read(ctx.config, ctx.backend, key)))]}

    def _caller(self, key: JobKey, req: NodeRequest) -> dict[str, Any]:
        """Whether a process of the user's in the job here made the connection named."""
        try:
            *where, uid_text = req.body.decode("ascii").split()
            ends = ssh.connection_ends(" ".join(where))
            uid = int(uid_text)
        except ValueError:
            ends = None
        if ends is None:
            return {"status": "failed", "reason": "the body must be '<src> <sport> <dst> "
                                                  "<dport> <uid>'"}
        deadline = time.monotonic() + self.ctx.config.ssh_callerid_budget
        try:
            if self.ctx.backend.exists(key) and \
                    ssh.holder_job(ends, uid, [key], self.ctx.backend, deadline=deadline) == key:
                return {"status": "found"}
        except ssh.OverBudget:
            return {"status": "refused",
                    "reason": f"the processes of uid {uid} in job {key} on "
                              f"{self.ctx.hostname} were not all looked at within "
                              f"{self.ctx.config.ssh_callerid_budget:g} s"}
        return {"status": "refused",
                "reason": f"no process of uid {uid} in job {key} on {self.ctx.hostname} "
                          "made that connection"}

    def _report_oom(self, key: JobKey, req: NodeRequest) -> dict[str, Any]:
        """A slave's OOM kill: its words go to the owner's stderr file here, once."""
        cfg, host = self.ctx.config, self.ctx.hostname
        spool = execd.find_spool_dir(cfg.execd_spool_dir, key, host)
        if spool is None:
            return {"status": "refused", "reason": f"job {key} is not running on {host}"}
        target = stderr_target(spool, privatetmp.namespace(cfg, key))
        if target is not None:  # else the job's stderr goes to /dev/null
            tell_owner(target, req.body.decode("utf-8", "replace"), timeout=_REPORT_TIMEOUT)
        return {"status": "reported"}


def open_channel(ctx: GecodContext, pools: Pools, *, listener: socket.socket | None = None,
                 on_change: Callable[[], None] | None = None,
                 on_prepared: Callable[[JobKey], None] | None = None,
                 before_release: Callable[[JobKey], None] | None = None
                 ) -> ClusterChannel | None:
    """The cluster channel, listening (on ``listener``: the socket a gecod handed over);
    None (warned about) when this host has no cluster key or cannot listen: then it cannot
    be a slave host of a parallel job."""
    cfg = ctx.config
    try:
        key = cluster.load_key(cfg)
        listener = listener or listen(cfg)
    except (GecoError, OSError) as exc:
        _log.warning("not listening for parallel jobs' masters: %s; multi-host jobs with this "
                     "host among their slaves are re-queued until it does", exc,
                     extra=log.job_fields(None, None, "cluster-channel-closed",
                                          REASON=str(exc)))
        return None
    return ClusterChannel(ctx, key, listener, pools, allow=AllowList(cfg), on_change=on_change,
                          on_prepared=on_prepared, before_release=before_release)
