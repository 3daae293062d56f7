"""Run the cgroup v2 tests (tests/vm) inside the QEMU machine: systemd as PID 1, pure cgroup v2.

This host has a hybrid v1 layout, so cpuset and memory cannot appear on a
cgroup2 here; only a guest kernel can show them. :mod:`vmrun` boots a
throw-away Debian VM (``integration/vm/run-in-vm.sh``, with the VM tests' packages baked
into its cached image), shares this repository read-mostly at its working
directory, and runs pytest there.

The guest writes nothing to the share: no bytecode (PYTHONDONTWRITEBYTECODE)
and no pytest cache (``-p no:cacheprovider``); the run-in-vm exit status and
pytest's closing line decide, and any failure shows the guest's output.

Cost: the first run builds the image (~2-3 min, cached in /var/cache/geco-vm);
each run boots in ~25 s under software emulation.
"""

from __future__ import annotations

import pytest
import vmrun

# --noconftest: tests/conftest.py serves the host suite (Grid Engine, journald)
# and may import what the guest's bare python3 lacks; tests/vm needs none of it
GUEST_COMMAND = vmrun.guest_pytest("tests/vm")

pytestmark = pytest.mark.vm


def test_given_the_qemu_machine_when_tests_vm_run_inside_then_all_of_them_pass(
        figures: list[str]) -> None:
    # ~16 s of tests here; a stuck one shows its traceback after 4 min (vmrun.guest_pytest)
    result = vmrun.run(GUEST_COMMAND, timeout=600)
    vmrun.assert_all_passed(result)
    figures.append(result.figure("tests/vm (the v2 backend)"))
