"""A job's story from the journal: ``geco journal N[.T]``.

Every hook and gecod journal what they do for a job with ``JOB_ID``,
``SGE_TASK_ID`` and ``GECO_EVENT`` (see :func:`geco.log.job_fields`), so the
journal alone tells what happened to a job on this node: resources read,
cgroups made, processes quarantined, OOM kills, the end-of-job accounting,
cleanup. This module reads those entries back and prints them one line each,
oldest first, then what the job-end entry says::

    2026-11-22 02:46:20  geco-prolog  job-contained  job 42.1 contained on n001: cores 0-1, ...
    2026-11-22 02:51:07  geco-epilog  job-end        job 42.1 ended: peak memory 1.2G, ...
    job 42.1 ended 2026-11-22 02:51:07: peak memory 1.2G, CPU 3.1 s user + 0.2 s system,
    no OOM kill, 2 processes killed at cleanup (by epilog)

The journal is read with systemd-python's ``Reader`` through the journal's
field index (``JOB_ID=N``), so a job's entries come back in milliseconds
whatever the journal's size. The journal is per node: run this on the node
the job ran on.

Grid Engine reuses job numbers (after they wrap around, a qmaster installed anew,
a node that served another cluster), so the entries of a number may tell of
several jobs. Entries say which job they are about with ``SGE_CLUSTER`` and
``JOB_SUBMITTED`` (:mod:`geco.sge.jobinstance`); :func:`instances` splits them
into jobs, and the story shows the newest unless asked for an earlier one or all
(:func:`format_stories`), with a line saying what else the journal holds.

Any local process may send journald an entry with any field it likes (``logger
--journald``): ``SYSLOG_IDENTIFIER=gecod``, ``GECO_EVENT=job-end``, a ``JOB_ID`` of
another user's job. Only the fields journald adds itself, which start with ``_`` and
which no client can send, are the kernel's word on who wrote an entry. So an entry is
geco's (:attr:`Entry.by_root`) only when its ``_UID`` is root's: hooks and gecod run as
root. Another's (the starter runs as the job's owner; any user may name any job) is
shown with the uid that wrote it and never decides how the story ends or which job of a
number it tells. Everything printed is escaped for the terminal (:mod:`geco.terminal`).

Reading the system journal needs root or the ``systemd-journal`` group; a
``Reader`` that may not open a file silently skips it, so
:func:`check_access` looks at the files first and says so instead of showing
an empty story.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from geco import log
from geco.accounting import Accounting
from geco.errors import GecoError
from geco.terminal import printable

__all__ = ["JOURNAL_DIRS", "Entry", "Instance", "accounting_from_fields", "check_access",
           "format_entry", "format_stories", "format_story", "instances", "others_note",
           "pick", "read", "summary", "to_json"]

# journald's runtime and persistent stores (journald(8)); a Reader with the
# default LOCAL_ONLY flag opens the files of this machine in both
JOURNAL_DIRS = (Path("/run/log/journal"), Path("/var/log/journal"))
_CANNOT_READ = "cannot read the journal: add yourself to the systemd-journal group or ask an admin"
# Fields every entry has that say nothing about the job; --json leaves them out
# unless --all-fields (journald's own trusted fields start with "_").
_PLUMBING = frozenset({"CODE_FILE", "CODE_LINE", "CODE_FUNC", "SYSLOG_PID", "SYSLOG_FACILITY",
                       "SYSLOG_TIMESTAMP", "SYSLOG_RAW"})
# journald's own field naming the writer's uid: --json keeps it, it says whose word it is
_WRITER = "_UID"
# The entries that end a job task's story, the last one wins.
_END_EVENTS = ("job-end", "cleanup-stuck")
# How long before a job's first entry one that names no job may be that job's (its records
# before geco had its resource set: qstat's retries take at most minutes).
_LEAD_USEC = 10 * 60 * 1_000_000
# JOB_SUBMITTED values past this (or not numbers: nan) are shown as written, not as a time
_LAST_SECOND = 253402300800  # 10000-01-01

FieldValue = str | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Entry:
    """One journal entry, its values as text.

    Attributes
    ----------
    usec: when journald received it, microseconds since the epoch (``__REALTIME_TIMESTAMP``).
    fields: every field but the timestamp; a field the entry repeats is a tuple.
    """

    usec: int
    fields: Mapping[str, FieldValue] = field(default_factory=dict)

    def get(self, name: str, default: str = "") -> str:
        """Return field ``name`` (its first value when repeated), or ``default``."""
        value = self.fields.get(name)
        if value is None:
            return default
        return value if isinstance(value, str) else (value[0] if value else default)

    @property
    def by_root(self) -> bool:
        """Written by a process of root's, by journald's word (``_UID``): geco's."""
        return self.get(_WRITER) == "0"

    @property
    def identifier(self) -> str:
        """``SYSLOG_IDENTIFIER``: who wrote it (``geco-prolog``, ``gecod``, ...), followed
        by the uid that wrote it when that is not root (the writer chose the name)."""
        name = self.get("SYSLOG_IDENTIFIER", "?")
        return name if self.by_root else f"{name}[uid {self.get(_WRITER, '?')}]"

    @property
    def event(self) -> str:
        """``GECO_EVENT``, "" when the entry has none."""
        return self.get("GECO_EVENT")

    @property
    def ends(self) -> bool:
        """One of root's entries that end a job task's story."""
        return self.by_root and self.event in _END_EVENTS

    @property
    def key(self) -> str:
        """``<job>.<task>``, or ``<job>`` when the entry names no task."""
        task = self.get("SGE_TASK_ID")
        return f"{self.get('JOB_ID')}.{task}" if task else self.get("JOB_ID")

    @property
    def instance(self) -> tuple[str, str] | None:
        """Which job of its number: ``(SGE_CLUSTER, JOB_SUBMITTED)``, None when it names
        neither (an older geco's entry, or one written when geco did not know) or is not
        root's (its writer chose them)."""
        cluster, submitted = self.get(log.CLUSTER_FIELD), self.get(log.SUBMITTED_FIELD)
        return (cluster, submitted) if (cluster or submitted) and self.by_root else None


@dataclass(frozen=True, slots=True)
class Instance:
    """One job of the number asked for, with its entries.

    Attributes
    ----------
    cluster, submitted: its ``SGE_CLUSTER`` and ``JOB_SUBMITTED`` (either may be "");
        both "" for the entries that name no job and lie before every job that does.
    entries: oldest first.
    """

    cluster: str
    submitted: str
    entries: tuple[Entry, ...]

    @property
    def known(self) -> bool:
        """False for the group of entries that name no job (an older geco's)."""
        return bool(self.cluster or self.submitted)

    def title(self, job: int | str) -> str:
        """``job 42 submitted 2026-11-22 02:40:05, cluster p6444``, for a heading."""
        if not self.known:
            return (f"job {job}: entries that name no cluster or submission time (an older "
                    f"geco's; one job or several)")
        seconds = _number(self.submitted)
        if not self.submitted:
            when = "submission time unknown"
        elif seconds is None or not 0 <= seconds < _LAST_SECOND:  # hand-written: as it is
            when = f"submitted {self.submitted}"
        else:
            when = f"submitted {_when(round(seconds * 1_000_000))}"
        return f"job {job} {when}, cluster {self.cluster or 'unknown'}"


def _text(value: object) -> FieldValue:
    """A Reader value as text: bytes decoded (undecodable bytes kept as surrogate escapes)."""
    if isinstance(value, list):
        return tuple(_scalar(v) for v in value)
    return _scalar(value)


def _scalar(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, tuple) and value:  # __MONOTONIC_TIMESTAMP: (usec, boot id)
        return str(value[0])
    return str(value)


def _entry(raw: Mapping[str, object]) -> Entry:
    usec = raw.get("__REALTIME_TIMESTAMP", 0)
    return Entry(usec=usec if isinstance(usec, int) else int(_scalar(usec) or 0),
                 fields={k: _text(v) for k, v in raw.items() if k != "__REALTIME_TIMESTAMP"})


def check_access(dirs: Iterable[Path] = JOURNAL_DIRS,
                 machine_id: str | None = None) -> list[Path]:
    """Check that this process can read the system journal; return the files it cannot read.

    Parameters
    ----------
    dirs: journald's stores.
    machine_id: whose files (default: this machine's, from ``/etc/machine-id``).

    Returns
    -------
    list[Path]
        System journal files (or store directories) that are not readable,
        when others are: the story may then lack entries.

    Raises
    ------
    GecoError
        ``cannot read the journal: add yourself to the systemd-journal group or
        ask an admin``, with the first unreadable path, when system journal
        files exist and none of them can be read.
    """
    if machine_id is None:
        try:
            machine_id = Path("/etc/machine-id").read_text().strip()
        except OSError:
            machine_id = ""
    readable = 0
    refused: list[Path] = []
    for base in dirs:
        store = base / machine_id if machine_id else base
        try:
            names = sorted(e.name for e in os.scandir(store))
        except FileNotFoundError:
            continue
        except PermissionError:
            refused.append(store)
            continue
        except OSError as exc:
            raise GecoError.from_oserror("cannot list the journal files", exc,
                                         path=store) from exc
        for name in names:
            # journald's system files: system.journal and its archives system@...journal(~)
            if not (name.startswith("system") and ".journal" in name):
                continue
            path = store / name
            if os.access(path, os.R_OK):
                readable += 1
            else:
                refused.append(path)
    if refused and not readable:
        raise GecoError(_CANNOT_READ, path=refused[0])
    return refused


def read(job: int, task: int | None = None) -> list[Entry]:
    """Return the journal entries of job ``job`` (and task ``task``), oldest first.

    Parameters
    ----------
    job: the Grid Engine job id (``JOB_ID``).
    task: the array task (``SGE_TASK_ID``); None = every task, and entries
        that name no task.

    Returns
    -------
    list[Entry]
        Sorted by the time journald received them.

    Raises
    ------
    GecoError
        when systemd-python is missing or the journal cannot be opened. (Files
        the caller may not read are skipped by the journal library without an
        error: call :func:`check_access` first.)
    """
    try:
        from systemd import journal
    except ImportError as exc:
        raise GecoError("cannot read the journal: the Python module systemd (package "
                        "systemd-python / python3-systemd) is not installed") from exc
    # Raw values for the fields systemd-python would turn into ints, UUIDs and
    # datetimes: the story prints them as journalctl does, as text.
    raw = {name: _identity for name in journal.DEFAULT_CONVERTERS}
    try:
        with journal.Reader(converters=raw) as reader:
            reader.add_match(JOB_ID=str(job))
            if task is not None:
                reader.add_match(SGE_TASK_ID=str(task))
            entries = [_entry(e) for e in reader]
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the journal", exc, job=job) from exc
    # journal files interleave by time already; a stable sort makes it certain
    # across files written by several journald instances (one per boot)
    entries.sort(key=lambda e: e.usec)
    return entries


def _identity(value: object) -> object:
    return value


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def accounting_from_fields(fields: Mapping[str, FieldValue] | Entry) -> Accounting | None:
    """Rebuild the job-end accounting from a journal entry's fields.

    The inverse of :meth:`Accounting.journal_fields`: ``MEMORY_PEAK`` (bytes),
    ``CPU_USER_SEC`` and ``CPU_SYSTEM_SEC`` (seconds; absent = not accounted),
    ``OOM_KILLS``.

    Returns
    -------
    Accounting | None
        None when the entry holds no ``MEMORY_PEAK`` that is a number (a
        job-end without figures: the job had no cgroups on the node); any
        other field that is missing or not a number counts as not known.
    """
    entry = fields if isinstance(fields, Entry) else Entry(0, fields)
    peak = _number(entry.get("MEMORY_PEAK"))
    if peak is None or peak < 0:
        return None
    kills = _number(entry.get("OOM_KILLS"))
    return Accounting(memory_peak=int(peak), cpu_user=_number(entry.get("CPU_USER_SEC")),
                      cpu_system=_number(entry.get("CPU_SYSTEM_SEC")),
                      oom_kills=int(kills) if kills is not None and kills >= 0 else 0)


def _when(usec: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(usec / 1_000_000))


def _plural(n: int, word: str, plural: str) -> str:
    return f"{n} {word if n == 1 else plural}"


def _end_line(entry: Entry, oom_entries: int) -> str:
    """``job 42.1 ended <time>: <accounting>, <cleanup>`` from a job-end entry.

    ``oom_entries`` (the task's ``oom`` entries) stands in for ``OOM_KILLS``
    when the entry has none: epilogs before the accounting record wrote only
    the peak, and "no OOM kill" must not be claimed from a missing field.
    """
    acc = accounting_from_fields(entry)
    if acc is not None and not entry.get("OOM_KILLS"):
        acc = acc._replace(oom_kills=oom_entries)
    parts = [acc.describe() if acc else "no accounting recorded"]
    killed = _number(entry.get("KILLED"))
    by = entry.get("CLEANED_BY")
    if killed is not None:
        n = int(killed)
        parts.append(("nothing left to kill at cleanup" if n == 0 else
                      f"{_plural(n, 'process', 'processes')} killed at cleanup")
                     + (f" (by {by})" if by else ""))
    elif by:
        parts.append(f"cleaned up by {by}")
    return f"job {entry.key} ended {_when(entry.usec)}: {', '.join(parts)}"


def _stuck_line(entry: Entry) -> str:
    pids = entry.get("PIDS")
    what = f"processes {pids} survived SIGKILL" if pids else "processes survived SIGKILL"
    return (f"job {entry.key}: no job-end entry yet; cleanup stuck at {_when(entry.usec)}: "
            f"{what}, cgroups kept (gecod's reaper retries)")


def summary(entries: Sequence[Entry], job: int | str, task: int | None = None) -> list[str]:
    """Return one line per task telling how it ended, from its latest end entry.

    Parameters
    ----------
    entries: the job's entries, oldest first.
    job, task: what was asked for (names the job when no entry names a task).

    Returns
    -------
    list[str]
        Per task, in the order tasks first appear: ``job 42.1 ended <time>:
        peak memory 1.2G, CPU 3.1 s user + 0.2 s system, no OOM kill, 2
        processes killed at cleanup (by epilog)``; ``job 42.1: no job-end entry
        yet; cleanup stuck ...`` when the last word is a stuck cleanup; or
        ``job 42.1: no job-end entry yet (still running?)``.
    """
    tasks = list(dict.fromkeys(e.key for e in entries if e.get("SGE_TASK_ID")))
    if not tasks:
        tasks = [f"{job}.{task}" if task is not None else str(job)]
    lines = []
    for key in tasks:
        ends = [e for e in entries if e.key == key and e.ends]
        if not ends:
            lines.append(f"job {key}: no job-end entry yet (still running?)")
        elif ends[-1].event == "job-end":
            ooms = sum(1 for e in entries if e.key == key and e.by_root and e.event == "oom")
            lines.append(_end_line(ends[-1], ooms))
        else:
            lines.append(_stuck_line(ends[-1]))
    return [printable(line) for line in lines]


def format_entry(entry: Entry, widths: Sequence[int] = (0, 0), *, show_key: bool = False,
                 all_fields: bool = False) -> str:
    """Return one entry for people: ``<local time>  <identifier>  <event>  <message>``.

    Parameters
    ----------
    entry: the entry.
    widths: the identifier and event columns' widths (padding only; longer text is kept).
    show_key: put ``<job>.<task>`` after the time (a story of several tasks).
    all_fields: follow with one ``    KEY=value`` line per field, sorted.

    Returns
    -------
    str
        Without a trailing newline; further lines of a multi-line message are
        indented under the message's first line.
    """
    cols = [_when(entry.usec)]
    if show_key:
        cols.append(printable(entry.key))
    cols += [printable(entry.identifier).ljust(widths[0]),
             printable(entry.event or "-").ljust(widths[1])]
    head = "  ".join(cols) + "  "
    message = printable(entry.get("MESSAGE").rstrip("\n"), lines=True).split("\n")
    lines = [(head + message[0]).rstrip()]
    lines += [(" " * len(head) + more).rstrip() for more in message[1:]]
    if all_fields:
        for name in sorted(entry.fields):
            if name == "MESSAGE":
                continue
            value = entry.fields[name]
            shown = value if isinstance(value, str) else " | ".join(value)
            lines.append(printable(f"    {name}={shown}"))
    return "\n".join(lines)


def format_story(entries: Sequence[Entry], job: int | str, task: int | None = None, *,
                 all_fields: bool = False) -> str:
    """Return the job's entries (:func:`format_entry`) then its :func:`summary`, ``\\n``-ended."""
    widths = (max((len(printable(e.identifier)) for e in entries), default=0),
              max((len(printable(e.event or "-")) for e in entries), default=0))
    show_key = len({e.key for e in entries}) > 1
    lines = [format_entry(e, widths, show_key=show_key, all_fields=all_fields) for e in entries]
    lines += summary(entries, job, task)
    return "\n".join(lines) + "\n"


def to_json(entry: Entry, *, all_fields: bool = False) -> str:
    """Return one entry as a line of JSON, in ``journalctl -o json``'s shape.

    Values are strings (a repeated field a list), ``__REALTIME_TIMESTAMP`` in
    microseconds. Without ``all_fields`` only the timestamp, ``MESSAGE``,
    ``PRIORITY``, ``SYSLOG_IDENTIFIER``, geco's own fields and ``_UID`` (whose word it
    is) are kept: the journal's other trusted ``_*`` fields, the cursor and the
    ``CODE_*`` location go.
    """
    doc: dict[str, object] = {"__REALTIME_TIMESTAMP": str(entry.usec)}
    for name, value in entry.fields.items():
        if all_fields or name == _WRITER or not (name.startswith("_") or name in _PLUMBING):
            doc[name] = value if isinstance(value, str) else list(value)
    return json.dumps(doc, sort_keys=True)


# ---------------------------------------------------------------------------
# several jobs of one number


def instances(entries: Sequence[Entry]) -> list[Instance]:
    """Split the entries of one job number into the jobs that had it, oldest first.

    Entries that name the same ``SGE_CLUSTER`` and ``JOB_SUBMITTED`` are one job,
    spanning the time from its first such entry to its last. An entry that names
    neither (the starter, which runs as the job's owner; a hook's last lines after
    the job's resource file was removed; an older geco) belongs to the job whose
    span holds it (the latest to start, should spans overlap), else to the nearer of
    the job that ended just before it and one that starts within 10 minutes after
    it. The entries before every job (an older geco's, from before the fields were
    journaled) make one group of their own, first, whose ``known`` is False.

    Returns
    -------
    list[Instance]
        Ordered by their first entry; [] for no entries.
    """
    ordered = sorted(entries, key=lambda e: e.usec)  # stable: journal order within a usec
    spans: dict[tuple[str, str], list[int]] = {}
    for e in ordered:
        key = e.instance
        if key is not None:
            spans.setdefault(key, [e.usec, e.usec])[1] = e.usec
    groups: dict[tuple[str, str] | None, list[Entry]] = {}
    for e in ordered:
        groups.setdefault(e.instance or _owner(e.usec, spans), []).append(e)
    found = [Instance(*key, tuple(groups[key])) for key in sorted(spans, key=spans.__getitem__)]
    if None in groups:
        found.insert(0, Instance("", "", tuple(groups[None])))
    return found


def _owner(usec: int, spans: Mapping[tuple[str, str], list[int]]) -> tuple[str, str] | None:
    """The job an entry written at ``usec`` that names none belongs to (see :func:`instances`)."""
    inside = [k for k, (first, last) in spans.items() if first <= usec <= last]
    if inside:
        return max(inside, key=lambda k: spans[k][0])
    before = max((k for k, (_, last) in spans.items() if last < usec),
                 key=lambda k: spans[k][1], default=None)
    after = min((k for k, (first, _) in spans.items() if usec < first <= usec + _LEAD_USEC),
                key=lambda k: spans[k][0], default=None)
    if after is not None and (before is None or
                              spans[after][0] - usec < usec - spans[before][1]):
        return after
    return before


def pick(found: Sequence[Instance], earlier: int, job: int | str) -> Instance:
    """The newest job of ``found`` (``earlier`` 0), or the one ``earlier`` jobs before it.

    Raises
    ------
    GecoError
        ``this node's journal holds 1 earlier job numbered 42 (--earlier 2)`` when there
        are fewer.
    """
    if not 0 <= earlier < len(found):
        n = max(len(found) - 1, 0)
        held = "no earlier job" if n == 0 else _plural(n, "earlier job", "earlier jobs")
        raise GecoError(f"this node's journal holds {held} numbered {job} (--earlier {earlier})")
    return found[len(found) - 1 - earlier]


def others_note(found: Sequence[Instance], shown: Instance, job: int | str) -> str:
    """What else of the number the journal holds besides ``shown``, "" when nothing.

    E.g. ``2 earlier jobs numbered 42 are in this journal: --all shows them``.
    """
    at = found.index(shown)
    earlier = sum(1 for i in found[:at] if i.known)
    later = len(found) - at - 1
    parts = []
    if earlier or later:
        counts = [_plural(n, f"{word} job", f"{word} jobs")
                  for n, word in ((earlier, "earlier"), (later, "later")) if n]
        parts.append(f"{' and '.join(counts)} numbered {job}")
    if any(not i.known for i in found[:at]):
        parts.append(f"entries of job {job} that name no cluster or submission time (an "
                     f"older geco's)")
    if not parts:
        return ""
    verb = "is" if len(parts) == 1 and earlier + later == 1 else "are"
    return f"{' and '.join(parts)} {verb} in this journal: --all shows them"


def format_stories(found: Sequence[Instance], job: int | str, task: int | None = None, *,
                   earlier: int | None = 0, all_fields: bool = False) -> str:
    """Return the story of one job of the number, or of each (``earlier`` None), ``\n``-ended.

    With one job in the journal this is its :func:`format_story`. With more, each story
    shown starts with a ``-- <title> --`` heading (:meth:`Instance.title`), stories are
    separated by a blank line, and one job's story ends with :func:`others_note`.

    Raises
    ------
    GecoError
        as :func:`pick`, when there is no job ``earlier`` jobs before the newest.
    """
    shown = list(found) if earlier is None else [pick(found, earlier, job)]
    if len(found) == 1:
        return format_story(found[0].entries, job, task, all_fields=all_fields)
    stories = [f"-- {printable(i.title(job))} --\n"
               + format_story(i.entries, job, task, all_fields=all_fields) for i in shown]
    note = others_note(found, shown[0], job) if earlier is not None else ""
    return "\n".join(stories) + (note + "\n" if note else "")
