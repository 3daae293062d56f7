"""What `geco check` says the node gives jobs (geco.reports.nodeview): cores, memory, the default
for a job that requests none, the GPUs with their devices, and how the kernel moves a
process into its job, as the configuration and the kernel say them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from geco.cgroup import Backend, detect
from geco.config import Config
from geco.cpulist import format_cpulist
from geco.reports import nodeview

M = 1 << 20


def _before_any_job() -> Backend:
    """This machine's backend with a GECO parent no job has made yet (nothing is created):
    the cores are then the ones this process may run on."""
    return detect(name=f"geco-test-nodeview-{os.getpid()}")


def test_the_picture_names_the_reserves_the_default_and_each_gpus_device(
        tmp_path: Path) -> None:
    for name, minor in (("a", 1), ("b", 0)):
        os.mknod(tmp_path / name, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    cpus = sorted(os.sched_getaffinity(0))
    cfg = Config(cpus_reserve=str(cpus[0]), memory_reserve=256 * M, memory_per_slot=2 << 30,
                 gpu_devices=(str(tmp_path / "a"), str(tmp_path / "b")),
                 state_dir=_complexes(tmp_path, ""))
    lines = dict(nodeview.lines(cfg, _before_any_job()))
    rest = cpus[1:]
    assert lines["cores"] == (f"cpus {format_cpulist(rest) or 'none'} for jobs ({len(rest)}); "
                              f"cpus {cpus[0]} kept for the node's daemons ([cgroup] "
                              "cpus_reserve)")
    assert lines["memory"].startswith("all jobs together may use ")
    assert lines["memory"].endswith("less 256M kept for its daemons ([cgroup] memory_reserve)")
    assert lines["default"] == ("a job that requests no memory gets RAM 2G per slot, RAM+swap "
                                "unlimited ([cgroup] memory_per_slot, vmem_per_slot; else the "
                                "memory complexes' defaults, qconf -sc)")
    assert lines["gpus"] == (
        f"2, each job opens only those Grid Engine granted it ([gpu] complex gpu): "
        f"0 = {tmp_path / 'a'} (c 195:1), 1 = {tmp_path / 'b'} (c 195:0)")


def _complexes(tmp_path: Path, qconf_sc: str) -> Path:
    """A state dir holding ``qconf -sc``'s answer as gecod keeps it (fresh: not asked again)."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "complexes").write_text(qconf_sc)
    return state


def test_a_node_without_reserves_defaults_or_gpus_says_so(tmp_path: Path) -> None:
    cfg = Config(gpu_devices=(str(tmp_path / "missing"),), state_dir=_complexes(tmp_path, ""))
    lines = dict(nodeview.lines(cfg, _before_any_job()))
    assert lines["cores"].endswith("none kept back ([cgroup] cpus_reserve)")
    assert lines["default"] == ("a job that requests no memory runs with no memory limit "
                                "([cgroup] memory_per_slot, vmem_per_slot; else the memory "
                                "complexes' defaults, qconf -sc)")
    assert lines["gpus"].startswith("unusable: cannot use the GPU device in [gpu] devices: ")


def test_the_default_is_grid_engines_complex_default_where_the_config_sets_none(
        tmp_path: Path) -> None:
    """Given no [cgroup] default and Grid Engine's h_vmem consumable with a default of 2G
    (as in the demo's cluster), then `geco check` says such a job gets RAM+swap 2G per slot,
    which is what its containment gives it."""
    sc = ("#name shortcut type relop requestable consumable default urgency\n"
          "h_vmem h_vmem MEMORY <= YES YES 2G 0\n")
    cfg = Config(state_dir=_complexes(tmp_path, sc))
    assert dict(nodeview.lines(cfg, _before_any_job()))["default"] == (
        "a job that requests no memory gets RAM unlimited, RAM+swap 2G per slot ([cgroup] "
        "memory_per_slot, vmem_per_slot; else the memory complexes' defaults, qconf -sc)")



def _proc_with(tmp_path: Path, mountinfo: bytes) -> Path:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_bytes(mountinfo)
    return tmp_path / "proc"


# A v1 hierarchy mounted favordynmods, as this kernel shows it in mountinfo. The tests do
# not mount one: the kernel's lock leaves that mode when every such hierarchy is gone,
# and one unmounted on Linux 6.18 here left it on until the next boot.
FAVOR = (b"45 27 0:39 / /tmp/favor rw,relatime shared:23 - cgroup cgroup "
         b"rw,relatime,favordynmods,name=geco-favor\n")


def test_the_picture_says_whether_the_kernel_moves_a_process_at_once(tmp_path: Path) -> None:
    """The line follows the kernel's mount table: this machine's own, without and then with a
    hierarchy mounted favordynmods."""
    mine = Path("/proc/self/mountinfo").read_bytes().replace(b",favordynmods", b"")
    off = dict(nodeview.lines(Config(), _before_any_job(), _proc_with(tmp_path / "a", mine)))
    on = dict(nodeview.lines(Config(), _before_any_job(),
                             _proc_with(tmp_path / "b", mine + FAVOR)))
    assert off["moves"].startswith("the kernel's default: after a quiet moment, the first "
                                   "process moved into a job waits for an RCU grace period")
    assert off["moves"].endswith("wants favordynmods (README: Busy nodes)")
    assert on["moves"].startswith("favordynmods: the kernel moves a process into its job at "
                                  "once")
