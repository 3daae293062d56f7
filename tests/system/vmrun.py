"""Boot the QEMU test machine and judge the pytest run inside it (shared by the ``*_vm`` tests).

``run-in-vm.sh`` (from the shared directory: ``$GECO_SHARED`` or
``<repo>/../shared``) boots a throw-away Debian VM with systemd as PID 1 on a
pure cgroup v2, shares this repository at its working directory, runs one
command as root and exits with its status. Every VM test asks for the same
Debian packages (:data:`PACKAGES`): the cached image is keyed by that exact
list, so they all share one image (built once, ~2-3 min).

A guest pytest run passes when run-in-vm exits 0 and pytest's closing line
counts only passed tests: a skip inside the VM means the machine is not what
the tests need, and that is a failure here.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PACKAGES", "REPO", "TIMEOUT", "VmRun", "assert_all_passed", "run", "runner",
           "summary"]

REPO = Path(__file__).resolve().parents[2]
# What the guests need: pytest; geco's imports (cffi, lxml, nacl, psutil, systemd);
# and a C toolchain with hwloc to build geco's hwloc bridge on the guest's own disk.
PACKAGES = ("gcc", "hwloc", "libc6-dev", "libhwloc-dev", "pkg-config", "python3-cffi",
            "python3-dev", "python3-lxml", "python3-nacl", "python3-psutil", "python3-pytest",
            "python3-systemd")
# image build (~2-3 min) + boot (~25 s, more on a busy host) + the tests at ~8x
# emulation slowdown, with room
TIMEOUT = 1800


def runner() -> Path:
    """Where run-in-vm.sh is: ``$GECO_SHARED/vm`` or ``<repo>/../shared/vm``."""
    shared = Path(os.environ.get("GECO_SHARED") or REPO.parent / "shared")
    return shared / "vm" / "run-in-vm.sh"


def summary(output: str) -> dict[str, int]:
    """The counts of pytest's closing line (``3 passed, 1 skipped in 4.20s``); {} if none."""
    for line in reversed(output.splitlines()):
        if re.search(r"\b(passed|failed|error|errors|skipped|no tests ran)\b.* in [\d.]+s", line):
            return {word: int(n) for n, word in
                    re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", line)}
    return {}


@dataclass(frozen=True, slots=True)
class VmRun:
    """One finished run-in-vm.sh call.

    Attributes
    ----------
    returncode: the guest command's exit status (124 timeout, 125 no result, 126 setup).
    stdout, stderr: what the guest command printed (run-in-vm's own lines are on stderr).
    seconds: wall time of the whole call, image build included.
    """

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        """Both streams, labelled, for assertion messages."""
        return f"--- guest stdout:\n{self.stdout}\n--- stderr:\n{self.stderr}"

    @property
    def timings(self) -> str:
        """run-in-vm's timing line (``boot(...)=21.3s command=...``), or "" when it printed none."""
        found = re.findall(r"run-in-vm: timings: (.*)", self.stderr)
        return found[-1] if found else ""


def run(command: str, *, timeout: float = TIMEOUT) -> VmRun:
    """Boot the VM with :data:`PACKAGES`, run ``command`` (one ``bash -c`` string) as root.

    ``$VM_EXTRA_PACKAGES`` adds packages (the image key then changes); ``$VM_VERBOSE``
    defaults to 1 so the boot and command times are reported.

    Skips (machine-level reasons) when not root, when there is no run-in-vm.sh, or
    when qemu is missing and cannot be installed.
    """
    if os.geteuid() != 0:
        pytest.skip("run-in-vm.sh needs root (debootstrap, chroot, 9p passthrough)")
    script = runner()
    if not script.is_file():
        pytest.skip(f"no VM runner at {script}; set GECO_SHARED to the shared/ directory")
    env = dict(os.environ)
    extra = set(env.get("VM_EXTRA_PACKAGES", "").split()) | set(PACKAGES)
    env["VM_EXTRA_PACKAGES"] = " ".join(sorted(extra))  # sorted: one image key per set
    env.setdefault("VM_VERBOSE", "1")
    started = time.monotonic()
    proc = subprocess.run([str(script), str(REPO), command], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)
    result = VmRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    if proc.returncode == 126 and "apt-get install" in proc.stderr:
        pytest.skip("no qemu-system-x86_64 here and it cannot be installed: "
                    + proc.stderr.strip().splitlines()[-1])
    # shown with -rP or -s: the figures the VM README asks CI to watch
    print(f"run-in-vm: {result.seconds:.1f} s in all; {result.timings or 'no timings'}")
    return result


def assert_all_passed(result: VmRun) -> dict[str, int]:
    """Fail unless the guest command exited 0 and its pytest ran tests that all passed.

    Returns
    -------
    The counts of the guest's pytest summary.
    """
    counts = summary(result.stdout)
    assert result.returncode == 0, f"run-in-vm.sh exited {result.returncode}\n{result.output}"
    assert counts.get("passed", 0) > 0, f"no pytest summary from the guest\n{result.output}"
    # a skip inside the VM means the machine is not what these tests need
    assert set(counts) == {"passed"}, f"guest summary {counts}\n{result.output}"
    return counts
