"""gecod's socket address: the seed's ``service:`` / ``port:`` / ``path:`` strings.

Exactly the forms of the original GECOQuarantine API
(``seeds/geco-core-library.txt``):

===================  ==========================================
``service:<name>``   TCP on 127.0.0.1, port from /etc/services
``service:<n>``      TCP on 127.0.0.1, port n
``port:<n>``         TCP on 127.0.0.1, port n
``path:<abs path>``  Unix stream socket
``<n>``              (inferred) TCP on 127.0.0.1, port n
``/<path>``          (inferred) Unix stream socket
===================  ==========================================

so ``service:http-alt``, ``service:8080``, ``port:8080`` and ``8080`` are the
same address, and so are ``path:/run/x.s`` and ``/run/x.s``. TCP is always
loopback: gecod never listens on a network interface.

Over TCP the MAC is the only gate (any local user can connect); over a Unix
socket the kernel also names the peer (SO_PEERCRED), which gecod trusts over
the message. Prefer ``path:``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
from dataclasses import dataclass
from typing import Literal

from geco.errors import ConfigError, GecoError

__all__ = ["LOOPBACK", "PUBLIC_MODE", "ROOT_MODE", "Address", "connect", "listen", "parse",
           "port_listeners", "privileged", "unlink_socket"]

LOOPBACK = "127.0.0.1"
# sun_path is 108 bytes including the terminating NUL
_MAX_UNIX_PATH = 107
_DIGITS = re.compile(r"[0-9]+")
_FORMS = ("service:<name|port>, port:<n>, path:</absolute/path>, <n> (a loopback TCP port) "
          "or </absolute/path> (a Unix socket)")
# The public socket: everyone may connect (geco status, the starter's fallback);
# the MAC and SO_PEERCRED are the gate there, not the file mode.
PUBLIC_MODE = 0o666
# The privileged socket: root (and a configured group) only; the kernel refuses
# everyone else's connect, so no user can queue work in front of root's requests.
ROOT_MODE = 0o600
# Where the privileged socket goes when gecod's public one is a TCP port.
_RUN_DIR = "/run/geco"


@dataclass(frozen=True, slots=True)
class Address:
    """Where gecod listens: a Unix socket ``path`` or a loopback TCP ``port``."""

    family: Literal["unix", "tcp"]
    path: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        """The canonical text (``path:/x`` or ``port:n``), which :func:`parse` reads back."""
        return f"path:{self.path}" if self.family == "unix" else f"port:{self.port}"


def _error(text: str, why: str) -> ConfigError:
    return ConfigError(f"socket address {text!r} {why}; accepted forms: {_FORMS}")


def _port(text: str, value: str) -> int:
    if not _DIGITS.fullmatch(value):
        raise _error(text, f"must give a port number, got {value!r}")
    port = int(value)
    if not 1 <= port <= 65535:
        raise _error(text, f"must give a port 1..65535, got {port}")
    return port


def _unix(text: str, path: str) -> Address:
    if not path.startswith("/"):
        raise _error(text, f"must give an absolute path, got {path!r}")
    if "\0" in path:
        raise _error(text, "must not contain a NUL byte")
    size = len(os.fsencode(path))
    if size > _MAX_UNIX_PATH:
        raise _error(text, f"must be a path of at most {_MAX_UNIX_PATH} bytes "
                           f"(the kernel's limit), got {size}")
    return Address("unix", path=path)


def parse(text: str) -> Address:
    """Parse a socket address in one of the seed's forms.

    Parameters
    ----------
    text:
        ``service:<name|port>``, ``port:<n>``, ``path:<abs path>``, ``<n>`` or
        ``/<path>``; no surrounding spaces.

    Returns
    -------
    The address (TCP ports are always on 127.0.0.1).

    Raises
    ------
    ConfigError
        (a ValueError) naming the text, what is wrong and the accepted forms;
        also for a service name /etc/services does not know.
    """
    scheme, colon, rest = text.partition(":")
    if colon and scheme == "path":
        return _unix(text, rest)
    if colon and scheme == "port":
        return Address("tcp", port=_port(text, rest))
    if colon and scheme == "service":
        if _DIGITS.fullmatch(rest):
            return Address("tcp", port=_port(text, rest))
        if not rest:
            raise _error(text, "must name a service")
        try:
            return Address("tcp", port=socket.getservbyname(rest, "tcp"))
        except OSError:
            raise _error(text, f"names a service that /etc/services does not list for tcp: "
                               f"{rest!r}") from None
    if text.startswith("/"):
        return _unix(text, text)
    if _DIGITS.fullmatch(text):
        return Address("tcp", port=_port(text, text))
    raise _error(text, "is not understood")


def privileged(text: str, public: Address) -> Address:
    """The privileged socket's address: ``text`` if given, else derived from ``public``.

    Always a Unix socket (only the file mode keeps other users out; any user can
    connect to a loopback port). The derived path sits beside the public socket:
    ``/run/geco/gecod.sock`` -> ``/run/geco/gecod-root.sock``; for a TCP public
    socket, ``/run/geco/gecod-<port>-root.sock``.

    Raises
    ------
    ConfigError
        when ``text`` is not a ``path:`` address (or an absolute path).
    """
    if text:
        addr = parse(text)
        if addr.family != "unix":
            raise _error(text, "must be a Unix socket (path:<absolute path>): the privileged "
                               "socket is guarded by its file mode, which a TCP port has not")
        return addr
    if public.family == "unix":
        assert public.path is not None
        stem, dot, suffix = os.path.basename(public.path).rpartition(".")
        name = f"{stem}-root.{suffix}" if dot and stem else f"{suffix}-root"
        return _unix(f"path:{public.path}", os.path.join(os.path.dirname(public.path), name))
    return _unix(f"port:{public.port}", f"{_RUN_DIR}/gecod-{public.port}-root.sock")


def _new_socket(addr: Address) -> socket.socket:
    family = socket.AF_UNIX if addr.family == "unix" else socket.AF_INET
    return socket.socket(family, socket.SOCK_STREAM)


def _sockaddr(addr: Address) -> str | tuple[str, int]:
    if addr.family == "unix":
        assert addr.path is not None
        return addr.path
    assert addr.port is not None
    return (LOOPBACK, addr.port)


def connect(addr: Address, timeout: float) -> socket.socket:
    """Connect to gecod.

    Parameters
    ----------
    addr:
        The address (:func:`parse`).
    timeout:
        Seconds for the connect; also left set on the returned socket.

    Returns
    -------
    A connected, blocking stream socket with ``timeout`` set.

    Raises
    ------
    GecoError
        when nobody listens there (errno ``ENOENT``/``ECONNREFUSED``) or the
        connect fails otherwise; names the address.
    """
    sock = _new_socket(addr)
    try:
        sock.settimeout(timeout)
        sock.connect(_sockaddr(addr))
    except OSError as exc:
        sock.close()
        raise GecoError.from_oserror("cannot connect to gecod", exc, address=addr) from exc
    return sock


def _remove_stale(path: str) -> None:
    """Unlink a socket file nobody listens on; refuse anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise GecoError("the socket path exists and is not a socket; refusing to remove it",
                        path=path)
    # a live gecod answers the connect: never pull the socket from under it
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError as exc:
        if exc.errno != errno.ECONNREFUSED:
            raise GecoError.from_oserror("cannot probe the old socket", exc, path=path) from exc
    else:
        raise GecoError("another process is listening on the socket (a second gecod?)",
                        path=path)
    finally:
        probe.close()
    os.unlink(path)


def listen(addr: Address, *, backlog: int = 128, mode: int = PUBLIC_MODE,
           group: int = 0) -> socket.socket:
    """Create one of gecod's listening sockets.

    Unix: the parent directory is created (0755) when missing, a stale socket
    file left by a crashed gecod is removed (only if it is a socket nobody
    listens on), and the new socket gets ``mode`` and ``group``. It is bound
    under a umask of 077 and opened up afterwards, so a privileged socket is
    never reachable by others, not even for a moment. TCP: bound to 127.0.0.1
    only, with SO_REUSEADDR so a restart does not wait for TIME_WAIT.

    Parameters
    ----------
    addr:
        The address (:func:`parse`).
    backlog:
        The kernel's queue of connections not yet accepted.
    mode, group:
        The Unix socket file's mode and group (:data:`PUBLIC_MODE`, :data:`ROOT_MODE`).

    Returns
    -------
    A listening, blocking, close-on-exec socket.

    Raises
    ------
    GecoError
        when the socket cannot be created, bound or listened on (the address in
        use, a path that is not a socket, a live gecod on it); names the address.
    """
    sock = _new_socket(addr)
    try:
        if addr.family == "unix":
            assert addr.path is not None
            os.makedirs(os.path.dirname(addr.path), mode=0o755, exist_ok=True)
            _remove_stale(addr.path)
            umask = os.umask(0o077)
            try:
                sock.bind(addr.path)
            finally:
                os.umask(umask)
            if os.stat(addr.path).st_gid != group:
                os.chown(addr.path, -1, group)
            os.chmod(addr.path, mode)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(_sockaddr(addr))
        sock.listen(backlog)
    except GecoError:
        sock.close()
        raise
    except OSError as exc:
        sock.close()
        raise GecoError.from_oserror("cannot listen", exc, address=addr) from exc
    return sock


def port_listeners(port: int) -> set[int]:
    """The uids of the sockets listening on TCP ``port`` (any local address, IPv4 or 6).

    In ``port:`` mode any user can take gecod's port while gecod is down; gecod
    asks this before it starts, to say so rather than mistake them for a gecod.
    """
    uids: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st ... uid: state 0A is LISTEN
            if len(fields) > 7 and fields[3] == "0A" \
                    and int(fields[1].rsplit(":", 1)[1], 16) == port:
                uids.add(int(fields[7]))
    return uids


def unlink_socket(addr: Address) -> None:
    """Remove a Unix socket's file (no-op for TCP or when it is already gone).

    A socket file outlives its socket; gecod calls this when it stops listening.
    """
    if addr.family == "unix" and addr.path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(addr.path)
