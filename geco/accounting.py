"""What a job used, in one place: read from its cgroups, journaled at its end.

The figures come from the kernel's own counters (the backend's
:meth:`~geco.cgroup.Backend.usage`), so they include every process that ever
ran in the job's cgroups, also those that exited long ago:

* ``memory_peak``: highest RAM use (v1 ``memory.max_usage_in_bytes``,
  v2 ``memory.peak``);
* ``cpu_user`` / ``cpu_system``: CPU seconds (v1 ``cpuacct.stat``,
  v2 ``cpu.stat``); None when this node does not account CPU per cgroup;
* ``oom_kills``: processes the kernel's OOM killer ended in the job.

The same record is journaled as ``GECO_EVENT=job-end`` (by the epilog, or by
gecod's reaper when no epilog ran), shown by ``geco status --job`` while the
job runs and by ``geco journal`` after it.
"""

from __future__ import annotations

from collections.abc import Mapping

from geco._tuple import NamedTuple
from geco.units import format_memory

__all__ = ["Accounting"]

_USEC = 1_000_000


class Accounting(NamedTuple):
    """A job's resource use as its cgroups counted it.

    Attributes
    ----------
    memory_peak: bytes (0 when the kernel keeps no peak).
    cpu_user, cpu_system: CPU seconds, None when CPU time is not accounted.
    oom_kills: processes killed by the OOM killer inside the job.
    """

    memory_peak: int = 0
    cpu_user: float | None = None
    cpu_system: float | None = None
    oom_kills: int = 0

    @classmethod
    def from_usage(cls, usage: Mapping[str, int]) -> Accounting:
        """Build the record from a backend's ``usage()`` mapping (missing keys = not known)."""
        user = usage.get("cpu_user_usec")
        system = usage.get("cpu_system_usec")
        return cls(memory_peak=usage.get("memory_peak", 0),
                   cpu_user=None if user is None else user / _USEC,
                   cpu_system=None if system is None else system / _USEC,
                   oom_kills=usage.get("oom_kill", 0))

    def journal_fields(self) -> dict[str, object]:
        """Journal fields: ``MEMORY_PEAK`` (bytes), ``CPU_USER_SEC``, ``CPU_SYSTEM_SEC``
        (seconds with three decimals; left out when not accounted), ``OOM_KILLS``."""
        fields: dict[str, object] = {"MEMORY_PEAK": self.memory_peak,
                                     "OOM_KILLS": self.oom_kills}
        if self.cpu_user is not None:
            fields["CPU_USER_SEC"] = f"{self.cpu_user:.3f}"
        if self.cpu_system is not None:
            fields["CPU_SYSTEM_SEC"] = f"{self.cpu_system:.3f}"
        return fields

    def describe(self) -> str:
        """One line for people: ``peak memory 1.5G, CPU 12.3 s user + 0.4 s system, 1 OOM kill``."""
        parts = [f"peak memory {format_memory(self.memory_peak)}"]
        if self.cpu_user is not None and self.cpu_system is not None:
            parts.append(f"CPU {self.cpu_user:.1f} s user + {self.cpu_system:.1f} s system")
        kills = self.oom_kills
        parts.append("no OOM kill" if kills == 0 else
                     f"{kills} OOM kill{'s' if kills != 1 else ''}")
        return ", ".join(parts)
