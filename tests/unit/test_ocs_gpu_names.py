"""GPU ids as Grid Engine names them (issue 38): numbers or names, mapped to devices by one rule.

An RSMAP's ids are the admin's words: Open Cluster Scheduler 9.1.4 granted ``0 1`` on a host
whose ``complex_values`` said ``gpu=2(0 1)``, and ``nvidia0`` / ``nvidia1`` where it said
``gpu=2(nvidia0 nvidia1)`` (``SGE_HGR_gpu`` in the spooled ``environment`` files of
tests/fixtures/ocs-9.1.4). geco reads each granted id by the first rule that applies: a
name in ``[gpu] names``, else ``nvidia<N>`` as ``/dev/nvidia<N>``, else a number N as the GPU
of id N (PCI bus order). It maps them once, where the node's table is known (the job's
containment: :class:`geco.node.limits.GpuShare`), saves the ids in the node's resource file,
and everything after reads ids. A grant it cannot map holds the job (exit 100, one sentence)
instead of refusing its shepherd, which Grid Engine would start again and again.

The node's GPUs are device nodes made with mknod and listed in ``[gpu] devices``, their minors
crossed as a driver may number them: id 0 is ``c 195:1`` (``/dev/nvidia1``'s numbers), id 1 is
``c 195:0``. So ``nvidia0`` is id 1: a mapping by order instead of by device would be caught.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from geco import config as _config
from geco import gpushare
from geco.config import Config
from geco.gpushare import Share
from geco.hooks import Exit, run
from geco.jobkey import JobKey
from geco.node import gpus, limits
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import lookup, resourcefile
from geco.sge.execd import JobRef
from tests.logkit import RecordingHandler, handler_on

OCS = Path(__file__).resolve().parents[1] / "fixtures" / "ocs-9.1.4"
HOST = "vm"  # the fixtures' one host
KEY = JobKey(6, 1)

# hooks.run() sets up geco's logging (stderr and the journal): undone after each test
pytestmark = pytest.mark.usefixtures("restored_geco_logger")


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Config]:
    """The node: two GPUs with crossed minors, a state dir, and a site config whose
    ``[gpu]`` section ends with the given text (the hooks read it from DEFAULT_PATH)."""
    devices = tmp_path / "dev"
    devices.mkdir()
    for name, minor in (("gpu-a", 1), ("gpu-b", 0)):
        os.mknod(devices / name, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    site = tmp_path / "geco.toml"
    monkeypatch.setattr(_config, "DEFAULT_PATH", site)

    def configured(gpu: str = "") -> Config:
        site.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n[gpu]\n'
                        f'devices = ["{devices / "gpu-a"}", "{devices / "gpu-b"}"]\n{gpu}\n')
        return _config.load(site)
    return configured


def contained(cfg: Config, granted: str) -> tuple[tuple[int, ...] | None, list[object], str]:
    """Contain the job's GPUs as its containment does, granted ``granted`` here (saved in its
    resource file as qstat or the spool gave it): the ids it gets, the devices it is denied
    and its GPU list on record afterwards."""
    rs = ResourceSet(KEY.job, KEY.task, owner="ocsuser",
                     nodes=(NodeResources(HOST, slots=1, gpus=granted),))
    resourcefile.write(cfg.resources_dir, rs)
    share = limits.gpu_share(cfg, rs, rs.nodes[0], HOST)
    ids = share.ids(KEY, frozenset(), backend=None)  # type: ignore[arg-type]  # granted ids: no other job is asked
    share.save(ids)
    saved = resourcefile.read(cfg.resources_dir, KEY)
    assert saved is not None
    return ids, list(share.denied(ids)), saved.nodes[0].gpus


def spooled_grant(tmp_path: Path, env_file: str, complex_name: str = "gpu") -> str:
    """The GPU list the master node knows from the job's spool alone (the qmaster
    unreachable): ``SGE_HGR_<complex>`` as OCS spooled it in ``env_file``."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "config").write_text("job_owner=ocsuser\njob_name=arr\n")
    (spool / "pe_hostfile").write_bytes((OCS / "pe_hostfile-gpu1.txt").read_bytes())
    (spool / "environment").write_bytes((OCS / env_file).read_bytes())
    [here] = lookup.from_spool(JobRef(KEY.job, KEY.task, spool), complex_name).nodes
    return here.gpus


def test_numbers_are_the_gpus_of_those_ids_as_before(node: Callable[[str], Config],
                                                     tmp_path: Path) -> None:
    """Given OCS's grant on a host with gpu=2(0 1) (SGE_HGR_gpu="0 1"), then the job gets ids
    0 and 1, is denied neither device, its record is left as Grid Engine wrote it, and it is
    told GECO_GPUS=0,1."""
    cfg = node("")
    granted = spooled_grant(tmp_path, "env-gpu2.txt")
    assert granted == "0,1"
    assert contained(cfg, granted) == ((0, 1), [], "0,1")
    assert contained(cfg, "1") == ((1,), [("c", 195, 1)], "1")
    assert gpus.job_environment(cfg, KEY, HOST) == {
        "GECO_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize(("env_file", "gpu_id", "other_minor"), [
    ("env-array-gpu1.task1.txt", 1, 1), ("env-array-gpu1.task2.txt", 0, 0)])
def test_nvidia_n_is_the_gpu_whose_device_is_dev_nvidia_n(
        node: Callable[[str], Config], tmp_path: Path, env_file: str, gpu_id: int,
        other_minor: int) -> None:
    """Given OCS's grants on a host with gpu=2(nvidia0 nvidia1) (task 1 got nvidia0, task 2
    nvidia1), then nvidia<N> is the GPU of minor N, whatever its id: nvidia0 is id 1 here.
    The job is denied the other GPU's device only, its record says the id from now on, and
    it is told that id."""
    cfg = node("")
    granted = spooled_grant(tmp_path, env_file)
    assert granted == f"nvidia{1 - gpu_id}"
    assert contained(cfg, granted) == ((gpu_id,), [("c", 195, other_minor)], str(gpu_id))
    assert gpus.job_environment(cfg, KEY, HOST)["GECO_GPUS"] == str(gpu_id)


def test_both_nvidia_names_of_a_two_gpu_grant_are_both_gpus(
        node: Callable[[str], Config]) -> None:
    cfg = node("")
    assert contained(cfg, "nvidia0,nvidia1") == ((0, 1), [], "0,1")
    assert gpus.job_environment(cfg, KEY, HOST) == {
        "GECO_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_name_in_the_gpu_table_is_the_gpu_it_is_set_to_by_id_or_device_file(
        node: Callable[[str], Config], tmp_path: Path) -> None:
    """Given [gpu] names setting gpuA to id 0, gpuB to a device file (a link to the second
    GPU's device: the same numbers) and nvidia0 to id 0 (a name there wins over the
    nvidia<N> rule), then each grant is the GPU it is set to."""
    (tmp_path / "second").symlink_to(tmp_path / "dev" / "gpu-b")
    cfg = node(f'names = {{ gpuA = 0, gpuB = "{tmp_path / "second"}", nvidia0 = 0 }}')
    assert cfg.gpu_names == (("gpuA", 0), ("gpuB", str(tmp_path / "second")), ("nvidia0", 0))
    assert contained(cfg, "gpuB") == ((1,), [("c", 195, 1)], "1")
    assert contained(cfg, "gpuA,gpuB") == ((0, 1), [], "0,1")
    assert contained(cfg, "nvidia0") == ((0,), [("c", 195, 0)], "0")


def test_a_grant_that_names_no_gpu_holds_the_job_with_one_sentence(
        node: Callable[[str], Config], capsys: pytest.CaptureFixture[str]) -> None:
    """Given a granted id that is none of the rules' (gpuZ), then the job is contained with
    no GPU (both denied: never refused, or Grid Engine would start it again and again), the
    containment journals why, Grid Engine's id stays on record, and the hook that tells the
    job its GPUs (the starter; the prolog alike) holds it: exit 100 and one sentence naming
    the id, the rule and the node's GPUs."""
    cfg = node("")
    records = RecordingHandler()
    with handler_on("geco.node.limits", records):
        assert contained(cfg, "gpuZ") == (None, [("c", 195, 1), ("c", 195, 0)], "gpuZ")
    sentence = (
        "Grid Engine granted GPU 'gpuZ', but it names no GPU here: geco reads a granted id "
        "as a name in [gpu] names, else nvidia<N> as /dev/nvidia<N>, else a number N as the "
        f"GPU of index N in PCI bus order, and this node's GPUs are 0={cfg.gpu_devices[0]}, "
        f"1={cfg.gpu_devices[1]}")
    [record] = records.records
    assert record.levelno == logging.ERROR
    assert record.geco_fields["GECO_EVENT"] == "gpu-grant-unmapped"  # type: ignore[attr-defined]
    assert record.getMessage() == (f"job 6.1: {sentence}; it is contained with no GPU, and "
                                   "its prolog or starter holds it in error state")

    def starter(cfg: Config, logger: object) -> Exit:
        gpus.job_environment(cfg, KEY, HOST)
        return Exit.OK
    assert run("starter", starter) == Exit.JOB_ERROR
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"geco starter: {sentence} (job=6.1 node={HOST}); the job is put in error state")


def test_a_table_name_set_to_a_gpu_the_node_lacks_says_so(
        node: Callable[[str], Config]) -> None:
    cfg = node('names = { gpuA = 5, gpuB = "/dev/no-such-gpu" }')
    for name, target in (("gpuA", "5"), ("gpuB", "'/dev/no-such-gpu'")):
        with pytest.raises(gpus.GpuGrantError) as info:
            gpus.map_share(gpushare.parse_share(name), gpus.node_table(cfg.gpu_devices),
                           cfg.gpu_names)
        assert str(info.value).startswith(
            f"Grid Engine granted GPU '{name}', but [gpu] names sets it to {target}, no GPU "
            "here: geco reads a granted id as a name in [gpu] names, else nvidia<N>")


def test_mixed_ids_each_follow_the_rule(node: Callable[[str], Config]) -> None:
    """Given a number and an nvidia<N> name in one grant, then each is read by its rule:
    1 is id 1, nvidia1 (minor 1) is id 0."""
    cfg = node("")
    assert contained(cfg, "1 nvidia1") == ((0, 1), [], "0,1")


def test_an_id_granted_twice_is_one_gpu_but_two_ids_of_one_gpu_hold_the_job(
        node: Callable[[str], Config]) -> None:
    """Given the same id twice, then it is one GPU; given two ids that are one GPU here
    (0 and nvidia1: minor 1 is id 0), then the job would get fewer GPUs than it was granted,
    so it is held, naming both and the device."""
    cfg = node("")
    assert gpushare.parse_share("nvidia0 nvidia0") == Share(1, names=("nvidia0",))
    assert contained(cfg, "nvidia0 nvidia0") == ((1,), [("c", 195, 1)], "1")
    assert contained(cfg, "0,nvidia1")[0] is None
    with pytest.raises(gpus.GpuGrantError) as info:
        gpus.job_environment(cfg, KEY, HOST)
    assert str(info.value) == (
        f"Grid Engine granted GPUs '0' and 'nvidia1', which are one GPU here "
        f"({cfg.gpu_devices[0]}, id 0), so the job would get fewer GPUs than it was granted: "
        f"name each GPU once in the host's complex_values or [gpu] names (job=6.1 node={HOST})")


def test_an_int_consumables_amount_in_sge_hgr_is_no_gpu_id(tmp_path: Path) -> None:
    """Given OCS's SGE_HGR_gpuint=2.000000 (a plain INT consumable: an amount), then the
    spool gives no GPU list: how many is no id, and geco does not guess."""
    assert spooled_grant(tmp_path, "env-mpi2-INTgpu1-hvmem-hrt.txt", "gpuint") == ""


@pytest.mark.parametrize(("text", "why"), [
    ('names = { "0" = 1 }', "must name Grid Engine GPU ids that are not numbers (a number "
                            "is always the GPU of that id) and hold no space, ',' or '=', "
                            "got '0'"),
    ('names = { "gpu A" = 1 }', "must name Grid Engine GPU ids that are not numbers (a "
                                "number is always the GPU of that id) and hold no space, ',' "
                                "or '=', got 'gpu A'"),
    ('names = { gpuA = "nvidia0" }', "must set each name to a GPU's id (0, its index in PCI "
                                     "bus order) or its device file (\"/dev/nvidia0\"), got "
                                     "gpuA = 'nvidia0'"),
    ('names = { gpuA = -1 }', "must set each name to a GPU's id (0, its index in PCI bus "
                              "order) or its device file (\"/dev/nvidia0\"), got gpuA = -1"),
    ('names = ["gpuA"]', "must be a table such as { gpuA = 0, gpuB = \"/dev/nvidia1\" }, got "
                         "['gpuA']"),
])
def test_a_bad_gpu_table_is_logged_and_no_name_used(
        node: Callable[[str], Config], text: str, why: str) -> None:
    records = RecordingHandler()
    with handler_on("geco.config", records):
        cfg = node(text)
    assert cfg.gpu_names == ()
    assert [r.getMessage() for r in records.records] == [
        f"config {_config.DEFAULT_PATH}: gpu.names {why}; using the default ()"]
