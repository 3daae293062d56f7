"""A real OpenSSH sshd on 127.0.0.1 with a PAM stack of the caller's, for tests and benches.

sshd names its PAM service after its program name, so each one runs as a link
``/usr/sbin/sshd`` -> ``<dir>/<service>`` and reads ``/etc/pam.d/<service>``: the
node's own sshd and PAM files are never touched. Key-based logins only (one client
key in every listed user's authorized keys, which live in the sshd's own dir).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from tests.cleanslate import stop_process

REPO = Path(__file__).resolve().parents[1]
SSHD = Path("/usr/sbin/sshd")
PAM_MODULE = "pam_geco.so"
PRELOAD = "/usr/lib/geco/libgeco_preload.so"


def readme_pam_stack() -> str:
    """The /etc/pam.d/sshd of the README's "ssh into compute nodes" section: geco's two
    lines around Debian's own (so the tests run what the admins are told to write)."""
    section = (REPO / "README.md").read_text().split("## ssh into compute nodes", 1)[1]
    found = re.search(r"```\n(.*?)```", section, re.S)
    if found is None:
        raise AssertionError("the README's ssh section has no PAM stack")
    return found.group(1)


GECO_PAM_STACK = readme_pam_stack()
PLAIN_PAM_STACK = "\n".join(line for line in GECO_PAM_STACK.splitlines()
                            if PAM_MODULE not in line) + "\n"
CLIENT_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                  "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=20")


class Sshd(NamedTuple):
    port: int
    key: Path  # the client key every listed user's authorized keys hold (root reads it)
    dir: Path
    node: str
    address: str = "127.0.0.1"

    def argv(self, user: str, *command: str, options: Sequence[str] = ()) -> list[str]:
        """``ssh user@<address> command`` with this sshd's port and key."""
        return ["ssh", "-i", str(self.key), "-p", str(self.port), *CLIENT_OPTIONS, *options,
                f"{user}@{self.address}", *command]

    def ssh(self, user: str, *command: str, options: Sequence[str] = (),
            timeout: float = 60, send: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run :meth:`argv` as root's client; the completed process. ``send``: variables
        the client sends with the session (SendEnv), as a job's ssh would its JOB_ID."""
        sent = dict(send or {})
        options = (*options, *(f"-oSendEnv={name}" for name in sent))
        return subprocess.run(self.argv(user, *command, options=options), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
                              env={**os.environ, **sent})

    def command_line(self, user: str, key: Path, host: str = "") -> str:
        """The ssh command a job of ``user`` runs, with a key it can read (to ``host``, by
        default this sshd's address)."""
        return (f"ssh -i {key} -p {self.port} {' '.join(CLIENT_OPTIONS)} "
                f"{user}@{host or self.address}")


@contextlib.contextmanager
def rc_probe(home: Path, uid: int, gid: int) -> Iterator[Path]:
    """A ``~/.ssh/rc`` (sshd runs it through popen before the session's command) that
    writes its own /proc/self/cgroup to the file yielded; removed afterwards."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    os.chown(ssh_dir, uid, gid)
    seen = home / "geco-ssh-rc-cgroup"
    seen.unlink(missing_ok=True)
    rc = ssh_dir / "rc"
    rc.write_text(f"cat /proc/self/cgroup > {seen}\n")
    os.chown(rc, uid, gid)
    try:
        yield seen
    finally:
        rc.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_leftover(service: str, pidfile: Path) -> None:
    """An sshd of an interrupted earlier run (by the pid it wrote, and only if it is ours)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().split()[0])
        if service in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            stop_process(pid)


@contextlib.contextmanager
def running_sshd(service: str, pam_stack: str, users: Sequence[str], *,
                 preload: bool = False, address: str = "127.0.0.1",
                 wrap: Sequence[str] = (), node: str = "") -> Iterator[Sshd]:
    """An sshd as ``service`` with ``pam_stack``, letting ``users`` log in with one key and
    send ``JOB_ID``/``SGE_TASK_ID`` (AcceptEnv, as the README advises); with ``preload``,
    geco's exec() preload loaded into it (as ``LD_PRELOAD`` in its unit's environment
    would). It listens on ``address``; ``wrap`` runs it on another host (a command that
    execs its arguments there, e.g. ``cluster.sh run 2``, named ``node``). Stopped (by
    its pid), its PAM file and dir removed afterwards."""
    pidfile = Path(f"/run/{service}.pid")
    pam_file = Path("/etc/pam.d") / service
    _stop_leftover(service, pidfile)
    # not under pytest's 0700 tmp: sshd reads each user's authorized keys as that user
    base = Path(tempfile.mkdtemp(prefix=f"{service}-", dir="/run"))
    proc = None
    try:
        base.chmod(0o755)
        keys = base / "keys"
        keys.mkdir(mode=0o755)
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(base / name)], check=True, capture_output=True)
        public = (base / "client_key.pub").read_text()
        for user in users:
            (keys / user).write_text(public)
        port = free_port()
        (base / "sshd_config").write_text(f"""\
Port {port}
ListenAddress {address}
HostKey {base}/host_key
PidFile {pidfile}
AuthorizedKeysFile {keys}/%u
StrictModes no
UsePAM yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
AcceptEnv JOB_ID SGE_TASK_ID
LogLevel VERBOSE
""")
        link = base / service
        link.symlink_to(SSHD)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        pam_file.write_text(pam_stack)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        if preload:
            env["LD_PRELOAD"] = PRELOAD
        proc = subprocess.Popen([*wrap, str(link), "-D", "-f", str(base / "sshd_config"),
                                 "-E", str(base / "sshd.log")], env=env)
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex((address, port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test sshd did not listen: {(base / 'sshd.log')}")
            time.sleep(0.05)
        yield Sshd(port, base / "client_key", base,
                   node or os.uname().nodename.partition(".")[0], address)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=20)
        pam_file.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
