"""gecod's cluster channel: a slave host's side of a parallel job's barrier.

A job's master host asks this host's gecod, over TCP on ``[cluster] address``
(every address of the host), to PREPARE the job (make its cgroups for this
host's share, from the resource set the master sends: no qstat here), to ABORT
it (the job could not start on all its hosts) or to RELEASE it (the job ended:
tear down, and answer with the figures). Any host of a job may ask for its live
figures here (NODE_STATUS, for ``geco status --job``), and a slave host tells the
job's master of an OOM kill (OOM_REPORT): the master's gecod appends the words
to the job owner's stderr file, as the owner. A host an ssh login reached asks
whether a process of the user's job here made the connection (CALLERID).
:mod:`geco.cluster` is the asking side.

Anyone on the network can connect, so nothing is believed before its frame
passes every check of :func:`geco.protocol.decode` with the cluster key (MAC,
clock, a replay cache of its own) and names *this* host: a frame recorded for
another host is refused here. A refusal is journaled (``cluster-refused``:
peer address, claimed job, reason) and answered with an ACK that says nothing
of the job, as on the local socket. The connections are few (a request per
host per job start and end), so each is served in a thread of a small pool;
a client that sends nothing is dropped at ``[gecod] connection_deadline``, and
connections past :data:`_MAX_OPEN` are closed unread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from geco import cluster, containment, jobstatus, log, ssh, teardown
from geco.daemon.quarantine import Context
from geco.errors import GecoError, ProtocolError
from geco.jobkey import JobKey
from geco.oom.owner_file import stderr_target, tell_owner
from geco.protocol import (
    CLUSTER_MAX_PAYLOAD,
    NODE_REQUESTS,
    MsgType,
    NodeRequest,
    ReplayCache,
    StatusReply,
    ack_for_error,
    claimed,
    decode,
    encode,
    read_frame,
)
from geco.resourceset import short_hostname
from geco.sge import execd, lookup, resourcefile, v1format

__all__ = ["ClusterServer"]

_log = log.get("gecod.cluster")
# Connections served or waiting at once; more are closed unread (a flood costs its sender).
_MAX_OPEN = 64
_WORKERS = 4


class ClusterServer:
    """The cluster listener and its workers (see the module docstring).

    Parameters
    ----------
    ctx: gecod's context (settings, cgroup backend, topology, job locks).
    key: the cluster key.
    listener: a listening TCP socket (:func:`listen`).
    on_change: called (from a worker) after a request made or removed a job's cgroups.
    on_prepared: called (from a worker) with a job's key once PREPARE made its cgroups
        (gecod watches them for OOM kills from then on).
    before_release: called (from a worker) with a job's key before RELEASE tears it down
        (gecod reads its OOM counter one last time, while the cgroup exists).
    """

    def __init__(self, ctx: Context, key: bytes, listener: socket.socket, *,
                 on_change: Callable[[], None] | None = None,
                 on_prepared: Callable[[JobKey], None] | None = None,
                 before_release: Callable[[JobKey], None] | None = None) -> None:
        self.ctx = ctx
        self.key = key
        self.listener = listener
        self.on_change = on_change
        self.on_prepared = on_prepared
        self.before_release = before_release
        self.replay = ReplayCache.for_skew(ctx.config.gecod_max_skew)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=_WORKERS,
                                                           thread_name_prefix="gecod-cluster")
        self._open = threading.BoundedSemaphore(_MAX_OPEN)
        self._thread = threading.Thread(target=self._accept, name="gecod-cluster-accept",
                                        daemon=True)

    @classmethod
    def listen(cls, port: int, host: str = "") -> socket.socket:
        """A socket listening on ``port`` on every address of this host (IPv6 and IPv4
        where the host has IPv6), or on ``host``'s address only."""
        if host:
            return socket.create_server((host, port), backlog=128)
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, backlog=128,
                                        reuse_port=False, dualstack_ipv6=True)
        return socket.create_server(("", port), backlog=128)

    def start(self) -> None:
        """Serve in threads of our own until :meth:`close`."""
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, let the requests in progress finish."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self.listener.accept()
            except OSError:
                return  # closed
            if not self._open.acquire(blocking=False):
                sock.close()
                continue
            try:
                # an IPv4 peer of the dual-stack socket reads ::ffff:a.b.c.d
                self._pool.submit(self._serve, sock,
                                  f"{peer[0].removeprefix('::ffff:')}:{peer[1]}")
            except RuntimeError:  # shutting down
                self._open.release()
                sock.close()
                return

    def _serve(self, sock: socket.socket, peer: str) -> None:
        try:
            with sock:
                self._answer(sock, peer)
        except Exception as exc:  # a bug must not end the channel
            _log.error("internal error serving %s: %s", peer, exc, exc_info=exc)
        finally:
            self._open.release()

    def _answer(self, sock: socket.socket, peer: str) -> None:
        cfg = self.ctx.config
        raw = b""
        try:
            raw = read_frame(sock, time.monotonic() + cfg.gecod_connection_deadline,
                             CLUSTER_MAX_PAYLOAD)
            got = decode(raw, self.key, max_skew=cfg.gecod_max_skew, replay=self.replay,
                         max_payload=CLUSTER_MAX_PAYLOAD)
            if got.type not in NODE_REQUESTS:
                raise ProtocolError(f"{got.type.name} is not a request of the cluster "
                                    "channel (PREPARE, ABORT, RELEASE, NODE_STATUS, "
                                    "OOM_REPORT, CALLERID)", reason="type")
            req = got.message
            assert isinstance(req, NodeRequest)
            here = self.ctx.hostname
            if short_hostname(req.host) != short_hostname(here):
                raise ProtocolError(f"the request is for host {req.host}, not this one "
                                    f"({here})", reason="host")
        except ProtocolError as exc:
            self._refused(peer, raw, exc)
            if raw and exc.reason not in ("timeout", "closed"):
                with contextlib.suppress(OSError):
                    sock.sendall(ack_for_error(raw, exc, self.key))
            return
        doc = self._do(got.type, req, peer)
        doc["request"] = got.nonce.hex()
        with contextlib.suppress(OSError):
            sock.sendall(encode(MsgType.NODE_REPLY, StatusReply(doc), self.key,
                                max_payload=CLUSTER_MAX_PAYLOAD))

    def _refused(self, peer: str, raw: bytes, exc: ProtocolError) -> None:
        job, task, _ = claimed(raw)
        _log.warning("refused a cluster request from %s (%s): %s", peer,
                     f"job {job}.{task}" if job is not None else "no readable claim", exc.msg,
                     extra=log.job_fields(job, task, "cluster-refused", PEER=peer,
                                          REASON=exc.reason))

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
            else:
                with self.ctx.job_lock(key):
                    if kind is MsgType.PREPARE:
                        doc = self._prepare(key, req)
                    elif kind is MsgType.ABORT:
                        doc = self._abort(key)
                    else:
                        doc = self._release(key)
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
        limits = done.limits
        return {"status": "ready", "cpus": limits.cpus, "mems": limits.mems,
                "memory": limits.memory, "memory_swap": limits.memory_swap}

    def _abort(self, key: JobKey) -> dict[str, Any]:
        """Undo a PREPARE: the job will not start (here or anywhere)."""
        cfg = self.ctx.config
        done = containment.release(key, self.ctx.backend, timeout=cfg.kill_timeout)
        resourcefile.remove(cfg.resources_dir, key)
        if not done.clean:
            return {"status": "failed",
                    "reason": f"processes {', '.join(map(str, done.remaining))} are left"}
        return {"status": "aborted"}

    def _release(self, key: JobKey) -> dict[str, Any]:
        """The job ended: tear it down here and say what it used."""
        cfg = self.ctx.config
        if self.before_release is not None:
            self.before_release(key)
        result = teardown.tear_down(key, self.ctx.backend, cfg, queue_instance=None,
                                    cleaned_by="master", event="job-end-slave")
        if result.clean:
            resourcefile.remove(cfg.resources_dir, key)
        return {"status": "released" if result.clean else "failed",
                "reason": result.error or (f"{len(result.stuck)} processes would not die"
                                           if result.stuck else ""),
                "killed": result.killed, "accounting": result.accounting._asdict()}


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
        if self.ctx.backend.exists(key) and \
                ssh.holder_job(ends, uid, [key], self.ctx.backend) == key:
            return {"status": "found"}
        return {"status": "refused",
                "reason": f"no process of uid {uid} in job {key} on {self.ctx.hostname} "
                          "made that connection"}

    def _report_oom(self, key: JobKey, req: NodeRequest) -> dict[str, Any]:
        """A slave's OOM kill: its words go to the owner's stderr file here, once."""
        cfg, host = self.ctx.config, self.ctx.hostname
        spool = execd.find_spool_dir(cfg.execd_spool_dir, key, host)
        if spool is None:
            return {"status": "refused", "reason": f"job {key} is not running on {host}"}
        target = stderr_target(spool)
        if target is not None:  # else the job's stderr goes to /dev/null
            tell_owner(target, req.body.decode("utf-8", "replace"))
        return {"status": "reported"}


def open_channel(ctx: Context, *, on_change: Callable[[], None] | None = None,
                 on_prepared: Callable[[JobKey], None] | None = None,
                 before_release: Callable[[JobKey], None] | None = None
                 ) -> ClusterServer | None:
    """The cluster channel, listening; None (warned about) when this host has no cluster key
    or cannot listen: then it cannot be a slave host of a parallel job."""
    cfg = ctx.config
    try:
        key = cluster.load_key(cfg)
        port = cluster.port(cfg)
        listener = ClusterServer.listen(port)
    except (GecoError, OSError) as exc:
        _log.warning("not listening for parallel jobs' masters: %s; multi-host jobs with this "
                     "host among their slaves are re-queued until it does", exc,
                     extra=log.job_fields(None, None, "cluster-channel-closed",
                                          REASON=str(exc)))
        return None
    return ClusterServer(ctx, key, listener, on_change=on_change, on_prepared=on_prepared,
                         before_release=before_release)
