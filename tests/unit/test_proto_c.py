"""libgeco/geco_proto.c against the same vectors and the Python twin.

The C file is compiled here, from source, into pytest's temporary directory
(never into the repo): once as a cffi extension (API mode, linked with the
real libsodium and UBSan, so signed overflow or a bad shift aborts the test),
and once as a stand-alone harness under AddressSanitizer that decodes every
prefix of every vector and random buffers, each in a heap block of exactly its
size, so a read past the end is caught.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geco.errors import ProtocolError
from geco.wire import frame as wire_frame
from geco.wire.frame import (
    HEADER_BYTES,
    KEY_BYTES,
    MAC_BYTES,
    MAX_FRAME,
    PEERCRED,
    PUBLIC_KEY,
    VERSION,
    decode,
    encode,
)
from geco.wire.messages import (
    MAX_PAYLOAD,
    NONCE_BYTES,
    REPLY_MAX_TEXT,
    Ack,
    AckStatus,
    Adopt,
    AdoptReply,
    AdoptStage,
    Hook,
    HookName,
    JobStarted,
    MsgType,
)
from tests.ckit import LIBGECO, REPO, ubsan_module, undefined_calls

SOURCE = LIBGECO / "geco_proto.c"
VECTORS = json.loads((REPO / "tests" / "vectors" / "wire.json").read_text())
KEY = bytes.fromhex(VECTORS["key"])
BY_NAME = {v["name"]: v for v in VECTORS["vectors"]}
SKEW_NS = 30 * 10**9
STRICT = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion",
          "-Wsign-conversion", "-Wshadow", "-Werror"]

CDEF = """
#define GECO_PROTO_VERSION 1
#define GECO_KEY_BYTES 32
#define GECO_NONCE_BYTES 16
#define GECO_HEADER_BYTES 36
#define GECO_MAC_BYTES 32
#define GECO_MAX_PAYLOAD 4096
#define GECO_MAX_FRAME ...
enum geco_type { GECO_JOB_STARTED = 1, GECO_ACK = 2, GECO_STATUS = 3, GECO_STATUS_REPLY = 4,
                 GECO_ADOPT = 5, GECO_QUARANTINE_SELF = 6, GECO_ADOPT_REPLY = 7, GECO_HOOK = 8,
                 GECO_STARTER = 9, GECO_STARTER_REPLY = 10, GECO_PREPARE = 11, GECO_ABORT = 12,
                 GECO_RELEASE = 13, GECO_NODE_REPLY = 14, GECO_NODE_STATUS = 15,
                 GECO_OOM_REPORT = 16, GECO_CALLERID = 17 };
enum geco_hook_name { GECO_HOOK_PROLOG = 1, GECO_HOOK_EPILOG = 2 };
enum geco_status { GECO_OK = 0, GECO_REFUSED = 1, GECO_NO_SUCH_JOB = 2, GECO_FAILED = 3,
                   GECO_BAD_REQUEST = 4, GECO_VERSION = 5, GECO_BUSY = 6, GECO_REQUEUE = 7,
                   GECO_HOLD = 8 };
enum geco_err { GECO_E_SHORT = -1, GECO_E_MAGIC = -2, GECO_E_VERSION = -3, GECO_E_FLAGS = -4,
                GECO_E_LENGTH = -5, GECO_E_MAC = -6, GECO_E_TYPE = -7, GECO_E_PAYLOAD = -8,
                GECO_E_STALE = -9, GECO_E_NONCE = -10 };
typedef struct { uint64_t job_id, task_id; uint32_t pid; } geco_job_started_t;
typedef struct { uint64_t job_id, task_id; uint32_t status; uint8_t request_nonce[16]; } geco_ack_t;
typedef struct { uint64_t job_id, task_id; uint32_t pid, uid, stage; const char *connection;
                 int peercred; } geco_adopt_t;
typedef struct { uint64_t job_id, task_id; uint32_t pid; const char *environ[4]; int argc;
                 char *const *argv; } geco_starter_t;
long geco_encode_starter(uint8_t *buf, size_t cap, const uint8_t *nonce, int64_t ts_ns,
                         const geco_starter_t *msg);
int geco_decode_starter_reply(const uint8_t *buf, size_t len, const uint8_t request_nonce[16],
                              int64_t now_ns, int64_t max_skew_ns, geco_ack_t *out,
                              char *strings, size_t cap, size_t *strings_len);
int geco_proto_init(void);
long geco_encode_adopt(uint8_t *buf, size_t cap, const uint8_t key[32],
                       const uint8_t *nonce, int64_t ts_ns, const geco_adopt_t *msg);
int geco_decode_adopt_reply(const uint8_t *buf, size_t len, const uint8_t key[32],
                            const uint8_t request_nonce[16], int64_t now_ns,
                            int64_t max_skew_ns, int peercred, geco_ack_t *out, char *text,
                            size_t cap);
long geco_encode_job_started(uint8_t *buf, size_t cap, int type, const uint8_t key[32],
                             const uint8_t *nonce, int64_t ts_ns, const geco_job_started_t *msg);
long geco_encode_hook(uint8_t *buf, size_t cap, const uint8_t key[32],
                      const uint8_t *nonce, int64_t ts_ns, const geco_job_started_t *msg,
                      uint32_t hook);
long geco_encode_ack(uint8_t *buf, size_t cap, const uint8_t key[32],
                     const uint8_t *nonce, int64_t ts_ns, const geco_ack_t *msg);
int geco_decode_ack(const uint8_t *buf, size_t len, const uint8_t key[32],
                    const uint8_t request_nonce[16], int64_t now_ns,
                    int64_t max_skew_ns, geco_ack_t *out);
int geco_decode_job_started(const uint8_t *buf, size_t len, const uint8_t key[32],
                            int64_t now_ns, int64_t max_skew_ns, geco_job_started_t *out);
const uint8_t *geco_frame_nonce(const uint8_t *frame);
int geco_check_header(const uint8_t *header);
long geco_frame_length(const uint8_t *header);
const char *geco_strerror(int err);
"""


class C:
    """The compiled C protocol, with Python-friendly calls."""

    def __init__(self, module: ModuleType) -> None:
        self.ffi: Any = module.ffi
        self.lib: Any = module.lib

    def _in(self, data: bytes | None) -> Any:
        return self.ffi.NULL if data is None else self.ffi.from_buffer("uint8_t[]", data)

    def encode_job_started(self, type_: int, job: int, task: int, pid: int, *,
                           nonce: bytes | None, ts: int, cap: int | None = None,
                           key: bytes = KEY) -> bytes | int:
        buf = self.ffi.new("uint8_t[]", self.lib.GECO_MAX_FRAME if cap is None else cap or 1)
        msg = self.ffi.new("geco_job_started_t *", {"job_id": job, "task_id": task, "pid": pid})
        n = self.lib.geco_encode_job_started(buf, len(buf) if cap is None else cap, type_,
                                             self._in(key), self._in(nonce), ts, msg)
        return n if n < 0 else bytes(self.ffi.buffer(buf, n))

    def encode_hook(self, job: int, task: int, pid: int, hook: int, *, nonce: bytes | None,
                    ts: int) -> bytes | int:
        buf = self.ffi.new("uint8_t[]", self.lib.GECO_MAX_FRAME)
        msg = self.ffi.new("geco_job_started_t *", {"job_id": job, "task_id": task, "pid": pid})
        n = self.lib.geco_encode_hook(buf, len(buf), self._in(KEY), self._in(nonce), ts, msg,
                                      hook)
        return n if n < 0 else bytes(self.ffi.buffer(buf, n))

    def encode_ack(self, job: int, task: int, status: int, request: bytes, *,
                   nonce: bytes | None, ts: int, cap: int | None = None) -> bytes | int:
        buf = self.ffi.new("uint8_t[]", self.lib.GECO_MAX_FRAME if cap is None else cap or 1)
        msg = self.ffi.new("geco_ack_t *", {"job_id": job, "task_id": task, "status": status,
                                             "request_nonce": list(request)})
        n = self.lib.geco_encode_ack(buf, len(buf) if cap is None else cap, self._in(KEY),
                                     self._in(nonce), ts, msg)
        return n if n < 0 else bytes(self.ffi.buffer(buf, n))

    def decode_ack(self, frame: bytes, request: bytes, *, now: int,
                   skew: int = SKEW_NS, key: bytes = KEY) -> tuple[int, Ack | None]:
        out = self.ffi.new("geco_ack_t *")
        rc = self.lib.geco_decode_ack(self._in(frame or b"\0"), len(frame), self._in(key),
                                      self._in(request), now, skew, out)
        if rc != 0:
            return rc, None
        return rc, Ack(out.job_id, out.task_id, AckStatus(out.status),
                       bytes(out.request_nonce))

    def decode_job_started(self, frame: bytes, *, now: int, skew: int = SKEW_NS
                           ) -> tuple[int, JobStarted | None]:
        """gecod's fast lane's decoding of a request (lane/serve.c)."""
        out = self.ffi.new("geco_job_started_t *")
        rc = self.lib.geco_decode_job_started(self._in(frame or b"\0"), len(frame),
                                              self._in(KEY), now, skew, out)
        return rc, (JobStarted(out.job_id, out.task_id, out.pid) if rc == 0 else None)

    def encode_adopt(self, adopt: Adopt, *, nonce: bytes | None, ts: int,
                     peercred: bool = False) -> bytes | int:
        buf = self.ffi.new("uint8_t[]", self.lib.GECO_MAX_FRAME)
        connection = self.ffi.new("char[]", adopt.connection.encode())
        msg = self.ffi.new("geco_adopt_t *", {
            "job_id": adopt.job_id, "task_id": adopt.task_id, "pid": adopt.pid,
            "uid": adopt.uid, "stage": adopt.stage, "connection": connection,
            "peercred": int(peercred)})
        key = PUBLIC_KEY if peercred else KEY
        n = self.lib.geco_encode_adopt(buf, len(buf), self._in(key), self._in(nonce), ts, msg)
        return n if n < 0 else bytes(self.ffi.buffer(buf, n))

    def decode_adopt_reply(self, frame: bytes, request: bytes, *, now: int,
                           peercred: bool = False) -> tuple[int, AdoptReply | None]:
        out = self.ffi.new("geco_ack_t *")
        text = self.ffi.new("char[]", REPLY_MAX_TEXT + 1)
        key = PUBLIC_KEY if peercred else KEY
        rc = self.lib.geco_decode_adopt_reply(self._in(frame or b"\0"), len(frame),
                                              self._in(key), self._in(request), now, SKEW_NS,
                                              int(peercred), out, text, len(text))
        if rc != 0:
            return rc, None
        return rc, AdoptReply(out.job_id, out.task_id, AckStatus(out.status),
                              bytes(out.request_nonce), self.ffi.string(text).decode())

    def strerror(self, err: int) -> str:
        return str(self.ffi.string(self.lib.geco_strerror(err)).decode())


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> C:
    """geco_proto.c built as a cffi extension (with UBSan) in a temporary directory."""
    module = ubsan_module("_geco_proto_test", CDEF, "geco_proto.h", ["geco_proto.c"],
                          tmp_path_factory.mktemp("geco_proto_cffi"), libraries=["sodium"])
    lib = C(module)
    assert lib.lib.geco_proto_init() == 0
    return lib


# ---------------------------------------------------------------------------
# the source itself
# ---------------------------------------------------------------------------

def test_the_c_compiles_warning_free_and_calls_only_memcpy_clock_and_libsodium(
        tmp_path: Path) -> None:
    """Given geco_proto.c, when compiled with strict warnings (-Wconversion ... -Werror)
    at -O0 and -O2, then it builds, and its object refers to no allocator, no stdio and no
    lock: only mem*, strlen, clock_gettime and libsodium (the header's post-fork promise)."""
    allowed = {"memcpy", "memcmp", "memchr", "memset", "strlen", "clock_gettime", "sodium_init",
               "randombytes_buf",
               "crypto_generichash", "sodium_memcmp", "__stack_chk_fail"}
    for opt, undefined in undefined_calls(SOURCE, STRICT, tmp_path).items():
        assert undefined <= allowed, f"{opt}: unexpected calls {sorted(undefined - allowed)}"


def test_the_header_constants_are_the_protocol_constants(c: C) -> None:
    lib = c.lib
    assert (lib.GECO_PROTO_VERSION, lib.GECO_KEY_BYTES, lib.GECO_NONCE_BYTES,
            lib.GECO_HEADER_BYTES, lib.GECO_MAC_BYTES, lib.GECO_MAX_PAYLOAD,
            lib.GECO_MAX_FRAME) == (VERSION, KEY_BYTES, NONCE_BYTES, HEADER_BYTES,
                                    MAC_BYTES, MAX_PAYLOAD, MAX_FRAME)
    assert {t.name: t.value for t in MsgType} == {
        n: getattr(lib, f"GECO_{n}") for n in MsgType.__members__}
    assert {s.name: s.value for s in AckStatus} == {
        n: getattr(lib, f"GECO_{n}") for n in AckStatus.__members__}


# ---------------------------------------------------------------------------
# vectors
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["job_started", "quarantine_self"])
def test_c_encodes_a_job_started_vector_byte_for_byte(c: C, name: str) -> None:
    v = BY_NAME[name]
    f = v["fields"]
    frame = c.encode_job_started(v["type"], f["job_id"], f["task_id"], f["pid"],
                                 nonce=bytes.fromhex(v["nonce"]), ts=v["timestamp_ns"])
    assert isinstance(frame, bytes) and frame.hex() == v["frame"]


def test_c_encodes_the_hook_vector_byte_for_byte(c: C) -> None:
    """Given the HOOK vector, then the hook program's encoder makes exactly its frame, and
    Python reads back the hook it names."""
    v = BY_NAME["hook"]
    f = v["fields"]
    frame = c.encode_hook(f["job_id"], f["task_id"], f["pid"], f["hook"],
                          nonce=bytes.fromhex(v["nonce"]), ts=v["timestamp_ns"])
    assert isinstance(frame, bytes) and frame.hex() == v["frame"]
    got = decode(frame, KEY, now_ns=v["timestamp_ns"]).message
    assert got == Hook(366474, 27, 28170, HookName.PROLOG)


def test_c_encodes_the_starter_vector_and_decodes_its_reply_vector(c: C) -> None:
    """Given the STARTER and STARTER_REPLY vectors, then the starter's encoder makes exactly
    the request's frame, and its decoder reads the reply's strings as Python wrote them."""
    v, r = BY_NAME["peercred_starter"], BY_NAME["peercred_starter_reply"]
    f = v["fields"]
    keep = [c.ffi.new("char[]", w.encode()) for w in f["environ"] + f["argv"]]
    argv = c.ffi.new("char *[]", [*keep[4:], c.ffi.NULL])
    msg = c.ffi.new("geco_starter_t *", {"job_id": f["job_id"], "task_id": f["task_id"],
                                         "pid": f["pid"], "environ": keep[:4],
                                         "argc": len(f["argv"]), "argv": argv})
    buf = c.ffi.new("uint8_t[]", c.lib.GECO_MAX_FRAME)
    n = c.lib.geco_encode_starter(buf, len(buf), c._in(bytes.fromhex(v["nonce"])),
                                  v["timestamp_ns"], msg)
    out = c.ffi.new("geco_ack_t *")
    strings = c.ffi.new("char[]", 4096)
    length = c.ffi.new("size_t *")
    reply = bytes.fromhex(r["frame"])
    rc = c.lib.geco_decode_starter_reply(c._in(reply), len(reply),
                                         c._in(bytes.fromhex(v["nonce"])), r["timestamp_ns"],
                                         SKEW_NS, out, strings, 4096, length)
    words = bytes(c.ffi.buffer(strings, length[0])).split(b"\0")[:-1]

    assert n > 0 and bytes(c.ffi.buffer(buf, n)).hex() == v["frame"]
    assert (rc, out.status, out.job_id) == (0, 0, 366474)
    assert [w.decode() for w in words] == [
        r["fields"]["program"], str(len(r["fields"]["argv"])), *r["fields"]["argv"],
        *r["fields"]["environ"]]


def test_c_encodes_the_ack_vector_byte_for_byte(c: C) -> None:
    v = BY_NAME["ack"]
    f = v["fields"]
    frame = c.encode_ack(f["job_id"], f["task_id"], f["status"],
                         bytes.fromhex(f["request_nonce"]), nonce=bytes.fromhex(v["nonce"]),
                         ts=v["timestamp_ns"])
    assert isinstance(frame, bytes) and frame.hex() == v["frame"]


def test_c_decodes_the_ack_vector_as_the_answer_to_the_job_started_vector(c: C) -> None:
    v = BY_NAME["ack"]
    request = bytes.fromhex(BY_NAME["job_started"]["nonce"])
    rc, ack = c.decode_ack(bytes.fromhex(v["frame"]), request, now=v["timestamp_ns"])
    assert (rc, ack) == (0, Ack(366474, 27, AckStatus.OK, request))


def test_c_encodes_the_adopt_vector_and_decodes_its_reply_vector(c: C) -> None:
    v, r = BY_NAME["adopt"], BY_NAME["adopt_reply"]
    f = v["fields"]
    adopt = Adopt(f["job_id"], f["task_id"], f["pid"], f["uid"], AdoptStage(f["stage"]),
                  f["connection"])
    frame = c.encode_adopt(adopt, nonce=bytes.fromhex(v["nonce"]), ts=v["timestamp_ns"])
    assert isinstance(frame, bytes) and frame.hex() == v["frame"]
    rc, reply = c.decode_adopt_reply(bytes.fromhex(r["frame"]), bytes.fromhex(v["nonce"]),
                                     now=r["timestamp_ns"])
    assert (rc, reply) == (0, AdoptReply(366474, 1, AckStatus.OK, bytes.fromhex(v["nonce"]),
                                         r["fields"]["text"]))
    # an ADOPT_REPLY is not the ACK a JOB_STARTED waits for, nor the reverse
    assert c.decode_ack(bytes.fromhex(r["frame"]), bytes.fromhex(v["nonce"]),
                        now=r["timestamp_ns"])[0] == c.lib.GECO_E_TYPE
    ack = BY_NAME["ack"]
    assert c.decode_adopt_reply(bytes.fromhex(ack["frame"]),
                                bytes.fromhex(BY_NAME["job_started"]["nonce"]),
                                now=ack["timestamp_ns"])[0] == c.lib.GECO_E_TYPE


@given(magic=st.sampled_from([b"GECQ", b"GECX", b"\0ECQ"]), version=st.sampled_from([1, 0, 2]),
       length=st.sampled_from([0, 24, 40, 4096, 4097, 2**32 - 1]),
       rest=st.binary(min_size=24, max_size=24))
def test_c_reads_a_header_alone_as_python_does(c: C, magic: bytes, version: int, length: int,
                                               rest: bytes) -> None:
    """Given a frame's header alone (no flags), when C checks it and reads the length it
    announces (the client and gecod's fast lane, before waiting for the rest), then it
    refuses what geco.wire.frame.expected_length refuses, for the same reason, and
    announces the same whole-frame length."""
    header = magic + bytes([version, c.lib.GECO_ACK]) + b"\0\0" + struct.pack("<I", length) + rest
    buf = c._in(header)
    try:
        whole = wire_frame.expected_length(header)
    except ProtocolError as e:
        assert c.lib.geco_check_header(buf) == getattr(c.lib, f"GECO_E_{e.reason.upper()}")
    else:
        assert c.lib.geco_check_header(buf) == 0
        assert c.lib.geco_frame_length(buf) == whole
    assert c.lib.geco_frame_length(buf) == (
        wire_frame.HEADER_BYTES + length + wire_frame.MAC_BYTES if length <= wire_frame.MAX_PAYLOAD
        else c.lib.GECO_E_LENGTH)


@pytest.mark.parametrize("neg", VECTORS["negative"], ids=lambda n: n["name"])
def test_c_refuses_a_negative_vector_with_its_error_code(c: C, neg: dict[str, Any]) -> None:
    """Given a negative vector, when C decodes it as the awaited ack, then it returns the
    vector's geco_err, the same refusal Python gives."""
    rc, ack = c.decode_ack(bytes.fromhex(neg["frame"]), bytes.fromhex(neg["request_nonce"]),
                           now=neg["now_ns"], skew=neg["max_skew_ns"])
    assert rc == getattr(c.lib, neg["c_error"]) and ack is None


def test_every_error_code_has_its_own_static_message(c: C) -> None:
    codes = [getattr(c.lib, f"GECO_E_{r.upper()}") for r in (
        "short", "magic", "version", "flags", "length", "mac", "type", "payload", "stale",
        "nonce")]
    assert codes == list(range(-1, -11, -1))
    texts = [c.strerror(code) for code in codes]
    assert len(set(texts)) == len(texts)
    assert c.strerror(c.lib.GECO_E_VERSION) == ("unsupported protocol version: gecod speaks "
                                                "protocol 1; upgrade the preload/gecod")
    assert c.strerror(0) == "ok"
    assert c.strerror(-99) == "unknown geco protocol error"


# ---------------------------------------------------------------------------
# C and Python understand each other
# ---------------------------------------------------------------------------

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
nonces = st.binary(min_size=16, max_size=16)
int64 = st.integers(-(2**63), 2**63 - 1).filter(lambda t: t != 0)  # 0 = "now" in C


@given(u64, u64, u32, nonces, int64, st.sampled_from([1, 6]))
def test_python_decodes_what_c_encodes(c: C, job: int, task: int, pid: int, nonce: bytes,
                                       ts: int, type_: int) -> None:
    frame = c.encode_job_started(type_, job, task, pid, nonce=nonce, ts=ts)
    assert isinstance(frame, bytes)
    got = decode(frame, KEY, now_ns=ts)
    assert (got.type, got.nonce, got.timestamp_ns) == (type_, nonce, ts)
    assert got.message == JobStarted(job, task, pid)


def test_c_decodes_a_job_started_request_as_gecod_does_and_nothing_else(c: C) -> None:
    """The fast lane's decoder takes the JOB_STARTED vector, and refuses what gecod's Python
    decoding refuses (another type, another key, a bad MAC, the clock)."""
    v = BY_NAME["job_started"]
    frame, ts = bytes.fromhex(v["frame"]), v["timestamp_ns"]
    assert c.decode_job_started(frame, now=ts) == (0, JobStarted(**v["fields"]))
    for other in ("quarantine_self", "hook", "ack"):
        o = BY_NAME[other]
        assert c.decode_job_started(bytes.fromhex(o["frame"]), now=o["timestamp_ns"])[0] \
            == c.lib.GECO_E_TYPE
    forged = frame[:-1] + bytes([frame[-1] ^ 1])
    assert c.decode_job_started(forged, now=ts)[0] == c.lib.GECO_E_MAC
    assert c.decode_job_started(frame, now=ts + SKEW_NS + 1)[0] == c.lib.GECO_E_STALE
    assert c.decode_job_started(frame[:-1], now=ts)[0] == c.lib.GECO_E_LENGTH
    for neg in VECTORS["negative"]:  # C takes one only where Python reads a JOB_STARTED
        data = bytes.fromhex(neg["frame"])
        try:
            got = decode(data, KEY, now_ns=neg["now_ns"], max_skew=neg["max_skew_ns"] / 1e9)
        except ProtocolError:
            got = None
        rc, msg = c.decode_job_started(data, now=neg["now_ns"], skew=neg["max_skew_ns"])
        assert (rc == 0) == (got is not None and got.type is MsgType.JOB_STARTED), neg["name"]
        assert msg == (got.message if rc == 0 and got is not None else None)


@given(u64, u64, u32, u32, st.sampled_from(list(AdoptStage)),
       st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=255),
       st.sampled_from(list(AckStatus)), st.text(max_size=600).filter(lambda t: "\0" not in t),
       nonces, int64)
def test_adopt_and_its_reply_cross_between_c_and_python(
        c: C, job: int, task: int, pid: int, uid: int, stage: AdoptStage, connection: str,
        status: AckStatus, text: str, nonce: bytes, ts: int) -> None:
    adopt = Adopt(job, task, pid, uid, stage, connection)
    frame = c.encode_adopt(adopt, nonce=nonce, ts=ts)
    assert isinstance(frame, bytes)
    assert decode(frame, KEY, now_ns=ts).message == adopt
    reply = AdoptReply(job, task, status, nonce, text)
    assert c.decode_adopt_reply(encode(MsgType.ADOPT_REPLY, reply, KEY, ts_ns=ts), nonce,
                                now=ts) == (0, reply)


def test_a_peercred_adopt_and_its_reply_carry_the_flag_and_the_public_key(c: C) -> None:
    """Given the EXEC stage from an ssh session's own process (no key: PEERCRED), then C
    encodes it with the flag and the public key, Python reads it as peer-credentialed, and
    C accepts only a reply in kind: a reply without the flag, or with the secret key's
    MAC, is refused."""
    ts = 1_700_000_000_000_000_000
    adopt = Adopt(42, 1, 4242, 1001, AdoptStage.EXEC, "127.0.0.1 1 127.0.0.1 22")
    frame = c.encode_adopt(adopt, nonce=bytes(16), ts=ts, peercred=True)
    assert isinstance(frame, bytes)
    got = decode(frame, PUBLIC_KEY, now_ns=ts, peercred=True)
    assert got.peercred and got.message == adopt
    reply = AdoptReply(42, 1, AckStatus.OK, bytes(16), "\nJOB_ID=42")
    in_kind = encode(MsgType.ADOPT_REPLY, reply, PUBLIC_KEY, ts_ns=ts, flags=PEERCRED)
    assert c.decode_adopt_reply(in_kind, bytes(16), now=ts, peercred=True) == (0, reply)
    plain = encode(MsgType.ADOPT_REPLY, reply, PUBLIC_KEY, ts_ns=ts)
    assert c.decode_adopt_reply(plain, bytes(16), now=ts, peercred=True)[0] == \
        c.lib.GECO_E_FLAGS
    forged = bytearray(in_kind)
    forged[-1] ^= 1
    assert c.decode_adopt_reply(bytes(forged), bytes(16), now=ts, peercred=True)[0] == \
        c.lib.GECO_E_MAC


@given(u64, u64, st.sampled_from(list(AckStatus)), nonces, nonces, int64)
def test_c_decodes_what_python_encodes(c: C, job: int, task: int, status: AckStatus,
                                       request: bytes, nonce: bytes, ts: int) -> None:
    ack = Ack(job, task, status, request)
    frame = encode(MsgType.ACK, ack, KEY, nonce=nonce, ts_ns=ts)
    assert c.decode_ack(frame, request, now=ts) == (0, ack)
    assert c.encode_ack(job, task, status, request, nonce=nonce, ts=ts) == frame


def test_c_draws_a_random_nonce_and_reads_the_clock_when_asked(c: C) -> None:
    """Given nonce NULL and timestamp 0, then C draws 16 random bytes and stamps the current
    CLOCK_REALTIME: two frames differ, Python accepts both at its own clock, and
    geco_frame_nonce points at bytes 12..27."""
    before = time.time_ns()
    a = c.encode_job_started(1, 1, 1, 1, nonce=None, ts=0)
    b = c.encode_job_started(1, 1, 1, 1, nonce=None, ts=0)
    after = time.time_ns()
    assert isinstance(a, bytes) and isinstance(b, bytes)
    fa, fb = decode(a, KEY), decode(b, KEY)
    assert fa.nonce != fb.nonce
    assert before <= fa.timestamp_ns <= fb.timestamp_ns <= after
    buf = c.ffi.from_buffer("uint8_t[]", a)
    assert bytes(c.ffi.buffer(c.lib.geco_frame_nonce(buf), 16)) == fa.nonce


def test_c_decode_with_now_zero_reads_the_clock(c: C) -> None:
    request = bytes(range(16))
    fresh = encode(MsgType.ACK, Ack(1, 2, AckStatus.BUSY, request), KEY)
    old = encode(MsgType.ACK, Ack(1, 2, AckStatus.BUSY, request), KEY,
                 ts_ns=time.time_ns() - 2 * SKEW_NS)
    assert c.decode_ack(fresh, request, now=0)[0] == 0
    assert c.decode_ack(old, request, now=0)[0] == c.lib.GECO_E_STALE


@pytest.mark.parametrize(("offset", "ok"), [(0, True), (SKEW_NS, True), (-SKEW_NS, True),
                                            (SKEW_NS + 1, False), (-SKEW_NS - 1, False)])
def test_c_accepts_exactly_plus_minus_max_skew(c: C, offset: int, ok: bool) -> None:
    v = BY_NAME["ack"]
    rc, _ = c.decode_ack(bytes.fromhex(v["frame"]), bytes.fromhex(BY_NAME["job_started"]["nonce"]),
                         now=v["timestamp_ns"] + offset)
    assert rc == (0 if ok else c.lib.GECO_E_STALE)


@pytest.mark.parametrize(("ts", "now"), [(-(2**63), 2**63 - 1), (2**63 - 1, -(2**63)),
                                         (-(2**63), 1), (2**63 - 1, 1)])
def test_c_extreme_timestamps_are_stale_without_overflow(c: C, ts: int, now: int) -> None:
    """Given timestamps at the ends of int64 (UBSan aborts on signed overflow), then C says
    stale."""
    request = bytes(16)
    frame = encode(MsgType.ACK, Ack(1, 1, AckStatus.OK, request), KEY, ts_ns=ts)
    assert c.decode_ack(frame, request, now=now, skew=SKEW_NS)[0] == c.lib.GECO_E_STALE


def test_c_refuses_another_key_and_a_negative_skew_means_zero(c: C) -> None:
    v = BY_NAME["ack"]
    request = bytes.fromhex(BY_NAME["job_started"]["nonce"])
    frame = bytes.fromhex(v["frame"])
    assert c.decode_ack(frame, request, now=v["timestamp_ns"],
                        key=bytes(32))[0] == c.lib.GECO_E_MAC
    assert c.decode_ack(frame, request, now=v["timestamp_ns"], skew=-5)[0] == 0
    assert c.decode_ack(frame, request, now=v["timestamp_ns"] + 1,
                        skew=-5)[0] == c.lib.GECO_E_STALE


def test_c_encoders_refuse_a_small_buffer_and_a_wrong_type(c: C) -> None:
    """Given a buffer one byte short, then the encoders return GECO_E_SHORT and write
    nothing; a type other than JOB_STARTED/QUARANTINE_SELF is GECO_E_TYPE."""
    assert c.encode_job_started(1, 1, 1, 1, nonce=None, ts=0, cap=83) == c.lib.GECO_E_SHORT
    assert isinstance(c.encode_job_started(1, 1, 1, 1, nonce=None, ts=0, cap=92), bytes)
    assert c.encode_ack(1, 1, 0, bytes(16), nonce=None, ts=0, cap=107) == c.lib.GECO_E_SHORT
    for bad in (0, 2, 3, 4, 5, 7, 255):
        assert c.encode_job_started(bad, 1, 1, 1, nonce=None, ts=0) == c.lib.GECO_E_TYPE


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_c_random_bytes_are_refused_without_crashing(c: C, raw: bytes) -> None:
    rc, _ = c.decode_ack(raw, bytes(16), now=1)
    assert c.lib.GECO_E_NONCE <= rc < 0


# ---------------------------------------------------------------------------
# AddressSanitizer: no read past the frame
# ---------------------------------------------------------------------------

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "geco_proto.h"

/* stdin: records of u32 length (LE), then the bytes; stdout: one return code per record.
   Each frame lives in a heap block of exactly its length, so ASan sees any overread. */
int main(void)
{
    static const uint8_t key[32] = {0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,
                                    22,23,24,25,26,27,28,29,30,31};
    uint8_t request[16] = {0xa0,0xa1,0xa2,0xa3,0xa4,0xa5,0xa6,0xa7,0xa8,0xa9,0xaa,0xab,0xac,
                           0xad,0xae,0xaf};
    unsigned char hdr[4];
    if (geco_proto_init() != 0)
        return 2;
    while (fread(hdr, 1, 4, stdin) == 4) {
        size_t len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16
                     | (size_t)hdr[3] << 24;
        uint8_t *buf = malloc(len ? len : 1);
        if (buf == NULL || fread(buf, 1, len, stdin) != len)
            return 3;
        geco_ack_t out;
        printf("%d\n", geco_decode_ack(buf, len, key, request, 1700000000124956789LL,
                                       30000000000LL, &out));
        free(buf);
    }
    return 0;
}
"""


def test_c_decoder_never_reads_past_the_frame_under_asan(tmp_path: Path) -> None:
    """Given every prefix of every vector, each vector with a byte appended, and random
    buffers, each in a heap block of exactly its size, when decoded by an AddressSanitizer
    build, then no overread is reported and the vectors give their expected codes."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the preload; install build-essential")
    src = tmp_path / "harness.c"
    src.write_text(HARNESS)
    exe = tmp_path / "harness"
    subprocess.run(["gcc", "-std=c11", "-g", "-O1", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", f"-I{LIBGECO}", str(src), str(SOURCE),
                    "-lsodium", "-o", str(exe)], check=True, capture_output=True, text=True)
    rng = random.Random(20240601)
    frames = [bytes.fromhex(v["frame"]) for v in VECTORS["vectors"]]
    frames += [bytes.fromhex(n["frame"]) for n in VECTORS["negative"]]
    inputs: list[bytes] = []
    for frame in frames:
        inputs += [frame[:i] for i in range(len(frame) + 1)] + [frame + b"\0"]
    inputs += [rng.randbytes(rng.randrange(0, 300)) for _ in range(2000)]
    inputs += [b"GECQ\x01\x02\x00\x00" + struct.pack("<I", n)
               + rng.randbytes(rng.randrange(56, 200)) for n in (0, 40, 4096, 4097, 2**32 - 1)]
    stdin = b"".join(struct.pack("<I", len(i)) + i for i in inputs)
    proc = subprocess.run([str(exe)], input=stdin, capture_output=True, timeout=120,
                          env={"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    codes = [int(line) for line in proc.stdout.split()]
    assert len(codes) == len(inputs)
    ack = bytes.fromhex(BY_NAME["ack"]["frame"])
    assert codes[inputs.index(ack)] == 0
    assert all(rc in range(-10, 1) for rc in codes)
