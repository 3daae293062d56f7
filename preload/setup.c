/*
 * setup.c - the constructor: which program loaded the library, its config and key.
 *
 * Where it works. Only in the programs it is meant for, named by the kernel
 * (/proc/self/exe, not argv[0], which the parent chooses): sge_execd, sshd,
 * and sshd-session (the per-session program of OpenSSH >= 9.8). In any other
 * program -- everything that merely inherits LD_PRELOAD from sge_execd or
 * sshd: load sensors, mailers, hooks, a job that got the variable somehow --
 * it reads no config and no key and stays silent; every exec passes through
 * as if it were not there. (A user may call a binary of theirs sge_execd:
 * it then reads the config and fails to read the root-only key, as before.)
 *
 * The library is inert -- every exec passes through -- when its config
 * (/etc/geco/preload.conf, rendered by `geco preload-config`) is missing or
 * broken, or the key file cannot be read (e.g. in a process that does not run
 * as root). It says so once at load, to the configured log destination
 * (missing file: silently; it says so at the first matching exec instead),
 * and never breaks the host program.
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "geco_proto.h"
#include "preload.h"

/* written once under pthread_once, read-only afterwards (preload.h) */
geco_config_t cfg;
struct preload_state state;

static pthread_once_t geco_once = PTHREAD_ONCE_INIT;

/* Load config and key (geco_config.c); when they are unusable, stay inert and
   say so once, where the config's log= line (if it got that far) says. */
static void load_config(int want_key)
{
    char errbuf[600], notebuf[300];
    line_t err = {errbuf, sizeof errbuf, 0}, note = {notebuf, sizeof notebuf, 0};
    int r = geco_config_load(&cfg, want_key, &err, &note);

    if (note.len > 0)
        emit(4, note.buf, note.len);
    if (r == 0) {
        state.active = 1;
        return;
    }
    state.active = 0;
    memcpy(state.inert_reason, err.buf, err.len < sizeof state.inert_reason
                                            ? err.len : sizeof state.inert_reason - 1);
    if (r < 0) {
        char buf[700];
        line_t l = {buf, sizeof buf, 0};
        put(&l, "preload inactive, every exec passes through unchecked: ");
        put(&l, state.inert_reason);
        emit(3, l.buf, l.len);
    }
}

/* The programs the wrapper works in (see the top of this file). */
static const char *const host_programs[] = {"sge_execd", "sshd", "sshd-session"};

/* Is this process one of host_programs? 1 sge_execd, 2 sshd or sshd-session, 0 no, -1
   cannot tell (err says why).
   The kernel's name of the running binary: argv[0] and comm are the parent's or the
   process's own choice. A binary replaced on disk while running (a package upgrade)
   reads "<path> (deleted)" and still counts. */
static int host_program(line_t *err)
{
    static const char deleted[] = " (deleted)";
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        put(err, "cannot tell which program loaded it: /proc/self/exe: ");
        put_errno(err, n < 0 ? errno : EINVAL);
        return -1;
    }
    if ((size_t)n > sizeof deleted - 1
        && memcmp(exe + n - (sizeof deleted - 1), deleted, sizeof deleted - 1) == 0)
        n -= (ssize_t)(sizeof deleted - 1);
    exe[n] = '\0';
    const char *slash = strrchr(exe, '/');
    const char *name = slash != NULL ? slash + 1 : exe;
    for (size_t i = 0; i < sizeof host_programs / sizeof host_programs[0]; i++)
        if (strcmp(name, host_programs[i]) == 0)
            return i == 0 ? 1 : 2;
    return 0;
}

/* This library's file name, as the dynamic linker loaded it (the LD_PRELOAD entry, or
   the file it found for a bare name): what shepherd_env() takes out of LD_PRELOAD. Read
   here: dladdr() takes the loader's lock, which a child forked while another thread
   held it would wait for forever. Empty when unknown (nothing is taken out then). */
static void find_self_name(void)
{
    Dl_info info;
    if (dladdr((void *)&state, &info) == 0 || info.dli_fname == NULL)
        return;
    const char *slash = strrchr(info.dli_fname, '/');
    const char *name = slash != NULL ? slash + 1 : info.dli_fname;
    size_t n = strlen(name);
    if (n < sizeof state.self_name)
        memcpy(state.self_name, name, n + 1);
}

static void geco_init(void)
{
    int saved = errno;
    char whybuf[128];
    line_t why = {whybuf, sizeof whybuf, 0};
    resolve_real();
    int host = host_program(&why);
    if (host == 1 || host == -1)
        find_self_name(); /* where a shepherd may be exec'd */
    switch (host) {
    case 0:
        /* not sge_execd or sshd: no filters, so every exec takes the fast path out,
           silently; no config or key is read into a process that only inherited us */
        break;
    case -1:
        /* cannot tell: no key either, but a shepherd exec says why it is unchecked */
        memcpy(state.inert_reason, why.buf,
               why.len < sizeof state.inert_reason ? why.len : sizeof state.inert_reason - 1);
        cfg.log_to = LOG_STDERR;
        cfg.nfilters = 1;
        memcpy(cfg.filters[0], DEFAULT_FILTER, sizeof DEFAULT_FILTER);
        break;
    default:
        if (geco_proto_init() != 0) {
            static const char msg[] = "libsodium failed to initialise";
            memcpy(state.inert_reason, msg, sizeof msg);
            cfg.log_to = LOG_STDERR;
            emit(3, msg, sizeof msg - 1);
        } else {
            /* sshd: its sessions ask as their user, peer-credentialed; no key is read
               into a program whose processes become the user's */
            state.sshd = host == 2;
            load_config(!state.sshd);
            if (state.sshd)
                cfg.nfilters = 0; /* sshd starts no shepherds */
        }
        break;
    }
    errno = saved;
}

void preload_setup(void)
{
    pthread_once(&geco_once, geco_init);
}

__attribute__((constructor)) static void geco_constructor(void)
{
    preload_setup();
}
