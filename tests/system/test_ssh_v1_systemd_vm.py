"""ssh into a node where systemd runs the legacy cgroup v1 layout, with pam_systemd.

Many clusters still boot systemd with ``systemd.unified_cgroup_hierarchy=0``: systemd
keeps its ``name=systemd`` hierarchy and realizes units in the v1 controllers it
manages, while geco's jobs live in ``<controller>/GECO/<job>``. One boot of the QEMU
machine with that command line (:mod:`vmrun`): the guest installs geco's package as an
admin would (apt; gecod.service, the execd drop-in), Grid Engine comes up as units, and
``tests/vm_sge/test_ssh_systemd.py`` runs: a session opened through pam_systemd lands
in the job in every hierarchy geco uses, and stays there, with the job's own
processes, across ``systemctl daemon-reload``. Then the preload-in-sshd half of the ssh
matrix the host runs whole (``tests/integration/test_ssh_preload.py``: its sessions that
land in a job), here with pam_systemd and logind in the stack and gecod as a unit (the
other half runs in tests/vm_sge's boot: the two boots run side by side, and this one is
the shorter).

Cost: a boot (~60 s beside the host's suite), the install,
Grid Engine's start and the jobs.
"""

from __future__ import annotations

import re

import pytest

from tests.system import vmrun

LEGACY_V1 = "systemd.unified_cgroup_hierarchy=0 systemd.legacy_systemd_cgroup_controller=1"
FILES = ("tests/vm_sge/test_ssh_systemd.py", "tests/integration/test_ssh_preload.py")
# of the preload half (the host runs it all), those where the session lands in a job, as
# pam_systemd put it in a session scope first; a refusal comes before anything systemd does
GUEST_TESTS = (FILES[0], *(f"{FILES[1]}::{test}" for test in (
    "test_a_job_id_sent_with_the_session_picks_that_job_of_the_users",
    "test_without_geco_in_the_pam_stack_the_preload_still_contains_sessions")))
GUEST_COMMAND = (
    f"set -e; {vmrun.COPY_TO_GUEST}; cd /root/geco; "
    "test -d /sys/fs/cgroup/memory && ! test -e /sys/fs/cgroup/cgroup.controllers; "
    f"{vmrun.QMASTER_EARLY}; {vmrun.INSTALL_PACKAGE}; "
    f"{vmrun.GUEST_SGE} "
    f"{vmrun.guest_pytest(' '.join(GUEST_TESTS), 'python3', '-v')}")
BOOT = vmrun.Boot("tests/vm_sge/test_ssh_systemd.py and test_ssh_preload.py on systemd's "
                  "legacy cgroup v1",
                  GUEST_COMMAND, timeout=1500, mem_mib=6144, append=LEGACY_V1)

pytestmark = pytest.mark.vm


def test_on_systemd_cgroup_v1_a_job_owners_ssh_session_through_pam_systemd_is_in_the_job(
        figures: list[str]) -> None:
    result = vmrun.result(BOOT)
    vmrun.assert_all_passed(result)
    # -v against guest_pytest's -q: pytest names each file it ran, with a dot a test
    for file in FILES:
        assert re.search(rf"^{re.escape(file)} \.+", result.stdout, re.MULTILINE), result.output
    figures.append(result.figure())
