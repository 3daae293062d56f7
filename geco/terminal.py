"""What a user chose (a job's name, a process's comm, a path, a journal message), made safe
to print on an admin's terminal.

A control character in such text is an instruction to the terminal, not a letter: an
escape sequence can move the cursor, rewrite what an earlier line said, set the window's
title or, on some terminals, answer back as if typed. So every byte a user chose is
printed as text: C0 and C1 controls and DEL as ``\\xNN``, the bidirectional overrides
that reorder a line as ``\\u202e``, a byte that is not UTF-8 (kept by ``surrogateescape``)
as the ``\\xNN`` it was. JSON output needs none of this (``json.dumps`` escapes them).
"""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 but tab and newline, DEL and C1; bidi embeddings, overrides and isolates; the
# surrogates surrogateescape keeps undecodable bytes in
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\udc80-\udcff]")
_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\udc80-\udcff]")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character that would steer a terminal written out as an
    escape; ``lines``: newlines and tabs are kept (a message of several lines), else they
    are escaped too (one field on one line)."""
    return (_UNSAFE if lines else _NEWLINE).sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as surrogateescape kept it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
