/*
 * session.c - sshd's gate: the second line behind sshd's PAM module.
 *
 * ssh sessions do not inherit the library: OpenSSH builds a session's
 * environment afresh (session.c, do_setup_env(): the user's basics, PAM's,
 * SetEnv, what the client sends through AcceptEnv, ~/.ssh/environment with
 * PermitUserEnvironment), never from sshd's own, and runs ~/.ssh/rc, sshrc and
 * xauth in it too (environ = env before them). LD_PRELOAD reaches a session
 * only where the admin or the user put it: their own choice, as with
 * `qsub -v LD_PRELOAD=...`, and the library is inert there.
 *
 * In sshd (and sshd-session), the process that runs the user's shell or
 * command, ~/.ssh/rc, /etc/ssh/sshrc or xauth runs as the user by then. The
 * first time such a process is about to run anything, it asks gecod (ADOPT,
 * stage EXEC, peer-credentialed on everyone's socket: it holds no key) to put
 * it into its job: the one its JOB_ID/SGE_TASK_ID name (sent by the client,
 * AcceptEnv), else the one it is in already (sshd's PAM module adopted the
 * connection), else gecod's choice, as at login. gecod checks the kernel's
 * word: the sender's uid and pid, a program named sshd, a root sshd above it.
 * The answer's NAME=value lines (JOB_ID, SGE_TASK_ID, GECO_*) go into the
 * environment of an exec; a refusal's line goes to the session's stderr and
 * nothing runs (EACCES). root's sessions and sshd's own root processes pass.
 *
 * When gecod does not place the process (not running, its socket's share for
 * this user full, an address that is not gecod's socket), the exec fails closed
 * unless session_policy=allow: see unplaced_may_run() (session_policy.c).
 */
#define _GNU_SOURCE

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "geco_client.h"
#include "geco_job.h"
#include "geco_proto.h"
#include "preload.h"

/* a login waits no longer than this for gecod (PAM's module gives it as long) */
#define SESSION_TIMEOUT_MS 2000

static struct {
    pid_t pid;                             /* the process the answer is for */
    int envc;                              /* reply lines in env_add (0: none) */
    char text[GECO_REPLY_MAX_TEXT + 1];    /* the reply, lines NUL-terminated in place */
    char *env_add[64];                     /* its NAME=value lines */
} session;

/* Value of NAME in envp (NULL: absent). */
static const char *env_value(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (; envp != NULL && *envp != NULL; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

/* The session's own environment with the reply's lines replacing theirs; NULL when it
   does not fit (then it runs with its own). */
static char *const *session_env(char *const *envp)
{
    int n = 0;
    for (; envp != NULL && *envp != NULL; envp++) {
        int replaced = 0;
        for (int i = 0; i < session.envc && !replaced; i++) {
            size_t len = (size_t)(strchr(session.env_add[i], '=') - session.env_add[i]);
            replaced = strncmp(*envp, session.env_add[i], len + 1) == 0;
        }
        if (replaced)
            continue;
        if (n >= EXEC_ENV_SLOTS - 65)
            return NULL;
        exec_env[n++] = *envp;
    }
    for (int i = 0; i < session.envc; i++)
        exec_env[n++] = session.env_add[i];
    exec_env[n] = NULL;
    return exec_env;
}

static void say_to_session(const char *text)
{
    size_t n = strlen(text);
    ssize_t w;
    if (n == 0)
        return;
    do
        w = write(STDERR_FILENO, text, n);
    while (w < 0 && errno == EINTR);
    do
        w = write(STDERR_FILENO, "\n", 1);
    while (w < 0 && errno == EINTR);
}

/* Ask gecod once per process; 0: go on (*use_envp set when the environment changes),
   -1: refused (errno EACCES). */
int session_gate(char *const *envp, char *const **use_envp)
{
    if (!state.sshd || !state.active || getuid() == 0)
        return 0;
    if (session.pid != getpid()) {
        geco_client_outcome_t out;
        /* ids Grid Engine would not write name no job (0.0): gecod chooses one */
        uint64_t job = 0, task = 0;
        (void)geco_job_of(env_value(envp, "JOB_ID"), env_value(envp, "SGE_TASK_ID"), &job,
                          &task);
        const char *connection = env_value(envp, "SSH_CONNECTION");
        static const uint8_t public_key[GECO_KEY_BYTES]; /* PEERCRED: 32 zero bytes */
        const geco_adopt_t msg = {.job_id = job, .task_id = task, .pid = (uint32_t)getpid(),
                                  .uid = (uint32_t)getuid(), .stage = GECO_ADOPT_EXEC,
                                  .connection = connection != NULL
                                                    && strlen(connection)
                                                           <= GECO_ADOPT_MAX_CONNECTION
                                                    ? connection : "",
                                  .peercred = 1};
        int r = geco_client_adopt(&cfg.session_addr, public_key,
                                  cfg.timeout_ms < SESSION_TIMEOUT_MS ? cfg.timeout_ms
                                                                      : SESSION_TIMEOUT_MS,
                                  cfg.max_skew_ns, &msg, session.text, sizeof session.text,
                                  &out);
        char *rest = strchr(session.text, '\n');
        if (rest != NULL)
            *rest++ = '\0';
        if (r == GECO_CLIENT_E_STATUS && out.status == GECO_REFUSED) {
            say_to_session(session.text[0] != '\0' ? session.text
                                                   : "geco: your session has no job here");
            errno = EACCES;
            return -1;
        }
        if (r != GECO_CLIENT_OK) {
            char buf[1000];
            line_t l = {buf, sizeof buf, 0};
            put(&l, "ssh session (pid ");
            put_u64(&l, (uint64_t)getpid());
            put(&l, ", uid ");
            put_u64(&l, (uint64_t)getuid());
            put(&l, "): gecod at ");
            put(&l, cfg.session_socket_text);
            put(&l, " did not place it: ");
            put(&l, r == GECO_CLIENT_E_STATUS ? geco_status_name(out.status)
                                              : geco_client_strresult(r));
            if (out.sys_errno != 0 && r != GECO_CLIENT_E_TIMEOUT) {
                put(&l, ": ");
                put_errno(&l, out.sys_errno);
            }
            if (!unplaced_may_run(&l)) {
                emit(3, l.buf, l.len);
                say_to_session("geco: your session cannot be placed in its job now; try "
                               "again, or ask your admin");
                errno = EACCES;
                return -1;
            }
            emit(4, l.buf, l.len);
            session.text[0] = '\0';
            rest = NULL;
        }
        session.envc = 0;
        while (rest != NULL && *rest != '\0'
               && session.envc < (int)(sizeof session.env_add / sizeof session.env_add[0])) {
            char *line = rest;
            rest = strchr(line, '\n');
            if (rest != NULL)
                *rest++ = '\0';
            if (strchr(line, '=') != NULL)
                session.env_add[session.envc++] = line;
        }
        session.pid = getpid();
    }
    if (use_envp != NULL && session.envc > 0) {
        char *const *env = session_env(envp);
        if (env != NULL)
            *use_envp = env;
    }
    return 0;
}
