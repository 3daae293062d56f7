"""gecod: geco's daemon on each execution node.

It answers signed requests over its sockets (job starts, hooks, the starter, ssh
logins, STATUS, other hosts' gecods), watches jobs' shepherds and OOM events, and
reaps what ended jobs leave. Modules, each with one job:

* :mod:`~geco.daemon.runloop` - the single-threaded epoll loop (sources, timers,
  observers, signals, wake-ups from worker threads);
* :mod:`~geco.daemon.server` - connections: read one frame, verify it, hand the
  request to a worker, send the reply;
* :mod:`~geco.daemon.lanes` - the listening sockets' budgets and each connection's state;
* :mod:`~geco.daemon.dispatch` - where each kind of request runs, and its answer;
* :mod:`~geco.daemon.requestlog` - the journal of refusals and successes, within budgets;
* :mod:`~geco.daemon.context` - gecod's shared state, lent to every kind of request;
* :mod:`~geco.daemon.quarantine` - JOB_STARTED and QUARANTINE_SELF: may this pid go
  into this job before it runs anything, and putting it there;
* :mod:`~geco.daemon.status` - the node's jobs, read back from the cgroup tree;
* :mod:`~geco.daemon.service` - start-up checks, systemd notification, signals;
* :mod:`~geco.daemon.handover` - the sockets handed to the gecod an upgrade installed.

``python -m geco.daemon`` or ``geco daemon`` runs it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from geco.log import LEVELS

__all__ = ["add_arguments", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add gecod's options to ``parser`` (``geco daemon``'s subparser) and return it."""
    parser.add_argument("--config", metavar="PATH",
                        help="geco.toml (default $GECO_CONFIG or /etc/geco/geco.toml)")
    parser.add_argument("--foreground", action="store_true", default=True,
                        help="stay in the foreground (the default and only mode: systemd "
                             "supervises gecod, it never forks itself away)")
    parser.add_argument("--log-level", choices=sorted(LEVELS), metavar="LEVEL",
                        help="stderr verbosity: quiet, error, warn, info or debug "
                             "(default: [log] level; the journal always gets info)")
    return parser


# The service is imported on call: the runloop alone (tests, tools) and every other
# `geco` subcommand need not load pynacl, lxml and hwloc.

def run(args: argparse.Namespace) -> int:
    """Run gecod with parsed arguments; return its exit status (``geco daemon``)."""
    from geco.daemon.service import run as _run

    return _run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run gecod from a command line (``python -m geco.daemon``); return its exit status."""
    parser = argparse.ArgumentParser(
        prog="gecod", description="geco's node daemon (run by systemd as root).")
    return run(add_arguments(parser).parse_args(argv))
