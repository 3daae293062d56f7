"""Run the cgroup v2 tests (tests/vm) inside the QEMU machine: systemd as PID 1, pure cgroup v2.

This host has a hybrid v1 layout, so cpuset and memory cannot appear on a
cgroup2 here; only a guest kernel can show them. ``run-in-vm.sh`` (from the
shared directory: ``$GECO_SHARED`` or ``<repo>/../shared``) boots a
throw-away Debian VM with python3-pytest baked into its cached image, shares
this repository read-mostly at its working directory, and runs pytest there.

The guest writes nothing to the share: no bytecode (PYTHONDONTWRITEBYTECODE)
and no pytest cache (``-p no:cacheprovider``); the run-in-vm exit status and
pytest's closing line decide, and any failure shows the guest's output.

Cost: the first run builds the image (~2 min, cached in /var/cache/run-in-vm);
each run boots in ~25 s under software emulation.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# --noconftest: tests/conftest.py serves the host suite (Grid Engine, journald)
# and may import what the guest's bare python3 lacks; tests/vm needs none of it
GUEST_COMMAND = ("PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider "
                 "--noconftest -o addopts= -rfEs tests/vm")
# image build (~2 min) + boot (~25 s) + the tests at ~8x emulation slowdown, with room
TIMEOUT = 1800

pytestmark = pytest.mark.vm


def runner() -> Path:
    shared = Path(os.environ.get("GECO_SHARED") or REPO.parent / "shared")
    return shared / "vm" / "run-in-vm.sh"


def summary(output: str) -> dict[str, int]:
    """The counts of pytest's closing line (``3 passed, 1 skipped in 4.20s``); {} if none."""
    for line in reversed(output.splitlines()):
        if re.search(r"\b(passed|failed|error|errors|skipped|no tests ran)\b.* in [\d.]+s", line):
            return {word: int(n) for n, word in
                    re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", line)}
    return {}


def test_given_the_qemu_machine_when_tests_vm_run_inside_then_all_of_them_pass() -> None:
    if os.geteuid() != 0:
        pytest.skip("run-in-vm.sh needs root (debootstrap, chroot, 9p passthrough)")
    script = runner()
    if not script.is_file():
        pytest.skip(f"no VM runner at {script}; set GECO_SHARED to the shared/ directory")
    env = dict(os.environ)
    extra = env.get("VM_EXTRA_PACKAGES", "").split()
    if "python3-pytest" not in extra:
        env["VM_EXTRA_PACKAGES"] = " ".join([*extra, "python3-pytest"])
    proc = subprocess.run([str(script), str(REPO), GUEST_COMMAND], env=env, text=True,
                          capture_output=True, timeout=TIMEOUT, check=False)
    output = f"--- guest stdout:\n{proc.stdout}\n--- stderr:\n{proc.stderr}"
    if proc.returncode == 126 and "apt-get install" in proc.stderr:
        pytest.skip("no qemu-system-x86_64 here and it cannot be installed: "
                    + proc.stderr.strip().splitlines()[-1])
    counts = summary(proc.stdout)
    assert proc.returncode == 0, f"run-in-vm.sh exited {proc.returncode}\n{output}"
    assert counts.get("passed", 0) > 0, f"no pytest summary from the guest\n{output}"
    # a skip inside the VM means the machine is not what these tests need
    assert set(counts) == {"passed"}, f"guest summary {counts}\n{output}"
