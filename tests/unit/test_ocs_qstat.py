"""Open Cluster Scheduler 9.1.4: every recorded job read as the hooks read it.

``tests/fixtures/ocs-9.1.4`` holds what a running OCS 9.1.4 printed (its README lists each
job's ``qsub`` line). Each running job is fetched the way the prolog and gecod fetch it
(:func:`geco.sge.qstat.fetch` with a qstat that prints the recorded ``qstat -xml -j``, and
the job's spooled ``pe_hostfile``), and its whole resource set is compared with what the
job asked (the README's table) and was granted; the grant is checked once more against
what execd itself told the job (``NSLOTS`` and ``SGE_HGR_<complex>`` in its spooled
``environment``). Requests OCS puts in a scope of their own (``qsub -scope``) were not
recorded: those documents are the recorded ones with their request sets, granted queues
and granted resources replaced, in the shapes OCS printed them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from geco.config import Config
from geco.gpushare import GpuComplex
from geco.resourceset import NodeResources, ResourceSet
from geco.sge.pe_hostfile import Placement, parse_pe_hostfile
from geco.sge.qstat import TaskNotRunning, fetch, parse_job, parse_placement_gt

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ocs-9.1.4"
G = 1024**3
OWNER = "ocsuser"
GPU = GpuComplex("gpu", "slot")       # the RSMAP, consumable YES (later JOB: same ids)
GPUINT = GpuComplex("gpuint", "slot")  # the plain INT consumable, YES


def recorded(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def fake_qstat(directory: Path, job: int, job_xml: bytes, listing: str | None = None) -> Path:
    """A qstat that prints ``job_xml`` for ``-xml -j <job>`` (and the recorded listing
    ``listing`` for ``-xml -u * -g t``), writing each call to ``calls``."""
    (directory / "job.xml").write_bytes(job_xml)
    gt = f'"-xml -u * -g t") cat {FIXTURES / listing} ;;' if listing else ""
    path = directory / "qstat"
    path.write_text(f"""#!/bin/sh
echo "$*" >> {directory / 'calls'}
case "$*" in
  "-xml -j {job}") cat {directory / 'job.xml'} ;;
  {gt}
  *) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
""")
    path.chmod(0o755)
    return path


def fetched(tmp_path: Path, kind: str, job: int, task: int, gpu: GpuComplex) -> ResourceSet:
    """Given the recorded job, when it is fetched as the prolog does (its spooled
    pe_hostfile beside it, when one was recorded), then this resource set."""
    qstat = fake_qstat(tmp_path, job, recorded(f"job-{kind}.xml"))
    hostfile = FIXTURES / f"pe_hostfile-{kind}.txt"
    cfg = Config(qstat=str(qstat), qstat_retries=0, gpu_complex=gpu.name,
                 gpu_consumable=gpu.per)
    return fetch(job, task, cfg, hostfile if hostfile.exists() else None,
                 sleep=lambda _: None)


def job(number: int, name: str, *nodes: NodeResources, task: int = 1, array: bool = False,
        cwd: str = "", h_rt: float = 0.0, h_vmem: int = 0) -> ResourceSet:
    """A resource set of ocsuser's job; cwd "" = submitted without -cwd (runs in $HOME)."""
    return ResourceSet(job_id=number, task_id=task, runtime_limit=h_rt, per_slot_vmem=h_vmem,
                       is_array=array, job_name=name, owner=OWNER, group=OWNER, cwd=cwd,
                       nodes=nodes)


def vm(slots: int, gpus: str, *, vmem: int = 0, memory: int = 0) -> NodeResources:
    """The recording's one host, the master."""
    return NodeResources("vm", is_slave=False, slots=slots, memory_limit=memory,
                         vmem_limit=vmem, gpus=gpus)


# (fixture kind, job, $ja_task_id, GPU complex, the resource set its qsub line and grant give)
RECORDED = [
    # qsub -b y -N gpu1 -l gpu=1 sleep 300
    ("gpu1", 1, 0, GPU, job(1, "gpu1", vm(1, "0"))),
    # qsub -b y -N gpu2 -l gpu=2 sleep 300
    ("gpu2", 2, 0, GPU, job(2, "gpu2", vm(1, "0,1"))),
    # qsub -b y -cwd -N arr -t 1-2 -l gpu=1 sleep 300 (ids named nvidia0, nvidia1 by then;
    # geco keeps a name as Grid Engine prints it)
    ("array-gpu1", 6, 1, GPU, job(6, "arr", vm(1, "nvidia0"), array=True, cwd="/tmp")),
    ("array-gpu1", 6, 2, GPU, job(6, "arr", vm(1, "nvidia1"), task=2, array=True, cwd="/tmp")),
    # qsub -b y -N mpi2 -pe mpi 2 -l gpu=1 sleep 300 (consumable YES: one per slot)
    ("mpi2-gpu1", 3, 0, GPU, job(3, "mpi2", vm(2, "0,1"))),
    # qsub -b y -N mpijob -pe mpi 2 -l gpu=1 sleep 300 (consumable JOB: one for the job)
    ("mpi2-gpu1-consumable-JOB", 8, 0, GpuComplex("gpu", "job"),
     job(8, "mpijob", vm(2, "nvidia0"))),
    # qsub -b y -N intgpu -pe mpi 2 -l gpuint=1,h_vmem=1G,h_rt=600 sleep 300: an INT
    # consumable has no ids, so the node's list is the count (1 per slot), for geco to pick
    ("mpi2-INTgpu1-hvmem-hrt", 9, 0, GPUINT,
     job(9, "intgpu", vm(2, "count:2", vmem=2 * G), h_rt=600.0, h_vmem=G)),
]


@pytest.mark.parametrize(("kind", "number", "task", "gpu", "expected"), RECORDED,
                         ids=[f"{r[0]}.{r[2]}" for r in RECORDED])
def test_a_recorded_job_gives_what_it_asked_and_was_granted(
        tmp_path: Path, kind: str, number: int, task: int, gpu: GpuComplex,
        expected: ResourceSet) -> None:
    """GPU ids, memory and RAM+swap per host, runtime limit, trace level, slots per host
    and the master, all at once; qstat is asked once (OCS lists the granted hosts)."""
    assert fetched(tmp_path, kind, number, task, gpu) == expected
    assert (tmp_path / "calls").read_text().splitlines() == [f"-xml -j {number}"]


def environment(name: str) -> dict[str, str]:
    lines = recorded(name).decode().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


@pytest.mark.parametrize(("kind", "number", "task", "gpu", "expected"), RECORDED,
                         ids=[f"{r[0]}.{r[2]}" for r in RECORDED])
def test_the_grant_read_is_what_execd_told_the_job(
        tmp_path: Path, kind: str, number: int, task: int, gpu: GpuComplex,
        expected: ResourceSet) -> None:
    """Given the job's spooled environment, then its NSLOTS are the slots read and its
    SGE_HGR_<complex> (ids separated by spaces; an INT consumable's amount) the GPUs."""
    env = environment(f"env-{kind}.task{task}.txt" if kind.startswith("array")
                      else f"env-{kind}.txt")
    node = fetched(tmp_path, kind, number, task, gpu).nodes[0]
    granted = env[f"SGE_HGR_{gpu.name}"]
    assert node.slots == int(env["NSLOTS"])
    assert node.gpus == (",".join(granted.split()) if gpu.name != "gpuint"
                         else f"count:{int(float(granted))}")


@pytest.mark.parametrize(("kind", "slots"), [
    ("gpu1", 1), ("gpu2", 1), ("mpi2-gpu1", 2), ("mpi2-gpu1-consumable-JOB", 2),
    ("mpi2-INTgpu1-hvmem-hrt", 2),
])
def test_the_spooled_pe_hostfile_gives_the_granted_slots(kind: str, slots: int) -> None:
    assert parse_pe_hostfile(recorded(f"pe_hostfile-{kind}.txt")) == [Placement("vm", slots,
                                                                                True)]


def test_a_pending_job_is_not_running() -> None:
    """qsub -b y -N pend -l gpu=2 sleep 300, still waiting: re-queued (99) if a hook asked."""
    with pytest.raises(TaskNotRunning) as info:
        parse_job(recorded("job-pending-gpu2.xml"), 0, job_id=7)
    assert str(info.value) == "job 7 has no running task (it is pending, or ending) (job=7 task=1)"


# ---------------------------------------------------------------------------
# qstat -g t and job_is_first_task FALSE (the PE mpi of the recording)


@pytest.mark.parametrize(("kind", "number"), [
    ("mpi2-gpu1", 3), ("mpi2-gpu1-consumable-JOB", 8), ("mpi2-INTgpu1-hvmem-hrt", 9),
])
def test_g_t_rows_of_a_2_slot_job_whose_master_task_holds_no_slot_give_2_slots(
        kind: str, number: int) -> None:
    """Given OCS's listing of a -pe mpi 2 job (job_is_first_task FALSE): one MASTER row
    for the master task and two SLAVE rows. Then 2 slots when the job's count is known,
    and the rows as printed (3) when it is not."""
    listing = recorded(f"job-{kind}.qstat-gt-all.xml")
    assert parse_placement_gt(listing, number, 0, job_slots=2) == [Placement("vm", 2, True)]
    assert parse_placement_gt(listing, number, 0) == [Placement("vm", 3, True)]


@pytest.mark.parametrize(("kind", "number", "task"), [
    ("gpu1", 1, 0), ("gpu2", 2, 0), ("array-gpu1", 6, 1), ("array-gpu1", 6, 2),
])
def test_g_t_rows_of_a_serial_job_or_array_task_give_its_one_slot(kind: str, number: int,
                                                                   task: int) -> None:
    listing = recorded(f"job-{kind}.qstat-gt-all.xml")
    assert parse_placement_gt(listing, number, task) == [Placement("vm", 1, True)]
    assert parse_placement_gt(listing, number, task, job_slots=1) == [Placement("vm", 1, True)]


def test_fetch_without_granted_hosts_or_pe_hostfile_counts_the_master_task_row_out(
        tmp_path: Path) -> None:
    """Given a -pe mpi 2 job whose qstat -j lists no granted hosts (as Son of Grid Engine
    prints it) and no readable pe_hostfile, then the -g t listing gives 2 slots, not 3."""
    xml = re.sub(rb"<JAT_granted_destin_identifier_list>.*?"
                 rb"</JAT_granted_destin_identifier_list>", b"",
                 recorded("job-mpi2-gpu1.xml"), flags=re.S)
    qstat = fake_qstat(tmp_path, 3, xml, "job-mpi2-gpu1.qstat-gt-all.xml")
    rs = fetch(3, 0, Config(qstat=str(qstat), qstat_retries=0), sleep=lambda _: None)
    assert rs.nodes == (vm(2, "0,1"),)
    assert (tmp_path / "calls").read_text().splitlines() == ["-xml -j 3", "-xml -u * -g t"]


# ---------------------------------------------------------------------------
# requests: sizes, and scopes (qsub -scope global | master | slave)


def request(name: str, text: str, value: str) -> str:
    """One hard request as OCS 9.1.4 printed it (job-mpi2-INTgpu1-hvmem-hrt.xml)."""
    return (f"<qstat_l_requests><CE_name>{name}</CE_name><CE_valtype>4</CE_valtype>"
            f"<CE_stringval>{text}</CE_stringval><CE_doubleval>{value}</CE_doubleval>"
            "<CE_relop>0</CE_relop><CE_consumable>0</CE_consumable></qstat_l_requests>")


def request_set(scope: int, *requests: str) -> str:
    return (f"<ulong_sublist><JRS_scope>{scope}</JRS_scope><JRS_hard_resource_list>"
            f"{''.join(requests)}</JRS_hard_resource_list><JRS_ignore_slave_requests_on_"
            "master_host>false</JRS_ignore_slave_requests_on_master_host></ulong_sublist>")


def granted_queue(host: str, slots: int) -> str:
    return (f"<element><JG_qname>all.q@{host}</JG_qname><JG_qversion>0</JG_qversion>"
            f"<JG_qhostname>{host}</JG_qhostname><JG_slots>{slots}</JG_slots>"
            "<JG_queue></JG_queue><JG_tag_slave_job>0</JG_tag_slave_job></element>")


def granted_ids(host: str, name: str, *ids: str) -> str:
    """An RSMAP grant (GRU_type 2) as OCS 9.1.4 printed it."""
    items = "".join(f"<element><RESL_value>{i}</RESL_value><RESL_id_instance>0"
                    "</RESL_id_instance><RESL_pe_task_id>0</RESL_pe_task_id><RESL_amount>1"
                    "</RESL_amount></element>" for i in ids)
    return (f"<element><GRU_type>2</GRU_type><GRU_name>{name}</GRU_name><GRU_amount>"
            f"{len(ids)}.000000</GRU_amount><GRU_resource_map_list>{items}"
            f"</GRU_resource_map_list><GRU_host>{host}</GRU_host></element>")


def granted_amount(host: str, name: str, amount: int) -> str:
    """A plain consumable's grant (GRU_type 0) as OCS 9.1.4 printed it."""
    return (f"<element><GRU_type>0</GRU_type><GRU_name>{name}</GRU_name><GRU_amount>"
            f"{amount}.000000</GRU_amount><GRU_host>{host}</GRU_host></element>")


def mpi_job(sets: str, queues: str, grants: str = "") -> bytes:
    """job-mpi2-INTgpu1-hvmem-hrt.xml (job 9, -pe mpi) with its request sets, granted
    queues and granted resources replaced by these (derived from the recording: OCS's
    shapes, with what a `qsub -scope ...` job on these hosts would hold)."""
    xml = recorded("job-mpi2-INTgpu1-hvmem-hrt.xml")
    for element, content in (("JB_request_set_list", sets),
                             ("JAT_granted_destin_identifier_list", queues),
                             ("JAT_granted_resources_list", grants)):
        xml, count = re.subn(f"<{element}>.*?</{element}>".encode(),
                             f"<{element}>{content}</{element}>".encode(), xml, flags=re.S)
        assert count == 1
    return xml


H_RT_600 = request("h_rt", "600", "600.000000")


def h_vmem(size: str) -> str:
    return request("h_vmem", size, f"{int(size[:-1]) * G}.000000")


def test_h_vmem_2G_of_a_2_slot_job_is_4G_of_ram_and_swap_on_its_host() -> None:
    """-pe mpi 2 -l h_vmem=2G,h_rt=600: RAM+swap is the per-slot request x the host's
    slots, the runtime limit 600 s."""
    xml = mpi_job(request_set(0, h_vmem("2G"), H_RT_600), granted_queue("vm", 2))
    rs = parse_job(xml, 0, job_id=9)
    assert rs == job(9, "intgpu", vm(2, "", vmem=4 * G), h_rt=600.0, h_vmem=2 * G)


def test_m_mem_free_is_the_request_x_slots_or_what_ocs_granted() -> None:
    """-pe mpi 2 -l m_mem_free=1G: 2G of RAM on the host; when OCS lists the granted
    amount (a consumable), that amount."""
    sets = request_set(0, request("m_mem_free", "1G", f"{G}.000000"))
    asked = parse_job(mpi_job(sets, granted_queue("vm", 2)), 0, job_id=9)
    assert asked.nodes == (vm(2, "", memory=2 * G),)
    granted = parse_job(mpi_job(sets, granted_queue("vm", 2),
                                granted_amount("vm", "m_mem_free", 3 * G)), 0, job_id=9)
    assert granted.nodes == (vm(2, "", memory=3 * G),)


def test_geco_requests_give_the_trace_level_and_standby() -> None:
    """-l geco_trace_level=3,standby=TRUE."""
    sets = request_set(0, request("geco_trace_level", "3", "3.000000"),
                       request("standby", "TRUE", "1.000000"))
    rs = parse_job(mpi_job(sets, granted_queue("vm", 2)), 0, job_id=9)
    assert (rs.trace_level, rs.is_standby) == (3, True)


MASTER_AND_SLAVE = granted_queue("vm", 1) + granted_queue("n2", 2)


@pytest.mark.parametrize("gpu", [GpuComplex("gpuint", "slot"), GpuComplex("gpuint", "job")])
def test_a_master_scope_gpu_count_reaches_the_master_host_only(gpu: GpuComplex) -> None:
    """-pe mpi 3 -scope master -l gpuint=1, on vm (the master task) and n2 (2 slave
    tasks): one GPU on vm, none on n2, per slot or per job alike."""
    xml = mpi_job(request_set(1, request("gpuint", "1", "1.000000")), MASTER_AND_SLAVE)
    rs = parse_job(xml, 0, job_id=9, gpu=gpu)
    assert [(n.name, n.is_slave, n.slots, n.gpus) for n in rs.nodes] == [
        ("vm", False, 1, "count:1"), ("n2", True, 2, "")]


def test_a_master_scope_rsmap_gpu_is_its_granted_id_on_the_master_host_only() -> None:
    """-pe mpi 3 -scope master -l gpu=1: OCS grants the id on vm; n2 gets no GPU (its
    slave tasks asked for none), not a count of its own."""
    xml = mpi_job(request_set(1, request("gpu", "1", "1.000000")), MASTER_AND_SLAVE,
                  granted_ids("vm", "gpu", "nvidia1"))
    rs = parse_job(xml, 0, job_id=9, gpu=GPU)
    assert [(n.name, n.gpus) for n in rs.nodes] == [("vm", "nvidia1"), ("n2", "")]


def test_a_slave_scope_request_reaches_the_slave_tasks_only() -> None:
    """-pe mpi 3 -scope slave -l gpuint=1,h_vmem=2G: the master host, running only the
    master task, gets neither; n2's two slave tasks get 2 GPUs and 4G."""
    xml = mpi_job(request_set(2, request("gpuint", "1", "1.000000"), h_vmem("2G")),
                  MASTER_AND_SLAVE)
    rs = parse_job(xml, 0, job_id=9, gpu=GPUINT)
    assert [(n.name, n.vmem_limit, n.gpus) for n in rs.nodes] == [
        ("vm", 0, ""), ("n2", 4 * G, "count:2")]
    assert (rs.per_slot_vmem, rs.runtime_limit) == (0, 0.0)


def test_scopes_add_up_per_task_on_each_host_and_the_job_wide_values_are_the_masters() -> None:
    """-pe mpi 4 -l h_rt=600 -scope master -l h_vmem=1G,gpuint=1 -scope slave -l
    h_vmem=2G, on vm (2 slots: the master task and one slave task) and n2 (2 slave tasks):
    vm gets 1G + 2G and the master's GPU, n2 2 x 2G; h_rt holds for every task."""
    sets = (request_set(0, H_RT_600)
            + request_set(1, h_vmem("1G"), request("gpuint", "1", "1.000000"))
            + request_set(2, h_vmem("2G")))
    xml = mpi_job(sets, granted_queue("vm", 2) + granted_queue("n2", 2))
    rs = parse_job(xml, 0, job_id=9, gpu=GPUINT)
    assert rs == job(9, "intgpu", vm(2, "count:1", vmem=3 * G),
                     NodeResources("n2", is_slave=True, slots=2, vmem_limit=4 * G),
                     h_rt=600.0, h_vmem=G)


def test_a_master_request_alone_leaves_slave_tasks_on_the_master_host_unlimited() -> None:
    """-pe mpi 2 -scope master -l h_vmem=1G on one host with 2 slots: the slave task there
    asked for no limit, so the host has none (OCS sets no h_vmem there either)."""
    xml = mpi_job(request_set(1, h_vmem("1G")), granted_queue("vm", 2))
    rs = parse_job(xml, 0, job_id=9)
    assert (rs.nodes[0].vmem_limit, rs.per_slot_vmem) == (0, G)


def test_geco_rsrcinfo_with_a_g_t_listing_counts_the_master_task_row_out(
        tmp_path: Path) -> None:
    """Given the same job's saved XML (no granted hosts) and its recorded -g t listing,
    when an admin runs `geco rsrcinfo --xml ... --placement ...`, then it shows 2 slots."""
    saved = tmp_path / "job.xml"
    saved.write_bytes(re.sub(rb"<JAT_granted_destin_identifier_list>.*?"
                             rb"</JAT_granted_destin_identifier_list>", b"",
                             recorded("job-mpi2-gpu1.xml"), flags=re.S))
    out = subprocess.run([sys.executable, "-m", "geco.cli", "rsrcinfo", "--xml", str(saved),
                          "--placement", str(FIXTURES / "job-mpi2-gpu1.qstat-gt-all.xml"),
                          "--format", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [(n["name"], n["slots"]) for n in json.loads(out.stdout)["nodes"]] == [("vm", 2)]
