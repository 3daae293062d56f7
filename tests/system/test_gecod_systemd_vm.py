"""The cgroup v2 backend (tests/vm) and gecod as a real systemd service (tests/vm_systemd),
inside the QEMU machine.

This host has a hybrid v1 layout, so cpuset and memory cannot appear on a
cgroup2 here; only a guest kernel can show them. One boot for both (:mod:`vmrun`):
the guest copies this repository onto its own disk (9p is slow for many small
files, and gecod's ``ProtectHome=read-only`` must not meet the share), takes geco's
two cffi extensions from the package the host built (``build/deb``, not installed: these
tests install geco's units their own way), and runs pytest on
``tests/vm`` (the backend against the kernel, each test below a cgroup of its
own) and then ``tests/vm_systemd``, which installs ``conf/gecod.service`` and
``conf/geco-jobs.service`` and drives them with systemctl. Nothing is written
back to the share.

Cost: the first run builds the image with the VM tests' packages (~2-3 min,
cached in /var/cache/geco-vm); then a boot (~25 s on an idle host) and the
story itself, which waits out 1.5 watchdog periods (45 s) under emulation.
"""

from __future__ import annotations

import pytest

from tests.system import vmrun

# --noconftest: tests/conftest.py serves the host suite (Grid Engine, journald) and may
# import what the guest's bare python3 lacks; tests/vm first: tests/vm_systemd rewrites
# /etc/geco and the units
GUEST_COMMAND = (f"set -e; {vmrun.COPY_TO_GUEST}; cd /root/geco; "
                 f"{vmrun.EXTENSIONS}; "
                 f"{vmrun.guest_pytest('tests/vm tests/vm_systemd')}")

BOOT = vmrun.Boot("tests/vm + tests/vm_systemd (the v2 backend, gecod as a service)",
                  GUEST_COMMAND)

pytestmark = pytest.mark.vm


def test_given_the_qemu_machine_when_the_v2_backend_and_gecod_under_systemd_run_then_all_pass(
        figures: list[str]) -> None:
    result = vmrun.result(BOOT)
    vmrun.assert_all_passed(result)
    figures.append(result.figure())
