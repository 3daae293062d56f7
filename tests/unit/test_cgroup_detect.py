"""Layout detection and the value checks of geco.cgroup, on fixture mountinfo files.

The real kernels are exercised in tests/system/test_cgroup_v1.py (this host)
and tests/vm/test_cgroup_v2.py (the QEMU machine); here the layouts this host
does not have: RHEL6's ``/cgroup/<ctrl>``, co-mounted controllers, escaped
mount points, a pure cgroup2, and a host with neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geco.cgroup import Limits, V1Backend, V2Backend, detect, parse_mountinfo
from geco.errors import CgroupError

RHEL6 = b"""\
16 21 0:3 / /proc rw,relatime - proc proc rw
20 1 253:0 / / rw,relatime - ext4 /dev/mapper/vg-root rw
24 20 0:20 / /cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
25 20 0:21 / /cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
26 20 0:22 / /cgroup/memory rw,relatime - cgroup cgroup rw,memory
27 20 0:23 / /cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
"""

COMOUNTED = b"""\
30 20 0:30 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:31 / /sys/fs/cgroup/cpuset,memory rw shared:7 - cgroup cgroup rw,cpuset,memory
32 30 0:32 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
40 20 0:31 /docker/abc /mnt/odd\\040dir rw - cgroup cgroup rw,cpuset,memory
"""

NO_CGROUPS = b"20 1 253:0 / / rw,relatime - ext4 /dev/sda1 rw\n"


def fake_proc(tmp_path: Path, mountinfo: bytes) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_bytes(mountinfo)
    return proc


def test_given_rhel6_mounts_when_detecting_then_v1_uses_cgroup_ctrl_directories(
        tmp_path: Path) -> None:
    b = detect(name="GECO", proc=fake_proc(tmp_path, RHEL6))
    assert isinstance(b, V1Backend)
    assert b.controllers == ("cpuset", "memory", "freezer")
    assert b.paths("42.1") == {"cpuset": Path("/cgroup/cpuset/GECO/42.1"),
                               "memory": Path("/cgroup/memory/GECO/42.1"),
                               "freezer": Path("/cgroup/freezer/GECO/42.1")}
    assert b.cgroup_paths("42.1") == dict.fromkeys(("cpuset", "memory", "freezer"),
                                                   "/GECO/42.1")


def test_given_co_mounted_controllers_when_detecting_then_they_share_one_directory(
        tmp_path: Path) -> None:
    b = detect(proc=fake_proc(tmp_path, COMOUNTED))
    assert isinstance(b, V1Backend)
    cpuset = Path("/sys/fs/cgroup/cpuset,memory/GECO/7.2")
    assert b.paths("7.2") == {"cpuset": cpuset, "memory": cpuset,
                              "pids": Path("/sys/fs/cgroup/pids/GECO/7.2")}
    assert b._dirs("7.2") == [cpuset, Path("/sys/fs/cgroup/pids/GECO/7.2")]


def test_given_a_second_mount_of_a_hierarchy_when_it_is_preferred_then_its_root_is_used(
        tmp_path: Path) -> None:
    """A bind mount showing only a subtree: /proc/<pid>/cgroup paths start with its root."""
    b = detect(Path("/mnt"), proc=fake_proc(tmp_path, COMOUNTED))
    assert isinstance(b, V1Backend)
    assert b.hierarchies["cpuset"].mount_point == Path("/mnt/odd dir")
    assert b.cgroup_paths("7.2")["memory"] == "/docker/abc/GECO/7.2"


def test_given_no_cgroups_when_detecting_then_the_error_names_what_is_missing(
        tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, NO_CGROUPS)
    with pytest.raises(CgroupError) as err:
        detect(proc=proc)
    assert str(err.value) == ("no usable cgroup hierarchy: /sys/fs/cgroup is not a mount point, "
                              "and no cgroup v1 hierarchy has cpuset or memory mounted "
                              f"({proc}/self/mountinfo) (path=/sys/fs/cgroup)")
    with pytest.raises(CgroupError) as err:
        detect(version="1", proc=proc)
    assert str(err.value) == ("cgroup version 1 is configured, but no cgroup v1 hierarchy has "
                              f"cpuset or memory mounted ({proc}/self/mountinfo)")
    with pytest.raises(CgroupError) as err:
        detect(version="3", proc=proc)
    assert str(err.value) == "the cgroup version must be auto, 1 or 2, got '3'"


def test_given_a_pure_cgroup2_when_detecting_then_v2_with_the_configured_base(
        tmp_path: Path) -> None:
    mount = tmp_path / "cg"
    mount.mkdir()
    (mount / "cgroup.controllers").write_bytes(b"cpuset cpu io memory pids\n")
    info = f"31 22 0:26 / {mount} rw - cgroup2 cgroup2 rw,nsdelegate\n".encode()
    proc = fake_proc(tmp_path, info)
    b = detect(mount, "GECO", proc=proc)
    assert isinstance(b, V2Backend)
    assert (b.version, b.base, b.controllers) == (2, mount / "GECO", ("cpuset", "memory", "pids"))
    assert b.cgroup_paths("3.1") == {"": "/GECO/3.1"}
    delegated = mount / "system.slice" / "gecod.service" / "jobs"
    b = detect(mount, "GECO", "2", base=delegated, proc=proc)
    assert isinstance(b, V2Backend)
    assert b.paths("3.1")["memory"] == delegated / "3.1"
    assert b.cgroup_paths("3.1") == {"": "/system.slice/gecod.service/jobs/3.1"}
    with pytest.raises(CgroupError) as err:
        detect(mount, "GECO", "2", base=tmp_path / "elsewhere", proc=proc)
    assert str(err.value) == (f"the cgroup base must be a directory below {mount}, got "
                              f"'{tmp_path / 'elsewhere'}' (path={tmp_path / 'elsewhere'})")


def test_given_a_cgroup2_without_cpuset_when_v2_is_forced_then_the_error_lists_what_it_has(
        tmp_path: Path) -> None:
    mount = tmp_path / "cg"
    mount.mkdir()
    (mount / "cgroup.controllers").write_bytes(b"memory pids\n")
    proc = fake_proc(tmp_path, f"31 22 0:26 / {mount} rw - cgroup2 cgroup2 rw\n".encode())
    with pytest.raises(CgroupError) as err:
        detect(mount, version="2", proc=proc)
    assert str(err.value) == (f"cgroup version 2 is configured, but {mount}/cgroup.controllers "
                              "lacks cpuset (it has: memory pids; cgroup v1 may hold them) "
                              f"(path={mount})")


def test_mountinfo_lines_with_optional_fields_and_escapes_parse() -> None:
    mounts = parse_mountinfo(COMOUNTED + b"garbage line\n")
    assert [(str(m.mount_point), m.root, m.fstype) for m in mounts] == [
        ("/sys/fs/cgroup", "/", "tmpfs"),
        ("/sys/fs/cgroup/cpuset,memory", "/", "cgroup"),
        ("/sys/fs/cgroup/pids", "/", "cgroup"),
        ("/mnt/odd dir", "/docker/abc", "cgroup")]
    assert mounts[1].super_options == ("rw", "cpuset", "memory")


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"cpus": "0-"}, "Limits.cpus must be a kernel list such as 0-3,8 or empty, got '0-'"),
    ({"mems": "a"}, "Limits.mems must be a kernel list such as 0-3,8 or empty, got 'a'"),
    ({"memory": -1}, "Limits.memory must be a whole number >= 0 (0 = no limit), got -1"),
    ({"pids": True}, "Limits.pids must be a whole number >= 0 (0 = no limit), got True"),
])
def test_given_bad_limits_then_they_are_refused(kwargs: dict[str, object], text: str) -> None:
    with pytest.raises(CgroupError) as err:
        Limits(**kwargs)  # type: ignore[arg-type]
    assert str(err.value) == text


def test_limits_read_back_from_the_json_they_write_and_a_wrong_kind_is_named() -> None:
    """What a slave host's READY reply carries comes back as the same limits on its master;
    a field of the wrong kind is one error naming it, a field left out is no limit."""
    made = Limits(cpus="0-3", mems="0", memory=2 << 30, memory_swap=3 << 30, pids=512)
    assert json.loads(json.dumps(made.as_json())) == {
        "cpus": "0-3", "mems": "0", "memory": 2 << 30, "memory_swap": 3 << 30, "pids": 512}
    assert Limits.from_json(json.loads(json.dumps(made.as_json()))) == made
    assert Limits.from_json({"cpus": "3", "status": "ready"}) == Limits(cpus="3")
    with pytest.raises(CgroupError) as err:
        Limits.from_json({"memory": "2G"})
    assert str(err.value) == "Limits.memory must be a whole number >= 0 (0 = no limit), got '2G'"


@pytest.mark.parametrize(("memory", "memory_swap", "ram"), [
    (0, 0, 0), (64, 0, 64), (0, 64, 64), (64, 128, 64), (128, 64, 64)])
def test_ram_is_the_smaller_of_the_two_requests(memory: int, memory_swap: int, ram: int) -> None:
    assert Limits(memory=memory, memory_swap=memory_swap).ram == ram


def test_given_a_bad_parent_name_then_the_backend_refuses_it(tmp_path: Path) -> None:
    for bad in ("", ".", "..", "a/b"):
        with pytest.raises(CgroupError) as err:
            detect(name=bad, proc=fake_proc(tmp_path / bad.replace("/", "_").replace(".", "d"),
                                            RHEL6))
        assert str(err.value) == ("the cgroup name must be one directory name (not '.', '..', "
                                  f"no '/'), got {bad!r}")
