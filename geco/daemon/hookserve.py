"""gecod's side of a hook: the prolog's, epilog's and starter's work done here, for hooks
that start in a millisecond.

Grid Engine runs ``/usr/libexec/geco/prolog``, ``epilog`` and ``starter`` for every
job: a small C program (``hook/geco_hook.c``) that asks gecod to do the hook's work.
gecod has the interpreter, the config and the cgroups at hand; the Python hook would
spend most of its time starting. gecod runs the very same code and journals it under
the hook's name (``SYSLOG_IDENTIFIER=geco-prolog``, ...; ``<hook>-done`` and
``job-started`` with the hook process's own "since exec"), so the journal, the cgroups,
the job's environment and the exit code are the Python hook's.

* prolog, epilog (root): HOOK, on the privileged socket with the secret key;
  :func:`geco.hooks.prolog.contain`, :func:`geco.hooks.epilog.end`.
* starter (the job owner, no key): STARTER, peer-credentialed on the public socket,
  with the job's arguments and what Grid Engine tells a starter about its shell;
  answered with the program, arguments and ``GECO_*`` variables the starter sets before
  it execs the job (:func:`geco.hooks.starter.plan`). gecod only computes words for the
  asker's own exec: it runs nothing, and reads nothing the asker names (the spooled
  config is its shepherd's, verified).

gecod does only the common case, the one it can do exactly as the hook would: the job
is not traced and the log level sends no line to the job's output. (For the prolog of a
job gecod has not seen, on a node without the preload, gecod asks qstat as the prolog
would and saves the resource file; for a traced job it then leaves the rest to the
Python prolog, which reads that file.) Anything else, a
failure included, is answered "not done" and the program runs the Python hook
(``/usr/libexec/geco/geco-prolog``, ``geco-epilog``), which does it all and reports
what went wrong in its own words: the work is safe to do twice.

The epilog's teardown may wait out ``kill_timeout`` for a stuck job: it runs in the
threads gecod tears jobs down in, never in a worker a quarantine request needs.

What is taken on trust: nothing the kernel does not vouch for. A HOOK comes on the
root lane, MAC'd with the secret key, from a process running as root; a STARTER from a
process inside the job's cgroups. The pid is the sender's (``SO_PEERCRED``), and its
parent must be the job's ``sge_shepherd``, running in the job's spool dir under the pid
Grid Engine spooled (:func:`geco.sge.execd.find_shepherd`), or for a qrsh command its
``qrsh_starter``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from geco import log, procfs
from geco.daemon.context import GecodContext, Peer
from geco.errors import GecoError
from geco.hooks import Exit, epilog, journal_done, prolog, starter
from geco.jobkey import JobKey
from geco.node import gpus
from geco.sge import execd, lookup, resourcefile
from geco.wire.messages import STARTER_ENVIRON, AckStatus, Hook, HookName, Starter, StarterReply

__all__ = ["refusal", "serve", "serve_starter"]

_log = log.get("daemon.hookserve")

_STATUS = {Exit.OK: AckStatus.OK, Exit.REQUEUE: AckStatus.REQUEUE, Exit.JOB_ERROR: AckStatus.HOLD}

# the log levels at which a Python hook writes lines to the job's output files
_VERBOSE = ("info", "debug")


def refusal(msg: Hook | Starter, peer: Peer | None, lane: str) -> str:
    """Why gecod will not take this HOOK or STARTER ("" when it will)."""
    name = "HOOK" if isinstance(msg, Hook) else "STARTER"
    if peer is None:
        return f"{name} needs gecod's Unix socket, where the kernel names the sender"
    if isinstance(msg, Hook) and (lane != "root" or peer.uid != 0):
        return "HOOK is root's hook program's request, on gecod's privileged socket"
    if msg.pid != peer.pid:
        return f"{name} must name its sender (pid {peer.pid}), not pid {msg.pid}"
    return ""


def serve(msg: Hook, ctx: GecodContext) -> tuple[AckStatus, str]:
    """Worker: do the hook's work for the sender; ``(OK, "")`` when done, else a status
    and why the hook must do it itself."""
    started = time.monotonic()
    cfg = ctx.config
    name = msg.hook.name.lower()
    if cfg.log_level in _VERBOSE:
        return _not_here(msg, f"log level {cfg.log_level}: the {name}'s lines go to the job")
    logger = log.speaking_as(f"hooks.{name}", f"geco-{name}")
    try:
        shepherd = procfs.ppid(msg.pid)
        job = execd.JobRef(msg.job_id, msg.task_id, Path(procfs.cwd(shepherd)))
        execd.find_shepherd(job, msg.pid)
        rs = resourcefile.read(cfg.resources_dir, job.key)
        if rs is not None and rs.trace_level > 0:
            return _not_here(msg, f"traced job (level {rs.trace_level})")
        if msg.hook is HookName.PROLOG:
            with ctx.job_lock(job.key):
                # no preload (gecod has not seen the job): qstat, as the prolog would ask it,
                # and the resource file saved; a traced job's prolog then reads that file
                found = lookup.find(job, cfg, logger) if rs is None else None
            if found is not None and found.resources.trace_level > 0:
                return _not_here(msg, f"traced job (level {found.resources.trace_level})")
            code = prolog.contain(job, shepherd, msg.pid, cfg, logger, ctx.backend, found)
        else:  # the job's lock and the resource set read above go to its end
            code = epilog.end(job, shepherd, msg.pid, cfg, logger, ctx.backend, gate=ctx,
                              resources=rs)
    except (GecoError, OSError) as exc:
        return _not_here(msg, str(exc), AckStatus.FAILED)
    journal_done(logger, name, code, time.monotonic() - started,
                 procfs.seconds_since_start(msg.pid), msg.job_id, msg.task_id)
    # a re-queue or a hold was decided and journaled here: the hook exits 99 or 100
    # without a second try
    return _STATUS[code], ""


def serve_starter(msg: Starter, nonce: bytes, peer: Peer, ctx: GecodContext) -> StarterReply:
    """Worker: how the starter ``msg.pid`` starts its job, as the Python starter would
    decide it, with the ``job-started`` record journaled; a reply that is not OK when the
    starter must decide it itself (outside the job's cgroups, a traced or verbose site,
    anything unexpected)."""
    key = JobKey(msg.job_id, msg.task_id)
    why = _starter_refusal(msg, key, ctx)
    if why:
        _log.debug("job %s: the starter (pid %d) does its work itself: %s", key, msg.pid, why)
        return StarterReply(key.job, key.task, AckStatus.REFUSED, nonce)
    try:
        env = dict(zip(STARTER_ENVIRON, msg.environ, strict=True))
        parent = procfs.ppid(msg.pid)
        job = execd.JobRef(key.job, key.task, None)
        if env["JOB_SCRIPT"] != "QRSH":
            job = execd.JobRef(key.job, key.task, Path(procfs.cwd(parent)))
            execd.find_shepherd(job, msg.pid)
        launch = starter.launch_of(env, msg.argv, parent, peer.uid, job.spool_dir or Path())
        node = os.uname().nodename
        facts = ctx.backend.read_limits(key).environment(
            len(os.sched_getaffinity(msg.pid)), node)
        facts.update(gpus.job_environment(ctx.config, key))
        program, args = starter.plan(msg.argv, env, launch)
        reply = StarterReply(key.job, key.task, AckStatus.OK, nonce, program, tuple(args),
                             (*(f"{k}={v}" for k, v in facts.items()), *starter.FOR_THE_STARTER))
        reply.pack()  # too big for one frame: the starter does it itself
    except (GecoError, OSError, ValueError) as exc:
        _log.debug("job %s: the starter (pid %d) does its work itself: %s", key, msg.pid, exc)
        return StarterReply(key.job, key.task, AckStatus.FAILED, nonce)
    starter.journal_started(log.speaking_as("hooks.starter", "geco-starter"), key, node,
                            facts["GECO_CPUS"], msg.argv, program,
                            procfs.seconds_since_start(msg.pid))
    return reply


def _starter_refusal(msg: Starter, key: JobKey, ctx: GecodContext) -> str:
    if ctx.config.log_level in _VERBOSE:
        return f"log level {ctx.config.log_level}: the starter's lines go to the job"
    if not msg.argv:
        return "no job to start"
    if not ctx.backend.contains(key, msg.pid):
        return "outside the job's cgroups"
    return ""


def _not_here(msg: Hook, why: str,
              status: AckStatus = AckStatus.REFUSED) -> tuple[AckStatus, str]:
    _log.debug("job %d.%d: the %s (pid %d) does its work itself: %s", msg.job_id,
               msg.task_id, msg.hook.name.lower(), msg.pid, why)
    return status, why
