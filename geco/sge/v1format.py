"""The ``GECOResourceSet_v1{...}`` text: exact serializer and strict parser.

Grammar (bytes; a string's bytes are raw and may be anything, ``,{}:`` NUL
newlines and non-UTF-8 included)::

    resource_set = 'GECOResourceSet_v1' '{' globals (',' node){node_count} [instance] '}' END
    globals      = li ',' li ',' lf ',' b ',' lf ',' i ',' i ',' b ',' b ',' s ',' s ',' s ',' s
    node         = s '{' b ',' i ',' lf ',' lf ',' s ',' s '}'
    instance     = ',instance{' s ',' lf '}'                 (cluster, submission time)
    li           = 'li' ['-'] DIGITS                      (64-bit signed)
    i            = 'i' ['-'] DIGITS                       (32-bit signed)
    lf           = 'lf' ['-'] (DIGITS ['.' DIGITS*] | '.' DIGITS) [('e'|'E') ['+'|'-'] DIGITS]
    b            = 'b' DIGITS                             (0 or 1)
    s            = 's' DIGITS ':' <that many bytes>

The ``instance`` section is geco's, not the original's: which job of its number
the set is (:mod:`geco.sge.jobinstance`; Grid Engine reuses job numbers). It is
written only when the cluster or the submission time is known, so the seed's
example and every file of an older geco read as before (with ``""`` and ``0``);
an older geco refuses a text that has one (a parallel job's PREPARE from an
upgraded master to a slave not yet upgraded: the job is re-queued).

Canonical output, which :func:`serialize` writes and the seed's example uses:
integral ``lf`` values without decimals (``lf0``), others as Python's
shortest ``repr`` (``lf1.5``); no trailing newline. The parser also reads the
original's ``%lf`` text (``lf3221225472.000000``). Memory sizes are ``lf`` in
the text but whole bytes (``int``) in :class:`~geco.resourceset.ResourceSet`.

Both directions raise :class:`~geco.errors.ResourceFormatError`. From
:func:`serialize` its ``offset`` is where the refused value would have started
in the output, and ``source`` is the text written up to there.
"""

from __future__ import annotations

import math
import re

from geco.errors import ResourceFormatError
from geco.resourceset import NodeResources, ResourceSet

__all__ = ["MAX_SIZE", "parse", "serialize"]

#: Largest text either direction accepts. Real files are a few hundred bytes;
#: the cap stops a corrupt or hostile file from costing unbounded memory.
MAX_SIZE = 64 * 1024 * 1024
_MAGIC = b"GECOResourceSet_v1"
_I64 = (-(2**63), 2**63 - 1)
_I32 = (-(2**31), 2**31 - 1)
_COUNT = (0, 2**31 - 1)
_MEM_MAX = 2**63 - 1
_MEM_RULE = f"a whole number of bytes from 0 to {_MEM_MAX}"
_SECONDS_RULE = "a finite number of seconds >= 0"

_RULES: dict[str, re.Pattern[bytes]] = {
    "MAGIC": re.compile(re.escape(_MAGIC)),
    "LBRACE": re.compile(rb"\{"),
    "RBRACE": re.compile(rb"\}"),
    "COMMA": re.compile(rb","),
    "li": re.compile(rb"li(-?[0-9]+)"),
    "i": re.compile(rb"i(-?[0-9]+)"),
    # inf/nan are matched (C's %lf prints them) only to be refused with a clear message
    "lf": re.compile(
        rb"lf(-?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|(?i:inf(?:inity)?|nan)))"
    ),
    "b": re.compile(rb"b([0-9]+)"),
    "s": re.compile(rb"s([0-9]+):"),
    # one token with its comma: a ',' after the last node that starts no instance section
    # is reported as before ("expected '}' after node N of N")
    "INSTANCE": re.compile(rb",instance\{"),
}
_FORMS = {"li": "'li<integer>'", "i": "'i<integer>'", "lf": "'lf<number>'",
          "b": "'b0' or 'b1'", "s": "'s<length>:<bytes>'"}
# group 1: the integer digits. No "0*" before it: two adjacent ways to read a zero made
# the regex backtrack quadratically ("lf" and a MiB of zeros before ".5" never ended).
_WHOLE = re.compile(rb"([0-9]+)(?:\.0*)?")
_WORD = re.compile(rb"[^,{}]{1,21}|[,{}]")


def _found(data: bytes, pos: int) -> str:
    """Describe what sits at ``pos``: up to 20 bytes of the next word, or end of input."""
    word = _WORD.match(data, pos)
    if word is None:
        return "end of input"
    return repr(word[0][:20])[1:] + ("..." if len(word[0]) > 20 else "")


def _show(text: str) -> str:
    """Quote a string for a message, cut to 40 characters (job names can be megabytes)."""
    return repr(text[:40]) + ("..." if len(text) > 40 else "")


def _clip(text: bytes) -> str:
    """A matched (ASCII) number for a message, cut to 40 characters."""
    return text[:40].decode("ascii") + ("..." if len(text) > 40 else "")


class _Tokenizer:
    """Matches named rules at an offset into the input; never copies the rest of it."""

    __slots__ = ("data", "last", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.last = ""  # the field just read, for "expected ',' after <last>"

    def error(self, msg: str, at: int, expected: str) -> ResourceFormatError:
        return ResourceFormatError(msg, offset=at, expected=expected, source=self.data)

    def expect(self, rule: str, expected: str, *phrase: str) -> re.Match[bytes]:
        """Consume ``rule`` or raise "expected <phrase...> at byte N, got <what is there>".

        The phrase comes in pieces, joined only on error: most fields parse fine.
        """
        match = _RULES[rule].match(self.data, self.pos)
        if match is None:
            got = _found(self.data, self.pos)
            raise self.error(f"expected {''.join(phrase)} at byte {self.pos}, got {got}",
                             self.pos, expected)
        self.pos = match.end()
        return match

    def field(self, tag: str, what: str, first: bool) -> tuple[int, bytes]:
        """Consume ',' (unless ``first``) and a typed field; return its value's (offset, text)."""
        if not first:
            self.expect("COMMA", "','", "',' after ", self.last)
        form = _FORMS[tag]
        match = self.expect(tag, form, what, " as ", form)
        self.last = what
        return match.start(1), match[1]

    def bad_value(self, at: int, what: str, rule: str, text: bytes) -> ResourceFormatError:
        return self.error(f"{what} at byte {at} must be {rule}, got {_clip(text)}", at, rule)


# Each field rule below reads the ',' before its field unless it is the first after a '{'.
def _parse_int(tok: _Tokenizer, tag: str, what: str, bounds: tuple[int, int],
               first: bool = False) -> int:
    """li = 'li' ['-'] DIGITS ;  i = 'i' ['-'] DIGITS  (value within ``bounds``)"""
    at, text = tok.field(tag, what, first)
    lo, hi = bounds
    # over 19 significant digits is beyond 64 bits, and int() refuses thousands of digits
    digits = text.lstrip(b"-0") or b"0"
    value = int(digits) * (-1 if text[:1] == b"-" else 1) if len(digits) <= 19 else None
    if value is None or not lo <= value <= hi:
        raise tok.bad_value(at, what, f"an integer from {lo} to {hi}", text)
    return value


def _parse_bool(tok: _Tokenizer, what: str, first: bool = False) -> bool:
    """b = 'b' DIGITS  (value 0 or 1)"""
    at, text = tok.field("b", what, first)
    if text not in (b"0", b"1"):
        raise tok.bad_value(at, what, "0 or 1", text)
    return text == b"1"


def _parse_seconds(tok: _Tokenizer, what: str) -> float:
    """lf = 'lf' NUMBER  (a time: finite, >= 0)"""
    at, text = tok.field("lf", what, False)
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise tok.bad_value(at, what, _SECONDS_RULE, text)
    return value


def _parse_memory(tok: _Tokenizer, what: str) -> int:
    """lf = 'lf' NUMBER  (a memory size: a whole number of bytes, 0 to 2**63-1)"""
    at, text = tok.field("lf", what, False)
    whole = _WHOLE.fullmatch(text)
    value: float | int = math.nan
    if whole is not None:
        # plain digits (with %lf's ".000000") are read exactly, not through a double
        digits = whole[1].lstrip(b"0") or b"0"
        value = int(digits) if len(digits) <= 19 else math.inf
    elif math.isfinite(number := float(text)) and number.is_integer():
        value = int(number)
    if not 0 <= value <= _MEM_MAX:
        raise tok.bad_value(at, what, _MEM_RULE, text)
    return int(value)


def _parse_string(tok: _Tokenizer, what: str, first: bool = False) -> str:
    """s = 's' DIGITS ':' <DIGITS raw bytes>  (decoded UTF-8, surrogateescape)"""
    at, digits = tok.field("s", what, first)
    left = len(tok.data) - tok.pos
    # count significant digits first: int() refuses thousands of digits, and any
    # length over 9 digits is past the size cap anyway
    size = digits.lstrip(b"0") or b"0"
    if len(size) > 9 or int(size) > left:
        raise tok.error(f"{what} at byte {at} declares {_clip(digits)} bytes, "
                        f"but only {left} follow", at, f"at most {left} bytes")
    end = tok.pos + int(size)
    raw = tok.data[tok.pos:end]
    tok.pos = end
    return raw.decode("utf-8", "surrogateescape")


def _parse_node(tok: _Tokenizer, number: int, count: int) -> NodeResources:
    """node = s '{' b ',' i ',' lf ',' lf ',' s ',' s '}'"""
    name = _parse_string(tok, f"the name of node {number} of {count}", first=True)
    node = f"node {_show(name)}"
    tok.expect("LBRACE", "'{'", "'{' after the name of ", node)
    is_slave = _parse_bool(tok, f"the slave flag of {node}", first=True)
    slots = _parse_int(tok, "i", f"the slot count of {node}", _COUNT)
    memory = _parse_memory(tok, f"the memory limit of {node}")
    vmem = _parse_memory(tok, f"the vmem limit of {node}")
    gpus = _parse_string(tok, f"the GPU list of {node}")
    phis = _parse_string(tok, f"the Phi list of {node}")
    tok.expect("RBRACE", "'}'", "'}' after the Phi list of ", node)
    return NodeResources(name, is_slave, slots, memory, vmem, gpus, phis)


def _parse_globals(tok: _Tokenizer) -> tuple[ResourceSet, int]:
    """globals = li ',' li ',' lf ',' b ',' lf ',' i ',' i ',' b ',' b ',' s ',' s ',' s ',' s

    Returns the resource set without nodes, and the node count.
    """
    job = _parse_int(tok, "li", "the job id", _I64, first=True)
    task = _parse_int(tok, "li", "the task id", _I64)
    walltime = _parse_seconds(tok, "the walltime limit")
    standby = _parse_bool(tok, "the standby flag")
    per_slot_vmem = _parse_memory(tok, "the per-slot vmem limit")
    trace = _parse_int(tok, "i", "the trace level", _I32)
    count = _parse_int(tok, "i", "the node count", _COUNT)
    array = _parse_bool(tok, "the array-job flag")
    phi_for_user = _parse_bool(tok, "the phi-for-user flag")
    name = _parse_string(tok, "the job name")
    owner = _parse_string(tok, "the owner")
    group = _parse_string(tok, "the group")
    cwd = _parse_string(tok, "the working directory")
    return ResourceSet(job, task, walltime, standby, per_slot_vmem, trace, array,
                       phi_for_user, name, owner, group, cwd), count


def _parse_resource_set(tok: _Tokenizer) -> ResourceSet:
    """resource_set = 'GECOResourceSet_v1' '{' globals (',' node){node_count} '}' END"""
    magic = repr(_MAGIC.decode())
    tok.expect("MAGIC", magic, magic)
    tok.expect("LBRACE", "'{'", f"'{{' after {magic}")
    head, count = _parse_globals(tok)
    nodes = []
    # the node count drives the loop, so a mismatch is reported where the records disagree
    for number in range(1, count + 1):
        tok.expect("COMMA", "','", "',' before node ", str(number), " of ", str(count))
        nodes.append(_parse_node(tok, number, count))
    last = f"node {count} of {count}" if count else "the working directory (node count 0)"
    cluster, submitted = "", 0.0
    instance = _RULES["INSTANCE"].match(tok.data, tok.pos)
    if instance is not None:
        tok.pos = instance.end()
        cluster, submitted = _parse_instance(tok)
        last = "the instance section"
    tok.expect("RBRACE", "'}'", f"'}}' after {last}")
    if tok.pos != len(tok.data):
        got = _found(tok.data, tok.pos)
        raise tok.error(f"expected end of input after the final '}}' at byte {tok.pos}, "
                        f"got {got}", tok.pos, "end of input")
    return head.replace(nodes=tuple(nodes), cluster=cluster, submitted=submitted)


def _parse_instance(tok: _Tokenizer) -> tuple[str, float]:
    """instance = ',instance{' s ',' lf '}'  (after its opening token)"""
    cluster = _parse_string(tok, "the cluster", first=True)
    submitted = _parse_seconds(tok, "the submission time")
    tok.expect("RBRACE", "'}'", "'}' after the submission time")
    return cluster, submitted


def parse(data: bytes) -> ResourceSet:
    """Parse a ``GECOResourceSet_v1{...}`` text.

    Parameters
    ----------
    data:
        The whole text (a resource file's content), at most :data:`MAX_SIZE` bytes.

    Returns
    -------
    ResourceSet
        With nodes in the order the text lists them.

    Raises
    ------
    geco.errors.ResourceFormatError
        For anything but one complete, well-formed resource set; ``offset`` is the
        byte where it goes wrong, and the message says what was expected there.
    """
    if len(data) > MAX_SIZE:
        rule = f"at most {MAX_SIZE} bytes"
        raise ResourceFormatError(f"a resource text must be {rule}, got {len(data)}",
                                  offset=MAX_SIZE, expected=rule, source=data)
    return _parse_resource_set(_Tokenizer(bytes(data)))


class _Writer:
    """Collects the output and refuses values the format cannot carry.

    Each ``put_*`` writes ``sep`` (default ``','``) and then its field.
    """

    __slots__ = ("key", "parts", "size")

    def __init__(self, key: str) -> None:
        self.key = key
        self.parts: list[bytes] = []
        self.size = 0

    def put(self, *parts: bytes) -> None:
        self.parts.extend(parts)
        self.size += sum(map(len, parts))

    def refuse(self, what: str, rule: str, value: object) -> ResourceFormatError:
        shown = _show(value) if isinstance(value, str) else repr(value)
        return ResourceFormatError(
            f"cannot serialize job {self.key}: {what} must be {rule}, got {shown}",
            offset=self.size, expected=rule, source=b"".join(self.parts))

    def put_int(self, tag: bytes, value: int, what: str, bounds: tuple[int, int],
                sep: bytes = b",") -> None:
        lo, hi = bounds
        if not lo <= value <= hi:
            raise self.refuse(what, f"an integer from {lo} to {hi}", value)
        self.put(sep, tag, b"%d" % value)

    def put_bool(self, value: bool, sep: bytes = b",") -> None:
        self.put(sep, b"b1" if value else b"b0")

    def put_seconds(self, value: float, what: str) -> None:
        value = float(value)
        if not (math.isfinite(value) and value >= 0):
            raise self.refuse(what, _SECONDS_RULE, value)
        # integral values print bare (the seed's 'lf0'); repr is the shortest exact text
        self.put(b",lf", b"%d" % int(value) if value.is_integer() else repr(value).encode())

    def put_memory(self, value: int, what: str) -> None:
        if not 0 <= value <= _MEM_MAX:
            raise self.refuse(what, _MEM_RULE, value)
        self.put(b",lf%d" % value)

    def put_string(self, value: str, what: str, sep: bytes = b",") -> None:
        rule = "text whose only surrogates are escaped undecodable bytes"
        try:
            raw = value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise self.refuse(what, rule, value) from None
        # escapes that spell valid UTF-8 would read back as other text: refuse, never alter
        if raw.decode("utf-8", "surrogateescape") != value:
            raise self.refuse(what, rule, value)
        self.put(sep, b"s%d:" % len(raw), raw)


def serialize(rs: ResourceSet) -> bytes:
    """Write ``rs`` as canonical ``GECOResourceSet_v1{...}`` text (no trailing newline).

    Parameters
    ----------
    rs:
        The resource set; its nodes are written in order.

    Returns
    -------
    bytes
        Text that :func:`parse` turns back into an equal resource set.

    Raises
    ------
    geco.errors.ResourceFormatError
        If a value cannot be represented (an integer out of its field's range, a
        negative or non-finite limit, a string with stray surrogates) or the text
        would exceed :data:`MAX_SIZE`; ``offset`` is where it would have gone.
    """
    # names the record in errors; not a JobKey: the format carries any 64-bit ids
    w = _Writer(f"{rs.job_id}.{rs.task_id}")
    w.put(_MAGIC)
    w.put_int(b"li", rs.job_id, "the job id", _I64, sep=b"{")
    w.put_int(b"li", rs.task_id, "the task id", _I64)
    w.put_seconds(rs.runtime_limit, "the walltime limit")
    w.put_bool(rs.is_standby)
    w.put_memory(rs.per_slot_vmem, "the per-slot vmem limit")
    w.put_int(b"i", rs.trace_level, "the trace level", _I32)
    w.put_int(b"i", len(rs.nodes), "the node count", _COUNT)
    w.put_bool(rs.is_array)
    w.put_bool(rs.phi_for_user)
    w.put_string(rs.job_name, "the job name")
    w.put_string(rs.owner, "the owner")
    w.put_string(rs.group, "the group")
    w.put_string(rs.cwd, "the working directory")
    for number, node in enumerate(rs.nodes, 1):
        w.put_string(node.name, f"the name of node {number} of {len(rs.nodes)}")
        label = f"node {_show(node.name)}"
        w.put_bool(node.is_slave, sep=b"{")
        w.put_int(b"i", node.slots, f"the slot count of {label}", _COUNT)
        w.put_memory(node.memory_limit, f"the memory limit of {label}")
        w.put_memory(node.vmem_limit, f"the vmem limit of {label}")
        w.put_string(node.gpus, f"the GPU list of {label}")
        w.put_string(node.phis, f"the Phi list of {label}")
        w.put(b"}")
    if rs.cluster or rs.submitted:  # never in a set that does not know them: see the module
        w.put_string(rs.cluster, "the cluster", sep=b",instance{")
        w.put_seconds(rs.submitted, "the submission time")
        w.put(b"}")
    w.put(b"}")
    if w.size > MAX_SIZE:
        raise w.refuse("the resource text", f"at most {MAX_SIZE} bytes", w.size)
    return b"".join(w.parts)
