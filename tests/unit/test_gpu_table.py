"""A node's GPU table, a job's share of it, the pick and what the job is told (geco.node.gpus).

The driver's table is read from a recorded ``/proc/driver/nvidia/gpus`` layout (one
``<pci bus id>/information`` per GPU, "Device Minor: N") whose minors are not the ids,
as the driver may number them; device files are made with mknod where the table is
read from ``/dev`` or from ``[gpu] devices``. The Grid Engine side (RSMAP ids in qstat,
``SGE_HGR_<name>``) is in test_qstat.py and below; ids that are names (``nvidia0``, a
``[gpu] names`` table) in test_ocs_gpu_names.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from geco import gpushare
from geco.errors import GecoError
from geco.gpushare import Share
from geco.node import gpus
from geco.node.gpus import Gpu, GpusUnavailable
from geco.sge import lookup
from geco.sge.execd import JobRef

# the "information" file as the driver prints it (trimmed)
INFORMATION = """Model: \t\t NVIDIA A100-SXM4-40GB
IRQ:   \t\t 180
GPU UUID: \t GPU-3b1c1a3e-0000-0000-0000-000000000000
Video BIOS: \t 92.00.25.00.08
Bus Type: \t PCIe
DMA Size: \t 47 bits
DMA Mask: \t 0x7fffffffffff
Bus Location: \t {bus}
Device Minor: \t {minor}
GPU Excluded:\t No
"""


def driver_tree(root: Path, gpus_by_bus: dict[str, tuple[int, int]]) -> tuple[Path, Path]:
    """``proc`` and ``sys`` trees with the given ``bus: (minor, numa)`` GPUs."""
    proc, sys = root / "proc", root / "sys"
    for bus, (minor, numa) in gpus_by_bus.items():
        d = proc / "driver/nvidia/gpus" / bus
        d.mkdir(parents=True)
        (d / "information").write_text(INFORMATION.format(bus=bus, minor=minor))
        pci = sys / "bus/pci/devices" / bus.lower()
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{numa}\n")
    return proc, sys


def test_the_drivers_table_gives_ids_in_pci_bus_order_and_each_ones_minor(
        tmp_path: Path) -> None:
    """Given four GPUs whose minors the driver gave out of bus order, then the ids follow
    the bus order (nvidia-smi's index, CUDA's under PCI_BUS_ID) and map to those minors."""
    proc, sys = driver_tree(tmp_path, {"0000:C1:00.0": (0, 1), "0000:07:00.0": (2, 0),
                                       "0000:81:00.0": (1, 1), "0000:0F:00.0": (3, 0)})
    table = gpus.node_table(proc=proc, sys=sys, dev=Path("/dev"))
    assert table == (Gpu(0, "/dev/nvidia2", 195, 2, 0), Gpu(1, "/dev/nvidia3", 195, 3, 0),
                     Gpu(2, "/dev/nvidia1", 195, 1, 1), Gpu(3, "/dev/nvidia0", 195, 0, 1))


def test_without_the_driver_the_dev_files_are_the_table_in_minor_order(tmp_path: Path) -> None:
    for name, minor in (("nvidia1", 1), ("nvidia0", 0), ("nvidiactl", 255), ("nvidia10", 10)):
        os.mknod(tmp_path / name, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    table = gpus.node_table(proc=tmp_path / "none", sys=tmp_path, dev=tmp_path)
    assert [(g.id, g.minor) for g in table] == [(0, 0), (1, 1), (2, 10)]


def test_a_node_without_gpus_has_an_empty_table(tmp_path: Path) -> None:
    assert gpus.node_table(proc=tmp_path, sys=tmp_path, dev=tmp_path) == ()


def test_configured_devices_are_ids_in_order_with_the_minors_they_really_have(
        tmp_path: Path) -> None:
    """Given [gpu] devices listing files whose minors are crossed, then id 0 is the first
    file with its own minor (nothing assumed from the name)."""
    for name, minor in (("a", 1), ("b", 0)):
        os.mknod(tmp_path / name, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    table = gpus.node_table([str(tmp_path / "a"), str(tmp_path / "b")])
    assert [(g.id, g.minor) for g in table] == [(0, 1), (1, 0)]
    assert gpus.denied(table, [0]) == [("c", 195, 0)]


def test_a_node_without_gpus_denies_a_job_every_nvidia_device_it_may_make_later() -> None:
    """Given a node where geco knows no GPU (the driver not loaded yet, /dev/nvidia<N> not
    made yet: nvidia-modprobe makes them on first use), then a job is denied every minor
    of NVIDIA's major 195 (nvidiactl's 255 too), and every MIG capability device when the
    caps' major is known; fail closed, not "nothing to deny"."""
    assert gpus.denied((), ()) == [("c", 195, None)]
    assert gpus.denied((), (), gpus.MigCaps(240, b"config 1\ngpu0/gi0/access 3\n")) == [
        ("c", 195, None), ("c", 240, None)]


# /proc/devices as a node with the driver and its MIG capabilities has it (trimmed)
PROC_DEVICES = """Character devices:
  1 mem
  4 tty
195 nvidia
236 nvidia-uvm
237 nvidia-caps-imex-channels
240 nvidia-caps

Block devices:
  8 sd
241 nvidia-caps
"""
# /proc/driver/nvidia-caps/mig-minors (trimmed): gpu<N> is the GPU's device minor
MIG_MINORS = """config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu1/gi0/access 138
gpu1/gi0/ci0/access 139
gpu1/gi1/access 147
gpu2/gi0/access 273
"""


def caps_tree(root: Path, devices: str = PROC_DEVICES, minors: str | None = MIG_MINORS) -> Path:
    """A ``proc`` tree with ``devices`` and, unless None, the MIG ``minors`` table."""
    proc = root / "proc"
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "devices").write_text(devices)
    if minors is not None:
        (proc / "driver/nvidia-caps/mig-minors").write_text(minors)
    return proc


def test_the_mig_caps_are_the_char_major_of_nvidia_caps_and_the_minors_of_a_gpus_caps(
        tmp_path: Path) -> None:
    """Given the driver's caps major and table, then the caps of GPUs (by device minor:
    gpu<N>/...) come with the node's own (config, monitor), in the table's order."""
    caps = gpus.mig_caps(caps_tree(tmp_path))
    assert caps == gpus.MigCaps(240, MIG_MINORS.encode())
    assert caps.minors([0, 1, 2]) == [1, 2, 3, 4, 138, 139, 147, 273]
    assert caps.minors({1}) == [1, 2, 138, 139, 147]
    assert caps.minors([]) == [1, 2]
    assert gpus.MigCaps(240, b"gpu1/gi0/access 138\ngpu11/gi0/access 1488\n").minors([1]) == [138]


def test_without_the_nvidia_caps_major_there_are_no_mig_caps(tmp_path: Path) -> None:
    """No ``nvidia-caps`` character line (no driver, or one without MIG caps): None, even
    beside a table; a block device of that name, or nvidia-caps-imex-channels, is not it."""
    devices = PROC_DEVICES.replace("240 nvidia-caps\n", "")
    assert gpus.mig_caps(caps_tree(tmp_path, devices)) is None
    assert gpus.mig_caps(tmp_path / "no-proc") is None


@pytest.mark.parametrize("minors", [None, "config 1\ngpu0/gi0/access three\n", "gpu0 3\n",
                                    "gpuX/gi0/access 3\n"])
def test_a_mig_table_that_cannot_be_read_leaves_only_the_major(
        tmp_path: Path, minors: str | None) -> None:
    """Given the caps' major but their table missing or with a line that is not
    ``<name> <minor>`` (``gpu<N>/...`` for a GPU's), then the caps are known by their major
    alone, and a job is denied all of them (fail closed)."""
    caps = gpus.mig_caps(caps_tree(tmp_path, minors=minors))
    assert caps is not None and caps.major == 240 and caps.minors([0]) is None
    table = (Gpu(0, "/dev/nvidia1", 195, 1), Gpu(1, "/dev/nvidia0", 195, 0))
    assert gpus.denied(table, [0], caps) == [("c", 195, 0), ("c", 240, None)]


def test_a_job_is_denied_the_mig_caps_of_the_gpus_it_was_not_granted_and_config_and_monitor(
        tmp_path: Path) -> None:
    """Given two GPUs whose ids and minors are crossed (id 0 = minor 1) and the MIG table,
    when a job is granted id 0, then it is denied GPU minor 0, the caps of gpu0 (minor 0 is
    id 1's), config and monitor, and keeps the caps of gpu1 (its own GPU's minor); a GPU the
    node's table does not list (gpu2) is as open as its device (not geco's). A job granted
    none is denied every cap (the caps' whole major)."""
    caps = gpus.mig_caps(caps_tree(tmp_path))
    table = (Gpu(0, "/dev/nvidia1", 195, 1), Gpu(1, "/dev/nvidia0", 195, 0))
    assert gpus.denied(table, [0], caps) == [
        ("c", 195, 0), ("c", 240, 1), ("c", 240, 2), ("c", 240, 3), ("c", 240, 4)]
    assert gpus.denied(table, [1], caps) == [
        ("c", 195, 1), ("c", 240, 1), ("c", 240, 2), ("c", 240, 138), ("c", 240, 139),
        ("c", 240, 147)]
    assert gpus.denied(table, [0, 1], caps) == [("c", 240, 1), ("c", 240, 2)]
    assert gpus.denied(table, [], caps) == [("c", 195, 1), ("c", 195, 0), ("c", 240, None)]
    assert gpus.denied(table, [0], None) == [("c", 195, 0)]


def test_a_configured_device_that_is_not_a_character_device_is_named(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    with pytest.raises(GecoError) as info:
        gpus.node_table([str(tmp_path / "plain")])
    assert str(info.value) == ("a GPU in [gpu] devices must be a character device "
                               f"(path={tmp_path / 'plain'})")
    with pytest.raises(GecoError) as info:
        gpus.node_table([str(tmp_path / "missing")])
    assert str(info.value).startswith("cannot use the GPU device in [gpu] devices: No such ")


@pytest.mark.parametrize(("text", "share", "canonical"), [
    ("", Share(), ""), ("count:2", Share(2, (), True), "count:2"),
    ("count:2=3,1", Share(2, (1, 3), True), "count:2=1,3"),
    ("1,3", Share(2, (1, 3)), "1,3"), ("3 1", Share(2, (1, 3)), "1,3"),
    (" 0 ", Share(1, (0,)), "0"), ("count:0", Share(0, (), True), "count:0"),
    ("1 1", Share(1, (1,)), "1"),
    ("nvidia1 nvidia0", Share(2, names=("nvidia1", "nvidia0")), "nvidia1,nvidia0"),
    ("gpuB,gpuA,gpuB", Share(2, names=("gpuB", "gpuA")), "gpuB,gpuA"),
    ("0 nvidia1", Share(2, names=("0", "nvidia1")), "0,nvidia1"),
])
def test_a_node_records_gpu_list_is_granted_ids_or_a_count_and_its_pick(
        text: str, share: Share, canonical: str) -> None:
    """Numbers are ids; a list with any other word is Grid Engine's ids as granted (each
    once, in its order), mapped to the node's GPUs at containment (test_ocs_gpu_names)."""
    assert gpushare.parse_share(text) == share
    assert str(share) == canonical


@pytest.mark.parametrize(("text", "message"), [
    ("count:two", "a GPU count must be a whole number, got 'count:two'"),
    ("count:1=gpu0", "a GPU list must be ids in PCI bus order such as 0,1, got 'count:1=gpu0'"),
    ("count:-1", "a GPU count must be a whole number, got 'count:-1'"),
])
def test_a_gpu_list_of_anything_else_is_named(text: str, message: str) -> None:
    with pytest.raises(GecoError) as info:
        gpushare.parse_share(text)
    assert str(info.value) == message


TWO_SOCKETS = tuple(Gpu(i, f"/dev/nvidia{i}", 195, i, i // 4) for i in range(8))


def test_the_pick_prefers_gpus_on_the_jobs_numa_nodes_then_the_lowest_ids() -> None:
    assert gpus.pick(TWO_SOCKETS, 2, busy=[], near=[1]) == (4, 5)
    assert gpus.pick(TWO_SOCKETS, 2, busy=[4, 5, 6], near=[1]) == (0, 7)
    assert gpus.pick(TWO_SOCKETS, 3, busy=[0], near=[]) == (1, 2, 3)
    assert gpus.pick(TWO_SOCKETS, 0, busy=range(8)) == ()


def test_a_pick_beyond_the_free_gpus_says_how_many_are_free() -> None:
    with pytest.raises(GpusUnavailable) as info:
        gpus.pick(TWO_SOCKETS, 3, busy=range(6))
    assert str(info.value) == ("the job needs 3 GPU(s) here, but only 2 of this node's 8 "
                               "are free")


def test_a_granted_id_the_node_lacks_is_named() -> None:
    """Given ids Grid Engine granted (numbers: the GPUs of those ids), then they are the
    job's where the node has them, and an id it lacks is the job's error naming it, the
    rule and the node's GPUs (the hooks hold the job: test_ocs_gpu_names)."""
    assert gpus.map_share(gpushare.parse_share("7 0"), TWO_SOCKETS) == Share(2, (0, 7))
    with pytest.raises(gpus.GpuGrantError) as info:
        gpus.map_share(gpushare.parse_share("1,3"), TWO_SOCKETS[:2])
    assert str(info.value) == (
        "Grid Engine granted GPU '3', but it names no GPU here: geco reads a granted id as "
        "a name in [gpu] names, else nvidia<N> as /dev/nvidia<N>, else a number N as the "
        "GPU of index N in PCI bus order, and this node's GPUs are 0=/dev/nvidia0, "
        "1=/dev/nvidia1")


def test_the_job_is_told_its_node_ids_and_cuda_counts_its_own_from_zero() -> None:
    """SGE_HGR_gpu="1 3" (or RSMAP gpu=2(1 3)) -> CUDA_VISIBLE_DEVICES=0,1: the job's cgroup
    lets CUDA open only those two, which it numbers from 0 in PCI bus order."""
    assert gpus.environment(gpushare.parse_share("1 3").ids) == {
        "GECO_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpus.environment(()) == {"GECO_GPUS": "", "CUDA_VISIBLE_DEVICES": "",
                                    "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize(("hgr", "gpus_here"), [
    ("SGE_HGR_gpu=1 3\n", "1,3"), ("", ""), ("SGE_HGR_gpu=nvidia0 gpuB\n", "nvidia0,gpuB"),
    ("SGE_HGR_other=2\n", ""), ("SGE_HGR_gpu=2.000000\n", ""),
])
def test_without_qstat_the_master_node_takes_the_ids_from_sge_hgr(
        tmp_path: Path, hgr: str, gpus_here: str) -> None:
    """Given a job's spool (the qmaster unreachable, [qstat] run_without_memory_limits),
    then the master node's GPUs are the ids Grid Engine put in SGE_HGR_<complex> (names
    too: mapped at containment), a slave has none, and an INT consumable's amount (OCS
    writes SGE_HGR_gpuint=2.000000) gives none: how many is no id (never a guess)."""
    spool = tmp_path / "7.1"
    spool.mkdir()
    (spool / "config").write_text("job_owner=alice\njob_name=gpu\n")
    (spool / "pe_hostfile").write_text("n1 2 all.q@n1 UNDEFINED\nn2 1 all.q@n2 UNDEFINED\n")
    (spool / "environment").write_text(f"JOB_ID=7\n{hgr}")
    rs = lookup.from_spool(JobRef(7, 1, spool))
    assert [n.gpus for n in rs.nodes] == [gpus_here, ""]
