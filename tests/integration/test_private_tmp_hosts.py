"""A parallel job's private /tmp on each of its hosts (the emulated cluster, [tmp] private).

``integration/cluster/cluster.sh`` gives three hosts a mount namespace each, shared by the
host's gecod and execd as a real host's are; this module turns [tmp] private on for all
three (their gecods restarted) and runs a 3-slot -pe job, one slot per host, whose master
starts a ``qrsh -inherit`` task on each other host. The machine's /tmp is every emulated
host's, so a task that saw its host's /tmp would see all of it: each must see only its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.config import Config
from geco.job import privatetmp
from geco.jobkey import JobKey
from tests.clusterkit import cluster, submit_pe
from tests.integration.livekit import no_queue_in_error, wait_until, with_setting

pytestmark = pytest.mark.sge

HOSTS = (1, 2, 3)
WAIT = 180.0
# The master writes /tmp/master, each task (a host of the job's other than the master's)
# says what its /tmp holds and whether Grid Engine's $TMPDIR is there, then writes a file;
# all hold on (a "go" file) until the test has looked at every host's places.
SCRIPT = r"""#!/bin/bash
echo master > /tmp/master
look='echo "$(hostname): $(ls -A /tmp | tr "\n" " ")tmpdir=$(test -d "$TMPDIR" && echo ok)"; '\
'touch /tmp/task.$(hostname); touch up.$(hostname); while [ ! -e go ]; do sleep 0.2; done'
for h in $(awk 'NR > 1 { print $1 }' "$PE_HOSTFILE"); do
  qrsh -inherit "$h" "cd $PWD && $look" &
done
touch up.$(hostname)
wait
echo "$(hostname): $(ls -A /tmp | tr '\n' ' ')"
"""


def _config(k: int) -> Path:
    return Path(f"/etc/netns/geco-test-n{k}/geco/geco.toml")


def _restart_gecod(k: int) -> None:
    for verb in ("stop-gecod", "start-gecod"):
        done = cluster(verb, str(k))
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def private_on_every_host(three_hosts: None) -> Iterator[None]:
    before = {k: _config(k).read_text() for k in HOSTS}
    try:
        for k in HOSTS:
            _config(k).write_text(with_setting(before[k], "tmp", "private", True))
            _restart_gecod(k)
        yield
    finally:
        for k in HOSTS:
            if _config(k).exists():
                _config(k).write_text(before[k])
                _restart_gecod(k)


def _places(k: int, job: int) -> privatetmp.Places:
    return privatetmp.places(Config(state_dir=Path(f"/var/lib/geco-test-node{k}")),
                             JobKey(job, 1))


def test_each_host_of_a_parallel_job_gives_its_tasks_a_private_tmp_of_its_own(
        sge: Any, job_owner: Any, private_on_every_host: None) -> None:
    """Given a 3-slot -pe job across the three hosts, then each task on another host sees
    only what it wrote in /tmp (and its $TMPDIR, which works), not the master's file nor
    the machine's /tmp; each host has the job's namespace while it runs, and none once it
    ended; no queue instance went into error."""
    job, out = submit_pe(sge, job_owner, "ptmp-hosts", SCRIPT)
    try:
        wait_until(lambda: all((out / f"up.geco-node{k}").exists() for k in HOSTS)
                   or not sge.is_known(job), WAIT, "the master and both tasks running")
        missing = [k for k in HOSTS if not (out / f"up.geco-node{k}").exists()]
        assert not missing, (f"no task ran on {missing}: "
                             f"{(out / 'out').read_text() if (out / 'out').exists() else ''}")
        for k in HOSTS:
            places = _places(k, job)
            assert os.path.lexists(places.pin), f"geco-node{k} has no namespace for {job}"
        assert (_places(1, job).tmp / "master").read_text() == "master\n"
        for k in (2, 3):
            assert (_places(k, job).tmp / f"task.geco-node{k}").exists()
    finally:
        (out / "go").touch()
    [record] = sge.wait_finished(job, timeout=WAIT)
    text = (out / "out").read_text()
    assert record["exit_status"] == "0", text
    seen = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    for k in (2, 3):
        words = seen[f"geco-node{k}"].split()
        assert words[-1] == "tmpdir=ok", text
        # its /tmp: Grid Engine's $TMPDIR (under this host's tmpdir) and nothing else
        assert words[:-1] == [f"geco-test-node{k}"], text
    master = set(seen["geco-node1"].split())
    assert "master" in master and not {w for w in master if w.startswith("task.")}, text
    for k in HOSTS:
        places = _places(k, job)
        wait_until(lambda places=places: not os.path.lexists(places.pin)
                   and not places.job_dir.exists(), WAIT,
                   f"geco-node{k}'s namespace of job {job} removed")
    assert not re.search(r"Traceback", text)
    assert no_queue_in_error(sge) == {}
