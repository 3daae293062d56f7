"""What keeps geco from leaving a node: ``geco uninstall-check``, the package's prerm.

A removal goes ahead only when nothing on the node still needs geco, and each thing
that does is named with how to clear it:

* a job it contains (its cgroups hold processes): removing gecod and its job unit
  would end the job's containment, or the job with it;
* a PAM file that names ``pam_geco.so``: a ``required`` line whose module is missing
  fails every login through that stack, root's included;
* a unit or ``/etc/ld.so.preload`` that loads the preload, but for the package's own
  execd drop-in (which goes with the package): its daemon would ask a gecod that is
  gone and refuse what it was asked to contain;
* a queue on this host whose prolog, epilog or starter_method is one of geco's hooks:
  Grid Engine puts a queue whose hook is missing into error state. Asked with
  ``qconf``; a host that may not ask is told to check by hand (not refused: that is
  an exec-only host's normal case, and the queue is the admin's, cluster-wide).

After gecod has stopped, :func:`remove_cgroups` takes geco's own cgroups, empty then.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from geco.errors import GecoError

if TYPE_CHECKING:
    from geco.cgroup import Backend
    from geco.config import Config

__all__ = ["HOOK_DIR", "PRELOAD", "blockers", "queue_hooks", "remove_cgroups"]

HOOK_DIR = "/usr/libexec/geco/"
PRELOAD = "libgeco_preload.so"
# the package's own drop-ins: they go with it, and postrm restarts execd without them
_OWN_DROPINS = ("/lib/systemd/system/sgeexecd.service.d/",
                "/lib/systemd/system/gridengine-exec.service.d/",
                "/usr/lib/systemd/system/sgeexecd.service.d/",
                "/usr/lib/systemd/system/gridengine-exec.service.d/")
_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/lib/systemd/system",
              "/usr/lib/systemd/system")
_HOOK_ATTRS = ("prolog", "epilog", "starter_method")


def blockers(cfg: Config, backend: Backend, *, etc: Path = Path("/etc"),
             unit_dirs: tuple[str, ...] = _UNIT_DIRS) -> tuple[list[str], str]:
    """One line per thing on this node that still needs geco ([] when it may go), and ""
    or why the queue configuration could not be read (:func:`queue_hooks`)."""
    found = [f"job {key} is running contained by geco ({len(pids)} processes): wait for it "
             "to end, or drain the node first (qmod -d)"
             for key in backend.job_keys() if (pids := backend.pids(key))]
    found += _pam_lines(etc / "pam.d")
    found += _preloaders(etc, unit_dirs)
    hooked, unread = queue_hooks(cfg)
    found += [f"queue {queue} runs geco's {attr} on this host ({value}): set it to NONE "
              f"for this host first (qconf -mattr queue {attr} NONE {queue}@<host>)"
              for queue, attr, value in hooked]
    return found, unread


def _pam_lines(pam_d: Path) -> list[str]:
    from geco.ssh import pamstack

    try:
        services = sorted(p.name for p in pam_d.iterdir() if p.is_file())
    except OSError:
        return []
    # each file's own lines (the others count as seen: an include is reported where it is)
    return [f"{pam_d / service} names {pamstack.MODULE}: remove its geco lines first "
            "(a required line whose module is gone refuses every login)"
            for service in services
            if any(line.module == pamstack.MODULE
                   for line in pamstack.stack(service, pam_d, frozenset(services) - {service}))]


def _preloaders(etc: Path, unit_dirs: tuple[str, ...]) -> list[str]:
    found = []
    ld_preload = etc / "ld.so.preload"
    if PRELOAD in _read(ld_preload):
        found.append(f"{ld_preload} names geco's preload: take it out first")
    for top in unit_dirs:
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                path = os.path.join(dirpath, name)
                if (name.endswith((".service", ".conf")) and not path.startswith(_OWN_DROPINS)
                        and PRELOAD in _read(Path(path))):
                    found.append(f"{path} loads geco's preload: remove it and restart that "
                                 "unit first (its daemon would ask a gecod that is gone)")
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def queue_hooks(cfg: Config, host: str | None = None) -> tuple[list[tuple[str, str, str]], str]:
    """The (queue, attribute, value) of this host's queues that run one of geco's hooks,
    and "" or why the queue configuration could not be read (qconf refused or absent)."""
    from geco.resourceset import short_hostname
    from geco.sge import command

    me = short_hostname(host)
    try:
        queues = command.run_qconf(["-sql"], cfg).split()
        texts = {queue: command.run_qconf(["-sq", queue], cfg) for queue in queues}
    except GecoError as exc:
        return [], str(exc)
    found = []
    for queue, text in texts.items():
        attrs = _attributes(text)
        found += [(queue, attr, value) for attr in _HOOK_ATTRS
                  if HOOK_DIR in (value := _for_host(attrs.get(attr, "NONE"), me))]
    return found, ""


def _attributes(text: str) -> dict[str, str]:
    """``qconf -sq``'s attribute lines (``\\`` continues one) as name -> value."""
    joined = re.sub(r"\\\n\s*", "", text)
    return {words[0]: words[1].strip() for line in joined.splitlines()
            if len(words := line.split(None, 1)) == 2}


def _for_host(value: str, host: str) -> str:
    """A queue attribute's value on ``host``: its ``[host=...]`` entry, else the default.
    A host group's entry (``[@group=...]``) counts when it names geco's hooks: which
    hosts a group holds is not read here."""
    default, _, rest = value.partition(",[")
    entries: dict[str, str] = dict(re.findall(r"\[?([^=\[\]]+)=([^\]]*)\]",
                                              "[" + rest if rest else ""))
    for name, entry in entries.items():
        if name.split(".", 1)[0] == host:
            return entry
    grouped = [entry for name, entry in entries.items() if name.startswith("@")]
    return " ".join([default, *(e for e in grouped if HOOK_DIR in e)])


def remove_cgroups(backend: Backend) -> list[str]:
    """Remove geco's cgroup directories (every controller's parent and what is left
    below it, deepest first); return those that could not go (a process still in one)."""
    stayed = []
    for parent in dict.fromkeys(backend.parent_paths().values()):
        for dirpath, _dirs, _files in os.walk(parent, topdown=False):
            try:
                os.rmdir(dirpath)
            except FileNotFoundError:
                pass
            except OSError as exc:
                stayed.append(f"{dirpath}: {exc.strerror}")
    return stayed
