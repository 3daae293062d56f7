"""A job's files on this node: where each one lives, and forgetting them.

Every file and directory geco keeps for one job task is named here, from the
configuration's directories and the job's key (``<job>.<task>``, checked: nothing like
``..`` or ``/`` reaches a path):

==============  ==============================================  ===========================
what            where (``<state>``: ``[paths] state_dir``)      until
==============  ==============================================  ===========================
resource file   ``<state>/resources/<key>``                     the job's end here
GPU picks       ``<state>/resources/gpu-picks/<key>``           the job's end here
OOM count       ``<state>/oom/<key>``                           the job's end here
stuck marker    ``<state>/stuck/<key>``                         the job's end here
re-queue count  ``<state>/health/requeues/<key>``               the job's start (or a day)
namespace pin   ``<state>/mntns/<key>``                         its private /tmp goes
private /tmp    ``[tmp] base/<key>``, else ``<state>/tmp/<key>``  its private /tmp goes
usage samples   ``<state>/usage/<key>``                         ``[usage] keep_days`` after
trace           ``[log] trace_dir/<key>.trace``                 ``[log] trace_keep_days``
==============  ==============================================  ===========================

:func:`forget` removes the four a job's end leaves nothing of (:data:`ENDED`); its
private /tmp goes with its namespace (:mod:`geco.job.privatetmp`), its samples and trace
stay for its owner to read and are pruned by age (gecod's reaper).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from geco import atomicfile, log
from geco._tuple import NamedTuple
from geco.errors import GecoError
from geco.jobkey import JobKey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from geco.config import Config

__all__ = ["ENDED", "GPU_PICKS", "File", "forget", "gpu_picks", "is_trace", "kept",
           "namespace_pin", "oom_count", "oom_dir", "pins_dir", "requeue_count", "requeues_dir",
           "resource_file", "samples", "stuck_marker", "tmp_dir", "trace"]

GPU_PICKS = "gpu-picks"  # below resources_dir, beside the resource files
_OOM = "oom"  # below state_dir
_STUCK = "stuck"  # below state_dir
_TRACE_SUFFIX = ".trace"

_log = log.get("jobfiles")


def resource_file(resources_dir: Path, key: str) -> Path:
    """The job's resource set for this node (:mod:`geco.sge.resourcefile`)."""
    return resources_dir / JobKey.parse(key)


def gpu_picks(resources_dir: Path, key: str) -> Path:
    """The GPUs geco picked for the job's count (:mod:`geco.sge.gpupicks`)."""
    return resources_dir / GPU_PICKS / JobKey.parse(key)


def oom_count(state_dir: Path, key: str) -> Path:
    """The job's OOM kills gecod has reported (:mod:`geco.oom.watch`)."""
    return oom_dir(state_dir) / JobKey.parse(key)


def oom_dir(state_dir: Path) -> Path:
    """The jobs' OOM counts (gecod prunes those of jobs gone at its start)."""
    return state_dir / _OOM


def stuck_marker(state_dir: Path, key: str) -> Path:
    """Says the queue was disabled for the job (:mod:`geco.job.teardown`)."""
    return state_dir / _STUCK / JobKey.parse(key)


def requeues_dir(state_dir: Path) -> Path:
    """The jobs' re-queue counts (:mod:`geco.node.health`)."""
    return state_dir / "health" / "requeues"


def requeue_count(state_dir: Path, key: str) -> Path:
    """The master's re-queues of a job that has not started (:mod:`geco.node.health`)."""
    return requeues_dir(state_dir) / JobKey.parse(key)


def pins_dir(state_dir: Path) -> Path:
    """Where the jobs' mount namespaces are pinned (the preload's ``job_mntns``)."""
    return state_dir / "mntns"


def namespace_pin(state_dir: Path, key: str) -> Path:
    """The bind mount that keeps the job's mount namespace (:mod:`geco.job.privatetmp`)."""
    return pins_dir(state_dir) / JobKey.parse(key)


def tmp_dir(cfg: Config, key: str) -> Path:
    """The job's private /tmp and /var/tmp live below this directory."""
    base = Path(cfg.tmp_base) if cfg.tmp_base else cfg.state_dir / "tmp"
    return base / JobKey.parse(key)


def samples(usage_dir: Path, key: str) -> Path:
    """The job's usage samples on this node (:mod:`geco.usage.samples`)."""
    return usage_dir / JobKey.parse(key)


def trace(trace_dir: Path, key: str) -> Path:
    """The job's trace (:mod:`geco.job.trace`)."""
    return trace_dir / f"{JobKey.parse(key)}{_TRACE_SUFFIX}"


def is_trace(name: str) -> bool:
    """True for the name of a trace file (pruned by age)."""
    return name.endswith(_TRACE_SUFFIX)


class File(NamedTuple):
    """One kind of a job's file that its end forgets."""

    what: str  # for the error that names it
    directory: Callable[[Config], Path]

    def path(self, cfg: Config, key: str) -> Path:
        return self.directory(cfg) / JobKey.parse(key)


# What a job's end leaves nothing of, GPU picks before the resource file they ride with:
# a crash between the two leaves a resource file, whose next removal takes both
ENDED = (File("record of GPU picks", lambda cfg: cfg.resources_dir / GPU_PICKS),
         File("resource file", lambda cfg: cfg.resources_dir),
         File("OOM count file", lambda cfg: oom_dir(cfg.state_dir)),
         File("stuck marker", lambda cfg: cfg.state_dir / _STUCK))


def forget(cfg: Config, key: str) -> bool:
    """Remove the files of :data:`ENDED` of a job whose cgroups are gone (missing ones are
    fine); False when one is left, journaled naming it (gecod's reaper tries again).

    Raises
    ------
    JobKeyError
        when ``key`` is no job key.
    """
    key = JobKey.parse(key)  # a key that is none raises here: no file is looked at
    left = False
    for kind in ENDED:
        try:
            atomicfile.remove(kind.path(cfg, key), kind.what)
        except GecoError as exc:
            _log.warning("job %s: %s", key, exc)
            left = True
    return not left


def kept(cfg: Config) -> dict[JobKey, float]:
    """``{job: when its newest file of :data:`ENDED` changed}`` for every job that has
    one here (gecod's reaper forgets those that no longer run)."""
    newest: dict[JobKey, float] = {}
    for kind in ENDED:
        directory = kind.directory(cfg)
        try:
            names = os.listdir(directory)
        except OSError:  # none yet, or unreadable: nothing of it to forget
            continue
        for name in names:
            if not JobKey.is_key_text(name):
                continue
            try:
                mtime = os.stat(directory / name, follow_symlinks=False).st_mtime
            except OSError:  # gone meanwhile
                continue
            key = JobKey.parse(name)
            newest[key] = max(mtime, newest.get(key, mtime))
    return newest
