"""``geco daemon``: start gecod, serve until SIGTERM, leave every job where it is.

Start-up refuses, with one line on stderr and exit status 1, when:

* it does not run as root (it creates cgroups and moves other users' processes);
* the configuration or the socket address is unusable;
* the key file is unsafe (the message of :func:`geco.wire.keys.load_key` says the fix);
* another gecod already answers on the socket;
* the cgroup hierarchy or the node topology cannot be used.

On cgroup v2 under systemd, job cgroups live in a delegated unit of their own
(``[cgroup] v2_base`` in ``geco-jobs.service``): start-up checks that systemd
delegates it and passes the controllers down (:meth:`geco.cgroup.V2Backend.ensure_root`
says which unit setting to fix when not); a base outside any unit is only
warned about, since systemd owns that part of the tree. On cgroup v1 the same holds
for ``[cgroup] v1_systemd_base`` (:meth:`geco.cgroup.V1Backend.ensure_root`).

Then it rebuilds its view of the node from the cgroup tree (nothing lives only
in its memory), watches the running jobs' shepherds again (before it listens: a
shepherd that exits once gecod answers is never missed), listens, and tells
systemd ``READY=1``. While it runs:
``WATCHDOG=1`` at half of ``$WATCHDOG_USEC`` from a runloop timer (a hung
loop stops pinging, and systemd restarts it), ``STATUS=`` with the job count;
each job's master shepherd watched through a pidfd, and the job torn down the
moment it exits (:mod:`geco.daemon.shepherdwatch`; found again from the cgroups at
start, so a restart loses no job end); the reaper (:mod:`geco.daemon.reaper`)
every ``[gecod] reaper_interval`` s in a thread of its own: cgroups of jobs
that no longer run here are emptied and
removed, processes past ``h_rt`` + ``walltime_grace`` killed, old trace files
deleted; with ``[metrics] listen``, a Prometheus endpoint in a thread of its own
(:mod:`geco.daemon.metrics`: the usage sampler's last round, never the kernel; a port
it cannot bind costs the metrics only). SIGHUP re-reads the configuration and the key
file (the reaper's interval and walltime settings included). SIGUSR2 (``geco handover``,
after an upgrade): start the gecod installed now and hand the sockets over to it once it is
loaded (:mod:`geco.daemon.handover`), then exit 0. SIGTERM or SIGINT: stop
accepting, answer the requests already being worked on (at most
``_DRAIN_GRACE`` seconds) and let a reaper round finish the job it is at (a
teardown cut short could leave a job frozen), ``STOPPING=1``, exit 0. Job
cgroups are never touched on the way out: running jobs stay contained, and a
restart neither kills nor releases them (they are not in gecod's cgroup, so
no ``KillMode=`` reaches them; ``conf/gecod.service`` says why they cannot be).
When the SIGTERM is the node's own shutdown (systemd says ``stopping``: poweroff,
reboot, halt), nothing of that is worth waiting for: the jobs die with the node, and
what a worker waits on (a qstat or qmod to a Grid Engine that is going down too, a
cluster peer, a teardown's ``kill_timeout``) could hold the poweroff up until
systemd's stop timeout. gecod then answers only what is done within
``_SHUTDOWN_GRACE`` s and exits 0 without waiting for its threads (systemd SIGKILLs
what they started: ``KillMode=mixed``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import grp
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from geco import __version__, cgroup, log, oom
from geco import config as _config
from geco.daemon import clusterserve, fastlane, handover, metrics, status
from geco.daemon.context import GecodContext
from geco.daemon.lanes import PUBLIC_BUDGET, Lane, root_budget
from geco.daemon.quarantine import spool_root
from geco.daemon.reaper import Reaper
from geco.daemon.runloop import RunLoop
from geco.daemon.server import Server
from geco.daemon.shepherdwatch import ShepherdWatch
from geco.errors import GecoError
from geco.job import privatetmp, trace
from geco.jobkey import JobKey
from geco.node.topology import Topology
from geco.pools import Pools
from geco.usage.sampler import Health, Sampler
from geco.wire import address, cluster, keys

__all__ = ["Daemon", "notify", "run"]

_log = log.get("daemon.service")

EXIT_OK, EXIT_FAILED = 0, 1
# Seconds a thread holds the GIL while another waits for it (sys.setswitchinterval).
_GIL_SWITCH = 0.001
# Seconds SIGTERM waits for requests already in a worker to be answered.
_DRAIN_GRACE = 10.0
# At the node's shutdown: seconds for requests nearly answered, then for the log thread.
_SHUTDOWN_GRACE = 1.0
# The longest gecod asks systemd whether the node is going down (a wedged PID 1 is no
# reason to stop slowly).
_SYSTEMCTL_WAIT = 2.0
# Seconds between two reports of log records dropped (journald stopped or too slow).
_LOG_DROP_REPORT = 10.0
# A job start short of cores waits this much beyond kill_timeout for ended jobs' teardowns.
_RECLAIM_SLACK = 5.0
# Seconds between status lines to systemd while requests keep coming.
_STATUS_EVERY = 1.0
# The longest a slave's RELEASE waits for gecod's loop to read the job's OOM counter.
_OOM_CHECK_WAIT = 2.0
# Held back from the first line until the loop handles them: a SIGTERM between
# listen() and the handlers would otherwise kill gecod the default way, leaving
# its socket file behind and its workers unjoined.
_HANDLED_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2}
# Settings a SIGHUP cannot change in a running gecod (sockets, threads, cgroup
# layout and the replay window are set up once); a change is logged instead.
_RESTART_ONLY = ("gecod_socket", "gecod_privileged_socket", "gecod_privileged_group",
                 "gecod_max_skew", "gecod_workers", "gecod_granularity",
                 "cgroup_mount", "cgroup_name", "cgroup_version", "cgroup_v2_base",
                 "cgroup_v1_systemd_base",
                 "exclusive_cpus", "state_dir", "cluster_address", "cluster_bind",
                 "metrics_listen")


def notify(message: str, fds: list[int] | None = None) -> bool:
    """Send ``message`` (and ``fds``) to systemd (sd_notify); a no-op returning False
    without NOTIFY_SOCKET."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return False
    try:
        from systemd import daemon as sd
    except ImportError:  # systemd-python missing: gecod still runs, unsupervised
        return False
    return bool(sd.notify(message, fds=fds) if fds else sd.notify(message))


def _watchdog_interval() -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds when systemd watches this process, else None."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    wpid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if wpid and wpid != str(os.getpid()):
        return None  # meant for another process (we were started by a wrapper)
    return int(usec) / 2e6


class _StartupError(Exception):
    """A reason not to start; printed as one line, exit 1."""


class Daemon:
    """gecod assembled: config, key, cgroups, listener, runloop, workers.

    Parameters
    ----------
    cfg: the configuration.
    config_path: where it came from (re-read on SIGHUP).
    log_level: the stderr level chosen on the command line (None = from the config).
    """

    def __init__(self, cfg: _config.Config, config_path: Path,
                 log_level: str | None = None,
                 successor: handover.Successor | None = None) -> None:
        self.cfg = cfg
        # started by a running gecod to take its sockets over (geco.daemon.handover)
        self.successor = successor
        self.config_path = config_path
        self.log_level = log_level
        if os.geteuid() != 0:
            raise _StartupError(f"gecod must run as root (it creates cgroups and moves other "
                                f"users' processes into them); running as uid {os.geteuid()}")
        try:
            self.address = address.parse(cfg.gecod_socket)
            self.root_address = address.privileged(cfg.gecod_privileged_socket, self.address)
            self.root_group = _group(cfg.gecod_privileged_group)
            self.secret = keys.load_key(cfg.gecod_key_file)
            self.metrics_where = metrics.parse_listen(cfg.metrics_listen)
        except GecoError as exc:
            raise _StartupError(str(exc)) from exc
        if self.successor is None:
            self._refuse_second_gecod()
        try:
            self.backend = cgroup.for_config(cfg)
            self.backend.ensure_root()
            self._warn_outside_units()
            self.topology = Topology.load()
            inherited = self._take_over() if self.successor is not None else {}
            node = status.scan(self.backend)
        except GecoError as exc:
            raise _StartupError(str(exc)) from exc
        self.ctx = GecodContext(cfg, self.backend, self.topology)
        _log.info("gecod %s: %d job cgroups on this node (cpus in use: %s of %s), rebuilt "
                  "from %s", __version__, len(node.jobs), node.cpus_in_use or "none",
                  node.available_cpus, self.backend,
                  extra=log.job_fields(None, None, "gecod-state-rebuilt",
                                       JOB_COUNT=len(node.jobs),
                                       JOBS=",".join(j.key for j in node.jobs) or None,
                                       CPUS_IN_USE=node.cpus_in_use))
        self.loop = RunLoop(cfg.gecod_granularity)
        # every kind of work on threads of its own, bounded per uid, job and peer: nothing
        # a user can cause waits in front of a job start or another user's login
        self.pools = Pools.open(cfg.gecod_workers)
        # OOM kills of every job cgroup: watched from the loop, reported (owner's .e
        # file, journal) and acted on (policy) in the reports pool, one job's at a time
        self.oom = oom.OomMonitor(self.loop, self.backend, state_dir=cfg.state_dir,
                                  policy=cfg.gecod_oom, execd_spool_dir=cfg.execd_spool_dir,
                                  resources_dir=cfg.resources_dir, executor=self.pools.reports,
                                  relay=self._relay_oom, namespace_of=self._job_namespace)
        # a job ends when its master shepherd exits: torn down at once, in the pool of
        # job ends (an allocation short of cores waits for them in a worker)
        self.shepherds = ShepherdWatch(self.loop, self.ctx, self.pools.ends,
                                       before_end=self.oom.check, on_ended=self._job_reaped)
        self.ctx.reclaim = self._reclaim
        # before anyone can connect: once gecod answers, no running job's end is missed
        self._rewatch()
        try:
            self.listener = inherited.get("public") or address.listen(self.address)
        except GecoError as exc:
            raise _StartupError(str(exc)) from exc
        try:
            self.root_listener = inherited.get("root") or address.listen(
                self.root_address, mode=address.ROOT_MODE | (0o060 if self.root_group else 0),
                group=self.root_group)
        except GecoError as exc:
            self.listener.close()
            address.unlink_socket(self.address)
            raise _StartupError(str(exc)) from exc
        # later tasks of contained jobs: served in C threads (geco.daemon.fastlane)
        self.lane = self.ctx.lane = fastlane.open_lane(
            self.root_listener, cfg, self.secret, **self._lane_settings(cfg))
        lanes = [Lane("root", self.root_listener, self.root_address,
                      root_budget(cfg.gecod_workers), inline=True, fast=self.lane),
                 Lane("public", self.listener, self.address, PUBLIC_BUDGET)]
        self.server = Server(self.loop, lanes, self.secret, self.ctx, self.pools,
                             on_change=self._report_status_soon, on_contained=self._watch_job,
                             on_shepherd=self.shepherds.watch)
        # leftovers of ended jobs, and jobs past h_rt + grace: rounds in a thread of
        # their own, so a teardown waiting out kill_timeout never holds a worker a
        # quarantine request needs
        self.reaper_executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gecod-reaper")
        self.reaper = Reaper(self.loop, self.backend, cfg, self.reaper_executor,
                             on_reaped=self._job_reaped, gate=self.ctx)
        # what each job uses over time (geco usage): rounds in a thread of their own
        self.sampler = Sampler(self.loop, self.backend, cfg, topology=self.topology)
        # the sampler's last round and gecod's counters for Prometheus ([metrics] listen):
        # a thread of its own, its clients served together within per-peer caps
        self.metrics = self._open_metrics(inherited.pop("metrics", None))
        # the masters of parallel jobs with this host among their slaves (geco.wire.cluster):
        # a lane of the server's, on the loop, with the budgets of the local sockets
        self.cluster = clusterserve.open_channel(
            self.ctx, self.pools, listener=inherited.get("cluster"),
            on_change=lambda: self.loop.call_soon_threadsafe(self._report_status_soon),
            on_prepared=lambda key: self.loop.call_soon_threadsafe(lambda: self._watch_job(key)),
            before_release=self._check_oom_now)
        self._stopping = False
        self._node_going_down = False  # SIGTERM came with the node's shutdown
        self._log_drops = 0
        self._status_due = False
        self.predecessor: handover.Predecessor | None = None  # this gecod handing over

    def _take_over(self) -> dict[str, socket.socket]:
        """A successor: the running gecod's sockets, once it has stopped answering on them."""
        assert self.successor is not None
        taken = {"public": self.successor.take("public", self.address),
                 "root": self.successor.take("root", self.root_address)}
        if "cluster" in self.successor.sockets:
            taken["cluster"] = self.successor.take(
                "cluster", address.Address("tcp", port=cluster.port(self.cfg)))
        # checked against [metrics] listen where it is opened (a mismatch costs no start)
        taken["metrics"] = self.successor.sockets.pop("metrics", None)
        self.successor.ready()  # from here on the node is ours alone
        return {name: sock for name, sock in taken.items() if sock is not None}

    def _open_metrics(self, inherited: socket.socket | None) -> metrics.Endpoint | None:
        """The metrics endpoint when ``[metrics] listen`` is set and it can be opened."""
        if self.metrics_where is None:
            if inherited is not None:  # the gecod before had one; this configuration not
                inherited.close()
            return None
        endpoint = metrics.open_endpoint(
            self.cfg, self.metrics_where, lambda: self.sampler.latest,
            lambda: Health(self.server.served, self.server.refused, self.server.working),
            self.sampler.node, inherited)
        if endpoint is not None:
            self.sampler.on_round = endpoint.body.prepare
        return endpoint

    def _warn_outside_units(self) -> None:
        """Warn when systemd runs this node but the job cgroups (v2) or their systemd base
        (v1) are in no unit it delegates."""
        backend = self.backend
        if isinstance(backend, cgroup.V2Backend) and backend.delegated_root is None \
                and cgroup.SYSTEMD_RUN.is_dir():
            _log.warning("job cgroups live in %s, outside any delegated systemd unit: systemd "
                         "owns that part of the tree and may undo geco's settings there (drop "
                         "+cpuset on a daemon-reload); install conf/geco-jobs.service and set "
                         "[cgroup] v2_base = \"%s/system.slice/geco-jobs.service/jobs\"",
                         backend.base, backend.mount_point,
                         extra=log.job_fields(None, None, "cgroup-base-not-delegated",
                                              CGROUP=backend.base))
        if isinstance(backend, cgroup.V1Backend) and cgroup.SYSTEMD_RUN.is_dir() \
                and None in backend.systemd_units.values():
            _log.warning("[cgroup] v1_systemd_base lies in no systemd unit: systemd does not "
                         "delegate it to geco; install conf/geco-jobs.service and set "
                         "[cgroup] v1_systemd_base = \"/system.slice/geco-jobs.service/jobs\"",
                         extra=log.job_fields(None, None, "cgroup-base-not-delegated"))

    def _refuse_second_gecod(self) -> None:
        """Fail when something already answers on our socket (a running gecod), or when
        a user holds gecod's TCP port (``port:`` mode; the reason to prefer ``path:``)."""
        if self.address.family == "tcp" and self.address.port is not None:
            users = address.port_listeners(self.address.port) - {0}
            if users:
                raise _StartupError(
                    f"{self.address} is taken by uid {', '.join(map(str, sorted(users)))}, "
                    f"not by a gecod (gecod runs as root): in port: mode any user can bind "
                    f"gecod's port while it is down. Stop that process; for production use "
                    f"[gecod] socket = \"path:/run/geco/gecod.sock\", which no user can take")
        try:
            probe = address.connect(self.address, timeout=1.0)
        except GecoError:
            return  # nobody there (a stale Unix socket file is removed by listen())
        probe.close()
        raise _StartupError(f"another gecod is already listening on {self.address}; stop it "
                            f"first (systemctl stop gecod)")

    def _watch_job(self, key: JobKey) -> None:
        try:
            self.oom.watch(key)
        except GecoError as exc:  # the job runs on; only its OOM report would be missing
            _log.warning("job %s: cannot watch for OOM kills: %s", key, exc)

    def _relay_oom(self, master: str, key: JobKey, text: str) -> None:
        # a worker: a slave's OOM words go to the owner's file on the job's master host
        cluster.report_oom(master, key, text, self.cfg)

    def _job_namespace(self, key: JobKey) -> oom.JobNamespace:
        # a job's stderr path is the job's in its private /tmp's namespace, if it has one
        return privatetmp.namespace(self.cfg, key)

    def _check_oom_now(self, key: JobKey) -> None:
        """From a worker: read the job's OOM counter in the loop, then wait (briefly) for
        its reports under way, so that a kill just before the job's end is reported, and
        a slave's report reaches the master, before the job is gone."""
        done = threading.Event()
        reports: list[concurrent.futures.Future[object]] = []

        def check() -> None:
            try:
                self.oom.check(key)
                reports.extend(self.oom.reporting(key))
            finally:
                done.set()

        self.loop.call_soon_threadsafe(check)
        done.wait(_OOM_CHECK_WAIT)
        concurrent.futures.wait(reports, timeout=self.cfg.cluster_timeout + _OOM_CHECK_WAIT)

    def _reclaim(self) -> None:
        # a worker short of cores: the jobs whose shepherd just exited free theirs first
        if not self.shepherds.wait_idle(self.cfg.kill_timeout + _RECLAIM_SLACK):
            _log.warning("the teardowns of ended jobs are still running after %g s; the new "
                         "job is placed with the cores free now", self.cfg.kill_timeout)

    def _job_reaped(self, key: JobKey) -> None:
        # in the loop; a job re-created under the same key meanwhile keeps its watch
        self.ctx.ready.pop(key, None)
        if not self.backend.exists(key):
            self.oom.unwatch(key)
        self._report_status()

    # -- systemd ----------------------------------------------------------------

    def _report_status_soon(self) -> None:
        # after a request: at most one status line a second however many requests come
        if not self._status_due:
            self._status_due = True
            self.loop.add_timer(_STATUS_EVERY, self._report_status)

    def _report_status(self) -> None:
        self._status_due = False
        try:
            jobs = len(self.backend.job_keys())
        except GecoError as exc:
            _log.warning("cannot count the job cgroups: %s", exc)
            return
        notify(f"STATUS=serving on {self.address}: {jobs} job(s) contained, "
               f"{self.server.served} request(s) answered, {self.server.refused} refused")

    def _lane_settings(self, cfg: _config.Config) -> dict[str, Any]:
        level = _stderr_level(self.log_level, cfg)
        return {"spool_root": str(spool_root(cfg)),
                "stderr_level": log.LEVELS.get(level.lower(), log.ERROR)}

    def _report_log_drops(self) -> None:
        now = log.dropped() + (self.lane.journal_drops if self.lane is not None else 0)
        if now > self._log_drops:
            _log.warning("%d log record(s) dropped in the last %g s: journald is stopped or "
                         "too slow (gecod never waits for it)", now - self._log_drops,
                         _LOG_DROP_REPORT,
                         extra=log.job_fields(None, None, "log-records-dropped",
                                              DROPPED=now - self._log_drops))
        self._log_drops = now

    def _watchdog(self) -> None:
        # sent from the loop itself: a loop stuck in a callback stops the pings
        notify("WATCHDOG=1")

    # -- signals ----------------------------------------------------------------

    def _on_stop_signal(self, signum: int) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self.predecessor is not None:  # a stop means stop: no successor takes over
            self.loop.remove_source(self.predecessor.line)
            self.predecessor.abandon()
            self.predecessor = None
        _log.info("gecod stopping on %s; job cgroups are left as they are",
                  signal.Signals(signum).name,
                  extra=log.job_fields(None, None, "gecod-stopping",
                                       SIGNAL=signal.Signals(signum).name))
        notify("STOPPING=1")
        self._node_going_down = node_going_down()
        if self._node_going_down:
            _log.info("the node is shutting down: gecod exits without waiting for the work "
                      "in progress (its jobs end with the node)",
                      extra=log.job_fields(None, None, "gecod-stopping-with-node"))
        self.server.shutdown(on_idle=self.loop.stop)
        self.loop.add_timer(_SHUTDOWN_GRACE if self._node_going_down else _DRAIN_GRACE,
                            self.loop.stop)

    def _on_handover_signal(self, signum: int) -> None:
        if self._stopping or self.predecessor is not None:
            _log.warning("SIGUSR2: gecod is %s already; ignored",
                         "stopping" if self._stopping else "handing over")
            return
        listeners = {lane.name: lane.listener for lane in self.server.lanes
                     if lane.listener is not None}
        if self.metrics is not None:
            listeners["metrics"] = self.metrics.listener
        try:
            self.predecessor = handover.Predecessor.start(listeners)
        except GecoError as exc:
            self._handover_failed(str(exc))
            return
        _log.info("SIGUSR2: starting the installed gecod (pid %d) to hand over to; serving "
                  "on until it is ready", self.predecessor.proc.pid,
                  extra=log.job_fields(None, None, "gecod-handover-started",
                                       SUCCESSOR_PID=self.predecessor.proc.pid))
        self.loop.add_source(self.predecessor.line, selectors.EVENT_READ, self._on_successor)

    def _on_successor(self, _line: object, _events: int) -> None:
        pred = self.predecessor
        assert pred is not None
        self.loop.remove_source(pred.line)
        failure = pred.failure()
        if failure is not None:
            self.predecessor = None
            self._handover_failed(failure)
            return
        # connections arriving from now on wait in the kernel's backlog for the successor
        self._stopping = True
        _log.info("handing over to gecod pid %d: answering what was taken, then exiting",
                  pred.proc.pid, extra=log.job_fields(None, None, "gecod-handing-over",
                                                      SUCCESSOR_PID=pred.proc.pid))
        self.server.shutdown(on_idle=self.loop.stop, finish_reading=True)
        self.loop.add_timer(_DRAIN_GRACE, self.loop.stop)

    def _handover_failed(self, reason: str) -> None:
        _log.error("no handover: %s; this gecod serves on (its reason is in the journal)",
                   reason, extra=log.job_fields(None, None, "gecod-handover-failed",
                                                REASON=reason))
        self.server.handover_failed = {"at": time.time(), "reason": reason}

    def _on_reload(self, signum: int) -> None:
        try:
            new = _config.load(self.config_path)
        except GecoError as exc:
            _log.error("SIGHUP: keeping the running configuration: %s", exc)
            return
        for name in _RESTART_ONLY:
            if getattr(new, name) != getattr(self.cfg, name):
                _log.warning("SIGHUP: %s changed to %r; it takes effect when gecod restarts",
                             name, getattr(new, name))
        new = new._replace(**{n: getattr(self.cfg, n) for n in _RESTART_ONLY})
        try:
            secret = keys.load_key(new.gecod_key_file)
        except GecoError as exc:
            _log.error("SIGHUP: keeping the running key: %s", exc)
            secret = self.secret
        try:
            self.oom.policy = oom.check_policy(new.gecod_oom)
        except GecoError as exc:
            _log.error("SIGHUP: keeping OOM policy %s: %s", self.oom.policy, exc)
        self.cfg = self.ctx.config = new
        self.reaper.reconfigure(new)
        self.sampler.reconfigure(new)
        self.secret = secret
        self.server.replace_secret(secret)
        if self.cluster is not None:
            try:
                self.cluster.key = cluster.load_key(new)
            except GecoError as exc:
                _log.error("SIGHUP: keeping the running cluster key: %s", exc)
            self.cluster.reload(new)
        log.setup(_stderr_level(self.log_level, new), identifier="gecod")
        _route_traces(new)
        log.in_background()
        if self.lane is not None:
            try:
                self.lane.configure(new, secret, journal=log.journal_socket(),
                                    **self._lane_settings(new))
            except OSError as exc:
                _log.error("SIGHUP: %s", exc)
        _log.info("SIGHUP: configuration re-read from %s", self.config_path,
                  extra=log.job_fields(None, None, "gecod-reloaded"))

    def _rewatch(self) -> None:
        """Watch the shepherds of the jobs already contained (a restart loses no job end)."""
        try:
            watched = self.shepherds.rewatch(self.backend, spool_root(self.cfg))
        except GecoError as exc:  # the reaper ends those jobs instead
            _log.warning("cannot find the shepherds of the running jobs: %s", exc)
        else:
            _log.debug("watching %d running job(s) for their end", watched)

    # -- running ----------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; return the exit status."""
        log.in_background()  # before the signals are unblocked: the thread keeps them blocked
        self.loop.add_timer(_LOG_DROP_REPORT, self._report_log_drops, repeat=_LOG_DROP_REPORT)
        self.loop.add_signal(signal.SIGTERM, self._on_stop_signal)
        self.loop.add_signal(signal.SIGINT, self._on_stop_signal)
        self.loop.add_signal(signal.SIGHUP, self._on_reload)
        self.loop.add_signal(signal.SIGUSR2, self._on_handover_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED_SIGNALS)  # pending ones arrive now
        interval = _watchdog_interval()
        if interval is not None:
            self.loop.add_timer(interval, self._watchdog, repeat=interval)
        _log.info("gecod %s listening on %s (root: %s) (pid %d, %d workers)", __version__,
                  self.address, self.root_address, os.getpid(), self.cfg.gecod_workers,
                  extra=log.job_fields(None, None, "gecod-started", SOCKET=self.address,
                                       ROOT_SOCKET=self.root_address))
        self.oom.start()
        self.reaper.start()
        self.sampler.start()
        if self.metrics is not None:
            self.metrics.start()
            _log.info("gecod serves Prometheus metrics on http://%s/metrics",
                      self.metrics.where, extra=log.job_fields(None, None, "metrics-serving"))
        if self.cluster is not None:
            self.cluster.start()
            self.server.add_lane(self.cluster.lane)
        if self.lane is not None:
            self.lane.start()
        if self.successor is not None:
            self._took_over(self.successor)
        else:
            notify("READY=1")
        self._report_status()
        try:
            self.loop.run()
        finally:
            self.close()
        code = EXIT_OK
        if self.predecessor is not None:
            code = self._handed_over(self.predecessor)
        else:
            _log.info("gecod stopped", extra=log.job_fields(None, None, "gecod-stopped"))
        if self._node_going_down:
            # the interpreter's exit would join every executor thread still at its work
            log.stop_background(wait=_SHUTDOWN_GRACE)
            _exit_now(code)
        log.stop_background()
        return code

    def _took_over(self, successor: handover.Successor) -> None:
        # systemd's main process from now on, and sure of it before the predecessor exits
        if notify(f"MAINPID={os.getpid()}\nREADY=1") and not handover.systemd_barrier(notify):
            _log.warning("systemd did not confirm gecod's new main pid %d", os.getpid())
        _log.info("gecod %s took over from the gecod before it (pid %d)", __version__,
                  os.getppid(), extra=log.job_fields(None, None, "gecod-took-over"))
        successor.serving()

    def _handed_over(self, pred: handover.Predecessor) -> int:
        if pred.drained():
            _log.info("gecod handed over to pid %d", pred.proc.pid,
                      extra=log.job_fields(None, None, "gecod-handed-over",
                                           SUCCESSOR_PID=pred.proc.pid))
            return EXIT_OK
        # nothing answers on the sockets now: systemd restarts gecod (Restart=on-failure)
        _log.error("the installed gecod (pid %d) did not take over after this one stopped "
                   "answering; exiting with failure for systemd to restart gecod",
                   pred.proc.pid, extra=log.job_fields(None, None, "gecod-handover-failed",
                                                       SUCCESSOR_PID=pred.proc.pid))
        return EXIT_FAILED

    def close(self) -> None:
        """Close the listener and the loop, wait for running workers; jobs are left alone."""
        if self.metrics is not None:  # first: a scrape reads the server's counters
            self.metrics.close(finish=self.predecessor is not None)
            self.metrics = None
        if any(lane.listener is not None for lane in self.server.lanes):
            self.server.shutdown(on_idle=lambda: None)
        if self.predecessor is None:  # else the successor serves on these very files
            address.unlink_socket(self.address)
            address.unlink_socket(self.root_address)
        if self.cluster is not None:
            self.cluster.close()
        self.oom.close()
        self.shepherds.close()
        self.reaper.close()
        self.sampler.close()
        # on the way out already: a second SIGTERM (an impatient admin, kill -TERM
        # twice) must not turn a clean exit into a kill while workers finish
        self.loop.close(signals_to=signal.SIG_IGN)
        # at the node's shutdown nothing is waited for: what a worker waits on may be
        # going down too, and the jobs end with the node
        wait = not self._node_going_down
        self.pools.shutdown(wait=wait, cancel_futures=True)
        # waits for a round's teardown in progress: one cut short could leave a job frozen
        self.reaper_executor.shutdown(wait=wait, cancel_futures=True)
        # nothing publishes or withdraws jobs any more (at the node's shutdown, workers
        # may still: the lane goes with the process)
        if self.lane is not None and wait:
            self.lane.close()


def node_going_down() -> bool:
    """True when systemd is taking the whole node down (``systemctl is-system-running``
    says ``stopping``: a poweroff, reboot or halt is under way); False without systemd
    (``offline``, or no systemctl), or when it does not answer within ``_SYSTEMCTL_WAIT`` s."""
    try:
        state = subprocess.run(["systemctl", "is-system-running"], capture_output=True,
                               text=True, timeout=_SYSTEMCTL_WAIT, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return state.strip() == "stopping"


def _exit_now(code: int) -> None:
    """Exit with ``code`` at once: threads still at their work are not joined, and
    nothing is flushed (stderr, a journal stream, may be stalled; the log thread wrote
    what it could)."""
    os._exit(code)


def _group(name: str) -> int:
    """The gid of ``[gecod] privileged_group`` (0 when unset)."""
    if not name:
        return 0
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise GecoError(f"[gecod] privileged_group names a group this node does not know: "
                        f"{name!r}") from None


def _route_traces(cfg: _config.Config) -> None:
    """Copy each job's records to its trace file when it asked for one (-l geco_trace_level)."""
    logging.getLogger("geco").addHandler(trace.TraceRouter(cfg))


def _stderr_is_journal() -> bool:
    """True when systemd connected our stderr to the journal ($JOURNAL_STREAM = dev:inode)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def _stderr_level(chosen: str | None, cfg: _config.Config) -> str:
    """The stderr level: the command line's, else none when stderr is the journal already
    (every entry would arrive twice, once structured, once as a plain line), else the
    configuration's."""
    return chosen or ("quiet" if _stderr_is_journal() else cfg.log_level)


def run(args: argparse.Namespace) -> int:
    """Run gecod with parsed arguments (``geco daemon`` calls this); return the exit status."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED_SIGNALS)  # worker threads inherit it
    # a pool's thread waits for the loop's turn at the GIL at most this long (Python's
    # default 5 ms is one job start's whole budget when a flood keeps the loop busy)
    sys.setswitchinterval(_GIL_SWITCH)
    path = Path(args.config or os.environ.get("GECO_CONFIG") or _config.DEFAULT_PATH)
    log.setup(args.log_level or "error", identifier="gecod")  # until the config is read
    successor = None
    try:
        successor = handover.Successor.from_environ()
        cfg = _config.load(path)
        log.setup(_stderr_level(args.log_level, cfg), identifier="gecod")
        _route_traces(cfg)
        daemon = Daemon(cfg, path, args.log_level, successor)
    except (_StartupError, GecoError, OSError) as exc:
        # OSError: anything the kernel refused that no module translated
        reason = str(exc) if not isinstance(exc, OSError) else f"cannot start: {exc}"
        print(f"gecod: {reason}", file=sys.stderr)
        if successor is not None:  # the running gecod serves on and says why
            successor.failed(reason)
        return EXIT_FAILED
    return daemon.run()
