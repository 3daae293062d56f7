"""A job's hard requests, read from ``qstat -xml -j`` in either shape Grid Engine prints.

One reader (:func:`read`), chosen by what the job element holds:

* ``JB_hard_resource_list`` (Son of Grid Engine 8.1.9, Univa/Altair Grid Engine): one
  list for the whole job; items ``qstat_l_requests`` (SoGE) or ``element`` (UGE).
* ``JB_request_set_list`` (Open Cluster Scheduler 9): one request set per scope, its
  ``JRS_scope`` (0 global, 1 master, 2 slave: ``qsub -scope``) and its
  ``JRS_hard_resource_list`` (hpc-gridware/clusterscheduler ``sge_job.h``,
  ``JRS_SCOPE_*``).

Grid Engine leaves empty lists out, so a job that requests nothing has neither. What
geco cannot read - a request set of a scope it does not know, a request without a name,
a request list under a name it does not know (a newer Grid Engine) - is listed in
:attr:`JobRequests.unknown` for the caller to journal: those requests are not applied,
and the admin must hear of it before such a job runs without its limits.

Scopes as Open Cluster Scheduler applies them: a global request holds for every task of
the job, a master request for its master task (the job script, on the master host), a
slave request for each slave task (one per slot besides the master's). A host books the
sum over the tasks it runs (OCS ``sge_resource_utilization.cc``: the master request once,
the slave request for the host's other slots): on the master host the master task and
``slots - 1`` slave tasks, on every other host ``slots`` slave tasks. With global requests
only (Son of Grid Engine; OCS without ``-scope``) that is the request x the host's slots.
A PE with ``job_is_first_task FALSE`` runs one slave task more on the master host (its
master task holds no slot); ``qstat -j`` does not say which a PE does, so a job with both
a master and a slave request for one resource gets one slave request less there than
OCS books. The job-wide values (``h_rt``, ``geco_trace_level``, standby) are the master
task's: the job ends when it does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from decimal import Decimal

from lxml import etree

from geco.errors import QstatParseError
from geco.sge import _xml
from geco.sge.pe_hostfile import shown
from geco.units import decimal_value, parse_memory, parse_time

__all__ = ["JobRequests", "Requests", "read"]

_GLOBAL, _MASTER, _SLAVE = 0, 1, 2
# the most GPUs one request may count (a typo such as 1e9 is an error, not a loop)
_MAX_GPUS = 4096
# Elements of a job, and of an OCS request set, that hold requests geco knows: read, or
# left alone on purpose (soft requests are preferences, not limits; jid/ja_ad lists are
# -hold_jid dependencies; queue lists pick queues). Any other element whose name says
# "resource" or "request" is a shape geco does not know.
_JOB_KNOWN = frozenset({"JB_hard_resource_list", "JB_request_set_list", "JB_soft_resource_list",
                        "JB_jid_request_list", "JB_ja_ad_request_list"})
_SET_KNOWN = frozenset({"JRS_hard_resource_list", "JRS_soft_resource_list",
                        "JRS_ignore_slave_requests_on_master_host"})


@dataclass(frozen=True, slots=True)
class Requests:
    """The hard requests geco uses, of one scope or one task; None = not requested.

    Attributes
    ----------
    h_vmem, m_mem_free: bytes per slot, 0 = no limit (INFINITY).
    h_rt: seconds, 0 = no limit.
    trace_level: ``geco_trace_level``, clamped to 0-4.
    standby: a ``standby*`` request other than 0 or false.
    phi_for_user: ``phi_config_for_user``.
    gpus: the GPU complex's count (per slot or per job: ``[gpu] consumable``).
    """

    h_vmem: int | None = None
    m_mem_free: int | None = None
    h_rt: float | None = None
    trace_level: int | None = None
    standby: bool | None = None
    phi_for_user: bool | None = None
    gpus: int | None = None

    def over(self, wider: Requests) -> Requests:
        """These requests, and ``wider``'s where these have none: a scope's request set
        over the global one (OCS refuses a variable requested in both,
        ``sge_job_verify.cc``)."""
        mine = {f.name: getattr(self, f.name) for f in fields(self)}
        return Requests(**{name: getattr(wider, name) if value is None else value
                           for name, value in mine.items()})


@dataclass(frozen=True, slots=True)
class JobRequests:
    """A job's requests with their scopes applied, and what geco could not read.

    Attributes
    ----------
    master: the master task's requests (global and master scope).
    slave: each slave task's requests (global and slave scope).
    unknown: each part of the XML that holds requests in a shape geco does not know,
        in words naming its element; empty when every request was read.
    """

    master: Requests = Requests()
    slave: Requests = Requests()
    unknown: tuple[str, ...] = ()

    def _tasks(self, slots: int, is_master: bool) -> tuple[tuple[Requests, int], ...]:
        """The tasks a host with ``slots`` slots runs: (requests, how many)."""
        if is_master:
            return (self.master, 1), (self.slave, slots - 1)
        return ((self.slave, slots),)

    def host_memory(self, name: str, slots: int, is_master: bool) -> int:
        """Bytes of ``name`` (``h_vmem`` or ``m_mem_free``) a host's tasks asked for
        together; 0 = no limit (a task on it asked for none, or the sum reaches 2**63,
        which the resource file's int64 sizes cannot hold)."""
        total = 0
        for task, count in self._tasks(slots, is_master):
            per_slot = getattr(task, name)
            if count and not per_slot:
                return 0
            total += (per_slot or 0) * count
        return 0 if total >= _xml.NO_LIMIT else total

    def host_gpus(self, slots: int, is_master: bool, per: str) -> int:
        """GPUs a host's tasks asked for: per slot (``per`` ``slot``), or the job's count
        on its master host (``job``: a JOB consumable is booked with the master task)."""
        if per == "job":
            return (self.master.gpus or 0) if is_master else 0
        return sum((task.gpus or 0) * count for task, count in self._tasks(slots, is_master))


def read(job: etree._Element, gpu_name: str) -> JobRequests:
    """Read a job's hard requests from its ``qstat -xml -j`` element (``djob_info/element``).

    Parameters
    ----------
    job: the job's element.
    gpu_name: the GPU complex (``[gpu] complex``), whose request is a count.

    Returns
    -------
    JobRequests
        The master and slave tasks' requests, and the parts geco could not read.

    Raises
    ------
    QstatParseError
        a request whose value has the wrong type, naming the request and the element.
    """
    unknown = [_shown_tag(child) for child in job
               if _about_requests(child.tag) and child.tag not in _JOB_KNOWN]
    sets = job.find("JB_request_set_list")
    flat = job.find("JB_hard_resource_list")
    scopes: dict[int, Requests] = {}
    if sets is not None:
        if flat is not None:
            unknown.append("both <JB_hard_resource_list> and <JB_request_set_list> "
                           "(only the request sets are read)")
        for request_set in sets:
            _read_set(request_set, gpu_name, scopes, unknown)
    elif flat is not None:
        scopes[_GLOBAL] = _read_list(flat, gpu_name, unknown)
    whole_job = scopes.get(_GLOBAL, Requests())
    return JobRequests(master=scopes.get(_MASTER, Requests()).over(whole_job),
                       slave=scopes.get(_SLAVE, Requests()).over(whole_job),
                       unknown=tuple(dict.fromkeys(unknown)))  # each once, in order


def _about_requests(tag: object) -> bool:
    return isinstance(tag, str) and ("resource" in tag.lower() or "request" in tag.lower())


def _shown_tag(element: etree._Element) -> str:
    """An element's name for a message: ``<name>``, cut to 40 characters."""
    tag = str(element.tag)
    return f"<{tag[:40]}...>" if len(tag) > 40 else f"<{tag}>"


def _read_set(request_set: etree._Element, gpu_name: str, scopes: dict[int, Requests],
              unknown: list[str]) -> None:
    """One OCS request set (``JRS_scope``, ``JRS_hard_resource_list``) into ``scopes``."""
    scope_text = _xml.text(request_set, "JRS_scope")
    scope = None if scope_text is None else _xml.whole(scope_text, "JRS_scope")
    if scope not in (_GLOBAL, _MASTER, _SLAVE):
        unknown.append("a request set without JRS_scope" if scope is None
                       else f"a request set of JRS_scope {scope}")
        return
    unknown.extend(f"{_shown_tag(child)} in a request set" for child in request_set
                   if _about_requests(child.tag) and child.tag not in _SET_KNOWN)
    hard = request_set.find("JRS_hard_resource_list")
    if hard is not None:
        scopes[scope] = _read_list(hard, gpu_name, unknown).over(scopes.get(scope, Requests()))


def _read_list(container: etree._Element, gpu_name: str, unknown: list[str]) -> Requests:
    """A hard resource list: ``CE_name`` with ``CE_doubleval``/``CE_stringval`` per item."""
    found = Requests()
    nameless = False
    for req in container:
        name = (_xml.text(req, "CE_name") or "").strip()[:40]  # for messages: standby<any>
        if not name:
            nameless = True
        elif name == "h_vmem":
            found = replace(found, h_vmem=_request_bytes(req, name))
        elif name == "m_mem_free":
            found = replace(found, m_mem_free=_request_bytes(req, name))
        elif name == "h_rt":
            found = replace(found, h_rt=_request_seconds(req, name))
        elif name == "geco_trace_level":
            # the original's log levels are 0 (quiet) .. 4 (debug); a typo must not fail the
            # job. Clamped before int(): int(Decimal("1e999999999")) would never end.
            level = _request_number(req, name)
            found = replace(found, trace_level=0 if level < 0 else 4 if level > 4 else int(level))
        elif name.startswith("standby"):
            found = replace(found, standby=bool(found.standby)
                            or _request_number(req, name) != 0)
        elif name == "phi_config_for_user":
            found = replace(found, phi_for_user=_request_number(req, name) != 0)
        elif name == gpu_name:
            found = replace(found, gpus=_gpu_count(req, name))
    if nameless:
        unknown.append(f"a request without CE_name in {_shown_tag(container)}")
    return found


def _gpu_count(req: etree._Element, name: str) -> int:
    count = _request_number(req, name)
    if count < 0 or count != count.to_integral_value() or count > _MAX_GPUS:
        raise QstatParseError(f"request {name} must be a whole number of GPUs "
                              f"(0-{_MAX_GPUS}), got {shown(str(count))}",
                              element="CE_doubleval")
    return int(count)


def _is_infinity(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "infinity"


def _request_number(req: etree._Element, name: str) -> Decimal:
    """A numeric/boolean request: CE_doubleval (Grid Engine's own parse), else CE_stringval."""
    for tag in ("CE_doubleval", "CE_stringval"):
        value = _xml.text(req, tag)
        if value is None:
            continue
        if tag == "CE_stringval" and value.strip().lower() in ("true", "false"):
            return Decimal(value.strip().lower() == "true")
        try:
            return decimal_value(value)
        except ValueError:
            raise QstatParseError(f"request {name}: {tag} must be a number, got {shown(value)}",
                                  element=tag) from None
    raise QstatParseError(f"request {name} has neither CE_doubleval nor CE_stringval",
                          element="CE_name")


def _request_value(req: etree._Element, name: str,
                   parse: Callable[[str], int | float | None], unit: str) -> Decimal | float:
    """A memory (bytes per slot) or time (seconds) request; 0 for INFINITY."""
    value: Decimal | float
    if _is_infinity(_xml.text(req, "CE_stringval")):
        return 0
    if _xml.text(req, "CE_doubleval") is None:
        # Only a CE_stringval: parse the way Grid Engine documents such values.
        value = _xml.unit_value(_xml.text(req, "CE_stringval") or "", parse,
                                f"request {name}", "CE_stringval")
    else:
        value = _request_number(req, name)
        if value < 0:
            raise QstatParseError(f"request {name}: CE_doubleval must be >= 0 {unit}, got "
                                  f"{value}", element="CE_doubleval")
    return 0 if value >= _xml.NO_LIMIT else value


def _request_bytes(req: etree._Element, name: str) -> int:
    return int(_request_value(req, name, parse_memory, "bytes"))


def _request_seconds(req: etree._Element, name: str) -> float:
    return float(_request_value(req, name, parse_time, "seconds"))
