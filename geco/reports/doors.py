"""The doors out of a job on this node, as ``geco check`` names them.

A job's processes are born in its cgroups and die with them, but a job can ask a root
daemon to start a process for its owner: ``at``/``batch`` (atd), ``crontab`` (cron),
``systemd-run --user`` (linger), an ssh login; and systemd may move a job's processes on a
daemon-reload. :func:`doors` says which of these are open here, and whether the stray
killing (:mod:`geco.job.strays`) closes them at the owner's last job's end.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from geco import procfs
from geco._tuple import NamedTuple
from geco.cgroup import SYSTEMD_RUN
from geco.config import Config
from geco.job.strays import is_exempt
from geco.resourceset import short_hostname
from geco.ssh.pamstack import sshd_account_gate, sshd_gate

__all__ = ["Door", "doors", "execution_host"]


class Door(NamedTuple):
    """One way out of a job on this node, and whether it is open.

    Attributes
    ----------
    name: ``atd``, ``cron``, ``linger``, ``sshd``, ``systemd`` or ``strays`` (the stray
        killing itself).
    open: True when a job's owner can use it to leave processes behind.
    text: one sentence for the admin.
    """

    name: str
    open: bool
    text: str


# The daemons that start a process for a user on request, and the file that limits who may ask.
_DAEMONS = {"atd": (("atd",), "at", "at.allow"),
            "cron": (("cron", "crond"), "crontab", "cron.allow")}


def _daemon_pids(names: tuple[str, ...], proc: Path) -> list[int]:
    """The pids of root processes whose command is one of ``names``."""
    found = []
    for entry in os.listdir(proc):
        if entry.isdigit() and procfs.comm(int(entry), proc) in names \
                and procfs.real_uid(int(entry), proc) == 0:
            found.append(int(entry))
    return sorted(found)


def execution_host(cfg: Config, proc: Path = procfs.ROOT) -> str:
    """Why this host counts as an execution host ("" when it does not): sge_execd runs
    here, or its spool directory for this host exists (it stays while execd is down)."""
    for entry in os.listdir(proc):
        if entry.isdigit() and procfs.comm(int(entry), proc) == "sge_execd":
            return f"sge_execd runs (pid {entry})"
    spool = cfg.execd_spool_dir / short_hostname()
    return f"{spool} exists" if spool.is_dir() else ""


def _sshd_door(cfg: Config, proc: Path, etc: Path) -> Door:
    """sshd's PAM stack (:func:`sshd_gate`) on an execution host; on a host that runs no
    sge_execd (a login node: no job can run there), geco's gate would refuse every user
    who is no admin, so there the door is open when the gate is on."""
    is_open, text = sshd_gate(etc)
    if execution_host(cfg, proc):
        return Door("sshd", is_open, text)
    where = f"this host runs no sge_execd (and has no {cfg.execd_spool_dir / short_hostname()})"
    if sshd_account_gate(etc):
        return Door("sshd", True, f"sshd: pam_geco.so gates logins, but {where}: no job can run "
                                  "here, so it refuses every user but root and the admins; "
                                  "take geco's PAM lines out on login nodes")
    return Door("sshd", False, f"sshd: geco's gate is off, as it should be where {where}")


def _exempt_name(cfg: Config, name: str) -> bool:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return False
    return is_exempt(cfg, entry.pw_uid, entry.pw_name)


def _allow_list(path: Path) -> list[str] | None:
    """The names in an ``at.allow``/``cron.allow``, None when there is no such file."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError:
        return None  # unreadable: as if anyone may
    return [w for line in text.splitlines() for w in line.split()[:1] if not w.startswith("#")]


def doors(cfg: Config, *, proc: Path = procfs.ROOT, etc: Path = Path("/etc"),
          linger: Path = Path("/var/lib/systemd/linger"),
          systemd: Path = SYSTEMD_RUN) -> list[Door]:
    """The doors out of a job on this node: atd, cron, systemd linger, sshd's PAM stack
    (:func:`geco.ssh.pamstack.sshd_gate`), systemd's own cgroup moves, and the stray killing.

    A daemon is a root process of that command name; its door is closed when its
    allow file (``/etc/at.allow``, ``/etc/cron.allow``) names only exempt users. Linger
    is a file per user in ``linger``; exempt users' do not count.
    """
    found = []
    for name, (comms, tool, allow_name) in _DAEMONS.items():
        allow_file = etc / allow_name
        pids = _daemon_pids(comms, proc)
        if not pids:
            found.append(Door(name, False, f"{name}: not running"))
            continue
        running = f"{name} runs (pid {' '.join(map(str, pids))})"
        allowed = _allow_list(allow_file)
        if allowed is not None and all(_exempt_name(cfg, n) for n in allowed):
            found.append(Door(name, False, f"{running}, but {allow_file} admits only exempt "
                                           f"users ({' '.join(allowed) or 'nobody'})"))
            continue
        found.append(Door(name, True, f"{running}: a job can start processes outside its "
                                      f"cgroups with {tool}, also after it ended (stop {name}, "
                                      f"or list only admins in {allow_file})"))
    try:
        users = sorted(e.name for e in os.scandir(linger) if not e.name.startswith("."))
    except OSError:
        users = []
    users = [u for u in users if not _exempt_name(cfg, u)]
    if users:
        found.append(Door("linger", True, f"systemd linger is on for {' '.join(users)}: their "
                                          f"user manager runs processes (systemd-run --user) "
                                          f"outside every job (loginctl disable-linger USER)"))
    else:
        found.append(Door("linger", False, "systemd linger: no user but exempt ones has it"))
    found.append(_sshd_door(cfg, proc, etc))
    found.append(_systemd_door(cfg, systemd))
    if cfg.strays_kill:
        found.append(Door("strays", False, "stray killing: on (a user's processes outside every "
                                           "job die when their last job on this node ends; "
                                           f"exempt: root, uid < {cfg.strays_min_uid}"
                                           + "".join(f", {u}" for u in cfg.strays_exempt_users)
                                           + ")"))
    else:
        found.append(Door("strays", True, "stray killing: off ([strays] kill = false): what a "
                                          "job leaves through these doors outlives it"))
    return found


def _systemd_door(cfg: Config, run: Path) -> Door:
    """Whether systemd, re-realizing a unit (a daemon-reload can), may move job processes
    out of their cgroups: not when jobs live in a subtree it delegates (v2: ``v2_base``;
    v1: their processes also in ``v1_systemd_base`` in systemd's own hierarchies)."""
    if not run.is_dir():
        return Door("systemd", False, "systemd: not this node's init system")
    if (cfg.cgroup_mount / "cgroup.controllers").exists():
        key, value, fix = "v2_base", cfg.cgroup_v2_base, \
            "/sys/fs/cgroup/system.slice/geco-jobs.service/jobs"
        harm = "undo a job cgroup's controllers and limits"
    else:
        key, value, fix = "v1_systemd_base", cfg.cgroup_v1_systemd_base, \
            "/system.slice/geco-jobs.service/jobs"
        harm = "move a job's processes out of its memory, pids and cpuacct cgroups"
    if value:
        return Door("systemd", False, f"systemd: jobs are in {value} ([cgroup] {key}), a "
                                      "subtree it leaves alone when its unit is delegated")
    return Door("systemd", True, f"systemd: [cgroup] {key} is not set, so on a daemon-reload "
                                 f"systemd can {harm} (set {key} = \"{fix}\" with "
                                 "geco-jobs.service installed; scripts/install.sh does)")
