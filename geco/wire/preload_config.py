"""Render the preload's ``/etc/geco/preload.conf`` from geco's one configuration.

The exec() preload runs inside sshd and sge_execd, in C, where parsing TOML is
out of the question; it reads a few ``key=value`` lines in its constructor
instead. Those lines are generated from ``/etc/geco/geco.toml`` by
``geco preload-config``, so there is one source of truth::

    socket=path:/run/geco/gecod-root.sock
    key_file=/etc/geco/quarantine.key
    timeout_ms=10000
    max_skew_ms=30000
    policy=refuse
    exec_filter=sge_shepherd
    session_socket=path:/run/geco/gecod.sock
    session_policy=in-job
    job_cgroups=/GECO
    session_admin_uids=
    session_admin_gids=
    session_bypass=/etc/geco/ssh-bypass
    job_mntns=/var/lib/geco/mntns

Every value is validated here against what the C parser (``libgeco/geco_config.c``)
accepts, so a config that renders is one the preload reads: values on one line,
without surrounding blanks or a `` #`` (which starts a comment there),
milliseconds in 1..3600000, at most 16 exec_filter names, at most 4 job_cgroups
paths of 255 bytes, at most 64 admin uids and 64 admin gids, and 4095 bytes in all.
"""

from __future__ import annotations

import grp
import pwd
import re
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

from geco import atomicfile, jobfiles
from geco.config import Config
from geco.errors import ConfigError
from geco.wire import address

__all__ = ["DEFAULT_PATH", "render", "write"]

DEFAULT_PATH = Path("/etc/geco/preload.conf")
# Not secret (it names the key file, it does not hold the key); sshd and
# sge_execd read it as root, tools may show it to anyone.
_FILE_MODE = 0o644
# a program's basename as exec() sees it; excludes the separators of this format
_BASENAME = re.compile(r"[A-Za-z0-9._+-]+")
_POLICIES = ("refuse", "allow")
# the sshd preload's session_policy for each [ssh] gecod_unreachable: what its exec does when
# gecod cannot place a session's process (preload/session_policy.c, unplaced_may_run)
_SESSION_POLICIES = {"decide-here": "in-job", "refuse": "refuse", "allow": "allow"}
_MAX_MS = 3_600_000
_MAX_FILTERS = 16
# the C parser's limits (libgeco/geco_config.h): a job_cgroups path (at most 4 of them: we
# render 2 at most), admin ids, the file's size
_JOB_CGROUP_MAX = 255
_MAX_ADMINS = 64
_MAX_BYTES = 4095
# what the C parser would cut off or split: line ends, NUL, a blank before '#'
_UNSAFE = re.compile(r"[\n\r\0]|\s#|^\s|\s$")


def _value(setting: str, text: str, section: str = "gecod") -> str:
    if not text or _UNSAFE.search(text):
        raise ConfigError(f"{section}.{setting} must be one line without surrounding blanks "
                          f"or ' #', got {text!r}")
    return text


def _job_cgroups(cfg: Config) -> str:
    """Where geco's ``<job>.<task>`` cgroups are, as ``/proc/self/cgroup`` shows them: v1
    ``/<name>`` (in every controller's hierarchy), v2 ``[cgroup] v2_base`` made relative to
    ``mount`` (``/<name>`` when unset); both for ``version = "auto"``."""
    name = cfg.cgroup_name
    if (not name or "/" in name or "," in name or name in (".", "..")
            or len(name.encode()) >= _JOB_CGROUP_MAX):
        raise ConfigError(f"cgroup.name must be one directory name (no '/' or ',') of at "
                          f"most {_JOB_CGROUP_MAX - 1} bytes, got {name!r}")
    v1 = v2 = "/" + _value("name", name, "cgroup")
    if cfg.cgroup_v2_base and cfg.cgroup_version != "1":
        try:
            below = PurePosixPath(cfg.cgroup_v2_base).relative_to(cfg.cgroup_mount)
        except ValueError:
            raise ConfigError(f"cgroup.v2_base must lie below cgroup.mount "
                              f"({cfg.cgroup_mount}), got {cfg.cgroup_v2_base!r}") from None
        v2 = "/" + below.as_posix() if below.parts else "/"
        if "," in v2 or len(v2.encode()) > _JOB_CGROUP_MAX:
            raise ConfigError(f"cgroup.v2_base must be at most {_JOB_CGROUP_MAX} bytes below "
                              f"cgroup.mount, without ',', got {cfg.cgroup_v2_base!r}")
        _value("v2_base", v2, "cgroup")
    paths = {"1": [v1], "2": [v2]}.get(cfg.cgroup_version, [v1, v2])
    return ",".join(dict.fromkeys(paths))


def _admin_ids(setting: str, names: Iterable[str], lookup: Callable[[str], int],
               unknown: list[str]) -> str:
    """The ids of ``names`` (an [ssh] list), in order, each once; a name this node does not
    know is added to ``unknown`` and left out (it cannot log in here anyway)."""
    ids: dict[int, None] = {}
    for name in names:
        try:
            ids[lookup(name)] = None
        except KeyError:
            unknown.append(name)
    if len(ids) > _MAX_ADMINS:
        raise ConfigError(f"ssh.{setting} must name at most {_MAX_ADMINS} accounts (the "
                          f"preload's limit), got {len(ids)}")
    return ",".join(map(str, ids))


def _ms(setting: str, seconds: float) -> int:
    ms = round(seconds * 1000)
    if not 1 <= ms <= _MAX_MS:
        raise ConfigError(f"gecod.{setting} must be 0.001 to 3600 seconds, got {seconds!r}")
    return ms


def _exec_filter(names: Iterable[str]) -> str:
    names = list(names)
    if not 1 <= len(names) <= _MAX_FILTERS:
        raise ConfigError(f"gecod.exec_filter must name 1 to {_MAX_FILTERS} programs, "
                          f"got {len(names)}")
    for name in names:
        if not _BASENAME.fullmatch(name):
            raise ConfigError(f"gecod.exec_filter must hold program basenames (letters, "
                              f"digits, . _ + -), got {name!r}")
    return ",".join(names)


def render(cfg: Config, *, source: Path | str | None = None) -> str:
    """Return the preload.conf text for ``cfg``.

    Parameters
    ----------
    cfg:
        The configuration (its ``gecod_*`` settings).
    source:
        The geco.toml it came from, named in the header comment.

    Returns
    -------
    ``key=value`` lines: ``socket`` (gecod's privileged socket, in canonical
    ``path:`` form: :func:`geco.wire.address.privileged`),
    ``key_file``, ``timeout_ms`` (request_timeout), ``max_skew_ms`` (the ack's
    clock check), ``policy``, ``exec_filter`` (comma-separated), and for the
    preload in sshd ``session_socket`` (everyone's socket: a session's process asks
    as the user), ``session_policy`` (what a session's exec does when gecod cannot
    place it, per ``[ssh] gecod_unreachable``: ``in-job`` for ``decide-here``, else
    ``refuse`` or ``allow``), ``job_cgroups`` (where geco's job cgroups are, as
    ``/proc/self/cgroup`` shows them), ``session_admin_uids`` and
    ``session_admin_gids`` (``[ssh] admins`` and ``admin_groups``, resolved here
    through the password and group databases) and ``session_bypass`` (``[ssh]
    bypass_file``), ``job_mntns`` (where a job's mount namespace is pinned, with
    ``[tmp] private``), after one ``#`` comment line; a last ``#`` line names the admins
    and groups this node does not know, when there are.

    Raises
    ------
    ConfigError
        naming the setting whose value the preload could not use.
    """
    # the privileged socket, where no user's connections compete with the job starts;
    # canonical form: the preload must not resolve a service name itself
    # (getservbyname loads NSS modules inside sshd/execd)
    public = address.parse(cfg.gecod_socket)
    sock = _value("socket", str(address.privileged(cfg.gecod_privileged_socket, public)))
    key_file = _value("key_file", str(cfg.gecod_key_file))
    if not key_file.startswith("/"):
        raise ConfigError(f"gecod.key_file must be an absolute path, got {key_file!r}")
    timeout_ms = _ms("request_timeout", cfg.gecod_request_timeout)
    skew_ms = _ms("max_skew", cfg.gecod_max_skew)
    policy = cfg.gecod_unreachable_policy
    if policy not in _POLICIES:
        raise ConfigError(f"gecod.unreachable_policy must be one of {', '.join(_POLICIES)}, "
                          f"got {policy!r}")
    session_sock = _value("session_socket", str(public))
    session_policy = _SESSION_POLICIES.get(cfg.ssh_gecod_unreachable)
    if session_policy is None:
        raise ConfigError(f"ssh.gecod_unreachable must be one of "
                          f"{', '.join(_SESSION_POLICIES)}, got {cfg.ssh_gecod_unreachable!r}")
    unknown: list[str] = []
    admin_uids = _admin_ids("admins", cfg.ssh_admins, lambda n: pwd.getpwnam(n).pw_uid,
                            unknown)
    admin_gids = _admin_ids("admin_groups", cfg.ssh_admin_groups,
                            lambda n: grp.getgrnam(n).gr_gid, unknown)
    bypass = _value("bypass_file", str(cfg.ssh_bypass_file), "ssh")
    origin = f" from {source}" if source is not None else ""
    text = (f"# written by `geco preload-config`{origin}; edit geco.toml and re-run it\n"
            f"socket={sock}\n"
            f"key_file={key_file}\n"
            f"log={cfg.gecod_preload_log}\n"
            f"timeout_ms={timeout_ms}\n"
            f"max_skew_ms={skew_ms}\n"
            f"policy={policy}\n"
            f"exec_filter={_exec_filter(cfg.gecod_exec_filter)}\n"
            f"session_socket={session_sock}\n"
            f"session_policy={session_policy}\n"
            f"job_cgroups={_job_cgroups(cfg)}\n"
            f"session_admin_uids={admin_uids}\n"
            f"session_admin_gids={admin_gids}\n"
            f"session_bypass={bypass}\n")
    # where the preload finds a job's namespace to enter: always, as gecod pins one only
    # with [tmp] private, which then needs no sge_execd restart to take effect
    text += f"job_mntns={_value('private', str(jobfiles.pins_dir(cfg.state_dir)), 'tmp')}\n"
    if unknown:
        text += (f"# not on this node, left out of session_admin_*: {', '.join(unknown)} "
                 f"(re-run geco preload-config once they are)\n")
    size = len(text.encode())
    if size > _MAX_BYTES:
        raise ConfigError(f"the preload config would be {size} bytes; the preload reads at "
                          f"most {_MAX_BYTES} (fewer [ssh] admins or shorter paths)")
    return text


def write(cfg: Config, path: Path | str = DEFAULT_PATH, *,
          source: Path | str | None = None) -> Path:
    """Render and atomically write the preload config (mode 0644); return the path.

    Raises
    ------
    ConfigError
        as :func:`render` (nothing is written).
    GecoError
        when the file cannot be written.
    """
    path = Path(path)
    text = render(cfg, source=source)
    atomicfile.write_atomic(path, text.encode(), mode=_FILE_MODE, make_dir=True,
                           what="preload config")
    return path
