"""The wire format (geco/wire/): vectors, check order, replay, transport.

The vectors in tests/vectors/wire.json are checked three ways: against
frames rebuilt here with ``struct`` and ``hashlib.blake2b`` (independent of
geco and of libsodium), against geco's encoder/decoder, and against the hex in
docs/wire-format.md, so the JSON, the code and the document cannot drift apart;
and both files are what tests/vectors/make_vectors.py writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geco.errors import ProtocolError
from geco.wire.frame import (
    HEADER_BYTES,
    MAX_FRAME,
    PEERCRED,
    PEERCRED_TYPES,
    PUBLIC_KEY,
    Header,
    ack_for_error,
    claimed,
    claims_peercred,
    decode,
    decode_ack,
    encode,
    expected_length,
)
from geco.wire.messages import (
    MAX_PAYLOAD,
    Ack,
    AckStatus,
    Adopt,
    AdoptReply,
    AdoptStage,
    Hook,
    HookName,
    JobStarted,
    Message,
    MsgType,
    NodeRequest,
    Starter,
    StarterReply,
    StatusReply,
)
from geco.wire.reader import read_frame
from geco.wire.replay import ReplayCache

REPO = Path(__file__).resolve().parents[2]
VECTORS = json.loads((REPO / "tests" / "vectors" / "wire.json").read_text())
DOC = (REPO / "docs" / "wire-format.md").read_text()
KEY = bytes.fromhex(VECTORS["key"])
BY_NAME = {v["name"]: v for v in VECTORS["vectors"]}
NEGATIVE = VECTORS["negative"]
TS = BY_NAME["job_started"]["timestamp_ns"]
SKEW_NS = 30 * 10**9
ZERO_KEY = bytes(32)  # the public key of PEERCRED frames, spelled out independently of geco

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
nonces = st.binary(min_size=16, max_size=16)
int64 = st.integers(-(2**63), 2**63 - 1)


def reference_frame(type_: int, payload: bytes, nonce: bytes, ts: int, *, key: bytes = KEY,
                    version: int = 1, flags: int = 0, length: int | None = None,
                    magic: bytes = b"GECQ") -> bytes:
    """The frame as docs/wire-format.md §2 defines it, built without geco."""
    n = len(payload) if length is None else length
    body = struct.pack("<4sBBHI16sq", magic, version, type_, flags, n, nonce, ts) + payload
    return body + hashlib.blake2b(body, key=key, digest_size=32).digest()


def message_of(vector: dict[str, Any]) -> Message | None:
    """The geco message object a vector's fields describe."""
    f = vector["fields"]
    match MsgType(vector["type"]):
        case MsgType.JOB_STARTED | MsgType.QUARANTINE_SELF:
            return JobStarted(f["job_id"], f["task_id"], f["pid"])
        case MsgType.ACK:
            return Ack(f["job_id"], f["task_id"], AckStatus(f["status"]),
                       bytes.fromhex(f["request_nonce"]))
        case MsgType.ADOPT:
            return Adopt(f["job_id"], f["task_id"], f["pid"], f["uid"],
                         AdoptStage(f["stage"]), f["connection"])
        case MsgType.ADOPT_REPLY:
            return AdoptReply(f["job_id"], f["task_id"], AckStatus(f["status"]),
                              bytes.fromhex(f["request_nonce"]), f["text"])
        case MsgType.STATUS_REPLY | MsgType.NODE_REPLY:
            return StatusReply(f["document"])
        case MsgType.PREPARE | MsgType.ABORT | MsgType.RELEASE | \
                MsgType.NODE_STATUS | MsgType.OOM_REPORT | MsgType.CALLERID:
            return NodeRequest(f["job_id"], f["task_id"], f["host"], bytes.fromhex(f["body"]))
        case MsgType.HOOK:
            return Hook(f["job_id"], f["task_id"], f["pid"], HookName(f["hook"]))
        case MsgType.STARTER:
            return Starter(f["job_id"], f["task_id"], f["pid"], tuple(f["environ"]),
                           tuple(f["argv"]))
        case MsgType.STARTER_REPLY:
            return StarterReply(f["job_id"], f["task_id"], AckStatus(f["status"]),
                                bytes.fromhex(f["request_nonce"]), f["program"],
                                tuple(f["argv"]), tuple(f["environ"]))
        case _:
            return None


def refused(frame: bytes, **kw: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frame, KEY, **kw)
    return info.value


# ---------------------------------------------------------------------------
# vectors
# ---------------------------------------------------------------------------

def test_the_vectors_cover_every_message_type_and_every_refusal_reason() -> None:
    """Given the JSON vectors, then each message type has a positive vector and each decoder
    reason of the C enum a negative one: nothing in the format goes untested."""
    assert {v["type"] for v in VECTORS["vectors"]} == {t.value for t in MsgType}
    reasons = {n["reason"] for n in NEGATIVE}
    assert reasons == {"short", "magic", "version", "flags", "length", "mac", "type", "payload",
                       "stale", "nonce"}


def test_the_vectors_cover_peer_credentialed_frames_and_their_refusals() -> None:
    """Given the JSON vectors, then PEERCRED frames of the requests and of their replies are
    there, and refusals for a PEERCRED JOB_STARTED and for an unknown flag bit."""
    assert {(v["type_name"], v["flags"]) for v in VECTORS["vectors"] if v["flags"]} == {
        ("QUARANTINE_SELF", 1), ("STATUS", 1), ("ACK", 1), ("STARTER", 1),
        ("STARTER_REPLY", 1)}
    flagged = {n["name"]: int.from_bytes(bytes.fromhex(n["frame"])[6:8], "little")
               for n in NEGATIVE if n["reason"] == "flags"}
    assert flagged["peercred_job_started"] == PEERCRED
    assert flagged["unknown_flag"] & ~PEERCRED


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_a_vector_frame_is_the_independently_built_frame(vector: dict[str, Any]) -> None:
    """Given a vector's inputs, when its frame is rebuilt with struct + hashlib.blake2b,
    then it equals the recorded frame: the vectors follow the documented layout (a PEERCRED
    frame's MAC keyed with 32 zero bytes)."""
    payload = bytes.fromhex(vector["payload"])
    frame = reference_frame(vector["type"], payload, bytes.fromhex(vector["nonce"]),
                            vector["timestamp_ns"], flags=vector["flags"],
                            key=ZERO_KEY if vector["flags"] else KEY)
    assert frame.hex() == vector["frame"]


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_python_encodes_a_vector_byte_for_byte(vector: dict[str, Any]) -> None:
    """Given a vector's fields, key, flags, nonce and timestamp, when geco encodes them,
    then the frame equals the vector's hex (the flag, not the key passed, picks the MAC
    key)."""
    msg = message_of(vector)
    frame = encode(vector["type"], b"" if msg is None else msg, KEY,
                   nonce=bytes.fromhex(vector["nonce"]), ts_ns=vector["timestamp_ns"],
                   flags=vector["flags"])
    assert frame.hex() == vector["frame"]


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_python_decodes_a_vector_back_to_its_fields(vector: dict[str, Any]) -> None:
    """Given a vector's frame received at its own timestamp, when decoded,
    then type, flags, nonce, timestamp and message are the vector's inputs."""
    got = decode(bytes.fromhex(vector["frame"]), KEY, now_ns=vector["timestamp_ns"])
    assert got.type == vector["type"]
    assert (got.flags, got.peercred) == (vector["flags"], bool(vector["flags"]))
    assert got.nonce.hex() == vector["nonce"]
    assert got.timestamp_ns == vector["timestamp_ns"]
    assert got.payload.hex() == vector["payload"]
    assert got.message == message_of(vector)


@pytest.mark.parametrize("neg", NEGATIVE, ids=lambda n: n["name"])
def test_a_negative_vector_is_refused_with_its_reason_and_message(neg: dict[str, Any]) -> None:
    """Given a negative vector, when decoded as the awaited ack (decode_ack, like the C),
    then ProtocolError names the vector's reason with the recorded full text; the generic
    decode() gives the recorded decode_reason (None: accepted)."""
    frame = bytes.fromhex(neg["frame"])
    with pytest.raises(ProtocolError) as info:
        decode_ack(frame, KEY, bytes.fromhex(neg["request_nonce"]), now_ns=neg["now_ns"],
                   max_skew=neg["max_skew_ns"] / 1e9)
    assert info.value.reason == neg["reason"]
    assert str(info.value) == f"{neg['message']} (reason={neg['reason']})"
    try:
        decode(frame, KEY, now_ns=neg["now_ns"], max_skew=neg["max_skew_ns"] / 1e9)
    except ProtocolError as exc:
        assert exc.reason == neg["decode_reason"]
    else:
        assert neg["decode_reason"] is None


def test_the_ack_vector_decodes_as_the_answer_to_the_job_started_vector() -> None:
    """Given the ACK vector and the JOB_STARTED vector's nonce, then decode_ack returns OK for
    that job task."""
    ack = decode_ack(bytes.fromhex(BY_NAME["ack"]["frame"]), KEY,
                     bytes.fromhex(BY_NAME["job_started"]["nonce"]),
                     now_ns=BY_NAME["ack"]["timestamp_ns"])
    assert ack == Ack(366474, 27, AckStatus.OK, bytes.fromhex(BY_NAME["job_started"]["nonce"]))


# ---------------------------------------------------------------------------
# the document cannot drift from the JSON
# ---------------------------------------------------------------------------

def doc_hex_blocks() -> dict[str, str]:
    blocks: dict[str, str] = {}
    for name, body in re.findall(r"^```hex (\S+)\n(.*?)^```$", DOC, re.MULTILINE | re.DOTALL):
        assert name not in blocks, f"hex block {name} appears twice in the document"
        blocks[name] = "".join(body.split())
    return blocks


def test_every_hex_block_of_the_document_is_the_json_vector() -> None:
    """Given docs/wire-format.md, when its ```hex NAME blocks are read, then they are exactly
    the key, every vector's frame and every negative frame of the JSON: no more, no fewer,
    byte for byte."""
    expected = {"key": VECTORS["key"]}
    expected |= {v["name"]: v["frame"] for v in VECTORS["vectors"]}
    expected |= {f"negative:{n['name']}": n["frame"] for n in NEGATIVE}
    assert doc_hex_blocks() == expected


def _generator() -> Any:
    path = REPO / "tests" / "vectors" / "make_vectors.py"
    spec = importlib.util.spec_from_file_location("make_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_json_and_the_documents_section_9_are_what_the_generator_writes() -> None:
    """Given tests/vectors/make_vectors.py, when it renders the vectors and section 9,
    then they are the committed files byte for byte: nobody edited them by hand, and the
    next change runs the generator instead of a scratch script."""
    json_text, doc_text = _generator().render()
    assert json_text == (REPO / "tests" / "vectors" / "wire.json").read_text()
    assert doc_text == DOC


def test_the_documents_byte_table_adds_up_to_the_job_started_frame() -> None:
    """Given the byte-by-byte table of the document, then its hex column, in order, is the
    JOB_STARTED vector and its offsets and sizes are consistent."""
    section = DOC.split("### 9.1 JOB_STARTED, byte by byte")[1].split("###")[0]
    rows = re.findall(r"^\| (\d+) \| (\d+) \| [^|]+ \| [^|]+ \| `([0-9a-f]+)` \|$", section,
                      re.MULTILINE)
    assert "".join(h for _, _, h in rows) == BY_NAME["job_started"]["frame"]
    offset = 0
    for off, size, h in rows:
        assert (int(off), int(size)) == (offset, len(h) // 2)
        offset += int(size)


def test_the_document_quotes_every_negative_message_and_input() -> None:
    """Given the negative vectors, then the document shows each one's full error text, and
    each positive vector's nonce and timestamp."""
    for neg in NEGATIVE:
        assert f"**{neg['name']}**: {neg['message']}\n" in DOC
    for v in VECTORS["vectors"]:
        assert f"| nonce | `{v['nonce']}` |" in DOC
        assert f"| timestamp_ns | {v['timestamp_ns']} |" in DOC


# ---------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------

@given(u64, u64, u32, nonces, int64, st.sampled_from([1, 6]))
def test_job_started_round_trips(job: int, task: int, pid: int, nonce: bytes, ts: int,
                                 type_: int) -> None:
    """Given any JOB_STARTED/QUARANTINE_SELF fields, when encoded and decoded at the same
    time, then the same fields come back, and the frame is the reference frame."""
    frame = encode(type_, JobStarted(job, task, pid), KEY, nonce=nonce, ts_ns=ts)
    assert frame == reference_frame(type_, struct.pack("<QQII", job, task, pid, 0), nonce, ts)
    got = decode(frame, KEY, now_ns=ts)
    assert (got.type, got.nonce, got.timestamp_ns) == (type_, nonce, ts)
    assert got.message == JobStarted(job, task, pid)


@given(u64, u64, st.sampled_from(list(AckStatus)), nonces, nonces, int64)
def test_ack_round_trips(job: int, task: int, status: AckStatus, request: bytes,
                         nonce: bytes, ts: int) -> None:
    frame = encode(MsgType.ACK, Ack(job, task, status, request), KEY, nonce=nonce,
                   ts_ns=ts)
    assert decode_ack(frame, KEY, request, now_ns=ts) == Ack(job, task, status, request)


@given(u64, u64, u32, u32, st.sampled_from(list(AdoptStage)),
       st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=255), int64)
def test_adopt_round_trips(job: int, task: int, pid: int, uid: int, stage: AdoptStage,
                           connection: str, ts: int) -> None:
    adopt = Adopt(job, task, pid, uid, stage, connection)
    frame = encode(MsgType.ADOPT, adopt, KEY, ts_ns=ts)
    assert decode(frame, KEY, now_ns=ts).message == adopt


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_status_reply_round_trips(doc: dict[str, Any]) -> None:
    """Given any JSON object (any Unicode), then STATUS_REPLY carries it unchanged."""
    reply = StatusReply(doc)
    if len(reply.pack()) > MAX_PAYLOAD:
        return
    frame = encode(MsgType.STATUS_REPLY, reply, KEY)
    assert decode(frame, KEY).message == reply


def test_a_fresh_frame_gets_a_random_nonce_and_the_current_time() -> None:
    """Given no nonce and no timestamp, then encode draws 16 random bytes and reads the
    clock: two frames differ, and both pass decode with the default clock and skew."""
    before = time.time_ns()
    a = encode(MsgType.STATUS, b"", KEY)
    b = encode(MsgType.STATUS, b"", KEY)
    after = time.time_ns()
    fa, fb = decode(a, KEY), decode(b, KEY)
    assert fa.nonce != fb.nonce
    assert before <= fa.timestamp_ns <= fb.timestamp_ns <= after
    assert fa.message is None


# ---------------------------------------------------------------------------
# refusals: order, boundaries, every reason's full text
# ---------------------------------------------------------------------------

JS = BY_NAME["job_started"]
JS_PAYLOAD = bytes.fromhex(JS["payload"])
JS_NONCE = bytes.fromhex(JS["nonce"])


@pytest.mark.parametrize(("faults", "reason"), [
    ({"magic": b"XECQ", "version": 9, "flags": 1, "key": bytes(32)}, "magic"),
    ({"version": 9, "flags": 1, "length": 5000, "key": bytes(32)}, "version"),
    ({"flags": 1, "length": 5000, "key": bytes(32)}, "flags"),
    ({"length": 5000, "key": bytes(32)}, "length"),
    ({"key": bytes(32), "type_": 99}, "mac"),
    ({"type_": 99, "ts": TS - 10**12}, "type"),
])
def test_the_first_failed_check_in_the_documented_order_names_the_refusal(
        faults: dict[str, Any], reason: str) -> None:
    """Given a frame with several faults, then the refusal is the one the documented check
    order reaches first (shape before MAC, MAC before content)."""
    type_ = faults.pop("type_", 1)
    ts = faults.pop("ts", TS)
    frame = reference_frame(type_, JS_PAYLOAD, JS_NONCE, ts, **faults)
    assert refused(frame, now_ns=TS).reason == reason


def test_payload_content_is_checked_before_the_clock() -> None:
    """Given a JOB_STARTED with a nonzero reserved field and an old timestamp, then it is
    refused for the payload: the clock check comes after."""
    frame = reference_frame(1, struct.pack("<QQII", 1, 1, 1, 5), JS_NONCE, TS - 10**12)
    err = refused(frame, now_ns=TS)
    assert str(err) == "the reserved field of the JOB_STARTED payload must be 0, got 5 " \
                       "(reason=payload)"


@pytest.mark.parametrize(("type_", "payload", "text"), [
    (1, bytes(23), "the JOB_STARTED payload must be 24 bytes, got 23"),
    (6, bytes(25), "the QUARANTINE_SELF payload must be 24 bytes, got 25"),
    (3, b"x", "the STATUS payload must be 0 bytes, got 1"),
    (5, struct.pack("<QQIIII", 1, 1, 2, 3, 2, 4), "the reserved field of the ADOPT payload "
                                                 "must be 0, got 4"),
    (5, struct.pack("<QQIIII", 1, 1, 2, 3, 4, 0), "an ADOPT stage must be 1, 2 or 3, got 4"),
    (5, struct.pack("<QQIIII", 1, 1, 2, 3, 1, 0) + b"a\nb", "an ADOPT connection must be "
                                                            "printable ASCII"),
    (5, bytes(31), "the ADOPT payload must be 32 to 287 bytes, got 31"),
    (7, bytes(40) + b"\xff", "an ADOPT_REPLY text must be UTF-8"),
    (7, bytes(40) + b"a\0", "an ADOPT_REPLY text must not hold a NUL"),
    (4, b"[1, 2]", "a STATUS_REPLY must be a JSON object, got list"),
    (4, b"\xff{}", "a STATUS_REPLY must be UTF-8 JSON: 'utf-8' codec can't decode byte 0xff "
                   "in position 0: invalid start byte"),
    (4, b"{", "a STATUS_REPLY must be UTF-8 JSON: Expecting property name enclosed in double "
              "quotes: line 1 column 2 (char 1)"),
])
def test_a_payload_wrong_for_its_type_is_refused_with_the_full_text(
        type_: int, payload: bytes, text: str) -> None:
    err = refused(reference_frame(type_, payload, JS_NONCE, TS), now_ns=TS)
    assert str(err) == f"{text} (reason=payload)"


@pytest.mark.parametrize(("offset_ns", "accepted"), [
    (0, True), (SKEW_NS, True), (-SKEW_NS, True), (SKEW_NS + 1, False), (-SKEW_NS - 1, False),
])
def test_the_timestamp_window_is_plus_minus_max_skew_inclusive(offset_ns: int,
                                                               accepted: bool) -> None:
    """Given a frame stamped at TS, when received at TS + offset with the default skew
    (30 s), then exactly the offsets within ±30 s are accepted."""
    frame = bytes.fromhex(JS["frame"])
    if accepted:
        assert decode(frame, KEY, now_ns=TS + offset_ns).timestamp_ns == TS
    else:
        err = refused(frame, now_ns=TS + offset_ns)
        side = "behind" if offset_ns > 0 else "ahead of"
        assert str(err) == (f"timestamp must be within ±30 s of this host's clock, got "
                            f"30.000000001 s {side} it (a replayed frame, or clocks out of "
                            f"step: check NTP) (reason=stale)")


def test_max_skew_is_the_receivers_setting() -> None:
    frame = bytes.fromhex(JS["frame"])
    err = refused(frame, now_ns=TS + 2 * 10**9, max_skew=1.5)
    assert err.reason == "stale" and "within ±1.5 s" in str(err) and "got 2 s behind" in str(err)
    assert decode(frame, KEY, now_ns=TS + 2 * 10**9, max_skew=2.0).type == MsgType.JOB_STARTED


def test_extreme_timestamps_are_stale_not_an_overflow() -> None:
    """Given frames stamped at the ends of int64, then they are refused as stale."""
    for ts in (-(2**63), 2**63 - 1):
        frame = encode(1, JobStarted(1, 1, 1), KEY, ts_ns=ts)
        assert refused(frame).reason == "stale"


def test_every_prefix_of_a_frame_is_refused_as_short_or_length() -> None:
    """Given each truncation of a valid frame (and one with a byte appended), then decode
    refuses it: below 68 bytes as short, else as a length mismatch."""
    frame = bytes.fromhex(BY_NAME["status_reply"]["frame"])
    for cut in range(len(frame)):
        assert refused(frame[:cut], now_ns=TS).reason == ("short" if cut < 68 else "length")
    err = refused(frame + b"\0", now_ns=TS)
    assert str(err) == "a frame with a 23-byte payload must be 91 bytes, got 92 (reason=length)"


def test_a_maximal_payload_is_accepted_and_one_more_byte_refused() -> None:
    big = StatusReply({"x": "y" * (MAX_PAYLOAD - 8)})
    assert len(big.pack()) == MAX_PAYLOAD
    frame = encode(MsgType.STATUS_REPLY, big, KEY)
    assert len(frame) == MAX_FRAME
    assert decode(frame, KEY).message == big
    over = reference_frame(4, b"{" + b" " * 4095 + b"}", JS_NONCE, TS)
    assert str(refused(over, now_ns=TS)) == ("payload length must be at most 4096, got 4097 "
                                             "(reason=length)")


def test_another_key_is_refused_as_a_mac_mismatch() -> None:
    frame = encode(1, JobStarted(1, 1, 1), bytes(range(1, 33)))
    assert str(refused(frame)) == (
        "the MAC does not match: the frame is forged, corrupted or made with another key "
        "(gecod and the preload must read the same key file) (reason=mac)")


@settings(max_examples=300)
@given(st.data())
def test_any_single_byte_change_of_a_valid_frame_is_refused(data: st.DataObject) -> None:
    """Given a valid frame, when any one byte is changed to any other value, then it is
    refused (the MAC covers every byte, and the MAC itself is checked)."""
    vector = data.draw(st.sampled_from(VECTORS["vectors"]))
    frame = bytearray.fromhex(vector["frame"])
    i = data.draw(st.integers(0, len(frame) - 1))
    frame[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(ProtocolError):
        decode(bytes(frame), KEY, now_ns=vector["timestamp_ns"])


@settings(max_examples=500)
@given(st.binary(max_size=200) | st.binary(min_size=4100, max_size=4300))
def test_random_bytes_raise_nothing_but_protocol_error(raw: bytes) -> None:
    """Given arbitrary bytes, then decode, decode_ack and expected_length either accept or
    raise ProtocolError, never anything else."""
    for call in (lambda: decode(raw, KEY),
                 lambda: decode_ack(raw, KEY, bytes(16)),
                 lambda: expected_length(raw)):
        with contextlib.suppress(ProtocolError):
            call()


@settings(max_examples=300)
@given(st.binary(min_size=0, max_size=120))
def test_random_bytes_behind_a_valid_header_raise_only_protocol_error(tail: bytes) -> None:
    """Given a well-shaped header followed by arbitrary bytes, then only ProtocolError."""
    raw = b"GECQ\x01" + tail
    try:
        decode(raw, KEY)
    except ProtocolError as exc:
        assert exc.reason in {"short", "flags", "length", "mac"}


@pytest.mark.parametrize(("args", "text"), [
    ((1, JobStarted(1, 1, 1), bytes(31)), "the key must be 32 bytes, got 31"),
    ((1, JobStarted(1, 1, 1), KEY, {"nonce": bytes(15)}), "a nonce must be 16 bytes, got 15"),
    ((4, bytes(4097), KEY), "a payload must be at most 4096 bytes, got 4097"),
    ((2, JobStarted(1, 1, 1), KEY), "a JobStarted cannot be sent as type 2"),
    ((1, JobStarted(-1, 1, 1), KEY), "a field of the JobStarted does not fit its integer: "),
    ((1, JobStarted(1, 1, 1), KEY, {"ts_ns": 2**63}), "a header field does not fit"),
    ((2, Ack(1, 1, AckStatus.OK, bytes(8)), KEY), "request_nonce must be 16 bytes, got 8"),
])
def test_encode_refuses_what_it_cannot_send(args: tuple[Any, ...], text: str) -> None:
    """Given a bad key, nonce, payload size, type or field, then encode raises ValueError
    (a programming error, never a frame on the wire)."""
    kw = args[3] if len(args) > 3 else {}
    with pytest.raises(ValueError, match=re.escape(text)):
        encode(*args[:3], **kw)


# ---------------------------------------------------------------------------
# peer-credentialed frames (flag PEERCRED, MAC keyed with 32 zero bytes)
# ---------------------------------------------------------------------------

PQS = BY_NAME["peercred_quarantine_self"]
PACK = BY_NAME["peercred_ack"]
PEERCRED_REPLY = "the reply carries the PEERCRED flag (MAC'd with the public key), but it " \
                 "answers a request MAC'd with the secret key, so it must be MAC'd with " \
                 "that key too"
LACKS_PEERCRED = "the reply lacks the PEERCRED flag: it is MAC'd with gecod's secret key, " \
                 "which this client cannot check (a gecod older than this client refuses " \
                 "peer-credentialed requests: upgrade gecod)"


def test_the_public_key_is_32_zero_bytes_and_the_flag_is_bit_0() -> None:
    assert (PUBLIC_KEY, PEERCRED) == (ZERO_KEY, 0x0001)
    assert sorted(PEERCRED_TYPES) == [MsgType.ACK, MsgType.STATUS,
                                      MsgType.STATUS_REPLY, MsgType.ADOPT,
                                      MsgType.QUARANTINE_SELF, MsgType.ADOPT_REPLY,
                                      MsgType.STARTER, MsgType.STARTER_REPLY]


@given(st.sampled_from(sorted(PEERCRED_TYPES)), nonces, int64,
       st.binary(min_size=32, max_size=32), st.data())
def test_a_peercred_frame_round_trips_under_any_key_the_caller_holds(
        type_: MsgType, nonce: bytes, ts: int, key: bytes, data: st.DataObject) -> None:
    """Given any PEERCRED frame of a type that may carry the flag, encoded with whatever key
    the sender holds, then it is the reference frame MAC'd with 32 zero bytes, and any
    receiver decodes it with whatever key it holds: the flag, not the key, decides."""
    msg: Message | bytes
    match type_:
        case MsgType.QUARANTINE_SELF:
            msg = JobStarted(data.draw(u64), data.draw(u64), data.draw(u32))
        case MsgType.ACK:
            msg = Ack(data.draw(u64), data.draw(u64), data.draw(st.sampled_from(
                list(AckStatus))), data.draw(nonces))
        case MsgType.STATUS_REPLY:
            msg = StatusReply({"jobs": [], "n": data.draw(u32)})
        case MsgType.ADOPT:
            msg = Adopt(data.draw(u64), data.draw(u64), data.draw(u32), data.draw(u32),
                        AdoptStage.EXEC)
        case MsgType.ADOPT_REPLY:
            msg = AdoptReply(data.draw(u64), data.draw(u64), AckStatus.OK,
                             data.draw(nonces), "\nJOB_ID=1")
        case MsgType.STARTER:
            msg = Starter(data.draw(u64), data.draw(u64), data.draw(u32),
                          ("", "", "", "QRSH"),
                          # an argv word from the OS: no NUL, no lone surrogate (only
                          # surrogateescape's, which stand for undecodable bytes)
                          (data.draw(st.text(st.characters(blacklist_characters="\0",
                                                           blacklist_categories=("Cs",)),
                                             max_size=40)),))
        case MsgType.STARTER_REPLY:
            msg = StarterReply(data.draw(u64), data.draw(u64), AckStatus.OK,
                               data.draw(nonces), "/bin/sh", ("sh", "-c", "true"),
                               ("GECO_CPUS=0",))
        case _:
            msg = b""
    frame = encode(type_, msg, key, nonce=nonce, ts_ns=ts, flags=PEERCRED)
    payload = msg if isinstance(msg, bytes) else msg.pack()
    assert frame == reference_frame(type_, payload, nonce, ts, key=ZERO_KEY, flags=1)
    got = decode(frame, data.draw(st.binary(min_size=32, max_size=32)), now_ns=ts)
    assert (got.type, got.flags, got.peercred, got.nonce, got.payload) == (
        type_, PEERCRED, True, nonce, payload)
    assert decode(frame, PUBLIC_KEY, now_ns=ts, peercred=True).payload == payload


@pytest.mark.parametrize(("type_", "name"), [(1, "JOB_STARTED"), (8, "HOOK"), (11, "PREPARE"),
                                             (15, "NODE_STATUS"), (18, "type 18"),
                                             (255, "type 255")])
def test_the_peercred_flag_on_any_other_type_is_refused_as_flags_before_the_mac(
        type_: int, name: str) -> None:
    """Given a PEERCRED frame of a type other than STATUS, QUARANTINE_SELF, ADOPT, STARTER and
    their replies (even with a good public-key MAC), then decode and expected_length refuse it as
    ``flags``, saying the type needs the secret key: JOB_STARTED stays privileged."""
    frame = reference_frame(type_, JS_PAYLOAD, JS_NONCE, TS, key=ZERO_KEY, flags=1)
    text = (f"the PEERCRED flag is only allowed on STATUS, QUARANTINE_SELF, ADOPT and STARTER "
            f"requests and their replies, got it on {name}: {name} must be MAC'd with the secret "
            f"key "
            f"(reason=flags)")
    assert str(refused(frame, now_ns=TS)) == text
    with pytest.raises(ProtocolError) as info:
        expected_length(frame[:12])
    assert str(info.value) == text


@given(st.integers(0, 0xFFFF).filter(lambda f: f & ~PEERCRED), st.sampled_from([1, 3, 6]))
def test_an_unknown_flag_bit_is_refused_whatever_else_is_set(flags: int, type_: int) -> None:
    frame = reference_frame(type_, b"" if type_ == 3 else JS_PAYLOAD, JS_NONCE, TS,
                            key=ZERO_KEY, flags=flags)
    assert str(refused(frame, now_ns=TS)) == (
        f"flags must be 0 or 0x0001 (PEERCRED), got 0x{flags:04x} (reason=flags)")


def test_a_peercred_frame_macd_with_the_secret_key_is_refused_as_mac_saying_which_key() -> None:
    """Given a STATUS flagged PEERCRED but MAC'd with the secret key (a client mixing the
    two), then the receiver, checking with the public key, refuses it naming that key."""
    frame = reference_frame(3, b"", JS_NONCE, TS, key=KEY, flags=1)
    assert str(refused(frame, now_ns=TS)) == (
        "the MAC of a PEERCRED frame does not match: it must be keyed with the public key "
        "(32 zero bytes); the frame is corrupted or was MAC'd with another key (reason=mac)")


@pytest.mark.parametrize(("faults", "reason"), [
    ({"flags": 3, "length": 5000, "key": KEY}, "flags"),
    ({"length": 5000, "key": KEY}, "length"),
    ({"key": KEY, "type_": 99}, "flags"),
    ({"key": KEY}, "mac"),
    ({"ts": TS - 10**12}, "stale"),
])
def test_a_peercred_frame_goes_through_the_same_checks_in_the_same_order(
        faults: dict[str, Any], reason: str) -> None:
    """Given a PEERCRED STATUS with several faults, then the first check of the documented
    order names the refusal, as for any frame (the clock check included)."""
    type_ = faults.pop("type_", 3)
    ts = faults.pop("ts", TS)
    faults.setdefault("flags", 1)
    faults.setdefault("key", ZERO_KEY)
    frame = reference_frame(type_, b"", JS_NONCE, ts, **faults)
    assert refused(frame, now_ns=TS).reason == reason


def test_a_peercred_request_is_answered_by_a_peercred_ack_and_nothing_else() -> None:
    """Given the PEERCRED QUARANTINE_SELF vector's nonce, then decode_ack(peercred=True)
    accepts the PEERCRED ACK vector, and refuses the (secret-keyed) ACK vector re-bound to
    that nonce, because the asker could not have checked its MAC."""
    request = bytes.fromhex(PQS["nonce"])
    ack = decode_ack(bytes.fromhex(PACK["frame"]), PUBLIC_KEY, request,
                     now_ns=PACK["timestamp_ns"], peercred=True)
    assert ack == Ack(366474, 27, AckStatus.OK, request)
    keyed = encode(MsgType.ACK, ack, KEY, ts_ns=PACK["timestamp_ns"])
    with pytest.raises(ProtocolError) as info:
        decode_ack(keyed, KEY, request, now_ns=PACK["timestamp_ns"], peercred=True)
    assert str(info.value) == f"{LACKS_PEERCRED} (reason=flags)"


def test_a_peercred_ack_never_answers_a_request_macd_with_the_secret_key() -> None:
    """Given a root client that sent a secret-keyed request, when a PEERCRED ACK for its
    nonce arrives (anyone can make one), then decode_ack refuses it before the MAC."""
    request = bytes.fromhex(JS["nonce"])
    forged = encode(MsgType.ACK, Ack(1, 1, AckStatus.OK, request), PUBLIC_KEY,
                    flags=PEERCRED)
    with pytest.raises(ProtocolError) as info:
        decode_ack(forged, KEY, request)
    assert str(info.value) == f"{PEERCRED_REPLY} (reason=flags)"


def test_decode_with_peercred_true_or_false_insists_on_the_flag_of_the_request() -> None:
    """Given a STATUS_REPLY with and without the flag, then decode(peercred=True) takes only
    the flagged one, decode(peercred=False) only the other, and decode() both."""
    doc = StatusReply({"jobs": [], "version": 1})
    flagged = encode(MsgType.STATUS_REPLY, doc, KEY, flags=PEERCRED)
    keyed = encode(MsgType.STATUS_REPLY, doc, KEY)
    assert decode(flagged, PUBLIC_KEY, peercred=True).message == doc
    assert decode(keyed, KEY, peercred=False).message == doc
    assert decode(flagged, KEY).peercred and not decode(keyed, KEY).peercred
    assert str(refused(keyed, peercred=True)) == f"{LACKS_PEERCRED} (reason=flags)"
    assert str(refused(flagged, peercred=False)) == f"{PEERCRED_REPLY} (reason=flags)"


@pytest.mark.parametrize(("received", "flags"), [
    (reference_frame(1, JS_PAYLOAD, JS_NONCE, TS, key=ZERO_KEY, flags=1), PEERCRED),
    (reference_frame(6, JS_PAYLOAD, JS_NONCE, TS, key=KEY, flags=1), PEERCRED),
    (reference_frame(6, JS_PAYLOAD, JS_NONCE, TS, key=ZERO_KEY, flags=3), PEERCRED),
    (reference_frame(6, JS_PAYLOAD, JS_NONCE, TS, key=ZERO_KEY, flags=1, version=2), 0),
    (reference_frame(6, JS_PAYLOAD, JS_NONCE, TS, flags=2), 0),
])
def test_a_refused_peercred_request_is_answered_in_kind(received: bytes, flags: int) -> None:
    """Given a refused request whose header has the PEERCRED bit, then ack_for_error answers
    with a PEERCRED ACK its keyless sender can check; other frames, and any frame of another
    protocol version (never read past byte 4), get a secret-keyed ACK."""
    answer = ack_for_error(received, refused(received, now_ns=TS), KEY)
    got = decode(answer, KEY)
    assert got.flags == flags
    ack = decode_ack(answer, KEY, JS_NONCE, peercred=bool(flags))
    assert ack.status in (AckStatus.BAD_REQUEST, AckStatus.VERSION)


def test_a_cache_for_peercred_frames_forgets_its_oldest_nonce_when_full() -> None:
    """Given a PEERCRED replay cache (forget_when_full) full of live nonces, then a new nonce
    is accepted and the oldest forgotten (anyone can mint such frames, so failing closed
    would hand every local user a switch that blocks everyone); a nonce it still holds is
    refused as a replay."""
    cache = ReplayCache.for_skew(0.5, capacity=2, forget_when_full=True)
    cache.check(b"a" * 16, TS)
    cache.check(b"b" * 16, TS)
    cache.check(b"c" * 16, TS)
    assert len(cache) == 2
    with pytest.raises(ProtocolError) as info:
        cache.check(b"c" * 16, TS)
    assert info.value.reason == "nonce"
    cache.check(b"a" * 16, TS)  # forgotten, so accepted again


# ---------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------

def test_a_replayed_frame_is_refused_within_the_window_and_forgotten_after() -> None:
    """Given a receiver with a replay cache (window 2 x 30 s), when the same frame arrives
    twice within its clock window, then the second is refused; a nonce older than the
    window is forgotten."""
    cache = ReplayCache.for_skew(30.0)
    assert cache.window == 60.0
    frame = bytes.fromhex(JS["frame"])
    decode(frame, KEY, now_ns=TS, replay=cache)
    with pytest.raises(ProtocolError) as info:
        decode(frame, KEY, now_ns=TS + SKEW_NS, replay=cache)
    assert str(info.value) == (f"nonce {JS['nonce']} was already used within the last 60 s: "
                               f"a replayed frame (reason=nonce)")
    assert len(cache) == 1
    # 60 s + 1 ns after it was first seen, the nonce is gone (the frame is stale by then)
    cache.check(b"other-nonce-1234", TS + 2 * SKEW_NS + 1)
    assert len(cache) == 1
    cache.check(JS_NONCE, TS + 2 * SKEW_NS + 2)


def test_the_window_closes_every_replay_the_clock_check_lets_through() -> None:
    """Given a frame stamped 30 s in the future and first seen at once, when it is replayed
    at every later moment, then each replay is refused: by the cache within 60 s, by the
    clock check after (the reason for a 2 x max_skew window)."""
    cache = ReplayCache.for_skew(30.0)
    frame = encode(1, JobStarted(1, 1, 1), KEY, ts_ns=TS + SKEW_NS)
    decode(frame, KEY, now_ns=TS, replay=cache)
    for later in (0, 1, SKEW_NS, 2 * SKEW_NS, 2 * SKEW_NS + 1, 10 * SKEW_NS):
        with pytest.raises(ProtocolError) as info:
            decode(frame, KEY, now_ns=TS + later, replay=cache)
        assert info.value.reason == ("nonce" if later <= 2 * SKEW_NS else "stale")


def test_a_refused_frame_does_not_spend_its_nonce() -> None:
    """Given a forged copy (bad MAC) of a frame arriving first, then the genuine frame is
    still accepted: only authentic frames enter the cache."""
    cache = ReplayCache(60.0)
    frame = bytes.fromhex(JS["frame"])
    forged = frame[:-1] + bytes([frame[-1] ^ 1])
    assert refused(forged, now_ns=TS, replay=cache).reason == "mac"
    assert len(cache) == 0
    assert decode(frame, KEY, now_ns=TS, replay=cache).nonce == JS_NONCE


def test_a_clock_that_jumps_back_keeps_nonces_longer() -> None:
    cache = ReplayCache(1.0)
    cache.check(JS_NONCE, TS)
    with pytest.raises(ProtocolError):
        cache.check(JS_NONCE, TS - 3600 * 10**9)


def test_a_full_cache_refuses_rather_than_forgets() -> None:
    """Given a cache full of nonces inside the window, then a new nonce is refused (fail
    closed); once they age out, it is accepted."""
    cache = ReplayCache(1.0, capacity=2)
    cache.check(b"a" * 16, TS)
    cache.check(b"b" * 16, TS)
    with pytest.raises(ProtocolError) as info:
        cache.check(b"c" * 16, TS)
    assert str(info.value) == ("the replay cache holds 2 nonces younger than 1 s; refusing the "
                               "frame rather than forgetting one (reason=nonce)")
    cache.check(b"c" * 16, TS + 10**9 + 1)
    assert len(cache) == 1


def test_a_cache_needs_a_positive_window_and_capacity() -> None:
    with pytest.raises(ValueError, match=r"window and capacity must be > 0, got 0, 5"):
        ReplayCache(0, capacity=5)


# ---------------------------------------------------------------------------
# streams: expected_length, read_frame; refusal answers
# ---------------------------------------------------------------------------

def test_expected_length_waits_for_12_bytes_and_checks_shape_as_early_as_possible() -> None:
    """Given a frame arriving byte by byte, then expected_length says "more" until byte 12,
    then the total; garbage is refused at the first wrong magic byte, another version at
    byte 5, a too large N at byte 12."""
    frame = bytes.fromhex(JS["frame"])
    assert [expected_length(frame[:i]) for i in range(12)] == [None] * 12
    assert expected_length(frame[:12]) == len(frame) == 92
    with pytest.raises(ProtocolError) as info:
        expected_length(b"GX")
    assert str(info.value) == "a frame must start with b'GECQ', got b'GX' (reason=magic)"
    with pytest.raises(ProtocolError) as info:
        expected_length(b"GECQ\x02")
    assert str(info.value) == ("protocol version must be 1, got 2: gecod speaks protocol 1; "
                               "upgrade the preload/gecod (reason=version)")
    with pytest.raises(ProtocolError) as info:
        expected_length(frame[:8] + (4097).to_bytes(4, "little"))
    assert info.value.reason == "length"


def test_read_frame_reads_exactly_one_frame() -> None:
    """Given a frame followed by more bytes on a stream, then read_frame returns the frame and
    leaves the rest unread."""
    a, b = socket.socketpair()
    with a, b:
        frame = bytes.fromhex(JS["frame"])
        a.sendall(frame + b"next")
        assert read_frame(b, time.monotonic() + 5) == frame
        assert b.recv(100) == b"next"


def test_read_frame_assembles_a_frame_sent_in_pieces() -> None:
    a, b = socket.socketpair()
    frame = bytes.fromhex(BY_NAME["status_reply"]["frame"])

    def trickle() -> None:
        for i in range(0, len(frame), 7):
            a.sendall(frame[i:i + 7])
            time.sleep(0.002)

    with a, b:
        writer = threading.Thread(target=trickle)
        writer.start()
        assert read_frame(b, time.monotonic() + 5) == frame
        writer.join()


def test_read_frame_gives_up_at_the_deadline_and_when_the_peer_closes() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(bytes.fromhex(JS["frame"])[:40])
        start = time.monotonic()
        with pytest.raises(ProtocolError) as info:
            read_frame(b, start + 0.2)
        assert str(info.value) == ("no whole frame before the deadline: got 40 bytes "
                                   "(reason=timeout)")
        assert time.monotonic() - start < 2
        a.close()
        with pytest.raises(ProtocolError) as info:
            read_frame(b, time.monotonic() + 5)
        assert str(info.value) == ("the peer closed the connection after 0 bytes of a frame "
                                   "(reason=closed)")


def test_read_frame_refuses_garbage_without_waiting_for_more() -> None:
    """Given a client that sends an HTTP request and waits, then read_frame refuses it at
    once (magic), not at the deadline."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"GET / HTTP/1.0\r\n")
        start = time.monotonic()
        with pytest.raises(ProtocolError) as info:
            read_frame(b, start + 10)
        assert info.value.reason == "magic"
        assert time.monotonic() - start < 2


@pytest.mark.parametrize(("received", "status", "nonce"), [
    (reference_frame(1, JS_PAYLOAD, JS_NONCE, TS, version=2), AckStatus.VERSION, JS_NONCE),
    (reference_frame(1, JS_PAYLOAD, JS_NONCE, TS, key=bytes(32)), AckStatus.BAD_REQUEST,
     JS_NONCE),
    (b"GECQ\x01", AckStatus.BAD_REQUEST, bytes(16)),
])
def test_a_refused_request_is_answered_with_a_bound_ack(received: bytes, status: AckStatus,
                                                        nonce: bytes) -> None:
    """Given a refused request, then ack_for_error answers VERSION for another protocol
    version, else BAD_REQUEST, bound to the request's nonce (zeros if it never arrived)."""
    answer = ack_for_error(received, refused(received, now_ns=TS), KEY)
    assert decode_ack(answer, KEY, nonce) == Ack(0, 0, status, nonce)


def test_a_receiver_parses_a_frames_header_once_and_decode_agrees_with_it() -> None:
    """Given a JOB_STARTED frame, then its header view (what gecod reads first) names its
    type, flags, size, nonce and time as decode does; the claim and the PEERCRED bit read
    without trusting the frame agree too, and a partial header claims nothing."""
    frame = encode(MsgType.QUARANTINE_SELF, JobStarted(42, 7, 4242), PUBLIC_KEY,
                   flags=PEERCRED)
    header = Header.parse(frame[:HEADER_BYTES])
    got = decode(frame, KEY, header=header)
    assert (header.type, header.flags, header.nonce, header.timestamp_ns) == (
        got.type, got.flags, got.nonce, got.timestamp_ns)
    assert (header.frame_bytes, header.peercred) == (len(frame), True)
    assert claimed(frame) == (42, 7, 4242) and claims_peercred(frame[:8])
    assert claimed(frame[:40]) == (None, None, None) and not claims_peercred(frame[:7])
    with pytest.raises(ProtocolError) as err:
        Header.parse(b"GECQ\x02" + bytes(31))
    assert err.value.reason == "version"
