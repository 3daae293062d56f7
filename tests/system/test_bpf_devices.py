"""geco.cgroup._bpfdev against this machine's kernel: a BPF device program on a cgroup2.

This host runs cgroup v1 with a cgroup2 at ``/sys/fs/cgroup/unified`` (hardly any
controllers, but device programs attach there and the kernel enforces them). Each test
makes its own ``geco-test-bpfdev-<pid>`` there and removes it afterwards (killing only
the child it started), plus device nodes made with mknod in a temporary directory:
``c 195:0``, ``c 195:1``, ``c 195:255`` (NVIDIA's major) and ``b 195:1``. No driver
serves major 195 here, so open(2) fails either way, and the errno is the kernel's
verdict: ENXIO when the cgroup allows the device (the open reached the missing
driver), EPERM when the program refused it.

The child is a small Python script started by the test and moved into the cgroup
(its pid written to ``cgroup.procs``) before it reads one byte on stdin and does
anything; it reports what it saw as JSON, its own cgroup included.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from geco.cgroup._bpfdev import _program, deny_devices
from geco.errors import CgroupError
from geco.node import gpus
from tests.cgroup_testkit import MIG_MINORS, free_char_major

UNIFIED = Path("/sys/fs/cgroup/unified")
NAME = f"geco-test-bpfdev-{os.getpid()}"
# a major no driver here holds, for NVIDIA's MIG caps (whose major is dynamic)
CAPS = free_char_major()
NODES = {"c195:0": (stat.S_IFCHR, 195, 0), "c195:1": (stat.S_IFCHR, 195, 1),
         "c195:255": (stat.S_IFCHR, 195, 255), "b195:1": (stat.S_IFBLK, 195, 1),
         **{f"cap{minor}": (stat.S_IFCHR, CAPS, minor) for minor in (2, 3, 138, 139)}}
# What a cgroup that denies nothing shows: every major-195 node reaches the missing driver.
ALLOWED = {"c195:0": "ENXIO", "c195:1": "ENXIO", "c195:255": "ENXIO", "b195:1": "ENXIO",
           "cap2": "ENXIO", "cap3": "ENXIO", "cap138": "ENXIO", "cap139": "ENXIO",
           "/dev/null": "ok", "/dev/zero": "ok", "/dev/urandom": "ok", "pty": "ok",
           "mknod c195:0": "ok", "mknod c195:1": "ok"}

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(not (UNIFIED / "cgroup.controllers").exists(),
                                 reason=f"no cgroup2 mounted at {UNIFIED}")]

# argv: the nodes directory. Waits for one byte on stdin (sent once it is in the cgroup).
CHILD = r"""
import errno, json, os, pty, stat, sys, tempfile
if sys.stdin.read(1) != "x":  # not moved into the cgroup: test nothing
    sys.exit(1)
nodes = sys.argv[1]
seen = {"cgroup": open("/proc/self/cgroup").read()}

def attempt(what, fn):
    try:
        fn()
        seen[what] = "ok"
    except OSError as exc:
        seen[what] = errno.errorcode[exc.errno]

def open_close(path, size=0):
    fd = os.open(path, os.O_RDWR)
    try:
        if size and len(os.read(fd, size)) != size:
            raise OSError(errno.EIO, "short read")
    finally:
        os.close(fd)

for name in sorted(os.listdir(nodes)):
    attempt(name, lambda: open_close(os.path.join(nodes, name)))
attempt("/dev/null", lambda: open_close("/dev/null"))
attempt("/dev/zero", lambda: open_close("/dev/zero", 16))
attempt("/dev/urandom", lambda: open_close("/dev/urandom", 16))

def a_pty():
    main, sub = os.openpty()
    os.write(sub, b"hi\n")
    got = os.read(main, 16)
    os.close(main)
    os.close(sub)
    if b"hi" not in got:
        raise OSError(errno.EIO, "pty echo")
attempt("pty", a_pty)
scratch = tempfile.mkdtemp()
for minor in (0, 1):
    attempt(f"mknod c195:{minor}", lambda: os.mknod(os.path.join(scratch, f"n{minor}"),
                                                   0o600 | stat.S_IFCHR, os.makedev(195, minor)))
    if os.path.exists(os.path.join(scratch, f"n{minor}")):
        os.unlink(os.path.join(scratch, f"n{minor}"))
os.rmdir(scratch)
print(json.dumps(seen))
"""


def remove(path: Path, children: list[subprocess.Popen[str]]) -> None:
    """Kill and reap the children this test started, then rmdir the cgroup (EBUSY for the
    moment an exited child takes to leave it)."""
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(30)
    children.clear()
    deadline = time.monotonic() + 10
    while path.exists():
        try:
            path.rmdir()
        except FileNotFoundError:
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class Cgroup:
    """The test's own cgroup2 directory and the children it started in it."""

    def __init__(self, path: Path, nodes: Path) -> None:
        self.path = path
        self.nodes = nodes
        self.children: list[subprocess.Popen[str]] = []

    def deny(self, devices: Sequence[tuple[str, int, int | None]]) -> None:
        """deny_devices, skipping the test where the kernel has no device programs."""
        try:
            deny_devices(self.path, devices)
        except CgroupError as exc:
            if exc.fields.get("errno") == "EINVAL" and "no BPF cgroup device" in exc.msg:
                pytest.skip(f"the kernel refuses BPF_PROG_LOAD: {exc}")
            raise

    def observe(self) -> dict[str, str]:
        """What a child in the cgroup sees: "ok" or the errno name, per device."""
        child = subprocess.Popen([sys.executable, "-I", "-c", CHILD, str(self.nodes)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 cwd="/")
        self.children.append(child)
        (self.path / "cgroup.procs").write_text(f"{child.pid}\n")
        out, _ = child.communicate("x", timeout=60)
        assert child.returncode == 0, out
        seen: dict[str, str] = json.loads(out)
        assert f"0::/{NAME}\n" in seen.pop("cgroup")  # it ran in the test's cgroup
        return seen

    def recreate(self) -> None:
        remove(self.path, self.children)
        self.path.mkdir()


@pytest.fixture
def cg(tmp_path: Path) -> Iterator[Cgroup]:
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    for name, (kind, major, minor) in NODES.items():
        os.mknod(nodes / name, 0o600 | kind, os.makedev(major, minor))
    path = UNIFIED / NAME
    path.mkdir()
    cgroup = Cgroup(path, nodes)
    try:
        yield cgroup
    finally:
        remove(path, cgroup.children)


def test_given_nothing_attached_then_every_node_reaches_its_missing_driver(cg: Cgroup) -> None:
    assert cg.observe() == ALLOWED


def test_given_one_denied_gpu_then_only_it_is_refused_and_every_other_device_works(
        cg: Cgroup) -> None:
    cg.deny([("c", 195, 0)])

    assert cg.observe() == ALLOWED | {"c195:0": "EPERM", "mknod c195:0": "EPERM"}


def test_given_two_denied_gpus_then_both_are_refused_and_the_one_between_is_not(
        cg: Cgroup) -> None:
    cg.deny([("c", 195, 0), ("c", 195, 255)])

    assert cg.observe() == ALLOWED | {"c195:0": "EPERM", "c195:255": "EPERM",
                                      "mknod c195:0": "EPERM"}


def test_given_a_denied_block_device_then_the_char_device_of_the_same_numbers_works(
        cg: Cgroup) -> None:
    cg.deny([("b", 195, 1)])

    assert cg.observe() == ALLOWED | {"b195:1": "EPERM"}


def test_given_every_minor_of_a_major_denied_then_each_char_device_of_it_is_refused(
        cg: Cgroup) -> None:
    """A node where geco knows no GPU denies ``c 195:*`` (minor None): every GPU and
    nvidiactl, made later as well; the block device of that major and other majors work."""
    cg.deny([("c", 195, None)])

    assert cg.observe() == ALLOWED | {"c195:0": "EPERM", "c195:1": "EPERM",
                                      "c195:255": "EPERM", "mknod c195:0": "EPERM",
                                      "mknod c195:1": "EPERM"}


def test_given_a_run_of_minors_then_exactly_that_run_is_refused_by_one_rule(
        cg: Cgroup) -> None:
    """A GPU's MIG caps are a run of minors (135 per GPU): the program tests the run's two
    ends, one rule for the run and not one per minor (the verifier's time grows with the
    program), and the minors just outside it stay open."""
    run = [("c", CAPS, minor) for minor in range(3, 139)]
    assert len(_program(run)) == len(_program([("c", CAPS, 3)])) + 8  # one test more
    cg.deny(list(reversed(run)))

    assert cg.observe() == ALLOWED | {"cap3": "EPERM", "cap138": "EPERM"}


def test_given_what_geco_denies_a_job_granted_one_gpu_of_a_mig_node_then_it_keeps_its_caps(
        cg: Cgroup, tmp_path: Path) -> None:
    """geco.node.gpus.denied for a job granted GPU id 0 (c 195:1; id 1 is c 195:0) with the MIG
    caps table (cgroup_testkit.MIG_MINORS, its major a free one): the other GPU, its caps
    (gpu0/...: minor 0 is id 1's), config and monitor are refused; its own caps are not."""
    proc = tmp_path / "proc"
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "devices").write_text(f"Character devices:\n{CAPS} nvidia-caps\n")
    (proc / "driver/nvidia-caps/mig-minors").write_text(
        "".join(f"{name} {minor}\n" for name, minor in MIG_MINORS.items()))
    table = gpus.node_table([str(cg.nodes / "c195:1"), str(cg.nodes / "c195:0")])

    cg.deny(gpus.denied(table, [0], gpus.mig_caps(proc)))

    assert cg.observe() == ALLOWED | {"c195:0": "EPERM", "mknod c195:0": "EPERM",
                                      "cap2": "EPERM", "cap3": "EPERM"}


def test_given_an_empty_list_then_nothing_is_attached(cg: Cgroup) -> None:
    cg.deny([])

    assert cg.observe() == ALLOWED


def test_given_two_programs_on_one_cgroup_then_both_are_in_force(cg: Cgroup) -> None:
    """BPF_F_ALLOW_MULTI: the second attach adds a program, it replaces none."""
    cg.deny([("c", 195, 0)])
    cg.deny([("c", 195, 1)])

    assert cg.observe() == ALLOWED | {"c195:0": "EPERM", "c195:1": "EPERM",
                                      "mknod c195:0": "EPERM", "mknod c195:1": "EPERM"}


def test_given_a_removed_cgroup_when_one_of_the_same_name_is_made_then_nothing_is_denied(
        cg: Cgroup) -> None:
    cg.deny([("c", 195, 0)])
    assert cg.observe()["c195:0"] == "EPERM"

    cg.recreate()

    assert cg.observe() == ALLOWED


def test_given_no_such_cgroup_then_a_cgroup_error_names_it_and_enoent(cg: Cgroup) -> None:
    missing = cg.path / "missing"

    with pytest.raises(CgroupError) as caught:
        deny_devices(missing, [("c", 195, 0)])

    assert caught.value.fields == {"errno": "ENOENT", "path": missing}
    assert str(missing) in str(caught.value)
    assert "ENOENT" in str(caught.value)


def test_given_a_directory_not_on_cgroup2_then_the_attach_is_refused_with_ebadf(
        tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match=r"cannot attach.*not a cgroup2") as caught:
        deny_devices(tmp_path, [("c", 195, 0)])

    assert caught.value.fields == {"errno": "EBADF", "path": tmp_path}


def test_given_a_bad_device_type_then_value_error_before_any_syscall(cg: Cgroup) -> None:
    with pytest.raises(ValueError, match="not a device"):
        deny_devices(cg.path, [("x", 195, 0)])
