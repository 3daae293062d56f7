"""``geco uninstall-check``, the package's prerm: what keeps geco from leaving this node.

On this host's real cgroup v1 hierarchies (a job with a process, then without), a real
PAM directory and unit directories laid out as a node's, and the real Grid Engine's
queue configuration read with qconf. The whole removal, with apt and jobs, runs in the
QEMU machine (tests/vm_sge/test_package_lifecycle.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from geco.cgroup import Limits, find_hierarchies, parse_mountinfo
from geco.config import Config
from geco.jobkey import JobKey
from geco.reports import removal
from geco.resourceset import short_hostname
from tests.cgroup_testkit import eventually, start_in, usable_v1_hierarchies, v1_fixtures
from tests.sshkit import GECO_PAM_STACK, PLAIN_PAM_STACK

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
REPO = Path(__file__).resolve().parents[2]

children, backend = v1_fixtures(HIER)


def quiet_node(tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """An /etc with Debian's plain sshd stack and a unit directory with sshd's unit."""
    etc = tmp_path / "etc"
    (etc / "pam.d").mkdir(parents=True)
    (etc / "pam.d" / "sshd").write_text(PLAIN_PAM_STACK)
    units = tmp_path / "units"
    (units / "ssh.service.d").mkdir(parents=True)
    (units / "ssh.service.d" / "local.conf").write_text("[Service]\nEnvironment=A=1\n")
    return etc, (str(units),)


@pytest.mark.root
@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
def test_a_job_with_a_process_blocks_removal_and_then_gecos_cgroups_go(
        backend: Any, children: list[int], tmp_path: Path) -> None:
    """Given a job cgroup holding a process, removal is refused naming the job; once the
    process is gone nothing blocks, and remove_cgroups takes the job's and geco's own
    cgroups in every controller."""
    etc, units = quiet_node(tmp_path)
    key = JobKey.parse("7.1")
    backend.create(key, Limits(cpus="0", mems="0", memory=64 << 20))
    child = start_in(backend, str(key), lambda out: signal.pause(), children)
    found, _ = removal.blockers(Config(qstat="/nonexistent/qstat"), backend, etc=etc,
                                unit_dirs=units)
    assert found == ["job 7.1 is running contained by geco (1 processes): wait for it to end, "
                     "or drain the node first (qmod -d)"]

    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -9
    assert eventually(lambda: not backend.pids(key))
    assert removal.blockers(Config(qstat="/nonexistent/qstat"), backend, etc=etc,
                            unit_dirs=units)[0] == []
    assert removal.remove_cgroups(backend) == []
    assert not [p for p in backend.parent_paths().values() if p.exists()]


def test_pam_lines_and_units_that_load_the_preload_block_removal(tmp_path: Path) -> None:
    """Given the README's sshd stack, sshd's drop-in from /usr/share/geco installed and an
    ld.so.preload naming the preload, each is named once; Debian's plain stack, a plain
    drop-in and the package's own execd drop-ins are not."""
    etc, units = quiet_node(tmp_path)
    assert removal._pam_lines(etc / "pam.d") == []
    assert removal._preloaders(etc, units) == []

    (etc / "pam.d" / "sshd").write_text(GECO_PAM_STACK)
    (etc / "pam.d" / "common-account").write_text("account required pam_unix.so\n")
    dropin = Path(units[0]) / "ssh.service.d" / "geco-preload.conf"
    dropin.write_text((REPO / "conf/systemd/ssh.service.d/geco-preload.conf").read_text())
    (etc / "ld.so.preload").write_text("/usr/lib/geco/libgeco_preload.so\n")
    assert removal._pam_lines(etc / "pam.d") == [
        f"{etc}/pam.d/sshd names pam_geco.so: remove its geco lines first (a required line "
        "whose module is gone refuses every login)"]
    assert removal._preloaders(etc, units) == [
        f"{etc}/ld.so.preload names geco's preload: take it out first",
        f"{dropin} loads geco's preload: remove it and restart that unit first (its daemon "
        "would ask a gecod that is gone)"]
    # what the package ships for sge_execd goes with it: never a reason to stay
    assert removal._preloaders(etc, ("/lib/systemd/system",)) == [
        f"{etc}/ld.so.preload names geco's preload: take it out first"]


@pytest.mark.sge
def test_a_queue_running_gecos_hooks_on_this_host_blocks_removal(sge: Any) -> None:
    """Given the suite's queue with geco's hooks and a queue whose starter_method is geco's
    only for this host ([host=...]), qconf's view names both, with the value for this host;
    a queue whose hooks are not geco's is not named."""
    ours = {attr: value for attr, value in sge.queue_config().items()
            if attr in ("prolog", "epilog", "starter_method") and removal.HOOK_DIR in value}
    assert ours, sge.queue_config()
    host = short_hostname()
    starter = "/usr/libexec/geco/starter"
    with sge.temporary_queue("geco-test-removal", prolog="NONE", epilog="NONE",
                             starter_method=f"NONE,[{host}={starter}]"), \
            sge.temporary_queue("geco-test-plain", prolog="NONE", epilog="NONE",
                                starter_method="NONE"):
        found, unread = removal.queue_hooks(Config())
    assert unread == ""
    assert sorted(found) == sorted([*((sge.queue, a, v) for a, v in ours.items()),
                                    ("geco-test-removal", "starter_method", starter)])
