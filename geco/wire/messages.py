"""The payloads of the wire format: one record per request and reply (protocol 1).

Each record packs itself into a frame's payload and unpacks strictly (sizes,
reserved fields, enum values, text), raising :class:`~geco.errors.ProtocolError`
with reason ``payload``. The frame around a payload (header, MAC, checks) is
:mod:`geco.wire.frame`; the byte layout of both is ``docs/wire-format.md``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import operator
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from geco.errors import ProtocolError

__all__ = [
    "ADOPT_MAX_CONNECTION",
    "CLUSTER_MAX_PAYLOAD",
    "HOST_MAX",
    "MAX_PAYLOAD",
    "NODE_REQUESTS",
    "NONCE_BYTES",
    "PAYLOAD_SIZES",
    "REPLY_MAX_TEXT",
    "STARTER_ENVIRON",
    "Ack",
    "AckStatus",
    "Adopt",
    "AdoptReply",
    "AdoptStage",
    "Hook",
    "HookName",
    "JobStarted",
    "Message",
    "MsgType",
    "NodeRequest",
    "Starter",
    "StarterReply",
    "StatusReply",
    "claims",
    "unpack",
]

NONCE_BYTES = 16  # a frame's nonce, which an ACK names to say which request it answers
MAX_PAYLOAD = 4096
# The cluster channel's cap: a PREPARE carries the whole job's resource set (a host costs
# ~50 bytes of it), so jobs of thousands of hosts fit.
CLUSTER_MAX_PAYLOAD = 256 * 1024


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
    HOLD = 8  # a HOOK: gecod did the prolog's work and the job is held in error (exit 100)


def _payload_error(msg: str, **fields: object) -> ProtocolError:
    return ProtocolError(msg, reason="payload", **fields)


@dataclass(frozen=True, slots=True)
class _ForJob:
    """What every request payload and ACK names first, on the wire and here: the job task
    it is about (u64 job_id, u64 task_id; :func:`claims` reads them before any other check)."""

    job_id: int
    task_id: int


# each fixed record's field getter, made at its first pack: gecod packs an ACK for every
# request, and dataclasses.fields() each time cost seven times the pack itself
_FIELDS: dict[type, Callable[[object], tuple[Any, ...]]] = {}


class _Fixed(_ForJob):
    """A payload of one fixed layout, ``_S``: the record's fields in their order, with a u32
    reserved field (0) at index ``_RESERVED`` of the layout where the record has one. A
    record states its layout and, in ``_checked``, what its values must be beyond that."""

    __slots__ = ()

    _NAME: ClassVar[str]  # the type, as error texts name it
    _S: ClassVar[struct.Struct]
    _RESERVED: ClassVar[int | None] = None

    def pack(self) -> bytes:
        """Return the payload bytes (struct.error when a field does not fit its integer)."""
        fields = _FIELDS.get(type(self))
        if fields is None:
            fields = _FIELDS[type(self)] = operator.attrgetter(
                *(f.name for f in dataclasses.fields(self)))
        values = list(fields(self))
        if self._RESERVED is not None:
            values.insert(self._RESERVED, 0)
        return self._S.pack(*values)

    @classmethod
    def unpack(cls, payload: bytes) -> Self:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        _check_size(cls._NAME, payload, cls._S.size)
        values = list(cls._S.unpack(payload))
        if cls._RESERVED is not None:
            _check_reserved(cls._NAME, values.pop(cls._RESERVED))
        return cls._checked(values)

    @classmethod
    def _checked(cls, values: list[Any]) -> Self:
        """The record of a payload's ``values`` (reserved field taken out), which it checks."""
        make: Callable[..., Self] = cls
        return make(*values)


@dataclass(frozen=True, slots=True)
class JobStarted(_Fixed):
    """Payload of JOB_STARTED and QUARANTINE_SELF: "put ``pid`` into ``job_id.task_id``".

    Wire: u64 job_id, u64 task_id, u32 pid, u32 reserved (0); 24 bytes.
    """

    pid: int

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.JOB_STARTED, MsgType.QUARANTINE_SELF)
    _NAME: ClassVar[str] = "JOB_STARTED"
    _S: ClassVar[struct.Struct] = struct.Struct("<QQII")
    _RESERVED: ClassVar[int | None] = 3


class HookName(enum.IntEnum):
    """Which Grid Engine hook a HOOK request runs in gecod."""

    PROLOG = 1
    EPILOG = 2


@dataclass(frozen=True, slots=True)
class Hook(_Fixed):
    """Payload of HOOK (root's hook program): "do ``hook``'s work for ``job_id.task_id``;
    I am ``pid``, the hook process the job's shepherd started". Answered with an ACK:
    OK when done, anything else when the hook must do it itself.

    Wire: u64 job_id, u64 task_id, u32 pid, u32 hook (:class:`HookName`); 24 bytes.
    """

    pid: int
    hook: HookName

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.HOOK,)
    _NAME: ClassVar[str] = "HOOK"
    _S: ClassVar[struct.Struct] = struct.Struct("<QQII")

    @classmethod
    def _checked(cls, values: list[Any]) -> Self:
        job_id, task_id, pid, hook = values
        if hook not in tuple(HookName):
            raise _payload_error(f"a HOOK's hook must be 1 (PROLOG) or 2 (EPILOG), got {hook}")
        return cls(job_id, task_id, pid, HookName(hook))


@dataclass(frozen=True, slots=True)
class Ack(_Fixed):
    """Payload of ACK: gecod's answer to the request whose nonce is ``request_nonce``.

    Wire: u64 job_id, u64 task_id, u32 status, u32 reserved (0), 16 bytes request
    nonce; 40 bytes.
    """

    status: AckStatus
    request_nonce: bytes

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.ACK,)
    _NAME: ClassVar[str] = "ACK"
    _S: ClassVar[struct.Struct] = struct.Struct("<QQII16s")
    _RESERVED: ClassVar[int | None] = 3

    def pack(self) -> bytes:
        """Return the 40 payload bytes."""
        # struct pads a short nonce and cuts a long one, which would answer another request
        if len(self.request_nonce) != NONCE_BYTES:
            raise ValueError(f"request_nonce must be {NONCE_BYTES} bytes, "
                             f"got {len(self.request_nonce)}")
        return _Fixed.pack(self)

    @classmethod
    def _checked(cls, values: list[Any]) -> Self:
        job_id, task_id, status, nonce = values
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
class Adopt(_ForJob):
    """Payload of ADOPT (sshd's PAM module): "may ``uid`` log in, into which job".

    Wire: u64 job_id, u64 task_id (0, 0: gecod chooses), u32 pid (the sender, sshd's root
    process for the connection), u32 uid, u32 stage (:class:`AdoptStage`), u32 reserved
    (0), then the connection's ``SSH_CONNECTION`` text (printable ASCII, at most 255
    bytes); 32 to 287 bytes.
    """

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
        head, text = _split("ADOPT", payload, cls._S.size, cls._S.size + ADOPT_MAX_CONNECTION)
        job_id, task_id, pid, uid, stage, reserved = cls._S.unpack(head)
        _check_reserved("ADOPT", reserved)
        if stage not in tuple(AdoptStage):
            raise _payload_error(f"an ADOPT stage must be 1, 2 or 3, got {stage}")
        if not all(0x20 <= c < 0x7F for c in text):
            raise _payload_error("an ADOPT connection must be printable ASCII")
        return cls(job_id, task_id, pid, uid, AdoptStage(stage), text.decode("ascii"))


@dataclass(frozen=True, slots=True)
class AdoptReply(_ForJob):
    """Payload of ADOPT_REPLY: an ACK's 40 bytes, then UTF-8 text (at most 2048 bytes, no
    NUL): a line for the user (may be empty), then the session's ``NAME=value`` lines."""

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
        head, tail = _split("ADOPT_REPLY", payload, Ack._S.size, Ack._S.size + REPLY_MAX_TEXT)
        ack = Ack.unpack(head)
        try:
            text = tail.decode()
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
class Starter(_ForJob):
    """Payload of STARTER (the job owner's starter_method, peer-credentialed): "I am ``pid``
    of job ``job_id.task_id``, to start ``argv``: how would Grid Engine start it?".

    Wire: u64 job_id, u64 task_id, u32 pid, u32 argc, then NUL-terminated strings: the
    values of :data:`STARTER_ENVIRON` ("" when unset), then ``argc`` arguments.
    """

    pid: int
    environ: tuple[str, ...]
    argv: tuple[str, ...]

    TYPES: ClassVar[tuple[MsgType, ...]] = (MsgType.STARTER,)
    _S: ClassVar[struct.Struct] = struct.Struct("<QQII")

    def pack(self) -> bytes:
        """Return the payload bytes (ValueError when a string holds a NUL or it is too big)."""
        if len(self.environ) != len(STARTER_ENVIRON):
            raise ValueError(f"a STARTER carries {len(STARTER_ENVIRON)} environment values")
        return _capped("STARTER", self._S.pack(self.job_id, self.task_id, self.pid, len(self.argv))
                       + _nul_terminated(self.environ + self.argv))

    @classmethod
    def unpack(cls, payload: bytes) -> Starter:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        head, tail = _split("STARTER", payload, cls._S.size, MAX_PAYLOAD)
        job_id, task_id, pid, argc = cls._S.unpack(head)
        words = _strings("STARTER", tail, len(STARTER_ENVIRON) + argc)
        n = len(STARTER_ENVIRON)
        return cls(job_id, task_id, pid, tuple(words[:n]), tuple(words[n:]))


@dataclass(frozen=True, slots=True)
class StarterReply(_ForJob):
    """Payload of STARTER_REPLY: an ACK's 40 bytes, then (status OK) NUL-terminated strings:
    the program, the number of arguments, the arguments, then the environment's changes,
    ``NAME=value`` to set and ``NAME`` to remove."""

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
        return _capped("STARTER_REPLY", ack + _nul_terminated(
            (self.program, str(len(self.argv)), *self.argv, *self.environ)))

    @classmethod
    def unpack(cls, payload: bytes) -> StarterReply:
        """Parse a payload; raise ProtocolError (reason ``payload``) when it is malformed."""
        head, tail = _split("STARTER_REPLY", payload, Ack._S.size, MAX_PAYLOAD)
        ack = Ack.unpack(head)
        words = _strings("STARTER_REPLY", tail)
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
class NodeRequest(_ForJob):
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


def _split(name: str, payload: bytes, fixed: int, high: int) -> tuple[bytes, bytes]:
    """A payload of ``fixed`` to ``high`` bytes, cut after its ``fixed`` bytes."""
    if not fixed <= len(payload) <= high:
        raise _payload_error(f"the {name} payload must be {fixed} to {high} bytes, "
                             f"got {len(payload)}")
    return payload[:fixed], payload[fixed:]


def _capped(name: str, data: bytes) -> bytes:
    """``data``; ValueError when it is too big for a payload."""
    if len(data) > MAX_PAYLOAD:
        raise ValueError(f"a {name} payload is at most {MAX_PAYLOAD} bytes")
    return data


def _check_reserved(name: str, value: int) -> None:
    if value != 0:
        raise _payload_error(f"the reserved field of the {name} payload must be 0, got {value}")


# Payload size per type; None = any size up to the channel's cap.
PAYLOAD_SIZES: dict[MsgType, int | None] = {
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


def unpack(type_: MsgType, payload: bytes) -> Message | None:
    """The payload parsed for its type (None for STATUS, which has none); raise
    ProtocolError (reason ``payload``) when it is malformed."""
    parse = _UNPACK.get(type_)
    return None if parse is None else parse(payload)


# The requests whose payload starts with u64 job_id, u64 task_id, u32 pid.
_CLAIMS_PID = frozenset({MsgType.JOB_STARTED, MsgType.QUARANTINE_SELF, MsgType.HOOK,
                         MsgType.STARTER})


def claims(type_: int, payload: bytes | bytearray) -> tuple[int | None, int | None, int | None]:
    """Job, task and pid a JOB_STARTED, QUARANTINE_SELF, HOOK or STARTER payload claims (job
    and task for the cluster channel's requests), read without trusting it: ``payload``
    may be cut short or malformed; Nones for other types or too few bytes."""
    if type_ in _CLAIMS_PID and len(payload) >= 24:
        job, task, pid, _ = JobStarted._S.unpack_from(payload)
        return job, task, pid
    if type_ in NODE_REQUESTS and len(payload) >= 16:
        job, task = NodeRequest._S.unpack_from(payload)
        return job, task, None
    return None, None, None
