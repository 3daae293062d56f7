"""qstat output -> ResourceSet, Grid Engine's units, and running qstat.

Every recorded Son of Grid Engine 8.1.9 output in ``tests/fixtures/qstat``
(see its README for the qsub options behind each) is parsed here with the
placement from the ``-g t`` listing taken at the same moment. Expected values
are the qsub options of each scenario; error texts are asserted in full
(except the part libxml2 words itself). A synthetic UGE-style document covers
the granted-host and granted-resource elements SoGE never prints. ``run_qstat``
(:mod:`geco.sge.command`) and ``fetch`` run small fake qstat scripts (the real one is
exercised by the integration tests); retries never sleep for real (the sleep is injected).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geco.config import Config
from geco.errors import JobNotFound, QstatError, QstatParseError
from geco.gpushare import GpuComplex
from geco.resourceset import NodeResources, ResourceSet
from geco.sge.command import run_qstat
from geco.sge.pe_hostfile import Placement, parse_pe_hostfile
from geco.sge.qstat import (
    TaskNotRunning,
    fetch,
    parse_job,
    parse_placement_gt,
)
from geco.sge.siteenv import discover
from geco.units import format_memory, parse_memory, parse_time

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "qstat"
K, M, G = 1024, 1024**2, 1024**3
# the site's fixed PATH of root's Grid Engine commands on this machine (geco.sge.siteenv)
SAFE_PATH = discover(Config()).path
COMMLIB = "error: commlib error: can't connect to service (Connection refused)"
# the scenarios of tests/fixtures/qstat/README.md: fixture name -> job id
JOBS = {"serial": 1, "h_vmem": 2, "m_mem_free": 3, "h_rt": 4, "pending_hvmem": 5, "array": 6,
        "pe_smp": 7, "pe_mpi_qrsh": 8, "combined": 9, "no_cwd": 13}


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def job_xml(name: str) -> bytes:
    return fixture(f"{name}.xml")


def placement_gt(name: str, task: int = 0) -> list[Placement]:
    return parse_placement_gt(fixture(f"{name}.qstat-gt-all.xml"), JOBS[name], task)


def parsed(name: str, task: int = 0) -> ResourceSet:
    """Given the recorded -j and -g t outputs of a scenario, parse them as the hooks would."""
    return parse_job(job_xml(name), task, placement_gt(name, task), job_id=JOBS[name])


def with_requests(*requests: bytes) -> bytes:
    """serial.xml (no -l at all) with the given qstat_l_requests items added."""
    items = b"".join(b"<qstat_l_requests>" + r + b"</qstat_l_requests>" for r in requests)
    return job_xml("serial").replace(
        b"</JB_job_name>", b"</JB_job_name><JB_hard_resource_list>" + items
        + b"</JB_hard_resource_list>", 1)


def ce(name: str, stringval: str | None = None, doubleval: str | None = None) -> bytes:
    text = f"<CE_name>{name}</CE_name>"
    if stringval is not None:
        text += f"<CE_stringval>{stringval}</CE_stringval>"
    if doubleval is not None:
        text += f"<CE_doubleval>{doubleval}</CE_doubleval>"
    return text.encode()


VM1 = [Placement("vm", 1, True)]


# ---------------------------------------------------------------------------
# units


@pytest.mark.parametrize(("text", "expected"), [
    ("500M", 500 * M), ("1G", G), ("1.5G", 3 * G // 2), ("2K", 2 * K), ("3T", 3 * 1024**4),
    ("1g", 10**9), ("2k", 2000), ("5m", 5 * 10**6), ("1t", 10**12), ("7", 7), (" 1K\n", K),
    (".5K", 512), ("0.1K", 102),
])
def test_parse_memory_given_number_and_suffix_then_exact_bytes(text: str, expected: int) -> None:
    """Upper-case suffixes are powers of 1024, lower-case of 1000; a byte fraction is dropped."""
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["INFINITY", "infinity", "Infinity"])
def test_parse_memory_given_infinity_then_none_meaning_no_limit(text: str) -> None:
    assert parse_memory(text) is None


@pytest.mark.parametrize("text", ["x", "1X", "-1G", "1 G", "", "1e9", "G", "1GB"])
def test_parse_memory_given_malformed_text_then_valueerror_naming_it(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_memory(text)
    assert str(info.value) == ("memory size must be a number with an optional K/M/G/T or "
                               f"k/m/g/t suffix, got {text!r}")


@pytest.mark.parametrize(("n", "text"), [
    (0, "0"), (512, "512"), (200 * M, "200M"), (3 * G // 2, "1.5G"), (2 * G, "2G"),
    (G - 1, "1G"), (5 * G // 4, "1.25G"), (3 * 1024**4, "3T"),
])
def test_format_memory_given_bytes_then_short_power_of_1024_text(n: int, text: str) -> None:
    assert format_memory(n) == text


def test_format_memory_given_negative_then_valueerror() -> None:
    with pytest.raises(ValueError) as info:
        format_memory(-1)
    assert str(info.value) == "memory size must be >= 0 bytes, got -1"


@given(st.integers(min_value=0, max_value=2**62))
def test_format_memory_reads_back_within_one_percent(n: int) -> None:
    """Given any size, when formatted and parsed back, then it is within 1 % of the original."""
    back = parse_memory(format_memory(n))
    assert back is not None
    assert abs(back - n) <= n / 100


@pytest.mark.parametrize(("text", "seconds"), [
    ("60", 60.0), ("90.5", 90.5), ("1:30:00", 5400.0), ("1::1", 3601.0), ("0:0:59", 59.0),
    ("INFINITY", None), ("infinity", None),
])
def test_parse_time_given_seconds_or_hms_then_seconds(text: str, seconds: float | None) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["1:30", "a", "1:2:3:4", "-5", "1h"])
def test_parse_time_given_malformed_then_valueerror_naming_it(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_time(text)
    assert str(info.value) == f"time must be seconds or hours:minutes:seconds, got {text!r}"


# ---------------------------------------------------------------------------
# pe_hostfile


def test_pe_hostfile_given_one_line_then_master_with_its_slots() -> None:
    """The file execd wrote for jobs 7-9 (fixtures/hooks)."""
    assert parse_pe_hostfile(b"vm 2 all.q@vm UNDEFINED\n") == [Placement("vm", 2, True)]


def test_pe_hostfile_given_several_hosts_then_first_is_master_and_queues_add_up() -> None:
    text = (b"n002 4 all.q@n002 UNDEFINED\n"
            b"n001 2 all.q@n001 UNDEFINED\n"
            b"\n"
            b"n002 2 big.q@n002 0,1:0,2\n")
    assert parse_pe_hostfile(text) == [Placement("n002", 6, True), Placement("n001", 2, False)]


@pytest.mark.parametrize(("text", "number", "shown"), [
    (b"vm\n", 1, "vm"),
    (b"vm 2 all.q@vm UNDEFINED\nvm two all.q@vm UNDEFINED\n", 2, "vm two all.q@vm UNDEFINED"),
    (b"\nvm -1 all.q@vm UNDEFINED\n", 2, "vm -1 all.q@vm UNDEFINED"),
    (b"vm 0 all.q@vm UNDEFINED", 1, "vm 0 all.q@vm UNDEFINED"),
    (b"vm 2 all.q@vm UNDEFINED extra", 1, "vm 2 all.q@vm UNDEFINED extra"),
])
def test_pe_hostfile_given_malformed_line_then_error_names_line_and_content(
        text: bytes, number: int, shown: str) -> None:
    with pytest.raises(QstatParseError) as info:
        parse_pe_hostfile(text)
    assert str(info.value) == (f"pe_hostfile line {number} must be 'host slots queue processors'"
                               f" with slots >= 1, got {shown!r} (line={number})")


@pytest.mark.parametrize("text", [b"", b"\n\n  \n"])
def test_pe_hostfile_given_no_host_then_error(text: bytes) -> None:
    with pytest.raises(QstatParseError) as info:
        parse_pe_hostfile(text)
    assert str(info.value) == ("pe_hostfile lists no host; expected 'host slots queue "
                               "processors' lines")


# ---------------------------------------------------------------------------
# qstat -xml -u '*' -g t


@pytest.mark.parametrize(("name", "task", "slots"), [
    ("serial", 0, 1), ("h_vmem", 0, 1), ("m_mem_free", 0, 1), ("h_rt", 0, 1),
    ("array", 1, 1), ("array", 2, 1), ("array", 3, 1),
    ("pe_smp", 0, 2), ("pe_mpi_qrsh", 0, 2), ("combined", 1, 2), ("combined", 2, 2),
])
def test_gt_listing_given_running_task_then_its_slots_on_vm(name: str, task: int,
                                                            slots: int) -> None:
    """MASTER and SLAVE rows of one task add up; rows of other jobs and tasks are skipped."""
    assert placement_gt(name, task) == [Placement("vm", slots, True)]


def test_gt_listing_given_pending_job_then_no_placement() -> None:
    """Job 5's row in the pending section has an empty queue_name."""
    assert placement_gt("pending_hvmem") == []


def test_gt_listing_given_array_task_not_running_then_no_placement() -> None:
    assert placement_gt("array", 4) == []


def gt_rows(*rows: tuple[str, str, str, str | None]) -> bytes:
    """A -g t listing of job 42 with rows (queue_name, master, slots, tasks)."""
    body = b""
    for queue, master, slots, tasks in rows:
        body += (f"<job_list state='running'><JB_job_number>42</JB_job_number>"
                 f"<queue_name>{queue}</queue_name><master>{master}</master>"
                 f"<slots>{slots}</slots>").encode()
        body += f"<tasks>{tasks}</tasks>".encode() if tasks is not None else b""
        body += b"</job_list>"
    return b"<?xml version='1.0'?><job_info><queue_info>" + body + b"</queue_info></job_info>"


def test_gt_listing_given_several_hosts_then_master_first_and_slots_per_host() -> None:
    xml = gt_rows(("all.q@n002", "SLAVE", "1", None), ("all.q@n001", "MASTER", "1", None),
                  ("all.q@n001", "SLAVE", "1", None), ("big.q@n002", "SLAVE", "1", None))
    assert parse_placement_gt(xml, 42, 0) == [Placement("n001", 2, True),
                                              Placement("n002", 2, False)]


@pytest.mark.parametrize(("xml", "message"), [
    (fixture("serial.qstat-gt-all.xml").replace(b">1</JB_job_number>", b">one</JB_job_number>"),
     "JB_job_number must be a whole number >= 1, got 'one' (element=JB_job_number)"),
    (gt_rows(("all.q@vm", "MASTER", "-1", None)),
     "slots must be a whole number >= 1, got '-1' (element=slots)"),
    (gt_rows(("all.q@vm", "MASTER", "1", "1-3:1")),
     "tasks must be a whole number >= 1, got '1-3:1' (element=tasks)"),
    (gt_rows(("all.q", "MASTER", "1", None)),
     "queue_name must be queue@host, got 'all.q' (element=queue_name)"),
    (fixture("serial.xml"),
     "qstat -xml -u '*' -g t output must have the root element <job_info>, "
     "got <detailed_job_info>"),
])
def test_gt_listing_given_wrong_value_then_error_names_element(xml: bytes, message: str) -> None:
    job = 1 if b"<JB_job_number>one" in xml or b"detailed_job_info" in xml else 42
    with pytest.raises(QstatParseError) as info:
        parse_placement_gt(xml, job, 0)
    assert str(info.value) == message


# ---------------------------------------------------------------------------
# qstat -xml -j: the recorded scenarios


def test_serial_job_gives_owner_name_cwd_and_one_slot_without_limits() -> None:
    rs = parsed("serial")
    assert (rs.job_id, rs.task_id, rs.is_array) == (1, 1, False)
    assert (rs.owner, rs.group, rs.job_name, rs.cwd) == (
        "testuser", "testuser", "serial", "/home/testuser/jobs")
    assert (rs.runtime_limit, rs.per_slot_vmem, rs.trace_level, rs.is_standby,
            rs.phi_for_user) == (0.0, 0, 0, False, False)
    # the complex default h_vmem=2G is not in qstat -j, so no limit is known
    assert rs.nodes == (NodeResources("vm", is_slave=False, slots=1, memory_limit=0,
                                      vmem_limit=0),)


def test_a_job_requeued_while_the_qmaster_was_down_is_read_despite_its_task_tag() -> None:
    """SoGE prints such a job's task as <JATASK:    3829.> ... </JATASK:    3829.> (not
    XML): it is read like any other task, with its memory request."""
    rs = parse_job(fixture("rescheduled.xml"), 1, VM1)
    assert (rs.job_id, rs.task_id, rs.owner) == (3829, 1, "gecotest")
    assert rs.nodes[0].memory_limit == 150 << 20


def test_non_array_job_given_task_0_or_1_then_task_1() -> None:
    """$ja_task_id is 0 for a non-array job; its only task is number 1."""
    assert parsed("serial", 0) == parsed("serial", 1)


def test_h_vmem_500M_gives_per_slot_and_host_vmem_limit() -> None:
    rs = parsed("h_vmem")
    assert rs.per_slot_vmem == 500 * M
    assert (rs.nodes[0].vmem_limit, rs.nodes[0].memory_limit) == (500 * M, 0)


def test_m_mem_free_1G_gives_host_memory_limit() -> None:
    rs = parsed("m_mem_free")
    assert (rs.nodes[0].memory_limit, rs.nodes[0].vmem_limit, rs.per_slot_vmem) == (G, 0, 0)


def test_h_rt_60_gives_runtime_limit_in_seconds() -> None:
    assert parsed("h_rt").runtime_limit == 60.0


def test_pending_job_is_task_not_running_which_is_a_transient_qstat_error() -> None:
    """Given job 5 (never schedulable, no JB_ja_tasks), the prolog would re-queue (99)."""
    with pytest.raises(TaskNotRunning) as info:
        parse_job(job_xml("pending_hvmem"), 0, VM1, job_id=5)
    assert str(info.value) == "job 5 has no running task (it is pending, or ending) (job=5 task=1)"
    assert isinstance(info.value, QstatError)


@pytest.mark.parametrize("task", [1, 2, 3])
def test_array_job_gives_each_task_with_array_flag(task: int) -> None:
    rs = parsed("array", task)
    assert (rs.job_id, rs.task_id, rs.is_array, rs.job_name) == (6, task, True, "array")
    assert rs.key == f"6.{task}"
    assert rs.nodes == (NodeResources("vm", slots=1),)


def test_array_job_given_task_suffix_output_then_same_as_plain_output() -> None:
    """qstat -xml -j 6.2 ignores '.2': both outputs give the same task 2."""
    pl = placement_gt("array", 2)
    assert parse_job(fixture("array.task2.xml"), 2, pl) == parse_job(job_xml("array"), 2, pl)


@pytest.mark.parametrize("task", [0, 4])
def test_array_job_given_task_it_does_not_have_then_task_not_running(task: int) -> None:
    with pytest.raises(TaskNotRunning) as info:
        parse_job(job_xml("array"), task, VM1)
    assert str(info.value) == f"job 6 has no running task {task} (job=6 task={task})"


@pytest.mark.parametrize("name", ["pe_smp", "pe_mpi_qrsh"])
def test_pe_job_with_2_slots_gives_2_slots_on_the_master(name: str) -> None:
    rs = parsed(name)
    assert (rs.job_id, rs.job_name, rs.is_array) == (JOBS[name], name, False)
    assert rs.nodes == (NodeResources("vm", is_slave=False, slots=2),)


@pytest.mark.parametrize("task", [1, 2])
def test_combined_requests_give_limits_times_host_slots(task: int) -> None:
    """-t 1-2 -pe smp 2 -l h_vmem=500M,m_mem_free=1G,h_rt=120 -l s_rt=100."""
    rs = parsed("combined", task)
    assert (rs.job_id, rs.task_id, rs.is_array) == (9, task, True)
    assert (rs.runtime_limit, rs.per_slot_vmem) == (120.0, 500 * M)
    assert rs.nodes == (NodeResources("vm", is_slave=False, slots=2, memory_limit=2 * G,
                                      vmem_limit=2 * 500 * M),)


def test_combined_given_multi_host_pe_hostfile_then_limits_follow_each_hosts_slots() -> None:
    pl = parse_pe_hostfile(b"n001 1 all.q@n001 UNDEFINED\nn002 3 all.q@n002 UNDEFINED\n")
    rs = parse_job(job_xml("combined"), 1, pl)
    assert rs.nodes == (
        NodeResources("n001", is_slave=False, slots=1, memory_limit=G, vmem_limit=500 * M),
        NodeResources("n002", is_slave=True, slots=3, memory_limit=3 * G,
                      vmem_limit=1500 * M),
    )
    assert [n.name for n in rs.nodes if n.is_slave] == ["n002"]


def test_job_without_cwd_gives_empty_cwd_meaning_home() -> None:
    rs = parse_job(job_xml("no_cwd"), 0, parse_pe_hostfile(b"vm 1 all.q@vm UNDEFINED\n"),
                   job_id=13)
    assert (rs.job_id, rs.job_name, rs.owner, rs.cwd) == (13, "no_cwd", "testuser", "")


def test_unknown_job_is_job_not_found() -> None:
    with pytest.raises(JobNotFound) as info:
        parse_job(job_xml("unknown_job"), 0, job_id=1)
    assert str(info.value) == ("Grid Engine does not know job 1 (finished, deleted or never "
                               "submitted) (job=1)")


def test_job_given_no_placement_anywhere_then_error_says_what_to_pass() -> None:
    with pytest.raises(QstatParseError) as info:
        parse_job(job_xml("serial"), 0)
    assert str(info.value) == (
        "no placement for task 1 of job 1: qstat -xml -j lists no granted hosts (Son of Grid "
        "Engine never does); pass the job's pe_hostfile or the rows of qstat -xml -u '*' -g t "
        "(job=1 task=1)")


def test_job_given_output_of_another_job_then_error() -> None:
    with pytest.raises(QstatParseError) as info:
        parse_job(job_xml("serial"), 0, VM1, job_id=2)
    assert str(info.value) == "qstat -xml -j output describes job 1, not job 2 (job=2)"


def test_job_given_negative_task_then_valueerror() -> None:
    with pytest.raises(ValueError) as info:
        parse_job(job_xml("serial"), -1, VM1)
    assert str(info.value) == "task_id must be >= 0, got -1"


def test_job_given_placement_with_repeated_host_then_slots_add_up_master_first() -> None:
    pl = [Placement("n2", 1, False), Placement("n1", 1, True), Placement("n2", 2, False)]
    rs = parse_job(job_xml("h_vmem"), 0, pl)
    assert rs.nodes == (NodeResources("n1", False, 1, 0, 500 * M),
                        NodeResources("n2", True, 3, 0, 1500 * M))


# ---------------------------------------------------------------------------
# requests in other forms


def test_requests_given_only_stringvals_then_parsed_as_grid_engine_units() -> None:
    xml = with_requests(ce("h_vmem", "1.5G"), ce("m_mem_free", "2g"), ce("h_rt", "1:30:00"))
    rs = parse_job(xml, 0, [Placement("vm", 2, True)])
    assert (rs.per_slot_vmem, rs.runtime_limit) == (3 * G // 2, 5400.0)
    assert (rs.nodes[0].vmem_limit, rs.nodes[0].memory_limit) == (3 * G, 4 * 10**9)


def test_requests_given_infinity_then_no_limit() -> None:
    dbl_max = "1797693134862315708145274237317043567980705675258449965989174768031572607800" \
              "2853876058955863276687817154045895351438246423432132688946418276846754670353" \
              "7516986049910576551282076245490090389328944075868508455133942304583236903222" \
              "9481658085593321233482747978262041447231687381771809192998812504040261841248" \
              "583680.000000"
    xml = with_requests(ce("h_vmem", "INFINITY", dbl_max), ce("h_rt", "INFINITY", dbl_max),
                        ce("m_mem_free", "100G", dbl_max))
    rs = parse_job(xml, 0, VM1)
    assert (rs.per_slot_vmem, rs.runtime_limit, rs.nodes[0].memory_limit) == (0, 0.0, 0)


def test_requests_given_geco_options_then_trace_standby_and_phi_flags() -> None:
    xml = with_requests(ce("geco_trace_level", "3", "3.000000"),
                        ce("standby_queue", "TRUE", "1.000000"),
                        ce("phi_config_for_user", "1", "1.000000"))
    rs = parse_job(xml, 0, VM1)
    assert (rs.trace_level, rs.is_standby, rs.phi_for_user) == (3, True, True)


@pytest.mark.parametrize(("value", "level"), [("9", 4), ("-2", 0)])
def test_trace_level_out_of_range_is_clamped_not_fatal(value: str, level: int) -> None:
    rs = parse_job(with_requests(ce("geco_trace_level", value)), 0, VM1)
    assert rs.trace_level == level


def test_standby_zero_and_false_mean_not_standby() -> None:
    xml = with_requests(ce("standby", "0", "0.000000"), ce("standby_x", "false"))
    assert parse_job(xml, 0, VM1).is_standby is False


@pytest.mark.parametrize(("request_", "message"), [
    (ce("h_vmem", "lots", "lots"),
     "request h_vmem: CE_doubleval must be a number, got 'lots' (element=CE_doubleval)"),
    (ce("h_vmem", "-5", "-5.000000"),
     "request h_vmem: CE_doubleval must be >= 0 bytes, got -5.000000 (element=CE_doubleval)"),
    (ce("m_mem_free", "1Q"),
     "request m_mem_free: memory size must be a number with an optional K/M/G/T or k/m/g/t "
     "suffix, got '1Q' (element=CE_stringval)"),
    (ce("h_rt", "1:30"),
     "request h_rt: time must be seconds or hours:minutes:seconds, got '1:30' "
     "(element=CE_stringval)"),
    (ce("h_rt", None, "-1"),
     "request h_rt: CE_doubleval must be >= 0 seconds, got -1 (element=CE_doubleval)"),
    (ce("geco_trace_level"),
     "request geco_trace_level has neither CE_doubleval nor CE_stringval (element=CE_name)"),
])
def test_requests_given_wrong_type_then_error_names_request_and_element(
        request_: bytes, message: str) -> None:
    with pytest.raises(QstatParseError) as info:
        parse_job(with_requests(request_), 0, VM1)
    assert str(info.value) == message


@pytest.mark.parametrize(("old", "new", "message"), [
    (b"<JB_job_number>1<", b"<JB_job_number>abc<",
     "JB_job_number must be a whole number >= 1, got 'abc' (element=JB_job_number)"),
    (b"<JB_type>0<", b"<JB_type>x<", "JB_type must be a whole number >= 0, got 'x' "
     "(element=JB_type)"),
    (b"<JAT_task_number>1<", b"<JAT_task_number>one<",
     "JAT_task_number must be a whole number >= 1, got 'one' (element=JAT_task_number)"),
    (b"<JB_owner>testuser</JB_owner>", b"",
     "JB_owner is missing or empty; a job always has an owner (element=JB_owner job=1)"),
    (b"<RN_max>1<", b"<RN_max>-3<", "RN_max must be a whole number >= 1, got '-3' "
     "(element=RN_max)"),
])
def test_job_given_wrong_type_then_error_names_element_and_value(old: bytes, new: bytes,
                                                                  message: str) -> None:
    xml = job_xml("serial")
    assert old in xml
    with pytest.raises(QstatParseError) as info:
        parse_job(xml.replace(old, new, 1), 0, VM1)
    assert str(info.value) == message


def test_task_in_list_but_idle_is_not_running() -> None:
    xml = job_xml("serial").replace(b"<JAT_status>128<", b"<JAT_status>0<")
    with pytest.raises(TaskNotRunning) as info:
        parse_job(xml, 0, VM1)
    assert str(info.value) == "task 1 of job 1 is not dispatched yet (job=1 task=1)"


def test_wrong_document_kind_then_error_names_root() -> None:
    with pytest.raises(QstatParseError) as info:
        parse_job(fixture("serial.qstat-gt-all.xml"), 0, VM1)
    assert str(info.value) == ("qstat -xml -j output must have the root element "
                               "<detailed_job_info>, got <job_info>")


# ---------------------------------------------------------------------------
# UGE / OCS: granted hosts and resources in the -j output itself


def uge_xml(*, requests: str = "", gdil: str = "", grl: str = "", status: str = "128",
            array: str = "false") -> bytes:
    """A UGE 8.x style `qstat -xml -j 77`, modelled on the SoGE fixtures plus the elements
    the original GECO read (research/geco-original.md §2)."""
    return f"""<?xml version='1.0'?>
<detailed_job_info>
  <djob_info>
    <element>
      <JB_job_number>77</JB_job_number>
      <JB_owner>alice</JB_owner>
      <JB_group>users</JB_group>
      <JB_job_name>mpi-run</JB_job_name>
      <JB_hard_resource_list>{requests}</JB_hard_resource_list>
      <JB_ja_tasks>
        <element>
          <JAT_status>{status}</JAT_status>
          <JAT_task_number>1</JAT_task_number>
          <JAT_granted_destin_identifier_list>{gdil}</JAT_granted_destin_identifier_list>
          <JAT_granted_resources_list>{grl}</JAT_granted_resources_list>
        </element>
      </JB_ja_tasks>
      <JB_cwd>/home/alice/run</JB_cwd>
      <JB_is_array>{array}</JB_is_array>
    </element>
  </djob_info>
</detailed_job_info>
""".encode()


def uge_request(name: str, stringval: str, doubleval: str) -> str:
    return (f"<element><CE_name>{name}</CE_name><CE_valtype>4</CE_valtype>"
            f"<CE_stringval>{stringval}</CE_stringval><CE_doubleval>{doubleval}</CE_doubleval>"
            "<CE_consumable>1</CE_consumable></element>")


def gdil(queue: str, slots: str, tag: int) -> str:
    return (f"<element><JG_qname>{queue}</JG_qname><JG_qhostname>{queue.split('@')[1]}"
            f"</JG_qhostname><JG_slots>{slots}</JG_slots><JG_tag_slave_job>{tag}"
            "</JG_tag_slave_job></element>")


def grl(host: str, name: str, value: str) -> str:
    return (f"<grl><GRU_type>1</GRU_type><GRU_name>{name}</GRU_name><GRU_value>{value}"
            f"</GRU_value><GRU_host>{host}</GRU_host></grl>")


UGE_GDIL = (gdil("all.q@n001", "4", 1) + gdil("all.q@n002", "2", 1)
            + gdil("gpu.q@n001", "2", 0))
UGE_REQUESTS = uge_request("m_mem_free", "2G", "2147483648.000000") + uge_request(
    "h_vmem", "3G", "3221225472.000000")


def test_uge_granted_list_gives_hosts_slots_gpus_and_phis() -> None:
    """Given JG_* entries (n001 twice) and grl items, then per-host records in list order.

    The first entry is the master although qmaster tagged it JG_tag_slave_job=1;
    the placement argument is ignored when the XML has its own.
    """
    xml = uge_xml(requests=UGE_REQUESTS, gdil=UGE_GDIL,
                  grl=grl("n001", "m_mem_free", "12.000G") + grl("n002", "m_mem_free", "4G")
                  + grl("n001", "nvidia_gpu", "0 1") + grl("n002", "intel_phi", "mic0"))
    rs = parse_job(xml, 1, [Placement("elsewhere", 9, True)], job_id=77,
                   gpu=GpuComplex("nvidia_gpu"))
    assert (rs.owner, rs.group, rs.job_name, rs.cwd, rs.is_array) == (
        "alice", "users", "mpi-run", "/home/alice/run", False)
    assert rs.per_slot_vmem == 3 * G
    assert rs.nodes == (
        NodeResources("n001", is_slave=False, slots=6, memory_limit=12 * G,
                      vmem_limit=18 * G, gpus="0,1"),
        NodeResources("n002", is_slave=True, slots=2, memory_limit=4 * G, vmem_limit=6 * G,
                      phis="mic0"),
    )


def test_uge_granted_m_mem_free_is_the_hosts_total_taken_as_is() -> None:
    """Given granted values that differ from request x slots, then the granted ones win
    (not multiplied by slots again); a host without a grl item falls back to the request."""
    xml = uge_xml(requests=UGE_REQUESTS, gdil=UGE_GDIL + gdil("all.q@n003", "1", 1),
                  grl=grl("n001", "m_mem_free", "10G") + grl("n002", "m_mem_free", "3000000000")
                  + grl("global", "m_mem_free", "1T"))
    rs = parse_job(xml, 1)
    assert [(n.name, n.memory_limit) for n in rs.nodes] == [
        ("n001", 10 * G), ("n002", 3_000_000_000), ("n003", 2 * G)]


def test_ocs_granted_amount_and_resource_map_ids_are_read_too() -> None:
    ocs = ("<element><GRU_type>1</GRU_type><GRU_name>m_mem_free</GRU_name>"
           "<GRU_amount>8589934592.000000</GRU_amount><GRU_host>n001</GRU_host></element>"
           "<element><GRU_type>2</GRU_type><GRU_name>gpu</GRU_name>"
           "<GRU_amount>2.000000</GRU_amount><GRU_resource_map_list>"
           "<element><RESL_value>2</RESL_value><RESL_amount>1</RESL_amount></element>"
           "<element><RESL_value>3</RESL_value><RESL_amount>1</RESL_amount></element>"
           "</GRU_resource_map_list><GRU_host>n001</GRU_host></element>")
    rs = parse_job(uge_xml(gdil=gdil("all.q@n001", "2", 0), grl=ocs), 1)
    assert rs.nodes == (NodeResources("n001", slots=2, memory_limit=8 * G, gpus="2,3"),)


def test_uge_array_flag_and_idle_task() -> None:
    assert parse_job(uge_xml(gdil=UGE_GDIL, array="true"), 1).is_array is True
    with pytest.raises(TaskNotRunning) as info:
        parse_job(uge_xml(gdil=UGE_GDIL, status="0"), 1)
    assert str(info.value) == "task 1 of job 77 is not dispatched yet (job=77 task=1)"


@pytest.mark.parametrize(("entries", "granted", "message"), [
    (gdil("all.q@n001", "-2", 0), "",
     "JG_slots must be a whole number >= 1, got '-2' (element=JG_slots)"),
    ("<element><JG_slots>1</JG_slots></element>", "",
     "JG_qhostname is missing or empty in a granted queue entry (element=JG_qhostname)"),
    (gdil("all.q@n001", "1", 0), grl("n001", "m_mem_free", "much"),
     "granted m_mem_free on n001: memory size must be a number with an optional K/M/G/T or "
     "k/m/g/t suffix, got 'much' (element=GRU_value)"),
    (gdil("all.q@n001", "1", 0), grl("n001", "m_mem_free", "-1"),
     "granted m_mem_free on n001 must be >= 0 bytes, got '-1' (element=GRU_value)"),
])
def test_uge_given_wrong_type_then_error_names_element(entries: str, granted: str,
                                                       message: str) -> None:
    with pytest.raises(QstatParseError) as info:
        parse_job(uge_xml(gdil=entries, grl=granted), 1)
    assert str(info.value) == message


# ---------------------------------------------------------------------------
# hostile and broken output


def test_escaped_markup_and_newlines_in_job_name_come_back_exactly() -> None:
    xml = job_xml("serial").replace(b">serial</JB_job_name>",
                                    b">a&lt;b&gt;&amp;c&#10;d\"e'f</JB_job_name>")
    assert parse_job(xml, 0, VM1).job_name == "a<b>&c\nd\"e'f"


def test_job_name_bytes_survive_utf8_and_not_utf8() -> None:
    """UTF-8 decodes; other bytes become surrogate escapes (ResourceSet keeps any byte)."""
    xml = job_xml("serial").replace(b">serial<", b">" + "café ☺".encode() + b"\xff<")
    rs = parse_job(xml.replace(b">/home/testuser/jobs<", b">/data/\xe9t\xe9<"), 0, VM1)
    assert rs.job_name == "café ☺\udcff"
    assert rs.cwd == "/data/\udce9t\udce9"
    assert rs.cwd.encode("utf-8", "surrogateescape") == b"/data/\xe9t\xe9"


def assert_not_well_formed(xml: bytes) -> QstatParseError:
    with pytest.raises(QstatParseError) as info:
        parse_job(xml, 0, VM1)
    assert str(info.value).startswith("qstat -xml -j output is not well-formed XML: ")
    assert isinstance(info.value.__cause__, Exception)
    return info.value


def test_raw_markup_in_job_name_is_a_parse_error() -> None:
    assert_not_well_formed(job_xml("serial").replace(b">serial<", b">a<b&c<"))


def test_truncated_output_is_a_parse_error() -> None:
    xml = job_xml("combined")
    assert_not_well_formed(xml[: len(xml) // 2])


def test_commlib_error_text_is_a_parse_error_quoting_it() -> None:
    error = assert_not_well_formed(COMMLIB.encode() + b"\n")
    assert error.fields["output"] == COMMLIB


def test_binary_garbage_is_a_parse_error() -> None:
    assert_not_well_formed(bytes(range(256)) * 4)


def test_excessive_nesting_is_a_parse_error() -> None:
    depth = 10_000
    assert_not_well_formed(b"<detailed_job_info>" + b"<a>" * depth + b"</a>" * depth
                           + b"</detailed_job_info>")


@pytest.mark.parametrize("xml", [b"", b"  \n\t"])
def test_empty_output_is_a_parse_error(xml: bytes) -> None:
    with pytest.raises(QstatParseError) as info:
        parse_job(xml, 0, VM1)
    assert str(info.value) == "qstat -xml -j output is empty; expected XML"


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<detailed_job_info><djob_info><element><JB_job_number>1</JB_job_number>
<JB_owner>x</JB_owner><JB_job_name>&lol9;</JB_job_name></element></djob_info>
</detailed_job_info>"""
XXE = (b"<?xml version='1.0'?><!DOCTYPE d [<!ENTITY e SYSTEM 'file:///etc/shadow'>]>"
       b"<detailed_job_info><djob_info><element><JB_job_number>1</JB_job_number>"
       b"<JB_job_name>&e;</JB_job_name></element></djob_info></detailed_job_info>")


@pytest.mark.parametrize(("xml", "shown"), [
    (BILLION_LAUGHS, "<!DOCTYPE lolz ["),
    (XXE, "<!DOCTYPE d [<!ENTITY e SYSTEM 'file:///etc/shadow'>]><detailed_job_info><djob_i"),
])
def test_entity_definitions_are_refused_before_parsing(xml: bytes, shown: str) -> None:
    """Given a DOCTYPE (billion laughs, external entity), then refused at once, nothing read."""
    with pytest.raises(QstatParseError) as info:
        parse_job(xml, 0, VM1)
    assert str(info.value) == f"qstat -xml -j output must not contain a DOCTYPE, got {shown!r}"


def test_undefined_entity_is_a_parse_error() -> None:
    assert_not_well_formed(job_xml("serial").replace(b">serial<", b">&shadow;<"))


# ---------------------------------------------------------------------------
# run_qstat with fake qstat scripts


def fake_qstat(directory: Path, body: str, mode: int = 0o755) -> Path:
    path = directory / "qstat"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


def config(qstat: Path | str, *, retries: int = 3, timeout: float = 5.0) -> Config:
    return Config(qstat=str(qstat), qstat_retries=retries, qstat_timeout=timeout)


def failing_then(directory: Path, failures: int, then: str) -> Path:
    """A qstat that fails with a commlib error ``failures`` times, then runs ``then``."""
    count = directory / "count"
    return fake_qstat(directory, f"""n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1))
echo $n > {count}
if [ $n -le {failures} ]; then echo "{COMMLIB}" >&2; echo "second line" >&2; exit 1; fi
{then}
""")


def test_run_qstat_returns_output_and_passes_arguments_verbatim(tmp_path: Path) -> None:
    args_file = tmp_path / "args"
    qstat = fake_qstat(tmp_path, f"""printf '%s\\n' "$@" > {args_file}
cat {FIXTURES / 'combined.xml'}
""")
    sleeps: list[float] = []
    out = run_qstat(["-xml", "-u", "*", "-j", "9"], config(qstat), sleep=sleeps.append)
    assert out == job_xml("combined")
    assert args_file.read_text().splitlines() == ["-xml", "-u", "*", "-j", "9"]
    assert sleeps == []


def test_run_qstat_given_transient_failures_then_retries_with_growing_backoff(
        tmp_path: Path) -> None:
    qstat = failing_then(tmp_path, 2, f"cat {FIXTURES / 'serial.xml'}")
    sleeps: list[float] = []
    assert run_qstat(["-xml", "-j", "1"], config(qstat), sleep=sleeps.append) == job_xml("serial")
    assert (tmp_path / "count").read_text() == "3\n"
    assert sleeps == [1.0, 2.0]


def test_run_qstat_given_permanent_failure_then_error_names_command_status_stderr(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    qstat = failing_then(tmp_path, 99, "")
    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="geco.sge.qstat"), \
            pytest.raises(QstatError) as info:
        run_qstat(["-xml", "-j", "9"], config(qstat, retries=3), sleep=sleeps.append)
    assert str(info.value) == (f"{qstat} -xml -j 9 failed 4 time(s); last: exit status 1, "
                               f"stderr: {COMMLIB} (attempts=4 exit_status=1)")
    assert (tmp_path / "count").read_text() == "4\n"
    assert sleeps == [1.0, 2.0, 4.0]
    assert len(caplog.records) == 3
    assert caplog.records[0].getMessage() == (
        f"{qstat} -xml -j 9 failed (exit status 1, stderr: {COMMLIB}); attempt 1 of 4, "
        "retrying in 1 s")


def test_run_qstat_backoff_is_capped(tmp_path: Path) -> None:
    sleeps: list[float] = []
    with pytest.raises(QstatError):
        run_qstat(["-help"], config(failing_then(tmp_path, 99, ""), retries=6),
                  sleep=sleeps.append)
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_run_qstat_given_no_retries_then_one_attempt(tmp_path: Path) -> None:
    sleeps: list[float] = []
    with pytest.raises(QstatError) as info:
        run_qstat(["-j", "1"], config(failing_then(tmp_path, 99, ""), retries=0),
                  sleep=sleeps.append)
    assert "failed 1 time(s)" in str(info.value)
    assert sleeps == []


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in (b"Z", b"X")


def test_run_qstat_given_hanging_qstat_then_kills_it_and_its_children(tmp_path: Path) -> None:
    """A wrapper whose child keeps the pipes open must not hang geco (subprocess.run would)."""
    pids = tmp_path / "pids"
    qstat = fake_qstat(tmp_path, f"sleep 30 &\necho $! >> {pids}\nwait\n")
    sleeps: list[float] = []
    started = time.monotonic()
    with pytest.raises(QstatError) as info:
        run_qstat(["-xml", "-j", "1"], config(qstat, retries=1, timeout=0.2),
                  sleep=sleeps.append)
    assert time.monotonic() - started < 2.0
    assert str(info.value) == (f"{qstat} -xml -j 1 failed 2 time(s); last: timed out after "
                               "0.2 s (attempts=2)")
    assert sleeps == [1.0]
    children = [int(p) for p in pids.read_text().split()]
    assert len(children) == 2
    deadline = time.monotonic() + 1.0
    while not all(process_gone(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(process_gone(p) for p in children)


@pytest.mark.parametrize(("body", "why", "status"), [
    ("exit 0\n", "exit status 0 but no output, no stderr", 0),
    ("echo '   '\nexit 0\n", "exit status 0 but no output, no stderr", 0),
    ("echo oops >&2\nexit 3\n", "exit status 3, stderr: oops", 3),
    ("kill -9 $$\n", "killed by signal SIGKILL, no stderr", -9),
])
def test_run_qstat_given_no_usable_output_then_transient_error(tmp_path: Path, body: str,
                                                               why: str, status: int) -> None:
    qstat = fake_qstat(tmp_path, body)
    with pytest.raises(QstatError) as info:
        run_qstat(["-j", "1"], config(qstat, retries=1), sleep=lambda _: None)
    assert str(info.value) == (f"{qstat} -j 1 failed 2 time(s); last: {why} "
                               f"(attempts=2 exit_status={status})")


def test_run_qstat_given_missing_executable_then_error_at_once(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-qstat"
    sleeps: list[float] = []
    with pytest.raises(QstatError) as info:
        run_qstat(["-j", "1"], config(missing), sleep=sleeps.append)
    assert str(info.value) == (f"cannot execute {missing}: No such file or directory "
                               f"(errno=ENOENT command={missing})")
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert sleeps == []


def test_run_qstat_given_non_executable_file_then_error_at_once(tmp_path: Path) -> None:
    qstat = fake_qstat(tmp_path, "exit 0\n", mode=0o644)
    sleeps: list[float] = []
    with pytest.raises(QstatError) as info:
        run_qstat(["-j", "1"], config(qstat), sleep=sleeps.append)
    assert str(info.value) == (f"cannot execute {qstat}: Permission denied "
                               f"(errno=EACCES command={qstat})")
    assert sleeps == []


def test_run_qstat_given_bare_name_not_on_system_path_then_error_at_once() -> None:
    with pytest.raises(QstatError) as info:
        run_qstat(["-j", "1"], config("geco-test-no-such-qstat"), sleep=lambda _: None)
    assert str(info.value) == (
        f"qstat command 'geco-test-no-such-qstat' not found in {SAFE_PATH}; set [qstat] "
        "command in geco.toml to its full path (command=geco-test-no-such-qstat)")


def test_run_qstat_runs_with_the_sites_environment_devnull_stdin_and_root_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a job environment (as the root prolog has), then none of it reaches qstat:
    the site's SGE_* values and PATH (geco.sge.siteenv), LC_ALL=C, HOME=/."""
    env_file, stdin_file, cwd_file = tmp_path / "env", tmp_path / "stdin", tmp_path / "cwd"
    qstat = fake_qstat(tmp_path, f"""env > {env_file}
readlink /proc/self/fd/0 > {stdin_file}
pwd > {cwd_file}
cat {FIXTURES / 'serial.xml'}
""")
    site = discover(config(qstat))
    monkeypatch.setenv("SGE_ROOT", "/tmp")
    monkeypatch.setenv("SGE_CELL", "x")
    monkeypatch.setenv("SGE_QMASTER_PORT", "1")
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", "/home/testuser")
    run_qstat(["-j", "1"], config(qstat), sleep=lambda _: None)
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert {k: v for k, v in env.items() if k.startswith("SGE_")} == site.values
    assert (env["PATH"], env["LC_ALL"], env["HOME"]) == (SAFE_PATH, "C", "/")
    assert "LD_PRELOAD" not in env
    assert stdin_file.read_text() == "/dev/null\n"
    assert cwd_file.read_text() == "/\n"


# ---------------------------------------------------------------------------
# fetch


def dispatching_qstat(directory: Path, job_xml_name: str, gt_name: str, job: int) -> Path:
    """A qstat answering -j <job> and -u '*' -g t from fixtures, logging each call."""
    calls = directory / "calls"
    return fake_qstat(directory, f"""echo "$*" >> {calls}
case "$*" in
  "-xml -j {job}") cat {FIXTURES / job_xml_name} ;;
  "-xml -u * -g t") cat {FIXTURES / gt_name} ;;
  *) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
""")


def calls(directory: Path) -> list[str]:
    return (directory / "calls").read_text().splitlines()


def test_fetch_without_pe_hostfile_asks_qstat_g_t_for_the_placement(tmp_path: Path) -> None:
    qstat = dispatching_qstat(tmp_path, "combined.xml", "combined.qstat-gt-all.xml", 9)
    rs = fetch(9, 2, config(qstat), sleep=lambda _: None)
    assert rs == parsed("combined", 2)
    assert calls(tmp_path) == ["-xml -j 9", "-xml -u * -g t"]


def test_fetch_with_pe_hostfile_runs_qstat_once(tmp_path: Path) -> None:
    qstat = dispatching_qstat(tmp_path, "combined.xml", "combined.qstat-gt-all.xml", 9)
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_bytes(b"vm 2 all.q@vm UNDEFINED\n")
    rs = fetch(9, 1, config(qstat), hostfile, sleep=lambda _: None)
    assert rs.nodes == (NodeResources("vm", False, 2, 2 * G, 1000 * M),)
    assert calls(tmp_path) == ["-xml -j 9"]


@pytest.mark.parametrize("content", [None, b"vm many all.q@vm UNDEFINED\n"])
def test_fetch_with_unusable_pe_hostfile_falls_back_to_g_t_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes | None) -> None:
    qstat = dispatching_qstat(tmp_path, "pe_smp.xml", "pe_smp.qstat-gt-all.xml", 7)
    hostfile = tmp_path / "pe_hostfile"
    if content is not None:
        hostfile.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="geco.sge.qstat"):
        rs = fetch(7, 0, config(qstat), hostfile, sleep=lambda _: None)
    assert rs.nodes == (NodeResources("vm", slots=2),)
    assert calls(tmp_path) == ["-xml -j 7", "-xml -u * -g t"]
    assert caplog.records[0].getMessage().startswith(
        f"job 7.1: cannot use {hostfile} (")
    assert caplog.records[0].getMessage().endswith("); asking qstat -g t instead")


def test_fetch_given_pending_job_then_task_not_running_without_g_t_call(tmp_path: Path) -> None:
    qstat = dispatching_qstat(tmp_path, "pending_hvmem.xml", "pending_hvmem.qstat-gt-all.xml", 5)
    with pytest.raises(TaskNotRunning):
        fetch(5, 0, config(qstat), sleep=lambda _: None)
    assert calls(tmp_path) == ["-xml -j 5"]


@pytest.mark.parametrize(("job_xml", "job", "task", "error", "message"), [
    pytest.param("array.xml", 6, 2, TaskNotRunning,
                 "task 2 of job 6 is not running according to qstat -g t (job=6 task=2)",
                 id="task missing from -g t: not running"),
    pytest.param("unknown_job.xml", 1, 0, JobNotFound,
                 "Grid Engine does not know job 1 (finished, deleted or never submitted) "
                 "(job=1)", id="finished job: not found"),
    pytest.param("serial.xml", 4, 0, QstatParseError,
                 "qstat -xml -j output describes job 1, not job 4 (job=4)",
                 id="another job's xml: parse error"),
])
def test_fetch_given_a_job_it_cannot_use_then_the_error_says_why(
        tmp_path: Path, job_xml: str, job: int, task: int, error: type[Exception],
        message: str) -> None:
    qstat = dispatching_qstat(tmp_path, job_xml, "serial.qstat-gt-all.xml", job)
    with pytest.raises(error) as info:
        fetch(job, task, config(qstat), sleep=lambda _: None)
    assert str(info.value) == message


def test_fetch_given_uge_granted_hosts_then_no_placement_call(tmp_path: Path) -> None:
    (tmp_path / "uge.xml").write_bytes(uge_xml(requests=UGE_REQUESTS, gdil=UGE_GDIL))
    calls_file = tmp_path / "calls"
    qstat = fake_qstat(tmp_path, f'echo "$*" >> {calls_file}\ncat {tmp_path / "uge.xml"}\n')
    rs = fetch(77, 1, config(qstat), sleep=lambda _: None)
    assert [(n.name, n.slots, n.is_slave) for n in rs.nodes] == [("n001", 6, False),
                                                                 ("n002", 2, True)]
    assert calls(tmp_path) == ["-xml -j 77"]



# ---------------------------------------------------------------------------
# GPUs: Grid Engine's grant ([gpu] complex), ids or a count


def soge_gpu_request(count: str) -> bytes:
    """The combined fixture (2 slots on vm, -pe smp 2) with a SoGE request -l gpu=<count>."""
    request = (f"<qstat_l_requests><CE_name>gpu</CE_name><CE_valtype>1</CE_valtype>"
               f"<CE_stringval>{count}</CE_stringval><CE_doubleval>{count}</CE_doubleval>"
               "<CE_consumable>1</CE_consumable></qstat_l_requests>")
    return job_xml("combined").replace(b"<JB_hard_resource_list>",
                                       b"<JB_hard_resource_list>" + request.encode(), 1)


@pytest.mark.parametrize(("per", "placement", "shares"), [
    ("slot", [Placement("vm", 2, True)], ["count:2"]),
    ("slot", [Placement("vm", 2, True), Placement("n2", 3, False)], ["count:2", "count:3"]),
    ("job", [Placement("vm", 2, True), Placement("n2", 3, False)], ["count:1", ""]),
])
def test_soge_counts_gpus_per_slot_or_per_job_and_geco_picks_the_ids(
        per: str, placement: list[Placement], shares: list[str]) -> None:
    """Given Son of Grid Engine's INT consumable (no ids), then each node's GPU list is the
    count it booked there: the request x its slots (consumable YES), or the request on the
    master node only (consumable JOB)."""
    rs = parse_job(soge_gpu_request("1"), 1, placement, gpu=GpuComplex("gpu", per))
    assert [n.gpus for n in rs.nodes] == shares


def test_a_job_that_requests_no_gpu_has_an_empty_gpu_list() -> None:
    assert [n.gpus for n in parsed("combined", 1).nodes] == [""]


@pytest.mark.parametrize("count", ["-1", "1.5", "1e9"])
def test_a_gpu_request_that_is_not_a_count_names_the_request(count: str) -> None:
    with pytest.raises(QstatParseError) as info:
        parse_job(soge_gpu_request(count), 1, VM1)
    assert str(info.value).startswith("request gpu must be a whole number of GPUs (0-4096), ")


def test_a_complex_of_another_name_is_not_counted() -> None:
    """Given -l gpu=1 but [gpu] complex = "nvidia_gpu", then the job has no GPUs."""
    rs = parse_job(soge_gpu_request("1"), 1, VM1, gpu=GpuComplex("nvidia_gpu"))
    assert rs.nodes[0].gpus == ""
