"""ssh into the modern node: pam_systemd and logind in the stack, sessions still in the job.

Runs INSIDE the QEMU machine, after tests/vm_sge/test_sge_systemd.py (same boot,
same Grid Engine, gecod.service installed by scripts/install.sh). A real sshd on
127.0.0.1 with the README's Debian stack, whose ``common-session`` runs
``pam_systemd`` (logind makes the login a session scope) before geco's session
line: the session must still land in the job's ``0::`` cgroup, and the node's
``geco check`` must call that stack closed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.integration import livekit as kit
from tests.sshkit import GECO_PAM_STACK, running_sshd

JOBS = kit.V2_JOBS
SLOW = 300.0  # the emulated machine is ~8x slower than the host


def test_with_pam_systemd_in_the_stack_a_job_owners_session_lands_in_the_job(sge: Any) -> None:
    """Given a running job and the README's stack (pam_systemd before geco's session line),
    when its owner sshs in, then logind opened a session for them, yet the command runs in
    the job's cgroup with the job's JOB_ID; root gets in outside every job, and
    ``geco check`` says sshd's stack gates and adopts."""
    owner = sge.owner
    job = sge.submit("-b", "y", "-o", "/dev/null", "-e", "/dev/null", "sleep", "600")
    key = f"{job}.1"
    try:
        procs = JOBS / key / "cgroup.procs"
        kit.wait_until(lambda: procs.exists() and procs.read_text().strip() != "", SLOW,
                       "the job's cgroup with its shepherd")
        with running_sshd("geco-test-sshd", GECO_PAM_STACK, (owner.name, "root")) as sshd:
            out = sshd.ssh(owner.name, "cat /proc/self/cgroup; echo $JOB_ID; "
                           "loginctl --no-legend list-sessions", timeout=SLOW)
            root = sshd.ssh("root", "cat /proc/self/cgroup", timeout=SLOW)
        assert out.returncode == 0, out.stderr
        cgroup, job_id, *sessions = out.stdout.splitlines()
        assert cgroup == f"0::/{JOBS.relative_to('/sys/fs/cgroup')}/{key}"
        assert job_id == str(job)
        assert any(owner.name in line.split() for line in sessions), sessions
        assert root.returncode == 0, root.stderr
        assert "geco-jobs.service" not in root.stdout
    finally:
        subprocess.run(["qdel", "-f", str(job)], capture_output=True, check=False)
        sge.wait_finished(job, timeout=SLOW, accounting=False)
    node_stack = Path("/etc/pam.d/sshd")
    before = node_stack.read_text()
    try:
        node_stack.write_text(GECO_PAM_STACK)  # the node's own sshd, as the README says
        check = subprocess.run(["/opt/geco/venv/bin/geco", "check"], capture_output=True,
                               text=True, check=False)
    finally:
        node_stack.write_text(before)
    assert ("ok    sshd: pam_geco.so gates logins (account) and adopts sessions (session, "
            "last)") in check.stdout.splitlines(), check.stdout
