"""geco's configuration: one TOML file, one immutable record.

The file is ``/etc/geco/geco.toml`` (``$GECO_CONFIG`` overrides the path, for
tests and for sites that keep it elsewhere). Every key, its section and its
default are documented in ``conf/geco.toml``; this module is the single place
that knows them.

Like pam_slurm_adopt, a bad *value* never aborts: it is logged together with
the default used instead. A file that is not valid TOML is a
:class:`~geco.errors.ConfigError`, because nothing in it can be trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

from geco import configcache, log
from geco._tuple import NamedTuple
from geco.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

__all__ = ["DEFAULT_PATH", "Config", "load"]

DEFAULT_PATH = Path("/etc/geco/geco.toml")
_log = log.get("config")


class Config(NamedTuple):
    """Every setting, with its default. See ``conf/geco.toml`` for the prose.

    A NamedTuple, not a dataclass: every hook loads it on every job start, and
    importing :mod:`dataclasses` (with :mod:`inspect`) costs a hook more than its
    work. ``cfg._replace(name=value)`` makes a changed copy.
    """

    # [paths]
    state_dir: Path = Path("/var/lib/geco")
    execd_spool_dir: Path = Path("/var/spool/gridengine/execd")
    # [cgroup]
    cgroup_mount: Path = Path("/sys/fs/cgroup")
    cgroup_name: str = "GECO"
    cgroup_version: str = "auto"
    cgroup_v2_base: str = ""
    cgroup_v1_systemd_base: str = ""
    exclusive_cpus: bool = False
    pids_per_slot: int = 1024
    pids_min: int = 4096
    memory_per_slot: int = 0
    vmem_per_slot: int = 0
    memory_reserve: int = 0
    cpus_reserve: str = ""
    # [cores]
    hardware_threads: bool = False
    # [gpu]
    gpu_complex: str = "gpu"
    gpu_consumable: str = "slot"
    gpu_devices: tuple[str, ...] = ()
    gpu_names: tuple[tuple[str, int | str], ...] = ()
    # [qstat]
    qstat: str = "qstat"
    qstat_timeout: float = 30.0
    qstat_retries: int = 3
    sge_root: str = ""
    sge_cell: str = ""
    sge_qmaster_port: int = 0
    sge_execd_port: int = 0
    sge_cluster_name: str = ""
    run_without_memory_limits: bool = False
    # [log]
    log_level: str = "error"
    trace_dir: Path = Path("/var/log/geco/trace")
    trace_keep_days: int = 14
    # [epilog]
    kill_timeout: float = 30.0
    disable_queue_on_stuck: bool = True
    # [gecod]
    gecod_socket: str = "path:/run/geco/gecod.sock"
    gecod_privileged_socket: str = ""
    gecod_privileged_group: str = ""
    gecod_key_file: Path = Path("/etc/geco/quarantine.key")
    gecod_request_timeout: float = 10.0
    gecod_unreachable_policy: str = "refuse"
    gecod_exec_filter: tuple[str, ...] = ("sge_shepherd",)
    gecod_max_skew: float = 30.0
    gecod_connection_deadline: float = 5.0
    gecod_granularity: float = 60.0
    gecod_execd_uids: tuple[int, ...] = ()
    gecod_workers: int = 4
    gecod_preload_log: str = "syslog"
    gecod_oom: str = "kernel"
    gecod_reaper_interval: float = 300.0
    gecod_walltime_backstop: bool = True
    gecod_walltime_grace: float = 600.0
    # [strays]
    strays_kill: bool = True
    strays_min_uid: int = 1000
    strays_exempt_users: tuple[str, ...] = ("nobody",)
    strays_grace: float = 2.0
    strays_delay: float = 10.0
    # [ssh]
    ssh_admins: tuple[str, ...] = ()
    ssh_admin_groups: tuple[str, ...] = ()
    ssh_several_jobs: str = "newest"
    ssh_adopt_failure: str = "refuse"
    ssh_gecod_unreachable: str = "decide-here"
    ssh_callerid_budget: float = 0.2
    ssh_bypass_file: Path = Path("/etc/geco/ssh-bypass")
    # [cluster]
    cluster_address: str = "port:6446"
    cluster_bind: str = ""
    cluster_allow: tuple[str, ...] = ()
    cluster_key_file: Path = Path("/etc/geco/cluster.key")
    cluster_slaves: str = "strict"
    cluster_timeout: float = 10.0
    # [usage]
    usage_interval: float = 30.0
    usage_keep_days: int = 7
    usage_max_samples: int = 2880
    usage_readers: tuple[str, ...] = ()
    # [metrics]
    metrics_listen: str = ""
    # [tmp]
    tmp_private: bool = False
    tmp_base: str = ""
    tmp_var_tmp: bool = True
    tmp_shm_size: str = "50%"
    tmp_min_free: int = 0
    tmp_on_failure: str = "requeue"
    tmp_node_namespace: str = "/proc/1/ns/mnt"
    # [health]
    health_sick_after: int = 3
    health_on_sick: str = "disable"
    health_requeue_limit: int = 3

    @property
    def resources_dir(self) -> Path:
        """Where ``<job>.<task>`` resource files live."""
        return self.state_dir / "resources"

    @property
    def usage_dir(self) -> Path:
        """Where each job task's usage samples live (:mod:`geco.usage.samples`)."""
        return self.state_dir / "usage"


# TOML section -> the Config fields it holds.
_SECTIONS: dict[str, tuple[str, ...]] = {
    "paths": ("state_dir", "execd_spool_dir"),
    "cgroup": ("cgroup_mount", "cgroup_name", "cgroup_version", "cgroup_v2_base",
               "cgroup_v1_systemd_base", "exclusive_cpus", "pids_per_slot", "pids_min",
               "memory_per_slot", "vmem_per_slot", "memory_reserve", "cpus_reserve"),
    "cores": ("hardware_threads",),
    "gpu": ("gpu_complex", "gpu_consumable", "gpu_devices", "gpu_names"),
    "qstat": ("qstat", "qstat_timeout", "qstat_retries", "sge_root", "sge_cell",
              "sge_qmaster_port", "sge_execd_port", "sge_cluster_name",
              "run_without_memory_limits"),
    "log": ("log_level", "trace_dir", "trace_keep_days"),
    "epilog": ("kill_timeout", "disable_queue_on_stuck"),
    "strays": ("strays_kill", "strays_min_uid", "strays_exempt_users", "strays_grace",
               "strays_delay"),
    "ssh": ("ssh_admins", "ssh_admin_groups", "ssh_several_jobs", "ssh_adopt_failure",
            "ssh_gecod_unreachable", "ssh_bypass_file", "ssh_callerid_budget"),
    "cluster": ("cluster_address", "cluster_bind", "cluster_allow", "cluster_key_file",
                "cluster_slaves", "cluster_timeout"),
    "usage": ("usage_interval", "usage_keep_days", "usage_max_samples", "usage_readers"),
    "metrics": ("metrics_listen",),
    "tmp": ("tmp_private", "tmp_base", "tmp_var_tmp", "tmp_shm_size", "tmp_min_free",
            "tmp_on_failure", "tmp_node_namespace"),
    "health": ("health_sick_after", "health_on_sick", "health_requeue_limit"),
    "gecod": ("gecod_socket", "gecod_privileged_socket", "gecod_privileged_group",
              "gecod_key_file", "gecod_request_timeout",
              "gecod_unreachable_policy", "gecod_exec_filter", "gecod_max_skew",
              "gecod_connection_deadline", "gecod_granularity", "gecod_execd_uids",
              "gecod_workers", "gecod_preload_log", "gecod_oom", "gecod_reaper_interval",
              "gecod_walltime_backstop", "gecod_walltime_grace"),
}
# A key's TOML name is its field name with the section prefix dropped where that reads better.
_TOML_NAME = {"cgroup_mount": "mount", "cgroup_name": "name", "cgroup_version": "version",
              "cgroup_v2_base": "v2_base", "cgroup_v1_systemd_base": "v1_systemd_base",
              "qstat": "command", "qstat_timeout": "timeout", "qstat_retries": "retries",
              "sge_qmaster_port": "qmaster_port", "sge_execd_port": "execd_port",
              "sge_cluster_name": "cluster_name",
              "log_level": "level",
              **{f"gpu_{n}": n for n in ("complex", "consumable", "devices", "names")},
              **{f"strays_{n}": n for n in ("kill", "min_uid", "exempt_users", "grace", "delay")},
              **{f"ssh_{n}": n for n in ("admins", "admin_groups", "several_jobs",
                                         "adopt_failure", "gecod_unreachable",
                                         "bypass_file", "callerid_budget")},
              **{f"cluster_{n}": n for n in ("address", "bind", "allow", "key_file",
                                             "slaves", "timeout")},
              **{f"usage_{n}": n for n in ("interval", "keep_days", "max_samples", "readers")},
              "metrics_listen": "listen",
              **{f"tmp_{n}": n for n in ("private", "base", "var_tmp", "shm_size", "min_free",
                                         "on_failure", "node_namespace")},
              **{f"health_{n}": n for n in ("sick_after", "on_sick", "requeue_limit")},
              **{f"gecod_{n}": n for n in (
                  "socket", "privileged_socket", "privileged_group", "key_file",
                  "request_timeout", "unreachable_policy", "exec_filter",
                  "max_skew", "connection_deadline", "granularity", "execd_uids", "workers",
                  "preload_log", "oom", "reaper_interval", "walltime_backstop",
                  "walltime_grace")}}
_CHOICES = {"cgroup_version": ("auto", "1", "2"),
            "log_level": ("quiet", "error", "warn", "info", "debug"),
            "gecod_unreachable_policy": ("refuse", "allow"),
            "gecod_preload_log": ("syslog", "stderr", "none"),
            "gecod_oom": ("kernel", "kill-job"),
            "ssh_several_jobs": ("newest", "refuse"),
            "ssh_adopt_failure": ("refuse", "allow"),
            "ssh_gecod_unreachable": ("decide-here", "refuse", "allow"),
            "cluster_slaves": ("strict", "lenient"),
            "tmp_on_failure": ("requeue", "shared"),
            "health_on_sick": ("disable", "journal"),
            "gpu_consumable": ("slot", "job")}
# Whole-number settings whose smallest sensible value is above 0.
_MINIMUM = {"gecod_workers": 1, "usage_max_samples": 4}
# Byte counts given as Grid Engine memory values ("2G", "512M", 1073741824); 0 = none.
_MEMORY = ("memory_per_slot", "vmem_per_slot", "memory_reserve", "tmp_min_free")
# Path settings where "" means "the built-in choice" (not a path).
_OPTIONAL_PATHS = ("cgroup_v2_base", "cgroup_v1_systemd_base", "sge_root", "tmp_base",
                   "tmp_node_namespace")
# String settings where "" means "find it out" (geco.sge.siteenv) or "beside the public
# socket" / "none" (the privileged socket and its group).
_OPTIONAL_STRINGS = ("sge_cell", "sge_cluster_name", "gecod_privileged_socket",
                     "gecod_privileged_group", "cluster_bind", "metrics_listen")
# cpu lists in the kernel's syntax ("0-1,8"); "" = none.
_CPU_LISTS = ("cpus_reserve",)
class _Host(str):
    """A list item that names hosts: a host name, an address, or a network (10.77.0.0/16)."""

    __slots__ = ()


def _is_host(item: object) -> bool:
    import ipaddress
    import re

    if not isinstance(item, str) or not item:
        return False
    try:
        ipaddress.ip_network(item, strict=False)
    except ValueError:
        return re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", item) is not None
    return True


# List settings: the type of their items, and whether an empty list is allowed.
_LISTS: dict[str, tuple[type, bool]] = {"gecod_exec_filter": (str, False),
                                        "gecod_execd_uids": (int, True),
                                        "strays_exempt_users": (str, True),
                                        "ssh_admins": (str, True),
                                        "ssh_admin_groups": (str, True),
                                        "usage_readers": (str, True),
                                        "cluster_allow": (_Host, True),
                                        "gpu_devices": (Path, True)}


def _coerce_list(name: str, value: Any) -> tuple[Any, ...]:
    """Return a list setting as a tuple of its item type, or raise ValueError."""
    kind, empty_ok = _LISTS[name]
    if not isinstance(value, list):
        raise ValueError(f"must be a list, got {value!r}")
    if not value and not empty_ok:
        raise ValueError(f"must be a non-empty list, got {value!r}")
    for item in value:
        if kind is int and (isinstance(item, bool) or not isinstance(item, int) or item < 0):
            raise ValueError(f"must be a list of whole numbers >= 0, got {value!r}")
        if kind is str and (not isinstance(item, str) or not item or "/" in item
                            or "," in item):
            raise ValueError(f"must be a list of file names (no '/' or ','), got {value!r}")
        if kind is Path and (not isinstance(item, str) or not item.startswith("/")):
            raise ValueError(f"must be a list of absolute paths, got {value!r}")
        if kind is _Host and not _is_host(item):
            raise ValueError(f"must be a list of host names, addresses or networks "
                             f"(10.1.0.0/16), got {value!r}")
    return tuple(value)


def _coerce_gpu_names(value: Any) -> tuple[tuple[str, int | str], ...]:
    """``[gpu] names``: Grid Engine GPU ids -> a GPU's id (PCI bus order) or device file.

    A number is no name: it always means the GPU of that id, which is what the resource
    file carries once a job's ids are mapped (:func:`geco.node.gpus.map_share`). A name holds no
    space, ``,`` or ``=`` (the GPU list's separators)."""
    import re

    if not isinstance(value, dict):
        raise ValueError(f'must be a table such as {{ gpuA = 0, gpuB = "/dev/nvidia1" }}, '
                         f"got {value!r}")
    names: list[tuple[str, int | str]] = []
    for name, target in value.items():
        if not name or re.search(r"[\s,=]", name) or re.fullmatch(r"[0-9]+", name) \
                or name.startswith("count:"):
            raise ValueError(f"must name Grid Engine GPU ids that are not numbers (a number "
                             f"is always the GPU of that id) and hold no space, ',' or '=', "
                             f"got {name!r}")
        if isinstance(target, int) and not isinstance(target, bool) and target >= 0:
            names.append((name, target))
        elif isinstance(target, str) and target.startswith("/"):
            names.append((name, os.path.normpath(target)))
        else:
            raise ValueError(f"must set each name to a GPU's id (0, its index in PCI bus "
                             f"order) or its device file (\"/dev/nvidia0\"), got {name} = "
                             f"{target!r}")
    return tuple(names)


def _coerce_memory(value: Any) -> int:
    from geco.units import parse_memory

    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            return parse_memory(value) or 0 if value.strip() else 0
        except ValueError:
            pass
    raise ValueError(f'must be a memory size such as "2G" or "512M" (0 = none), got {value!r}')


def _coerce_share(value: Any) -> str:
    """``[tmp] shm_size``: a share of the job's memory limit ("50%", 1..100) or a size
    ("4G"), kept as written (:func:`geco.job.privatetmp.shm_bytes` reads it)."""
    from geco.units import parse_memory

    text = value.strip() if isinstance(value, str) else ""
    if text.endswith("%"):
        digits = text[:-1]
        if digits.isascii() and digits.isdigit() and 1 <= int(digits) <= 100:
            return text
    elif text:
        try:
            if parse_memory(text):
                return text
        except ValueError:
            pass
    raise ValueError(f'must be a share of the job\'s memory limit such as "50%" or a size '
                     f'such as "4G", got {value!r}')


def _coerce(name: str, value: Any, default: Any) -> Any:
    """Return ``value`` converted to the type of ``default``, or raise ValueError."""
    if name in _LISTS:
        return _coerce_list(name, value)
    if name == "gpu_names":
        return _coerce_gpu_names(value)
    if name in _MEMORY:
        return _coerce_memory(value)
    if name == "tmp_shm_size":
        return _coerce_share(value)
    if name in _OPTIONAL_PATHS:
        if not isinstance(value, str) or (value and not value.startswith("/")):
            raise ValueError(f'must be an absolute path or "" (the default), got {value!r}')
        return os.path.normpath(value) if value else ""
    if name in _CPU_LISTS:
        from geco.cpulist import format_cpulist, parse_cpulist  # only where one is set

        try:
            if not isinstance(value, str):
                raise TypeError(value)
            return format_cpulist(parse_cpulist(value))
        except (ValueError, TypeError):
            raise ValueError(f'must be a cpu list such as "0" or "0-1,8" ("" = none), '
                             f"got {value!r}") from None
    if name in _OPTIONAL_STRINGS:
        if not isinstance(value, str):
            raise ValueError(f'must be a string ("" = find it out), got {value!r}')
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value
    if isinstance(default, Path):
        if not isinstance(value, str) or not value.startswith("/"):
            raise ValueError(f"must be an absolute path, got {value!r}")
        return Path(value)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"must be a positive number, got {value!r}")
        return float(value)
    if isinstance(default, int):
        least = _MINIMUM.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"must be a whole number >= {least}, got {value!r}")
        return value
    value = str(value) if isinstance(value, int | float) else value
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    choices = _CHOICES.get(name)
    if choices and value.lower() not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
    return value.lower() if choices else value


def _parse(f: BinaryIO, path: Path) -> dict[str, Any]:
    import tomllib  # here: an unchanged file is read from the cache (geco.configcache)

    try:
        return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the configuration is not valid TOML: {exc}", path=path) from exc


def load(path: Path | str | None = None) -> Config:
    """Read the configuration file and return the settings.

    Parameters
    ----------
    path:
        The file; default ``$GECO_CONFIG`` or ``/etc/geco/geco.toml``.
        A missing file means all defaults.

    Raises
    ------
    ConfigError
        if the file exists but cannot be read or is not valid TOML.
    """
    path = Path(path or os.environ.get("GECO_CONFIG") or DEFAULT_PATH)
    try:
        with path.open("rb") as f:
            # the site's file only: the one every hook reads (tests' files stay uncached)
            cached = path == DEFAULT_PATH
            st = os.fstat(f.fileno())
            doc = configcache.read(path, st) if cached else None
            if doc is None:
                doc = _parse(f, path)
                if cached:
                    configcache.write(path, st, doc)
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise ConfigError.from_oserror("cannot read the configuration", exc, path=path) from exc

    defaults = Config()
    values: dict[str, Any] = {}
    for section, table in doc.items():
        names = _SECTIONS.get(section)
        if names is None or not isinstance(table, dict):
            _log.warning("config %s: unknown section [%s] ignored", path, section)
            continue
        by_toml = {_TOML_NAME.get(n, n): n for n in names}
        for key, value in table.items():
            name = by_toml.get(key)
            if name is None:
                _log.warning("config %s: unknown key %s.%s ignored", path, section, key)
                continue
            default = getattr(defaults, name)
            try:
                values[name] = _coerce(name, value, default)
            except ValueError as exc:
                _log.warning("config %s: %s.%s %s; using the default %r",
                             path, section, key, exc, default)
    return defaults._replace(**values)
