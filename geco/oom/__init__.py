"""OOM kills in job cgroups: detect each one, count it once, tell the owner and the journal.

The kernel's OOM killer stays in charge; geco only watches. The parts, one
module each (every public name is also here, as ``geco.oom.<name>``):

* :mod:`geco.oom.watch`: :class:`OomWatch`, one job cgroup's pollable fd (a
  v1 eventfd on ``memory.oom_control``, a v2 inotify watch on
  ``memory.events``) and the kernel's ``oom_kill`` counter compared with the
  count already reported, kept in ``<state_dir>/oom/<job>.<task>`` so a
  restarted gecod neither repeats nor misses a kill; each new kill is an
  :class:`OomEvent`.
* :mod:`geco.oom.kmsg`: :class:`KernelLog`, who was killed, from the
  ``oom-kill:`` lines of ``/dev/kmsg``; a kill whose line is missing is
  reported as "a process", never dropped.
* :mod:`geco.oom.message`: :func:`owner_message`, what the owner reads
  (HTCondor's style: limit, peak, remedy); a kill while the job was well below
  its limit, or one the kernel log puts outside the job's cgroup, is a
  node-wide shortage and says so instead of blaming the job.
* :mod:`geco.oom.asowner`: :func:`append_to_owner_file`, that text
  appended to the job's stderr file as the owner (in the job's mount namespace:
  its private /tmp).
* :mod:`geco.oom.monitor`: :class:`OomMonitor`, every job cgroup watched in
  gecod's runloop, and :func:`handle`, the journal record (``GECO_EVENT=oom``)
  and the policy (``[gecod] oom``): ``kernel`` reports only; ``kill-job`` also
  ends the whole job at its first kill, as Slurm's ``OOMKillStep`` does.

Threads: :class:`OomWatch`, :class:`KernelLog` and :class:`OomMonitor` belong
to the runloop's thread; :func:`handle` blocks (a fork per owner message, the
cgroup kill) and runs in a worker.

What gecod needs for all of it (each part degrades on its own, logged): read
access to ``/dev/kmsg`` (CAP_SYSLOG when ``kernel.dmesg_restrict=1``; no
systemd ``PrivateDevices=``/``ProtectKernelLogs=``), CAP_SETUID and CAP_SETGID
to write as the owner, the owners' output files writable in its mount
namespace (no ``ProtectHome=``/``ProtectSystem=strict`` over them), and
CAP_KILL for ``kill-job``.
"""

from __future__ import annotations

from geco.oom.asowner import (
    JobNamespace,
    StderrTarget,
    append_to_owner_file,
    stderr_target,
)
from geco.oom.kmsg import KMSG, KernelLog, KillRecord, parse_oom_kill
from geco.oom.message import RequestHint, owner_message, request_hint, suggest_request
from geco.oom.monitor import POLICIES, Loop, OomMonitor, check_policy, handle
from geco.oom.watch import OomEvent, OomWatch, open_inotify, parse_keyed, remove_counts

__all__ = [
    "KMSG",
    "POLICIES",
    "JobNamespace",
    "KernelLog",
    "KillRecord",
    "Loop",
    "OomEvent",
    "OomMonitor",
    "OomWatch",
    "RequestHint",
    "StderrTarget",
    "append_to_owner_file",
    "check_policy",
    "handle",
    "open_inotify",
    "owner_message",
    "parse_keyed",
    "parse_oom_kill",
    "remove_counts",
    "request_hint",
    "stderr_target",
    "suggest_request",
]
