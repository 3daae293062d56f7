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

Grid Engine's own words for a job (``JOB_ID`` and ``SGE_TASK_ID``, the queue's
``$job_id $ja_task_id``) are read by :meth:`JobKey.from_sge`, :meth:`JobKey.job_of`
and :meth:`JobKey.task_of`, the one Python home of that rule (its C twin is
``libgeco/geco_job.c``; both are tested against ``tests/vectors/job_identity.json``):
a job id is decimal digits only, no sign, blank or leading zero, 1 to 19 digits; a
task id is the same, or absent, ``""``, ``0`` or ``undefined``, which mean task 1
(not an array job: Grid Engine says ``$ja_task_id`` 0 and ``SGE_TASK_ID=undefined``
and spools it as ``<job>.1``). Anything else is refused.
"""

from __future__ import annotations

import re

from geco.errors import JobKeyError

__all__ = ["JOB_ID_RULE", "TASK_ID_RULE", "JobKey"]

_KEY_RE = re.compile(r"(0|[1-9][0-9]{0,18})\.(0|[1-9][0-9]{0,18})")
_ID_RE = re.compile(r"[1-9][0-9]{0,18}")
# not an array job: absent, "" (nothing to read), $ja_task_id 0, SGE_TASK_ID=undefined
_TASK_ONE = (None, "", "0", "undefined")

#: What an id Grid Engine writes must be (libgeco/geco_job.c says the same words).
JOB_ID_RULE = ("JOB_ID must be a number from 1 to 9999999999999999999, digits only, no "
               "leading zero")
TASK_ID_RULE = ('SGE_TASK_ID must be "undefined", 0 or a number from 1 to '
                "9999999999999999999, digits only, no leading zero")


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

    @staticmethod
    def is_key_text(text: str) -> bool:
        """True when ``text`` is a key (the name of a job's cgroup, resource or usage file)."""
        return _KEY_RE.fullmatch(text) is not None

    @classmethod
    def parse(cls, text: str) -> JobKey:
        """Return ``text`` as a key (it must be ``<job>.<task>``, e.g. ``42.1``)."""
        if isinstance(text, JobKey):
            return text
        if not isinstance(text, str) or _KEY_RE.fullmatch(text) is None:
            raise JobKeyError("a job cgroup key must be <job>.<task> in decimal digits "
                              f"without leading zeros (e.g. 42.1), got {text!r}")
        return str.__new__(cls, text)

    @classmethod
    def from_sge(cls, job: str | bytes | None, task: str | bytes | int | None) -> JobKey:
        """Return the key Grid Engine names with ``JOB_ID`` (or ``$job_id``) ``job`` and
        ``SGE_TASK_ID`` (or ``$ja_task_id``) ``task`` (None: absent), by :meth:`job_of`
        and :meth:`task_of`."""
        return cls(cls.job_of(job), cls.task_of(task))

    @staticmethod
    def job_of(text: str | bytes | None) -> int:
        """Return the job id ``text`` says (digits only, 1 to 19 of them, no leading zero)."""
        if isinstance(text, bytes):
            text = text.decode("ascii", "replace")
        if not isinstance(text, str) or _ID_RE.fullmatch(text) is None:
            raise JobKeyError(f"{JOB_ID_RULE}, got {text!r}")
        return int(text)

    @staticmethod
    def task_of(text: str | bytes | int | None) -> int:
        """Return the array task ``text`` says: absent (None), ``""``, ``0`` or
        ``undefined`` is task 1 (not an array job), else as :meth:`job_of`. An int is
        a task id a message carries (0: task 1)."""
        if isinstance(text, bytes):
            text = text.decode("ascii", "replace")
        elif isinstance(text, int):
            text = str(text)  # a message's number reads as its text does (0: task 1)
        if text in _TASK_ONE:
            return 1
        try:
            return JobKey.job_of(text)
        except JobKeyError:
            raise JobKeyError(f"{TASK_ID_RULE}, got {text!r}") from None

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
