"""A job whose requests are in a shape geco does not know is journaled, once per job.

geco reads a job's requests from ``JB_hard_resource_list`` (Son of Grid Engine,
Univa/Altair) or ``JB_request_set_list`` (Open Cluster Scheduler 9). A newer Grid Engine
may put them elsewhere; the job then runs without those limits, and the admin must learn
it from the journal before that happens (``GECO_EVENT=qstat-shape-unknown``, with the
job's fields and the shape named). The documents are the recorded OCS 9.1.4
``job-gpu1.xml`` (``qsub -b y -N gpu1 -l gpu=1 sleep 300``) with its request list
changed as such a Grid Engine might print it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from lxml import etree

from geco.config import Config
from geco.sge import execd, lookup, qstat, requests
from geco.sge.qstat import parse_job
from tests.logkit import handler_on

OCS = Path(__file__).resolve().parent.parent / "fixtures" / "ocs-9.1.4"
SOGE = Path(__file__).resolve().parent.parent / "fixtures" / "qstat"
GPU1 = (OCS / "job-gpu1.xml").read_bytes()
EVENT = "qstat-shape-unknown"


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process does: no job warned about yet."""
    monkeypatch.setattr(qstat, "_shape_warned", {})


class ShapeWarnings(logging.Handler):
    """Keeps the qstat-shape-unknown records it gets."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "geco_fields", {}).get("GECO_EVENT") == EVENT:
            self.records.append(record)


@pytest.fixture
def shape_warnings() -> Iterator[list[logging.LogRecord]]:
    """The qstat-shape-unknown records logged while the test runs."""
    handler = ShapeWarnings()
    with handler_on("geco.sge.qstat", handler):
        yield handler.records


def changed(old: bytes, new: bytes, xml: bytes = GPU1) -> bytes:
    assert old in xml
    return xml.replace(old, new)


def message(shape: str, job: int = 1) -> str:
    return (f"job {job}: qstat -xml -j holds requests in a shape geco does not know ({shape}); "
            "geco reads JB_hard_resource_list (Son of Grid Engine, Univa/Altair Grid Engine) "
            "and JB_request_set_list (Open Cluster Scheduler 9), so the job runs without the "
            "limits asked there (h_vmem, m_mem_free, h_rt, GPUs): is this a newer Grid Engine?")


FLAT = (b"<JB_hard_resource_list><qstat_l_requests><CE_name>h_rt</CE_name>"
        b"<CE_stringval>60</CE_stringval></qstat_l_requests></JB_hard_resource_list>")

SHAPES = [
    # the request sets under a name of their own
    (re.sub(rb"(</?)JB_request_set_list>", rb"\1JB_request_sets>", GPU1), "<JB_request_sets>"),
    # a scope beyond global, master and slave
    (changed(b"<JRS_scope>0<", b"<JRS_scope>3<"), "a request set of JRS_scope 3"),
    (changed(b"<JRS_scope>0</JRS_scope>", b""), "a request set without JRS_scope"),
    # requests without a name, or in a list of a name geco does not read
    (changed(b"<CE_name>gpu</CE_name>", b""),
     "a request without CE_name in <JRS_hard_resource_list>"),
    (re.sub(rb"(</?)JRS_hard_resource_list>", rb"\1JRS_hard_resource_map>", GPU1),
     "<JRS_hard_resource_map> in a request set"),
    # both shapes at once
    (changed(b"<JB_request_set_list>", FLAT + b"<JB_request_set_list>"),
     "both <JB_hard_resource_list> and <JB_request_set_list> (only the request sets are "
     "read)"),
]


@pytest.mark.parametrize(("xml", "shape"), SHAPES, ids=[s for _, s in SHAPES])
def test_a_shape_geco_does_not_know_is_journaled_naming_it(
        xml: bytes, shape: str, shape_warnings: list[logging.LogRecord]) -> None:
    """Given such a document, when it is parsed, then one warning names the shape, with
    the job's journal fields; the job is still read (its granted GPU among the rest)."""
    rs = parse_job(xml, 0, job_id=1)
    assert rs.nodes[0].gpus == "0"
    [record] = shape_warnings
    assert record.getMessage() == message(shape)
    assert record.geco_fields == {"JOB_ID": "1", "SGE_TASK_ID": "1", "GECO_EVENT": EVENT,
                                  "SHAPE": shape}


def test_a_warning_names_at_most_five_parts_each_cut_short(
        shape_warnings: list[logging.LogRecord]) -> None:
    """Given seven request lists of names geco does not know, one 60 characters long,
    then the warning names five, the long one cut to 40 characters, and counts the rest."""
    names = ["JB_resource_" + "x" * 48] + [f"JB_request_{i}" for i in range(6)]
    lists = b"".join(f"<{n}><a>1</a></{n}>".encode() for n in names)
    parse_job(changed(b"<JB_request_set_list>", lists + b"<JB_request_set_list>"), 0, job_id=1)
    shown = "; ".join([f"<JB_resource_{'x' * 28}...>"] + [f"<JB_request_{i}>" for i in range(4)])
    assert [r.getMessage() for r in shape_warnings] == [message(f"{shown}; and 2 more")]


def test_the_warning_comes_once_per_job_on_the_prolog_and_gecod_path(
        tmp_path: Path, shape_warnings: list[logging.LogRecord]) -> None:
    """Given a job of an unknown shape, when its resources are found as the prolog and
    gecod find them (qstat once, then the saved resource file) and qstat is asked again
    (gecod's reaper), then one warning in all."""
    (tmp_path / "job.xml").write_bytes(SHAPES[0][0])
    command = tmp_path / "qstat"
    command.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'calls'}\n"
                       f"cat {tmp_path / 'job.xml'}\n")
    command.chmod(0o755)
    cfg = Config(qstat=str(command), qstat_retries=0, state_dir=tmp_path / "state")
    job = execd.JobRef(1, 1)
    first = lookup.find(job, cfg)
    second = lookup.find(job, cfg)
    qstat.fetch(1, 1, cfg, sleep=lambda _: None)
    assert (first.source, second.source) == ("qstat", "file")
    assert (tmp_path / "calls").read_text().splitlines() == ["-xml -j 1", "-xml -j 1"]
    assert [r.getMessage() for r in shape_warnings] == [message("<JB_request_sets>")]


def test_each_job_of_an_unknown_shape_gets_its_own_warning(
        shape_warnings: list[logging.LogRecord]) -> None:
    """Job 2, asked about twice, is warned about once; a later job 1 (Grid Engine reuses
    job numbers: another submission time) gets its own warning."""
    first = SHAPES[0][0]
    other = first.replace(b"<JB_job_number>1<", b"<JB_job_number>2<")
    later = changed(b"<JB_submission_time>2026-11-27T03:31:", b"<JB_submission_time>2027-01-"
                    b"02T10:00:", first)
    for xml, number in ((first, 1), (other, 2), (other, 2), (later, 1), (first, 1)):
        parse_job(xml, 0, job_id=number)
    assert [r.getMessage() for r in shape_warnings] == [
        message("<JB_request_sets>", 1), message("<JB_request_sets>", 2),
        message("<JB_request_sets>", 1)]


# every recorded qstat -xml -j (rescheduled.xml, SoGE's not-quite-XML, is read in test_qstat)
DOCUMENTS = sorted(p for p in [*OCS.glob("job-*.xml"), *SOGE.glob("*.xml")]
                   if "qstat-gt" not in p.name and p.name != "rescheduled.xml")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recorded_document_has_a_shape_geco_knows(path: Path) -> None:
    """Son of Grid Engine 8.1.9's and OCS 9.1.4's outputs: jobs with and without requests
    (an empty list is left out), running or pending."""
    for job in etree.fromstring(path.read_bytes()).iterfind("djob_info/element"):
        assert requests.read(job, "gpu").unknown == ()


def test_a_job_that_requests_nothing_has_no_request_list_and_no_warning(
        shape_warnings: list[logging.LogRecord]) -> None:
    """OCS, like Son of Grid Engine, leaves an empty list out: no list is no requests."""
    xml = re.sub(rb"<JB_request_set_list>.*?</JB_request_set_list>", b"", GPU1, flags=re.S)
    rs = parse_job(xml, 0, job_id=1)
    assert (rs.runtime_limit, rs.nodes[0].vmem_limit, rs.nodes[0].gpus) == (0.0, 0, "0")
    assert shape_warnings == []
