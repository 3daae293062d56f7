"""GECOResourceSet_v1 text: exact round trip, strict parsing, refused values.

Given/When/Then in each test's name and docstring. Error texts are asserted in
full; expected values come from the seed document and the research notes.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from geco.errors import ResourceFormatError
from geco.resourceset import NodeResources, ResourceSet
from geco.sge.v1format import MAX_SIZE, parse, serialize

# the example printed in seeds/geco-core-library.txt, section GECOResource
SEED = (
    b"GECOResourceSet_v1{li3324,li1,lf0,b0,lf1000000000,i0,i2,b0,b1,s7:My test,s4:frey,"
    b"s6:it_nss,s10:/home/1001,s4:n000{b0,i20,lf2000000000,lf20000000000,s0:,s4:mic0},"
    b"s4:n003{b1,i12,lf1200000000,lf12000000000,s0:,s4:mic1}}"
)
SEED_SET = ResourceSet(
    job_id=3324, task_id=1, runtime_limit=0.0, is_standby=False, per_slot_vmem=1_000_000_000,
    trace_level=0, is_array=False, phi_for_user=True, job_name="My test", owner="frey",
    group="it_nss", cwd="/home/1001",
    nodes=(
        NodeResources("n000", False, 20, 2_000_000_000, 20_000_000_000, "", "mic0"),
        NodeResources("n003", True, 12, 1_200_000_000, 12_000_000_000, "", "mic1"),
    ),
)
# the original's own output (printf "%lf"), from research/geco-original.md §2
ORIGINAL = (
    b"GECOResourceSet_v1{li42,li1,lf3600.000000,b0,lf0.000000,i0,i1,b0,b0,s3:job,s5:alice,"
    b"s5:users,s11:/home/alice,s4:n001{b0,i4,lf8589934592.000000,lf0.000000,s0:,s0:}}"
)
MEM_RULE = "a whole number of bytes from 0 to 9223372036854775807"


def _error(data: bytes) -> ResourceFormatError:
    with pytest.raises(ResourceFormatError) as info:
        parse(data)
    return info.value


# --- the seed and the original's files ------------------------------------------------------

def test_given_seed_example_when_parsed_then_fields_match_the_seed_table() -> None:
    assert parse(SEED) == SEED_SET


def test_given_seed_example_when_parsed_and_serialized_then_bytes_are_identical() -> None:
    assert serialize(parse(SEED)) == SEED


def test_given_seed_set_when_serialized_twice_through_parse_then_node_order_is_kept() -> None:
    """The original prepended nodes on read, reversing them on every cycle."""
    once = parse(serialize(SEED_SET))
    twice = parse(serialize(once))
    assert [n.name for n in twice.nodes] == ["n000", "n003"]
    assert twice == SEED_SET


def test_given_nodes_out_of_name_order_when_parsed_then_document_order_is_kept() -> None:
    text = SEED.replace(b"n000", b"n009")
    assert [n.name for n in parse(text).nodes] == ["n009", "n003"]
    assert serialize(parse(text)) == text


def test_given_original_percent_lf_file_when_parsed_then_values_are_read_exactly() -> None:
    assert parse(ORIGINAL) == ResourceSet(
        job_id=42, task_id=1, runtime_limit=3600.0, job_name="job", owner="alice",
        group="users", cwd="/home/alice", nodes=(NodeResources("n001", False, 4, 8589934592),),
    )


def test_given_original_percent_lf_file_when_reserialized_then_output_is_canonical() -> None:
    assert serialize(parse(ORIGINAL)) == (
        b"GECOResourceSet_v1{li42,li1,lf3600,b0,lf0,i0,i1,b0,b0,s3:job,s5:alice,"
        b"s5:users,s11:/home/alice,s4:n001{b0,i4,lf8589934592,lf0,s0:,s0:}}"
    )


def test_given_phi_and_gpu_lists_when_round_tripped_then_phi_stays_out_of_gpu() -> None:
    """The original read the Phi string into the GPU field."""
    node = NodeResources("n1", gpus="0,1", phis="mic0,mic1")
    back = parse(serialize(ResourceSet(job_id=1, nodes=(node,)))).nodes[0]
    assert (back.gpus, back.phis) == ("0,1", "mic0,mic1")


def test_given_long_host_name_and_gpu_list_when_round_tripped_then_nothing_is_cut() -> None:
    """The original's 16-byte name and 24-byte list buffers refused these."""
    node = NodeResources("node-with-a-long-name.cluster.example.org",
                         gpus=",".join(str(i) for i in range(16)), phis="mic0," * 10)
    rs = ResourceSet(job_id=7, nodes=(node,))
    assert parse(serialize(rs)) == rs


def test_given_non_canonical_numbers_when_parsed_then_values_are_exact() -> None:
    text = SEED.replace(b"lf0,b0,lf1000000000", b"lf1.5,b0,lf1e9", 1)
    text = text.replace(b"lf2000000000", b"lf-0", 1).replace(b"i20", b"i0020", 1)
    rs = parse(text)
    assert (rs.runtime_limit, rs.per_slot_vmem) == (1.5, 1_000_000_000)
    assert (rs.nodes[0].memory_limit, rs.nodes[0].slots) == (0, 20)
    assert serialize(rs) == SEED.replace(b"lf0,", b"lf1.5,", 1).replace(
        b"lf2000000000", b"lf0", 1)


def test_given_numbers_padded_with_thousands_of_zeros_when_parsed_then_read_by_value() -> None:
    """Python's int() refuses over 4300 digits; padding must not turn into a crash."""
    zeros = b"0" * 5000
    text = (SEED.replace(b"li3324", b"li-" + zeros + b"3324", 1)
            .replace(b"s7:", b"s" + zeros + b"7:", 1)
            .replace(b"lf2000000000", b"lf" + zeros + b"2000000000." + zeros, 1))
    rs = parse(text)
    assert (rs.job_id, rs.job_name, rs.nodes[0].memory_limit) == (-3324, "My test", 2_000_000_000)


def test_given_memory_beyond_double_precision_when_round_tripped_then_it_is_exact() -> None:
    big = 2**63 - 1  # not representable as a double
    rs = ResourceSet(job_id=1, per_slot_vmem=big, nodes=(NodeResources("n", memory_limit=big),))
    assert b"lf9223372036854775807," in serialize(rs)
    assert parse(serialize(rs)) == rs


def test_given_one_megabyte_job_name_and_cwd_when_round_tripped_then_equal() -> None:
    rs = SEED_SET.replace(job_name="j,{}:\n" * 200_000, cwd="/d\x00é" * 300_000)
    text = serialize(rs)
    assert len(text) > 2_000_000
    assert parse(text) == rs


# --- malformed input ------------------------------------------------------------------------

MALFORMED = [
    pytest.param(b"", 0, "expected 'GECOResourceSet_v1' at byte 0, got end of input",
                 id="empty"),
    pytest.param(SEED.replace(b"_v1", b"_v2", 1), 0,
                 "expected 'GECOResourceSet_v1' at byte 0, got 'GECOResourceSet_v2'",
                 id="wrong-magic"),
    pytest.param(b"GECOResourceSet_v1li3324", 18,
                 "expected '{' after 'GECOResourceSet_v1' at byte 18, got 'li3324'",
                 id="no-brace"),
    pytest.param(SEED.replace(b"li3324,", b"li3324x,", 1), 25,
                 "expected ',' after the job id at byte 25, got 'x'", id="junk-after-number"),
    pytest.param(SEED.replace(b"li3324", b"q3324", 1), 19,
                 "expected the job id as 'li<integer>' at byte 19, got 'q3324'",
                 id="unknown-type-tag"),
    pytest.param(SEED.replace(b"li3324", b"i3324", 1), 19,
                 "expected the job id as 'li<integer>' at byte 19, got 'i3324'",
                 id="wrong-type-tag"),
    pytest.param(SEED.replace(b"li3324", b"li", 1), 19,
                 "expected the job id as 'li<integer>' at byte 19, got 'li'", id="no-digits"),
    pytest.param(SEED[:68], 63, "the job name at byte 63 declares 7 bytes, but only 3 follow",
                 id="truncated-in-string"),
    pytest.param(SEED[:-1], 215, "expected '}' after node 2 of 2 at byte 215, got end of input",
                 id="truncated-final-brace"),
    pytest.param(SEED + b"\n", 216,
                 "expected end of input after the final '}' at byte 216, got '\\n'",
                 id="trailing-newline"),
    pytest.param(SEED + b"GECOResourceSet_v1{", 216,
                 "expected end of input after the final '}' at byte 216, "
                 "got 'GECOResourceSet_v1'", id="trailing-bytes"),
    pytest.param(SEED.replace(b"s7:", b"s6:", 1), 71,
                 "expected ',' after the job name at byte 71, got 't'", id="length-too-short"),
    pytest.param(SEED.replace(b"s10:", b"s999:", 1), 92,
                 "the working directory at byte 92 declares 999 bytes, but only 121 follow",
                 id="length-past-end"),
    pytest.param(SEED.replace(b"s10:", b"s" + b"9" * 50 + b":", 1), 92,
                 "the working directory at byte 92 declares "
                 "9999999999999999999999999999999999999999... bytes, but only 121 follow",
                 id="length-huge"),
    pytest.param(SEED.replace(b"s7:", b"sX:", 1), 62,
                 "expected the job name as 's<length>:<bytes>' at byte 62, got 'sX:My test'",
                 id="non-numeric-length"),
    pytest.param(SEED.replace(b"s7:", b"s7", 1), 62,
                 "expected the job name as 's<length>:<bytes>' at byte 62, got 's7My test'",
                 id="no-colon"),
    pytest.param(SEED.replace(b"lf0,b0,", b"lf0,", 1), 34,
                 "expected the standby flag as 'b0' or 'b1' at byte 34, got 'lf1000000000'",
                 id="missing-global-field"),
    pytest.param(SEED.replace(b"i20,", b"i20,i5,", 1), 121,
                 "expected the memory limit of node 'n000' as 'lf<number>' at byte 121, got 'i5'",
                 id="extra-node-field"),
    pytest.param(SEED.replace(b"s4:mic0}", b"s4:mic0,s0:}", 1), 159,
                 "expected '}' after the Phi list of node 'n000' at byte 159, got ','",
                 id="extra-last-node-field"),
    pytest.param(SEED.replace(b"n000{", b"n000(", 1), 113,
                 "expected '{' after the name of node 'n000' at byte 113, got '(b0'",
                 id="node-without-brace"),
    pytest.param(SEED.replace(b"i2,", b"i3,", 1), 215,
                 "expected ',' before node 3 of 3 at byte 215, got '}'", id="too-few-nodes"),
    pytest.param(SEED.replace(b"i2,", b"i1,", 1), 160,
                 "expected '}' after node 1 of 1 at byte 160, got ','", id="too-many-nodes"),
    pytest.param(SEED.replace(b"i2,", b"i0,", 1), 105,
                 "expected '}' after the working directory (node count 0) at byte 105, got ','",
                 id="node-count-zero"),
    pytest.param(SEED.replace(b"i2,", b"i-1,", 1), 54,
                 "the node count at byte 54 must be an integer from 0 to 2147483647, got -1",
                 id="negative-node-count"),
    pytest.param(SEED.replace(b"i0,i2", b"i2147483648,i2", 1), 51,
                 "the trace level at byte 51 must be an integer from -2147483648 to "
                 "2147483647, got 2147483648", id="i-out-of-range"),
    pytest.param(SEED.replace(b"li3324", b"li9223372036854775808", 1), 21,
                 "the job id at byte 21 must be an integer from -9223372036854775808 to "
                 "9223372036854775807, got 9223372036854775808", id="li-out-of-range"),
    pytest.param(SEED.replace(b"li3324", b"li" + b"7" * 5000, 1), 21,
                 "the job id at byte 21 must be an integer from -9223372036854775808 to "
                 "9223372036854775807, got 7777777777777777777777777777777777777777...",
                 id="li-thousands-of-digits"),
    pytest.param(SEED.replace(b"i20", b"i-20", 1), 118,
                 "the slot count of node 'n000' at byte 118 must be an integer from 0 to "
                 "2147483647, got -20", id="negative-slots"),
    pytest.param(SEED.replace(b"b0,b1,", b"b0,b2,", 1), 60,
                 "the phi-for-user flag at byte 60 must be 0 or 1, got 2", id="b-not-0-or-1"),
    pytest.param(SEED.replace(b"b0,lf1", b"bx,lf1", 1), 34,
                 "expected the standby flag as 'b0' or 'b1' at byte 34, got 'bx'",
                 id="b-not-a-digit"),
    pytest.param(SEED.replace(b"lf2000000000", b"lf-1", 1), 123,
                 f"the memory limit of node 'n000' at byte 123 must be {MEM_RULE}, got -1",
                 id="negative-memory"),
    pytest.param(SEED.replace(b"lf2000000000", b"lf1.5", 1), 123,
                 f"the memory limit of node 'n000' at byte 123 must be {MEM_RULE}, got 1.5",
                 id="fractional-memory"),
    pytest.param(SEED.replace(b"lf1000000000", b"lfinf", 1), 39,
                 f"the per-slot vmem limit at byte 39 must be {MEM_RULE}, got inf",
                 id="infinite-memory"),
    pytest.param(SEED.replace(b"lf1000000000", b"lf1e999", 1), 39,
                 f"the per-slot vmem limit at byte 39 must be {MEM_RULE}, got 1e999",
                 id="overflowing-memory"),
    pytest.param(SEED.replace(b"lf1000000000", b"lf9223372036854775808", 1), 39,
                 f"the per-slot vmem limit at byte 39 must be {MEM_RULE}, "
                 "got 9223372036854775808", id="memory-above-2**63"),
    pytest.param(SEED.replace(b"lf0,", b"lf-nan,", 1), 32,
                 "the walltime limit at byte 32 must be a finite number of seconds >= 0, "
                 "got -nan", id="nan-walltime"),
    pytest.param(SEED.replace(b"lf0,", b"lf-60,", 1), 32,
                 "the walltime limit at byte 32 must be a finite number of seconds >= 0, "
                 "got -60", id="negative-walltime"),
]


@pytest.mark.parametrize(("data", "offset", "message"), MALFORMED)
def test_given_malformed_text_when_parsed_then_error_names_expectation_and_offset(
    data: bytes, offset: int, message: str
) -> None:
    err = _error(data)
    assert (err.msg, err.offset) == (message, offset)
    assert err.source == data


def test_given_syntax_error_when_printed_then_fields_follow_the_message() -> None:
    err = _error(SEED.replace(b"li3324,", b"li3324x,", 1))
    assert str(err) == "expected ',' after the job id at byte 25, got 'x' (offset=25 expected=',')"
    assert err.expected == "','"
    assert isinstance(err, ValueError)


def test_given_error_in_long_input_when_caret_shown_then_marker_is_under_the_bad_byte() -> None:
    err = _error(SEED.replace(b"b0,b1,", b"b0,b2,", 1))
    assert err.caret() == (
        "lf0,b0,lf1000000000,i0,i2,b0,b2,s7:My test,s4:frey,s6:it_nss\n"
        "~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~^"
    )


def test_given_input_over_the_size_cap_when_parsed_then_refused_before_reading() -> None:
    err = _error(SEED + b" " * (MAX_SIZE - len(SEED) + 1))
    assert err.msg == "a resource text must be at most 67108864 bytes, got 67108865"
    assert (err.offset, err.expected) == (MAX_SIZE, "at most 67108864 bytes")


# --- values serialize refuses -----------------------------------------------------------------

HEAD = b"GECOResourceSet_v1{li1,li1,lf0,b0,lf0,i0,i1,b0,b0,s0:,s0:,s0:,s0:,s4:n000{b0"
REFUSED = [
    pytest.param(ResourceSet(1, nodes=(NodeResources("n000", slots=-1),)), HEAD,
                 "cannot serialize job 1.1: the slot count of node 'n000' must be an integer "
                 "from 0 to 2147483647, got -1", id="negative-slots"),
    pytest.param(ResourceSet(1, nodes=(NodeResources("n000", slots=2**31),)), HEAD,
                 "cannot serialize job 1.1: the slot count of node 'n000' must be an integer "
                 "from 0 to 2147483647, got 2147483648", id="slots-over-32-bit"),
    pytest.param(ResourceSet(1, trace_level=-(2**31) - 1),
                 b"GECOResourceSet_v1{li1,li1,lf0,b0,lf0",
                 "cannot serialize job 1.1: the trace level must be an integer from "
                 "-2147483648 to 2147483647, got -2147483649", id="i-out-of-range"),
    pytest.param(ResourceSet(2**63), b"GECOResourceSet_v1",
                 "cannot serialize job 9223372036854775808.1: the job id must be an integer "
                 "from -9223372036854775808 to 9223372036854775807, got 9223372036854775808",
                 id="li-out-of-range"),
    pytest.param(ResourceSet(1, per_slot_vmem=-1), b"GECOResourceSet_v1{li1,li1,lf0,b0",
                 f"cannot serialize job 1.1: the per-slot vmem limit must be {MEM_RULE}, got -1",
                 id="negative-memory"),
    pytest.param(ResourceSet(1, nodes=(NodeResources("n000", vmem_limit=2**63),)),
                 HEAD + b",i1,lf0",
                 "cannot serialize job 1.1: the vmem limit of node 'n000' must be "
                 f"{MEM_RULE}, got 9223372036854775808", id="memory-over-63-bit"),
    pytest.param(ResourceSet(1, runtime_limit=math.nan), b"GECOResourceSet_v1{li1,li1",
                 "cannot serialize job 1.1: the walltime limit must be a finite number of "
                 "seconds >= 0, got nan", id="nan-walltime"),
    pytest.param(ResourceSet(1, runtime_limit=-0.5), b"GECOResourceSet_v1{li1,li1",
                 "cannot serialize job 1.1: the walltime limit must be a finite number of "
                 "seconds >= 0, got -0.5", id="negative-walltime"),
    pytest.param(ResourceSet(1, owner="a\ud800"),
                 b"GECOResourceSet_v1{li1,li1,lf0,b0,lf0,i0,i0,b0,b0,s0:",
                 "cannot serialize job 1.1: the owner must be text whose only surrogates are "
                 "escaped undecodable bytes, got 'a\\ud800'", id="lone-surrogate"),
    pytest.param(ResourceSet(1, job_name="\udcc3\udca9"),
                 b"GECOResourceSet_v1{li1,li1,lf0,b0,lf0,i0,i0,b0,b0",
                 "cannot serialize job 1.1: the job name must be text whose only surrogates "
                 "are escaped undecodable bytes, got '\\udcc3\\udca9'",
                 id="escapes-spelling-utf8"),
]


@pytest.mark.parametrize(("rs", "written", "message"), REFUSED)
def test_given_unrepresentable_value_when_serialized_then_refused_where_it_would_go(
    rs: ResourceSet, written: bytes, message: str
) -> None:
    with pytest.raises(ResourceFormatError) as info:
        serialize(rs)
    assert info.value.msg == message
    assert (info.value.offset, info.value.source) == (len(written), written)


def test_given_text_over_the_size_cap_when_serialized_then_refused() -> None:
    rs = ResourceSet(1, job_name="x" * MAX_SIZE)
    size = len(f"GECOResourceSet_v1{{li1,li1,lf0,b0,lf0,i0,i0,b0,b0,s{MAX_SIZE}:"
               ",s0:,s0:,s0:}") + MAX_SIZE
    with pytest.raises(ValueError, match=r"^cannot serialize job 1\.1: the resource text must "
                       rf"be at most 67108864 bytes, got {size} \(") as info:
        serialize(rs)
    assert isinstance(info.value, ResourceFormatError)


# --- properties ---------------------------------------------------------------------------------

_SPECIAL = st.sampled_from([",", "{", "}", ":", "\n", "\x00", "s3:", "}}", "é", "\udcff", "日本"])
_TEXT = st.one_of(
    st.text(max_size=30),
    # any bytes at all, as the parser would hand them back
    st.binary(max_size=40).map(lambda raw: raw.decode("utf-8", "surrogateescape")),
    st.lists(_SPECIAL | st.text(max_size=3), max_size=8).map("".join),
)
_GPUS = st.lists(st.integers(0, 15), max_size=16).map(lambda ids: ",".join(map(str, ids)))
_MEM = st.integers(0, 2**63 - 1)
_NODE = st.builds(NodeResources, name=_TEXT | st.text(min_size=17, max_size=64),
                  is_slave=st.booleans(), slots=st.integers(0, 2**31 - 1), memory_limit=_MEM,
                  vmem_limit=_MEM, gpus=_GPUS | _TEXT, phis=_GPUS | _TEXT)
_SECONDS = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
RESOURCE_SETS = st.builds(
    ResourceSet, job_id=st.integers(-(2**63), 2**63 - 1), task_id=st.integers(-(2**63), 2**63 - 1),
    runtime_limit=_SECONDS | st.integers(0, 10**7).map(float), is_standby=st.booleans(),
    per_slot_vmem=_MEM, trace_level=st.integers(-(2**31), 2**31 - 1), is_array=st.booleans(),
    phi_for_user=st.booleans(), job_name=_TEXT, owner=_TEXT, group=_TEXT, cwd=_TEXT,
    nodes=st.lists(_NODE, max_size=5).map(tuple), cluster=_TEXT, submitted=_SECONDS,
)


@given(RESOURCE_SETS)
@example(SEED_SET)
def test_given_any_resource_set_when_serialized_and_parsed_then_equal(rs: ResourceSet) -> None:
    assert parse(serialize(rs)) == rs


def _lf(value: float) -> bytes:
    """The canonical number as the module docstring states it, written independently."""
    return b"lf%d" % value if value == int(value) else b"lf" + repr(value).encode()


def _s(raw: bytes) -> bytes:
    return b"s%d:" % len(raw) + raw


@st.composite
def canonical_texts(draw: st.DrawFn) -> bytes:
    """Canonical v1 text assembled field by field from the format's rules."""
    nodes = [
        _s(draw(st.binary(max_size=20))) + b"{b%d,i%d,lf%d,lf%d,%s,%s}" % (
            draw(st.integers(0, 1)), draw(st.integers(0, 2**31 - 1)), draw(_MEM), draw(_MEM),
            _s(draw(st.binary(max_size=30))), _s(draw(st.binary(max_size=30))))
        for _ in range(draw(st.integers(0, 4)))
    ]
    fields = [
        b"li%d" % draw(st.integers(-(2**63), 2**63 - 1)),
        b"li%d" % draw(st.integers(-(2**63), 2**63 - 1)),
        _lf(draw(_SECONDS)), b"b%d" % draw(st.integers(0, 1)), b"lf%d" % draw(_MEM),
        b"i%d" % draw(st.integers(-(2**31), 2**31 - 1)), b"i%d" % len(nodes),
        b"b%d" % draw(st.integers(0, 1)), b"b%d" % draw(st.integers(0, 1)),
        *(_s(draw(st.binary(max_size=40))) for _ in range(4)), *nodes,
    ]
    return b"GECOResourceSet_v1{" + b",".join(fields) + b"}"


@given(canonical_texts())
@example(SEED)
def test_given_canonical_text_when_parsed_and_serialized_then_bytes_identical(
    text: bytes,
) -> None:
    assert serialize(parse(text)) == text


@settings(max_examples=50, deadline=None)  # parses every prefix: slow on a loaded node
@given(RESOURCE_SETS)
@example(SEED_SET)
def test_given_valid_text_when_truncated_anywhere_then_format_error_inside_the_prefix(
    rs: ResourceSet,
) -> None:
    text = serialize(rs)
    for end in range(len(text)):
        err = _error(text[:end])
        assert 0 <= err.offset <= end


@given(RESOURCE_SETS | st.just(SEED_SET), st.data())
def test_given_randomly_mutated_text_when_parsed_then_format_error_or_stable_result(
    rs: ResourceSet, data: st.DataObject
) -> None:
    text = bytearray(serialize(rs))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        byte = data.draw(st.binary(min_size=1, max_size=1))
        op = data.draw(st.sampled_from(["replace", "insert", "delete"]))
        if op == "insert" or at == len(text):
            text[at:at] = byte
        elif op == "replace":
            text[at:at + 1] = byte
        else:
            del text[at]
    try:
        result = parse(bytes(text))
    except ResourceFormatError as err:
        assert 0 <= err.offset <= len(text)
    else:
        # whatever the parser accepts, the serializer can write and read back unchanged
        assert parse(serialize(result)) == result
