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
    session_policy=allow

Every value is validated here against what the C parser (``preload/geco_preload.c``)
accepts, so a config that renders is one the preload reads: values on one line,
without surrounding blanks or a `` #`` (which starts a comment there),
milliseconds in 1..3600000, at most 16 exec_filter names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from geco import address, atomicfile
from geco.config import Config
from geco.errors import ConfigError

__all__ = ["DEFAULT_PATH", "render", "write"]

DEFAULT_PATH = Path("/etc/geco/preload.conf")
# Not secret (it names the key file, it does not hold the key); sshd and
# sge_execd read it as root, tools may show it to anyone.
_FILE_MODE = 0o644
# a program's basename as exec() sees it; excludes the separators of this format
_BASENAME = re.compile(r"[A-Za-z0-9._+-]+")
_POLICIES = ("refuse", "allow")
_MAX_MS = 3_600_000
_MAX_FILTERS = 16
# what the C parser would cut off or split: line ends, NUL, a blank before '#'
_UNSAFE = re.compile(r"[\n\r\0]|\s#|^\s|\s$")


def _value(setting: str, text: str) -> str:
    if not text or _UNSAFE.search(text):
        raise ConfigError(f"gecod.{setting} must be one line without surrounding blanks or "
                          f"' #', got {text!r}")
    return text


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
    ``path:`` form: :func:`geco.address.privileged`),
    ``key_file``, ``timeout_ms`` (request_timeout), ``max_skew_ms`` (the ack's
    clock check), ``policy``, ``exec_filter`` (comma-separated), and for the
    preload in sshd ``session_socket`` (everyone's socket: a session's process asks
    as the user) and ``session_policy`` (``refuse`` when ``[ssh] gecod_unreachable``
    says so, else ``allow``: PAM's helper has decided), after one ``#`` comment line.

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
    session_policy = "refuse" if cfg.ssh_gecod_unreachable == "refuse" else "allow"
    origin = f" from {source}" if source is not None else ""
    return (f"# written by `geco preload-config`{origin}; edit geco.toml and re-run it\n"
            f"socket={sock}\n"
            f"key_file={key_file}\n"
            f"log={cfg.gecod_preload_log}\n"
            f"timeout_ms={timeout_ms}\n"
            f"max_skew_ms={skew_ms}\n"
            f"policy={policy}\n"
            f"exec_filter={_exec_filter(cfg.gecod_exec_filter)}\n"
            f"session_socket={session_sock}\n"
            f"session_policy={session_policy}\n")


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
