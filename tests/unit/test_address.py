"""gecod's socket addresses: the seed's forms, their equivalences, and the sockets made."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from geco.errors import ConfigError, GecoError
from geco.wire import address
from geco.wire.address import Address

FORMS = ("service:<name|port>, port:<n>, path:</absolute/path>, <n> (a loopback TCP port) "
         "or </absolute/path> (a Unix socket)")


@pytest.mark.parametrize("text", ["service:http-alt", "service:8080", "port:8080", "8080"])
def test_the_seeds_tcp_forms_are_one_address(text: str) -> None:
    """Given the four spellings the seed calls equivalent, then each is loopback TCP 8080."""
    assert address.parse(text) == Address("tcp", port=8080)


@pytest.mark.parametrize("text", ["/var/run/gecod.s", "path:/var/run/gecod.s"])
def test_the_seeds_unix_forms_are_one_address(text: str) -> None:
    assert address.parse(text) == Address("unix", path="/var/run/gecod.s")


@pytest.mark.parametrize(("text", "canonical"), [
    ("service:http-alt", "port:8080"), ("1", "port:1"), ("port:65535", "port:65535"),
    ("/run/geco/gecod.sock", "path:/run/geco/gecod.sock"), ("path:/x:y", "path:/x:y"),
    ("service:ssh", "port:22"),
])
def test_str_is_the_canonical_form_and_parses_back(text: str, canonical: str) -> None:
    """Given any accepted form, then str() gives path:/port: (no name lookups left) and
    parsing that gives the same address."""
    addr = address.parse(text)
    assert str(addr) == canonical
    assert address.parse(canonical) == addr


@pytest.mark.parametrize(("text", "why"), [
    ("", "is not understood"),
    ("tcp:8080", "is not understood"),
    ("localhost:8080", "is not understood"),
    (" 8080", "is not understood"),
    ("8080 ", "is not understood"),
    ("gecod.sock", "is not understood"),
    ("./gecod.sock", "is not understood"),
    ("port:", "must give a port number, got ''"),
    ("port:80a", "must give a port number, got '80a'"),
    ("port:-1", "must give a port number, got '-1'"),
    ("port:\u0663", "must give a port number, got '\u0663'"),
    ("port:0", "must give a port 1..65535, got 0"),
    ("65536", "must give a port 1..65535, got 65536"),
    ("service:", "must name a service"),
    ("service:no-such-service-geco", "names a service that /etc/services does not list for "
                                     "tcp: 'no-such-service-geco'"),
    ("path:", "must give an absolute path, got ''"),
    ("path:run/gecod.sock", "must give an absolute path, got 'run/gecod.sock'"),
    ("path:/a\0b", "must not contain a NUL byte"),
    ("/" + "x" * 107, "must be a path of at most 107 bytes (the kernel's limit), got 108"),
])
def test_a_bad_address_names_the_text_the_problem_and_the_forms(text: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        address.parse(text)
    assert str(info.value) == f"socket address {text!r} {why}; accepted forms: {FORMS}"
    assert isinstance(info.value, ValueError)


def test_a_path_of_107_bytes_is_the_longest_accepted() -> None:
    assert address.parse("/" + "x" * 106).path == "/" + "x" * 106


# ---------------------------------------------------------------------------
# listen / connect
# ---------------------------------------------------------------------------

def test_a_unix_listener_is_0666_in_a_created_directory_and_accepts(tmp_path: Path) -> None:
    """Given a path in a missing directory, when listened on, then the directory is made,
    the socket file is mode 0666 (the MAC and SO_PEERCRED are the gate), and a client
    connects and talks."""
    addr = address.parse(f"path:{tmp_path}/run/gecod.sock")
    with address.listen(addr) as server:
        st = os.lstat(tmp_path / "run" / "gecod.sock")
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
        with address.connect(addr, 2.0) as client:
            conn, _ = server.accept()
            with conn:
                client.sendall(b"hi")
                assert conn.recv(2) == b"hi"
                assert client.gettimeout() == 2.0
    address.unlink_socket(addr)
    assert not (tmp_path / "run" / "gecod.sock").exists()
    address.unlink_socket(addr)  # already gone: no error


def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    """Given the socket file of a gecod that died (nobody listens), then listen removes it
    and binds a new socket."""
    path = tmp_path / "gecod.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()
    with address.listen(Address("unix", path=str(path))) as server:
        assert server.getsockname() == str(path)


def test_a_live_listener_is_never_unlinked(tmp_path: Path) -> None:
    """Given a socket someone listens on (a running gecod), then a second listen refuses and
    the first keeps its socket."""
    addr = Address("unix", path=str(tmp_path / "gecod.sock"))
    with address.listen(addr):
        with pytest.raises(GecoError) as info:
            address.listen(addr)
        assert str(info.value) == ("another process is listening on the socket (a second "
                                   f"gecod?) (path={addr.path})")
        address.connect(addr, 1.0).close()


def test_a_file_that_is_not_a_socket_is_never_removed(tmp_path: Path) -> None:
    path = tmp_path / "gecod.sock"
    path.write_text("important")
    with pytest.raises(GecoError) as info:
        address.listen(Address("unix", path=str(path)))
    assert str(info.value) == ("the socket path exists and is not a socket; refusing to "
                               f"remove it (path={path})")
    assert path.read_text() == "important"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_a_tcp_listener_is_loopback_only_with_reuseaddr() -> None:
    addr = Address("tcp", port=free_port())
    with address.listen(addr) as server:
        assert server.getsockname() == ("127.0.0.1", addr.port)
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        with address.connect(addr, 2.0) as client:
            conn, _ = server.accept()
            conn.close()
            assert client.getpeername() == ("127.0.0.1", addr.port)


def test_connecting_to_nobody_names_the_address_and_errno(tmp_path: Path) -> None:
    tcp = Address("tcp", port=free_port())
    with pytest.raises(GecoError) as info:
        address.connect(tcp, 1.0)
    assert str(info.value) == ("cannot connect to gecod: Connection refused "
                               f"(errno=ECONNREFUSED address=port:{tcp.port})")
    unix = Address("unix", path=str(tmp_path / "none.sock"))
    with pytest.raises(GecoError) as info:
        address.connect(unix, 1.0)
    assert str(info.value) == ("cannot connect to gecod: No such file or directory "
                               f"(errno=ENOENT address=path:{unix.path})")


def test_a_port_in_use_is_a_listen_error() -> None:
    addr = Address("tcp", port=free_port())
    with address.listen(addr), pytest.raises(GecoError) as info:
        # SO_REUSEADDR does not allow two listeners on one port
        address.listen(addr)
    assert str(info.value) == ("cannot listen: Address already in use "
                               f"(errno=EADDRINUSE address=port:{addr.port})")


@pytest.mark.parametrize(("setting", "public", "expected"), [
    ("", "path:/run/geco/gecod.sock", "/run/geco/gecod-root.sock"),
    ("", "path:/tmp/x/sock", "/tmp/x/sock-root"),
    ("", "port:4000", "/run/geco/gecod-4000-root.sock"),
    ("path:/run/site/root.sock", "path:/run/geco/gecod.sock", "/run/site/root.sock"),
])
def test_the_privileged_socket_is_beside_the_public_one_unless_set(
        setting: str, public: str, expected: str) -> None:
    assert address.privileged(setting, address.parse(public)).path == expected


def test_a_privileged_socket_must_be_a_unix_socket() -> None:
    with pytest.raises(ConfigError) as info:
        address.privileged("port:99", address.parse("path:/run/geco/gecod.sock"))
    assert "must be a Unix socket (path:<absolute path>): the privileged socket is guarded " \
           "by its file mode, which a TCP port has not" in str(info.value)
