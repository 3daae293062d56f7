"""Boot the QEMU test machine and judge the pytest run inside it (shared by the ``*_vm`` tests).

``integration/vm/run-in-vm.sh`` boots a throw-away Debian VM with systemd as
PID 1 on a pure cgroup v2, shares this repository at its working directory,
runs one command as root and exits with its status. Every VM test asks for the
same Debian packages (:func:`packages`): the cached image is keyed by that
exact list, so they all share one image (built once, ~3 min, in
``/var/cache/geco-vm``).

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

__all__ = ["COPY_TO_GUEST", "MASK", "PRESEED", "REPO", "RUNNER", "TIMEOUT", "VmRun",
           "assert_all_passed", "guest_pytest", "packages", "run", "summary"]

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "integration" / "vm" / "run-in-vm.sh"
# What the guests need beyond an execution host's packages (scripts/install.sh) and Grid
# Engine's (integration/sge/setup.sh): geco's Python dependencies from Debian, so the
# guest's venv (GECO_SYSTEM_PACKAGES=1) needs no PyPI under emulation, and pytest.
GUEST_PYTHON = ("libc6-dev", "python3-cffi", "python3-lxml", "python3-nacl", "python3-pip",
                "python3-psutil", "python3-pytest", "python3-setuptools", "python3-systemd",
                "python3-wheel")
# Grid Engine in the image is configured in the guest by integration/sge/setup.sh, for
# the guest's own host name; not for the build host's by the package's postinst.
PRESEED = "gridengine-common shared/gridengineconfig boolean false"
# setup.sh runs Grid Engine as units of its own; Debian's init scripts would start an
# execd at every boot (holding its port, ~25 s of boot under emulation)
MASK = "gridengine-master.service gridengine-exec.service"
# The guest's own copy of the share, minus what must not or need not travel: git history,
# caches, and build products of the host (the hwloc bridge is built against the guest's
# libhwloc). 9p is slow for many small files, and nothing is written back to the share.
COPY_TO_GUEST = ("rm -rf /root/geco && mkdir /root/geco && tar -C \"$RUNINVM_MOUNT\" "
                 "--exclude=./.git --exclude=__pycache__ --exclude='*.so' --exclude='*.o' "
                 "--exclude=./.mypy_cache --exclude=./.ruff_cache --exclude=./.hypothesis "
                 "--exclude=./.pytest_cache -cf - . | tar -C /root/geco -xf -")
# the VM's own time limit (run-in-vm's VM_TIMEOUT, from qemu's start): boot (~25 s, ~45 s
# on a slower host) + the tests at ~8x emulation slowdown, with room. When it runs out,
# run-in-vm stops qemu and prints the console's last lines; what the guest printed so far
# is in the result, so a stuck guest test shows where it stuck.
TIMEOUT = 900
# the image build (~3 min here, once) comes before qemu starts: the host-side backstop
# allows for it on top of the VM's limit
IMAGE_BUILD_ALLOWANCE = 900


def guest_pytest(target: str, python: str = "python3", options: str = "--noconftest") -> str:
    """pytest as every guest runs it, for one ``bash -c`` string.

    Nothing is written to the share (no bytecode, no cache); output is unbuffered, so a run
    cut off by the time limit shows how far it got; a test stuck for 4 minutes dumps every
    thread's traceback (pytest's faulthandler_timeout) instead of hanging silently.
    """
    return (f"PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 {python} -m pytest -q "
            f"-p no:cacheprovider {options} -o addopts= -o faulthandler_timeout=240 "
            f"-rfEs {target}")


def packages() -> list[str]:
    """The image's Debian packages, sorted (one image key for every VM test)."""
    listed: set[str] = set(GUEST_PYTHON)
    for script in ("scripts/install.sh", "integration/sge/setup.sh"):
        out = subprocess.run(["bash", str(REPO / script), "--print-packages"], text=True,
                             capture_output=True, check=True).stdout
        listed.update(out.split())
    return sorted(listed)


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

    def figure(self, what: str) -> str:
        """One line for the run's figures: the whole call, boot and command, and the image
        build when this call made the image."""
        built = re.findall(r"run-in-vm: image built: (.*)", self.stderr)
        return (f"VM {what}: {self.seconds:.0f} s in all; {self.timings or 'no timings'}"
                + (f"; image built first: {built[-1]}" if built else ""))


def run(command: str, *, timeout: float = TIMEOUT, mem_mib: int = 2048) -> VmRun:
    """Boot the VM with :func:`packages`, run ``command`` (one ``bash -c`` string) as root.

    ``$VM_VERBOSE`` defaults to 1 so the boot and command times are reported. The
    machine needs root and qemu (``scripts/install.sh --test`` installs it); without
    them this fails, it never skips: the modern node would silently go untested.
    """
    assert os.geteuid() == 0, "run-in-vm.sh needs root (debootstrap, chroot, 9p passthrough)"
    env = dict(os.environ, VM_EXTRA_PACKAGES=" ".join(packages()), VM_PRESEED=PRESEED,
               VM_MASK=MASK, VM_MEM=str(mem_mib), VM_TIMEOUT=str(int(timeout)))
    env.setdefault("VM_VERBOSE", "1")
    started = time.monotonic()
    try:
        proc = subprocess.run([str(RUNNER), str(REPO), command], env=env, text=True,
                              capture_output=True, timeout=timeout + IMAGE_BUILD_ALLOWANCE,
                              check=False)
        result = VmRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
    except subprocess.TimeoutExpired as late:  # run-in-vm itself stuck: keep what it said
        result = VmRun(124, _text(late.stdout), _text(late.stderr) + "\nvmrun: run-in-vm.sh "
                       f"still running after {late.timeout:.0f} s, killed", late.timeout)
    # shown with -rP or -s: the figures the VM README asks CI to watch
    print(f"run-in-vm: {result.seconds:.1f} s in all; {result.timings or 'no timings'}")
    return result


def _text(partial: bytes | str | None) -> str:
    """What a timed-out subprocess had printed (bytes even in text mode)."""
    if isinstance(partial, bytes):
        return partial.decode(errors="replace")
    return partial or ""


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
