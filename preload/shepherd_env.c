/*
 * shepherd_env.c - a shepherd's environment: without this library.
 *
 * No job carries this library, whichever Grid Engine starts it. What sge_execd
 * starts inherits its environment, LD_PRELOAD included: load sensors, mailers
 * (where the library stays, inert), and the shepherd. Son of Grid Engine 8.1.9's
 * execd hands its shepherd an environment without LD_PRELOAD (seen in the
 * shepherd's /proc/<pid>/environ); Open Cluster Scheduler 9.1's execd execlp()s
 * it with its own, and that shepherd passes its environment on to the job
 * (INHERIT_ENV, true by default): every process of the job would map this
 * library and see the variable. So a shepherd's exec, however it goes ahead
 * (acked, policy=allow, inert), gets this library taken out of LD_PRELOAD:
 * other preloads stay, the variable goes when nothing is left, and an
 * environment that does not list the library (Son of Grid Engine's) passes on
 * as the caller's own array (shepherd_env()). Every other exec in sge_execd
 * keeps its environment, as rule 4 demands. The original GECO rewrote LD_PRELOAD in
 * the exec'd environment to keep itself there (with a duplicate check that never
 * matched); this one only ever takes itself out.
 */
#define _GNU_SOURCE

#include <string.h>
#include <unistd.h>

#include "preload.h"

/*
 * An entry of LD_PRELOAD (split at spaces and colons, as ld.so splits it) is this
 * library when its file name is state.self_name; every other entry stays,
 * in order, each after the separator that came before it, and the variable goes when
 * nothing is left. Every LD_PRELOAD= string of the environment is rewritten (ld.so
 * reads the last one, getenv() the first). An environment that does not list this
 * library is passed on as it is, the caller's own array.
 *
 * Built in static storage (exec_env, preload_text): nothing may be allocated between
 * fork and exec. When it does not fit (EXEC_ENV_SLOTS - 1 variables or more, or the
 * rewritten values over PRELOAD_TEXT_MAX bytes), the shepherd gets its environment as
 * it is and a warning says so: the library is inert in a job (it reads nothing outside
 * sge_execd and sshd), so the job still runs as it should; refusing the exec instead
 * would only make Grid Engine try again with the same environment, forever.
 */
#define PRELOAD_TEXT_MAX 8192
#define PRELOAD_SEPARATORS " :"
static const char preload_var[] = "LD_PRELOAD=";
static char preload_text[PRELOAD_TEXT_MAX];

static int is_preload(const char *entry)
{
    return strncmp(entry, preload_var, sizeof preload_var - 1) == 0;
}

/* Is the LD_PRELOAD entry entry[0..len) this library, by its file name? */
static int names_self(const char *entry, size_t len)
{
    size_t start = len, n = strlen(state.self_name);
    while (start > 0 && entry[start - 1] != '/')
        start--;
    return n > 0 && len - start == n && memcmp(entry + start, state.self_name, n) == 0;
}

/* Does the LD_PRELOAD value list this library? */
static int lists_self(const char *value)
{
    while (*value != '\0') {
        value += strspn(value, PRELOAD_SEPARATORS);
        size_t len = strcspn(value, PRELOAD_SEPARATORS);
        if (len > 0 && names_self(value, len))
            return 1;
        value += len;
    }
    return 0;
}

/* Write "LD_PRELOAD=<entry's entries but this library>" NUL-terminated to
   preload_text + *used and advance *used. Returns 1: written, 0: nothing is left (no
   variable), -1: it does not fit. */
static int rewrite_preload(const char *entry, size_t *used)
{
    const char *value = entry + sizeof preload_var - 1;
    size_t at = *used + sizeof preload_var - 1, kept = 0;

    if (at >= sizeof preload_text)
        return -1;
    memcpy(preload_text + *used, preload_var, sizeof preload_var - 1);
    while (*value != '\0') {
        value += strspn(value, PRELOAD_SEPARATORS);
        size_t len = strcspn(value, PRELOAD_SEPARATORS);
        if (len > 0 && !names_self(value, len)) {
            size_t sep = kept > 0; /* the separator before it: kept > 0, so one exists */
            if (at + sep + len >= sizeof preload_text)
                return -1;
            if (sep)
                preload_text[at++] = value[-1];
            memcpy(preload_text + at, value, len);
            at += len;
            kept++;
        }
        value += len;
    }
    if (kept == 0)
        return 0;
    preload_text[at++] = '\0';
    *used = at;
    return 1;
}

/* The environment a shepherd is exec'd with: *use_envp set to envp without this library
   in LD_PRELOAD when envp lists it, else left alone (see above). */
void shepherd_env(const char *name, char *const *envp, char *const **use_envp)
{
    size_t n = 0, used = 0;
    int listed = 0, too_long = 0, too_many = 0;

    for (char *const *e = envp; e != NULL && *e != NULL && !listed; e++)
        listed = is_preload(*e) && lists_self(*e + sizeof preload_var - 1);
    if (!listed)
        return;
    for (char *const *e = envp; *e != NULL && !too_long && !too_many; e++) {
        char *entry = *e;
        if (is_preload(entry)) {
            size_t at = used;
            int r = rewrite_preload(entry, &used);
            too_long = r < 0;
            if (r <= 0)
                continue;
            entry = preload_text + at;
        }
        too_many = n + 1 >= EXEC_ENV_SLOTS;
        if (!too_many)
            exec_env[n++] = entry;
    }
    if (!too_long && !too_many) {
        exec_env[n] = NULL;
        *use_envp = exec_env;
        return;
    }
    char buf[300];
    line_t l = {buf, sizeof buf, 0};
    put_job(&l, name, 0, 0, (uint32_t)getpid());
    put(&l, ": starts with LD_PRELOAD as it is, geco's library included "
            "(inert in a job): ");
    if (too_long) {
        put(&l, "its LD_PRELOAD rewritten would take more than ");
        put_u64(&l, PRELOAD_TEXT_MAX - 1);
        put(&l, " bytes");
    } else {
        put(&l, "its environment has more than ");
        put_u64(&l, EXEC_ENV_SLOTS - 1);
        put(&l, " variables");
    }
    emit(4, l.buf, l.len);
}
