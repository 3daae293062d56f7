"""Grid Engine's complex defaults for memory: what a job that requests none is booked.

A consumable complex with a default (``qconf -sc``: ``h_vmem ... YES YES 2G``) is an
implicit request of every job that does not name it: Grid Engine books it, and without
geco enforces ``h_vmem`` on the job's processes itself. ``qstat -j`` never lists such a
default, so a job with none of its own would run unlimited under geco;
:class:`geco.node.limits.MemoryDefault` takes these defaults where ``[cgroup]
memory_per_slot`` / ``vmem_per_slot`` are not set.

``qconf -sc`` is asked at most once per :data:`FRESH_SEC` per node, and only for a job
that requests no memory: its output is kept in ``<state_dir>/complexes`` (a failure for
:data:`RETRY_SEC`, so a qmaster that does not answer costs one timeout, not one per job).
"""

from __future__ import annotations

import os
import time

from geco import log
from geco.atomicfile import write_atomic
from geco.config import Config
from geco.errors import GecoError
from geco.units import parse_memory

__all__ = ["FRESH_SEC", "RETRY_SEC", "memory_defaults", "parse"]

FRESH_SEC = 600.0
RETRY_SEC = 60.0
_NAMES = ("m_mem_free", "h_vmem")
_log = log.get("sge.complexes")


def parse(text: str) -> dict[str, int]:
    """Per-slot bytes of the memory complexes that are consumable with a default other
    than 0 (``qconf -sc`` rows: name shortcut type relop requestable consumable default
    urgency ...; Univa adds columns after these)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 7 or fields[0].startswith("#") or fields[0] not in _NAMES:
            continue
        if fields[5].upper() not in ("YES", "JOB"):
            continue
        try:
            value = parse_memory(fields[6])
        except ValueError:
            continue
        if value:
            found[fields[0]] = int(value)
    return found


def memory_defaults(cfg: Config) -> dict[str, int]:
    """The ``m_mem_free`` and ``h_vmem`` defaults per slot Grid Engine books ({} when none,
    or when qconf cannot be asked: then only ``[cgroup]`` defaults apply, and it says so)."""
    path = cfg.state_dir / "complexes"
    try:
        st = os.stat(path)
        age = time.time() - st.st_mtime
        if (age < FRESH_SEC and st.st_size) or age < RETRY_SEC:
            return parse(path.read_text(errors="replace"))
    except OSError:
        pass
    from geco.sge import command  # only when the kept answer is stale

    text = ""
    try:
        text = command.run_qconf(["-sc"], cfg)
    except GecoError as exc:
        _log.warning("cannot read Grid Engine's complex defaults (%s): a job that requests "
                     "no memory gets [cgroup] memory_per_slot and vmem_per_slot only", exc)
    try:
        write_atomic(path, text.encode(), mode=0o644, make_dir=True, what="complex defaults")
    except GecoError as exc:  # a read-only state dir: asked again next time
        _log.debug("%s", exc)
    return parse(text)
