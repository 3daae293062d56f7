"""Ask Grid Engine what one task of one job was granted: qstat XML -> ResourceSet.

The hooks call :func:`fetch` once per job; everything else here is a pure
parser over bytes, so it is tested against real qstat output
(``tests/fixtures/qstat``, recorded on Son of Grid Engine 8.1.9;
``tests/fixtures/ocs-9.1.4``, on Open Cluster Scheduler 9.1.4).

Where the facts are:

* ``qstat -xml -j <job>`` (:func:`parse_job`): owner, group, name, cwd,
  array-ness, the hard requests (``h_vmem``, ``m_mem_free``, ``h_rt``,
  ``geco_trace_level``, ``standby*``, ``phi_config_for_user``; all per slot;
  read by :mod:`geco.sge.requests` from Son of Grid Engine's and Univa's
  ``JB_hard_resource_list`` or Open Cluster Scheduler's per-scope request sets; a
  shape it does not know is journaled, ``qstat-shape-unknown``, once per job)
  and the job's tasks. Univa/Altair GE and Open Cluster Scheduler also print
  each task's granted hosts (``JAT_granted_destin_identifier_list``) and
  granted resources per host (``grl``: ``m_mem_free``, the GPU complex's RSMAP ids,
  ``intel_phi``); Son of Grid Engine 8.1.9 prints neither: a GPU request there is a
  count (``count:N`` in the node's GPU list) whose ids geco picks (:mod:`geco.node.gpus`).
* so the placement (hosts, slots per host, master) comes from the job's
  ``pe_hostfile`` (:func:`parse_pe_hostfile`; execd writes one for every job,
  serial ones too) or from ``qstat -xml -u '*' -g t`` (:func:`parse_placement_gt`).

qstat output is untrusted input: a job name is whatever the user typed.
The XML parser never resolves entities, never touches the network, keeps
libxml2's size limits and refuses any DOCTYPE (Grid Engine never prints one),
so a "billion laughs" or an external entity is a :class:`QstatParseError`,
never a hang or a file read. Text is decoded byte for byte: bytes that are not
UTF-8 survive as surrogate escapes, as :mod:`geco.resourceset` expects.

Outcomes a hook maps to an exit code (``sge_shepherd(8)``):

* :class:`~geco.errors.JobNotFound` - qstat does not know the job (finished
  or deleted): nothing to set up.
* :class:`TaskNotRunning` (a :class:`~geco.errors.QstatError`) - the job is
  known but this task is not running in qmaster's view (pending, or a race
  at start or end). Like every QstatError it is transient: the prolog exits 99
  so Grid Engine re-queues the job.
* :class:`~geco.errors.QstatError` - qstat could not be run or failed every retry,
  including a ``<comunication_error>`` answer (exit status 0: the qmaster cannot be
  reached). qstat runs through :mod:`geco.sge.command`, with the site's environment
  (:mod:`geco.sge.siteenv`), never the caller's: in the prolog that is the job's.
* :class:`~geco.errors.QstatParseError` - qstat answered something that is not
  what Grid Engine prints (or a value of the wrong type), naming the element.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from lxml import etree

from geco import log
from geco.config import Config
from geco.errors import JobNotFound, QstatParseError, TaskNotRunning
from geco.gpushare import COUNT_PREFIX, GpuComplex
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import _xml, requests
from geco.sge.command import excerpt, run_qstat
from geco.sge.pe_hostfile import Placement, merge, parse_pe_hostfile, shown
from geco.sge.requests import JobRequests
from geco.sge.siteenv import discover
from geco.units import decimal_value, parse_memory

__all__ = [
    "MAX_XML",
    "TaskNotRunning",
    "fetch",
    "job_number",
    "job_slots",
    "parse_job",
    "parse_placement_gt",
]

_log = log.get("sge.qstat")

# JB_type bit set for "-t" (array) jobs (recorded: 128 for -t, 64 for "-b y", 0 otherwise).
_JB_TYPE_ARRAY = 0x80
# JAT_status JIDLE: the task exists in JB_ja_tasks (e.g. held) but was never dispatched.
_JIDLE = 0
#: The largest qstat output parsed (one job's document, or the running slots of a whole
#: cluster for ``-g t``: tens of MB at most); larger is refused before libxml2 builds a tree.
MAX_XML = 64 * 1024 * 1024
# granted per-host resources geco uses (UGE "grl" items), beside the GPU complex
_GRANTED = ("m_mem_free", "intel_phi")
_DEFAULT_GPU = GpuComplex()
# the jobs whose unknown request shape this process journaled (see _warn_unknown_shape):
# (job number, JB_submission_time), as Grid Engine reuses job numbers
_SHAPE_WARNED_MAX = 4096
_SHAPES_SHOWN = 5  # the unknown parts one warning names (a document may hold thousands)
_shape_warned: dict[tuple[int, str], None] = {}
_shape_lock = threading.Lock()


# ---------------------------------------------------------------------------
# XML plumbing


# Son of Grid Engine names a job's task element after its job number when the job was
# re-queued while the qmaster was down (``<JATASK:    3829.>`` ... ``</JATASK:    3829.>``):
# not XML. The task is read by position in JB_ja_tasks, so the name is made plain.
_SOGE_TASK_TAG = re.compile(rb"<(/?)JATASK:[^<>]*>")


def _parse_xml(xml: bytes, what: str) -> etree._Element:
    """Parse untrusted qstat output; every failure is a QstatParseError naming ``what``."""
    if len(xml) > MAX_XML:
        # checked first: a tree takes ~7 times its text (720 MiB for 100 MB of elements)
        raise QstatParseError(f"{what} must be at most {MAX_XML} bytes, got {len(xml)}",
                              output=excerpt(xml[:4096]))
    if not xml.strip():
        raise QstatParseError(f"{what} is empty; expected XML")
    if b"<!DOCTYPE" in xml:
        # qstat never prints a DOCTYPE; one only serves to define entities (an
        # external file, "billion laughs"), so refuse before libxml2 reads it
        raise QstatParseError(f"{what} must not contain a DOCTYPE, got "
                              f"{excerpt(xml[xml.index(b'<!DOCTYPE'):])!r}")
    xml = _SOGE_TASK_TAG.sub(rb"<\1JATASK>", xml)
    # Grid Engine prints raw bytes without an encoding declaration; reading them
    # as ISO-8859-1 maps each byte to one character so nothing is rejected or lost
    # (_restore turns them back into UTF-8 text).
    parser = etree.XMLParser(encoding="ISO-8859-1", resolve_entities=False, no_network=True,
                             huge_tree=False, load_dtd=False, remove_comments=True,
                             remove_pis=True)
    try:
        return etree.fromstring(xml, parser)
    except (etree.ParseError, ValueError) as exc:
        raise QstatParseError(f"{what} is not well-formed XML: {exc}",
                              output=excerpt(xml)) from exc


# ---------------------------------------------------------------------------
# placement


def parse_placement_gt(xml: bytes, job_id: int, task_id: int, *,
                       job_slots: int | None = None) -> list[Placement]:
    """Return the hosts and slots granted to one task, from ``qstat -xml -u '*' -g t``.

    That listing has one ``job_list`` row per granted slot (``JB_job_number``,
    ``tasks`` for array jobs, ``queue_name`` ``queue@host``, ``master``
    MASTER/SLAVE, ``slots``). Pending rows (empty ``queue_name``) are skipped.
    For a PE with ``job_is_first_task FALSE`` the master queue has one row more, for
    the master task, which holds no slot: qstat prints ``JG_slots`` + 1 rows there
    (``slot_adjust`` in Son of Grid Engine's and Open Cluster Scheduler's qstat,
    ``ocs_QStatDefaultController.cc``), so a 2-slot job shows one MASTER and two SLAVE
    rows. The listing does not name the PE's setting: when the rows add up to one more
    than ``job_slots``, that row is not counted.

    Parameters
    ----------
    xml: the command's output.
    job_id: the job.
    task_id: the array task; 0 or 1 for a non-array job (its rows carry no task).
    job_slots: the task's slots in all, when known (a PE request of one count, such as
        ``-pe mpi 2``); None: the rows are taken as printed, which for a PE with
        ``job_is_first_task FALSE`` is one slot more on the master host.

    Returns
    -------
    list[Placement]
        The master host first; empty when the task has no running row.

    Raises
    ------
    QstatParseError
        if the output is not that listing or a value has the wrong type.
    """
    what = "qstat -xml -u '*' -g t output"
    root = _parse_xml(xml, what)
    if root.tag != "job_info":
        raise QstatParseError(f"{what} must have the root element <job_info>, got <{root.tag}>")
    want = task_id or 1
    entries: list[tuple[str, int, bool]] = []
    for row in root.iter("job_list"):
        if _xml.whole(_xml.text(row, "JB_job_number"), "JB_job_number", minimum=1) != job_id:
            continue
        queue = (_xml.text(row, "queue_name") or "").strip()
        if not queue:
            continue
        tasks = _xml.text(row, "tasks")
        if tasks is not None and _xml.whole(tasks, "tasks", minimum=1) != want:
            continue
        host = queue.partition("@")[2]
        if not host:
            raise QstatParseError(f"queue_name must be queue@host, got {shown(queue)}",
                                  element="queue_name")
        slots = _xml.whole(_xml.text(row, "slots"), "slots", minimum=1)
        entries.append((host, slots, (_xml.text(row, "master") or "").strip() == "MASTER"))
    hosts = merge(entries)
    master_task_row = job_slots is not None and sum(h.slots for h in hosts) == job_slots + 1
    if master_task_row and hosts[0].slots > 1:
        hosts[0] = replace(hosts[0], slots=hosts[0].slots - 1)
    return hosts


# ---------------------------------------------------------------------------
# qstat -xml -j


@dataclass(slots=True)
class _Job:
    """What ``qstat -xml -j`` says about one task, before the placement is known."""

    number: int
    task: int
    owner: str
    group: str
    name: str
    cwd: str
    is_array: bool
    requests: JobRequests
    # the slots of a PE request of one count (-pe mpi 2), else None (a range, or no PE)
    slots: int | None
    granted_placement: list[Placement] | None
    # short host name -> {resource name: granted value as printed}
    granted: dict[str, dict[str, str]] = field(default_factory=dict)


def _is_array(job: etree._Element) -> bool:
    """JB_type bit 0x80 (SoGE), JB_is_array (UGE), or a task range other than 1..1."""
    jb_type = _xml.text(job, "JB_type")
    if jb_type is not None and _xml.whole(jb_type, "JB_type") & _JB_TYPE_ARRAY:
        return True
    if (_xml.text(job, "JB_is_array") or "").strip().lower() in ("true", "1"):
        return True
    task_range = job.find("JB_ja_structure/*")
    if task_range is not None and _xml.text(task_range, "RN_min") is not None:
        low = _xml.whole(_xml.text(task_range, "RN_min"), "RN_min", minimum=1)
        high = _xml.whole(_xml.text(task_range, "RN_max"), "RN_max", minimum=1)
        return (low, high) != (1, 1)
    return False


def _task_element(job: etree._Element, number: int, task_id: int,
                  is_array: bool) -> tuple[etree._Element, int]:
    """Find the task in JB_ja_tasks (items ``ulong_sublist`` on SoGE, ``element`` on UGE)."""
    # $ja_task_id is 0 for a non-array job, whose single task is number 1
    want = 1 if task_id == 0 and not is_array else task_id
    tasks = job.find("JB_ja_tasks")
    if tasks is None or len(tasks) == 0:
        raise TaskNotRunning(f"job {number} has no running task (it is pending, or ending)",
                             job=number, task=want)
    for task in tasks:
        if _xml.whole(_xml.text(task, "JAT_task_number"), "JAT_task_number", minimum=1) != want:
            continue
        status = _xml.text(task, "JAT_status")
        if status is not None and _xml.whole(status, "JAT_status") == _JIDLE:
            raise TaskNotRunning(f"task {want} of job {number} is not dispatched yet",
                                 job=number, task=want)
        return task, want
    raise TaskNotRunning(f"job {number} has no running task {want}", job=number, task=want)


def _granted_placement(task: etree._Element) -> list[Placement] | None:
    """Hosts from UGE/OCS ``JAT_granted_destin_identifier_list``; None when absent (SoGE).

    The first entry is the master queue (qmaster builds the list that way and
    stores it as JAT_master_queue). JG_tag_slave_job is not used: it is a
    delivery tag qmaster sets on the first entry of *every* host, the master's
    included, when it sends the slave containers (sge_give_jobs.c,
    sge_job_qmaster.c), so it cannot tell the master apart.
    """
    gdil = task.find("JAT_granted_destin_identifier_list")
    if gdil is None or len(gdil) == 0:
        return None
    entries: list[tuple[str, int, bool]] = []
    for entry in gdil:
        host = (_xml.text(entry, "JG_qhostname") or "").strip()
        if not host:
            raise QstatParseError("JG_qhostname is missing or empty in a granted queue entry",
                                  element="JG_qhostname")
        slots = _xml.whole(_xml.text(entry, "JG_slots"), "JG_slots", minimum=1)
        entries.append((host, slots, not entries))
    return merge(entries)


def _granted_resources(task: etree._Element, gpu: GpuComplex) -> dict[str, dict[str, str]]:
    """Per-host granted ``m_mem_free``, GPU ids, ``intel_phi`` (UGE ``grl`` items).

    UGE prints GRU_host, GRU_name, GRU_value. Open Cluster Scheduler names the
    amount GRU_amount and lists RSMAP ids as RESL_value items; both are read
    too. Keys are short host names; values are kept as printed.
    """
    granted: dict[str, dict[str, str]] = {}
    for item in task.iter():
        name = (_xml.text(item, "GRU_name") or "").strip()
        host = (_xml.text(item, "GRU_host") or "").strip()
        if (name not in _GRANTED and name != gpu.name) or not host:
            continue
        value = _xml.text(item, "GRU_value")
        if value is None and name == "m_mem_free":
            value = _xml.text(item, "GRU_amount")
        elif value is None:
            ids = [_xml.restore(r.text or "").strip() for r in item.iter("RESL_value")]
            value = ",".join(ids) if ids else None
        if value is not None:
            granted.setdefault(short_hostname(host), {})[name] = value.strip()
    return granted


def _granted_bytes(value: str, host: str) -> int:
    """A granted m_mem_free: a plain number of bytes (OCS) or a memory value (UGE, "4.000G")."""
    try:
        number = decimal_value(value)
    except ValueError:
        memory = _xml.unit_value(value, parse_memory, f"granted m_mem_free on {host}", "GRU_value")
        return 0 if memory >= _xml.NO_LIMIT else int(memory)
    if number < 0:
        raise QstatParseError(f"granted m_mem_free on {host} must be >= 0 bytes, got "
                              f"{shown(value)}",
                              element="GRU_value")
    return 0 if number >= _xml.NO_LIMIT else int(number)


def _job_element(root: etree._Element, job_id: int | None) -> etree._Element:
    if root.tag == "unknown_jobs":
        names = ", ".join(_xml.restore(e.text or "").strip() for e in root.iter("ST_name"))
        names = names if len(names) <= 40 else names[:40] + "..."
        raise JobNotFound(f"Grid Engine does not know job {names or job_id} "
                          "(finished, deleted or never submitted)", job=job_id)
    if root.tag != "detailed_job_info":
        raise QstatParseError("qstat -xml -j output must have the root element "
                              f"<detailed_job_info>, got <{root.tag}>", job=job_id)
    jobs = root.findall("djob_info/element")
    if not jobs:
        raise QstatParseError("qstat -xml -j output has no djob_info/element (no job in it)",
                              job=job_id)
    if job_id is None:
        if len(jobs) != 1:
            raise QstatParseError(f"qstat -xml -j output must describe one job, got {len(jobs)}")
        return jobs[0]
    numbers = []
    for job in jobs:
        number = _xml.whole(_xml.text(job, "JB_job_number"), "JB_job_number", minimum=1)
        if number == job_id:
            return job
        numbers.append(str(number))
    raise QstatParseError(f"qstat -xml -j output describes job {', '.join(numbers)}, "
                          f"not job {job_id}", job=job_id)


def job_number(xml: bytes) -> int:
    """Return the number of the one job a ``qstat -xml -j`` document describes.

    Raises
    ------
    JobNotFound, QstatParseError
        as :func:`parse_job` does for the same document.
    """
    job = _job_element(_parse_xml(xml, "qstat -xml -j output"), None)
    return _xml.whole(_xml.text(job, "JB_job_number"), "JB_job_number", minimum=1)


def job_slots(xml: bytes) -> int | None:
    """The slots the one job of a ``qstat -xml -j`` document asked for, when it asked one
    count (``-pe mpi 2``), else None: what :func:`parse_placement_gt` needs to know.

    Raises
    ------
    JobNotFound, QstatParseError
        as :func:`parse_job` does for the same document.
    """
    return _pe_slots(_job_element(_parse_xml(xml, "qstat -xml -j output"), None))


def _read_job(xml: bytes, task_id: int, job_id: int | None, gpu: GpuComplex) -> _Job:
    if task_id < 0:
        raise ValueError(f"task_id must be >= 0, got {task_id}")
    root = _parse_xml(xml, "qstat -xml -j output")
    job = _job_element(root, job_id)
    number = _xml.whole(_xml.text(job, "JB_job_number"), "JB_job_number", minimum=1)
    owner = (_xml.text(job, "JB_owner") or "").strip()
    if not owner:
        raise QstatParseError("JB_owner is missing or empty; a job always has an owner",
                              element="JB_owner", job=number)
    is_array = _is_array(job)
    asked = requests.read(job, gpu.name)
    task, task_number = _task_element(job, number, task_id, is_array)
    if asked.unknown:
        submitted = (_xml.text(job, "JB_submission_time") or "")[:64]
        _warn_unknown_shape(number, submitted, task_number, asked.unknown)
    return _Job(number=number, task=task_number, owner=owner,
                group=(_xml.text(job, "JB_group") or "").strip(),
                name=_xml.text(job, "JB_job_name") or "",
                # no JB_cwd: submitted without -cwd, the job runs in the owner's $HOME
                cwd=_xml.text(job, "JB_cwd") or "",
                is_array=is_array, requests=asked, slots=_pe_slots(job),
                granted_placement=_granted_placement(task),
                granted=_granted_resources(task, gpu))


def _pe_slots(job: etree._Element) -> int | None:
    """The slots of a PE request of one count (``-pe mpi 2``: one JB_pe_range 2-2), else
    None (no PE, or a range such as ``-pe mpi 2-8``)."""
    ranges = job.findall("JB_pe_range/*")
    if _xml.text(job, "JB_pe") is None or len(ranges) != 1:
        return None
    low = _xml.whole(_xml.text(ranges[0], "RN_min"), "RN_min", minimum=1)
    high = _xml.whole(_xml.text(ranges[0], "RN_max"), "RN_max", minimum=1)
    return low if low == high else None


def _warn_unknown_shape(number: int, submitted: str, task: int,
                        unknown: tuple[str, ...]) -> None:
    """Journal, once per job in this process, that its requests are partly unread.

    A job is asked about once (its resource file keeps the answer), but gecod may ask
    again (its reaper, a resource file rewritten), and one warning is what the admin
    needs: the newest _SHAPE_WARNED_MAX jobs are remembered.
    """
    with _shape_lock:
        if (number, submitted) in _shape_warned:
            return
        if len(_shape_warned) >= _SHAPE_WARNED_MAX:
            del _shape_warned[next(iter(_shape_warned))]
        _shape_warned[number, submitted] = None
    shape = "; ".join(unknown[:_SHAPES_SHOWN])
    if len(unknown) > _SHAPES_SHOWN:
        shape += f"; and {len(unknown) - _SHAPES_SHOWN} more"
    _log.warning("job %s: qstat -xml -j holds requests in a shape geco does not know (%s); "
                 "geco reads JB_hard_resource_list (Son of Grid Engine, Univa/Altair Grid "
                 "Engine) and JB_request_set_list (Open Cluster Scheduler 9), so the job runs "
                 "without the limits asked there (h_vmem, m_mem_free, h_rt, GPUs): is this a "
                 "newer Grid Engine?", number, shape,
                 extra=log.job_fields(number, task, "qstat-shape-unknown", shape=shape))


def _gpu_share(job: _Job, host: Placement, granted: dict[str, str], gpu: GpuComplex) -> str:
    """A host's GPU list: the ids Grid Engine granted there (RSMAP; names such as
    ``nvidia0`` kept as they are), else the count its tasks asked for (an INT consumable:
    per slot, or the job's on its master node)."""
    if gpu.name in granted:
        return granted[gpu.name].replace(" ", ",")
    count = job.requests.host_gpus(host.slots, host.is_master, gpu.per)
    return f"{COUNT_PREFIX}{count}" if count else ""


def _assemble(job: _Job, placement: Sequence[Placement] | None,
              gpu: GpuComplex) -> ResourceSet:
    hosts = job.granted_placement or (merge((p.host, p.slots, p.is_master) for p in placement)
                                      if placement else None)
    if not hosts:
        raise QstatParseError(
            f"no placement for task {job.task} of job {job.number}: qstat -xml -j lists no "
            "granted hosts (Son of Grid Engine never does); pass the job's pe_hostfile or "
            "the rows of qstat -xml -u '*' -g t", job=job.number, task=job.task)
    asked = job.requests
    nodes = []
    for host in hosts:
        granted = job.granted.get(short_hostname(host.host), {})
        if "m_mem_free" in granted:
            # The granted m_mem_free is the host's total, used as is (the original did
            # the same). OCS books it as request x JG_slots per host
            # (hpc-gridware/clusterscheduler sge_sched_thread_rsmap.cc,
            # add_granted_resource_list); the seed's example has 2e9 for 20 slots and
            # 1.2e9 for 12 (1e8 each); and UD's docs blame UGE 8.2's own cgroups for
            # multiplying m_mem_free "twice" - by slots, on top of a per-host total.
            memory = _granted_bytes(granted["m_mem_free"], host.host)
        else:
            memory = asked.host_memory("m_mem_free", host.slots, host.is_master)
        nodes.append(NodeResources(name=host.host, is_slave=not host.is_master,
                                   slots=host.slots, memory_limit=memory,
                                   vmem_limit=asked.host_memory("h_vmem", host.slots,
                                                                host.is_master),
                                   gpus=_gpu_share(job, host, granted, gpu),
                                   phis=granted.get("intel_phi", "")))
    master = asked.master  # the job-wide values are its master task's (it ends the job)
    return ResourceSet(job_id=job.number, task_id=job.task, runtime_limit=master.h_rt or 0.0,
                       is_standby=bool(master.standby), per_slot_vmem=master.h_vmem or 0,
                       trace_level=master.trace_level or 0, is_array=job.is_array,
                       phi_for_user=bool(master.phi_for_user), job_name=job.name,
                       owner=job.owner, group=job.group, cwd=job.cwd, nodes=tuple(nodes))


def parse_job(xml: bytes, task_id: int, placement: Sequence[Placement] | None = None, *,
              job_id: int | None = None, gpu: GpuComplex = _DEFAULT_GPU) -> ResourceSet:
    """Build one task's :class:`ResourceSet` from ``qstat -xml -j <job>``.

    Per host: ``slots``; ``memory_limit`` = the granted ``m_mem_free`` for that
    host when the XML has one (UGE, OCS), else the per-slot request x the host's
    slots; ``vmem_limit`` = per-slot ``h_vmem`` x slots; GPUs/Phis as granted
    (UGE, OCS), else a GPU count from the request. OCS's scoped requests count
    per task (:mod:`geco.sge.requests`). Requests absent from the XML (including
    complex defaults, which ``qstat -j`` does not list) give 0 = no limit.

    Parameters
    ----------
    xml:
        The command's output.
    task_id:
        The array task; 0 (``$ja_task_id`` of a non-array job) means task 1.
    placement:
        Hosts and slots from :func:`parse_pe_hostfile` or
        :func:`parse_placement_gt`; used when the XML has no granted host list.
    job_id:
        When given, the XML must describe this job.
    gpu:
        The GPU complex (``[gpu] complex`` and ``consumable``).

    Returns
    -------
    ResourceSet
        Nodes in placement order, the master first.

    Raises
    ------
    JobNotFound
        the output is ``<unknown_jobs>``.
    TaskNotRunning
        the job is pending or has no such running task.
    QstatParseError
        malformed XML, a value of the wrong type (naming the element), another
        job's XML, or no placement at all.
    ValueError
        if ``task_id`` is negative.
    """
    return _assemble(_read_job(xml, task_id, job_id, gpu), placement, gpu)


def fetch(job_id: int, task_id: int, config: Config, pe_hostfile: Path | None = None, *,
          sleep: Callable[[float], None] = time.sleep) -> ResourceSet:
    """Ask Grid Engine for one task's resources: the only call the hooks make.

    Runs ``qstat -xml -j <job>`` once (with :func:`geco.sge.command.run_qstat`'s retries). The
    placement comes from the XML when it has one (UGE/OCS), else from
    ``pe_hostfile`` when given and readable, else from
    ``qstat -xml -u '*' -g t`` (a second qstat call listing every running job).

    Parameters
    ----------
    job_id: the job.
    task_id: ``$ja_task_id`` (0 for a non-array job).
    config: settings for running qstat.
    pe_hostfile: the job's ``pe_hostfile`` (``$PE_HOSTFILE`` or
        ``active_jobs/<job>.<task>/pe_hostfile``), if known.
    sleep: the sleep function between retries (tests pass a recorder).

    Returns
    -------
    ResourceSet

    Raises
    ------
    JobNotFound, TaskNotRunning, QstatError, QstatParseError
        as described for :func:`parse_job` and :func:`geco.sge.command.run_qstat`.
    """
    env = discover(config)  # once for both qstat calls
    gpu = GpuComplex.from_config(config)
    job = _read_job(run_qstat(["-xml", "-j", str(job_id)], config, env=env, sleep=sleep),
                    task_id, job_id, gpu)
    if job.granted_placement:
        return _assemble(job, None, gpu)
    placement: list[Placement] | None = None
    if pe_hostfile is not None:
        try:
            placement = parse_pe_hostfile(pe_hostfile.read_bytes())
        except (OSError, QstatParseError) as exc:
            _log.warning("job %s.%s: cannot use %s (%s); asking qstat -g t instead",
                         job.number, job.task, pe_hostfile, exc,
                         extra=log.job_fields(job.number, job.task, "pe-hostfile-unusable"))
    if placement is None:
        listing = run_qstat(["-xml", "-u", "*", "-g", "t"], config, env=env, sleep=sleep)
        placement = parse_placement_gt(listing, job.number, job.task, job_slots=job.slots)
        if not placement:
            raise TaskNotRunning(f"task {job.task} of job {job.number} is not running "
                                 "according to qstat -g t", job=job.number, task=job.task)
    return _assemble(job, placement, gpu)
