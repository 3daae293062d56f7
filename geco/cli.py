"""The ``geco`` command.

``geco rsrcinfo`` is the successor of the original ``geco-rsrcinfo``; scripts
depend on its contract:

* ``-j JOB[.TASK]`` asks the live qstat;
* ``--xml FILE`` reads a saved ``qstat -xml -j`` (``-`` = stdin), with the
  hosts from ``--placement FILE`` (a saved ``qstat -xml -u '*' -g t``) or
  ``--pe-hostfile FILE``, and ``--task N``;
* ``-u FILE`` reads a v1 resource file; ``-s FILE`` writes one;
* ``--format text|json|shell|v1`` chooses the output.

``geco status --job N[.T]`` reads one job's live figures from the kernel
(no gecod needed); for a parallel job over several hosts it asks the others'
gecods too (over the cluster channel: root, or whoever may read the cluster
key; a host not shown is named with why); ``geco journal N[.T]`` tells its
story from the journal.
Both exit 1 with one line when there is nothing to show (no cgroups on this
node; no journal entry, or a journal the caller may not read).

``geco check`` names the doors out of a job open on this node (atd, cron,
systemd linger, the stray killing off), one line each; exit 1 when one is open.

Exit status: 0 success, 2 bad input, 1 when the system failed us (qstat
unreachable, a file that cannot be written); every failure is one line on
stderr starting with ``geco``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from geco import __version__, jobfiles
from geco import config as _config
from geco.errors import (
    CgroupError,
    ConfigError,
    GecoError,
    JobKeyError,
    JobNotFound,
    QstatError,
    QstatParseError,
    ResourceFormatError,
)
from geco.jobkey import JobKey
from geco.reports import rsrcinfo
from geco.resourceset import ResourceSet
from geco.sge import resourcefile, v1format
from geco.sge.pe_hostfile import parse_pe_hostfile

if TYPE_CHECKING:
    from geco.cgroup import Backend
    from geco.config import Config
    from geco.reports.jobstatus import JobStatus

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Usage(Exception):
    """A command line that cannot be run; printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Usage(f"{self.prog}: {message}")


def _job_spec(text: str) -> tuple[int, int | None]:
    job, dot, task = text.partition(".")
    try:  # both are ids as Grid Engine writes them; no task: every task
        return JobKey.job_of(job), JobKey.job_of(task) if dot else None
    except JobKeyError:
        raise argparse.ArgumentTypeError(
            f"JOB[.TASK] must be numbers like 42 or 42.3, got {text!r}") from None


def _count(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"N must be a number from 1 up, got {text!r}")
    return int(text)


def _read_input(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(name).read_bytes()
    except OSError as exc:
        raise _Usage(f"geco rsrcinfo: cannot read {name}: {exc.strerror}") from exc


def _rsrcinfo(args: argparse.Namespace) -> ResourceSet:
    # here, not at the top: lxml and the qstat client are most of what a `geco` start
    # would import, and only rsrcinfo's live and saved qstat paths use them
    from geco.sge import qstat

    cfg = _config.load()
    if args.job is not None:
        job, task = args.job
        return qstat.fetch(job, task or args.task or 1, cfg)
    if args.xml is not None:
        xml = _read_input(args.xml)
        job_id = qstat.job_number(xml)  # an unknown job is reported before any placement
        placement = None
        if args.placement:
            placement = qstat.parse_placement_gt(_read_input(args.placement), job_id,
                                                 args.task or 1, job_slots=qstat.job_slots(xml))
        elif args.pe_hostfile:
            placement = parse_pe_hostfile(_read_input(args.pe_hostfile))
        return qstat.parse_job(xml, args.task or 1, placement)
    try:
        return v1format.parse(_read_input(args.unserialize))
    except ResourceFormatError as exc:
        exc.fields.setdefault("path", args.unserialize)
        raise


def _add_key_commands(sub: Any) -> None:
    """The parser entries of `geco keygen` and `geco preload-config`."""
    kg = sub.add_parser("keygen", help="write a new quarantine key (gecod and the preload)",
                        description="Write a new random 32-byte quarantine key, atomically, "
                                    "mode 0600. Default PATH: [gecod] key_file, or with "
                                    "--cluster [cluster] key_file.")
    kg.add_argument("--force", action="store_true", help="replace an existing key file")
    kg.add_argument("--cluster", action="store_true",
                    help="the cluster key (the same file on every host: copy it to all)")
    kg.add_argument("path", nargs="?", metavar="PATH", help="the key file")
    pc = sub.add_parser("preload-config", help="render the preload's preload.conf",
                        description="Render the exec() preload's key=value config from "
                                    "geco.toml's [gecod] section (stdout by default).")
    pc.add_argument("-o", "--output", metavar="PATH",
                    help="write it atomically here (e.g. /etc/geco/preload.conf)")


def _failed(command: str, exc: GecoError) -> int:
    """Say why ``geco <command>`` failed, in one stderr line; return its exit status.

    A bad geco.toml (ConfigError) is bad input (2); anything else is the system
    failing us (1).
    """
    print(f"geco {command}: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT if isinstance(exc, ConfigError) else EXIT_FAILED


def _keygen(args: argparse.Namespace) -> int:
    # imported here: pynacl costs ~15 ms at import, which `geco rsrcinfo` need not pay
    from geco.wire import keys

    try:
        cfg = _config.load()
        path = Path(args.path) if args.path else (cfg.cluster_key_file if args.cluster
                                                  else cfg.gecod_key_file)
        keys.generate_key(path, force=args.force)
    except GecoError as exc:
        print(f"geco keygen: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.cluster:
        print(f"geco keygen: wrote a new cluster key to {path}; copy it to every host (mode "
              f"0600, owned by root) and restart gecod there")
    else:
        print(f"geco keygen: wrote a new key to {path}; restart gecod, sge_execd and sshd to "
              f"use it")
    if os.geteuid() != 0:
        print(f"geco keygen: warning: {path} is not owned by root, so gecod will refuse it; "
              f"run keygen as root", file=sys.stderr)
    return EXIT_OK


def _preload_config(args: argparse.Namespace) -> int:
    from geco.wire import preload_config  # see _keygen

    source = Path(os.environ.get("GECO_CONFIG") or _config.DEFAULT_PATH)
    try:
        cfg = _config.load(source)
        if args.output:
            preload_config.write(cfg, args.output, source=source)
        else:
            sys.stdout.write(preload_config.render(cfg, source=source))
    except GecoError as exc:
        return _failed("preload-config", exc)
    return EXIT_OK


# argparse refills a description's white space: these read as the paragraphs they are
_STATUS_DESCRIPTION = """Ask gecod (any user may) which jobs it contains on this node: their
cpus, NUMA nodes, memory limit and process count. Exit 1 when gecod is not running. With
--job: one job's live figures, read from its cgroups (no gecod needed); exit 1 when it has
no cgroups on this node."""


def _add_status_command(sub: Any) -> None:
    """The parser entry of `geco status`."""
    st = sub.add_parser("status", help="show the jobs gecod contains on this node",
                        description=_STATUS_DESCRIPTION)
    st.add_argument("--json", action="store_true", help="print gecod's STATUS document as JSON")
    st.add_argument("-j", "--job", type=_job_spec, metavar="JOB[.TASK]",
                    help="show this job's cores, memory, CPU time, OOM kills, processes and "
                         "running time (no TASK: each of its tasks on this node)")
    st.add_argument("-v", "--verbose", action="store_true",
                    help="with --job: list the job's processes (pid and command)")


_JOURNAL_DESCRIPTION = """Print the journal entries of a job on this node, oldest first
(time, writer, GECO_EVENT, message), then how it ended: peak memory, CPU time, OOM kills,
processes killed at cleanup. Grid Engine reuses job numbers: when the journal holds several
jobs of the number (told apart by SGE_CLUSTER and JOB_SUBMITTED), the newest is shown, under
a heading, and a last line says what else there is. Needs root or the systemd-journal group.
Exit 1 when the journal has no entry of the job or cannot be read."""


def _add_journal_command(sub: Any) -> None:
    """The parser entry of `geco journal`."""
    jo = sub.add_parser("journal", help="tell a job's story from this node's journal",
                        description=_JOURNAL_DESCRIPTION)
    jo.add_argument("job", type=_job_spec, metavar="JOB[.TASK]",
                    help="the job (no TASK: every task)")
    which = jo.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true",
                       help="every job of this number in the journal, oldest first")
    which.add_argument("--earlier", type=_count, metavar="N",
                       help="the job of this number N jobs before the newest (1: the one "
                            "before it)")
    jo.add_argument("--json", action="store_true",
                    help="print the entries as JSON lines (journalctl -o json's shape), "
                         "without the summary")
    jo.add_argument("--all-fields", action="store_true",
                    help="show every field of each entry, also the journal's own (_PID, ...)")


def _status_table(doc: dict[str, Any]) -> str:
    from geco.units import format_memory  # see _keygen

    rows = [("JOB", "CPUS", "MEMS", "MEMORY", "PIDS")]
    notes = []
    for job in doc.get("jobs", []):
        memory = int(job.get("memory") or 0)
        rows.append((str(job.get("key", "?")), str(job.get("cpus") or "-"),
                     str(job.get("mems") or "-"), format_memory(memory) if memory else "-",
                     str(job.get("pids", "?"))))
        if job.get("error"):
            notes.append(f"{job.get('key', '?')}: {job['error']}")
    count = int(doc.get("job_count", len(rows) - 1))
    lines = [f"gecod on {doc.get('host', '?')} (pid {doc.get('pid', '?')}): {count} job(s); "
             f"cpus in use: {doc.get('cpus_in_use') or 'none'} of "
             f"{doc.get('available_cpus') or '?'}"]
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                  for r in rows]
    if doc.get("truncated"):
        lines.append(f"(only {len(rows) - 1} of {count} jobs shown: gecod's reply is limited "
                     f"to 4096 bytes)")
    return "\n".join(lines + notes) + "\n"


def _job_status(args: argparse.Namespace) -> int:
    import json

    from geco import cgroup  # see _keygen
    from geco.reports import jobstatus
    from geco.resourceset import short_hostname

    job, task = args.job
    try:
        cfg = _config.load()
        backend = cgroup.for_config(cfg)
        keys = [JobKey(job, task)] if task is not None else \
            jobstatus.keys_of_job(backend, job)
        if not keys:
            raise jobstatus.not_here(str(job))
        found = []
        for key in keys:
            try:
                found.append(jobstatus.read(cfg, backend, key))
            except CgroupError:
                # one task of several ended while we looked: show the others
                if len(keys) == 1 or backend.exists(key):
                    raise
    except GecoError as exc:
        return _failed("status", exc)
    elsewhere, missing = _other_hosts_status(cfg, found)
    if args.json:
        doc = {"host": short_hostname(),
               "jobs": [jobstatus.to_dict(st) for st in [*found, *elsewhere]],
               "hosts_not_shown": [{"host": h, "reason": why} for h, why in missing]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(jobstatus.format_table(st, verbose=args.verbose)
                                   for st in [*found, *elsewhere]))
        if missing:
            sys.stdout.write("\n" + "".join(f"{host}: not shown: {why}\n"
                                            for host, why in missing))
    sys.stdout.flush()
    return EXIT_OK


def _other_hosts_status(cfg: Config, found: Sequence[JobStatus]
                        ) -> tuple[list[JobStatus], list[tuple[str, str]]]:
    """The other hosts' figures of a parallel job's tasks shown here, asked over the cluster
    channel (root: it needs the cluster key); and the hosts not shown, with why."""
    from geco.reports import jobstatus  # see _keygen
    from geco.resourceset import short_hostname
    from geco.wire import cluster

    shown: list[JobStatus] = []
    missing: list[tuple[str, str]] = []
    for st in found:
        hosts = [h for h in st.hosts if short_hostname(h) != st.host]
        if not hosts:
            continue
        try:
            answers = cluster.show(st.key, hosts, cfg)
        except GecoError as exc:
            why = (f"{exc.msg} ({cfg.cluster_key_file}); run `geco status --job {st.key}` "
                   f"there, or here as root")
            missing += [(h, why) for h in hosts]
            continue
        for a in answers:
            try:
                if not a.ok:
                    raise GecoError(a.reason or a.status)
                shown += [jobstatus.from_dict(d) for d in a.document.get("jobs", [])]
            except GecoError as exc:
                missing.append((a.host, str(exc)))
    return shown, missing


def _journal(args: argparse.Namespace) -> int:
    from geco.reports import journalview  # see _keygen
    from geco.resourceset import short_hostname

    job, task = args.job
    try:
        refused = journalview.check_access()
        entries = journalview.read(job, task)
    except GecoError as exc:
        return _failed("journal", exc)
    if refused:
        print(f"geco journal: warning: {len(refused)} journal file(s) not readable, entries "
              f"may be missing (first: {refused[0]})", file=sys.stderr)
    key = f"{job}.{task}" if task is not None else str(job)
    if not entries:
        print(f"geco journal: the journal on {short_hostname()} has no entry of job {key}",
              file=sys.stderr)
        return EXIT_FAILED
    found = journalview.instances(entries)
    earlier = None if args.all else args.earlier or 0
    try:
        if args.json:  # JSON lines only on stdout: what else there is goes to stderr
            shown = found if earlier is None else [journalview.pick(found, earlier, job)]
            sys.stdout.write("".join(journalview.to_json(e, all_fields=args.all_fields) + "\n"
                                     for i in shown for e in i.entries))
            note = journalview.others_note(found, shown[0], job) if earlier is not None else ""
            if note:
                print(f"geco journal: {note}", file=sys.stderr)
        else:
            sys.stdout.write(journalview.format_stories(found, job, task, earlier=earlier,
                                                        all_fields=args.all_fields))
    except GecoError as exc:  # --earlier past the oldest
        print(f"geco journal: {exc}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.flush()
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    import json

    from geco.wire import client  # see _keygen

    if args.job is not None:
        return _job_status(args)
    try:
        doc = client.status(_config.load())
    except GecoError as exc:
        return _failed("status", exc)
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n" if args.json
                     else _status_table(doc))
    sys.stdout.flush()
    return EXIT_OK


def _add_check_command(sub: Any) -> None:
    """The parser entry of `geco check`."""
    sub.add_parser("check", help="name the doors out of a job open on this node",
                   description="Name the ways a job can leave processes outside its cgroups "
                               "on this node, one line each, 'ok' or 'open': atd and cron "
                               "running (unless at.allow/cron.allow admit only exempt users), "
                               "users with systemd linger, sshd's PAM stack without geco's "
                               "gate or with a module after it that moves sessions out of "
                               "their job (on a host that runs no sge_execd, a login node: "
                               "with geco's gate, which would refuse every user), and "
                               "whether [strays] kill is on; then what the "
                               "node gives jobs: cores, memory and its reserve, the default "
                               "for a job that requests none, GPUs and their devices, and whether "
                               "the kernel moves a process into its job at once "
                               "(favordynmods). "
                               "Exit 0 when every door is closed, 1 when one is open, 2 when "
                               "geco.toml is not valid TOML.")


def _check(args: argparse.Namespace) -> int:
    from geco import cgroup  # see _keygen
    from geco.reports import doors, nodeview
    from geco.resourceset import short_hostname

    try:
        cfg = _config.load()
        found = doors.doors(cfg)
        picture = nodeview.lines(cfg, cgroup.for_config(cfg))
    except GecoError as exc:
        return _failed("check", exc)
    for door in found:
        print(f"{'open' if door.open else 'ok':5} {door.text}")
    for what, text in picture:
        print(f"node  {what:8} {text}")
    opened = [d.name for d in found if d.open]
    if opened:
        print(f"geco check: {len(opened)} door(s) out of a job open on {short_hostname()}: "
              f"{', '.join(opened)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _add_uninstall_command(sub: Any) -> None:
    """The parser entry of `geco uninstall-check` (the package's prerm runs it)."""
    un = sub.add_parser("uninstall-check", help="say whether geco may be removed from this node",
                        description="Name what on this node still needs geco, one line each "
                                    "with how to clear it: a job it contains, a PAM file "
                                    "naming pam_geco.so, a unit loading its preload, a queue "
                                    "on this host running its hooks. Exit 0 when geco may go "
                                    "(the package's prerm refuses a removal otherwise), 1 when "
                                    "something needs it.")
    un.add_argument("--remove-cgroups", action="store_true",
                    help="instead, remove geco's (empty) cgroups: gecod has stopped")


def _uninstall_check(args: argparse.Namespace) -> int:
    from geco import cgroup  # see _keygen
    from geco.reports import removal

    try:
        cfg = _config.load()
        backend = cgroup.for_config(cfg)
        if args.remove_cgroups:
            for line in removal.remove_cgroups(backend):
                print(f"geco uninstall-check: left behind: {line}", file=sys.stderr)
            return EXIT_OK
        found, unread = removal.blockers(cfg, backend)
    except GecoError as exc:
        return _failed("uninstall-check", exc)
    if unread:
        print(f"geco uninstall-check: cannot read the queue configuration ({unread}): make sure "
              f"no queue on this host still runs a hook in {removal.HOOK_DIR}", file=sys.stderr)
    for line in found:
        print(f"geco uninstall-check: {line}", file=sys.stderr)
    return EXIT_FAILED if found else EXIT_OK


_USAGE_DESCRIPTION = """Did the job use what it asked for? For a running or ended job on
this node (its samples, kept [usage] keep_days after it): cores, memory and GPUs requested
beside used, CPU and memory efficiency as Slurm's seff defines them (CPU time / (cores x
wall time), peak / requested), the peak and when it came, OOM kills, and a line of advice
where the request was far off; on a parallel job's master host, after the job, every
host's figures and one line over the whole job. --chart draws CPU and memory over time in
the terminal, --plot FILE to a PNG or SVG picture. The job's owner, root and the groups
[usage] readers names may read it. Exit 1 when this node has no samples of the job or
they are not yours to read."""


def _add_usage_command(sub: Any) -> None:
    """The parser entry of `geco usage`."""
    us = sub.add_parser("usage", help="what a job used beside what it requested",
                        description=_USAGE_DESCRIPTION)
    us.add_argument("job", type=_job_spec, metavar="JOB[.TASK]",
                    help="the job (no TASK: each of its tasks on this node)")
    how = us.add_mutually_exclusive_group()
    how.add_argument("--json", action="store_true", help="print the reports as JSON")
    how.add_argument("--chart", action="store_true",
                     help="also draw its CPU and memory over time, with the requests as "
                          "lines (80 columns)")
    us.add_argument("--plot", metavar="FILE",
                    help="also draw them to FILE, a PNG or SVG picture as its suffix (.png, "
                         ".svg) says, one row of panels per task and host; needs matplotlib")


def _usage(args: argparse.Namespace) -> int:
    import json

    from geco.resourceset import short_hostname
    from geco.usage import (
        efficiency,
        samples,  # see _keygen
    )

    job, task = args.job
    if args.plot is not None:
        from geco.usage import usageplot

        try:
            plot_path = usageplot.check_path(args.plot)
        except ValueError as exc:
            raise _Usage(f"geco usage: {exc}") from None
    try:
        if args.plot is not None:
            usageplot.require()  # before anything is printed: without it, one line
        cfg = _config.load()
        if task is not None:
            keys = [JobKey(job, task)]
        else:
            try:
                names = os.listdir(cfg.usage_dir)
            except FileNotFoundError:
                names = []
            keys = sorted((JobKey.parse(n) for n in names
                           if JobKey.is_key_text(n) and n.split(".")[0] == str(job)),
                          key=lambda k: k.task)
        # a parallel job's master also has its other hosts' samples, from the job's end
        series = [(k, s) for k in keys for s in samples.read_job(cfg.usage_dir, k)]
        if not series:
            where = f"job {job}" if task is None else f"job {job}.{task}"
            print(f"geco usage: {short_hostname()} has no usage samples of {where}",
                  file=sys.stderr)
            return EXIT_FAILED
        backend = _backend_or_none(cfg)
        reports = [(efficiency.report(s, running=backend is not None and backend.exists(k)), s)
                   for k, s in series]
    except GecoError as exc:
        return _failed("usage", exc)
    if args.json:
        sys.stdout.write(json.dumps([r.as_json() for r, _ in reports], indent=2) + "\n")
    else:
        from geco.usage.usagechart import chart

        blocks = [efficiency.render(r) + (chart(s) if args.chart else "") for r, s in reports]
        for k in keys:  # a job task of several hosts: its figures over all of them
            mine = [r for r, s in reports if JobKey(s.header.job_id, s.header.task_id) == k]
            if len(mine) > 1:
                blocks.append(efficiency.render_whole(str(k), efficiency.whole(mine)))
        sys.stdout.write("\n".join(blocks))
    sys.stdout.flush()
    if args.plot is not None:
        try:
            usageplot.plot([s for _, s in reports], plot_path)
        except GecoError as exc:
            return _failed("usage", exc)
        for _, s in reports:
            if why := usageplot.too_few(s):
                print(f"geco usage: {why}: not in {plot_path}", file=sys.stderr)
        print(f"geco usage: wrote {plot_path}", file=sys.stderr)
    return EXIT_OK


def _backend_or_none(cfg: Config) -> Backend | None:
    """The node's cgroup backend, to tell a running job from an ended one; None when
    this node has none geco can use (then every job reads as ended)."""
    from geco import cgroup

    try:
        return cgroup.for_config(cfg)
    except GecoError:
        return None


def _add_handover_command(sub: Any) -> None:
    """The parser entry of `geco handover` (the package's postinst runs it)."""
    ho = sub.add_parser("handover", help="make gecod hand its sockets to the installed gecod",
                        description="Ask the running gecod (root only) to start the gecod "
                                    "installed now and hand its sockets over to it once it "
                                    "is loaded: no job start waits for a restart. Exit 0 "
                                    "once the new gecod serves; 1 when gecod is not running "
                                    "or the new one could not take over (the old one then "
                                    "serves on, and the message says why).")
    ho.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                    help="how long to wait for the new gecod (default 120)")


def _handover(args: argparse.Namespace) -> int:
    from geco.daemon import handover  # see _keygen

    try:
        print(f"geco handover: {handover.request(_config.load(), timeout=args.timeout)}")
    except GecoError as exc:
        return _failed("handover", exc)
    return EXIT_OK


def _add_daemon_command(sub: Any) -> None:
    """The parser entry of `geco daemon` (gecod); its options live in geco.daemon."""
    from geco import daemon

    daemon.add_arguments(sub.add_parser("daemon", help="run gecod, the node daemon (root)",
                                description="Run gecod, the node daemon, in the "
                                            "foreground (systemd: gecod.service)."))


def _build_parser() -> _Parser:
    parser = _Parser(prog="geco", description="Grid Engine Cgroup Orchestrator")
    parser.add_argument("--version", action="version", version=f"geco {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ri = sub.add_parser("rsrcinfo", help="show or serialize a job's granted resources",
                        description="Show or serialize a job's granted resources.")
    src = ri.add_mutually_exclusive_group(required=True)
    src.add_argument("-j", "--job", type=_job_spec, metavar="JOB[.TASK]",
                     help="ask the live qstat about this job task")
    src.add_argument("--xml", metavar="FILE", help="a saved `qstat -xml -j JOB` (- = stdin)")
    src.add_argument("-u", "--unserialize", metavar="FILE", help="read a v1 resource file")
    hosts = ri.add_mutually_exclusive_group()
    hosts.add_argument("--placement", metavar="FILE",
                       help="with --xml: a saved `qstat -xml -u '*' -g t` for the hosts")
    hosts.add_argument("--pe-hostfile", metavar="FILE", help="with --xml: the job's pe_hostfile")
    ri.add_argument("--task", type=int, metavar="N", help="array task id (default 1)")
    ri.add_argument("-s", "--serialize", metavar="FILE", help="also write a v1 resource file")
    ri.add_argument("--format", choices=sorted(rsrcinfo.FORMATS), default="text",
                    help="output format (default text)")
    _add_key_commands(sub)
    _add_daemon_command(sub)
    _add_status_command(sub)
    _add_journal_command(sub)
    _add_check_command(sub)
    _add_uninstall_command(sub)
    _add_handover_command(sub)
    _add_usage_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``geco`` command; return its exit status."""
    try:
        args = _build_parser().parse_args(argv)
        if args.command == "daemon":
            from geco import daemon

            return daemon.run(args)
        if args.command == "keygen":
            return _keygen(args)
        if args.command == "preload-config":
            return _preload_config(args)
        if args.command == "status":
            if args.verbose and args.job is None:
                raise _Usage("geco status: -v goes with --job")
            return _status(args)
        if args.command == "journal":
            return _journal(args)
        if args.command == "check":
            return _check(args)
        if args.command == "uninstall-check":
            return _uninstall_check(args)
        if args.command == "handover":
            return _handover(args)
        if args.command == "usage":
            return _usage(args)
        if args.command == "rsrcinfo":
            if args.xml is None and (args.placement or args.pe_hostfile):
                raise _Usage("geco rsrcinfo: --placement and --pe-hostfile go with --xml")
            rs = _rsrcinfo(args)
            if args.serialize:  # into the job's own file: the GPUs geco picked are kept
                into = Path(args.serialize).absolute()
                if into == jobfiles.resource_file(_config.load().resources_dir, rs.key):
                    rs = resourcefile.rewrite(into.parent, rs, contained=True)
                else:
                    resourcefile.write_to(into, rs)
            sys.stdout.buffer.write(rsrcinfo.render(rs, args.format))
            sys.stdout.flush()
        return EXIT_OK
    except _Usage as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_INPUT
    except (JobNotFound, QstatParseError, ResourceFormatError) as exc:
        print(f"geco rsrcinfo: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (QstatError, GecoError) as exc:
        print(f"geco rsrcinfo: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
