"""Parser fuzzing: every text geco reads from a job or from Grid Engine, made hostile.

The parsers (and the one exception type each documents):

* ``GECOResourceSet_v1{...}`` (:mod:`geco.sge.v1format`): ResourceFormatError;
* ``qstat -xml -j`` and ``qstat -xml -u '*' -g t`` (:mod:`geco.sge.qstat`):
  QstatParseError, and for ``-j`` also JobNotFound and TaskNotRunning, which
  are Grid Engine's answers, not parse failures;
* ``pe_hostfile`` (:func:`geco.sge.pe_hostfile.parse_pe_hostfile`): QstatParseError;
* the spooled ``environment`` and ``config`` (:mod:`geco.sge.execd`; their users
  :func:`geco.sge.lookup.from_spool` and :func:`geco.oom.asowner.stderr_target`):
  never an error for the text itself, GecoError for a file that cannot be used.

The property, for every input: a result or that one error, never another
exception type, never a hang; a valid input round-trips where the format has
a writer; and whatever a parser returns can be stored in the job's resource
file (it serializes to v1 and reads back equal), since that is where geco
puts it next. Inputs are random bytes, mutations of real files (the recorded
qstat outputs in ``tests/fixtures/qstat``, the seed's resource text), field
values at their boundaries, and named attacks (entity expansion, external
entities, 100 MB documents).

``GECO_FUZZ_EXAMPLES=<n>`` runs ``n`` examples per test (see ``fuzzkit``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from lxml import etree

from geco.errors import (
    GecoError,
    JobNotFound,
    QstatParseError,
    ResourceFormatError,
    TaskNotRunning,
)
from geco.oom import asowner
from geco.reports import journalview
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import execd, lookup, qstat, v1format
from geco.sge.pe_hostfile import Placement, parse_pe_hostfile
from geco.usage import samples
from tests.fuzz import fuzzkit

# hypothesis warns when it shows an example of megabytes; they are the point here
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qstat"
# the seeds are edited as trees: rescheduled.xml, SoGE's not-quite-XML that qstat.py
# mends before parsing, is left out (tests/unit/test_qstat.py reads it)
JOB_XML = {p.stem: p.read_bytes() for p in sorted(FIXTURES.glob("*.xml"))
           if "qstat-gt" not in p.name and p.stem != "rescheduled"}
GT_XML = {p.name.split(".")[0]: p.read_bytes() for p in sorted(FIXTURES.glob("*.qstat-gt*"))}
SEED = (
    b"GECOResourceSet_v1{li3324,li1,lf0,b0,lf1000000000,i0,i2,b0,b1,s7:My test,s4:frey,"
    b"s6:it_nss,s10:/home/1001,s4:n000{b0,i20,lf2000000000,lf20000000000,s0:,s4:mic0},"
    b"s4:n003{b1,i12,lf1200000000,lf12000000000,s0:,s4:mic1}}"
)
MiB = 1 << 20

# What a hostile value of a field looks like: every boundary of the numbers geco reads,
# numbers Python reads but Grid Engine never prints, and text that is no number at all.
NUMBERS = [
    "", " ", "0", "1", "-1", "-0", " 7 ", "4294967295", "4294967296", "9223372036854775807",
    "9223372036854775808", "18446744073709551615", "18446744073709551616", "9" * 40,
    "9" * 5000, "0" * 5000 + "1", "1e999999999", "1e-999999999", "-1e999999999", "1E+99",
    "NaN", "-nan", "sNaN", "Infinity", "-Infinity", "INFINITY", "inf", "1.5", ".5", "5.",
    "0x10", "0o7", "1_000", "\u0661\u0662", "\uff11\uff12", "1:2:3", "9" * 400 + ":0:0",
    "1::1", "::", "1:2", "1.5G", "9" * 5000 + "G", "9" * 30 + "T", "1.5k", "true", "false",
    "TRUE", "\u263a", "a@b", "@", "all.q@", "MASTER", "SLAVE",
]
# the elements qstat.py reads (SoGE and UGE/OCS names), where a hostile value does harm
READ_TAGS = [
    "JB_job_number", "JB_owner", "JB_group", "JB_job_name", "JB_cwd", "JB_type",
    "JB_is_array", "RN_min", "RN_max", "JAT_task_number", "JAT_status", "CE_name",
    "CE_doubleval", "CE_stringval", "JG_qhostname", "JG_slots", "GRU_name", "GRU_host",
    "GRU_value", "GRU_amount", "RESL_value", "queue_name", "slots", "master", "tasks",
    "ST_name",
]
# the requests qstat.py reads, given hostile values in a job's JB_hard_resource_list
REQUESTS = ["h_vmem", "m_mem_free", "h_rt", "geco_trace_level", "standby", "standby_x",
            "phi_config_for_user"]
# UGE/OCS granted hosts and resources, added to a SoGE task so their parsers get input too
UGE_TASK_PARTS = (
    b"<JAT_granted_destin_identifier_list><element><JG_qhostname>vm</JG_qhostname>"
    b"<JG_slots>1</JG_slots></element></JAT_granted_destin_identifier_list>"
    b"<JAT_granted_resources_list><grl><GRU_name>m_mem_free</GRU_name><GRU_value>4.000G"
    b"</GRU_value><GRU_host>vm</GRU_host></grl><grl><GRU_name>nvidia_gpu</GRU_name>"
    b"<GRU_host>vm</GRU_host><RESL_value>0</RESL_value></grl></JAT_granted_resources_list>"
)


def storable(rs: ResourceSet) -> None:
    """What a parser returned goes into the job's resource file next: it must fit it."""
    assert v1format.parse(v1format.serialize(rs)) == rs


# inputs tried by this module's fuzz tests, and those that raised a foreign exception
TRIED = {"inputs": 0, "foreign": 0}


def only(errors: tuple[type[BaseException], ...], call: Callable[[], object]) -> object:
    """``call()``'s result, or the exception when it raised one of ``errors`` (anything
    else fails the test, with the input hypothesis shows)."""
    TRIED["inputs"] += 1
    try:
        return call()
    except errors as exc:
        # one clear sentence: never empty, never the megabytes of a hostile value
        assert 0 < len(str(exc)) <= 2000, f"{type(exc).__name__}: {str(exc)[:2000]}..."
        return exc
    except Exception:
        TRIED["foreign"] += 1
        raise


def no_hang(call: Callable[[object], object], *, setup: Callable[[], object] = lambda: None,
            errors: tuple[type[BaseException], ...], timeout: float = 60.0,
            max_growth: int | None = None) -> fuzzkit.Outcome:
    """Run a parser in a forked child: it must end within ``timeout`` with a result or one
    of ``errors`` and, when given, add at most ``max_growth`` bytes of peak RSS."""
    outcome = fuzzkit.bounded(call, setup=setup, timeout=timeout)
    assert not outcome.hung, outcome.message
    names = {e.__name__ for e in errors} | {""}
    assert outcome.error in names, outcome.message
    if max_growth is not None:
        assert outcome.rss_growth <= max_growth, \
            f"peak RSS grew by {outcome.rss_growth / MiB:.0f} MiB"
    return outcome


# -- GECOResourceSet_v1 -------------------------------------------------------------------

names = st.text(max_size=30) | st.binary(max_size=30).map(
    lambda b: b.decode("utf-8", "surrogateescape"))
nodes = st.builds(NodeResources, name=names, is_slave=st.booleans(),
                  slots=st.integers(0, 2**31 - 1), memory_limit=st.integers(0, 2**63 - 1),
                  vmem_limit=st.integers(0, 2**63 - 1), gpus=names, phis=names)
resource_sets = st.builds(
    ResourceSet, job_id=st.integers(-(2**63), 2**63 - 1),
    task_id=st.integers(-(2**63), 2**63 - 1),
    runtime_limit=st.floats(0, allow_infinity=False, allow_nan=False) | st.sampled_from(
        [0.0, 5e-324, 1.7976931348623157e308]),
    is_standby=st.booleans(), per_slot_vmem=st.integers(0, 2**63 - 1),
    trace_level=st.integers(-(2**31), 2**31 - 1), is_array=st.booleans(),
    phi_for_user=st.booleans(), job_name=names, owner=names, group=names, cwd=names,
    nodes=st.lists(nodes, max_size=4).map(tuple), cluster=names,
    submitted=st.floats(0, allow_infinity=False, allow_nan=False))


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A valid text with a few bytes flipped, cut, repeated, or a number replaced by a
    boundary value."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "cut", "insert", "repeat", "number", "end"]))
        if kind == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:at + draw(st.integers(1, 40))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=20) | st.sampled_from(
                [b",", b"{", b"}", b"s99999999:", b"s0:", b"li", b"lf", b"i", b"b2", b"-"]))
        elif kind == "repeat":
            data[at:at] = data[at:at + draw(st.integers(1, 60))]
        elif kind == "number":
            data[at:at] = draw(st.sampled_from(NUMBERS)).encode()
        else:
            del data[at:]
    return bytes(data)


resource_texts = mutated(st.just(SEED) | resource_sets.map(v1format.serialize))


@fuzzkit.fuzz_settings(400)
@given(rs=resource_sets)
def test_a_valid_resource_set_round_trips_through_its_text(rs: ResourceSet) -> None:
    """Given any resource set the format can hold, when written and read back, then it is
    equal, and the text is canonical (written again, the same bytes)."""
    TRIED["inputs"] += 1
    text = v1format.serialize(rs)
    assert v1format.parse(text) == rs
    assert v1format.serialize(v1format.parse(text)) == text


@fuzzkit.fuzz_settings(1500)
@given(data=resource_texts | st.binary(max_size=300)
       | st.binary(max_size=300).map(lambda b: b"GECOResourceSet_v1{" + b))
@example(data=SEED[:-1])
@example(data=SEED + SEED)
@example(data=SEED.replace(b"s7:", b"s9999999999999999999999:"))
@example(data=SEED.replace(b"lf0,", b"lf1e400,"))
@example(data=SEED.replace(b"lf0,", b"lf-0,"))
@example(data=SEED.replace(b"lf1000000000", b"lf9223372036854775808"))
@example(data=SEED.replace(b"i2,", b"i2147483648,"))
def test_any_resource_text_parses_or_gives_one_resource_format_error(data: bytes) -> None:
    """Given any bytes (mutated real texts, random ones), when parsed, then the result is
    a resource set that writes back to a text reading the same, or the one error is
    ResourceFormatError with an offset inside the input and a caret line."""
    rs = only((ResourceFormatError,), lambda: v1format.parse(data))
    if isinstance(rs, ResourceFormatError):
        assert 0 <= rs.offset <= len(data), rs
        assert rs.caret().count("\n") == 1
    else:
        assert isinstance(rs, ResourceSet)
        storable(rs)


@pytest.mark.parametrize("text", [
    b"GECOResourceSet_v1{li1,li1,lf0,b0,lf" + b"0" * MiB + b".5,i0,i0,b0,b0,s0:,s0:,s0:,s0:}",
    b"GECOResourceSet_v1{li1,li1,lf" + b"0" * MiB + b".,b0,lf0,i0,i0,b0,b0,s0:,s0:,s0:,s0:}",
    b"GECOResourceSet_v1{li" + b"9" * MiB + b",li1",
    b"GECOResourceSet_v1{li1,li1,lf1" + b"0" * MiB + b"e-" + b"9" * MiB + b",b0",
    b"GECOResourceSet_v1{li1,li1,lf0,b0,lf0,i0,i1,b0,b0,s0:,s0:,s0:,s0:,s"
    + b"0" * MiB + b"1:x{b0",
    b"GECOResourceSet_v1{" + b"," * (4 * MiB),
], ids=["zeros-then-fraction", "zeros-then-dot", "huge-integer", "huge-exponent",
        "zero-padded-length", "commas"])
def test_a_pathological_resource_text_is_refused_without_a_hang(text: bytes) -> None:
    """Given a few MiB built to make a parser backtrack or convert huge numbers, when
    parsed, then it ends with a ResourceFormatError (a regex that backtracks on "lf000...0.5"
    took 43 s for 30,000 zeros and would never end for a MiB)."""
    no_hang(lambda _: v1format.parse(text), errors=(ResourceFormatError,), timeout=30)


# -- qstat -xml -j and -g t -------------------------------------------------------------------

JOB_ERRORS = (QstatParseError, JobNotFound, TaskNotRunning)
PLACEMENTS = st.lists(st.builds(Placement, host=st.sampled_from(["vm", "n1", "x.y", ""]),
                                slots=st.integers(1, 64), is_master=st.booleans()),
                      min_size=1, max_size=3)


def parse_any_job(xml: bytes, task: int, placement: list[Placement] | None) -> None:
    """Every reader of a ``qstat -xml -j`` document: one documented error or a storable set."""
    for rs in (only(JOB_ERRORS, lambda: qstat.parse_job(xml, task, placement)),
               only(JOB_ERRORS, lambda: qstat.parse_job(xml, task, placement, job_id=1))):
        if isinstance(rs, ResourceSet):
            storable(rs)
    number = only(JOB_ERRORS, lambda: qstat.job_number(xml))
    assert isinstance(number, JOB_ERRORS) or (isinstance(number, int) and number >= 1)


def parse_any_listing(xml: bytes, job: int, task: int) -> None:
    found = only((QstatParseError,), lambda: qstat.parse_placement_gt(xml, job, task))
    if isinstance(found, list) and found:
        storable(ResourceSet(job, max(task, 1), nodes=tuple(
            NodeResources(p.host, not p.is_master, p.slots) for p in found)))


@st.composite
def edited_xml(draw: st.DrawFn, documents: dict[str, bytes]) -> bytes:
    """A recorded qstat document with elements given hostile texts, removed, repeated,
    or (UGE/OCS) granted hosts and resources added to a task."""
    name = draw(st.sampled_from(sorted(documents)))
    root = etree.fromstring(documents[name])
    if draw(st.booleans()):
        for task in root.iter("ulong_sublist", "element"):
            if task.find("JAT_task_number") is not None:
                task.extend(etree.fromstring(b"<x>" + UGE_TASK_PARTS + b"</x>"))
    job = root.find("djob_info/element")
    if job is not None and draw(st.booleans()):
        hard = job.find("JB_hard_resource_list")
        if hard is None:
            hard = etree.SubElement(job, "JB_hard_resource_list")
        for _ in range(draw(st.integers(1, 3))):
            request = etree.SubElement(hard, "qstat_l_requests")
            etree.SubElement(request, "CE_name").text = draw(st.sampled_from(REQUESTS))
            for tag in draw(st.sets(st.sampled_from(["CE_stringval", "CE_doubleval"]))):
                etree.SubElement(request, tag).text = draw(st.sampled_from(NUMBERS))
    everything = list(root.iter())
    read = [e for e in everything if e.tag in READ_TAGS]
    for _ in range(draw(st.integers(1, 5))):
        target = draw(st.sampled_from(read or everything) | st.sampled_from(everything))
        kind = draw(st.sampled_from(["text", "text", "text", "remove", "repeat", "empty"]))
        parent = target.getparent()
        if kind == "text":
            value = draw(st.sampled_from(NUMBERS) | st.text(max_size=20))
            try:
                target.text = value
            except ValueError:  # lxml refuses characters XML cannot hold
                assume(False)
        elif kind == "remove" and parent is not None:
            parent.remove(target)
        elif kind == "repeat" and parent is not None:
            parent.append(copy.deepcopy(target))
        elif kind == "empty":
            target[:] = []
            target.text = None
    return bytes(etree.tostring(root))


def _flip(data: bytes, at: int, value: bytes) -> bytes:
    at %= max(len(data), 1)
    return data[:at] + value + data[at + len(value):]


raw_job_xml = st.builds(_flip, st.sampled_from(sorted(JOB_XML.values())),
                        st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8))


@fuzzkit.fuzz_settings(600)
@given(xml=edited_xml(JOB_XML) | raw_job_xml | st.binary(max_size=200), task=st.sampled_from(
    [0, 1, 2, 3, 2**63]), placement=st.none() | PLACEMENTS)
@example(xml=JOB_XML["serial"].replace(b"<JB_job_number>1<", b"<JB_job_number>" + b"9" * 5000
                                       + b"<"), task=0, placement=None)
def test_any_qstat_job_document_gives_a_storable_resource_set_or_one_documented_error(
        xml: bytes, task: int, placement: list[Placement] | None) -> None:
    """Given a recorded ``qstat -xml -j`` with hostile values (every boundary of the numbers
    qstat.py reads), broken bytes, or random bytes, when parsed as every caller does, then
    the result is a resource set the resource file can hold, or one of QstatParseError,
    JobNotFound, TaskNotRunning, each with a message."""
    parse_any_job(xml, task, placement)


@fuzzkit.fuzz_settings(300)
@given(xml=edited_xml(GT_XML) | st.binary(max_size=200), job=st.sampled_from([1, 5, 7, 8]),
       task=st.sampled_from([0, 1, 2]))
def test_any_qstat_listing_gives_placements_or_a_qstat_parse_error(
        xml: bytes, job: int, task: int) -> None:
    """Given a recorded ``qstat -xml -u '*' -g t`` with hostile values, when parsed, then
    the placements fit a resource file, or the one error is QstatParseError."""
    parse_any_listing(xml, job, task)


def with_request(name: str, stringval: str | None, doubleval: str | None) -> bytes:
    """The recorded serial job, requesting ``name`` with these CE_ values."""
    parts = f"<CE_name>{name}</CE_name>"
    for tag, value in (("CE_stringval", stringval), ("CE_doubleval", doubleval)):
        if value is not None:
            parts += f"<{tag}>{value}</{tag}>"
    return JOB_XML["serial"].replace(b"<JB_ja_tasks>", (
        f"<JB_hard_resource_list><qstat_l_requests>{parts}</qstat_l_requests>"
        "</JB_hard_resource_list><JB_ja_tasks>").encode())


xml_text = st.text(st.characters(blacklist_categories=["Cs", "Cc"],
                                 blacklist_characters="<&"), max_size=30)


@fuzzkit.fuzz_settings(400)
@given(name=st.sampled_from(REQUESTS), stringval=st.none() | st.sampled_from(NUMBERS)
       | xml_text, doubleval=st.none() | st.sampled_from(NUMBERS) | xml_text)
def test_any_request_value_gives_a_limit_the_resource_file_holds_or_one_error(
        name: str, stringval: str | None, doubleval: str | None) -> None:
    """Given a job requesting h_vmem, m_mem_free, h_rt, geco_trace_level, standby or
    phi_config_for_user with any CE_stringval and CE_doubleval (every boundary: negative,
    2**63, 1e999999999, NaN, thousands of digits, hours:minutes:seconds of 400 digits),
    when parsed, then the limits fit the resource file (anything from 2**63 up is "no
    limit", as Grid Engine's INFINITY), or the one error is QstatParseError."""
    placement = [Placement("vm", 2, True)]
    rs = only(JOB_ERRORS, lambda: qstat.parse_job(with_request(name, stringval, doubleval),
                                                  1, placement))
    if isinstance(rs, ResourceSet):
        storable(rs)
        assert 0 <= rs.trace_level <= 4


@pytest.mark.parametrize(("name", "stringval", "doubleval", "outcome"), [
    ("geco_trace_level", None, "1e999999999", "trace 4"),
    ("geco_trace_level", None, "-1e999999999", "trace 0"),
    ("h_rt", "9" * 400 + ":0:0", None, "must be at most 64 characters, got '9999"),
    ("h_rt", "9" * 30, None, "runtime 0.0"),
    ("h_rt", "9" * 30 + ":0:0", None, "runtime 0.0"),
    ("h_vmem", "9" * 9_000_000, None, "must be at most 64 characters, got '9999"),
    ("h_vmem", "9" * 40 + "T", None, "vmem 0"),
    ("m_mem_free", "1" + "0" * 30, None, "memory 0"),
    ("standby" + "x" * MiB, "no number", None, "request standbyxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx:"),
], ids=["trace-1e999999999", "trace-minus", "hms-400-digits", "seconds-30-digits",
        "hours-30-digits", "memory-9-MB", "memory-40-digits-T", "memory-31-digits",
        "name-1-MiB"])
def test_a_huge_request_value_is_no_limit_or_one_short_error_without_a_hang(
        name: str, stringval: str | None, doubleval: str | None, outcome: str) -> None:
    """Regressions: int(Decimal("1e999999999")) for geco_trace_level never ended; 400
    digits of hours raised OverflowError; 9 MB of digits raised ValueError (int's digit
    limit); h_vmem and m_mem_free from 2**63 up gave limits no resource file holds; a
    request's name of a MiB went whole into the message. Now each is "no limit" (0), a
    clamped trace level, or a QstatParseError of one short line."""
    xml = with_request(name, stringval, doubleval)

    def parse(_: object) -> None:
        try:
            rs = qstat.parse_job(xml, 1, [Placement("vm", 2, True)])
        except QstatParseError as exc:
            assert len(str(exc)) < 300 and outcome in str(exc), str(exc)[:300]
            return
        got = {"trace": rs.trace_level, "runtime": rs.runtime_limit,
               "vmem": rs.per_slot_vmem, "memory": rs.nodes[0].memory_limit}
        kind, value = outcome.split()
        assert str(got[kind]) == value, got
        storable(rs)

    no_hang(parse, errors=(), timeout=30)


@pytest.mark.parametrize(("text", "error"), [
    (b"vm " + b"9" * 5000 + b" all.q@vm UNDEFINED\n",
     "slots must be at most 4294967295 (a u_long32), got 'vm 999"),
    (b"vm 4294967296 all.q@vm UNDEFINED\n", "slots must be at most 4294967295"),
    (b"vm 2147483648 all.q@vm UNDEFINED\n", "add up to 2147483648, more than 2147483647"),
    (b"vm 2147483647 a.q@vm U\nvm 1 b.q@vm U\n", "add up to 2147483648"),
], ids=["5000-digits", "beyond-u32", "beyond-i32", "sum-beyond-i32"])
def test_a_pe_hostfile_with_more_slots_than_a_host_can_have_is_one_short_error(
        text: bytes, error: str) -> None:
    """Regression: 5000 digits of slots raised ValueError (int's digit limit), and slots
    beyond 2**31-1 gave a placement no resource file holds."""
    with pytest.raises(QstatParseError) as info:
        parse_pe_hostfile(text)
    assert error in str(info.value) and len(str(info.value)) < 300


@pytest.mark.parametrize(("old", "new", "error"), [
    (b"<JB_job_number>1<", b"<JB_job_number>" + b"9" * 5000 + b"<",
     "JB_job_number must be at most 4294967295 (a u_long32), got '9999"),
    (b"<JB_type>0<", b"<JB_type>4294967296<", "JB_type must be at most 4294967295"),
    (b"<JAT_task_number>1<", b"<JAT_task_number>" + b"1" * 5000 + b"<",
     "JAT_task_number must be at most 4294967295"),
], ids=["job-number", "jb-type", "task-number"])
def test_a_grid_engine_number_beyond_u32_is_one_short_qstat_parse_error(
        old: bytes, new: bytes, error: str) -> None:
    """Regression: thousands of digits in a number raised ValueError (int's digit limit),
    not QstatParseError; the message showed all of them."""
    with pytest.raises(QstatParseError) as info:
        qstat.parse_job(JOB_XML["serial"].replace(old, new), 1, [Placement("vm", 1, True)])
    assert error in str(info.value) and len(str(info.value)) < 300


def test_an_unknown_job_list_of_a_mib_is_named_in_one_short_line() -> None:
    """Regression: every ST_name of an <unknown_jobs> answer went into the message."""
    xml = b"<unknown_jobs><element><ST_name>" + b"7" * MiB + b"</ST_name></element></unknown_jobs>"
    with pytest.raises(JobNotFound, match="does not know job 7777") as info:
        qstat.parse_job(xml, 1)
    assert len(str(info.value)) < 300


def _with_doctype(subset: bytes) -> bytes:
    return (b"<?xml version='1.0'?>\n<!DOCTYPE detailed_job_info [" + subset + b"]>\n"
            + JOB_XML["serial"].split(b"?>", 1)[1].replace(b"<JB_owner>testuser<",
                                                             b"<JB_owner>&e;<"))


LAUGHS = b"<!ENTITY e0 'lol'>" + b"".join(
    b"<!ENTITY e%d '%s'>" % (i, b"".join(b"&e%d;" % (i - 1) for _ in range(10)))
    for i in range(1, 10)) + b"<!ENTITY e '&e9;'>"


@pytest.mark.parametrize("xml", [
    _with_doctype(LAUGHS),
    _with_doctype(b"<!ENTITY e SYSTEM 'file://{marker}'>"),
    _with_doctype(b"<!ENTITY % p SYSTEM 'file://{marker}'> %p;"),
    _with_doctype(b"<!ENTITY e SYSTEM 'http://127.0.0.1:9/x'>"),
    b"<?xml version='1.0'?>\n<!-- a comment first -->\n" + _with_doctype(LAUGHS).split(
        b"?>", 1)[1],
    JOB_XML["serial"].replace(b"<JB_owner>testuser<", b"<JB_owner>&undefined;<"),
    JOB_XML["serial"].replace(b"<JB_owner>testuser<", b"<JB_owner xmlns:xi='http://www.w3."
                              b"org/2001/XInclude'><xi:include href='file://{marker}' "
                              b"parse='text'/><"),
    JOB_XML["serial"].replace(b"<JB_owner>testuser<", b"<JB_owner>&#0;<"),
    JOB_XML["serial"].replace(b"<JB_owner>testuser<", b"<JB_owner>&#x110000;<"),
    b"<a>" * 100_000 + b"</a>" * 100_000,
    b"<detailed_job_info><djob_info>" + b"<element/>" * 100_000 + b"</djob_info>"
    b"</detailed_job_info>",
    JOB_XML["serial"].replace(b"<JB_job_name>serial<",
                              b"<JB_job_name>" + b"x" * (11 * MiB) + b"<"),
    "\ufeff".encode() + JOB_XML["serial"],
    JOB_XML["serial"].decode().encode("utf-16"),
], ids=["billion-laughs", "external-entity", "parameter-entity", "network-entity",
        "doctype-after-comment", "undefined-entity", "xinclude", "nul-reference",
        "beyond-unicode", "deep", "wide", "huge-text", "bom", "utf-16"])
def test_entity_and_size_attacks_on_qstat_xml_give_one_error_and_read_no_file(
        xml: bytes, tmp_path: Path) -> None:
    """Given a qstat document carrying entity expansion (billion laughs), an external or
    parameter entity naming a secret file, an XInclude of it, or extreme nesting or size,
    when parsed, then the outcome is a QstatParseError (or a plain result that holds none
    of the secret), within the time limit, and the secret's text appears nowhere."""
    marker = tmp_path / "secret"
    marker.write_text("SECRET-MARKER-4711\n")
    xml = xml.replace(b"{marker}", str(marker).encode())

    def parse(_: object) -> None:
        for call in (lambda: qstat.parse_job(xml, 1, [Placement("vm", 1, True)]),
                     lambda: qstat.job_number(xml)):
            try:
                result = call()
            except JOB_ERRORS as exc:
                result = exc
            assert "SECRET-MARKER" not in repr(result)
            if isinstance(result, ResourceSet):
                storable(result)

    no_hang(parse, errors=(), timeout=120)


def test_a_100_mb_qstat_document_is_refused_in_bounded_memory() -> None:
    """Given 100 MB of well-formed qstat XML (a job listing many elements), when parsed,
    then it is one QstatParseError, and the parser adds at most 64 MiB of peak memory
    (a tree of it would take gigabytes)."""
    def build() -> bytes:
        head, tail = JOB_XML["serial"].split(b"<JB_env_list>", 1)
        item = b"<job_sublist><VA_variable>V</VA_variable><VA_value>x</VA_value></job_sublist>"
        return head + b"<JB_env_list>" + item * (100 * MiB // len(item)) + tail

    outcome = no_hang(lambda xml: qstat.parse_job(xml, 1, [Placement("vm", 1, True)]),
                      setup=build, errors=(QstatParseError,), timeout=120,
                      max_growth=64 * MiB)
    assert outcome.error == "QstatParseError", outcome.message
    assert f"must be at most {qstat.MAX_XML} bytes, got {len(build())}" in outcome.message
    fuzzkit.record("parser: peak memory added by a 100 MB qstat document",
                   round(outcome.rss_growth / MiB, 1), "MiB")


# -- pe_hostfile --------------------------------------------------------------------------

hosts = st.text(st.characters(blacklist_categories=["Cs", "Z", "Cc"]), min_size=1,
                max_size=20).filter(lambda h: not any(c.isspace() for c in h))


@fuzzkit.fuzz_settings(400)
@given(lines=st.lists(st.tuples(hosts, st.integers(1, 2**31 - 1), st.sampled_from(
    ["all.q@vm", "UNDEFINED", "a.q@n1"]), st.sampled_from(["UNDEFINED", "0,1", ""])),
    min_size=1, max_size=6))
def test_a_valid_pe_hostfile_reads_back_the_hosts_and_slots_it_lists(
        lines: list[tuple[str, int, str, str]]) -> None:
    """Given a pe_hostfile of any hosts and slot counts, when parsed, then each host has the
    sum of its lines' slots, the first line's host is the master and comes first, and the
    result fits a resource file."""
    text = "".join(f"{h} {s} {q} {p}\n" for h, s, q, p in lines).encode()
    want: dict[str, int] = {}
    for h, s, _, _ in lines:
        want[h] = want.get(h, 0) + s
    TRIED["inputs"] += 1
    if max(want.values()) > 2**31 - 1:  # more than a resource file can hold for one host
        with pytest.raises(QstatParseError, match="add up to"):
            parse_pe_hostfile(text)
        return
    got = parse_pe_hostfile(text)
    assert {p.host: p.slots for p in got} == want
    assert got[0].host == lines[0][0] and got[0].is_master
    assert [p.is_master for p in got[1:]] == [False] * (len(got) - 1)
    storable(ResourceSet(1, nodes=tuple(NodeResources(p.host, not p.is_master, p.slots)
                                         for p in got)))


@fuzzkit.fuzz_settings(800)
@given(text=st.binary(max_size=300) | st.lists(st.sampled_from(
    [b"vm", b"1", b"0", b"-1", b"9" * 5000, b"18446744073709551616", b"2147483648",
     b"all.q@vm", b"UNDEFINED", b"\xff\xfe", b"\x00", b"\t", b" ", b"\r", b"\n", b"\x0b",
     b"\xc2\xa0", b"\x1c"]), max_size=30).map(b"".join))
@example(text=b"vm 2147483647 q p\nvm 1 q p\n")
@example(text=b"vm " + b"9" * 5000 + b" q p\n")
def test_any_pe_hostfile_gives_placements_or_a_qstat_parse_error(text: bytes) -> None:
    """Given any bytes as a pe_hostfile, when parsed, then the placements fit a resource
    file (slots from 1 to 2**31-1 per host), or the one error is QstatParseError."""
    got = only((QstatParseError,), lambda: parse_pe_hostfile(text))
    if not isinstance(got, QstatParseError):
        assert isinstance(got, list) and got
        storable(ResourceSet(1, nodes=tuple(NodeResources(p.host, not p.is_master, p.slots)
                                             for p in got)))


# -- the spooled environment and config ---------------------------------------------------

keys = st.binary(min_size=1, max_size=20).filter(lambda k: b"=" not in k and b"\n" not in k)
values = st.binary(max_size=40).filter(lambda v: b"\n" not in v)


@fuzzkit.fuzz_settings(300)
@given(pairs=st.dictionaries(keys, values, max_size=10))
def test_spooled_key_value_lines_read_back_what_execd_wrote(pairs: dict[bytes, bytes]) -> None:
    """Given key=value lines as sge_execd writes them (any bytes but '=' in the key and a
    newline anywhere), when parsed, then every pair reads back as written."""
    text = b"".join(k + b"=" + v + b"\n" for k, v in pairs.items())
    TRIED["inputs"] += 1
    assert execd.parse_key_values(text) == pairs


def _spool(base: Path, config: bytes, environment: bytes, pe_hostfile: bytes) -> Path:
    d = base / "active_jobs" / "42.1"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config").write_bytes(config)
    (d / "environment").write_bytes(environment)
    (d / "pe_hostfile").write_bytes(pe_hostfile)
    return d


CONFIG_KEYS = [b"job_owner", b"job_name", b"cwd", b"job_id", b"ja_task_id", b"merge_stderr",
               b"stderr_path", b"stdout_path", b"queue", b"host"]
ENV_KEYS = [b"JOB_ID", b"SGE_TASK_ID", b"SGE_STDERR_PATH", b"SGE_STDOUT_PATH"]
spool_values = st.binary(max_size=30) | st.sampled_from(
    [b"", b"/dev/null", b"rel/path", b"/abs/\x00nul", b"\xff", b"1", b"0", b"true", b".",
     b"..", b"/", b"x" * 5000, b"nobody", b"root"])


def key_values(key_names: list[bytes]) -> st.SearchStrategy[bytes]:
    line = st.tuples(st.sampled_from(key_names) | keys, spool_values).map(
        lambda kv: kv[0] + b"=" + kv[1])
    return st.lists(line | st.binary(max_size=30), max_size=12).map(b"\n".join)


@fuzzkit.fuzz_settings(300)
@given(config=key_values(CONFIG_KEYS), environment=key_values(ENV_KEYS),
       pe_hostfile=st.sampled_from([b"vm 1 all.q@vm UNDEFINED\n", b"", b"vm x\n"])
       | st.binary(max_size=60))
def test_a_hostile_spool_gives_a_storable_resource_set_or_one_geco_error(
        tmp_path_factory: pytest.TempPathFactory, config: bytes, environment: bytes,
        pe_hostfile: bytes) -> None:
    """Given a job spool dir whose config, environment and pe_hostfile hold anything a job's
    owner could have put there (names, paths, bytes that are not UTF-8), when geco reads it
    as it does without a qmaster (the resource set from the spool) and for an OOM message
    (where the job's stderr goes), then each gives a result (the resource set fits a
    resource file) or a GecoError, never another exception."""
    spool = _spool(tmp_path_factory.mktemp("spool"), config, environment, pe_hostfile)
    job = execd.JobRef(42, 1, spool)
    rs = only((GecoError,), lambda: lookup.from_spool(job))
    if not isinstance(rs, GecoError):
        assert isinstance(rs, ResourceSet)
        storable(rs)
    assert isinstance(only((GecoError,), lambda: execd.read_config(spool)), dict | GecoError)
    target = only((GecoError,), lambda: asowner.stderr_target(spool))
    assert target is None or isinstance(target, asowner.StderrTarget | GecoError)


# -- what a user's job leaves for root to read and print (issue 48) -------------------

_SAMPLE_HEAD = samples.MAGIC + b'{"job_id":42,"task_id":1,"owner":"alice"}\n'
_RECORD = samples.RECORD.pack(1000.0, *([7] * 9))


@fuzzkit.fuzz_settings(800)
@given(data=st.binary(max_size=600)
       | st.binary(max_size=600).map(lambda b: samples.MAGIC + b)
       | st.binary(max_size=300).map(lambda b: _SAMPLE_HEAD + b)
       | st.binary(max_size=300).map(lambda b: b"\n".join(
           [samples.MAGIC + b, _RECORD])))
@example(data=_SAMPLE_HEAD + _RECORD[:-1])
@example(data=samples.MAGIC + b'{"job_id": "x", "cores": []}\n' + _RECORD)
@example(data=samples.MAGIC + b"[]\n")
@example(data=samples.MAGIC + b"{" * 5000 + b"\n")
def test_any_usage_file_reads_back_or_gives_one_geco_error(data: bytes) -> None:
    """Given any bytes as a usage samples file (a slave's answer, a file left by a crash),
    when read back, then it is a series whose report and chart are made, or one
    GecoError: a job's end, a RELEASE and `geco usage` never meet another exception."""
    from geco.usage import efficiency
    from geco.usage.usagechart import chart

    def use() -> object:
        series = samples.load(data, "a slave's samples")
        efficiency.render(efficiency.report(series, running=False))
        return chart(series)

    only((GecoError,), use)


_FIELD = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"])
                 | st.sampled_from("\x1b\x07\r\n\x9b\u202e\udcff"), max_size=40)
_ENTRY = st.builds(
    lambda usec, uid, fields: journalview.Entry(usec, {**fields, "_UID": uid}),
    st.integers(0, 2**53), st.sampled_from(["0", "1001", ""]),
    st.dictionaries(st.sampled_from(["MESSAGE", "SYSLOG_IDENTIFIER", "GECO_EVENT", "JOB_ID",
                                     "SGE_TASK_ID", "MEMORY_PEAK", "KILLED", "CLEANED_BY",
                                     "SGE_CLUSTER", "JOB_SUBMITTED", "OOM_KILLS", "PIDS"]),
                    _FIELD | st.sampled_from(["job-end", "cleanup-stuck", "oom", "1"]))
    .map(lambda f: {**f, "JOB_ID": "42"}))


@fuzzkit.fuzz_settings(600)
@given(entries=st.lists(_ENTRY, max_size=8))
def test_any_journal_entries_make_a_story_whose_end_is_roots_alone_in_plain_text(
        entries: list[journalview.Entry]) -> None:
    """Given any entries of job 42 (any fields, any writer), when `geco journal 42`
    formats them, then it never raises, prints no control character but newlines, and an
    entry not written by root never ends a task's story."""
    def story() -> str:
        found = journalview.instances(entries)
        return "".join(journalview.format_stories(found, 42, all_fields=True, earlier=None)
                       for _ in [0] if found)

    text = only((), story)
    assert isinstance(text, str)
    assert not [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F
                or 0xDC80 <= ord(c) <= 0xDCFF or c == "\u202e"]
    if not any(e.by_root for e in entries):
        assert " ended " not in "".join(journalview.summary(entries, 42)) or \
            all(e.event not in ("job-end", "cleanup-stuck") for e in entries)


def test_zz_the_parser_fuzz_figures_are_reported() -> None:
    """The figures of this module (it runs last in it): the inputs the fuzz tests above
    tried in this run, and how many raised an exception of a foreign type (each one
    also fails its test)."""
    fuzzkit.record("parser: inputs tried", TRIED["inputs"])
    fuzzkit.record("parser: exceptions of a foreign type", TRIED["foreign"])
    assert TRIED["foreign"] == 0
