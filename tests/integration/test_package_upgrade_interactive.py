"""An interactive job across a package upgrade and downgrade: `qrsh <command>` runs on.

Issue 34's upgrade story with an interactive job, on this machine's Grid Engine (the
QEMU guest's runs the batch, ``-pe``, ``qrsh -inherit`` and ssh parts: in that emulated
machine ``qrsh`` loses its session now and then with plain Grid Engine too, so it cannot
judge geco there). A node without systemd upgrades as an admin would there: the package
is upgraded to the same package as the next version and downgraded back to it, by dpkg
(tests/packagekit.py: every file replaced, every maintainer script run with the other
version; sge_execd keeps mapping the old preload, deleted on disk), and ``geco handover``
moves gecod's sockets to the gecod now installed (what the postinst runs under systemd).
The job started before goes on in its cgroups, ends with its own exit code, is accounted
once, and the new gecod tears it down.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import packagekit
from tests.integration.livekit import job_cgroups
from tests.integration.samekit import CLIENT_ENV, GECO, QUEUES, Same, same_queues, wait_until
from tests.sshkit import PRELOAD

pytestmark = pytest.mark.sge

WAIT = 120.0
MEMORY = 300 << 20  # -l m_mem_free=300M


def show(file: str) -> str:
    """Shell: what the job sees of itself, into ``file`` of its directory, appearing whole."""
    return (f'{{ echo "JOB_ID=$JOB_ID"; cat /proc/self/cgroup; '
            f'm=$(sed -n "s/^[0-9]*:memory://p" /proc/self/cgroup); '
            f'echo "LIMIT=$(cat /sys/fs/cgroup/memory$m/memory.limit_in_bytes)"; }} > {file}.tmp '
            f'&& mv {file}.tmp {file}')


@pytest.fixture(scope="module")
def same(sge: Any, gecod: Any, job_owner: Any) -> Iterator[Same]:
    with same_queues(sge, job_owner, "upgrade-interactive") as kit:
        yield kit


def _shown(path: Path) -> dict[str, str]:
    text = path.read_text()
    cgroups = {c: p for line in text.splitlines() if line[:1].isdigit()
               for _, cs, p in [line.split(":", 2)] for c in cs.split(",")}
    return {"job": re.search(r"^JOB_ID=(\d+)$", text, re.M).group(1),  # type: ignore[union-attr]
            "cpuset": cgroups.get("cpuset", ""), "memory": cgroups.get("memory", ""),
            "limit": re.search(r"^LIMIT=(\d+)$", text, re.M).group(1)}  # type: ignore[union-attr]


def _maps_deleted_preload(pid: int) -> bool:
    return any(PRELOAD in line and line.endswith("(deleted)")
               for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


def test_an_interactive_qrsh_runs_on_contained_across_an_upgrade_a_downgrade_and_a_handover(
        same: Same, gecod: Any, sge: Any, journal: Any, tmp_path: Path) -> None:
    """Given `qrsh <command>` running in the geco queue, when the package is upgraded by
    one version and downgraded back (sge_execd then maps the replaced preload) and root
    runs `geco handover`, then the job is still in /GECO/<job>.1 with its memory limit, ends with
    its own exit code (6) when released, has one accounting record saying so, and the
    new gecod tears it down: one job-end record, from the new gecod, cgroups gone; no
    queue instance in error."""
    if not hasattr(gecod, "hand_over"):  # a GecodUnit
        pytest.skip("the node's gecod.service hands over through the package's postinst "
                    "(tests/vm_sge/test_package_lifecycle.py)")
    name = f"upg{uuid.uuid4().hex[:6]}"
    before, after, release = (same.path / f"{name}.{w}" for w in ("before", "after", "go"))
    command = (f"cd {same.path}; {show(before.name)}; "
               f"while [ ! -e {release.name} ]; do sleep 0.2; done; "
               f"{show(after.name)}; exit 6")
    built = packagekit.built()  # what this run installed; upgraded from, downgraded to
    versions = (packagekit.with_version(built, packagekit.field(built, "Version") + "+next",
                                        tmp_path), built)
    same.enable()
    same.wait_idle()
    client = subprocess.Popen(
        same.client_argv("qrsh", "-q", QUEUES[GECO], "-N", name, "-l", "m_mem_free=300M",
                         command),
        cwd=same.path, env=CLIENT_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        assert wait_until(before.exists, WAIT), "the job's first look at itself"
        seen = _shown(before)
        job = seen["job"]
        assert seen["cpuset"] == seen["memory"] == f"/GECO/{job}.1", seen
        assert seen["limit"] == str(MEMORY), seen

        for deb in versions:
            done = subprocess.run(["dpkg", "-i", str(deb)], capture_output=True, text=True,
                                  env=packagekit.APT_ENV, timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr
            assert packagekit.installed_version() == packagekit.field(deb, "Version")
        execd = int(sge.execd_pidfile.read_text().split()[0])
        assert _maps_deleted_preload(execd), "sge_execd should map the replaced preload"
        old = gecod.proc.pid
        handed = gecod.hand_over()
        assert f"(pid {old}) handed over to" in handed.stdout, handed.stdout

        release.touch()
        out, err = client.communicate(timeout=WAIT)
        assert client.returncode == 6, (out, err)
        assert _shown(after) == seen
        found, accounting = same.accounting_of(name, QUEUES[GECO], timeout=WAIT)
        assert str(found) == job and [a[1:] for a in accounting] == [("0", "6")], accounting
        assert wait_until(lambda: not job_cgroups(f"{job}.1"), WAIT), job_cgroups(f"{job}.1")
        [end] = journal.wait_for(GECO_EVENT="job-end", JOB_ID=job, timeout=WAIT)
        assert end["_PID"] == str(gecod.successor)
        assert "E" not in same.queue_state(QUEUES[GECO])
    finally:
        if packagekit.installed_version() != packagekit.field(built, "Version"):
            subprocess.run(["dpkg", "-i", str(built)], capture_output=True,
                           env=packagekit.APT_ENV, timeout=600, check=False)
        if client.poll() is None:
            client.kill()
            client.wait()
        gecod.stop()  # the new one too: the module's next test starts its own
        gecod.start()
