/*
 * geco_hook.c - the prolog, epilog and starter Grid Engine runs for every job, in a
 * millisecond.
 *
 *   prolog          root@/usr/libexec/geco/prolog $job_id $ja_task_id
 *   epilog          root@/usr/libexec/geco/epilog $job_id $ja_task_id
 *   starter_method  /usr/libexec/geco/starter
 *
 * The name it runs under picks the hook. A Python hook spends most of its time
 * starting an interpreter and importing geco. gecod already runs both: this program
 * asks it (HOOK, on the privileged socket, MAC'd with the quarantine key, socket and
 * key from /etc/geco/preload.conf) to do the hook's work for this process, and exits 0
 * when it did. The starter, running as the job owner, asks on gecod's public socket
 * (STARTER, peer-credentialed: gecod checks through the kernel that it is inside the
 * job's cgroups and the job's shepherd started it) how Grid Engine would start the job,
 * and gecod answers with the program, its arguments and the job's GECO_* variables;
 * the starter sets them and execs the job. In every other case -- gecod not running,
 * busy, refusing, the job traced, outside its cgroups, arguments it does not read -- it
 * execs the Python hook (geco-prolog, geco-epilog, geco-starter beside it) with the
 * same arguments, which does the work itself and says what went wrong: this program
 * never decides an outcome of its own, so it cannot put a job or a queue in error.
 *
 * The job's environment reaches these hooks (qsub -v): only the job's ids and what Grid
 * Engine tells a starter about the job's shell are read from it, and $GECO_PRELOAD_CONF
 * is dropped before the config is loaded, so that a job cannot point a hook at a socket
 * and key of its own.
 */
#define _GNU_SOURCE
/* first: geco_config.h names an enum constant LOG_SYSLOG, which syslog.h defines */
#include "geco_client.h"
#include "geco_config.h"
#include "geco_job.h"
#include "geco_proto.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef LIBEXEC
#define LIBEXEC "/usr/libexec/geco"
#endif

/* the hooks, by the name they run under, and the Python hook that does the work when
   gecod does not */
static const struct {
    const char *name, *python;
    uint32_t hook;
} HOOKS[] = {{"prolog", LIBEXEC "/geco-prolog", GECO_HOOK_PROLOG},
             {"epilog", LIBEXEC "/geco-epilog", GECO_HOOK_EPILOG},
             {"starter", LIBEXEC "/geco-starter", 0}};
#define NHOOKS (sizeof HOOKS / sizeof HOOKS[0])

/* gecod did the hook's work for this process: the hook's exit status (0; 99 when gecod
   says the job must be re-queued, 100 held), or -1 when the Python hook must do it */
static int done_by_gecod(int argc, char **argv, uint32_t hook)
{
    static geco_config_t cfg; /* one page for the key (see geco_config.h) */
    char ebuf[256], nbuf[256];
    line_t err = {ebuf, sizeof ebuf, 0}, note = {nbuf, sizeof nbuf, 0};
    geco_client_outcome_t out;

    if (argc != 3 || geteuid() != 0)
        return -1;
    uint64_t job, task;
    if (geco_job_of(argv[1], argv[2], &job, &task) != 0)
        return -1;
    unsetenv("GECO_PRELOAD_CONF");
    if (geco_proto_init() != 0 || geco_config_load(&cfg, 1, &err, &note) != 0)
        return -1;
    if (geco_client_hook(&cfg.addr, cfg.secret.key, cfg.timeout_ms, cfg.max_skew_ns, job,
                         task, (uint32_t)getpid(), hook, &out) == GECO_CLIENT_OK)
        return 0;
    /* a prolog gecod ran to the end, which found the job cannot start now (a host of a
       parallel job did not prepare it; journaled): re-queued, or held in error when that
       happened too often, not done a second time */
    if (hook != GECO_HOOK_PROLOG || out.result != GECO_CLIENT_E_STATUS)
        return -1;
    return out.status == GECO_REQUEUE ? 99 : out.status == GECO_HOLD ? 100 : -1;
}

/* Apply gecod's STARTER_REPLY strings (program, argument count, arguments, environment
   changes) and exec the job; returns only when the reply is unusable (-1) or the exec
   failed (errno set). */
static int start_as_told(char *strings, size_t len, const char **program)
{
    char *words[GECO_MAX_PAYLOAD + 1]; /* every string takes a byte at least; one NULL */
    size_t n = 0;
    for (size_t at = 0; at < len; at += strlen(strings + at) + 1)
        words[n++] = strings + at;
    if (n < 2)
        return -1;
    long argc = strcmp(words[1], "0") == 0 ? 0 : geco_parse_count(words[1], GECO_MAX_PAYLOAD);
    if (argc < 0 || (size_t)argc > n - 2)
        return -1;
    for (size_t i = 2 + (size_t)argc; i < n; i++) {
        char *eq = strchr(words[i], '=');
        if (eq != NULL ? putenv(words[i]) != 0 : unsetenv(words[i]) != 0)
            return -1;
    }
    char **argv = &words[2];
    words[2 + (size_t)argc] = NULL; /* its change is applied already */
    *program = words[0];
    execvp(words[0], argv);
    return 0;
}

/* Ask gecod how to start the job; exec it. Returns only when gecod did not answer OK
   (0), or the job's program could not be exec'd (1, errno set, *program named). */
static int started_by_gecod(int argc, char **argv, const char **program)
{
    static geco_config_t cfg;
    static char strings[GECO_MAX_PAYLOAD];
    static const char *const names[] = GECO_STARTER_ENVIRON;
    char ebuf[256], nbuf[256];
    line_t err = {ebuf, sizeof ebuf, 0}, note = {nbuf, sizeof nbuf, 0};
    geco_client_outcome_t out;
    geco_starter_t msg = {.pid = (uint32_t)getpid(), .argc = argc - 1, .argv = argv + 1};
    size_t len = 0;

    /* the job's ids from the environment Grid Engine gives a starter */
    if (argc < 2
        || geco_job_of(getenv("JOB_ID"), getenv("SGE_TASK_ID"), &msg.job_id, &msg.task_id) != 0)
        return 0;
    for (int i = 0; i < GECO_STARTER_NENVIRON; i++)
        msg.environ[i] = getenv(names[i]);
    unsetenv("GECO_PRELOAD_CONF");
    if (geco_proto_init() != 0 || geco_config_load(&cfg, 0, &err, &note) != 0)
        return 0;
    if (geco_client_starter(&cfg.session_addr, cfg.timeout_ms, cfg.max_skew_ns, &msg, strings,
                            sizeof strings, &len, &out) != GECO_CLIENT_OK)
        return 0;
    return start_as_told(strings, len, program) == 0;
}

int main(int argc, char **argv)
{
    const char *name = argc > 0 ? strrchr(argv[0], '/') : NULL;
    name = name != NULL ? name + 1 : argc > 0 ? argv[0] : "";
    if (*name == '-') /* the shepherd names a starter_method "-starter", as a login shell */
        name++;
    size_t i = 0;
    while (i < NHOOKS && strcmp(name, HOOKS[i].name) != 0)
        i++;
    if (i == NHOOKS) {
        fprintf(stderr, "geco hook: run it as prolog, epilog or starter (a link or copy "
                        "named so), not as %s\n", name);
        return 99;
    }
    if (HOOKS[i].hook == 0) {
        const char *program = NULL;
        if (started_by_gecod(argc, argv, &program)) {
            /* the Python starter's words for the same failure */
            fprintf(stderr, "geco: cannot start the job: %s: %s\n", program, strerror(errno));
            return 100;
        }
    } else {
        int status = done_by_gecod(argc, argv, HOOKS[i].hook);
        if (status >= 0)
            return status;
    }
    char *python_argv[argc + 2];
    python_argv[0] = (char *)HOOKS[i].python;
    for (int a = 1; a < argc; a++)
        python_argv[a] = argv[a];
    python_argv[argc > 0 ? argc : 1] = NULL;
    execv(HOOKS[i].python, python_argv);
    /* 99 re-queues a job before it ran; after it, the epilog exits 0 (a job is never run
       twice); a starter that cannot start the job fails it as the Python one does (100) */
    fprintf(stderr, "geco %s: cannot run %s: %s\n", name, HOOKS[i].python, strerror(errno));
    return HOOKS[i].hook == GECO_HOOK_PROLOG ? 99 : HOOKS[i].hook == 0 ? 100 : 0;
}
