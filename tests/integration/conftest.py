"""Fixtures of the Grid Engine integration tests: the site's gecod, three hosts.

(``job_dir``, which the QEMU machine's tests/vm_sge uses too, is in tests/conftest.py.)
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cleanslate import SITE_SOCKET as SOCKET
from tests.cleanslate import listener_pid
from tests.clusterkit import cluster
from tests.gecodkit import stop_by_pid

GECO = "/usr/bin/geco"
HERE = Path(__file__).parent
PRELOAD = "/usr/lib/geco/libgeco_preload.so"
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def serving() -> bool:
    """Something accepts connections on the site's gecod socket."""
    with socket.socket(socket.AF_UNIX) as s:
        return s.connect_ex(str(SOCKET)) == 0


@dataclass
class Gecod:
    """gecod as a child of this test session, serving the site configuration."""

    log: Path
    proc: subprocess.Popen[bytes] | None = None
    preload: str = PRELOAD  # what sge_execd gets for a test with the ``gecod`` fixture
    successor: int = 0  # the gecod this one handed over to (not this session's child)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([GECO, "daemon"], env=CLEAN_ENV, cwd="/",
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         start_new_session=True)
        deadline = time.monotonic() + 30
        # ours, not one another session or demo.sh left there (ours would then exit)
        while (listener := listener_pid(SOCKET)) != self.proc.pid:
            assert self.proc.poll() is None, (
                f"gecod exited{f' (pid {listener} serves {SOCKET})' if listener else ''}: "
                f"{self.log.read_text()}")
            assert time.monotonic() < deadline, f"gecod not serving: {self.log.read_text()}"
            time.sleep(0.1)

    def serving(self) -> bool:
        return serving()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def hand_over(self) -> subprocess.CompletedProcess[str]:
        """`geco handover` as root: the gecod now installed serves in this one's place."""
        assert self.proc is not None
        done = subprocess.run([GECO, "handover"], env=CLEAN_ENV, cwd="/", capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, (done.stderr, self.log.read_text())
        assert self.proc.wait(timeout=60) == 0, self.log.read_text()
        # STATUS's pid: the socket's SO_PEERCRED names the gecod that listened first
        shown = subprocess.run([GECO, "status", "--json"], env=CLEAN_ENV, cwd="/",
                               capture_output=True, text=True, timeout=60, check=True)
        self.successor = int(json.loads(shown.stdout)["pid"])
        assert self.successor != self.proc.pid, self.log.read_text()
        return done

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        if self.successor:  # not this session's child
            stop_by_pid(self.successor)
            self.successor = 0


class GecodUnit:
    """The node's own gecod.service, on a machine booted with systemd (the QEMU machine,
    where scripts/install.sh enabled it): started and stopped through systemctl."""

    UNIT = "gecod.service"
    preload = PRELOAD  # what sgeexecd.service's drop-in gives sge_execd

    @classmethod
    def installed(cls) -> bool:
        return Path("/run/systemd/system").is_dir() and subprocess.run(
            ["systemctl", "is-enabled", "--quiet", cls.UNIT], check=False).returncode == 0

    def start(self) -> None:
        subprocess.run(["systemctl", "start", self.UNIT], check=True, timeout=300)
        deadline = time.monotonic() + 300
        while not serving():
            assert time.monotonic() < deadline, f"{self.UNIT} started but not serving"
            time.sleep(0.2)

    def stop(self) -> None:
        subprocess.run(["systemctl", "stop", self.UNIT], check=True, timeout=300)


@pytest.fixture(scope="module")
def gecod_service(sge: Any, journal: Any,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gecod | GecodUnit]:
    """A real gecod serving the site configuration's socket for one test module: a child
    of this session, or the node's own unit where systemd runs it."""
    sge.require_hooks()
    if GecodUnit.installed():
        unit = GecodUnit()
        unit.start()
        yield unit
        return
    daemon = Gecod(tmp_path_factory.mktemp("gecod") / "gecod.log")
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def gecod(sge: Any, gecod_service: Gecod) -> Gecod:
    """gecod serving and sge_execd running with the exec() preload, for one test module:
    tests/conftest.py's ``execd_as_asked`` gives each test that asks for this fixture
    execd with the preload, and each other test execd without it (the hooks alone),
    restarting execd only where one kind of test follows the other."""
    return gecod_service


# ---------------------------------------------------------------------------
# the emulated cluster (tests/**/test_multinode*.py)
# ---------------------------------------------------------------------------

_CLUSTER_UP: list[bool] = []  # the emulated cluster is up (brought up by three_hosts)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the emulated cluster one after the other, where the first of them is
    (test_multinode*, test_stall_cluster, ...): it is brought up once for them and down
    after the last (:func:`three_hosts`), and its hosts' cores are the machine's, which
    the other modules' jobs would share meanwhile (its queue runs only jobs that ask for
    it: cluster.sh's FORCED complex). Then this directory's modules in the order that
    restarts sge_execd the fewest times (:func:`_fewest_execd_restarts`)."""
    on_cluster = [item for item in items if "three_hosts" in getattr(item, "fixturenames", ())]
    if on_cluster:
        first = items.index(on_cluster[0])
        rest = [item for item in items if item not in on_cluster]
        items[:] = rest[:first] + on_cluster + rest[first:]
    here = [i for i, item in enumerate(items) if item.path.is_relative_to(HERE)]
    if here and here == list(range(here[0], here[-1] + 1)):  # one run of this directory's
        items[here[0]:here[-1] + 1] = _fewest_execd_restarts(items[here[0]:here[-1] + 1])


def _fewest_execd_restarts(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` reordered so that sge_execd changes between with and without the preload
    once (tests/conftest.py's ``execd_as_asked``; ~5 s each time, ~25 times in file
    order): every module's tests without the ``gecod`` fixture first, then those marked
    ``starts_on_plain_execd`` (their module fixture runs plain jobs, then the preload
    comes), then those with it. A module holding both kinds is run in two parts: pytest
    sets its module fixtures up again for the second, and its ``gecod`` is never up
    while a test of the first part runs. The emulated cluster's tests stay one block,
    and each part's tests keep their order."""
    return sorted(items, key=_execd_rank)  # stable: file order within each rank


def _execd_rank(item: pytest.Item) -> int:
    names = getattr(item, "fixturenames", ())
    if "gecod" not in names:
        return 0
    return 1 if item.get_closest_marker("starts_on_plain_execd") else 2


def _cluster_down() -> None:
    _CLUSTER_UP.clear()
    down = cluster("down")
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture(scope="session")
def _cluster_session() -> Iterator[None]:
    """Brings the emulated cluster down at the session's end if a module left it up (an
    interrupted or -x run)."""
    yield
    if _CLUSTER_UP:
        _cluster_down()


@pytest.fixture(scope="module")
def three_hosts(request: pytest.FixtureRequest, sge: Any, _cluster_session: None
                ) -> Iterator[None]:
    """Three emulated execution hosts, shared by the multinode modules that run one after
    the other (each up and down costs the qmaster host-name look-ups it caches), and down
    as soon as no later test of the session needs them (their daemons hold cores and
    memory the other modules' jobs want)."""
    if not _CLUSTER_UP:
        cluster("down")
        up = cluster("up", "3")
        if up.returncode != 0:
            # once more from scratch: the qmaster may still hold the hosts of an earlier
            # run (its host-name cache), which the first try waited out
            print(f"geco tests: cluster up failed, trying again:\n{up.stdout}{up.stderr}")
            cluster("down")
            up = cluster("up", "3")
        assert up.returncode == 0, up.stdout + up.stderr
        _CLUSTER_UP.append(True)
    yield
    items = request.session.items
    mine = [i for i, item in enumerate(items) if item.module is request.module]
    later = items[max(mine) + 1:] if mine else []
    if _CLUSTER_UP and not any("three_hosts" in getattr(item, "fixturenames", ())
                               for item in later):
        _cluster_down()

