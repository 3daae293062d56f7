"""Disable a queue instance (``qmod -d``): what a node does when a job cannot be killed.

Run as root from the epilog or gecod's teardown, argv-only, once, with the
site's Grid Engine environment (:mod:`geco.sge.siteenv`; the epilog runs with
the job's, which its owner controls) and qstat's timeout.
"""

from __future__ import annotations

from geco.config import Config
from geco.errors import GecoError

__all__ = ["disable"]

_REMEDY = ("set [qstat] command in geco.toml to the full path of qstat: qmod is taken "
           "from the same directory")


def disable(instance: str, cfg: Config, qmod: str | None = None) -> str | None:
    """Run ``qmod -d <instance>``; return None when it worked, else why not (one line).

    qmod prints what it changed on stdout, but only its exit status says it
    worked. Never raises: the caller journals the answer.

    Parameters
    ----------
    instance: ``<queue>@<host>`` (or ``*@<host>``).
    cfg: ``qstat`` (qmod is taken beside a fully given qstat) and ``qstat_timeout``.
    qmod: the qmod command to run instead.
    """
    # only for a job that cannot be killed: the epilog of every other job loads none of it
    from geco.sge import command, siteenv

    try:
        env = siteenv.discover(cfg)
        found = command.find_command(qmod or command.beside_qstat(cfg, "qmod"), env,
                                     what="qmod", remedy=_REMEDY)
        _, why, status = command.run_once([found, "-d", instance], cfg.qstat_timeout, env)
    except GecoError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot execute it: {exc.strerror or exc}"
    return None if status == 0 else why

