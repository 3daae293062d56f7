"""The single-host Grid Engine from the ``sge`` fixture runs a user's job end to end.

Holds with or without geco's hooks configured: whatever the hooks do, a plain
job must run, exit 0, keep the user's output files clean and leave no queue
instance in error state (a failing hook would put the queue into ``E``).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sge


def test_binary_job_of_test_user_runs_to_completion_and_leaves_no_queue_in_error(sge, job_owner):
    """Given the cluster and the unprivileged test user,
    when the user submits ``-b y /bin/echo`` with ``-cwd``,
    then the job finishes with exit status 0 and failed 0, its .o file holds the echo,
    its .e file is empty, and no queue instance is in state E."""
    workdir = job_owner.make_dir("smoke")

    job = sge.submit("-b", "y", "-cwd", "-N", "smoke", "/bin/echo", "hello", "from smoke",
                     cwd=workdir)
    [record] = sge.wait_finished(job, timeout=60)

    assert (record["jobnumber"], record["owner"]) == (str(job), job_owner.name)
    assert (record["exit_status"], record["failed"]) == ("0", "0")
    assert (workdir / f"smoke.o{job}").read_text() == "hello from smoke\n"
    assert (workdir / f"smoke.e{job}").read_text() == ""
    assert {q: s for q, s in sge.queue_states().items() if "E" in s} == {}


def test_queue_runs_the_deployed_geco_hooks_and_nothing_else(sge):
    """Given the hooks found in /usr/libexec/geco when the fixture started,
    when the queue configuration is read back,
    then exactly those hooks are configured with the documented command lines."""
    config = sge.queue_config()

    expected = {
        "prolog": ("root@/usr/libexec/geco/prolog $job_id $ja_task_id"
                   if "prolog" in sge.hooks else "NONE"),
        "epilog": ("root@/usr/libexec/geco/epilog $job_id $ja_task_id"
                   if "epilog" in sge.hooks else "NONE"),
        "starter_method": "/usr/libexec/geco/starter" if "starter" in sge.hooks else "NONE",
    }
    assert {key: config[key] for key in expected} == expected


def test_array_job_id_is_parsed_and_every_task_is_accounted(sge, job_owner):
    """Given a 2-task array job submitted as the test user,
    when it finishes,
    then submit() returned the job id and qacct has one record per task, both exit 0."""
    job = sge.submit("-b", "y", "-t", "1-2", "/bin/true", cwd=job_owner.make_dir("array"))
    records = sge.wait_finished(job, timeout=60)

    assert sorted((r["jobnumber"], r["taskid"], r["exit_status"]) for r in records) == [
        (str(job), "1", "0"), (str(job), "2", "0")]
    assert {r["owner"] for r in records} == {job_owner.name}
