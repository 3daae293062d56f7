"""The frame of the wire format between the preload, gecod, the CLI and other hosts
(protocol 1): its header, encode/decode and the MAC check.

Every frame is a fixed 36-byte header, a payload of at most 4096 bytes and a
32-byte MAC (keyed BLAKE2b-256 over header and payload). The byte-by-byte
layout, the receiver's check order, the replay rules and test vectors are in
``docs/wire-format.md``; ``libgeco/geco_proto.c`` is the C twin of this module
and :mod:`geco.wire.messages` (the payloads),
and both are held to the same vectors (``tests/vectors/wire.json``).

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

    frame = encode(MsgType.JOB_STARTED, JobStarted(42, 1, pid), key)
    ...
    got = decode(raw, key, replay=cache)   # raises ProtocolError
    match got.message: ...                 # the payload, unpacked once by decode

    # without the key (a user): the kernel vouches for the sender instead
    frame = encode(MsgType.STATUS, b"", PUBLIC_KEY, flags=PEERCRED)
"""

from __future__ import annotations

import hmac
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from geco.errors import ProtocolError
from geco.wire.messages import (
    MAX_PAYLOAD,
    NONCE_BYTES,
    PAYLOAD_SIZES,
    Ack,
    AckStatus,
    Message,
    MsgType,
    claims,
    unpack,
)
from geco.wire.replay import Replay

__all__ = [
    "AFTER_MAC",
    "HEADER_BYTES",
    "KEY_BYTES",
    "LENGTH_PREFIX",
    "MAC_BYTES",
    "MAGIC",
    "MAX_FRAME",
    "PEERCRED",
    "PEERCRED_TYPES",
    "PUBLIC_KEY",
    "VERSION",
    "Frame",
    "Header",
    "ack_for_error",
    "claimed",
    "claims_peercred",
    "decode",
    "decode_ack",
    "encode",
    "expected_length",
    "nonce_of",
]

MAGIC = b"GECQ"
VERSION = 1
KEY_BYTES = 32
HEADER_BYTES = 36
MAC_BYTES = 32
MAX_FRAME = HEADER_BYTES + MAX_PAYLOAD + MAC_BYTES
# Flag bit: a peer-credentialed frame (MAC'd with PUBLIC_KEY; the kernel names the sender).
PEERCRED = 0x0001
# The MAC key of PEERCRED frames: public, so their MAC proves integrity, not who sent them.
PUBLIC_KEY = bytes(KEY_BYTES)

# magic, version, type, flags, payload length, nonce, timestamp (int64 ns)
_HEADER = struct.Struct("<4sBBHI16sq")
assert _HEADER.size == HEADER_BYTES
# The header's first bytes that tell the whole frame's length (magic to payload length).
LENGTH_PREFIX = 12
_NONCE = slice(LENGTH_PREFIX, LENGTH_PREFIX + NONCE_BYTES)


# What may carry PEERCRED: the requests any local user may make (ADOPT only at its EXEC
# stage, gecod checks), and gecod's replies. JOB_STARTED never: it is the privileged path,
# MAC'd with the secret key.
PEERCRED_TYPES = frozenset({MsgType.STATUS, MsgType.QUARANTINE_SELF, MsgType.ADOPT,
                            MsgType.STARTER, MsgType.ACK, MsgType.STATUS_REPLY,
                            MsgType.ADOPT_REPLY, MsgType.STARTER_REPLY})
_PEERCRED_REQUESTS = "STATUS, QUARANTINE_SELF, ADOPT and STARTER"


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
    # the payload parsed for its type, once, by decode (None for STATUS, which has none)
    message: Message | None = None

    @property
    def peercred(self) -> bool:
        """True for a peer-credentialed frame (flag :data:`PEERCRED`)."""
        return bool(self.flags & PEERCRED)


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
    means "read more" (fewer than :data:`LENGTH_PREFIX` bytes), an int is the total to wait for.
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
    if len(prefix) < LENGTH_PREFIX:
        return None
    _check_flags_and_length(prefix, None, max_payload)
    n = int.from_bytes(prefix[8:LENGTH_PREFIX], "little")
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
    refusal); Nones for other or short frames (:func:`geco.wire.messages.claims`)."""
    if len(frame) < HEADER_BYTES:
        return None, None, None
    return claims(frame[5], frame[HEADER_BYTES:])


def nonce_of(frame: bytes | bytearray) -> bytes:
    """The nonce in a frame's header (zeros when fewer bytes arrived): what binds a reply
    to its request. Not checked: read from what was sent or received as it is."""
    if len(frame) < _NONCE.stop:
        return bytes(NONCE_BYTES)
    return bytes(frame[_NONCE])


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
    n = int.from_bytes(frame[8:LENGTH_PREFIX], "little")
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
        Exactly one frame (:func:`geco.wire.reader.read_frame` delivers that).
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
    The frame's type, nonce, timestamp, payload, flags and the payload parsed
    (:attr:`Frame.message`: the one unpacking of a request's payload; pass it down).

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
    size = PAYLOAD_SIZES[mtype]
    if size is not None and n != size:
        raise ProtocolError(f"the {mtype.name} payload must be {size} bytes, got {n}",
                            reason="payload")
    message = unpack(mtype, payload)  # strict: reserved fields, status values, JSON
    _check_skew(ts_ns, now_ns, max_skew)
    if replay is not None:
        replay.check(nonce, time.time_ns() if now_ns is None else now_ns)
    return Frame(mtype, nonce, ts_ns, payload, flags, message)


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
    ack = got.message
    assert isinstance(ack, Ack)
    if not hmac.compare_digest(ack.request_nonce, request_nonce):
        raise ProtocolError(f"the ACK answers request {ack.request_nonce.hex()}, "
                            f"not this one ({request_nonce.hex()})", reason="nonce")
    return ack


def ack_for_error(received: bytes, error: ProtocolError, secret: bytes) -> bytes:
    """Return the ACK a server sends for a refused frame, before it closes.

    The status is VERSION for a protocol version it does not speak, else
    BAD_REQUEST; the request nonce is :func:`nonce_of` what was received (zeros
    when fewer arrived), so the client learns at once why instead of waiting
    for its timeout. The ACK carries no job: it does not say the frame was
    authentic.

    A request whose header has the PEERCRED flag is answered with a PEERCRED
    ACK: its sender has no secret key and could not check any other. (A frame
    of another protocol version is not read past its version byte, so it is
    answered with the secret key.)
    """
    status = AckStatus.VERSION if error.reason == "version" else AckStatus.BAD_REQUEST
    nonce = nonce_of(received)
    flags = 0
    if error.reason != "version" and len(received) >= 8:
        flags = int.from_bytes(received[6:8], "little") & PEERCRED
    return encode(MsgType.ACK, Ack(0, 0, status, nonce), secret, flags=flags)
