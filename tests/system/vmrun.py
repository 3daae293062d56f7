"""Boot the QEMU test machine and judge the pytest run inside it (shared by the ``*_vm`` tests).

``integration/vm/run-in-vm.sh`` boots a throw-away Debian VM with systemd as
PID 1 on a pure cgroup v2, shares this repository at its working directory,
runs one command as root and exits with its status. Every VM test asks for the
same Debian packages (:func:`packages`): the cached image is keyed by that
exact list, so they all share one image (built once, ~3 min, in
``/var/cache/geco-vm``). Grid Engine is set up in that image while it is built
(:data:`PREPARE`), natively, for the guest's host name: the guests' own
``integration/sge/setup.sh`` then finds it configured, checks it and starts it.

Each boot's time on the session's clock goes to the run's critical path
(``tests/figurekit.py``, printed at the end of the run beside the host's tests).

A guest pytest run passes when run-in-vm exits 0 and pytest's closing line
counts only passed tests: a skip inside the VM means the machine is not what
the tests need, and that is a failure here.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests import figurekit
from tests.cleanslate import TEST_USER
from tests.servicekit import HOOK_LINES

__all__ = ["COPY_TO_GUEST", "EXTENSIONS", "GUEST_SGE", "INSTALL_PACKAGE", "MASK",
           "ORDERLY_POWEROFF", "PREPARE", "PRESEED", "QMASTER_EARLY", "REPO", "RUNNER",
           "SGE_MEM", "TIMEOUT", "Boot", "VmRun", "assert_all_passed", "guest_pytest",
           "packages", "result", "start", "stop", "summary", "unit_stopped"]

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "integration" / "vm" / "run-in-vm.sh"
# What the guests need beyond an execution host's packages (scripts/install.sh; the
# package's Depends are among them, so its apt install needs no network) and Grid
# Engine's (integration/sge/setup.sh): pytest. No compiler: the guests install the
# package the host built.
GUEST_PYTHON = ("python3-pytest",)
# Grid Engine in the image is configured in the guest by integration/sge/setup.sh, for
# the guest's own host name; not for the build host's by the package's postinst.
PRESEED = "gridengine-common shared/gridengineconfig boolean false"
# setup.sh runs Grid Engine as units of its own; Debian's init scripts would start an
# execd at every boot (holding its port, ~25 s of boot under emulation)
MASK = "gridengine-master.service gridengine-exec.service"
# Grid Engine set up in the image as the guests' sge fixture asks for it (its test user,
# geco's starter only: GECO_TEST_HOOKS=starter), by the same setup.sh, natively, at the
# image build (run-in-vm's VM_PREPARE, with the guest's name and address), then stopped:
# in the guest setup.sh finds its spool, configuration, user and units there, made with
# the same settings, and only starts the daemons (every qconf is a ~3 s round trip there:
# checking each object took ~90 s of a boot beside the suite; now ~30 s in all). The
# scripts (and what setup.sh sources) are part of the image key: a change builds a new image.
SGE_SCRIPTS = ("integration/sge/setup.sh", "integration/sge/env.sh", "integration/sge/teardown.sh",
               "scripts/packages.sh")
# Grid Engine's h_vmem/m_mem_free capacity in the guests, the same at PREPARE and in the
# guest (the guests' sge fixtures pass SGE_MEM on to setup.sh): its default is MemTotal,
# which in the build's chroot is this host's, not the guest's, and a capacity that differs
# has the guest's setup.sh rewrite the host (~50 s of emulated qconf a boot). Grid Engine's
# h_vmem default (2G a slot) fits twice.
SGE_MEM = "5000M"
# how the guests run Grid Engine: as prepared, left running at the end (the guest is
# thrown away)
GUEST_SGE = f"GECO_KEEP_SGE=1 GECO_TEST_HOOKS=starter SGE_MEM={SGE_MEM}"
# a guest command's first step where Grid Engine runs: its qmaster starts (~20 s beside
# the suite) while geco's package installs; setup.sh then starts execd, with the preload
QMASTER_EARLY = "systemctl start --no-block sgemaster.service"
PREPARE = (f"SGE_TEST_USER={TEST_USER} GECO_STARTER={HOOK_LINES['starter']} "
           f"SGE_MEM={SGE_MEM} SGE_UNIT_FILES=yes "
           "bash /tmp/runinvm-prepare/integration/sge/setup.sh "
           "&& bash /tmp/runinvm-prepare/integration/sge/teardown.sh")
# The guest's own copy of the share, minus what must not or need not travel: git history,
# caches, and build products of the host, but for geco's package, which the host's
# scripts/install.sh built from these very sources for the same Debian 12 (build/deb).
# 9p is slow for many small files, and nothing is written back to the share.
COPY_TO_GUEST = ("rm -rf /root/geco && mkdir /root/geco && tar -C \"$RUNINVM_MOUNT\" "
                 "--exclude=./.git --exclude=__pycache__ --exclude='*.so' --exclude='*.o' "
                 "--exclude=./.mypy_cache --exclude=./.ruff_cache --exclude=./.hypothesis "
                 "--exclude=./.pytest_cache --exclude=./build --exclude=./preload/build "
                 "-cf - . | tar -C /root/geco -xf - && mkdir -p /root/geco/build && "
                 "tar -C \"$RUNINVM_MOUNT\" -cf - ./build/deb | tar -C /root/geco -xf -")
# geco as a node gets it: its package, installed with apt (the image holds its Depends);
# then the package's cffi extensions in the guest's checkout, which the tests import, and
# the preload's wait for gecod fitted to the emulated CPU (tests/packagekit.py)
INSTALL_PACKAGE = ("apt-get install -y -q --no-install-recommends ./build/deb/geco_*.deb "
                   ">/tmp/apt-geco.log 2>&1 || { cat /tmp/apt-geco.log; exit 1; }; "
                   "cp /usr/lib/python3/dist-packages/geco/_*_cffi*.so geco/; "
                   "python3 -c 'from tests import packagekit; packagekit.fit_to_emulated_cpu()'")
# the extensions alone, for a guest that runs geco from the checkout (no units installed)
EXTENSIONS = ("dpkg-deb -x build/deb/geco_*.deb /tmp/geco-deb && "
              "cp /tmp/geco-deb/usr/lib/python3/dist-packages/geco/_*_cffi*.so geco/")
# A guest command's last act instead of `exit $rc`: the node's own poweroff, every unit
# stopped in order (run-in-vm's guest half powers off with --force --force, which stops
# none). The guest half's result first, where and as it writes it (its control share,
# /run/runinvm): its bash is stopped with the rest, and never gets to write it.
ORDERLY_POWEROFF = ("echo $rc > /run/runinvm/rc.tmp && mv /run/runinvm/rc.tmp /run/runinvm/rc; "
                    "sync; systemctl poweroff; sleep 900; exit $rc")
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

    Nothing is written to the share: bytecode goes to the guest's own /var/tmp, compiled
    once for every Python process the tests start, and no cache. Output is unbuffered, so a
    run cut off by the time limit shows how far it got; a test stuck for 10 minutes dumps every
    thread's traceback (pytest's faulthandler_timeout) instead of hanging silently. The
    limit counts a test's fixtures too: Grid Engine's set-up plus one ssh test took 280 s on
    CI's slower host, and the dump of a running thread can itself crash Python 3.11 (a
    segfault ended that run), so it fires only at 10 minutes, where a test is stuck.
    """
    return (f"PYTHONPYCACHEPREFIX=/var/tmp/geco-pycache PYTHONUNBUFFERED=1 {python} -m pytest "
            f"-q -p no:cacheprovider {options} -o addopts= -o faulthandler_timeout=600 "
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
    name: the boot's (:attr:`Boot.name`).
    returncode: the guest command's exit status (124 timeout, 125 no result, 126 setup).
    stdout, stderr: what the guest command printed (run-in-vm's own lines are on stderr).
    seconds: wall time of the whole call, image build included.
    """

    name: str
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

    @property
    def image_built(self) -> str:
        """run-in-vm's line on the image this call built first (``152.3 s (debootstrap=...``),
        or "" when the image was there."""
        found = re.findall(r"run-in-vm: image built: (.*)", self.stderr)
        return found[-1] if found else ""

    def figure(self) -> str:
        """One line for the run's figures: the whole call, boot and command, and the image
        build when this call made the image."""
        return (f"VM {self.name}: {self.seconds:.0f} s in all; {self.timings or 'no timings'}"
                + (f"; image built first: {self.image_built}" if self.image_built else ""))


@dataclass(frozen=True, slots=True)
class Boot:
    """One VM run a test module asks for (its ``BOOT``): the guest command and the machine.

    ``name`` says what it runs (figures, critical path), ``timeout`` is the VM's own limit
    (run-in-vm's VM_TIMEOUT), ``mem_mib`` its RAM, ``append`` words for the guest kernel's
    command line (run-in-vm's VM_APPEND).
    """

    name: str
    command: str
    timeout: float = TIMEOUT
    mem_mib: int = 2048
    append: str = ""


# Boots run behind the host suite, from the moment the session has collected them
# (conftest's pytest_collection_finish calls start()): the host tests mostly wait on Grid
# Engine and leave the CPUs idle, the VM's emulated CPUs are busy throughout. Two at a time:
# the longest boot alone would otherwise be followed by the others, the suite waiting for
# them at its end. Niced to the lowest priority, so a host test that wants a CPU gets it:
# each VM's vCPUs are threads of their own, and at nice 10 two VMs' four took ~1/5 of a
# CPU a host test waited for (CFS weights 110 against 1,024 each); at 19, ~1/30.
# run-in-vm's limits are wall time, with room for that.
_NICE = 19
_PARALLEL = 2
_queue: list[Boot] = []
_started: dict[Boot, threading.Event] = {}
_results: dict[Boot, VmRun] = {}
_procs: dict[Boot, subprocess.Popen[str]] = {}
_lock = threading.Lock()
_workers: list[threading.Thread] = []
_over: list[bool] = []  # stop() was called: no boot starts after it


def start(boot: Boot) -> None:
    """Queue ``boot`` to run in the background (once; boots start in the order queued)."""
    with _lock:
        if boot in _started:
            return
        _started[boot] = threading.Event()
        _queue.append(boot)
        if len(_workers) < _PARALLEL:
            worker = threading.Thread(target=_run_queue, name="vmrun", daemon=True)
            _workers.append(worker)
            worker.start()


def result(boot: Boot) -> VmRun:
    """The finished run of ``boot`` (started now if nobody started it), waiting for it."""
    start(boot)
    _started[boot].wait()
    done = _results[boot]
    # shown with -rP or -s: the figures the VM README asks CI to watch
    print(f"run-in-vm: {done.seconds:.1f} s in all; {done.timings or 'no timings'}")
    return done


def stop() -> None:
    """End the boot under way and drop the queued ones (the session is over: an interrupted
    or -x run must not leave qemu behind). run-in-vm stops its qemu on SIGTERM."""
    with _lock:
        _over.append(True)
        _queue.clear()
        for proc in _procs.values():
            if proc.poll() is None:
                proc.terminate()


def _run_queue() -> None:
    while True:
        with _lock:
            if not _queue:  # leave under the lock: start() then sees one worker fewer
                _workers.remove(threading.current_thread())
                return
            boot = _queue.pop(0)
        try:
            _results[boot] = _run(boot)
        except Exception as error:  # the waiting test reports it
            _results[boot] = VmRun(boot.name, 125, "", f"vmrun: {error!r}", 0.0)
        _started[boot].set()


def _run(boot: Boot) -> VmRun:
    """Boot the VM with :func:`packages`, run ``boot.command`` (one ``bash -c`` string) as root.

    ``$VM_VERBOSE`` defaults to 1 so the boot and command times are reported. The
    machine needs root and qemu (``scripts/install.sh --test`` installs it); without
    them this fails, it never skips: the modern node would silently go untested.
    """
    if os.geteuid() != 0:
        return VmRun(boot.name, 126, "", "run-in-vm.sh needs root (debootstrap, chroot, 9p "
                     "passthrough)", 0.0)
    env = dict(os.environ, VM_EXTRA_PACKAGES=" ".join(packages()), VM_PRESEED=PRESEED,
               VM_MASK=MASK, VM_PREPARE=PREPARE, VM_PREPARE_FILES=" ".join(SGE_SCRIPTS),
               VM_PREPARE_ROOT=str(REPO),
               VM_MEM=str(boot.mem_mib), VM_TIMEOUT=str(int(boot.timeout)), VM_APPEND=boot.append)
    env.setdefault("VM_VERBOSE", "1")
    started = time.monotonic()
    with _lock:
        if _over:
            return VmRun(boot.name, 125, "", "vmrun: the session ended before this boot started",
                         0.0)
        proc = subprocess.Popen(["nice", "-n", str(_NICE), str(RUNNER), str(REPO), boot.command],
                                env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        _procs[boot] = proc
    try:
        stdout, stderr = proc.communicate(timeout=boot.timeout + IMAGE_BUILD_ALLOWANCE)
        done = VmRun(boot.name, proc.returncode, stdout, stderr, time.monotonic() - started)
    except subprocess.TimeoutExpired:  # run-in-vm itself stuck: keep what it said
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        done = VmRun(boot.name, 124, stdout, stderr + "\nvmrun: run-in-vm.sh still running "
                     f"after {boot.timeout + IMAGE_BUILD_ALLOWANCE:.0f} s, stopped",
                     time.monotonic() - started)
    _on_the_clock(done, started)
    return done


def _on_the_clock(done: VmRun, started: float) -> None:
    """The boot's span for the run's critical path, and the image build it began with."""
    built = re.match(r"([\d.]+) s \((.*?)\)", done.image_built)  # "154.1 s (debootstrap=...)"
    if built:
        figurekit.span("VM image build", started, started + float(built[1]), built[2])
    figurekit.span(f"VM {done.name}", started, started + done.seconds,
                   done.timings or f"exit {done.returncode}")


def unit_stopped(result: VmRun, unit: str) -> dict[str, str]:
    """What systemd said of ``unit``'s stop at the guest's poweroff: the ``systemctl show``
    properties a witness wrote (``guest shutdown: <unit> Result=success ...``; see
    tests/vm_sge/test_loose_ends_shutdown_vm.py); {} when no witness wrote any."""
    for line in result.stdout.splitlines():
        if line.startswith(f"guest shutdown: {unit} "):
            return dict(word.partition("=")[::2]
                        for word in line.removeprefix(f"guest shutdown: {unit} ").split())
    return {}


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
