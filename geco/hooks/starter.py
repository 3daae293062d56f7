"""The starter_method (job owner): check containment, export the job's facts, start the job.

Configure it in the queue as ``starter_method /opt/geco/libexec/starter``.

Steps, in order:

1. Find the job from its environment.
2. Check, from /proc, that this process is inside the job's cgroups in every
   managed controller. A batch job that is not is refused with one plain
   sentence in its stderr file: it would run unbound and unlimited.
   (``qrsh -inherit`` tasks are contained by gecod; until it runs on the
   node they start with a journaled warning.)
3. Export ``GECO_*`` facts read back from the kernel (what is enforced, not
   what was asked for): ``GECO_CPUS``, ``GECO_NCPUS``, ``GECO_MEMS``,
   ``GECO_MEMORY_LIMIT``, ``GECO_VMEM_LIMIT`` (bytes, 0 = none), ``GECO_NODE``.
4. Start the job the way Grid Engine itself would: with a configured starter,
   Grid Engine hands over the job script and leaves ``shell_start_mode`` to us
   (``SGE_STARTER_SHELL_START_MODE``, ``..._SHELL_PATH``, ``..._USE_LOGIN_SHELL``).
   The job's arguments are passed on untouched.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence

from geco import cgroup, log, sgejob
from geco.config import Config
from geco.errors import NotContained
from geco.hooks import Exit, run

__all__ = ["job_argv", "main"]


def job_argv(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, list[str]]:
    """Return ``(program, argv)`` that starts the job as Grid Engine would.

    A batch job script in ``posix_compliant`` mode runs under the queue's shell
    (``-S`` overrides), as a login shell when Grid Engine says so; in
    ``unix_behavior`` mode, and for binaries (``-b y``) and ``qrsh`` commands,
    the command is executed directly (its ``#!`` line decides).
    """
    # only the execd's copy of a job script goes through the shell; a -b y binary
    # (JOB_SCRIPT is then the command itself) and qrsh commands are exec'd as given
    is_script = env.get("JOB_SCRIPT") == argv[0] and os.path.basename(
        os.path.dirname(argv[0])) == "job_scripts"
    shell = env.get("SGE_STARTER_SHELL_PATH", "")
    if is_script and shell and env.get("SGE_STARTER_SHELL_START_MODE") == "posix_compliant":
        name = os.path.basename(shell)
        if env.get("SGE_STARTER_USE_LOGIN_SHELL") == "true":
            name = "-" + name
        return shell, [name, *argv]
    return argv[0], list(argv)


def _facts(limits: cgroup.Limits, ncpus: int) -> dict[str, str]:
    return {"GECO_CPUS": limits.cpus, "GECO_NCPUS": str(ncpus), "GECO_MEMS": limits.mems,
            "GECO_MEMORY_LIMIT": str(limits.memory), "GECO_VMEM_LIMIT": str(limits.memory_swap),
            "GECO_NODE": os.uname().nodename}


def _body(cfg: Config, logger: logging.Logger) -> Exit:
    argv = sys.argv[1:]
    if not argv:
        print("geco: the starter_method got no job to start", file=sys.stderr)
        return Exit.JOB_ERROR
    job = sgejob.job_from_hook([], os.environ)
    backend = cgroup.for_config(cfg)
    env = dict(os.environ)
    if backend.contains(job.key, os.getpid()):
        limits = backend.read_limits(job.key)
        env.update(_facts(limits, len(os.sched_getaffinity(0))))
    elif os.environ.get("JOB_SCRIPT") == "QRSH":
        logger.warning("qrsh -inherit task of job %s started outside the job's cgroups "
                       "(gecod is not running on %s)", job.key, os.uname().nodename,
                       extra=log.job_fields(job.job_id, job.task_id, "task-not-contained"))
    else:
        where = ", ".join(str(p) for p in backend.paths(job.key).values())
        raise NotContained(f"job {job.key} is not inside its cgroups on "
                           f"{os.uname().nodename}; it is not started uncontained. "
                           f"Ask your admin to check the queue's geco prolog", cgroups=where)
    program, args = job_argv(argv, env)
    try:
        os.execvpe(program, args, env)
    except OSError as exc:
        print(f"geco: cannot start the job: {program}: {exc.strerror}", file=sys.stderr)
    return Exit.JOB_ERROR


def main() -> int:
    """Entry point of ``geco-starter`` / ``python -m geco.hooks.starter``."""
    return run("starter", _body)


if __name__ == "__main__":
    sys.exit(main())
