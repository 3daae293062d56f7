"""ssh between the hosts of a parallel job lands in that job on the other host.

A real OpenSSH sshd with geco's PAM lines runs on geco-node2 (its network namespace,
its /etc/geco, so its PAM module asks geco-node2's gecod). A 3-host job's script on
geco-node1 runs ``ssh geco-node2 ...``, as an MPI launcher that uses ssh would:
geco-node2's gecod asks geco-node1's over the cluster channel whether a process of the
user's job there made the connection (Slurm's callerid), and the session joins the job.
The same user's ssh from outside the job joins it too, but by the "only job" rule.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

import pytest

from tests.clusterkit import CLUSTER, ON_CLUSTER, PE, QUEUE
from tests.sshkit import GECO_PAM_STACK, running_sshd

pytestmark = pytest.mark.sge



def test_an_ssh_from_inside_a_job_to_another_of_its_hosts_lands_in_that_job_there(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any) -> None:
    """Given a 3-host job with a task on geco-node2, when its script on geco-node1 runs ssh
    to geco-node2, then the session there is in the job's cgroups on geco-node2 with the
    job's JOB_ID, and geco-node2 journals that it joined the job by callerid (REASON=caller);
    the user's ssh from outside the job joins it only because it is the user's only job
    there (REASON=only-job)."""
    with running_sshd("geco-test-sshd-node2", GECO_PAM_STACK, [job_owner.name],
                      address="10.77.2.11", wrap=["bash", str(CLUSTER), "run", "2"],
                      node="geco-node2") as sshd:
        out = job_owner.make_dir("ssh-across")
        key = out / "key"
        shutil.copy(sshd.key, key)
        os.chown(key, job_owner.uid, job_owner.gid)
        key.chmod(0o600)
        script = out / "pe.sh"
        script.write_text(f"""#!/bin/bash
qrsh -inherit geco-node2 "touch $PWD/up; while [ ! -e $PWD/finish ]; do sleep 0.2; done" &
while [ ! -e up ]; do sleep 0.2; done
{sshd.command_line(job_owner.name, key, "geco-node2")} \\
  'echo "JOB_ID=$JOB_ID"; hostname; cat /proc/self/cgroup' > ssh.out 2> ssh.err
echo "ssh exit $?" >> ssh.out
touch sshed
wait
""")
        os.chown(script, job_owner.uid, job_owner.gid)
        job = sge.submit("-q", QUEUE, *ON_CLUSTER, "-pe", PE, "3", "-masterq",
                         f"{QUEUE}@geco-node1", "-cwd", "-o", "/dev/null", "-j", "y",
                         str(script), cwd=out)
        try:
            [caller] = journal.wait_for(180, JOB_ID=job, GECO_EVENT="ssh-adopted")
            deadline = time.monotonic() + 60
            while not (out / "sshed").exists():
                assert time.monotonic() < deadline, (out / "ssh.err").read_text()
                time.sleep(0.2)
            # the job runs on (its task on geco-node2 waits for `finish`): the user, from
            # this machine, outside the job
            outside = subprocess.run(["runuser", "-u", job_owner.name, "--", "sh", "-c",
                                      sshd.command_line(job_owner.name, key) + " true"],
                                     capture_output=True, text=True, timeout=60, check=False)
        finally:
            (out / "finish").touch()
        [record] = sge.wait_finished(job, timeout=120)
    seen = (out / "ssh.out").read_text()
    adopted = journal.entries(JOB_ID=job, GECO_EVENT="ssh-adopted")

    assert record["exit_status"] == "0"
    assert "ssh exit 0" in seen, seen + (out / "ssh.err").read_text()
    assert f"JOB_ID={job}" in seen.splitlines() and "geco-node2" in seen.splitlines()
    assert f":memory:/geco-test-node2/{job}.1" in seen, seen
    assert caller["REASON"] == "caller" and caller["SSH_USER"] == job_owner.name
    assert outside.returncode == 0, outside.stderr
    assert sorted(e["REASON"] for e in adopted) == ["caller", "only-job"], adopted
