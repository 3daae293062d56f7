"""The name of one task of one Grid Engine job: ``<job>.<task>``.

A :class:`JobKey` is what every part of geco calls a job by: the name of its
cgroups, of its resource file, of its spool dir (``active_jobs/<job>.<task>``),
of its OOM and stuck markers. Non-array jobs are task 1 (Grid Engine spools
them as ``<job>.1``).

It is a ``str`` (``"42.1"``), so it is a path component and a dict key as it
stands, with the two numbers at hand (``key.job``, ``key.task``). Every key
geco makes or reads from outside (a directory name, a request) goes through
:meth:`JobKey.parse` or the constructor, which accept decimal numbers without
leading zeros only: a key can never be ``..``, ``1/2`` or a name with a NUL.
"""

from __future__ import annotations

import re

from geco.errors import JobKeyError

__all__ = ["JobKey"]

_KEY_RE = re.compile(r"(0|[1-9][0-9]{0,18})\.(0|[1-9][0-9]{0,18})")


class JobKey(str):
    """``<job>.<task>``: ``JobKey(42, 1) == JobKey.parse("42.1") == "42.1"``.

    Raises
    ------
    JobKeyError
        when an id is not a non-negative int (the constructor) or the text is
        not two such numbers joined by a dot (:meth:`parse`).
    """

    __slots__ = ()

    def __new__(cls, job: int, task: int = 1) -> JobKey:
        if isinstance(job, bool) or isinstance(task, bool) or not isinstance(job, int) \
                or not isinstance(task, int):
            raise JobKeyError(f"job and task ids must be ints, got {job!r} and {task!r}")
        return cls.parse(f"{job}.{task}")

    @classmethod
    def parse(cls, text: str) -> JobKey:
        """Return ``text`` as a key (it must be ``<job>.<task>``, e.g. ``42.1``)."""
        if isinstance(text, JobKey):
            return text
        if not isinstance(text, str) or _KEY_RE.fullmatch(text) is None:
            raise JobKeyError("a job cgroup key must be <job>.<task> in decimal digits "
                              f"without leading zeros (e.g. 42.1), got {text!r}")
        return str.__new__(cls, text)

    @property
    def job(self) -> int:
        """The Grid Engine job number."""
        return int(self.partition(".")[0])

    @property
    def task(self) -> int:
        """The array task number (1 for a non-array job)."""
        return int(self.partition(".")[2])

    def order(self) -> tuple[int, int]:
        """``(job, task)``: sort keys with ``sorted(keys, key=JobKey.order)`` (as text,
        ``10.1`` would come before ``9.1``)."""
        return self.job, self.task
