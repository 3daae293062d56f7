"""Who may ssh into this node, and which of their jobs a session joins.

The rules are pam_slurm_adopt's, in Grid Engine's terms:

* root always gets in (a lock-out guard), and so do the configured admins
  (``[ssh] admins``, ``admin_groups``); their sessions join no job;
* while ``[ssh] bypass_file`` exists everyone gets in, uncontained (an
  emergency switch, journaled on every login);
* anyone else needs a job running on this node: a job whose cgroups exist and
  whose spooled config (``active_jobs/<job>.<task>/config``, written by
  sge_execd) names them as ``job_owner``;
* the session joins the job the connection comes from (an ssh started by a
  process of one of the user's jobs, found from the connection's 4-tuple as
  Slurm's callerid does: on this node in the kernel's TCP table, from another
  host of the job by asking that host's gecod over the cluster channel; within
  ``[ssh] callerid_budget`` seconds, since the user decides how many processes
  and open files that search walks), else the user's only job, else the newest
  one (``several_jobs = "newest"``) or none (``"refuse"``).

:func:`login_verdict` is the one decision and :func:`serve_login` carries it
out: at PAM's account stage (refuse before anything of the user's runs) and
again at its session stage (move the connection's root sshd process into the
chosen job, and name the job's variables for the session). gecod serves it for
sshd's PAM module (``pam_geco.so``, one round trip); the helper
(:mod:`geco.hooks.pam`) when gecod cannot be reached. A session goes into its
job only while the job is not ending (a :class:`Placement`'s guard: gecod holds
the job's lock for the move, which its end holds from the kill to the removal),
and only when the process moved is still the one asked about (its pidfd).
"""

from __future__ import annotations

import contextlib
import functools
import grp
import ipaddress
import os
import pwd
import socket
import struct
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from geco import log, procfs
from geco._tuple import NamedTuple
from geco.cgroup import Backend
from geco.config import Config
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.node import gpus
from geco.sge import execd, resourcefile

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Protocol

    class _Logger(Protocol):
        def info(self, msg: object, *args: object,
                 extra: Mapping[str, object] | None = ...) -> None: ...

__all__ = ["Answer", "Login", "NodeJob", "OverBudget", "Placement", "Verdict", "caller_job",
           "is_admin", "login_verdict", "running_jobs", "serve_exec", "serve_login",
           "sshd_program", "under_root_sshd"]

_log = log.get("ssh.policy")

# the programs an ssh session's processes run in before they exec the user's
_SSHD = ("sshd", "sshd-session")
# how far above a session's process sshd's root process for the connection is: the
# session child's parent is the user's sshd process, whose parent is the monitor
_ANCESTORS = 4
# A refusal names at most this many of the user's jobs: the reply has room for a line.
_JOBS_NAMED = 8
# Open files of a process looked at between two looks at the clock.
_FDS_PER_CHECK = 256


def sshd_program(pid: int, proc: Path = procfs.ROOT) -> bool:
    """The kernel names the process's program sshd (or sshd-session), owned by root."""
    try:
        exe = os.readlink(proc / str(pid) / "exe").removesuffix(" (deleted)")
        owner = os.stat(proc / str(pid) / "exe").st_uid
    except OSError:
        return False
    return os.path.basename(exe) in _SSHD and owner == 0


def under_root_sshd(pid: int, proc: Path = procfs.ROOT) -> bool:
    """A root sshd process is among ``pid``'s nearest ancestors."""
    for _ in range(_ANCESTORS):
        pid = procfs.ppid(pid, proc)
        if pid <= 1:
            return False
        if procfs.real_uid(pid, proc) == 0 and sshd_program(pid, proc):
            return True
    return False


class OverBudget(Exception):
    """The search for a connection's process ran past ``[ssh] callerid_budget``."""


def _no_guard(key: JobKey) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


class Placement(NamedTuple):
    """How a session's process goes into its job.

    Attributes
    ----------
    pid: the process (sshd's root process for the connection, or a session's own).
    guard: held around the move; raises GecoError when the job may not take it (gecod:
        the job's lock, refused while its end is under way).
    alive: whether ``pid`` is still the process it was when asked (its pidfd), checked
        after the move: if not, a process that reused the pid went in.
    """

    pid: int
    guard: Callable[[JobKey], AbstractContextManager[None]] = _no_guard
    alive: Callable[[], bool] = lambda: True


class Login(NamedTuple):
    """One ssh login, as PAM names it.

    Attributes
    ----------
    user: the account logging in (``PAM_USER``).
    uid: its uid, from the password database.
    groups: the names of its groups (primary and supplementary).
    rhost: where the connection comes from (``PAM_RHOST``).
    connection: ``SSH_CONNECTION`` (``<src> <sport> <dst> <dport>``), "" if unknown.
    """

    user: str
    uid: int
    groups: frozenset[str]
    rhost: str = ""
    connection: str = ""

    @classmethod
    def of(cls, user: str, rhost: str = "", connection: str = "") -> Login:
        """Look ``user`` up in the password and group databases.

        Raises
        ------
        GecoError: the user is unknown on this node.
        """
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise GecoError("unknown user", user=user) from None
        names = set()
        for gid in os.getgrouplist(pw.pw_name, pw.pw_gid):
            try:
                names.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                continue
        return cls(pw.pw_name, pw.pw_uid, frozenset(names), rhost, connection)


class NodeJob(NamedTuple):
    """A job running on this node: its key, owner, when its cgroups were made, and
    sge_execd's spool dir for it."""

    key: JobKey
    owner: str
    started: float
    spool: Path


class Verdict(NamedTuple):
    """What to do with a login.

    Attributes
    ----------
    admit: let the user in.
    why: the rule that decided, journaled as ``REASON``: ``root``, ``admin``,
        ``bypass``, ``caller``, ``only-job``, ``newest``, ``no-job``, ``several-jobs``.
    message: one line for the user when refused ("" when admitted).
    job: the job the session joins (None: it joins none).
    """

    admit: bool
    why: str
    message: str = ""
    job: NodeJob | None = None
    callerid: str = ""  # journaled as CALLERID: "over-budget" when the search ran out


def running_jobs(cfg: Config, backend: Backend, node: str) -> list[NodeJob]:
    """The jobs running on this node with cgroups of geco's, oldest first.

    A job counts while both its cgroups and sge_execd's spool dir for it exist:
    the owner comes from the spooled config, which only root and sge_execd write.
    """
    jobs = []
    for key in backend.job_keys():
        spool = execd.find_spool_dir(cfg.execd_spool_dir, key, node)
        if spool is None:
            continue
        owner = _owner(cfg, key, spool)
        started = backend.last_changed(key)
        if owner and started is not None:
            jobs.append(NodeJob(key, owner, started, spool))
    return sorted(jobs, key=lambda j: (j.started, j.key.order()))


def _owner(cfg: Config, key: JobKey, spool: Path) -> str:
    """The job's owner: its spooled config's ``job_owner``; on a slave host of a parallel
    job, whose spool dir holds only its tasks' dirs, the resource set the master's PREPARE
    gave (gecod wrote it, as root). "" when neither says."""
    try:
        return execd.read_config(spool).get("job_owner", "")
    except GecoError:
        pass
    try:
        rs = resourcefile.read(cfg.resources_dir, key)
    except GecoError:
        return ""
    return rs.owner if rs is not None else ""


Ends = tuple[str, int, str, int]  # a TCP connection: source, its port, destination, its port


def connection_ends(connection: str) -> Ends | None:
    """``SSH_CONNECTION`` (``<src> <sport> <dst> <dport>``) as a 4-tuple, else None; an
    IPv4 peer of a dual-stack socket reads as its IPv4 address."""
    try:
        src, sport, dst, dport = connection.split()
        src, dst = (str(ipaddress.ip_address(a.removeprefix("::ffff:"))) for a in (src, dst))
        ports = int(sport), int(dport)
    except ValueError:
        return None
    if not all(0 < p < 65536 for p in ports):
        return None
    return src, ports[0], dst, ports[1]


def _from_this_node(ends: Ends) -> bool:
    return ipaddress.ip_address(ends[0]).is_loopback or ends[0] == ends[2]


# sock_diag (netlink): the kernel finds one TCP socket by its 4-tuple in its hash table;
# /proc/net/tcp walks every bucket (~5 ms here, whatever few sockets there are)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, ext, pad, states
# inet_diag_msg: family, state, timer, retrans, a 48-byte sockid, then expires, rqueue,
# wqueue, uid and inode
_INODE_AT = _HEADER.size + 4 + 48 + 16


def _sockid(ends: Ends) -> bytes:
    """inet_diag_sockid: ports and addresses in network order, no interface, no cookie."""
    src, sport, dst, dport = ends
    return (struct.pack("!HH", sport, dport) + ipaddress.ip_address(src).packed.ljust(16, b"\0")
            + ipaddress.ip_address(dst).packed.ljust(16, b"\0")
            + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))


def _client_socket(ends: Ends) -> str | None:
    """``socket:[<inode>]`` of the connection's client end on this node, else None."""
    family = socket.AF_INET if ipaddress.ip_address(ends[0]).version == 4 else socket.AF_INET6
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, _NO_COOKIE) + _sockid(ends)
    request = _HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST,
                           1, 0) + body
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except OSError as error:  # e.g. a unit's RestrictAddressFamilies without AF_NETLINK
        _no_sock_diag(str(error))
        return None
    try:
        with nl:
            nl.settimeout(1.0)
            nl.send(request)
            reply = nl.recv(4096)
    except OSError:
        return None
    # an NLMSG_ERROR (ENOENT: no such connection) is not an answer of this type
    if len(reply) < _INODE_AT + 4 or _HEADER.unpack_from(reply)[1] != _SOCK_DIAG_BY_FAMILY:
        return None
    return f"socket:[{struct.unpack_from('=I', reply, _INODE_AT)[0]}]"


@functools.cache
def _no_sock_diag(why: str) -> None:
    """Say once per process (and reason) that callerid cannot work here."""
    _log.warning("ssh: no sock_diag netlink socket (%s): a session started from inside a "
                 "job cannot be told by its connection", why)


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise OverBudget


def _holds(pid: int, target: str, proc: Path, deadline: float = float("inf")) -> bool:
    fd_dir = f"{proc}/{pid}/fd"
    try:
        fds = os.scandir(fd_dir)
    except OSError:
        return False
    with fds:
        for n, fd in enumerate(fds):
            if n % _FDS_PER_CHECK == 0:
                _check(deadline)
            try:
                if os.readlink(fd.path) == target:
                    return True
            except OSError:
                continue
    return False


def holder_job(ends: Ends, uid: int, keys: Sequence[JobKey], backend: Backend,
               proc: Path = procfs.ROOT, *, deadline: float = float("inf")) -> JobKey | None:
    """The one of ``keys`` whose process of ``uid`` on this node made connection ``ends``.

    Its client socket is found by the 4-tuple in the kernel's TCP hash table (sock_diag),
    and must be held by a process of the user's that sits in the job's cgroups (only
    those processes are looked at). How many processes and open files those are is the
    user's choice, so the search stops at ``deadline`` (``time.monotonic()``).

    Raises
    ------
    OverBudget
        when the deadline passed first.
    """
    target = _client_socket(ends) if keys else None
    if target is None:
        return None
    for key in keys:
        for pid in backend.pids(key):
            _check(deadline)
            if procfs.real_uid(pid, proc) == uid and _holds(pid, target, proc, deadline):
                return key
    return None


def _addresses(host: str) -> frozenset[str]:
    try:
        return frozenset(str(info[4][0]) for info in socket.getaddrinfo(host, None))
    except (OSError, UnicodeError):
        return frozenset()


def caller_job(connection: str, uid: int, keys: Sequence[JobKey], backend: Backend,
               cfg: Config, proc: Path = procfs.ROOT, *,
               deadline: float = float("inf")) -> JobKey | None:
    """The job of the process that made this connection, when it is one of ``keys``.

    From this node to itself: :func:`holder_job` here. From another host: each job whose
    resource set names a host with the connection's source address asks that host's
    gecod (:func:`geco.wire.cluster.caller`), which answers with :func:`holder_job` there.
    All of it by ``deadline``.

    Raises
    ------
    OverBudget
        when the deadline passed first.
    """
    ends = connection_ends(connection)
    if ends is None or not keys:
        return None
    if _from_this_node(ends):
        return holder_job(ends, uid, keys, backend, proc, deadline=deadline)
    from geco.wire import cluster

    for key in keys:
        _check(deadline)
        try:
            rs = resourcefile.read(cfg.resources_dir, key)
        except GecoError:
            continue
        for host in cluster.other_hosts(rs) if rs is not None else ():
            _check(deadline)
            if ends[0] in _addresses(host) and cluster.caller(
                    host, key, ends, uid, cfg, timeout=deadline - time.monotonic()):
                return key
    return None


def is_admin(login: Login, cfg: Config) -> bool:
    """One of the configured admins: by name, or by a group."""
    return login.user in cfg.ssh_admins or not login.groups.isdisjoint(cfg.ssh_admin_groups)


def login_verdict(login: Login, cfg: Config, backend: Backend, node: str) -> Verdict:
    """Decide whether ``login`` gets in, and which job its session joins."""
    if login.uid == 0:
        return Verdict(True, "root")
    if is_admin(login, cfg):
        return Verdict(True, "admin")
    if cfg.ssh_bypass_file.exists():
        return Verdict(True, "bypass")
    mine = [job for job in running_jobs(cfg, backend, node) if job.owner == login.user]
    if not mine:
        return Verdict(False, "no-job", f"geco: you have no job running on {node}; ssh to "
                                        "compute nodes is for your running jobs")
    budget = ""
    try:
        caller = caller_job(login.connection, login.uid, [j.key for j in mine], backend, cfg,
                            deadline=time.monotonic() + cfg.ssh_callerid_budget)
    except OverBudget:
        caller, budget = None, "over-budget"
    if caller is not None:
        return Verdict(True, "caller", job=next(j for j in mine if j.key == caller))
    if len(mine) == 1:
        return Verdict(True, "only-job", job=mine[0], callerid=budget)
    if cfg.ssh_several_jobs == "newest":
        return Verdict(True, "newest", job=mine[-1], callerid=budget)
    names = ", ".join(j.key for j in mine[:_JOBS_NAMED])
    if len(mine) > _JOBS_NAMED:
        names += f" and {len(mine) - _JOBS_NAMED} more"
    return Verdict(False, "several-jobs",
                   f"geco: you have {len(mine)} jobs running on {node} ({names}); ssh from "
                   "inside the one your session should join", callerid=budget)


class Answer(NamedTuple):
    """What one stage of a login comes to.

    Attributes
    ----------
    admit: let it go on.
    message: one line for the user ("" for none).
    job: the job the session joined (session stage), or will join (account stage).
    env: the session's variables: ``JOB_ID``, ``SGE_TASK_ID`` and the ``GECO_*`` of
        its job, as its job's own processes see them (session stage only).
    """

    admit: bool
    message: str = ""
    job: NodeJob | None = None
    env: tuple[tuple[str, str], ...] = ()


def _journal(logger: _Logger, event: str, login: Login, verdict: Verdict, text: str,
             **more: object) -> None:
    job = verdict.job
    logger.info("%s", text, extra=log.job_fields(
        job.key.job if job else None, job.key.task if job else None, event,
        SSH_USER=login.user, RHOST=login.rhost or None, REASON=verdict.why,
        CALLERID=verdict.callerid or None, **more))


def _task_variable(job: NodeJob) -> str:
    """SGE_TASK_ID as the job has it: ``undefined`` unless an array job's task."""
    try:
        env = execd.parse_key_values((job.spool / "environment").read_bytes())
    except OSError:
        return str(job.key.task)
    return env.get(b"SGE_TASK_ID", str(job.key.task).encode()).decode(errors="replace")


def _session_env(job: NodeJob, cfg: Config, backend: Backend,
                 pid: int) -> tuple[tuple[str, str], ...]:
    """The job's variables as a process of it sees them: JOB_ID, SGE_TASK_ID, GECO_* (and
    its GPUs on a GPU node)."""
    limits = backend.read_limits(job.key)
    return (("JOB_ID", str(job.key.job)), ("SGE_TASK_ID", _task_variable(job)),
            *limits.environment(len(os.sched_getaffinity(pid)), os.uname().nodename).items(),
            *gpus.job_environment(cfg, job.key).items())


def _adopt(login: Login, verdict: Verdict, cfg: Config, backend: Backend, node: str,
           placement: Placement, logger: _Logger) -> Answer:
    """Move ``placement.pid`` (sshd's root process for the connection, which forks the
    user's side afterwards, or a session's own process) into the job."""
    job = verdict.job
    assert job is not None
    pid = placement.pid
    try:
        with placement.guard(job.key):
            backend.add_pid(job.key, pid)
        if not placement.alive():
            # the pid was reused between the ask and the move: whatever went in, not the
            # session, and the session itself is gone
            raise GecoError("the session's process exited before it was moved (its pid may "
                            "now be another process's)", pid=pid)
        if not backend.contains(job.key, pid):
            raise GecoError("the session's process is still outside the job's cgroups",
                            pid=pid)
        env = _session_env(job, cfg, backend, pid)
    except (GecoError, OSError) as exc:
        allow = cfg.ssh_adopt_failure == "allow"
        _journal(logger, "ssh-not-adopted", login, verdict,
                 f"ssh session of {login.user} not moved into job {job.key}: {exc}"
                 f"{'; let in outside the job (adopt_failure = allow)' if allow else ''}",
                 PID=pid)
        if allow:
            return Answer(True)
        return Answer(False, f"geco: your session cannot be put into job {job.key} on {node}; "
                             "try again, or ask your admin")
    _journal(logger, "ssh-adopted", login, verdict,
             f"ssh session of {login.user} from {login.rhost or '?'} joined job {job.key} "
             f"({verdict.why})", PID=pid)
    return Answer(True, job=job, env=env)


def serve_login(session: bool, login: Login, cfg: Config, backend: Backend, node: str,
                placement: Placement, logger: _Logger) -> Answer:
    """Decide one stage of a login (:func:`login_verdict`), journal it, and at the
    session stage move ``placement.pid`` into the chosen job.

    Every decision is journaled (``GECO_EVENT`` ``ssh-admitted``, ``ssh-refused``,
    ``ssh-bypassed``, ``ssh-adopted``, ``ssh-not-adopted``; ``SSH_USER``, ``RHOST``,
    ``REASON``, ``JOB_ID``).
    """
    verdict = login_verdict(login, cfg, backend, node)
    if not verdict.admit:
        _journal(logger, "ssh-refused", login, verdict,
                 f"ssh login of {login.user} from {login.rhost or '?'} refused ({verdict.why})")
        return Answer(False, verdict.message)
    if session and verdict.job is not None:
        return _adopt(login, verdict, cfg, backend, node, placement, logger)
    if not session:
        event = "ssh-bypassed" if verdict.why == "bypass" else "ssh-admitted"
        where = f", to job {verdict.job.key}" if verdict.job else ""
        _journal(logger, event, login, verdict,
                 f"ssh login of {login.user} from {login.rhost or '?'} to {node} admitted "
                 f"({verdict.why}{where})")
    return Answer(True, job=verdict.job)


def serve_exec(login: Login, wanted: JobKey | None, cfg: Config, backend: Backend, node: str,
               placement: Placement, logger: _Logger) -> Answer:
    """An ssh session's own process (``placement.pid``, running as the user) is about to run
    the user's shell, command, rc or xauth: put it into its job and name the job's variables.

    The job is ``wanted`` (the session's ``JOB_ID``/``SGE_TASK_ID``, sent by the client)
    when it is the user's and runs here, else refused; without one, the job the process is
    in already (sshd's PAM module adopted the connection), else the login's rules
    (:func:`login_verdict`: a node whose PAM stack lacks geco's lines).
    """
    pid = placement.pid
    mine = [job for job in running_jobs(cfg, backend, node) if job.owner == login.user]
    if wanted is not None:
        job = next((j for j in mine if j.key == wanted), None)
        if job is None:
            verdict = Verdict(False, "job-id", f"geco: job {wanted} is not a job of yours "
                                               f"running on {node}")
            _journal(logger, "ssh-refused", login, verdict,
                     f"ssh session of {login.user} from {login.rhost or '?'} refused: "
                     f"JOB_ID names {wanted}, not a job of theirs here", PID=pid)
            return Answer(False, verdict.message)
        verdict = Verdict(True, "job-id", job=job)
    else:
        inside = next((j for j in mine if backend.contains(j.key, pid)), None)
        if inside is not None:  # adopted at login: nothing new to journal
            return Answer(True, job=inside, env=_session_env(inside, cfg, backend, pid))
        verdict = login_verdict(login, cfg, backend, node)
        if not verdict.admit:
            _journal(logger, "ssh-refused", login, verdict,
                     f"ssh session of {login.user} from {login.rhost or '?'} refused "
                     f"({verdict.why}; sshd's PAM stack let it in)", PID=pid)
            return Answer(False, verdict.message)
        if verdict.job is None:  # root, admins, bypass: outside every job
            return Answer(True)
    assert verdict.job is not None
    if backend.contains(verdict.job.key, pid):
        return Answer(True, job=verdict.job, env=_session_env(verdict.job, cfg, backend, pid))
    return _adopt(login, verdict, cfg, backend, node, placement, logger)
