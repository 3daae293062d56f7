"""The quarantine wire format between the preload, gecod and the CLI (protocol 1).

Every frame is a fixed 36-byte header, a payload of at most 4096 bytes and a
32-byte MAC (keyed BLAKE2b-256 over header and payload). The byte-by-byte
layout, the receiver's check order, the replay rules and test vectors are in
``docs/wire-format.md``; ``preload/geco_proto.c`` is the C twin of this module,
and both are held to the same vectors (``tests/vectors/quarantine.json``).

Unlike the original GECO (static key compiled into a world-readable library,
no nonce or timestamp, native byte order), a frame here is bound to a secret
key file, to a random nonce and to the sender's clock, so a recorded frame
cannot be replayed and a forged one is refused before anything is trusted.

Users without the key (the job owner's starter, ``geco status``) send
*peer-credentialed* frames instead: flag :data:`PEERCRED`, MAC keyed with the
public all-zero :data:`PUBLIC_KEY` (integrity only). Such a frame claims
nothing the kernel does not vouch for: gecod accepts it only on its Unix
socket, where SO_PEERCRED names the sender, and only for STATUS and
QUARANTINE_SELF (and answers in kind). The flag, not the caller, decides the
MAC key on both sides.

Typical use::

    frame = protocol.encode(MsgType.JOB_STARTED, JobStarted(42, 1, pid), key)
    ...
    got = protocol.decode(raw, key, replay=cache)   # raises ProtocolError
    match got.message: ...

    # without the key (a user): the kernel vouches for the sender instead
    frame = protocol.encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED)
"""

from __future__ import annotations

import enum
import hmac
import json
import os
import re
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

from geco.errors import ProtocolError

__all__ = [
    "AFTER_MAC",
    "CLUSTER_MAX_PAYLOAD",
    "HEADER_BYTES",
    "KEY_BYTES",
    "MAC_BYTES",
    "MAGIC",
    "MAX_FRAME",
    "MAX_PAYLOAD",
    "NODE_REQUESTS",
    "NONCE_BYTES",
    "PEERCRED",
    "PEERCRED_TYPES",
    "PUBLIC_KEY",
    "STARTER_ENVIRON",
    "VERSION",
    "Ack",
    "AckStatus",
    "Adopt",
    "AdoptReply",
    "AdoptStage",
    "Frame",
    "Header",
    "Hook",
    "HookName",
    "JobStarted",
    "Message",
    "MsgType",
    "NodeRequest",
    "Replay",
    "ReplayCache",
    "Starter",
    "StarterReply",
    "StatusReply",
    "ack_for_error",
    "claimed",
    "claims_peercred",
    "decode",
    "decode_ack",
    "encode",
    "expected_length",
    "read_frame",
]

MAGIC = b"GECQ"
VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 16
HEADER_BYTES = 36
MAC_BYTES = 32
MAX_PAYLOAD = 4096
MAX_FRAME = HEADER_BYTES + MAX_PAYLOAD + MAC_BYTES
# The cluster channel's cap: a PREPARE carries the whole job's resource set (a host costs
# ~50 bytes of it), so jobs of thousands of hosts fit.
CLUSTER_MAX_PAYLOAD = 256 * 1024
# Flag bit: a peer-credentialed frame (MAC'd with PUBLIC_KEY; the kernel names the sender).
PEERCRED = 0x0001
# The MAC key of PEERCRED frames: public, so their MAC proves integrity, not who sent them.
PUBLIC_KEY = bytes(KEY_BYTES)

# magic, version, type, flags, payload length, nonce, timestamp (int64 ns)
_HEADER = struct.Struct("<4sBBHI16sq")
assert _HEADER.size == HEADER_BYTES


class MsgType(enum.IntEnum):
    """Message types (byte 5 of the header)."""

    JOB_STARTED = 1
    ACK = 2
    STATUS = 3
    STATUS_REPLY = 4
    ADOPT = 5
    QUARANTINE_SELF = 6
    ADOPT_REPLY = 7
    HOOK = 8
    STARTER = 9
    STARTER_REPLY = 10
    # one gecod to another over the cluster channel (geco.wire.cluster), MAC'd with the cluster key
    PREPARE = 11
    ABORT = 12
    RELEASE = 13
    NODE_REPLY = 14
    NODE_STATUS = 15
    OOM_REPORT = 16
    CALLERID = 17

# The cluster channel's requests (answered with NODE_REPLY).
NODE_REQUESTS = frozenset({MsgType.PREPARE, MsgType.ABORT, MsgType.RELEASE,
                           MsgType.NODE_STATUS, MsgType.OOM_REPORT, MsgType.CALLERID})


# What may carry PEERCRED: the requests any local user may make (ADOPT only at its EXEC
# stage, gecod checks), and gecod's replies. JOB_STARTED never: it is the privileged path,
# MAC'd with the secret key.
PEERCRED_TYPES = frozenset({MsgType.STATUS, MsgType.QUARANTINE_SELF, MsgType.ADOPT,
                            MsgType.STARTER, MsgType.ACK, MsgType.STATUS_REPLY,
                            MsgType.ADOPT_REPLY, MsgType.STARTER_REPLY})
_PEERCRED_REQUESTS = "STATUS, QUARANTINE_SELF, ADOPT and STARTER"


class AckStatus(enum.IntEnum):
    """The ``status`` of an ACK: what gecod did with the request."""

    OK = 0  # the pid is in the job's cgroups
    REFUSED = 1  # policy or credentials
    NO_SUCH_JOB = 2
    FAILED = 3  # cgroup or qstat error
    BAD_REQUEST = 4
    VERSION = 5  # the request's protocol version is not spoken here
    BUSY = 6
    REQUEUE = 7  # a HOOK: gecod did the prolog's work and the job must be re-queued (exit 99)


def _payload_error(msg: str, **fields: object) -> ProtocolError:
    return ProtocolError(msg, reason="payload", **fields)


@dataclass(frozen=True, slots=True)
class JobStarted:
    """Payload of JOB_STARTED and QUARANTINE_SELF: "put ``pid`` into ``job_id.task_id``".

    Wire: u64 job_id, u64 task_id, u32 pid, u32 reserved (0); 24 bytes.
    """

    job_id: int
    task_id: int
    pid: int

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.JOB_STARTED, MsgType.QUARANTINE_SELF)
    _S: ClassVar[struct.Struct] = struct.Struct("<QQII")

    def pack(self) -> bytes:
        """Return the 24 payload bytes (struct.error when a field does not fit its integer)."""
        return self._S.pack(self.job_id, self.task_id, self.pid, 0)

    @classmethod
    def unpack(cls, payload: bytes) -> JobStarted:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        _check_size("JOB_STARTED", payload, cls._S.size)
        job_id, task_id, pid, reserved = cls._S.unpack(payload)
        _check_reserved("JOB_STARTED", reserved)
        return cls(job_id, task_id, pid)


class HookName(enum.IntEnum):
    """Which Grid Engine hook a HOOK request runs in gecod."""

    PROLOG = 1
    EPILOG = 2


@dataclass(frozen=True, slots=True)
class Hook:
    """Payload of HOOK (root's hook program): "do ``hook``'s work for ``job_id.task_id``;
    I am ``pid``, the hook process the job's shepherd started". Answered with an ACK:
    OK when done, anything else when the hook must do it itself.

    Wire: u64 job_id, u64 task_id, u32 pid, u32 hook (:class:`HookName`); 24 bytes.
    """

    job_id: int
    task_id: int
    pid: int
    hook: HookName

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.HOOK,)
    _S: ClassVar[struct.Struct] = struct.Struct("<QQII")

    def pack(self) -> bytes:
        """Return the 24 payload bytes."""
        return self._S.pack(self.job_id, self.task_id, self.pid, self.hook)

    @classmethod
    def unpack(cls, payload: bytes) -> Hook:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        _check_size("HOOK", payload, cls._S.size)
        job_id, task_id, pid, hook = cls._S.unpack(payload)
        if hook not in tuple(HookName):
            raise _payload_error(f"a HOOK's hook must be 1 (PROLOG) or 2 (EPILOG), got {hook}")
        return cls(job_id, task_id, pid, HookName(hook))


@dataclass(frozen=True, slots=True)
class Ack:
    """Payload of ACK: gecod's answer to the request whose nonce is ``request_nonce``.

    Wire: u64 job_id, u64 task_id, u32 status, u32 reserved (0), 16 bytes request
    nonce; 40 bytes.
    """

    job_id: int
    task_id: int
    status: AckStatus
    request_nonce: bytes

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.ACK,)
    _S: ClassVar[struct.Struct] = struct.Struct("<QQII16s")

    def pack(self) -> bytes:
        """Return the 40 payload bytes."""
        if len(self.request_nonce) != NONCE_BYTES:
            raise ValueError(f"request_nonce must be {NONCE_BYTES} bytes, "
                             f"got {len(self.request_nonce)}")
        return self._S.pack(self.job_id, self.task_id, self.status, 0, self.request_nonce)

    @classmethod
    def unpack(cls, payload: bytes) -> Ack:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        _check_size("ACK", payload, cls._S.size)
        job_id, task_id, status, reserved, nonce = cls._S.unpack(payload)
        _check_reserved("ACK", reserved)
        try:
            status = AckStatus(status)
        except ValueError:
            raise _payload_error(f"an ACK status must be 0..{max(AckStatus)}, "
                                 f"got {status}") from None
        return cls(job_id, task_id, status, nonce)


class AdoptStage(enum.IntEnum):
    """What an ADOPT asks for: PAM's account check, the session's move as well, or (from
    an ssh session's own process, peer-credentialed) its move before it runs anything."""

    ACCOUNT = 1  # may this uid log in here, and into which job
    SESSION = 2  # the same, and move the sender into that job
    EXEC = 3  # the preload in sshd: move the sender (its JOB_ID's job, or gecod's choice)


ADOPT_MAX_CONNECTION = 255
REPLY_MAX_TEXT = 2048


@dataclass(frozen=True, slots=True)
class Adopt:
    """Payload of ADOPT (sshd's PAM module): "may ``uid`` log in, into which job".

    Wire: u64 job_id, u64 task_id (0, 0: gecod chooses), u32 pid (the sender, sshd's root
    process for the connection), u32 uid, u32 stage (:class:`AdoptStage`), u32 reserved
    (0), then the connection's ``SSH_CONNECTION`` text (printable ASCII, at most 255
    bytes); 32 to 287 bytes.
    """

    job_id: int
    task_id: int
    pid: int
    uid: int
    stage: AdoptStage
    connection: str = ""

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.ADOPT,)
    _S: ClassVar[struct.Struct] = struct.Struct("<QQIIII")

    def pack(self) -> bytes:
        """Return the payload bytes (ValueError when the connection is not short ASCII)."""
        text = self.connection.encode("ascii")
        if len(text) > ADOPT_MAX_CONNECTION:
            raise ValueError(f"an ADOPT connection is at most {ADOPT_MAX_CONNECTION} bytes")
        return self._S.pack(self.job_id, self.task_id, self.pid, self.uid, self.stage, 0) + text

    @classmethod
    def unpack(cls, payload: bytes) -> Adopt:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        fixed = cls._S.size
        _check_size_range("ADOPT", payload, fixed, fixed + ADOPT_MAX_CONNECTION)
        job_id, task_id, pid, uid, stage, reserved = cls._S.unpack_from(payload)
        _check_reserved("ADOPT", reserved)
        if stage not in tuple(AdoptStage):
            raise _payload_error(f"an ADOPT stage must be 1, 2 or 3, got {stage}")
        text = payload[fixed:]
        if not all(0x20 <= c < 0x7F for c in text):
            raise _payload_error("an ADOPT connection must be printable ASCII")
        return cls(job_id, task_id, pid, uid, AdoptStage(stage), text.decode("ascii"))


@dataclass(frozen=True, slots=True)
class AdoptReply:
    """Payload of ADOPT_REPLY: an ACK's 40 bytes, then UTF-8 text (at most 2048 bytes, no
    NUL): a line for the user (may be empty), then the session's ``NAME=value`` lines."""

    job_id: int
    task_id: int
    status: AckStatus
    request_nonce: bytes
    text: str = ""

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.ADOPT_REPLY,)

    def pack(self) -> bytes:
        """Return the payload bytes (ValueError when the text is too long or has a NUL)."""
        text = self.text.encode()
        if len(text) > REPLY_MAX_TEXT or b"\0" in text:
            raise ValueError(f"an ADOPT_REPLY text is at most {REPLY_MAX_TEXT} bytes, no NUL")
        return Ack(self.job_id, self.task_id, self.status, self.request_nonce).pack() + text

    @classmethod
    def unpack(cls, payload: bytes) -> AdoptReply:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        fixed = Ack._S.size
        _check_size_range("ADOPT_REPLY", payload, fixed, fixed + REPLY_MAX_TEXT)
        ack = Ack.unpack(payload[:fixed])
        try:
            text = payload[fixed:].decode()
        except UnicodeDecodeError:
            raise _payload_error("an ADOPT_REPLY text must be UTF-8") from None
        if "\0" in text:
            raise _payload_error("an ADOPT_REPLY text must not hold a NUL")
        return cls(ack.job_id, ack.task_id, ack.status, ack.request_nonce, text)


# What a STARTER carries of the starter's environment, in this order: what Grid Engine
# tells a starter_method about the job's shell, and JOB_SCRIPT ("QRSH" for qrsh).
STARTER_ENVIRON = ("SGE_STARTER_SHELL_PATH", "SGE_STARTER_SHELL_START_MODE",
                   "SGE_STARTER_USE_LOGIN_SHELL", "JOB_SCRIPT")


def _strings(name: str, data: bytes, count: int | None = None) -> list[str]:
    """NUL-terminated strings (exactly ``count`` when given), as the kernel keeps argv."""
    if data and not data.endswith(b"\0"):
        raise _payload_error(f"the {name} strings must each end with a NUL")
    words = [w.decode("utf-8", "surrogateescape") for w in data.split(b"\0")[:-1]]
    if count is not None and len(words) != count:
        raise _payload_error(f"the {name} payload must hold {count} strings, got {len(words)}")
    return words


def _nul_terminated(words: tuple[str, ...]) -> bytes:
    data = [w.encode("utf-8", "surrogateescape") for w in words]
    if any(b"\0" in w for w in data):
        raise ValueError("a string of a STARTER or STARTER_REPLY must not hold a NUL")
    return b"".join(w + b"\0" for w in data)


@dataclass(frozen=True, slots=True)
class Starter:
    """Payload of STARTER (the job owner's starter_method, peer-credentialed): "I am ``pid``
    of job ``job_id.task_id``, to start ``argv``: how would Grid Engine start it?".

    Wire: u64 job_id, u64 task_id, u32 pid, u32 argc, then NUL-terminated strings: the
    values of :data:`STARTER_ENVIRON` ("" when unset), then ``argc`` arguments.
    """

    job_id: int
    task_id: int
    pid: int
    environ: tuple[str, ...]
    argv: tuple[str, ...]

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.STARTER,)
    _S: ClassVar[struct.Struct] = struct.Struct("<QQII")

    def pack(self) -> bytes:
        """Return the payload bytes (ValueError when a string holds a NUL or it is too big)."""
        if len(self.environ) != len(STARTER_ENVIRON):
            raise ValueError(f"a STARTER carries {len(STARTER_ENVIRON)} environment values")
        data = (self._S.pack(self.job_id, self.task_id, self.pid, len(self.argv))
                + _nul_terminated(self.environ + self.argv))
        if len(data) > MAX_PAYLOAD:
            raise ValueError(f"a STARTER payload is at most {MAX_PAYLOAD} bytes")
        return data

    @classmethod
    def unpack(cls, payload: bytes) -> Starter:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        fixed = cls._S.size
        _check_size_range("STARTER", payload, fixed, MAX_PAYLOAD)
        job_id, task_id, pid, argc = cls._S.unpack_from(payload)
        words = _strings("STARTER", payload[fixed:], len(STARTER_ENVIRON) + argc)
        n = len(STARTER_ENVIRON)
        return cls(job_id, task_id, pid, tuple(words[:n]), tuple(words[n:]))


@dataclass(frozen=True, slots=True)
class StarterReply:
    """Payload of STARTER_REPLY: an ACK's 40 bytes, then (status OK) NUL-terminated strings:
    the program, the number of arguments, the arguments, then the environment's changes,
    ``NAME=value`` to set and ``NAME`` to remove."""

    job_id: int
    task_id: int
    status: AckStatus
    request_nonce: bytes
    program: str = ""
    argv: tuple[str, ...] = ()
    environ: tuple[str, ...] = ()

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.STARTER_REPLY,)

    def pack(self) -> bytes:
        """Return the payload bytes (ValueError when a string holds a NUL or it is too big)."""
        ack = Ack(self.job_id, self.task_id, self.status, self.request_nonce).pack()
        if self.status is not AckStatus.OK:
            return ack
        data = ack + _nul_terminated((self.program, str(len(self.argv)), *self.argv,
                                      *self.environ))
        if len(data) > MAX_PAYLOAD:
            raise ValueError(f"a STARTER_REPLY payload is at most {MAX_PAYLOAD} bytes")
        return data

    @classmethod
    def unpack(cls, payload: bytes) -> StarterReply:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        fixed = Ack._S.size
        _check_size_range("STARTER_REPLY", payload, fixed, MAX_PAYLOAD)
        ack = Ack.unpack(payload[:fixed])
        words = _strings("STARTER_REPLY", payload[fixed:])
        if ack.status is not AckStatus.OK or not words:
            if words:
                raise _payload_error("a STARTER_REPLY that is not OK carries no strings")
            return cls(ack.job_id, ack.task_id, ack.status, ack.request_nonce)
        if len(words) < 2 or not words[1].isdigit() or int(words[1]) > len(words) - 2:
            raise _payload_error("a STARTER_REPLY must give the program and its argument count")
        argc = int(words[1])
        return cls(ack.job_id, ack.task_id, ack.status, ack.request_nonce, words[0],
                   tuple(words[2:2 + argc]), tuple(words[2 + argc:]))


HOST_MAX = 255
_HOST_NAME = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True, slots=True)
class NodeRequest:
    """Payload of the cluster channel's requests, from one gecod of a job's hosts to another:
    make (PREPARE), undo (ABORT), end (RELEASE) or show (NODE_STATUS) ``job_id.task_id`` on
    ``host``, tell the job's owner there about an OOM kill elsewhere (OOM_REPORT, a slave
    to the master), or say whether a process of the job there made an ssh connection
    (CALLERID, from the host the connection reached).

    ``host`` binds the request to the one node it is for (a frame recorded for one host is
    refused by every other); ``body`` is the job's ``GECOResourceSet_v1`` text (PREPARE),
    the owner's UTF-8 text (OOM_REPORT), ``<src> <sport> <dst> <dport> <uid>`` in ASCII
    (CALLERID: the connection as ``SSH_CONNECTION`` names it, and the user), else empty.

    Wire: u64 job_id, u64 task_id, the host name (1 to 255 bytes of ``[A-Za-z0-9._-]``)
    and a NUL, then the body; at most :data:`CLUSTER_MAX_PAYLOAD` bytes.
    """

    job_id: int
    task_id: int
    host: str
    body: bytes = b""

    TYPES: ClassVar[tuple[MsgType, ...]] = tuple(sorted(NODE_REQUESTS))
    _S: ClassVar[struct.Struct] = struct.Struct("<QQ")

    def pack(self) -> bytes:
        """Return the payload bytes (ValueError for a host name that is not one)."""
        host = self.host.encode("ascii", "replace")
        if len(host) > HOST_MAX or not _HOST_NAME.fullmatch(host):
            raise ValueError(f"not a host name: {self.host!r}")
        return self._S.pack(self.job_id, self.task_id) + host + b"\0" + self.body

    @classmethod
    def unpack(cls, payload: bytes) -> NodeRequest:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        fixed = cls._S.size
        end = payload.find(b"\0", fixed, fixed + HOST_MAX + 1)
        if end < 0:
            raise _payload_error(f"a cluster request must name its host in at most "
                                 f"{HOST_MAX} bytes ending in a NUL")
        host = payload[fixed:end]
        if not _HOST_NAME.fullmatch(host):
            raise _payload_error(f"a cluster request's host must be a host name, got "
                                 f"{host[:40]!r}")
        job_id, task_id = cls._S.unpack_from(payload)
        if job_id < 1 or task_id < 1:
            raise _payload_error(f"job and task ids must be >= 1, got {job_id}.{task_id}")
        return cls(job_id, task_id, host.decode("ascii"), payload[end + 1:])


@dataclass(frozen=True, slots=True)
class StatusReply:
    """Payload of STATUS_REPLY and NODE_REPLY: one UTF-8 JSON object."""

    document: dict[str, Any]

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.STATUS_REPLY, MsgType.NODE_REPLY)

    def pack(self) -> bytes:
        """Return the compact UTF-8 JSON text."""
        return json.dumps(self.document, separators=(",", ":"), ensure_ascii=False,
                          sort_keys=True).encode()

    @classmethod
    def unpack(cls, payload: bytes) -> StatusReply:
        """Parse a payload; raise ProtocolError (reason ``payload``) unless a JSON object."""
        try:
            doc = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise _payload_error(f"a STATUS_REPLY must be UTF-8 JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise _payload_error(f"a STATUS_REPLY must be a JSON object, "
                                 f"got {type(doc).__name__}")
        return cls(doc)


Message = (JobStarted | Ack | Adopt | AdoptReply | StatusReply | Hook | Starter
           | StarterReply | NodeRequest)


def _check_size(name: str, payload: bytes, size: int) -> None:
    if len(payload) != size:
        raise _payload_error(f"the {name} payload must be {size} bytes, got {len(payload)}")


def _check_size_range(name: str, payload: bytes, low: int, high: int) -> None:
    if not low <= len(payload) <= high:
        raise _payload_error(f"the {name} payload must be {low} to {high} bytes, "
                             f"got {len(payload)}")


def _check_reserved(name: str, value: int) -> None:
    if value != 0:
        raise _payload_error(f"the reserved field of the {name} payload must be 0, got {value}")


# Payload size per type; None = any size up to MAX_PAYLOAD.
_SIZES: dict[MsgType, int | None] = {
    MsgType.JOB_STARTED: 24, MsgType.ACK: 40, MsgType.STATUS: 0,
    MsgType.STATUS_REPLY: None, MsgType.ADOPT: None, MsgType.QUARANTINE_SELF: 24,
    MsgType.ADOPT_REPLY: None, MsgType.HOOK: 24, MsgType.STARTER: None,
    MsgType.STARTER_REPLY: None, MsgType.PREPARE: None, MsgType.ABORT: None,
    MsgType.RELEASE: None, MsgType.NODE_REPLY: None, MsgType.NODE_STATUS: None,
    MsgType.OOM_REPORT: None, MsgType.CALLERID: None,
}
_UNPACK: dict[MsgType, Callable[[bytes], Message]] = {
    MsgType.JOB_STARTED: JobStarted.unpack, MsgType.QUARANTINE_SELF: JobStarted.unpack,
    MsgType.ACK: Ack.unpack, MsgType.ADOPT: Adopt.unpack,
    MsgType.STATUS_REPLY: StatusReply.unpack, MsgType.ADOPT_REPLY: AdoptReply.unpack,
    MsgType.HOOK: Hook.unpack, MsgType.STARTER: Starter.unpack,
    MsgType.STARTER_REPLY: StarterReply.unpack, MsgType.PREPARE: NodeRequest.unpack,
    MsgType.ABORT: NodeRequest.unpack, MsgType.RELEASE: NodeRequest.unpack,
    MsgType.NODE_REPLY: StatusReply.unpack, MsgType.NODE_STATUS: NodeRequest.unpack,
    MsgType.OOM_REPORT: NodeRequest.unpack, MsgType.CALLERID: NodeRequest.unpack,
}


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame that passed every check of :func:`decode`.

    ``flags`` is 0 or :data:`PEERCRED` (then the MAC was checked with
    :data:`PUBLIC_KEY`: the frame is intact, but only the kernel can say who sent it).
    """

    type: MsgType
    nonce: bytes
    timestamp_ns: int
    payload: bytes
    flags: int = 0

    @property
    def peercred(self) -> bool:
        """True for a peer-credentialed frame (flag :data:`PEERCRED`)."""
        return bool(self.flags & PEERCRED)

    @property
    def message(self) -> Message | None:
        """The payload parsed for its type (None for STATUS, which has none)."""
        unpack = _UNPACK.get(self.type)
        return None if unpack is None else unpack(self.payload)


def _mac(secret: bytes, body: bytes) -> bytes:
    # keyed BLAKE2b-256 through libsodium (crypto_generichash), the very primitive the C
    # side links: one implementation on both ends of the wire. pynacl is imported on the
    # first call, so the starter pays for it (~10 ms) only on its fallback path; its
    # binding, not nacl.hash, as gecod computes two MACs per request.
    global _blake2b
    if _blake2b is None:
        from nacl.bindings import crypto_generichash_blake2b_salt_personal

        _blake2b = crypto_generichash_blake2b_salt_personal
    return _blake2b(body, digest_size=MAC_BYTES, key=secret)


_blake2b: Callable[..., bytes] | None = None


def _mac_key(flags: int, secret: bytes) -> bytes:
    """The flag, not the caller, picks the key: PEERCRED frames use the public one."""
    return PUBLIC_KEY if flags & PEERCRED else secret


def _check_secret(secret: bytes) -> None:
    if len(secret) != KEY_BYTES:
        raise ValueError(f"the key must be {KEY_BYTES} bytes, got {len(secret)}")


def encode(type: MsgType | int, payload: bytes | Message, secret: bytes, *,
           nonce: bytes | None = None, ts_ns: int | None = None,
           version: int = VERSION, flags: int = 0, max_payload: int = MAX_PAYLOAD) -> bytes:
    """Build one MAC'd frame.

    Parameters
    ----------
    type:
        The message type.
    payload:
        A message (its type must match ``type``) or raw payload bytes.
    secret:
        The quarantine key's 32 bytes; ignored when ``flags`` has :data:`PEERCRED` (the MAC
        is then keyed with :data:`PUBLIC_KEY`, as the receiver expects).
    nonce:
        16 bytes; default random (never reuse one: receivers refuse repeats).
    ts_ns:
        Sender timestamp, ns since the epoch; default now (``CLOCK_REALTIME``).
    flags:
        0, or :data:`PEERCRED` for a peer-credentialed frame (types in
        :data:`PEERCRED_TYPES`, Unix socket only). Not checked here, so tests can
        build frames receivers must refuse.
    version:
        Only for tests of receivers (a frame of another version).
    max_payload:
        The channel's cap: :data:`MAX_PAYLOAD`, or :data:`CLUSTER_MAX_PAYLOAD` between gecods.

    Returns
    -------
    The frame: header, payload, MAC.

    Raises
    ------
    ValueError
        for a wrong-sized key or nonce, a payload over 4096 bytes, a message of
        another type, or a field that does not fit its integer.
    """
    _check_secret(secret)
    if not isinstance(payload, bytes):
        if int(type) not in payload.TYPES:
            raise ValueError(f"a {payload.__class__.__name__} cannot be sent as type "
                             f"{int(type)}")
        try:
            payload = payload.pack()
        except struct.error as exc:
            raise ValueError(f"a field of the {payload.__class__.__name__} does not fit its "
                             f"integer: {exc}") from None
    if len(payload) > max_payload:
        raise ValueError(f"a payload must be at most {max_payload} bytes, got {len(payload)}")
    if nonce is None:
        nonce = os.urandom(NONCE_BYTES)  # getrandom(2), as libsodium's randombytes_buf
    elif len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    if ts_ns is None:
        ts_ns = time.time_ns()
    try:
        header = _HEADER.pack(MAGIC, version, int(type), flags, len(payload), nonce, ts_ns)
    except struct.error as exc:
        raise ValueError(f"a header field does not fit: {exc}") from None
    body = header + payload
    return body + _mac(_mac_key(flags, secret), body)


def expected_length(prefix: bytes, max_payload: int = MAX_PAYLOAD) -> int | None:
    """Return the whole frame's length once enough of its start has arrived.

    A receiver reading from a socket calls this with what it has so far: None
    means "read more" (fewer than 12 bytes), an int is the total to wait for.
    Shape errors are raised as early as the bytes allow, so a client that sends
    garbage (or another protocol version) is answered at once instead of after
    a read deadline. The flags are checked as :func:`decode` does with
    ``peercred=None`` (0 or PEERCRED on a type that may carry it).

    Raises
    ------
    ProtocolError
        reason ``magic``, ``version``, ``flags`` or ``length`` (see :func:`decode`).
    """
    if prefix[:4] != MAGIC[:len(prefix)]:
        raise _shape_error("magic", prefix)
    # the version byte is checked before anything else can be assumed: a future
    # version may lay out everything after byte 5 differently
    if len(prefix) >= 5 and prefix[4] != VERSION:
        raise _shape_error("version", prefix)
    if len(prefix) < 12:
        return None
    _check_flags_and_length(prefix, None, max_payload)
    n = int.from_bytes(prefix[8:12], "little")
    return HEADER_BYTES + n + MAC_BYTES


class Header(NamedTuple):
    """A frame's header as it arrived, parsed once (shape checked, nothing trusted yet).

    A receiver reading a frame parses this from its first 36 bytes
    (:meth:`parse`), reads ``frame_bytes`` in all, and passes it to
    :func:`decode`, which checks the rest.
    """

    type: int
    flags: int
    length: int  # of the payload
    nonce: bytes
    timestamp_ns: int

    @classmethod
    def parse(cls, prefix: bytes, max_payload: int = MAX_PAYLOAD) -> Header:
        """The header at the start of ``prefix`` (at least :data:`HEADER_BYTES` long).

        Raises
        ------
        ProtocolError
            as :func:`expected_length` does (magic, version, flags, length).
        """
        expected_length(prefix, max_payload)
        _, _, type_, flags, n, nonce, ts_ns = _HEADER.unpack_from(prefix)
        return cls(type_, flags, n, nonce, ts_ns)

    @property
    def peercred(self) -> bool:
        """The PEERCRED flag (the MAC is keyed with the public key)."""
        return bool(self.flags & PEERCRED)

    @property
    def frame_bytes(self) -> int:
        """The whole frame's length: header, payload, MAC."""
        return HEADER_BYTES + self.length + MAC_BYTES


def claims_peercred(prefix: bytes | bytearray) -> bool:
    """The PEERCRED bit of a header, even a partial or refused one (not trusted: to answer
    a refused frame in kind)."""
    return len(prefix) >= 8 and prefix[4] == VERSION and bool(
        int.from_bytes(prefix[6:8], "little") & PEERCRED)


def claimed(frame: bytes | bytearray) -> tuple[int | None, int | None, int | None]:
    """Job, task and pid a JOB_STARTED, QUARANTINE_SELF, HOOK or STARTER frame claims (job
    and task for the cluster channel's requests), read without trusting it (for the journal of a
    refusal); Nones for other or short frames."""
    if len(frame) >= HEADER_BYTES + 24 and frame[5] in (MsgType.JOB_STARTED,
                                                         MsgType.QUARANTINE_SELF, MsgType.HOOK,
                                                         MsgType.STARTER):
        job, task, pid, _ = JobStarted._S.unpack_from(frame, HEADER_BYTES)
        return job, task, pid
    if len(frame) >= HEADER_BYTES + 16 and frame[5] in NODE_REQUESTS:
        job, task = NodeRequest._S.unpack_from(frame, HEADER_BYTES)
        return job, task, None
    return None, None, None


# The refusal reasons of :func:`decode` that come after the MAC was checked: the frame is
# the key holder's (a replay, a clock out of step, a bad payload), not a stranger's.
AFTER_MAC = frozenset({"type", "payload", "stale", "nonce"})


def _shape_error(reason: str, frame: bytes) -> ProtocolError:
    if reason == "magic":
        return ProtocolError(f"a frame must start with {MAGIC!r}, got {bytes(frame[:4])!r}",
                             reason="magic")
    return ProtocolError(f"protocol version must be {VERSION}, got {frame[4]}: gecod speaks "
                         f"protocol {VERSION}; upgrade the preload/gecod", reason="version")


def _type_name(type_: int) -> str:
    try:
        return MsgType(type_).name
    except ValueError:
        return f"type {type_}"


def _check_flags(frame: bytes, peercred: bool | None) -> None:
    """Check 4: the flags, from the header alone (nothing in the frame is trusted yet)."""
    flags = int.from_bytes(frame[6:8], "little")
    if flags & ~PEERCRED:
        raise ProtocolError(f"flags must be 0 or 0x{PEERCRED:04x} (PEERCRED), got "
                            f"0x{flags:04x}", reason="flags")
    if flags:
        if frame[5] not in PEERCRED_TYPES:
            name = _type_name(frame[5])
            raise ProtocolError(f"the PEERCRED flag is only allowed on {_PEERCRED_REQUESTS} "
                                f"requests and their replies, got it on {name}: {name} must "
                                "be MAC'd with the secret key", reason="flags")
        if peercred is False:
            raise ProtocolError("the reply carries the PEERCRED flag (MAC'd with the public "
                                "key), but it answers a request MAC'd with the secret key, so "
                                "it must be MAC'd with that key too", reason="flags")
    elif peercred:
        raise ProtocolError("the reply lacks the PEERCRED flag: it is MAC'd with gecod's "
                            "secret key, which this client cannot check (a gecod older than "
                            "this client refuses peer-credentialed requests: upgrade gecod)",
                            reason="flags")


def _check_flags_and_length(frame: bytes, peercred: bool | None, max_payload: int) -> None:
    _check_flags(frame, peercred)
    n = int.from_bytes(frame[8:12], "little")
    if n > max_payload:
        raise ProtocolError(f"payload length must be at most {max_payload}, got {n}",
                            reason="length")


def _seconds(ns: int) -> str:
    """Exact decimal seconds of a nanosecond count (floats would round 30 s + 1 ns to 30 s)."""
    whole, frac = divmod(ns, 10**9)
    return f"{whole}.{frac:09d}".rstrip("0").rstrip(".")


def _check_skew(ts_ns: int, now_ns: int | None, max_skew: float) -> None:
    now = time.time_ns() if now_ns is None else now_ns
    if abs(ts_ns - now) > round(max_skew * 1e9):
        side = "behind" if ts_ns < now else "ahead of"
        raise ProtocolError(
            f"timestamp must be within ±{max_skew:g} s of this host's clock, got "
            f"{_seconds(abs(ts_ns - now))} s {side} it (a replayed frame, or clocks out of "
            f"step: check NTP)", reason="stale")


def decode(frame: bytes, secret: bytes, *, now_ns: int | None = None, max_skew: float = 30.0,
           replay: Replay | None = None, peercred: bool | None = None,
           header: Header | None = None, max_payload: int = MAX_PAYLOAD) -> Frame:
    """Verify one frame and return it; the checks run in the documented order.

    Parameters
    ----------
    frame:
        Exactly one frame (:func:`read_frame` delivers that).
    secret:
        The quarantine key's 32 bytes. A frame with the :data:`PEERCRED` flag is checked
        with :data:`PUBLIC_KEY` instead (a client without the secret passes
        PUBLIC_KEY here).
    now_ns:
        This host's clock (ns since the epoch); default now.
    max_skew:
        Seconds the sender's timestamp may differ from ``now_ns`` either way.
    replay:
        The receiver's replay cache; the frame's nonce is recorded in it. None
        skips the nonce check (a client reading the one reply to its request,
        which :func:`decode_ack` binds to the request instead).
    peercred:
        None (a receiver of requests): flags 0 or PEERCRED on a type in
        :data:`PEERCRED_TYPES`. True / False (a client reading its reply): the
        flag must be / must not be set, as it was on the request, so a reply
        MAC'd with the public key never answers a request MAC'd with the secret.
    header:
        ``Header.parse(frame)`` when the receiver has it already (read once per frame).
    max_payload:
        The channel's cap (:data:`CLUSTER_MAX_PAYLOAD` between gecods).

    Returns
    -------
    The frame's type, nonce, timestamp, payload (:attr:`Frame.message` parses it)
    and flags.

    Raises
    ------
    ProtocolError
        with ``reason``, in check order: ``short`` (< 68 bytes), ``magic``,
        ``version``, ``flags``, ``length`` (payload > 4096 or the frame's size
        disagrees with it), ``mac``, ``type`` (unknown), ``payload`` (wrong size
        or content for the type), ``stale`` (timestamp outside ±max_skew),
        ``nonce`` (seen before within the replay window).
    """
    _check_secret(secret)
    if len(frame) < HEADER_BYTES + MAC_BYTES:
        raise ProtocolError(f"a frame must be at least {HEADER_BYTES + MAC_BYTES} bytes "
                            f"(header and MAC), got {len(frame)}", reason="short")
    if frame[:4] != MAGIC:
        raise _shape_error("magic", frame)
    if frame[4] != VERSION:
        raise _shape_error("version", frame)
    _check_flags_and_length(frame, peercred, max_payload)
    if header is None:
        header = Header.parse(frame, max_payload)
    type_, flags, n, nonce, ts_ns = header
    if len(frame) != HEADER_BYTES + n + MAC_BYTES:
        raise ProtocolError(f"a frame with a {n}-byte payload must be "
                            f"{HEADER_BYTES + n + MAC_BYTES} bytes, got {len(frame)}",
                            reason="length")
    body = frame[:HEADER_BYTES + n]
    # constant time: a byte-by-byte compare would tell a forger how much is right
    if not hmac.compare_digest(_mac(_mac_key(flags, secret), body), frame[HEADER_BYTES + n:]):
        if flags:
            raise ProtocolError("the MAC of a PEERCRED frame does not match: it must be "
                                "keyed with the public key (32 zero bytes); the frame is "
                                "corrupted or was MAC'd with another key", reason="mac")
        raise ProtocolError("the MAC does not match: the frame is forged, corrupted or made "
                            "with another key (gecod and the preload must read the same key "
                            "file)", reason="mac")
    try:
        mtype = MsgType(type_)
    except ValueError:
        known = ", ".join(f"{t.value} ({t.name})" for t in MsgType)
        raise ProtocolError(f"message type must be one of {known}, got {type_}",
                            reason="type") from None
    payload = bytes(frame[HEADER_BYTES:HEADER_BYTES + n])
    size = _SIZES[mtype]
    if size is not None and n != size:
        raise _payload_error(f"the {mtype.name} payload must be {size} bytes, got {n}")
    unpack = _UNPACK.get(mtype)
    if unpack is not None:
        unpack(payload)  # strict: reserved fields, status values, JSON
    _check_skew(ts_ns, now_ns, max_skew)
    if replay is not None:
        replay.check(nonce, time.time_ns() if now_ns is None else now_ns)
    return Frame(mtype, nonce, ts_ns, payload, flags)


def decode_ack(frame: bytes, secret: bytes, request_nonce: bytes, *, now_ns: int | None = None,
               max_skew: float = 30.0, peercred: bool = False) -> Ack:
    """Verify the reply to a request and return its ACK (the C ``geco_decode_ack``).

    Parameters
    ----------
    frame, secret, now_ns, max_skew:
        As for :func:`decode`.
    request_nonce:
        The nonce of the request this reply must answer.
    peercred:
        Whether the request was a PEERCRED frame: its reply must be one too (and
        is checked with :data:`PUBLIC_KEY`); else it must not be (``flags``), like
        the C decoder, which refuses every nonzero flag.

    Returns
    -------
    The ACK; its ``status`` says what gecod did.

    Raises
    ------
    ProtocolError
        as :func:`decode`; also ``type`` when the frame is not an ACK, and
        ``nonce`` when it answers another request.
    """
    got = decode(frame, secret, now_ns=now_ns, max_skew=max_skew, peercred=peercred)
    if got.type is not MsgType.ACK:
        raise ProtocolError(f"the reply must be an ACK, got {got.type.name}", reason="type")
    ack = Ack.unpack(got.payload)
    if not hmac.compare_digest(ack.request_nonce, request_nonce):
        raise ProtocolError(f"the ACK answers request {ack.request_nonce.hex()}, "
                            f"not this one ({request_nonce.hex()})", reason="nonce")
    return ack


def ack_for_error(received: bytes, error: ProtocolError, secret: bytes) -> bytes:
    """Return the ACK a server sends for a refused frame, before it closes.

    The status is VERSION for a protocol version it does not speak, else
    BAD_REQUEST; the request nonce is bytes 12..27 of what was received (zeros
    when fewer arrived), so the client learns at once why instead of waiting
    for its timeout. The ACK carries no job: it does not say the frame was
    authentic.

    A request whose header has the PEERCRED flag is answered with a PEERCRED
    ACK: its sender has no secret key and could not check any other. (A frame
    of another protocol version is not read past its version byte, so it is
    answered with the secret key.)
    """
    status = AckStatus.VERSION if error.reason == "version" else AckStatus.BAD_REQUEST
    nonce = bytes(received[12:28]) if len(received) >= 28 else bytes(NONCE_BYTES)
    flags = 0
    if error.reason != "version" and len(received) >= 8:
        flags = int.from_bytes(received[6:8], "little") & PEERCRED
    return encode(MsgType.ACK, Ack(0, 0, status, nonce), secret, flags=flags)


class Replay(Protocol):
    """What :func:`decode` asks of a replay cache: record a nonce, or refuse it."""

    def check(self, nonce: bytes, now_ns: int) -> None:
        """Record ``nonce``; raise ProtocolError (reason ``nonce``) to refuse the frame."""


class ReplayCache:
    """The nonces a receiver accepted recently; a repeat within the window is refused.

    Why the window must be at least ``2 * max_skew``: a frame is accepted while
    ``|timestamp - now| <= max_skew``, so a frame first seen at time *t* (with
    ``timestamp <= t + max_skew``) could pass the clock check again until
    ``t + 2 * max_skew``; after that :func:`decode` refuses it as ``stale``
    before the cache is asked. Ages are measured on the same realtime clock as
    the timestamps: a clock that jumps forward makes old frames stale at the
    same moment it makes their nonces forgettable; one that jumps back only
    keeps nonces longer.

    Only frames with a good MAC reach the cache, so its size is bounded by the
    legitimate request rate; ``capacity`` still bounds memory. When it is full
    of nonces still inside the window, new frames are refused (fail closed)
    rather than forgetting a nonce that could then be replayed.

    ``forget_when_full`` is for PEERCRED frames, whose MAC anyone can make: any
    local user can fill a cache with them, so failing closed would let one user
    block everyone's STATUS and starter fallback for a window. Such a frame's
    nonce guards nothing (the kernel names the sender; a fresh frame is as easy
    to make as a replay), so that cache forgets its oldest nonce instead.

    Thread-safe (one lock around each check).
    """

    CAPACITY = 65536  # nonces kept at most, by default

    def __init__(self, window: float, *, capacity: int = CAPACITY,
                 forget_when_full: bool = False) -> None:
        if window <= 0 or capacity <= 0:
            raise ValueError(f"window and capacity must be > 0, got {window}, {capacity}")
        self.window = window
        self.capacity = capacity
        self.forget_when_full = forget_when_full
        self._window_ns = round(window * 1e9)
        self._seen: OrderedDict[bytes, int] = OrderedDict()  # nonce -> first seen (ns)
        self._lock = threading.Lock()

    @classmethod
    def for_skew(cls, max_skew: float, *, capacity: int = CAPACITY,
                 forget_when_full: bool = False) -> ReplayCache:
        """Return a cache whose window (``2 * max_skew``) matches :func:`decode`'s clock check."""
        return cls(2 * max_skew, capacity=capacity, forget_when_full=forget_when_full)

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, nonce: bytes, now_ns: int) -> None:
        """Record ``nonce`` as seen at ``now_ns``; refuse it if it was seen within the window.

        Raises
        ------
        ProtocolError
            reason ``nonce``: a replay, or the cache is full of live nonces (unless
            ``forget_when_full``).
        """
        with self._lock:
            # insertion order is arrival order, so expired entries are at the front
            while self._seen:
                oldest, seen_ns = next(iter(self._seen.items()))
                if now_ns - seen_ns <= self._window_ns:
                    break
                del self._seen[oldest]
            if nonce in self._seen:
                raise self.replayed(nonce, self.window)
            if len(self._seen) >= self.capacity and self.forget_when_full:
                self._seen.popitem(last=False)
            elif len(self._seen) >= self.capacity:
                raise self.full(self.capacity, self.window)
            self._seen[nonce] = now_ns

    @staticmethod
    def replayed(nonce: bytes, window: float) -> ProtocolError:
        """The refusal of a nonce seen within the window (any cache with these rules)."""
        return ProtocolError(f"nonce {nonce.hex()} was already used within the last "
                             f"{window:g} s: a replayed frame", reason="nonce")

    @staticmethod
    def full(capacity: int, window: float) -> ProtocolError:
        """The refusal when ``capacity`` nonces younger than the window are kept."""
        return ProtocolError(f"the replay cache holds {capacity} nonces younger than "
                             f"{window:g} s; refusing the frame rather than forgetting one",
                             reason="nonce")


def read_frame(sock: socket.socket, deadline: float, max_payload: int = MAX_PAYLOAD) -> bytes:
    """Read exactly one frame from a blocking socket.

    Parameters
    ----------
    sock:
        A connected stream socket (its timeout is changed).
    deadline:
        ``time.monotonic()`` by which the whole frame must have arrived.
    max_payload:
        The channel's cap.

    Returns
    -------
    The frame's bytes, ready for :func:`decode`; nothing past it is read.

    Raises
    ------
    ProtocolError
        ``timeout`` at the deadline, ``closed`` when the peer closed before a
        whole frame, or a shape reason from :func:`expected_length`.
    OSError
        for other socket errors.
    """
    buf = bytearray()
    want: int | None = None
    while want is None or len(buf) < want:
        # read no further than this frame: header first, then exactly the rest
        need = (12 if want is None else want) - len(buf)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProtocolError(f"no whole frame before the deadline: got {len(buf)} bytes",
                                reason="timeout")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(need)
        except TimeoutError:
            raise ProtocolError(f"no whole frame before the deadline: got {len(buf)} bytes",
                                reason="timeout") from None
        if not chunk:
            raise ProtocolError(f"the peer closed the connection after {len(buf)} bytes of a "
                                f"frame", reason="closed")
        buf += chunk
        if want is None:
            want = expected_length(bytes(buf), max_payload)
    return bytes(buf)
