/*
 * geco_preload.c - the exec() wrapper loaded into sge_execd with LD_PRELOAD: its gate.
 *
 * Start reading at geco_gate(): every wrapped exec goes through it.
 *
 * What it does. When a process is about to exec a program whose basename is in
 * `exec_filter` (sge_shepherd), the wrapper reads the job id from the
 * `environment` file in the current directory (sge_execd chdir()s into
 * active_jobs/<job>.<task> before it execs the shepherd), asks gecod to put
 * this very process into the job's cgroups (JOB_STARTED with getpid(); the
 * exec keeps the pid), waits for the verified ack, and only then calls the
 * real exec. So the shepherd, and everything it starts, begins life inside
 * the job's cgroups. Every other exec is passed through untouched.
 *
 * In sshd and sshd-session it works for ssh sessions instead: the first exec,
 * posix_spawn, popen or system of a process running as the user asks gecod to
 * put it into its job (session_gate(), session.c), the second line behind sshd's
 * PAM module. When gecod cannot place it, session_policy decides (fail closed
 * unless `allow`: see unplaced_may_run(), session_policy.c).
 *
 * Outcomes of a matching exec (one place: quarantine(), shepherd.c):
 *   ack OK                          -> real exec
 *   anything else, policy=refuse    -> return -1, errno EAGAIN ("try again
 *                                      later"), the program does not run
 *   anything else, policy=allow     -> real exec + one "geco:" warning line
 *   library inert (see setup.c)     -> real exec + one "geco:" warning line
 *
 * Rules the preload's files keep (the exec path of a process it does not own must stay as
 * cheap and as safe as a plain exec):
 *   - all setup happens once, in the constructor (pthread_once as the
 *     fallback when an exec comes first, setup.c): dlsym(RTLD_NEXT) for every
 *     real function, the config, the key, the filter basenames (geco_config.c
 *     reads the last three);
 *   - the path taken by a non-matching exec is a basename scan and a few
 *     strcmp()s: no malloc, no stdio, no locks, no syscalls (fexecve: one
 *     readlink), the caller's errno restored, argv/envp passed on as the same
 *     pointers;
 *   - the matching path (geco_client.c) does no malloc/stdio/locking either:
 *     it runs in sge_execd's child between fork() and exec();
 *   - a thread-local flag makes a nested call (another preload, a libc that
 *     calls execve() through the PLT from execvp()) pass straight through, so
 *     one exec never sends two requests.
 *
 * Which file does what: preload.h.
 */
#define _GNU_SOURCE

#include <string.h>
#include <unistd.h>

#include "preload.h"

char *exec_env[EXEC_ENV_SLOTS];

/* Set while this thread is inside the wrapper's own work. initial-exec: the
   library is loaded at start-up, and a global-dynamic access may allocate. */
static __thread int geco_busy __attribute__((tls_model("initial-exec")));

/* The basename the filter is compared with; NULL (a NULL path: let the real
   call fail with EFAULT) matches nothing. Not inlined into the wrappers,
   whose parameters glibc declares nonnull. */
static const char *base_name(const char *path)
{
    if (path == NULL)
        return NULL;
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

static int filtered(const char *name)
{
    if (name == NULL)
        return 0;
    for (unsigned i = 0; i < cfg.nfilters; i++)
        if (strcmp(name, cfg.filters[i]) == 0)
            return 1;
    return 0;
}

/*
 * Every wrapped exec (and, for ssh sessions, spawn) asks this first. Returns 0:
 * call the real function, with *use_envp when it was changed (an ssh session's
 * job variables, a shepherd's LD_PRELOAD); -1: do not (errno is set). path
 * NULL: not an exec (a spawn, popen, system), which only ssh sessions are asked
 * about. The caller restores its saved errno before a call-through, so whatever
 * happens here never shows.
 */
int geco_gate(const char *path, char *const *envp, char *const **use_envp)
{
    int rc;
    /* a nested exec from inside our own work, or from a libc/preload below us
       that calls an exported exec from its own: pass straight through */
    if (geco_busy)
        return 0;
    preload_setup();
    if (state.sshd) {
        geco_busy = 1;
        rc = session_gate(envp, use_envp);
        geco_busy = 0;
        return rc;
    }
    const char *name = base_name(path);
    if (!filtered(name))
        return 0; /* the fast path: everything but job starts */

    geco_busy = 1;
    if (state.active) {
        rc = quarantine(name);
    } else {
        char buf[700];
        line_t l = {buf, sizeof buf, 0};
        put_job(&l, name, 0, 0, (uint32_t)getpid());
        put(&l, " starts without quarantine: preload inactive: ");
        put(&l, state.inert_reason);
        emit(4, l.buf, l.len);
        rc = 0;
    }
    /* however it goes ahead (acked, policy=allow, inert), the job carries no geco */
    if (rc == 0 && use_envp != NULL)
        shepherd_env(name, envp, use_envp);
    geco_busy = 0;
    return rc;
}
