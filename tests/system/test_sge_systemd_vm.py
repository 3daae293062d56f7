"""A real Grid Engine with geco on the modern node (tests/vm_sge), inside the QEMU machine.

One boot (:mod:`vmrun`) for the whole story: the guest copies this repository
onto its own disk and installs geco as an admin would, the package the host built
(``apt-get install ./build/deb/geco_<version>_amd64.deb``; its Depends are in the
image, no compiler, no PyPI), whose postinst enables and starts gecod.service (with
geco-jobs.service) and whose drop-in gives sge_execd the preload.
Then pytest runs ``tests/vm_sge`` there, whose fixtures bring up Grid Engine as
systemd units and submit real jobs, and the test of the PAM half of the ssh matrix
(``test_ssh_live``, which the host runs whole) whose outcome logind acts on (a session
ends with its job), with pam_systemd in the stack and gecod as a unit; its preload
half, ``test_ssh_preload``, runs in the legacy v1 boot of test_ssh_v1_systemd_vm. Then
the package's own story (tests/vm_sge/test_package_lifecycle.py: upgrade, removal
and purge with jobs running). Last, the guest prints its prolog and epilog
times from its journal; this test prints them beside this host's (the hooks the
integration tests of this run journaled) under "figures".

Cost: the image (shared with the other VM tests, ~3 min once, cached in
/var/cache/geco-vm), a boot (~25 s), the install and the jobs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

from tests.system import vmrun

BENCH = "bench.bench_hooks"  # run as a module from the checkout, as bench/run does
# the story, then the one of the PAM half of the ssh matrix (the host runs it all) whose
# outcome logind acts on: that a session ends with its job though logind holds it in a
# session scope (here with the README's stack and gecod as a unit). Where a session lands
# with pam_systemd in the stack, test_ssh_systemd shows; what a session inside its job
# sees (cores, memory, scp, sftp, ~/.ssh/rc) does not depend on it, and the host shows
# it; who is let in is decided before pam_systemd runs: that the host shows once. The
# preload half runs in the legacy v1 boot (test_ssh_v1_systemd_vm), the shorter of the two
# that run side by side.
# Then the package's own story (upgrade, removal and purge with jobs running),
# which leaves the node without geco and then installs it afresh. Last, the node's
# poweroff with gecod and a job running (issue 37): systemd's account of gecod's stop.
SSH_LIVE = "tests/integration/test_ssh_live.py"
GUEST_TESTS = " ".join((
    "tests/vm_sge/test_sge_systemd.py", "tests/vm_sge/test_ssh_systemd.py",
    "tests/vm_sge/test_strays_systemd.py", "tests/vm_sge/test_private_tmp_v2.py",
    f"{SSH_LIVE}::test_a_session_ends_with_its_job_counts_in_its_accounting_and_the_next_"
    "login_is_refused",
    "tests/vm_sge/test_package_lifecycle.py",
    # armed last, with gecod installed afresh: a witness of gecod's stop at the poweroff
    "tests/vm_sge/test_loose_ends_shutdown_vm.py"))
GUEST_COMMAND = (
    f"set -e; {vmrun.COPY_TO_GUEST}; cd /root/geco; since=$(date +%s); "
    f"t0=$(date +%s%N); {vmrun.QMASTER_EARLY}; {vmrun.INSTALL_PACKAGE}; "
    "echo \"guest: package: apt-get install ./build/deb/geco_*.deb on the fresh guest (Depends "
    "in the image): $(( ($(date +%s%N) - t0) / 1000000 )) ms\"; rc=0; "
    f"{vmrun.GUEST_SGE} "
    f"{vmrun.guest_pytest(GUEST_TESTS, 'python3', '--durations=12')} "
    "|| rc=$?; "
    # a failure shows what gecod said meanwhile (the guest's journal goes with the guest)
    "[ $rc = 0 ] || journalctl -u gecod.service --since \"@$since\" -n 200 --no-pager "
    "-o short-precise | sed 's/^/guest gecod: /'; "
    f"python3 -m {BENCH} --since \"$since\" | sed 's/^/guest: /'; "
    "sed 's/^/guest: /' /root/geco-figures.txt 2>/dev/null || true; "
    # the node's own poweroff, every unit stopped in order: the witness says how gecod's went
    f"{vmrun.ORDERLY_POWEROFF}")

# 6 GiB: Grid Engine's h_vmem default (2G a slot) must fit twice in the host's capacity;
# ~1,530 s beside the host's suite here (the suite's longest part): the limit leaves room
# for a slower host
BOOT = vmrun.Boot("tests/vm_sge (Grid Engine with geco's systemd units)", GUEST_COMMAND,
                  timeout=2100, mem_mib=6144)

pytestmark = pytest.mark.vm


def test_given_the_qemu_machine_when_grid_engine_runs_geco_under_systemd_then_jobs_are_contained(
        journal: Any, figures: list[str]) -> None:
    result = vmrun.result(BOOT)
    vmrun.assert_all_passed(result)
    figures.append(result.figure())
    figures.extend(f"in the VM: {line.removeprefix('guest: ')}"
                   for line in result.stdout.splitlines() if line.startswith("guest: "))
    # where the boot's time goes (it is the longest of the suite's): the slowest guest tests
    figures.extend(f"in the VM, slowest: {line}" for line in result.stdout.splitlines()
                   if re.match(r"\d+\.\d+s (call|setup|teardown) ", line))
    figures.append(_gecod_at_poweroff(result))
    host = subprocess.run([sys.executable, "-m", BENCH, "--since", str(journal.since)],
                          cwd=vmrun.REPO, capture_output=True, text=True, check=False)
    figures.extend(f"this host: {line}" for line in host.stdout.splitlines())


def _gecod_at_poweroff(result: vmrun.VmRun) -> str:
    """``systemctl poweroff`` with gecod running and a job contained: systemd stopped
    gecod cleanly (no stop timeout, no SIGKILL: exit 0), by the node's shutdown path; the
    figure says how long it took (the issue's bound: 5 s; systemd's: TimeoutStopSec)."""
    stopped = vmrun.unit_stopped(result, "gecod.service")
    said = [line for line in result.stdout.splitlines()
            if line.startswith("guest shutdown: journal: ")]
    assert stopped.get("Result") == "success", (stopped, said)
    assert (stopped.get("ExecMainCode"), stopped.get("ExecMainStatus")) == ("1", "0"), stopped
    assert any("the node is shutting down" in line for line in said), said
    took = (int(stopped["InactiveEnterTimestampMonotonic"])
            - int(stopped["ActiveExitTimestampMonotonic"])) / 1e6
    return (f"in the VM: systemctl poweroff with gecod running and a job contained: gecod "
            f"stopped in {took:.2f} s (systemd: Result={stopped['Result']}, exit "
            f"{stopped['ExecMainStatus']})")
