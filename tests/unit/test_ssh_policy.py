"""The ssh policy's inputs: [ssh] settings and the connection a login names.

The decisions themselves are tried on a real sshd with real jobs
(tests/integration/test_ssh_live.py); these are the edges no login reaches.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from geco import config
from geco.ssh.policy import _client_socket, _from_this_node, _holds, connection_ends

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("connection", "local"), [
    ("127.0.0.1 40000 127.0.0.1 22", True),
    ("::1 40000 ::1 22", True),
    ("10.1.2.3 40000 10.1.2.3 22", True),  # this node to its own address
    ("10.1.2.4 40000 10.1.2.3 22", False),  # another host
    ("", False),
    ("127.0.0.1 x 127.0.0.1 22", False),
    ("not-an-address 1 127.0.0.1 22", False),
    ("127.0.0.1 1 127.0.0.1 22 extra", False),
])
def test_only_a_well_formed_connection_from_this_node_is_traced_to_a_process(
        connection: str, local: bool) -> None:
    """Given SSH_CONNECTION as sshd sets it, or mangled, then only a connection from this
    node to itself is looked up (the callerid rule), and a mangled one is not an error."""
    ends = connection_ends(connection)
    assert (ends is not None and _from_this_node(ends)) is local


@pytest.mark.parametrize(("connection", "ends"), [
    ("10.1.2.4 40000 10.1.2.3 22", ("10.1.2.4", 40000, "10.1.2.3", 22)),
    ("::ffff:10.1.2.4 40000 ::ffff:10.1.2.3 22", ("10.1.2.4", 40000, "10.1.2.3", 22)),
    ("fd00::4 40000 fd00::3 22", ("fd00::4", 40000, "fd00::3", 22)),
    ("10.1.2.4 0 10.1.2.3 22", None),
    ("10.1.2.4 40000 10.1.2.3 65536", None),
])
def test_a_connection_from_another_host_is_read_as_its_four_ends(
        connection: str, ends: tuple[str, int, str, int] | None) -> None:
    """Given SSH_CONNECTION of a login from another host (what a job's ssh from one of its
    hosts to another gives), then its four ends are read as the other host will be asked
    about them (an IPv4 peer of a dual-stack socket as IPv4); impossible ports are none."""
    assert connection_ends(connection) == ends


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_a_loopback_connections_client_socket_is_found_in_the_kernels_table(
        family: socket.AddressFamily) -> None:
    """Given a real TCP connection on this node (what ``ssh`` from a job makes), when its
    SSH_CONNECTION 4-tuple is looked up, then the kernel's table names the client's socket,
    which this process holds; the server's end, or a tuple of no connection, is not it."""
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    try:
        server = socket.socket(family)
        server.bind((host, 0))
    except OSError as exc:  # no ::1 on this machine
        pytest.skip(f"cannot listen on {host}: {exc}")
    with server, socket.socket(family) as client:
        server.listen()
        client.connect(server.getsockname()[:2])
        accepted, _ = server.accept()
        with accepted:
            sport, dport = client.getsockname()[1], server.getsockname()[1]
            found = _client_socket((host, sport, host, dport))
            assert found == f"socket:[{os.fstat(client.fileno()).st_ino}]"
            assert _holds(os.getpid(), found, Path("/proc"))
            assert _client_socket((host, dport, host, sport)) != found
            assert _client_socket((host, 1, host, dport)) is None


def test_bad_ssh_settings_fall_back_to_their_defaults(tmp_path: Path) -> None:
    """Given [ssh] values of the wrong kind, then each keeps its default (fail closed:
    several_jobs and adopt_failure stay on their documented choices)."""
    path = tmp_path / "geco.toml"
    path.write_text('[ssh]\nadmins = "alice"\nadmin_groups = ["a/b"]\n'
                    'several_jobs = "oldest"\nadopt_failure = "maybe"\nbypass_file = "x"\n')
    cfg = config.load(path)
    defaults = config.Config()
    assert (cfg.ssh_admins, cfg.ssh_admin_groups, cfg.ssh_several_jobs,
            cfg.ssh_adopt_failure, cfg.ssh_bypass_file) == (
        defaults.ssh_admins, defaults.ssh_admin_groups, "newest", "refuse",
        Path("/etc/geco/ssh-bypass"))


def _helper(env: dict[str, str], user: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", str(REPO / "sge_hooks" / "geco-pam")],
                          env=env, capture_output=True, text=True, timeout=60, check=False,
                          user=user)


def test_the_pam_helper_ignores_other_pam_stages_and_refuses_to_run_unprivileged() -> None:
    """Given the helper run for close_session, then it succeeds and does nothing; run by a
    user for account, then it fails with one line saying where it belongs."""
    assert _helper({"PAM_TYPE": "close_session", "PAM_USER": "nobody"}).returncode == 0
    out = _helper({"PAM_TYPE": "account", "PAM_USER": "nobody"}, user=65534)
    assert out.returncode == 1
    assert out.stderr == "geco-pam: sshd's PAM module (pam_geco.so) runs it, as root\n"
