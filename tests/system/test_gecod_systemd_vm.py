"""Run gecod as a real systemd service (tests/vm_systemd) inside the QEMU machine.

One boot for the whole story (:mod:`vmrun`): the guest copies this repository
onto its own disk (9p is slow for many small files, and gecod's
``ProtectHome=read-only`` must not meet the share), builds geco's hwloc
bridge there against the guest's libhwloc, and runs pytest on
``tests/vm_systemd``, which installs ``conf/gecod.service`` and
``conf/geco-jobs.service`` and drives them with systemctl. Nothing is written
back to the share.

Cost: the first run builds the image with the VM tests' packages (~2-3 min,
cached in /var/cache/geco-vm); then a boot (~25 s on an idle host) and the
story itself, which waits out 1.5 watchdog periods (45 s) under emulation.
"""

from __future__ import annotations

import pytest
import vmrun

# --noconftest: tests/conftest.py serves the host suite (Grid Engine, journald)
GUEST_COMMAND = (f"set -e; {vmrun.COPY_TO_GUEST}; cd /root/geco; "
                 "python3 -m geco._hwloc_build >/dev/null; "
                 f"{vmrun.guest_pytest('tests/vm_systemd')}")

pytestmark = pytest.mark.vm


def test_given_the_qemu_machine_when_gecod_runs_under_systemd_then_the_whole_story_passes(
        figures: list[str]) -> None:
    result = vmrun.run(GUEST_COMMAND)
    vmrun.assert_all_passed(result)
    figures.append(result.figure("tests/vm_systemd (gecod as a service)"))
