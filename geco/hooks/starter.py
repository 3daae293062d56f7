"""The starter_method (job owner): check containment, export the job's facts, start the job.

Configure it in the queue as ``starter_method /usr/libexec/geco/starter``.
That path is a small C program (``hook/geco_hook.c``): gecod does this work with this
module's own code when it can (:mod:`geco.daemon.hookserve`), else the program runs this
module as ``/usr/libexec/geco/geco-starter``.

Steps, in order:

1. Find the job from its environment.
2. Check, from /proc, that this process is inside the job's cgroups in every
   managed controller (the exec() preload in sge_execd had gecod put the
   shepherd there, or the prolog did).
3. If it is not (a site without the preload, a ``qrsh -inherit`` task), ask
   gecod to move it: a peer-credentialed QUARANTINE_SELF for its own pid
   (:func:`geco.wire.client.quarantine_self`; gecod checks, through the kernel, that
   it runs as the job's owner below the job's shepherd). When gecod answers
   OK, check containment again from /proc. When it refuses or cannot be
   reached: a batch job is refused with one plain sentence in its stderr file
   (exit 100): it would run unbound and unlimited. A ``qrsh -inherit`` task
   follows ``[gecod] unreachable_policy``: ``refuse`` refuses it the same
   way, ``allow`` starts it uncontained with a journaled warning.
4. Export ``GECO_*`` facts read back from the kernel (what is enforced, not
   what was asked for): ``GECO_CPUS``, ``GECO_NCPUS``, ``GECO_MEMS``,
   ``GECO_MEMORY_LIMIT``, ``GECO_VMEM_LIMIT`` (bytes, 0 = none), ``GECO_NODE``; on a
   GPU node ``GECO_GPUS``, ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``.
5. Start the job the way Grid Engine itself would: with a configured starter,
   Grid Engine hands over the job script and leaves ``shell_start_mode`` to us
   (``SGE_STARTER_SHELL_START_MODE``, ``..._SHELL_PATH``, ``..._USE_LOGIN_SHELL``).
   The job's arguments are passed on untouched. A contained job's start is
   journaled (``GECO_EVENT=job-started``: its cores, the program run, and
   ``SINCE_EXEC_SEC``, the starter's time from its exec to the job's).

The starter is on every job's critical path: it imports nothing it does not
need, and it reads the job's resource file (for its trace level) only when
the job's trace file exists (:func:`geco.hooks.run`).
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from geco import cgroup, log, procfs
from geco._tuple import NamedTuple
from geco.config import Config
from geco.errors import GecoError, NotContained
from geco.hooks import Exit, run
from geco.jobkey import JobKey
from geco.node import gpus
from geco.sge import execd

__all__ = ["FOR_THE_STARTER", "Launch", "job_argv", "journal_started", "launch_of", "main",
           "plan"]

# What Grid Engine tells a starter_method about the shell; a job started without one
# never sees them.
FOR_THE_STARTER = ("SGE_STARTER_SHELL_PATH", "SGE_STARTER_SHELL_START_MODE",
                   "SGE_STARTER_USE_LOGIN_SHELL")


class Launch(NamedTuple):
    """What Grid Engine says about how it would start the job itself, without a starter.

    Attributes
    ----------
    binary: ``qsub -b y``: the "script" is a command (spooled config ``handle_as_binary``).
    no_shell: ``-shell no`` (``no_shell``), or ``qrsh -noshell`` (``qrsh_starter ... noshell``).
    qrsh: a ``qrsh`` command or ``qrsh -inherit`` task, started through ``qrsh_starter``.
    owner_shell: the owner's login shell (passwd), which runs qrsh commands.
    """

    binary: bool = False
    no_shell: bool = False
    qrsh: bool = False
    owner_shell: str = "/bin/sh"


def job_argv(argv: Sequence[str], env: Mapping[str, str],
             launch: Launch) -> tuple[str, list[str]]:
    """Return ``(program, argv)`` that starts the job exactly as Grid Engine would.

    With a starter_method, Grid Engine hands over the job's words and leaves the
    shell to us (``start_command()`` in the shepherd's ``builtin_starter.c``, and
    ``startJob()`` in ``qrsh_starter.c`` for qrsh commands); this repeats its rules:

    * ``-b y`` with a shell: the words joined into one line, each followed by a
      space, run by the job's shell with ``-c`` (so shell syntax in the string
      works, and an odd quote is the shell's syntax error);
    * ``script_from_stdin``: the shell with ``-s`` and the arguments (Grid Engine
      already made the script the starter's stdin and passed ``-s``);
    * ``posix_compliant``: the script as the shell's first argument;
    * ``start_as_command``: the script path as the shell's ``-c`` line;
    * ``unix_behavior``, ``raw_exec``, ``-b y -shell n``: exec'd directly;
    * a qrsh command: the owner's login shell with ``-c`` and the words joined by
      spaces, or exec'd directly with ``-noshell``.

    The job's shell runs as a login shell (``-sh``) when Grid Engine says so.
    """
    if launch.qrsh:
        if launch.no_shell:
            return argv[0], list(argv)
        shell = launch.owner_shell
        return shell, [os.path.basename(shell), "-c", " ".join(argv)]
    mode = env.get("SGE_STARTER_SHELL_START_MODE", "")
    shell = env.get("SGE_STARTER_SHELL_PATH", "") or "/bin/sh"
    name = os.path.basename(shell)
    if env.get("SGE_STARTER_USE_LOGIN_SHELL") == "true":
        name = "-" + name
    if launch.binary and not launch.no_shell:
        words = list(argv)
        if mode == "script_from_stdin" and words[:1] == ["-s"]:
            # Grid Engine passed "-s" for the mode; the command is the job "script"
            words = [env.get("JOB_SCRIPT", ""), *words[1:]]
        return shell, [name, "-c", "".join(word + " " for word in words)]
    if mode == "script_from_stdin":
        return shell, [name, *argv]
    if mode == "posix_compliant" and not launch.binary:
        return shell, [name, *argv]
    if mode == "start_as_command" and not launch.binary:
        return shell, [name, "-c", argv[0]]
    return argv[0], list(argv)


def launch_of(env: Mapping[str, str], argv: Sequence[str], parent: int, uid: int,
              spool_dir: Path) -> Launch:
    """How Grid Engine would start this job: from the spooled config and the process tree.

    ``parent`` is the starter's parent (``qrsh_starter`` for a qrsh command), ``uid`` the
    job owner's, ``spool_dir`` the job's execd spool dir. In the starter, which runs as
    the owner, all of it is the owner's own, so what the job's environment points at can
    mislead only the owner's own job; gecod passes what the kernel vouches for.
    """
    if env.get("JOB_SCRIPT") == "QRSH":
        # qrsh_starter <spool dir> [noshell] forked us; it names -noshell only there
        words = (procfs.read(parent, "cmdline") or b"").split(b"\0")
        try:
            shell = pwd.getpwuid(uid).pw_shell or "/bin/sh"
        except KeyError:
            shell = "/bin/sh"
        return Launch(no_shell=b"noshell" in words[2:3], qrsh=True, owner_shell=shell)
    try:
        config = execd.read_config(spool_dir)
    except GecoError:
        # no config to read: a job script is the execd's copy in job_scripts/
        script = bool(argv) and env.get("JOB_SCRIPT") == argv[0] and os.path.basename(
            os.path.dirname(argv[0])) == "job_scripts"
        return Launch(binary=not script)
    return Launch(binary=config.get("handle_as_binary") == "1",
                  no_shell=config.get("no_shell") == "1")


def plan(argv: Sequence[str], env: dict[str, str], launch: Launch) -> tuple[str, list[str]]:
    """The job's program and arguments (:func:`job_argv`); ``env`` loses what Grid Engine
    tells only the starter."""
    program, args = job_argv(argv, env, launch)
    for name in FOR_THE_STARTER:  # Grid Engine sets them for us only, not for the job
        env.pop(name, None)
    return program, args


def journal_started(logger: log.Logger, job: JobKey, node: str, cpus: str, argv: Sequence[str],
                    program: str, since_exec: float) -> None:
    """Journal a contained job's start (``job-started``): one datagram; the job's arguments
    stay out of it (they may hold secrets)."""
    shell = program != argv[0]
    logger.info("job %s started in its cgroups on %s: cores %s, running %s%s", job, node,
                cpus or "all", argv[0], f" under {program}" if shell else "",
                extra=log.job_fields(job.job, job.task, "job-started", CPUS=cpus,
                                     COMMAND=argv[0], SHELL=program if shell else None,
                                     # the starter's own figure: it never gets to journal
                                     # starter-done, the job replaces it
                                     SINCE_EXEC_SEC=f"{since_exec:.3f}"))


def _ask_gecod(cfg: Config, job: execd.JobRef, backend: cgroup.Backend,
               logger: log.Logger) -> str:
    """Have gecod move this process into the job's cgroups; return "" or why it did not."""
    # imported only on this rare path: the protocol and socket code are not needed by a
    # starter that is already contained, which is every job on a node with the preload
    from geco.wire import client

    try:
        client.quarantine_self(cfg, job.job_id, job.task_id)
    except GecoError as exc:
        why = str(exc)
    else:
        if backend.contains(job.key, os.getpid()):
            logger.info("job %s: the starter was outside the job's cgroups; gecod moved it "
                        "in", job.key, extra=log.job_fields(job.job_id, job.task_id,
                                                           "starter-quarantined"))
            return ""
        why = "gecod answered OK, but this process is still outside the job's cgroups"
    logger.warning("job %s: the starter is outside the job's cgroups and gecod did not move "
                   "it: %s", job.key, why,
                   extra=log.job_fields(job.job_id, job.task_id, "starter-not-quarantined",
                                        REASON=why))
    return why


def _body(cfg: Config, logger: log.Logger) -> Exit:
    argv = sys.argv[1:]
    if not argv:
        print("geco: the starter_method got no job to start", file=sys.stderr)
        return Exit.JOB_ERROR
    job = execd.job_from_hook([], os.environ)
    backend = cgroup.for_config(cfg)
    env = dict(os.environ)
    node = os.uname().nodename
    why = ""
    if not backend.contains(job.key, os.getpid()):
        why = _ask_gecod(cfg, job, backend, logger)
    qrsh = os.environ.get("JOB_SCRIPT") == "QRSH"
    if not why:
        limits = backend.read_limits(job.key)
        env.update(limits.environment(len(os.sched_getaffinity(0)), node))
        env.update(gpus.job_environment(cfg, job.key))
    elif qrsh and cfg.gecod_unreachable_policy == "allow":
        logger.warning("qrsh -inherit task of job %s started outside the job's cgroups on %s "
                       "([gecod] unreachable_policy = allow): %s", job.key, node, why,
                       extra=log.job_fields(job.job_id, job.task_id, "task-not-contained",
                                            REASON=why))
    else:
        where = ", ".join(str(p) for p in backend.paths(job.key).values())
        if qrsh:
            raise NotContained(f"qrsh -inherit task of job {job.key} is not inside the job's "
                               f"cgroups on {node}; it is not started uncontained ({why}). "
                               f"Ask your admin to check gecod on {node}", cgroups=where)
        raise NotContained(f"job {job.key} is not inside its cgroups on {node}; it is not "
                           f"started uncontained. Ask your admin to check the queue's geco "
                           f"prolog", cgroups=where)
    launch = launch_of(os.environ, argv, os.getppid(), os.getuid(),
                       Path(os.environ.get("SGE_JOB_SPOOL_DIR", "")))
    program, args = plan(argv, env, launch)
    if not why:
        journal_started(logger, job.key, node, env["GECO_CPUS"], argv, program,
                        procfs.seconds_since_start())
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
