/*
 * pam_geco.c - sshd's gate into jobs, as a PAM account and session module.
 *
 *   account  required  pam_geco.so
 *   session  required  pam_geco.so
 *
 * account: asks gecod (ADOPT, stage ACCOUNT) whether PAM_USER may log in on this
 *   node; a refusal shows the user gecod's one line and fails the login before
 *   anything of theirs runs.
 * session: asks gecod (stage SESSION) to move this process -- sshd's root process
 *   for the connection, which forks the user's side afterwards -- into the job
 *   gecod chose, and puts the job's JOB_ID, SGE_TASK_ID and GECO_* variables
 *   into the session's environment (sshd hands PAM's environment to the shell;
 *   with geco's preload in sshd, JOB_ID and SGE_TASK_ID are the preload's to
 *   set, so that a JOB_ID the client sends can choose the job).
 *
 * The decision is gecod's (geco.ssh.policy.login_verdict): it has the config, the
 * cgroups and the spool at hand, so a login costs one round trip on its
 * privileged socket, signed with the quarantine key (socket and key from
 * /etc/geco/preload.conf, as for the exec() preload). gecod moves the sender
 * of the request, which the kernel names (SO_PEERCRED): no pid is taken on
 * trust.
 *
 * root is always let in (a lock-out guard): gecod is asked only to journal it. When gecod cannot be
 * reached within timeout_ms, the helper (geco-pam, the same decision made in
 * a process of its own) runs instead and does what geco.toml's [ssh]
 * gecod_unreachable says.
 *
 * Arguments: timeout_ms=<1..60000> (default 2000), helper=<absolute path>
 * (default /usr/libexec/geco/geco-pam).
 */
#define _GNU_SOURCE
/* first: geco_config.h names an enum constant LOG_SYSLOG, which syslog.h defines */
#include "geco_client.h"
#include "geco_config.h"
#include "geco_job.h"
#include "geco_log.h"
#include "geco_mntns.h"
#include "geco_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#define PAM_SM_ACCOUNT
#define PAM_SM_SESSION
#include <security/pam_ext.h>
#include <security/pam_modules.h>
#include <sodium.h>

#define EXPORT __attribute__((visibility("default")))
/* where the helper lies: fixed at build time (the Makefile's LIBEXECDIR) */
#ifndef LIBEXEC
#define LIBEXEC "/usr/libexec/geco"
#endif
#define DEFAULT_HELPER LIBEXEC "/geco-pam"
#define DEFAULT_ADOPT_TIMEOUT_MS 2000
#define ROOT_TIMEOUT_MS 250

typedef struct {
    int timeout_ms;
    const char *helper;
} args_t;

static int parse_args(pam_handle_t *pamh, int argc, const char **argv, args_t *args)
{
    args->timeout_ms = DEFAULT_ADOPT_TIMEOUT_MS;
    args->helper = DEFAULT_HELPER;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "timeout_ms=", 11) == 0) {
            long ms = geco_parse_count(argv[i] + 11, 60000);
            if (ms < 0) {
                pam_syslog(pamh, LOG_ERR, "timeout_ms must be 1..60000, got %s", argv[i] + 11);
                return -1;
            }
            args->timeout_ms = (int)ms;
        } else if (strncmp(argv[i], "helper=", 7) == 0 && argv[i][7] == '/') {
            args->helper = argv[i] + 7;
        } else {
            pam_syslog(pamh, LOG_ERR, "unknown argument %s (timeout_ms=, helper=/path)", argv[i]);
            return -1;
        }
    }
    return 0;
}

/* Is geco's preload in this sshd? Then it sets JOB_ID and SGE_TASK_ID when the session
   runs something: sshd puts PAM's variables over the client's, and a JOB_ID the client
   sent (AcceptEnv) must reach the preload to choose the job. */
static int preload_in_sshd(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p != NULL && strstr(p, "libgeco_preload.so") != NULL;
}

/* The reply's first line to the user; the NAME=value lines after it into the session's
   environment (session stage only), its JOB_ID and SGE_TASK_ID into *job and *task. */
static int relay(pam_handle_t *pamh, char *text, int session, uint64_t *job, uint64_t *task)
{
    int leave_job_id = session && preload_in_sshd();
    char *rest = strchr(text, '\n');
    if (rest != NULL)
        *rest++ = '\0';
    if (*text != '\0')
        pam_info(pamh, "%s", text);
    while (session && rest != NULL && *rest != '\0') {
        char *line = rest;
        rest = strchr(line, '\n');
        if (rest != NULL)
            *rest++ = '\0';
        if (strncmp(line, "JOB_ID=", 7) == 0)
            *job = geco_job_id(line + 7, strlen(line + 7));
        else if (strncmp(line, "SGE_TASK_ID=", 12) == 0)
            *task = geco_task_id(line + 12, strlen(line + 12));
        if (leave_job_id && (strncmp(line, "JOB_ID=", 7) == 0
                             || strncmp(line, "SGE_TASK_ID=", 12) == 0))
            continue;
        if (strchr(line, '=') != NULL && pam_putenv(pamh, line) != PAM_SUCCESS) {
            pam_syslog(pamh, LOG_ERR, "cannot set %s in the session's environment", line);
            return -1;
        }
    }
    return 0;
}

/* This process (sshd's root process for the connection, which forks the user's side)
   into the job's mount namespace, as pam_slurm_adopt's join_container: the session
   sees the job's private /tmp and /dev/shm. None pinned: the job has none. */
static int join_mntns(pam_handle_t *pamh, const geco_config_t *cfg, uint64_t job,
                      uint64_t task)
{
    char path[PATH_MAX];
    const char *step;

    if (geco_join_mntns(cfg->job_mntns, job, task, path, sizeof path, &step) >= 0)
        return 0;
    pam_syslog(pamh, LOG_ERR, "cannot enter job %llu.%llu's private /tmp (%s %s): %s",
               (unsigned long long)job, (unsigned long long)task, step, path, strerror(errno));
    return -1;
}

/* Put NAME=value into envp[*n] (storage in buf), when value is set. */
static void add_env(char **envp, int *n, char *buf, size_t cap, const char *name,
                    const char *value)
{
    if (value != NULL && snprintf(buf, cap, "%s=%s", name, value) < (int)cap)
        envp[(*n)++] = buf;
}

/* gecod could not be asked: the helper decides in a process of its own (pam_exec's way:
   PAM_TYPE, PAM_USER, PAM_RHOST and SSH_CONNECTION in a clean environment). Its output
   is read as gecod's reply: the first line to the user, the job's NAME=value lines after
   it into an admitted session's environment. */
static int run_helper(pam_handle_t *pamh, const args_t *args, const char *stage,
                      int session, const char *user, const char *rhost,
                      const char *connection)
{
    char e_type[64], e_user[300], e_rhost[300], e_conn[300];
    char *envp[6];
    int n = 0, fds[2], status = 0;
    char out[GECO_REPLY_MAX_TEXT + 1];
    size_t got = 0;
    ssize_t r;

    add_env(envp, &n, e_type, sizeof e_type, "PAM_TYPE", stage);
    add_env(envp, &n, e_user, sizeof e_user, "PAM_USER", user);
    add_env(envp, &n, e_rhost, sizeof e_rhost, "PAM_RHOST", rhost);
    add_env(envp, &n, e_conn, sizeof e_conn, "SSH_CONNECTION", connection);
    envp[n++] = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
    envp[n] = NULL;
    if (pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        char *argv[] = {(char *)args->helper, NULL};
        dup2(fds[1], STDOUT_FILENO);
        execve(args->helper, argv, envp);
        _exit(127);
    }
    close(fds[1]);
    while (got < sizeof out - 1 && ((r = read(fds[0], out + got, sizeof out - 1 - got)) > 0
                                    || (r < 0 && errno == EINTR)))
        got += r > 0 ? (size_t)r : 0;
    out[got] = '\0';
    close(fds[0]);
    pid_t reaped;
    while ((reaped = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
        ;
    if (reaped != pid)
        return -1; /* its status is unknown (reaped elsewhere): not a success */
    int admitted = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    uint64_t job = 0, task = 1; /* gecod unreachable: the session keeps the node's /tmp */
    if (relay(pamh, out, session && admitted, &job, &task) != 0)
        return 1;
    return admitted ? 0 : 1;
}

/* The quarantine key leaves sshd's memory as soon as the request that needed it is done.
   decide()'s `cfg` is static, and sshd's root process for the connection lives as long as
   the connection: a key left there would sit in its memory for the whole session, in the
   user's side sshd forks from it (until that execs) and in any core dump -- the key that
   lets its holder say "job started" or adopt any session. So it is wiped on every path:
   right after geco_client_adopt() (root's and everyone else's), and before the helper runs
   (the config or key may have failed to load halfway). The next login reads the file
   again (a few syscalls). */
static void forget_key(geco_config_t *cfg)
{
    sodium_memzero(cfg->secret.key, sizeof cfg->secret.key);
}

static int decide(pam_handle_t *pamh, int argc, const char **argv, int stage)
{
    const char *user = NULL, *rhost = NULL, *connection;
    const char *stage_name = stage == GECO_ADOPT_SESSION ? "open_session" : "account";
    static geco_config_t cfg; /* one page for the key (see geco_config.h); sshd is one thread */
    char text[GECO_REPLY_MAX_TEXT + 1];
    char ebuf[512], nbuf[256];
    line_t err = {ebuf, sizeof ebuf, 0}, note = {nbuf, sizeof nbuf, 0};
    geco_client_outcome_t out;
    args_t args;

    if (parse_args(pamh, argc, argv, &args) != 0)
        return PAM_SERVICE_ERR;
    if (pam_get_item(pamh, PAM_USER, (const void **)&user) != PAM_SUCCESS || user == NULL)
        return PAM_USER_UNKNOWN;
    struct passwd *pw = getpwnam(user);
    if (pw == NULL)
        return PAM_USER_UNKNOWN;
    (void)pam_get_item(pamh, PAM_RHOST, (const void **)&rhost);
    connection = pam_getenv(pamh, "SSH_CONNECTION");
    if (connection == NULL || strlen(connection) > GECO_ADOPT_MAX_CONNECTION)
        connection = "";

    if (pw->pw_uid == 0) {
        /* never locked out, whatever gecod's state: asked only so that the login is
           journaled, briefly, and its answer does not count */
        if (geco_proto_init() == 0 && geco_config_load(&cfg, 1, &err, &note) == 0) {
            const geco_adopt_t msg = {.pid = (uint32_t)getpid(), .uid = 0,
                                      .stage = (uint32_t)stage, .connection = connection};
            (void)geco_client_adopt(&cfg.addr, cfg.secret.key, ROOT_TIMEOUT_MS,
                                    cfg.max_skew_ns, &msg, text, sizeof text, &out);
        }
        forget_key(&cfg);
        return PAM_SUCCESS;
    }
    if (geco_proto_init() != 0 || geco_config_load(&cfg, 1, &err, &note) != 0) {
        ebuf[err.len < sizeof ebuf ? err.len : sizeof ebuf - 1] = '\0';
        pam_syslog(pamh, LOG_WARNING, "gecod cannot be asked (%s); the helper decides", ebuf);
    } else {
        const geco_adopt_t msg = {.pid = (uint32_t)getpid(), .uid = (uint32_t)pw->pw_uid,
                                  .stage = (uint32_t)stage, .connection = connection};
        int rc = geco_client_adopt(&cfg.addr, cfg.secret.key, args.timeout_ms, cfg.max_skew_ns,
                                   &msg, text, sizeof text, &out);
        forget_key(&cfg); /* the reply is verified: nothing below needs the key */
        if (rc == GECO_CLIENT_OK || (rc == GECO_CLIENT_E_STATUS && out.status == GECO_REFUSED)) {
            int session = stage == GECO_ADOPT_SESSION && rc == GECO_CLIENT_OK;
            uint64_t job = 0, task = 1;
            if (relay(pamh, text, session, &job, &task) != 0)
                return PAM_SESSION_ERR;
            if (session && job != 0 && join_mntns(pamh, &cfg, job, task) != 0)
                return PAM_SESSION_ERR;
            if (rc == GECO_CLIENT_OK)
                return PAM_SUCCESS;
            return stage == GECO_ADOPT_SESSION ? PAM_SESSION_ERR : PAM_PERM_DENIED;
        }
        pam_syslog(pamh, LOG_WARNING, "gecod did not answer the %s of %s (%s%s%s); the helper "
                   "decides", stage_name, user, geco_client_strresult(rc),
                   rc == GECO_CLIENT_E_STATUS ? ": " : "",
                   rc == GECO_CLIENT_E_STATUS ? geco_status_name(out.status) : "");
    }
    forget_key(&cfg); /* also when the config or key failed to load halfway */
    switch (run_helper(pamh, &args, stage_name, stage == GECO_ADOPT_SESSION, user, rhost,
                       connection)) {
    case 0:
        return PAM_SUCCESS;
    case 1:
        return stage == GECO_ADOPT_SESSION ? PAM_SESSION_ERR : PAM_PERM_DENIED;
    default:
        pam_syslog(pamh, LOG_ERR, "cannot run %s: %s", args.helper, strerror(errno));
        return PAM_SYSTEM_ERR;
    }
}

EXPORT int pam_sm_acct_mgmt(pam_handle_t *pamh, int flags, int argc, const char **argv)
{
    (void)flags;
    return decide(pamh, argc, argv, GECO_ADOPT_ACCOUNT);
}

EXPORT int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv)
{
    (void)flags;
    return decide(pamh, argc, argv, GECO_ADOPT_SESSION);
}

EXPORT int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv)
{
    (void)pamh;
    (void)flags;
    (void)argc;
    (void)argv;
    return PAM_SUCCESS; /* the session's processes end with the job, or leave with it */
}
