"""Write tests/vectors/wire.json and section 9 of docs/wire-format.md.

Run from the repo root after a change to the vectors (``--check`` only compares and
exits 1 when a file would change)::

    /opt/geco-dev/venv/bin/python -m tests.vectors.make_vectors [--check]

The frames are built here with ``struct`` and ``hashlib.blake2b`` straight
from the layout in docs/wire-format.md section 2, independently of
geco/wire/ and libgeco/geco_proto.c; only the error *texts* of the negative
vectors come from geco.wire.frame (they are what its decoder says).
Sections 1 to 8 of the document are prose and are kept as they are; section 9
is rewritten from the JSON, so the two cannot drift
(tests/unit/test_protocol.py checks that too).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JSON_PATH = REPO / "tests" / "vectors" / "wire.json"
DOC_PATH = REPO / "docs" / "wire-format.md"
SECTION = "## 9. Test vectors\n"

KEY = bytes(range(32))
PUBLIC_KEY = bytes(32)  # the key of PEERCRED frames
PEERCRED = 0x0001
TS = 1_700_000_000_123_456_789
TS_ACK = TS + 1_500_000
SKEW_NS = 30_000_000_000
TYPE_NAMES = {1: "JOB_STARTED", 2: "ACK", 3: "STATUS", 4: "STATUS_REPLY", 5: "ADOPT",
              6: "QUARANTINE_SELF", 7: "ADOPT_REPLY", 8: "HOOK", 9: "STARTER",
              10: "STARTER_REPLY", 11: "PREPARE", 12: "ABORT", 13: "RELEASE",
              14: "NODE_REPLY", 15: "NODE_STATUS", 16: "OOM_REPORT",
              17: "CALLERID"}


PREPARE_RS = (b"GECOResourceSet_v1{li366474,li1,lf0,b0,lf0,i0,i2,b0,b0,s3:mpi,s5:alice,"
              b"s5:users,s0:,s6:node06{b0,i1,lf0,lf0,s0:,s0:},s6:node07{b1,i1,lf0,lf0,s0:,s0:}}")


def nonce(first: int) -> bytes:
    """16 consecutive byte values from ``first`` (a0 a1 .. af)."""
    return bytes(range(first, first + 16))


N_JS, N_ACK, N_ST, N_SR, N_AD, N_QS = (nonce(b) for b in (0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0))
N_PQS, N_PST, N_PACK, N_AR = nonce(0x10), nonce(0x20), nonce(0x30), nonce(0x40)
N_HK, N_SN, N_SNR = nonce(0x50), nonce(0x60), nonce(0x70)
N_PR, N_AB, N_RL, N_NR = nonce(0x80), nonce(0x90), nonce(0x01), nonce(0x11)
N_NS, N_OR, N_CI = nonce(0x21), nonce(0x31), nonce(0x41)
CALLERID_BODY = b"10.1.0.6 51234 10.1.0.7 22 1001"
OOM_TEXT = (b"geco: on node07, the out-of-memory killer ended process 4242 (python3) of job "
            b"366474.1.\n")
STARTER_ENV = ("/bin/bash", "posix_compliant", "false",
               "/var/spool/gridengine/execd/node07/job_scripts/366474")
STARTER_ARGV = ("/var/spool/gridengine/execd/node07/job_scripts/366474",)
STARTER_REPLY = ("/bin/bash", "2", "bash", STARTER_ARGV[0], "GECO_CPUS=0-3",
                 "SGE_STARTER_SHELL_PATH")


def nul_terminated(words: tuple[str, ...]) -> bytes:
    return b"".join(w.encode() + b"\0" for w in words)
ADOPT_CONNECTION = "127.0.0.1 40022 127.0.0.1 22"
ADOPT_TEXT = "\nJOB_ID=366474\nSGE_TASK_ID=undefined"


def frame(type_: int, payload: bytes, nonce_: bytes, ts: int, *, version: int = 1,
          flags: int = 0, length: int | None = None, magic: bytes = b"GECQ",
          key: bytes | None = None) -> bytes:
    """A frame as section 2 defines it; the MAC key follows the flags unless given."""
    if key is None:
        key = PUBLIC_KEY if flags & PEERCRED else KEY
    n = len(payload) if length is None else length
    body = struct.pack("<4sBBHI16sq", magic, version, type_, flags, n, nonce_, ts) + payload
    return body + hashlib.blake2b(body, key=key, digest_size=32).digest()


def job_started(job: int, task: int, pid: int) -> bytes:
    return struct.pack("<QQII", job, task, pid, 0)


def ack(job: int, task: int, status: int, request: bytes, reserved: int = 0) -> bytes:
    return struct.pack("<QQII16s", job, task, status, reserved, request)


STATUS_DOC: dict[str, Any] = {"jobs": [], "version": 1}
NODE_DOC: dict[str, Any] = {"cpus": "3", "memory": 0, "memory_swap": 0, "mems": "0", "pids": 0,
                            "request": bytes(range(0x80, 0x90)).hex(), "status": "ready"}

# name, type, flags, nonce, timestamp, fields, payload, description (section 9)
POSITIVE: list[tuple[str, int, int, bytes, int, dict[str, Any], bytes, str]] = [
    ("job_started", 1, 0, N_JS, TS, {"job_id": 366474, "task_id": 27, "pid": 28152},
     job_started(366474, 27, 28152),
     "JOB_STARTED: the preload in the process about to exec `sge_shepherd` asks for itself."),
    ("ack", 2, 0, N_ACK, TS_ACK,
     {"job_id": 366474, "task_id": 27, "status": 0, "request_nonce": N_JS.hex()},
     ack(366474, 27, 0, N_JS),
     "ACK: gecod's answer to the JOB_STARTED vector (status 0 = OK), bound to its nonce."),
    ("status", 3, 0, N_ST, TS + 2_000_000_000, {}, b"", "STATUS: an empty request."),
    ("status_reply", 4, 0, N_SR, TS + 2_000_250_000, {"document": STATUS_DOC},
     json.dumps(STATUS_DOC, separators=(",", ":"), sort_keys=True).encode(),
     "STATUS_REPLY: a (minimal) JSON document, compact, keys sorted."),
    ("adopt", 5, 0, N_AD, TS + 3_000_000_000,
     {"job_id": 0, "task_id": 0, "pid": 4242, "uid": 1001, "stage": 2,
      "connection": ADOPT_CONNECTION},
     struct.pack("<QQIIII", 0, 0, 4242, 1001, 2, 0) + ADOPT_CONNECTION.encode(),
     "ADOPT: sshd's root process 4242 opens the session of uid 1001 (stage 2) and asks to "
     "join a job of theirs (job_id 0: gecod chooses), for a connection from this node."),
    ("adopt_reply", 7, 0, N_AR, TS + 3_002_000_000,
     {"job_id": 366474, "task_id": 1, "status": 0, "request_nonce": N_AD.hex(),
      "text": ADOPT_TEXT},
     ack(366474, 1, 0, N_AD) + ADOPT_TEXT.encode(),
     "ADOPT_REPLY: gecod's answer to the ADOPT vector (OK: moved into job 366474.1), with "
     "no line for the user and the session's environment."),
    ("quarantine_self", 6, 0, N_QS, TS + 4_000_000_000,
     {"job_id": 366474, "task_id": 27, "pid": 28160}, job_started(366474, 27, 28160),
     "QUARANTINE_SELF: the starter (pid 28160) of job 366474.27 asks to be moved."),
    ("peercred_quarantine_self", 6, PEERCRED, N_PQS, TS + 5_000_000_000,
     {"job_id": 366474, "task_id": 27, "pid": 28160}, job_started(366474, 27, 28160),
     "QUARANTINE_SELF, peer-credentialed: the same starter, running as the job owner "
     "without the secret key, asks on the Unix socket (flag PEERCRED, MAC keyed with the "
     "public key of 32 zero bytes)."),
    ("peercred_ack", 2, PEERCRED, N_PACK, TS + 5_001_500_000,
     {"job_id": 366474, "task_id": 27, "status": 0, "request_nonce": N_PQS.hex()},
     ack(366474, 27, 0, N_PQS),
     "ACK, peer-credentialed: gecod's answer (OK) to the PEERCRED QUARANTINE_SELF vector, in "
     "kind, so the starter can check it."),
    ("peercred_status", 3, PEERCRED, N_PST, TS + 6_000_000_000, {}, b"",
     "STATUS, peer-credentialed: `geco status` run by any user."),
    ("hook", 8, 0, N_HK, TS + 7_000_000_000,
     {"job_id": 366474, "task_id": 27, "pid": 28170, "hook": 1},
     struct.pack("<QQII", 366474, 27, 28170, 1),
     "HOOK: the prolog (pid 28170, started by the shepherd of job 366474.27) asks gecod "
     "to do its work (hook 1 = PROLOG); an ACK answers it."),
    ("peercred_starter", 9, PEERCRED, N_SN, TS + 8_000_000_000,
     {"job_id": 366474, "task_id": 27, "pid": 28180, "environ": list(STARTER_ENV),
      "argv": list(STARTER_ARGV)},
     struct.pack("<QQII", 366474, 27, 28180, 1) + nul_terminated(STARTER_ENV + STARTER_ARGV),
     "STARTER, peer-credentialed: the starter_method of job 366474.27 (pid 28180, running as "
     "the job owner) asks how Grid Engine would start its job script: the shell Grid Engine "
     "names for it, its start mode, login shell or not, JOB_SCRIPT, then its arguments."),
    ("peercred_starter_reply", 10, PEERCRED, N_SNR, TS + 8_002_000_000,
     {"job_id": 366474, "task_id": 27, "status": 0, "request_nonce": N_SN.hex(),
      "program": STARTER_REPLY[0], "argv": list(STARTER_REPLY[2:4]),
      "environ": list(STARTER_REPLY[4:])},
     ack(366474, 27, 0, N_SN) + nul_terminated(STARTER_REPLY),
     "STARTER_REPLY: gecod's answer (OK), in kind: run /bin/bash as `bash <script>`, with "
     "GECO_CPUS set and SGE_STARTER_SHELL_PATH removed (the real reply sets every GECO_* "
     "variable and removes all three SGE_STARTER_* ones)."),
    # between gecods, over the cluster channel; MAC'd with the cluster key (here KEY too)
    ("prepare", 11, 0, N_PR, TS + 9_000_000_000,
     {"job_id": 366474, "task_id": 1, "host": "node07", "body": PREPARE_RS.hex()},
     struct.pack("<QQ", 366474, 1) + b"node07\0" + PREPARE_RS,
     "PREPARE: the master host of job 366474.1 asks node07's gecod to make the job's "
     "cgroups for its share of the GECOResourceSet_v1 that follows the host's NUL."),
    ("abort", 12, 0, N_AB, TS + 9_010_000_000,
     {"job_id": 366474, "task_id": 1, "host": "node07", "body": ""},
     struct.pack("<QQ", 366474, 1) + b"node07\0",
     "ABORT: the job cannot start on all its hosts; node07 undoes its PREPARE."),
    ("release", 13, 0, N_RL, TS + 9_020_000_000,
     {"job_id": 366474, "task_id": 1, "host": "node07", "body": ""},
     struct.pack("<QQ", 366474, 1) + b"node07\0",
     "RELEASE: the job ended; node07 tears it down and answers with its figures."),
    ("node_reply", 14, 0, N_NR, TS + 9_000_500_000, {"document": NODE_DOC},
     json.dumps(NODE_DOC, separators=(",", ":"), sort_keys=True).encode(),
     "NODE_REPLY: node07's answer to the PREPARE vector: ready, its cores and limits, and "
     "the nonce of the request it answers."),
    ("node_status", 15, 0, N_NS, TS + 9_030_000_000,
     {"job_id": 366474, "task_id": 1, "host": "node07", "body": ""},
     struct.pack("<QQ", 366474, 1) + b"node07\0",
     "NODE_STATUS: `geco status --job 366474` on another host of the job asks node07 for "
     "its live figures of the job."),
    ("oom_report", 16, 0, N_OR, TS + 9_040_000_000,
     {"job_id": 366474, "task_id": 1, "host": "node06", "body": OOM_TEXT.hex()},
     struct.pack("<QQ", 366474, 1) + b"node06\0" + OOM_TEXT,
     "OOM_REPORT: slave node07 tells the job's master node06 of an out-of-memory kill, in "
     "the words node06 appends to the owner's stderr file."),
    ("callerid", 17, 0, N_CI, TS + 9_050_000_000,
     {"job_id": 366474, "task_id": 1, "host": "node06", "body": CALLERID_BODY.hex()},
     struct.pack("<QQ", 366474, 1) + b"node06\0" + CALLERID_BODY,
     "CALLERID: uid 1001 logs in to node07 by ssh from 10.1.0.6 port 51234; node07 asks "
     "node06 whether a process of that user in job 366474.1 there made the connection."),
]

VECTOR_PREFIX = "geco wire format (protocol 1) test vectors; see docs/wire-format.md. "
DESCRIPTION = (
    VECTOR_PREFIX + "Byte strings are lowercase hex; frames are whole frames (header, payload, "
    "MAC). Negative vectors are decoded as the reply to a request whose nonce is request_nonce "
    "(C geco_decode_ack, Python decode_ack) at now_ns with max_skew_ns; reason is "
    "ProtocolError.reason, c_error the C return code, message the Python error text; "
    "decode_reason is what the generic Python decode() says (null: accepted).")


def positive_vectors() -> list[dict[str, Any]]:
    out = []
    for name, type_, flags, nonce_, ts, fields, payload, _ in POSITIVE:
        out.append({"name": name, "type": type_, "type_name": TYPE_NAMES[type_],
                    "flags": flags, "nonce": nonce_.hex(), "timestamp_ns": ts, "fields": fields,
                    "payload": payload.hex(), "frame": frame(type_, payload, nonce_, ts,
                                                             flags=flags).hex()})
    return out


def negative_vectors(vectors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ack_frame = frame(2, ack(366474, 27, 0, N_JS), N_ACK, TS_ACK)
    ack_payload = ack(366474, 27, 0, N_JS)
    bad_mac = bytearray(ack_frame)
    bad_mac[-1] ^= 1
    by_name = {v["name"]: v for v in vectors}

    def neg(name: str, fr: bytes, reason: str, c_error: str, what: str, *, now: int = TS_ACK,
            request_nonce: bytes = N_JS, decode_reason: str | None = "same") -> dict[str, Any]:
        return {"name": name, "what": what, "frame": fr.hex(),
                "request_nonce": request_nonce.hex(), "now_ns": now, "max_skew_ns": SKEW_NS,
                "reason": reason, "c_error": c_error,
                "decode_reason": reason if decode_reason == "same" else decode_reason}

    return [
        neg("bad_mac", bytes(bad_mac), "mac", "GECO_E_MAC",
            "the ack vector with the last MAC byte flipped"),
        neg("stale", ack_frame, "stale", "GECO_E_STALE",
            "the ack vector, received 30 s + 1 ns after its timestamp",
            now=TS_ACK + SKEW_NS + 1),
        neg("stale_future", ack_frame, "stale", "GECO_E_STALE",
            "the ack vector, received 30 s + 1 ns before its timestamp",
            now=TS_ACK - SKEW_NS - 1),
        neg("wrong_version", frame(2, ack_payload, N_ACK, TS_ACK, version=2), "version",
            "GECO_E_VERSION", "the ack vector as protocol 2 (MAC recomputed)"),
        neg("bad_magic", frame(2, ack_payload, N_ACK, TS_ACK, magic=b"GECX"), "magic",
            "GECO_E_MAGIC", "magic GECX (MAC recomputed)"),
        neg("unknown_flag", frame(2, ack_payload, N_ACK, TS_ACK, flags=0x0002), "flags",
            "GECO_E_FLAGS", "the ack vector with flag bit 0x0002 (MAC recomputed)"),
        neg("peercred_reply_to_keyed_request",
            frame(2, ack_payload, N_ACK, TS_ACK, flags=PEERCRED), "flags", "GECO_E_FLAGS",
            "the ack vector as a PEERCRED frame (MAC with the public key), awaited as the "
            "answer to the JOB_STARTED vector, which was MAC'd with the secret key",
            decode_reason=None),
        neg("peercred_job_started",
            frame(1, job_started(366474, 27, 28152), N_JS, TS, flags=PEERCRED), "flags",
            "GECO_E_FLAGS", "the job_started vector as a PEERCRED frame (MAC with the public "
            "key)", now=TS),
        neg("peercred_secret_mac", frame(3, b"", N_PST, TS + 6_000_000_000, flags=PEERCRED,
                                         key=KEY), "flags", "GECO_E_FLAGS",
            "the peercred_status vector with its MAC made with the secret key",
            now=TS + 6_000_000_000,
            decode_reason="mac"),
        neg("short", ack_frame[:67], "short", "GECO_E_SHORT",
            "the first 67 bytes of the ack vector"),
        neg("truncated", ack_frame[:-1], "length", "GECO_E_LENGTH",
            "the ack vector without its last byte"),
        neg("oversized_length", frame(2, b"", N_ACK, TS_ACK, length=4097), "length",
            "GECO_E_LENGTH", "a header announcing a 4097-byte payload, followed by a MAC"),
        neg("unknown_type", frame(99, ack_payload, N_ACK, TS_ACK), "type", "GECO_E_TYPE",
            "the ack payload sent as type 99 (MAC good)"),
        neg("not_an_ack", bytes.fromhex(by_name["job_started"]["frame"]), "type",
            "GECO_E_TYPE", "the job_started vector where an ack is awaited", now=TS,
            decode_reason=None),
        neg("ack_payload_size", frame(2, job_started(366474, 27, 28152), N_ACK, TS_ACK),
            "payload", "GECO_E_PAYLOAD", "an ACK with a 24-byte payload (MAC good)"),
        neg("ack_reserved", frame(2, ack(366474, 27, 0, N_JS, reserved=1), N_ACK, TS_ACK),
            "payload", "GECO_E_PAYLOAD", "an ACK whose reserved field is 1 (MAC good)"),
        neg("ack_unknown_status", frame(2, ack(366474, 27, 9, N_JS), N_ACK, TS_ACK),
            "payload", "GECO_E_PAYLOAD", "an ACK with status 9 (MAC good)"),
        neg("other_request", ack_frame, "nonce", "GECO_E_NONCE",
            "the ack vector, awaited as the answer to a request with nonce 00...00",
            request_nonce=bytes(16), decode_reason=None),
    ]


def add_messages(negatives: list[dict[str, Any]]) -> None:
    """Record what geco.wire.frame.decode_ack says for each negative vector (its full text)."""
    from geco.errors import ProtocolError
    from geco.wire.frame import decode_ack

    key = KEY
    for n in negatives:
        try:
            decode_ack(bytes.fromhex(n["frame"]), key, bytes.fromhex(n["request_nonce"]),
                       now_ns=n["now_ns"], max_skew=n["max_skew_ns"] / 1e9)
        except ProtocolError as exc:
            if exc.reason != n["reason"]:
                raise SystemExit(f"{n['name']}: decode_ack says {exc.reason} ({exc.msg}), "
                                 f"the vector says {n['reason']}") from None
            n["message"] = exc.msg
        else:
            raise SystemExit(f"{n['name']}: decode_ack accepted a negative vector")


def vectors_document() -> dict[str, Any]:
    vectors = positive_vectors()
    negatives = negative_vectors(vectors)
    add_messages(negatives)
    return {"description": DESCRIPTION, "protocol_version": 1, "key": KEY.hex(),
            "vectors": vectors, "negative": negatives}


# -- section 9 of the document ------------------------------------------------------


def hexblock(name: str, h: str) -> str:
    lines = [h[i:i + 64] for i in range(0, len(h), 64)] or [""]
    return f"```hex {name}\n" + "\n".join(lines) + "\n```\n"


def para(text: str) -> str:
    return textwrap.fill(text, 100, break_on_hyphens=False, break_long_words=False) + "\n\n"


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        return f"`{json.dumps(value, separators=(',', ':'), sort_keys=True)}`"
    return f"`{value}`" if isinstance(value, str) else str(value)


def section_9(d: dict[str, Any]) -> str:
    by_name = {v["name"]: v for v in d["vectors"]}
    out: list[str] = []
    w = out.append
    w(SECTION + "\n")
    w(para("The same vectors, machine-readable, are in `tests/vectors/wire.json`; "
           "`tests/unit/test_protocol.py` checks that every hex block of this section equals "
           "the JSON (so this document cannot drift), that Python encodes and decodes every "
           "vector, and `tests/unit/test_proto_c.py` that the C code does the same. A test also "
           "rebuilds each frame from its inputs with `struct` and `hashlib.blake2b` (an "
           "implementation independent of both)."))
    w(para("Hex is lowercase, two digits per byte, wrapped at 32 bytes per line; integers in "
           "the tables are decimal. Every vector uses this key:"))
    w(hexblock("key", d["key"]))
    w("\n### 9.1 JOB_STARTED, byte by byte\n\n")
    js = bytes.fromhex(by_name["job_started"]["frame"])
    rows = [(0, 4, "magic", '"GECQ"'), (4, 1, "version", "1"),
            (5, 1, "type", "1 (JOB_STARTED)"), (6, 2, "flags", "0"),
            (8, 4, "payload length", "24"), (12, 16, "nonce", "a0 .. af"),
            (28, 8, "timestamp_ns", str(by_name["job_started"]["timestamp_ns"])),
            (36, 8, "job_id", "366474"), (44, 8, "task_id", "27"), (52, 4, "pid", "28152"),
            (56, 4, "reserved", "0"), (60, 32, "MAC", "BLAKE2b-256(key, bytes 0..59)")]
    w("| offset | size | field | value | bytes (hex) |\n|---:|---:|---|---|---|\n")
    for off, size, field, val in rows:
        w(f"| {off} | {size} | {field} | {val} | `{js[off:off + size].hex()}` |\n")
    w("\n")
    descriptions = {p[0]: p[7] for p in POSITIVE}
    number = 2
    for v in d["vectors"]:
        title = v["type_name"] + (" (PEERCRED)" if v["flags"] else "")
        w(f"### 9.{number} {title}\n\n{descriptions[v['name']]}\n\n")
        w("| input | value |\n|---|---|\n")
        w(f"| type | {v['type']} ({v['type_name']}) |\n")
        if v["flags"]:
            w(f"| flags | {v['flags']} (PEERCRED): the MAC key is the public key, 32 zero "
              "bytes |\n")
        w(f"| nonce | `{v['nonce']}` |\n| timestamp_ns | {v['timestamp_ns']} |\n")
        for k, val in v["fields"].items():
            w(f"| {k} | {_cell(val)} |\n")
        w(f"| payload ({len(v['payload']) // 2} bytes) | `{v['payload'] or '(none)'}` |\n\n"
          "Frame:\n\n")
        w(hexblock(v["name"], v["frame"]))
        w("\n")
        number += 1
    w(f"### 9.{number} Negative vectors\n\n")
    w(para("Each frame is decoded as the reply awaited for a request (C `geco_decode_ack`, "
           "Python `decode_ack`) with max_skew 30 s, the request nonce `a0a1…af` of the "
           "JOB_STARTED vector (except where noted) and `now_ns` = the ACK vector's timestamp "
           f"({by_name['ack']['timestamp_ns']}) unless noted. *decode()* is what the generic "
           "receiver (gecod) says for the same frame."))
    w("| name | frame | now_ns | reason | C error | decode() |\n|---|---|---|---|---|---|\n")
    for n in d["negative"]:
        now = "ack ts" if n["now_ns"] == by_name["ack"]["timestamp_ns"] else str(n["now_ns"])
        what = n["what"]
        if n["request_nonce"] != by_name["job_started"]["nonce"]:
            what += f" (request nonce `{n['request_nonce']}`)"
        w(f"| {n['name']} | {what} | {now} | `{n['reason']}` | `{n['c_error']}` | "
          f"{n['decode_reason'] or 'accepted'} |\n")
    w("\nThe Python error message of each (`str(ProtocolError)` appends ` (reason=...)`):\n\n")
    for n in d["negative"]:
        w(f"- **{n['name']}**: {n['message']}\n")
    w("\nThe frames:\n\n")
    for n in d["negative"]:
        w(hexblock(f"negative:{n['name']}", n["frame"]))
        w("\n")
    return "".join(out).rstrip("\n") + "\n"


def render() -> tuple[str, str]:
    """Return the new texts of wire.json and docs/wire-format.md."""
    d = vectors_document()
    head, found, _ = DOC_PATH.read_text().partition(SECTION)
    if not found:
        raise SystemExit(f"{DOC_PATH} has no line {SECTION.strip()!r}: where does section 9 go?")
    return json.dumps(d, indent=2) + "\n", head + section_9(d)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 when a file is not what this script writes")
    args = parser.parse_args(argv)
    stale = []
    for path, text in zip((JSON_PATH, DOC_PATH), render(), strict=True):
        if path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    for path in stale:
        print(f"{path.relative_to(REPO)}: {'out of date' if args.check else 'rewritten'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
