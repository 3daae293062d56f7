"""The v2 base in a systemd-delegated unit: ``[cgroup] v2_base`` and what ensure_root checks.

A fake cgroup2 tree in a temporary directory stands in for ``/sys/fs/cgroup``:
the interface files a real cgroupfs would show are plain files made up front,
systemd's marks are ``user.*`` extended attributes, and ``/proc/<pid>/cgroup``
is a fake /proc. What the kernel and systemd really do with it (the move of
the placeholder, controllers passing down, a restart of gecod while a job
runs) is shown in the QEMU machine by ``tests/vm_systemd/test_gecod_systemd.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest

from geco import cgroup, config
from geco.cgroup import V2Backend, unit_cgroup
from geco.errors import CgroupError

MOUNT = Path("/sys/fs/cgroup")
ALL = "cpuset cpu io memory pids"


def test_given_bases_when_finding_their_unit_then_the_nearest_service_or_scope_is_it() -> None:
    jobs = MOUNT / "system.slice" / "geco-jobs.service"
    assert unit_cgroup(MOUNT, jobs / "jobs") == jobs
    assert unit_cgroup(MOUNT, jobs) == jobs
    assert unit_cgroup(MOUNT, jobs / "a" / "b") == jobs
    scope = MOUNT / "system.slice" / "geco.scope"
    assert unit_cgroup(MOUNT, scope / "jobs") == scope
    # slices are never delegated; a base beside the units is in none
    assert unit_cgroup(MOUNT, MOUNT / "system.slice" / "jobs") is None
    assert unit_cgroup(MOUNT, MOUNT / "GECO") is None
    # only names below the mount count
    assert unit_cgroup(Path("/x/y.service/cg"), Path("/x/y.service/cg/GECO")) is None


# -- configuration --------------------------------------------------------------


def test_given_no_v2_base_then_it_is_empty_and_the_backend_gets_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(cgroup, "detect", lambda *a, **kw: seen.update(kw))
    cgroup.for_config(config.Config())
    assert config.Config().cgroup_v2_base == ""
    assert seen["base"] is None


def test_given_a_v2_base_when_loaded_then_it_is_normalized_and_passed_to_the_backend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "geco.toml"
    path.write_text('[cgroup]\nv2_base = "/sys/fs/cgroup/system.slice/geco-jobs.service/jobs/"\n')
    cfg = config.load(path)
    seen: dict[str, object] = {}
    monkeypatch.setattr(cgroup, "detect", lambda *a, **kw: seen.update(kw))
    cgroup.for_config(cfg)
    assert cfg.cgroup_v2_base == "/sys/fs/cgroup/system.slice/geco-jobs.service/jobs"
    assert seen["base"] == MOUNT / "system.slice" / "geco-jobs.service" / "jobs"


def test_given_a_v1_systemd_base_when_loaded_then_it_is_normalized_and_passed_to_the_backend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "geco.toml"
    path.write_text('[cgroup]\nv1_systemd_base = "/system.slice/geco-jobs.service/jobs/"\n')
    cfg = config.load(path)
    seen: dict[str, object] = {}
    monkeypatch.setattr(cgroup, "detect", lambda *a, **kw: seen.update(kw))
    cgroup.for_config(cfg)
    assert seen["systemd_base"] == "/system.slice/geco-jobs.service/jobs"
    assert config.Config().cgroup_v1_systemd_base == ""


@pytest.mark.parametrize("value", ['"jobs"', "3", "true"])
def test_given_a_v2_base_that_is_no_absolute_path_then_it_is_logged_and_empty_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, value: str) -> None:
    path = tmp_path / "geco.toml"
    path.write_text(f"[cgroup]\nv2_base = {value}\n")
    with caplog.at_level(logging.WARNING, logger="geco.config"):
        cfg = config.load(path)
    assert cfg.cgroup_v2_base == ""
    shown = {'"jobs"': "'jobs'", "3": "3", "true": "True"}[value]
    assert caplog.messages == [f'config {path}: cgroup.v2_base must be an absolute path or "" '
                               f"(the default), got {shown}; using the default ''"]


# -- a fake cgroup2 tree -----------------------------------------------------------


@dataclasses.dataclass
class Tree:
    """A cgroup2 mount with system.slice, one unit cgroup and a fake /proc."""

    mount: Path
    proc: Path
    unit: Path

    def files(self, d: Path, *, controllers: str = ALL, subtree: str = "",
              procs: str = "") -> Path:
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.controllers").write_text(f"{controllers}\n")
        (d / "cgroup.subtree_control").write_text(f"{subtree}\n")
        (d / "cgroup.procs").write_text(procs)
        return d

    def mark(self, *, delegated: bool) -> None:
        """systemd (251 and later): every unit cgroup is marked, delegated ones also so."""
        os.setxattr(self.unit, "user.invocation_id", b"0123456789abcdef0123456789abcdef")
        if delegated:
            os.setxattr(self.unit, "user.delegate", b"1")

    def run_in(self, cgpath: str) -> None:
        """This process's /proc/<pid>/cgroup shows ``cgpath``."""
        d = self.proc / str(os.getpid())
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(f"0::{cgpath}\n")

    def backend(self, base: Path | None = None) -> V2Backend:
        return V2Backend(self.mount, base=base or self.unit / "jobs", proc=self.proc)

    def text(self, path: Path) -> str:
        return path.read_text().strip()


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    try:
        os.setxattr(tmp_path, "user.test", b"1")
    except OSError as exc:
        pytest.skip(f"the temporary directory's file system has no user xattrs: {exc}")
    t = Tree(tmp_path / "cg", tmp_path / "proc", tmp_path / "cg" / "system.slice" /
             "geco-jobs.service")
    t.files(t.mount, subtree="memory pids")
    t.files(t.mount / "system.slice", subtree="cpuset memory pids")
    t.files(t.unit, procs="4242\n")
    t.files(t.unit / "holder")
    t.files(t.unit / "jobs")
    t.run_in("/system.slice/gecod.service")
    return t


def test_given_a_delegated_unit_when_ensure_root_then_only_it_and_below_are_written(
        tree: Tree) -> None:
    """Given the base in a delegated unit holding its placeholder, when ensure_root, then the
    placeholder goes to <unit>/holder, the unit and the base pass cpuset, memory and pids
    down, and nothing above the unit is written (the mount lacks +cpuset: systemd's)."""
    tree.mark(delegated=True)
    b = tree.backend()

    b.ensure_root()

    assert b.delegated_root == tree.unit
    assert tree.text(tree.unit / "holder" / "cgroup.procs") == "4242"
    assert tree.text(tree.unit / "cgroup.subtree_control") == "+cpuset +memory +pids"
    assert tree.text(tree.unit / "jobs" / "cgroup.subtree_control") == "+cpuset +memory +pids"
    assert tree.text(tree.mount / "cgroup.subtree_control") == "memory pids"
    assert tree.text(tree.mount / "system.slice" / "cgroup.subtree_control") == \
        "cpuset memory pids"


def test_given_a_unit_that_systemd_does_not_delegate_when_ensure_root_then_it_names_the_fix(
        tree: Tree) -> None:
    tree.mark(delegated=False)
    with pytest.raises(CgroupError) as err:
        tree.backend().ensure_root()
    assert str(err.value) == (
        f"[cgroup] v2_base {tree.unit}/jobs lies in the cgroup of geco-jobs.service, which "
        "systemd does not delegate (it would undo geco's settings there): set Delegate=yes "
        f"in geco-jobs.service (path={tree.unit})")
    assert tree.text(tree.unit / "holder" / "cgroup.procs") == ""
    assert tree.text(tree.unit / "cgroup.subtree_control") == ""


def test_given_an_unmarked_unit_without_cpuset_when_ensure_root_then_it_names_the_fix(
        tree: Tree) -> None:
    """Given a systemd that marks no cgroup (before 251), the controllers tell: no cpuset."""
    tree.files(tree.unit, controllers="memory pids", procs="4242\n")
    with pytest.raises(CgroupError) as err:
        tree.backend().ensure_root()
    assert str(err.value) == (
        f"[cgroup] v2_base {tree.unit}/jobs lies in the cgroup of geco-jobs.service, which "
        "lacks the cpuset controller (cgroup.controllers has: memory pids): set Delegate=yes "
        "in geco-jobs.service (cpuset needs systemd 244 or later) "
        f"(path={tree.unit}/cgroup.controllers)")


def test_given_a_unit_that_is_not_running_when_ensure_root_then_it_says_start_it(
        tree: Tree) -> None:
    base = tree.mount / "system.slice" / "stopped.service" / "jobs"
    with pytest.raises(CgroupError) as err:
        tree.backend(base).ensure_root()
    assert str(err.value) == (
        f"[cgroup] v2_base {base} lies in the cgroup of stopped.service, which does not "
        "exist: start that unit first (systemctl start stopped.service) "
        f"(path={base.parent})")


def test_given_the_caller_in_the_units_own_cgroup_when_ensure_root_then_it_refuses(
        tree: Tree) -> None:
    """Given gecod started by systemd in the very unit the base lies in, when ensure_root,
    then it refuses: moving out would work until the first restart with jobs (219/CGROUP)."""
    tree.mark(delegated=True)
    tree.run_in("/system.slice/geco-jobs.service")
    with pytest.raises(CgroupError) as err:
        tree.backend().ensure_root()
    assert str(err.value) == (
        f"[cgroup] v2_base {tree.unit}/jobs lies in the cgroup of geco-jobs.service, and this "
        f"process (pid {os.getpid()}) runs in that cgroup itself: {tree.unit} must pass "
        "controllers down, so it may hold no process, and systemd could not start "
        "geco-jobs.service again while jobs run below it (status 219/CGROUP); keep job "
        "cgroups in a unit of their own (geco-jobs.service), or have systemd start "
        "geco-jobs.service in a sub-cgroup (DelegateSubgroup=, systemd 254 or later) "
        f"(path={tree.unit})")
    assert tree.text(tree.unit / "holder" / "cgroup.procs") == ""


def test_given_the_caller_in_a_sub_cgroup_of_the_unit_when_ensure_root_then_it_proceeds(
        tree: Tree) -> None:
    """Given systemd started the caller in <unit>/daemon (DelegateSubgroup=daemon), the base
    may share the unit: a restart lands in that leaf again."""
    tree.mark(delegated=True)
    tree.files(tree.unit, procs="")
    tree.run_in("/system.slice/geco-jobs.service/daemon")
    tree.backend().ensure_root()
    assert tree.text(tree.unit / "cgroup.subtree_control") == "+cpuset +memory +pids"


def test_given_a_base_outside_any_unit_when_ensure_root_then_every_level_passes_controllers(
        tree: Tree) -> None:
    """The layout without systemd (or with the default base): written from the mount down."""
    base = tree.mount / "GECO"
    tree.files(tree.mount)
    tree.files(base)
    b = tree.backend(base)
    b.ensure_root()
    assert b.delegated_root is None
    for d in (tree.mount, base):
        assert tree.text(d / "cgroup.subtree_control") == "+cpuset +memory +pids"
