"""Helpers shared by the cgroup backend tests on real kernels.

Used by ``tests/system/test_cgroup_v1.py`` (this host's v1 hierarchies), the
other tests/system modules that make job cgroups, and ``tests/vm/test_cgroup_v2.py``
(inside the QEMU machine). Standard library only (geco's own modules are imported
where a helper needs them), and no pytest fixtures: the guest runs tests/vm with a
bare python3 and pytest, ``--noconftest``, so this is a plain module those tests
import (``tests.cgroup_testkit``, the repo root on sys.path by pyproject's pytest
``pythonpath``); their fixtures are thin wrappers of the context
managers here. Nothing here uses the code under test: cleanup is plain
syscalls, so a broken backend cannot leak cgroups or processes.

A test forks a :class:`Child`, moves it into a job cgroup, then lets it run one
of the bodies below (``body(out_fd)``); what the child observes or survives is
then the cgroup's doing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import mmap
import os
import posixpath
import select
import signal
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from geco.cgroup import Hierarchy, V1Backend

__all__ = [
    "Child",
    "allocate",
    "cgroup_mounts",
    "count",
    "counter_body",
    "cpu_list",
    "eventually",
    "fork_forever",
    "forked_children",
    "free_char_major",
    "fresh_name",
    "gpu_story",
    "kill_from_inside_story",
    "mig_story",
    "mig_tree",
    "move_story",
    "open_verdicts",
    "parent_name",
    "parse_list",
    "raw_cleanup",
    "read",
    "reap",
    "report_affinity",
    "spin",
    "start_in",
    "usable_v1_hierarchies",
    "usage_after_kill",
    "v1_backend",
    "v1_fixtures",
    "verdicts",
]

_names = itertools.count()


class _Backend(Protocol):
    """What the helpers here need of a cgroup backend (V1Backend and V2Backend both)."""

    def add_pid(self, key: str, pid: int) -> None: ...

    def wait_empty(self, key: str, timeout: float, *, kill_late: bool = False) -> bool: ...

    def usage(self, key: str) -> dict[str, int]: ...


class Child:
    """A forked child that waits until the test has put it into a cgroup, then runs ``body``.

    ``body(out_fd)`` runs only after :meth:`go`, so whatever it observes (its
    affinity, its memory limit) is the cgroup's doing, not the parent's. The
    pid goes into ``registry`` (the test's ``children`` fixture, see
    :func:`reap`) the moment it exists.
    """

    def __init__(self, body: Callable[[int], None], registry: list[int]) -> None:
        go_r, self._go = os.pipe()
        self._out, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            code = 0
            try:
                os.close(self._go)
                os.close(self._out)
                os.read(go_r, 1)
                body(out_w)
            except BaseException:
                code = 70
            os._exit(code)
        os.close(go_r)
        os.close(out_w)
        self.pid = pid
        registry.append(pid)
        self._status: int | None = None

    def go(self) -> None:
        """Let the child run its body."""
        os.write(self._go, b"x")
        os.close(self._go)

    def output(self, timeout: float = 60.0) -> bytes:
        """Everything the child wrote to its out pipe, until it closes it.

        The timeout only matters when a test fails; it is generous because the
        QEMU machine runs several times slower under software emulation.
        """
        data = b""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._out], [], [], left)
            if not ready:
                break
            chunk = os.read(self._out, 65536)
            if not chunk:
                break
            data += chunk
        os.close(self._out)
        return data

    def wait(self, timeout: float = 120.0) -> int:
        """The child's exit code (``-9`` for SIGKILL, 70 when its body raised).

        A child still there after ``timeout`` fails the test (the kill or the OOM kill it
        waits for did not come) instead of hanging the run.
        """
        deadline = time.monotonic() + timeout
        while self._status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._status = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                raise AssertionError(f"child {self.pid} still running after {timeout:.0f} s")
            else:
                time.sleep(0.01)
        return self._status


def start_in(backend: _Backend, key: str, body: Callable[[int], None],
             registry: list[int]) -> Child:
    """Fork ``body`` into job ``key``: moved first, released second."""
    child = Child(body, registry)
    backend.add_pid(key, child.pid)
    child.go()
    return child


def usage_after_kill(backend: _Backend, key: str, child: Child,
                     timeout: float) -> dict[str, int]:
    """SIGKILL ``child``, wait up to ``timeout`` seconds until job ``key`` has no process
    left, then return the job's usage: what its cgroup keeps after its processes."""
    os.kill(child.pid, signal.SIGKILL)
    code = child.wait()
    if code != -signal.SIGKILL:
        raise AssertionError(f"child {child.pid} was SIGKILLed but its exit code is {code}")
    if not backend.wait_empty(key, timeout):
        raise AssertionError(f"job {key} still has processes {timeout} s after the SIGKILL")
    return backend.usage(key)


# -- bodies for a Child -------------------------------------------------------


def report_affinity(out: int) -> None:
    """Write the cpus this process may run on, as ``0,1``."""
    os.write(out, cpu_list(os.sched_getaffinity(0)).encode())


def allocate(size: int) -> Callable[[int], None]:
    """A body that touches ``size`` bytes and writes ``survived <size>`` if it lives."""
    def body(out: int) -> None:
        block = bytearray(size)  # zero-filled: every page is touched
        os.write(out, f"survived {len(block)}".encode())
    return body


def small_lives_big_dies(backend: _Backend, key: str, registry: list[int],
                         small: int, big: int) -> None:
    """In job ``key``: a child touching ``small`` bytes lives and says so, one touching
    ``big`` bytes is SIGKILLed by the kernel before it can say anything."""
    lives = start_in(backend, key, allocate(small), registry)
    assert lives.output() == f"survived {small}".encode()
    assert lives.wait() == 0
    dies = start_in(backend, key, allocate(big), registry)
    assert dies.output() == b""
    assert dies.wait() == -signal.SIGKILL


def move_story(backend: Any, registry: list[int], body: Callable[[int], None]) -> None:
    """The epilog steps out to sge_execd's cgroups: a process of job 12.1 moved to the
    cgroups of one in job 12.2 (standing in for execd's) leaves 12.1 empty. ``body``
    keeps both processes alive."""
    from geco.cgroup import Limits

    backend.create("12.1", Limits())
    backend.create("12.2", Limits())
    job = start_in(backend, "12.1", body, registry)
    execd = start_in(backend, "12.2", body, registry)
    assert backend.contains("12.1", job.pid)
    assert not backend.contains("12.2", job.pid)
    backend.move_to_cgroups_of(job.pid, execd.pid)
    assert backend.contains("12.2", job.pid)
    assert not backend.contains("12.1", job.pid)
    assert backend.pids("12.1") == []


def kill_from_inside_story(backend: Any, registry: list[int]) -> None:
    """The epilog runs inside the job; killing the job from there would kill the epilog
    itself: refused, with the way out named."""
    from geco.cgroup import Limits
    from geco.errors import CgroupError

    backend.create("15.1", Limits())

    def kill_own_job(out: int) -> None:
        try:
            backend.kill("15.1")
        except CgroupError as exc:
            os.write(out, str(exc).encode())

    child = start_in(backend, "15.1", kill_own_job, registry)
    assert child.output().decode() == (
        "refusing to kill job 15.1 from inside its cgroup: move this process out first "
        f"(move_to_cgroups_of) (key=15.1 pid={child.pid})")
    assert child.wait() == 0


def open_verdicts(paths: Mapping[str, str]) -> Callable[[int], None]:
    """A body that writes ``name=verdict`` lines, one per device in ``paths``: ``open``,
    or the errno's name (ENXIO: the cgroup allows a device no driver serves; EPERM: the
    cgroup denies it), then ``pty=open`` when a pseudo-terminal pair can be made."""
    import errno

    def verdict(path: str) -> str:
        try:
            os.close(os.open(path, os.O_RDWR))
        except OSError as exc:
            return errno.errorcode[exc.errno or 0]
        return "open"

    def body(out: int) -> None:
        lines = [f"{name}={verdict(path)}" for name, path in paths.items()]
        master, slave = os.openpty()
        os.close(master)
        os.close(slave)
        os.write(out, "\n".join([*lines, "pty=open"]).encode())
    return body


def verdicts(child: Child) -> dict[str, str]:
    """What an :func:`open_verdicts` child wrote, once it exited 0: ``{name: verdict}``."""
    text = child.output().decode()
    assert child.wait() == 0, text
    return dict(line.split("=", 1) for line in text.splitlines())


def gpu_story(backend: Any, registry: list[int], tmp: Path) -> None:
    """Two fake GPUs (id 0 = ``c 195:1``, id 1 = ``c 195:0``: ids and minors crossed, as
    the driver may number them) and nvidiactl, through :func:`geco.job.containment.contain_job`
    with jobs Grid Engine counted GPUs for (``count:N``): each job opens its own GPU and
    gets EPERM on the other (the kernel's verdict: no driver here), ordinary devices and
    a pty keep working, a job granted an id the node lacks gets neither GPU, a job asking
    more than is free is refused with nothing left, the picks are saved in the resource
    files, a GPU comes back when its job is gone, and a job contained anew picks again
    (what it held before may be another job's by then)."""
    import stat

    from geco.config import Config
    from geco.job.containment import contain_job
    from geco.node import gpus
    from geco.resourceset import NodeResources, ResourceSet
    from geco.sge import resourcefile
    from geco.sge.execd import JobRef
    from geco.sge.lookup import Found

    devices = {"gpu0": 1, "gpu1": 0, "ctl": 255}
    for name, minor in devices.items():
        os.mknod(tmp / name, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    paths = {name: str(tmp / name) for name in devices}
    paths["null"] = "/dev/null"
    cfg = Config(state_dir=tmp / "state", gpu_devices=(paths["gpu0"], paths["gpu1"]),
                 pids_per_slot=0)

    def start(job: int, share: str) -> tuple[Child, tuple[int, ...] | None]:
        rs = ResourceSet(job, 1, owner="root", nodes=(NodeResources("here", gpus=share),))
        child = Child(open_verdicts(paths), registry)
        done = contain_job(JobRef(job, 1, None), cfg, backend, pid=child.pid,
                           found=Found(rs, "file", 0.0), hostname="here")
        return child, done.gpus

    first, ids = start(601, "count:1")
    assert ids == (0,)
    # a granted id (RSMAP) that names no GPU here: contained with none (both denied), never
    # refused (Grid Engine would start it again and again); its starter holds it
    held, ids = start(604, "7")
    assert ids is None
    held.go()
    assert verdicts(held) == {"gpu0": "EPERM", "gpu1": "EPERM", "ctl": "ENXIO",
                              "null": "open", "pty": "open"}
    backend.destroy("604.1")
    try:
        start(602, "count:2")
    except gpus.GpusUnavailable as exc:
        assert str(exc) == ("the job needs 2 GPU(s) here, but only 1 of this node's 2 are "
                            "free")
    else:
        raise AssertionError("a job asking 2 GPUs with 1 free was contained")
    assert not backend.exists("602.1")
    second, ids = start(602, "count:1")
    assert ids == (1,)
    first.go()
    second.go()
    assert verdicts(first) == {"gpu0": "ENXIO", "gpu1": "EPERM", "ctl": "ENXIO",
                               "null": "open", "pty": "open"}
    assert verdicts(second) == {"gpu0": "EPERM", "gpu1": "ENXIO", "ctl": "ENXIO",
                                "null": "open", "pty": "open"}
    saved = resourcefile.read(cfg.resources_dir, "601.1")
    assert saved is not None and saved.nodes[0].gpus == "count:1=0"
    assert gpus.job_environment(cfg, "602.1", "here") == {
        "GECO_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    backend.destroy("601.1")  # its process has exited: GPU 0 is free again
    third, ids = start(603, "count:1")
    assert ids == (0,)
    third.go()
    assert verdicts(third)["gpu0"] == "ENXIO"
    # 601 contained anew (a parallel job's next task after its empty cgroups were reclaimed)
    # picks again: the GPU it held is 603's now (603 keeps a process; 602's cgroups are
    # empty, so a node short of cores takes them back), so it gets GPU 1, never 0 again
    start_in(backend, "603.1", lambda _: time.sleep(60), registry)
    again = ResourceSet(601, 1, owner="root", nodes=(NodeResources("here", gpus="count:1=0"),))
    done = contain_job(JobRef(601, 1, None), cfg, backend,
                       pid=Child(open_verdicts(paths), registry).pid,
                       found=Found(again, "file", 0.0), hostname="here")
    assert done.gpus == (1,)
    assert not backend.exists("602.1")


def free_char_major(proc: Path = Path("/proc")) -> int:
    """A character major no driver of this machine holds (from the experimental range
    240-254, else the dynamic one 234-239), to stand in for a dynamic major such as
    nvidia-caps': the devices cgroup checks numbers, not drivers."""
    text = (proc / "devices").read_text().split("\n\n")[0]
    used = {int(line.split()[0]) for line in text.splitlines()[1:] if line.split()}
    return next(m for m in [*range(240, 255), *range(234, 240)] if m not in used)


# /proc/driver/nvidia-caps/mig-minors, trimmed: gpu<N> is the device minor of the GPU
MIG_MINORS = {"config": 1, "monitor": 2, "gpu0/gi0/access": 3, "gpu0/gi0/ci0/access": 4,
              "gpu1/gi0/access": 138, "gpu1/gi0/ci0/access": 139, "gpu2/gi0/access": 273}


def mig_tree(tmp: Path, caps_major: int) -> tuple[Path, dict[str, str]]:
    """A ``proc`` tree with the driver's ``nvidia-caps`` major and MIG table
    (:data:`MIG_MINORS`), and ``/dev/nvidia-caps/nvidia-cap<minor>`` nodes for them (mknod
    ``c caps_major:<minor>``): ``proc`` and ``{"cap<minor>": path}``."""
    import stat

    proc = tmp / "proc"
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "devices").write_text(f"Character devices:\n195 nvidia\n{caps_major} nvidia-caps"
                                  "\n\nBlock devices:\n  8 sd\n")
    (proc / "driver/nvidia-caps/mig-minors").write_text(
        "".join(f"{name} {minor}\n" for name, minor in MIG_MINORS.items()))
    caps = tmp / "nvidia-caps"
    caps.mkdir()
    paths = {}
    for minor in MIG_MINORS.values():
        os.mknod(caps / f"nvidia-cap{minor}", 0o600 | stat.S_IFCHR,
                 os.makedev(caps_major, minor))
        paths[f"cap{minor}"] = str(caps / f"nvidia-cap{minor}")
    return proc, paths


def mig_story(backend: Any, registry: list[int], tmp: Path) -> None:
    """Two fake GPUs (id 0 = ``c 195:1``, id 1 = ``c 195:0``), nvidiactl and the MIG
    capability devices of a made-up caps major (:func:`mig_tree`), denied through
    ``backend.deny_devices(key, geco.node.gpus.denied(...))``: a job granted GPU 0 opens its
    GPU and the caps of its instances (``gpu1/...``: minor 1 is id 0's) and gets EPERM on
    the other GPU, its caps, and ``config`` and ``monitor``; a caps entry of a GPU the
    node's table lacks (``gpu2``) is left as open as that GPU; a job granted no GPU gets
    EPERM on every cap; a job on a node where geco knows no GPU, on every NVIDIA device
    (195:*, nvidiactl too) and every cap. ENXIO = allowed (no driver here), EPERM = denied."""
    import stat

    from geco.cgroup import Limits
    from geco.node import gpus

    proc, caps = mig_tree(tmp, free_char_major())
    for name, minor in {"gpu0": 1, "gpu1": 0, "ctl": 255}.items():
        os.mknod(tmp / name, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    paths = {name: str(tmp / name) for name in ("gpu0", "gpu1", "ctl")} | caps
    paths["null"] = "/dev/null"
    table = gpus.node_table([paths["gpu0"], paths["gpu1"]])
    table_caps = gpus.mig_caps(proc)

    def observe(key: str, devices: list[tuple[str, int, int | None]]) -> dict[str, str]:
        backend.create(key, Limits())
        backend.deny_devices(key, devices)
        return verdicts(start_in(backend, key, open_verdicts(paths), registry))

    allowed = dict.fromkeys(paths, "ENXIO") | {"null": "open", "pty": "open"}
    denied = "EPERM"
    assert observe("701.1", gpus.denied(table, [0], table_caps)) == allowed | {
        "gpu1": denied, "cap1": denied, "cap2": denied, "cap3": denied, "cap4": denied}
    assert observe("702.1", gpus.denied(table, [], table_caps)) == allowed | {
        "gpu0": denied, "gpu1": denied, **{name: denied for name in caps}}
    assert observe("703.1", gpus.denied((), (), table_caps)) == allowed | {
        "gpu0": denied, "gpu1": denied, "ctl": denied, **{name: denied for name in caps}}


def fork_forever(out: int) -> None:
    """Fork sleeping children as fast as the kernel allows, retrying when refused."""
    os.close(out)
    while True:
        try:
            if os.fork() == 0:
                time.sleep(300)
                os._exit(0)
        except OSError:
            time.sleep(0.001)


def spin(seconds: float) -> Callable[[int], None]:
    """A body that burns ``seconds`` of its own CPU time in user space, says so, then sleeps."""
    def body(out: int) -> None:
        # reading the clock is a system call: look at it only every 100000 additions
        n = 0
        while time.process_time() < seconds:
            for _ in range(100_000):
                n += 1
        os.write(out, b"spun")
        os.close(out)
        time.sleep(300)
    return body


def counter_body(counter: mmap.mmap) -> Callable[[int], None]:
    """A body that counts up in shared memory as fast as it can (see :func:`count`)."""
    def body(out: int) -> None:
        os.close(out)
        n = 0
        while True:
            n += 1
            struct.pack_into("Q", counter, 0, n)
    return body


def count(counter: mmap.mmap) -> int:
    """How far a :func:`counter_body` child has counted."""
    return int(struct.unpack_from("Q", counter, 0)[0])


# -- reading and waiting ------------------------------------------------------


def parse_list(text: str) -> set[int]:
    """The numbers of a kernel list such as ``0-2,5`` (surrounding white space allowed)."""
    out: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def cpu_list(cpus: Iterable[int]) -> str:
    """The cpus as a plain sorted list such as ``0,1,2``."""
    return ",".join(map(str, sorted(cpus)))


def read(path: Path) -> str:
    """A cgroup file's text without the trailing newline."""
    return path.read_text().strip()


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``check`` until it holds or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


# -- cleanup ------------------------------------------------------------------


def fresh_name() -> str:
    """A cgroup name no other test of this run uses: ``geco-test-<pid>-<n>``."""
    return f"geco-test-{os.getpid()}-{next(_names)}"


def reap(pids: Iterable[int]) -> None:
    """SIGKILL and wait for each of a test's forked children that is still there."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


@contextlib.contextmanager
def forked_children() -> Iterator[list[int]]:
    """The registry of a test's forked pids (a :class:`Child` adds its own); on exit each
    one still there is SIGKILLed and reaped (:func:`reap`). What a test's ``children``
    fixture yields."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        reap(pids)


# prctl(2) option: orphans of this process's descendants are re-parented to it
_PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def subreaper_children() -> Iterator[list[int]]:
    """:func:`forked_children`, with this process the subreaper of the test's daemons (a
    double fork lands here, not at pid 1, and is reaped), for the with-block."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        with forked_children() as pids:
            yield pids
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@contextlib.contextmanager
def parent_name(mount_points: Iterable[Path]) -> Iterator[str]:
    """A :func:`fresh_name` for a test's cgroup parent; on exit whatever was made under
    that name below any of ``mount_points`` is removed (:func:`raw_cleanup`)."""
    tops = list(mount_points)
    name = fresh_name()
    try:
        yield name
    finally:
        left = raw_cleanup(top / name for top in tops)
        assert not left, f"test cgroups left behind: {left}"


@contextlib.contextmanager
def v1_backend(hierarchies: Mapping[str, Hierarchy], **options: Any) -> Iterator[V1Backend]:
    """A V1Backend (``options``: its keyword arguments) on a fresh parent in ``hierarchies``,
    its root made; the parent and all below it removed on exit (:func:`parent_name`)."""
    from geco.cgroup import V1Backend  # here, not at the top: the VM's v2 tests never call this

    with parent_name(h.mount_point for h in hierarchies.values()) as name:
        backend = V1Backend(hierarchies, name, **options)
        backend.ensure_root()
        yield backend


def v1_fixtures(hierarchies: Mapping[str, Hierarchy]) -> tuple[Any, Any]:
    """The fixtures ``children`` (pids the test started or adopted as subreaper, SIGKILLed
    and reaped afterwards) and ``backend`` (a v1 backend on a fresh geco-test-* parent in
    ``hierarchies``, removed with plain syscalls afterwards), for a test module to bind
    to those names."""
    import pytest

    def children() -> Iterator[list[int]]:
        with subreaper_children() as pids:
            yield pids

    def backend(children: list[int]) -> Iterator[V1Backend]:
        with v1_backend(hierarchies, exclusive_cpus=False) as b:
            yield b

    return pytest.fixture(children), pytest.fixture(backend)


def _write(path: Path, data: bytes) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def cgroup_mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Path]:
    """The mount point of every cgroup hierarchy of this machine, each once: v1 whatever its
    controllers (named ones such as systemd's too) and cgroup2. Where a test's parent
    ``<mount point>/<name>`` may be, made by the test or by the geco it runs: a cleanup
    over all of them covers a controller geco starts to use tomorrow as well."""
    from geco.cgroup import parse_mountinfo  # here: most helpers need no geco

    return list(dict.fromkeys(m.mount_point for m in parse_mountinfo(mountinfo.read_bytes())
                              if m.fstype in ("cgroup", "cgroup2")))


def raw_cleanup(tops: Iterable[Path]) -> list[str]:
    """Remove test cgroups (``tops`` and all below) with plain syscalls, whatever their state;
    return what could not be removed, as ``<directory>: <error>`` (empty: all gone).

    v1 freezers are thawed first (a frozen task would not die of SIGKILL
    before it is thawed); every process in them is SIGKILLed until none is
    left, then the directories are removed deepest first. Only test children
    (and the job processes of a gecod a test runs) are ever put below a test
    cgroup, so killing what is there is safe. A directory that is not there, or
    vanishes meanwhile (the gecod under test may be removing a job's right now),
    is no failure.
    """
    dirs = list(dict.fromkeys(tops))
    for top in dirs:
        for dirpath, _, files in os.walk(top):
            if "freezer.state" in files:
                _write(Path(dirpath) / "freezer.state", b"THAWED")
    for _ in range(200):
        pids: set[int] = set()
        for top in dirs:
            for dirpath, _, _ in os.walk(top):
                with contextlib.suppress(OSError):
                    pids.update(map(int, (Path(dirpath) / "cgroup.procs").read_text().split()))
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    left = []
    for top in dirs:
        for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            try:
                os.rmdir(dirpath)
            except OSError as exc:  # ENODEV: the kernel is removing it already
                if exc.errno not in (errno.ENOENT, errno.ENODEV):
                    left.append(f"{dirpath}: {exc}")
    return left


def usable_v1_hierarchies(mounted: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The hierarchies the tests build their parents in, and why they cannot run ("" = they can).

    Normally the real ones. But a cpu_exclusive cpuset at the top (the GECO
    that geco's own prolog leaves behind, e.g. after tests/integration) bars
    every other top-level cpuset from its cpus, so no test parent could get a
    cpu there; the tests' cpuset parents then go inside that cpuset, which
    plays the root's part, as long as it holds no other cpuset using cpus.
    """
    from geco.cgroup import Hierarchy  # here, not at the top: the VM's v2 tests never call this

    if os.geteuid() != 0:
        return {}, "writing cgroups needs root"
    if "cpuset" not in mounted or "memory" not in mounted:
        return {}, "this machine has no cgroup v1 cpuset and memory hierarchies"
    top = mounted["cpuset"]
    root_cpus = parse_list((top.mount_point / "cpuset.cpus").read_text())
    blockers = [d for d in top.mount_point.iterdir()
                if d.is_dir() and (d / "cpuset.cpu_exclusive").read_text().strip() == "1"
                and parse_list((d / "cpuset.cpus").read_text()) & root_cpus]
    if not blockers:
        return dict(mounted), ""
    if len(blockers) > 1:
        return {}, f"the cpusets {', '.join(map(str, blockers))} are cpu_exclusive over this " \
                   "machine's cpus, so no test cpuset can get one"
    inside = blockers[0]
    busy = [d for d in inside.iterdir()
            if d.is_dir() and (d / "cpuset.cpus").read_text().strip()]
    if busy:
        return {}, f"the cpuset {inside} is cpu_exclusive over this machine's cpus and is " \
                   f"in use ({', '.join(d.name for d in busy)}), so no test cpuset can get one"
    return {**mounted, "cpuset": Hierarchy("cpuset", inside,
                                           posixpath.join(top.root, inside.name))}, ""
