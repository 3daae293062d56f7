"""The differential suite's cases ("same job, same result"): the job scripts written into
its job directory, and the batch submissions compared with Grid Engine alone
(tests/integration/test_same_result.py; test_private_tmp_same_result.py runs them with
private /tmp on)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.integration.samekit import Batch, Same, same_queues

__all__ = ["BATCH", "FILES", "queues_with_scripts"]


# ---------------------------------------------------------------------------
# the job scripts (written into the job directory once)
# ---------------------------------------------------------------------------

# What a job shows of how it was started: the shell's own argv (a login shell's starts
# with "-"), its parent (no wrapper left in between), its arguments, whether bash runs
# it and as a login shell, PATH (a login shell's profile resets it), cwd, stdin.
SHOW = r"""echo "argv: $(tr '\0' ' ' < /proc/$$/cmdline)"
echo "parent: $(cat /proc/$PPID/comm)"
echo "args: $#"
for a in "$@"; do echo "  [$a]"; done
echo "bash: ${BASH_VERSION:+yes}"
if [ -n "$BASH_VERSION" ]; then shopt login_shell; fi
echo "PATH=$PATH"
echo "pwd: $(pwd)"
if read -r line; then echo "stdin: $line"; else echo "stdin: <eof>"; fi
echo "to stderr" >&2
exit 3
"""

FILES = {
    "show.sh": "#!/bin/sh\n" + SHOW,
    "showbash.sh": "#!/bin/bash\n" + SHOW,
    "input.txt": "line one\nline 'two' $x\n",
    "python.sh": """#!/bin/sh
#$ -S /usr/bin/python3
import os, sys
print("argv", sys.argv[1:])
print("interpreter", os.path.basename(os.readlink("/proc/self/exe")))
print("cwd", os.getcwd())
print("parent", open(f"/proc/{os.getppid()}/comm").read().strip())
print("to stderr", file=sys.stderr)
sys.exit(4)
""",
    "directives.sh": """#!/bin/sh
#$ -N directives
#$ -j y
#$ -v FROM_DIRECTIVE=yes
echo "stdout, FROM_DIRECTIVE=$FROM_DIRECTIVE, JOB_NAME=$JOB_NAME"
echo "stderr" >&2
""",
    "env.sh": "#!/bin/sh\nenv | LC_ALL=C sort\n",
    "vars.sh": """#!/bin/sh
echo "SAME_A=[${SAME_A-unset}]"
echo "SAME_B=[${SAME_B-unset}]"
echo "SAME_C=[${SAME_C-unset}]"
""",
    "pwd.sh": "#!/bin/sh\necho \"pwd=$(pwd) PWD=$PWD\"\necho \"SGE_O_WORKDIR=$SGE_O_WORKDIR\"\n",
    "cat.sh": "#!/bin/sh\ncat\necho \"rc=$?\"\n",
    "task.sh": """#!/bin/sh
echo "task $SGE_TASK_ID of $SGE_TASK_FIRST-$SGE_TASK_LAST step $SGE_TASK_STEPSIZE"
exit $SGE_TASK_ID
""",
    # a parallel job starting tasks with qrsh -inherit: a command string, words joined by
    # qrsh_starter, -noshell, and a task's exit code
    "mpi.sh": r"""#!/bin/sh
echo "master: NSLOTS=$NSLOTS"
qrsh -inherit "$HOSTNAME" 'echo "a b"; echo err >&2; exit 3'
echo "rc=$?"
qrsh -inherit "$HOSTNAME" /usr/bin/printf '[%s]\n' "a b" 'c$d'
echo "rc=$?"
qrsh -inherit -noshell "$HOSTNAME" /usr/bin/printf '[%s]\n' "a b" 'c$d'
echo "rc=$?"
qrsh -inherit "$HOSTNAME" 'echo "task argv: $0"; cat /proc/$PPID/comm'
""",
    # three children counting while the job runs; stop.<job> ends them
    "counters.sh": """#!/bin/sh
for i in 1 2 3; do
  ( n=0; while [ ! -e stop.$JOB_ID ]; do n=$((n+1)); echo $n > count.$JOB_ID.$i; sleep 0.1; done ) &
done
echo ready
wait
echo "children done"
""",
    # Python, so that no child process dies of a notify signal: whether a shell's sleep
    # is running at that moment, and the shell reports its death, would be a race
    "notify.py": """#!/usr/bin/python3
#$ -S /usr/bin/python3
import signal, time
def said(number, frame):
    print("got", signal.Signals(number).name, flush=True)
signal.signal(signal.SIGUSR1, said)
signal.signal(signal.SIGUSR2, said)
print("ready", flush=True)
while True:
    time.sleep(0.2)
""",
    # sleeps 60 s; SIGUSR1 (s_rt) ends it with a word and exit code 3. Grid Engine may
    # deliver the signal twice: the handler ignores a second one and exits at once (a
    # second one during Python's shutdown would kill the job instead, on either queue)
    "sleeper.py": """#!/usr/bin/python3
#$ -S /usr/bin/python3
import os, signal, time
def ended(number, frame):
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print("got", signal.Signals(number).name, flush=True)
    os._exit(3)
signal.signal(signal.SIGUSR1, ended)
print("start", flush=True)
time.sleep(60)
print("not reached")
""",
}

# qsub -b y: Grid Engine runs "<command> <arg> ... " (each word and a blank) with the
# job's shell and -c, so shell syntax works and an odd quote is the shell's syntax error;
# with -shell no it execs the command with the words untouched.
ARGS = ("[%s]\\n", "a b", "$HOME", '"double"', "x  y", "`echo tick`")

BATCH = {
    "S-bash-login-shell": Batch(("-cwd", "-N", "sbash", "-S", "/bin/bash", "show.sh", "a b",
                                 "c$d")),
    "S-dash-not-login": Batch(("-cwd", "-N", "sdash", "-S", "/bin/dash", "show.sh")),
    "directive-S-python3": Batch(("-cwd", "python.sh", "x y")),
    "directives-N-j-v": Batch(("-cwd", "directives.sh")),
    "environment": Batch(("-cwd", "-N", "env", "env.sh")),
    "v-variables": Batch(("-cwd", "-N", "vars", "-v", "SAME_A=one two,SAME_B=x$y", "vars.sh")),
    "V-environment": Batch(("-cwd", "-N", "bigv", "-V", "vars.sh"),
                           env={"SAME_A": "from -V", "SAME_C": "c'c"}),
    "cwd": Batch(("-cwd", "-N", "cwd", "pwd.sh")),
    "no-cwd": Batch(("-N", "nocwd", "pwd.sh")),
    "stdin-i-file": Batch(("-cwd", "-N", "stdin", "-i", "input.txt", "cat.sh")),
    # (-N: without it Grid Engine refuses this command as a job name: "Unable to run job:
    # Error reading answer list from qmaster")
    "b-y-shell-syntax": Batch(
        ("-cwd", "-N", "pipe", "-b", "y", "echo one | tr a-z A-Z; echo two"),
        worked=lambda o: o.outputs.get("pipe.o<JOB>") == "ONE\ntwo\n"),
    "b-y-words-joined": Batch(
        ("-cwd", "-N", "quotes", "-b", "y", "/bin/echo", "a b", "c$d", "e'f"),
        worked=lambda o: "Syntax error" in o.outputs.get("quotes.e<JOB>", "")),
    "b-y-shell-no": Batch(
        ("-cwd", "-N", "noshell", "-b", "y", "-shell", "no", "/bin/echo", "a b", "c$d"),
        worked=lambda o: o.outputs.get("noshell.o<JOB>") == "a b c$d\n"),
    "b-y-arguments": Batch(("-cwd", "-N", "args", "-b", "y", "/usr/bin/printf", *ARGS)),
    "b-y-shell-no-arguments": Batch(("-cwd", "-N", "argsns", "-b", "y", "-shell", "no",
                                     "/usr/bin/printf", *ARGS)),
    "b-y-S-bash": Batch(("-cwd", "-N", "bbash", "-b", "y", "-S", "/bin/bash",
                         "echo $0; shopt login_shell; exit 5")),
    "array-t-tc": Batch(("-cwd", "-N", "arr", "-t", "1-2", "-tc", "1", "task.sh"), tasks=(1, 2)),
    "now-y": Batch(("-cwd", "-N", "now", "-now", "y", "show.sh", "now")),
}


@contextlib.contextmanager
def queues_with_scripts(sge: Any, owner: Any, prefix: str) -> Iterator[Same]:
    """:func:`samekit.same_queues`, with :data:`FILES` written into its job directory."""
    with same_queues(sge, owner, prefix) as kit:
        for name, text in FILES.items():
            kit.write(name, text)
        yield kit
