"""ssh into the modern node: pam_systemd and logind in the stack, sessions still in the job.

Runs INSIDE the QEMU machine: after tests/vm_sge/test_sge_systemd.py on the pure cgroup
v2 boot (same Grid Engine, gecod.service from geco's package), and alone on
a boot with systemd's legacy cgroup v1 layout (tests/system/test_ssh_v1_systemd_vm.py).
A real sshd on 127.0.0.1 with the README's Debian stack, whose ``common-session`` runs
``pam_systemd`` (logind makes the login a session scope) before geco's session line: the
session must still land in the job (v2: its ``0::`` cgroup; v1: every hierarchy geco
uses, while systemd's own ``name=systemd`` keeps its session scope), and the node's
``geco check`` must call that stack closed.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

from tests.integration import livekit as kit
from tests.sshkit import GECO_PAM_STACK, running_sshd

SLOW = 300.0  # the emulated machine is ~8x slower than the host


def test_with_pam_systemd_in_the_stack_a_job_owners_session_lands_in_the_job(sge: Any) -> None:
    """Given a running job and the README's stack (pam_systemd before geco's session line),
    when its owner sshs in, then logind opened a session for them, yet the command runs in
    the job's cgroups (v1: in every hierarchy geco uses; v2: the ``0::`` path) with the
    job's JOB_ID; a process the session leaves behind and the job's own stay there across
    ``systemctl daemon-reload`` (systemd re-realizing its units must not pull them out);
    root gets in outside every job, and ``geco check`` says sshd's stack gates and adopts."""
    owner = sge.owner
    job = sge.submit("-b", "y", "-o", "/dev/null", "-e", "/dev/null", "sleep", "600")
    key = f"{job}.1"
    try:
        dirs = kit.wait_for_cgroups(key, SLOW)
        job_pids = (dirs["memory"] / "cgroup.procs").read_text().split()
        with running_sshd("geco-test-sshd", GECO_PAM_STACK, (owner.name, "root")) as sshd:
            out = sshd.ssh(owner.name, "cat /proc/self/cgroup; echo =; echo $JOB_ID; echo =; "
                           "loginctl --no-legend list-sessions; echo =; "
                           "nohup sleep 600 </dev/null >/dev/null 2>&1 & echo $!", timeout=SLOW)
            root = sshd.ssh("root", "cat /proc/self/cgroup", timeout=SLOW)
        assert out.returncode == 0, out.stderr
        cgroup, job_id, sessions, left = out.stdout.split("=\n")
        assert kit.outside_the_job(cgroup, key) == [], cgroup
        assert job_id.strip() == str(job)
        assert any(owner.name in line.split() for line in sessions.splitlines()), sessions
        assert root.returncode == 0, root.stderr
        assert kit.job_of(root.stdout) == "", root.stdout

        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=SLOW)
        seen = {}
        for pid in (left.strip(), *job_pids):
            with contextlib.suppress(FileNotFoundError):  # a job's short-lived helper
                seen[pid] = Path(f"/proc/{pid}/cgroup").read_text()
        assert left.strip() in seen and len(seen) > 1, (left, job_pids, seen)
        for pid, after in seen.items():
            assert kit.outside_the_job(after, key) == [], f"pid {pid} after the reload:\n{after}"
    finally:
        subprocess.run(["qdel", "-f", str(job)], capture_output=True, check=False)
        sge.wait_finished(job, timeout=SLOW, accounting=False)
    node_stack = Path("/etc/pam.d/sshd")
    before = node_stack.read_text()
    try:
        node_stack.write_text(GECO_PAM_STACK)  # the node's own sshd, as the README says
        check = subprocess.run(["/usr/bin/geco", "check"], capture_output=True,
                               text=True, check=False)
    finally:
        node_stack.write_text(before)
    assert ("ok    sshd: pam_geco.so gates logins (account) and adopts sessions (session, "
            "last)") in check.stdout.splitlines(), check.stdout
