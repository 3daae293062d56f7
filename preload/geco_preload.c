/*
 * geco_preload.c - the exec() wrapper loaded into sge_execd with LD_PRELOAD.
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
 * put it into its job (session_gate(), below), the second line behind sshd's
 * PAM module. When gecod cannot place it, session_policy decides (fail closed
 * unless `allow`: see unplaced_may_run()).
 *
 * Outcomes of a matching exec (one place: quarantine()):
 *   ack OK                          -> real exec
 *   anything else, policy=refuse    -> return -1, errno EAGAIN ("try again
 *                                      later"), the program does not run
 *   anything else, policy=allow     -> real exec + one "geco:" warning line
 *   library inert (see below)       -> real exec + one "geco:" warning line
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
 *
 * Rules this file keeps (the exec path of a process it does not own must stay as
 * cheap and as safe as a plain exec):
 *   - all setup happens once, in the constructor (pthread_once as the
 *     fallback when an exec comes first): dlsym(RTLD_NEXT) for every real
 *     function, the config, the key, the filter basenames (geco_config.c
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
 * keeps its environment, as rule 4 demands. The original GECO rewrote LD_PRELOAD in the
 * exec'd environment to keep itself there (with a duplicate check that never
 * matched); this one only ever takes itself out.
 *
 * ssh sessions do not inherit it either: OpenSSH builds a session's
 * environment afresh (session.c, do_setup_env(): the user's basics, PAM's,
 * SetEnv, what the client sends through AcceptEnv, ~/.ssh/environment with
 * PermitUserEnvironment), never from sshd's own, and runs ~/.ssh/rc, sshrc and
 * xauth in it too (environ = env before them). LD_PRELOAD reaches a session
 * only where the admin or the user put it: their own choice, as with
 * `qsub -v LD_PRELOAD=...`, and the library is inert there.
 *
 * Not covered in sge_execd (calls that never reach an exported exec symbol):
 * posix_spawn(), system(), popen() (glibc calls its internal execve; wrapped,
 * but asked about for ssh sessions only), execveat(), static binaries and raw
 * syscalls. sge_execd starts the shepherd with exec*(). In sshd: internal-sftp
 * and forwarded ports run no program (sshd's PAM module covers them).
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "geco_client.h"
#include "geco_config.h"
#include "geco_job.h"
#include "geco_log.h"
#include "geco_proto.h"

#define GECO_EXPORT __attribute__((visibility("default")))

/* The errno of a refused exec (policy=refuse): "resource temporarily
   unavailable, try again later" is what a missing quarantine is. */
#define GECO_REFUSE_ERRNO EAGAIN
#define GECO_REFUSE_ERRNO_NAME "EAGAIN"

/* ------------------------------------------------------------------------- */
/* the real functions: one typedef and one pointer each                      */
/* ------------------------------------------------------------------------- */

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);
typedef int (*execvp_fn)(const char *, char *const[]);
typedef int (*execvpe_fn)(const char *, char *const[], char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);
typedef FILE *(*popen_fn)(const char *, const char *);
typedef int (*system_fn)(const char *);

/* execl, execle and execlp have no va_list twin to call through to; like
   glibc, the wrappers build argv on the stack and call execve/execvpe. */
static execve_fn real_execve;
static execv_fn real_execv;
static execvp_fn real_execvp;
static execvpe_fn real_execvpe;
static fexecve_fn real_fexecve;
/* sshd's other ways to run a program (~/.ssh/rc, /etc/ssh/sshrc and xauth go through
   popen): wrapped for ssh sessions only */
static spawn_fn real_posix_spawn;
static spawn_fn real_posix_spawnp;
static popen_fn real_popen;
static system_fn real_system;

/* ------------------------------------------------------------------------- */
/* state: written once under pthread_once, read-only afterwards              */
/* ------------------------------------------------------------------------- */

static geco_config_t cfg; /* geco_config.c fills it */

static struct {
    int active;             /* 1: quarantine matching execs; 0: inert, pass through */
    int sshd;               /* 1: loaded into sshd or sshd-session (ssh sessions, below) */
    char inert_reason[512]; /* why inert: said at a matching exec */
    char self_name[NAME_MAX + 1]; /* this library's file name (find_self_name()) */
} state;

static pthread_once_t geco_once = PTHREAD_ONCE_INIT;

/* The environment of an exec that changes it: an ssh session's (its job's variables
   added, session_env()) or a shepherd's (this library taken out of LD_PRELOAD,
   shepherd_env()). One array for both: they never meet in one process (sshd has no
   exec_filter). Static, as nothing may be allocated between fork and exec; each child
   has its own copy (Grid Engine's execds fork(), never vfork(), before they exec). */
#define EXEC_ENV_SLOTS 2048
static char *exec_env[EXEC_ENV_SLOTS];

/* Set while this thread is inside the wrapper's own work. initial-exec: the
   library is loaded at start-up, and a global-dynamic access may allocate. */
static __thread int geco_busy __attribute__((tls_model("initial-exec")));

/* ------------------------------------------------------------------------- */
/* messages: built on the stack (geco_log.h), written with one write()     */
/* ------------------------------------------------------------------------- */

/* Write one message to the configured destination. severity: 3 error, 4 warning. */
static void emit(int severity, const char *text, size_t len)
{
    char buf[1100];
    line_t l = {buf, sizeof buf, 0};
    ssize_t n;

    if (cfg.log_to == LOG_NONE)
        return;
    if (cfg.log_to == LOG_SYSLOG) {
        /* a datagram to /dev/log (journald or rsyslog) by hand: syslog(3)
           takes a lock, which a child of a multithreaded parent must not */
        /* /dev/log, or journald's own socket on a host without the symlink */
        static const char *const paths[] = {"/dev/log", "/run/systemd/journal/dev-log"};
        put(&l, "<");
        put_u64(&l, (uint64_t)(3 * 8 + severity)); /* facility daemon */
        put(&l, ">geco-preload[");
        put_u64(&l, (uint64_t)getpid());
        put(&l, "]: ");
        for (size_t i = 0; i < len && l.len + 2 < l.cap; i++)
            l.buf[l.len++] = text[i];
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return;
        for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
            struct sockaddr_un to = {.sun_family = AF_UNIX};
            memcpy(to.sun_path, paths[i], strlen(paths[i]) + 1);
            n = sendto(fd, l.buf, l.len, MSG_NOSIGNAL, (struct sockaddr *)&to, sizeof to);
            if (n >= 0 || (errno != ENOENT && errno != ECONNREFUSED))
                break;
        }
        close(fd);
        return;
    }
    put(&l, "geco: ");
    for (size_t i = 0; i < len && l.len + 2 < l.cap; i++)
        l.buf[l.len++] = text[i];
    l.buf[l.len++] = '\n';
    do
        n = write(STDERR_FILENO, l.buf, l.len);
    while (n < 0 && errno == EINTR);
}

/* ------------------------------------------------------------------------- */
/* setup (constructor): config, key, filters                                 */
/* ------------------------------------------------------------------------- */

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
    real_execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
    real_execv = (execv_fn)dlsym(RTLD_NEXT, "execv");
    real_execvp = (execvp_fn)dlsym(RTLD_NEXT, "execvp");
    real_execvpe = (execvpe_fn)dlsym(RTLD_NEXT, "execvpe");
    real_fexecve = (fexecve_fn)dlsym(RTLD_NEXT, "fexecve");
    real_posix_spawn = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
    real_posix_spawnp = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawnp");
    real_popen = (popen_fn)dlsym(RTLD_NEXT, "popen");
    real_system = (system_fn)dlsym(RTLD_NEXT, "system");
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

__attribute__((constructor)) static void geco_constructor(void)
{
    pthread_once(&geco_once, geco_init);
}

/* ------------------------------------------------------------------------- */
/* the decision                                                              */
/* ------------------------------------------------------------------------- */

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

/* The quarantine request failed; `l` says why. Apply the policy. */
static int refuse_or_allow(line_t *l)
{
    if (cfg.policy_allow) {
        put(l, "; starting it without quarantine (policy=allow)");
        emit(4, l->buf, l->len);
        return 0;
    }
    put(l, "; exec refused (policy=refuse, errno " GECO_REFUSE_ERRNO_NAME ")");
    emit(3, l->buf, l->len);
    errno = GECO_REFUSE_ERRNO;
    return -1;
}

static void put_job(line_t *l, const char *name, uint64_t job, uint64_t task, uint32_t pid)
{
    put(l, name);
    put(l, " (pid ");
    put_u64(l, pid);
    if (job != 0) {
        put(l, ", job ");
        put_u64(l, job);
        put(l, ".");
        put_u64(l, task);
    }
    put(l, ")");
}

/* Ask gecod to quarantine this process before it execs `name`. */
static int quarantine(const char *name)
{
    char buf[1024], cwd[PATH_MAX];
    line_t l = {buf, sizeof buf, 0};
    uint32_t pid = (uint32_t)getpid();
    uint64_t job = 0, task = 0;
    int sys_errno = 0, r;
    geco_client_outcome_t out;

    r = geco_job_from_environment("environment", &job, &task, &sys_errno);
    if (r != GECO_ENV_OK) {
        put_job(&l, name, 0, 0, pid);
        put(&l, ": cannot tell its job: ");
        put(&l, getcwd(cwd, sizeof cwd) != NULL ? cwd : ".");
        put(&l, "/environment: ");
        put(&l, geco_env_strerror(r));
        if (sys_errno != 0) {
            put(&l, ": ");
            put_errno(&l, sys_errno);
        }
        return refuse_or_allow(&l);
    }
    r = geco_client_job_started(&cfg.addr, cfg.secret.key, cfg.timeout_ms, cfg.max_skew_ns, job, task,
                                pid, &out);
    if (r == GECO_CLIENT_OK)
        return 0;

    put_job(&l, name, job, task, pid);
    put(&l, ": quarantine by gecod at ");
    put(&l, cfg.socket_text);
    put(&l, " failed: ");
    switch (r) {
    case GECO_CLIENT_E_TIMEOUT:
        put(&l, "no reply within timeout_ms=");
        put_u64(&l, (uint64_t)cfg.timeout_ms);
        put(&l, " (waiting for ");
        put(&l, out.phase);
        put(&l, ")");
        break;
    case GECO_CLIENT_E_FRAME:
        put(&l, "reply rejected: ");
        put(&l, geco_strerror(out.proto_err));
        break;
    case GECO_CLIENT_E_STATUS:
        put(&l, "gecod answered ");
        put(&l, geco_status_name(out.status));
        put(&l, " (its journal says why)");
        break;
    case GECO_CLIENT_E_MISMATCH:
        put(&l, "the ack names job ");
        put_u64(&l, out.ack.job_id);
        put(&l, ".");
        put_u64(&l, out.ack.task_id);
        break;
    default:
        put(&l, geco_client_strresult(r));
        if (out.sys_errno != 0) {
            put(&l, ": ");
            put_errno(&l, out.sys_errno);
        }
        if (r == GECO_CLIENT_E_CONNECT
            && (out.sys_errno == ENOENT || out.sys_errno == ECONNREFUSED))
            put(&l, " (is gecod running?)");
        break;
    }
    if (out.attempts > 1) {
        put(&l, " (after ");
        put_u64(&l, out.attempts);
        put(&l, " attempts)");
    }
    return refuse_or_allow(&l);
}

/* ------------------------------------------------------------------------- */
/* the shepherd's environment: without this library                          */
/* ------------------------------------------------------------------------- */

/*
 * A shepherd and all it starts are the job's, and no job carries this library (see the
 * top of this file): a shepherd's exec goes ahead with this library taken out of
 * LD_PRELOAD. An entry of the variable (split at spaces and colons, as ld.so splits
 * it) is this library when its file name is state.self_name; every other entry stays,
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
static void shepherd_env(const char *name, char *const *envp, char *const **use_envp)
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

/* ------------------------------------------------------------------------- */
/* ssh sessions: the second line behind sshd's PAM module                     */
/* ------------------------------------------------------------------------- */

/*
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
 * unless session_policy=allow: see unplaced_may_run().
 */
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

/* The first bytes of a cgroup path that decide whether it is a job's: a job_cgroups prefix
   (JOB_CGROUP_MAX), '/', <job>.<task> (20 digits each at most), what follows. */
#define JOB_PATH_HEAD (JOB_CGROUP_MAX + 48)

/* Is the cgroup path (its first n bytes; cut: it goes on) one of geco's job cgroups or
   below one: a job_cgroups prefix, then a component that is exactly <digits>.<digits>?
   Returns the length of the path up to that component, 0 when it is not a job's. */
static size_t job_cgroup_path(const char *path, size_t n, int cut)
{
    for (unsigned i = 0; i < cfg.njob_cgroups; i++) {
        size_t at = strlen(cfg.job_cgroups[i]), digits;
        if (n <= at || memcmp(path, cfg.job_cgroups[i], at) != 0 || path[at] != '/')
            continue;
        for (digits = 0, at++; at < n && path[at] >= '0' && path[at] <= '9'; at++)
            digits++;
        if (digits == 0 || digits > 20 || at == n || path[at] != '.')
            continue;
        for (digits = 0, at++; at < n && path[at] >= '0' && path[at] <= '9'; at++)
            digits++;
        if (digits == 0 || digits > 20)
            continue;
        if (at < n ? path[at] == '/' : !cut)
            return at;
    }
    return 0;
}

/*
 * Does the kernel show this process inside one of geco's job cgroups? Any line of
 * /proc/self/cgroup counts ("<id>:<controllers>:<path>", v1 and v2 alike): only root
 * moves a process into a job cgroup (gecod, or PAM's helper deciding while gecod was
 * down), never the process's user. The paths are as sshd's cgroup namespace shows them.
 * Read in chunks, keeping JOB_PATH_HEAD bytes of each path: no malloc, no stdio.
 * Returns 1 with the job's cgroup in where[cap] (cap > JOB_PATH_HEAD), else 0 (not in one,
 * or the file could not be read: then it is not shown to be).
 */
static int in_job_cgroup(char *where, size_t cap)
{
    char chunk[1024], path[JOB_PATH_HEAD];
    size_t pl = 0, len = 0;
    unsigned colons = 0;
    int cut = 0, fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC | O_NOCTTY);

    if (fd < 0)
        return 0;
    while (len == 0) {
        ssize_t got = read(fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        for (ssize_t i = 0; i < got && len == 0; i++) {
            if (chunk[i] == '\n') {
                len = colons == 2 ? job_cgroup_path(path, pl, cut) : 0;
                pl = 0;
                colons = 0;
                cut = 0;
            } else if (colons < 2) {
                colons += chunk[i] == ':';
            } else if (pl < sizeof path) {
                path[pl++] = chunk[i];
            } else {
                cut = 1;
            }
        }
    }
    close(fd);
    if (len == 0 || len >= cap)
        return 0;
    memcpy(where, path, len);
    where[len] = '\0';
    return 1;
}

/* One of [ssh] admins or admin_groups, as rendered into session_admin_uids/gids: the real
   uid, or the real, effective or a supplementary gid. Up to 1024 supplementary groups are
   looked at (getgroups refuses a smaller array than the process's groups: then only the
   real and effective gids count). */
static int session_admin(void)
{
    gid_t groups[1024];
    uid_t uid = getuid();
    int n;

    for (unsigned i = 0; i < cfg.nadmin_uids; i++)
        if (cfg.admin_uids[i] == uid)
            return 1;
    if (cfg.nadmin_gids == 0)
        return 0;
    n = getgroups((int)(sizeof groups / sizeof groups[0]), groups);
    for (unsigned i = 0; i < cfg.nadmin_gids; i++) {
        if (cfg.admin_gids[i] == getgid() || cfg.admin_gids[i] == getegid())
            return 1;
        for (int g = 0; g < n; g++)
            if (cfg.admin_gids[i] == groups[g])
                return 1;
    }
    return 0;
}

/*
 * gecod did not place this session's process. Fail closed: a node whose PAM stack lacks
 * pam_geco would otherwise run the user's shell outside every job whenever the user
 * keeps gecod from answering (fills their own share of its public socket) or it is down.
 * In order:
 *   1. session_policy=allow: it runs where it is (the site chose so);
 *   2. session_policy=in-job: it runs when the kernel shows it in a job's cgroup already
 *      (PAM's helper adopted it; see in_job_cgroup());
 *   3. refuse and in-job: it runs for an admin (session_admin()) and while the bypass
 *      file exists, as PAM's helper lets them in (geco.hooks.pam);
 *   4. else it does not run.
 * Appends the rule that decided to l. Returns 1: go on, 0: refuse.
 */
static int unplaced_may_run(line_t *l)
{
    static const char *const names[] = {"refuse", "in-job", "allow"};
    char where[JOB_PATH_HEAD + 1];
    struct stat st;
    int rc = 1;

    if (cfg.session_policy == SESSION_ALLOW) {
        put(l, "; it runs where it is");
    } else if (cfg.session_policy == SESSION_IN_JOB && in_job_cgroup(where, sizeof where)) {
        put(l, "; it runs where PAM put it, in job cgroup ");
        put(l, where);
    } else if (session_admin()) {
        put(l, "; it runs where it is, an admin's session");
    } else if (stat(cfg.session_bypass, &st) == 0) {
        put(l, "; it runs where it is: the bypass file ");
        put(l, cfg.session_bypass);
        put(l, " exists");
    } else {
        put(l, cfg.session_policy == SESSION_IN_JOB
                   ? "; refused: not in a job's cgroup, not an admin, no bypass file"
                   : "; refused: not an admin, no bypass file");
        rc = 0;
    }
    put(l, " (session_policy=");
    put(l, names[cfg.session_policy]);
    put(l, ")");
    return rc;
}

/* Ask gecod once per process; 0: go on (*use_envp set when the environment changes),
   -1: refused (errno EACCES). */
static int session_gate(char *const *envp, char *const **use_envp)
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

/*
 * Every wrapped exec (and, for ssh sessions, spawn) asks this first. Returns 0:
 * call the real function, with *use_envp when it was changed (an ssh session's
 * job variables, a shepherd's LD_PRELOAD); -1: do not (errno is set). path
 * NULL: not an exec (a spawn, popen, system), which only ssh sessions are asked
 * about. The caller restores its saved errno before a call-through, so whatever
 * happens here never shows.
 */
static int geco_gate(const char *path, char *const *envp, char *const **use_envp)
{
    int rc;
    /* a nested exec from inside our own work, or from a libc/preload below us
       that calls an exported exec from its own: pass straight through */
    if (geco_busy)
        return 0;
    pthread_once(&geco_once, geco_init);
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

/* Real function missing (a libc without it): fail like a kernel without the call. */
static int missing(void)
{
    errno = ENOSYS;
    return -1;
}

/* ------------------------------------------------------------------------- */
/* the wrappers                                                              */
/* ------------------------------------------------------------------------- */

GECO_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    int saved = errno;
    char *const *env = envp;
    if (geco_gate(path, envp, &env) != 0)
        return -1;
    if (real_execve == NULL)
        return missing();
    errno = saved;
    return real_execve(path, argv, env);
}

GECO_EXPORT int execv(const char *path, char *const argv[])
{
    int saved = errno;
    char *const *env = NULL;
    if (geco_gate(path, environ, &env) != 0)
        return -1;
    if (env != NULL && real_execve != NULL) {
        errno = saved;
        return real_execve(path, argv, env);
    }
    if (real_execv == NULL)
        return missing();
    errno = saved;
    return real_execv(path, argv);
}

GECO_EXPORT int execvp(const char *file, char *const argv[])
{
    int saved = errno;
    char *const *env = NULL;
    /* the basename of the name searched in PATH is the program's basename */
    if (geco_gate(file, environ, &env) != 0)
        return -1;
    if (env != NULL && real_execvpe != NULL) {
        errno = saved;
        return real_execvpe(file, argv, env);
    }
    if (real_execvp == NULL)
        return missing();
    errno = saved;
    return real_execvp(file, argv);
}

GECO_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    int saved = errno;
    char *const *env = envp;
    if (geco_gate(file, envp, &env) != 0)
        return -1;
    if (real_execvpe == NULL)
        return missing();
    errno = saved;
    return real_execvpe(file, argv, env);
}

GECO_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    int saved = errno;
    char proc[32] = "/proc/self/fd/", target[PATH_MAX];
    line_t l = {proc, sizeof proc, 14};
    const char *path = NULL;

    if (fd >= 0) {
        put_u64(&l, (uint64_t)fd);
        proc[l.len] = '\0';
        ssize_t n = readlink(proc, target, sizeof target - 1);
        if (n > 0) {
            /* an unlinked binary still is the program it was */
            static const char deleted[] = " (deleted)";
            if ((size_t)n > sizeof deleted - 1
                && memcmp(target + n - (sizeof deleted - 1), deleted, sizeof deleted - 1) == 0)
                n -= (ssize_t)(sizeof deleted - 1);
            target[n] = '\0';
            path = target;
        }
    }
    char *const *env = envp;
    if (geco_gate(path, envp, &env) != 0)
        return -1;
    if (real_fexecve == NULL)
        return missing();
    errno = saved;
    return real_fexecve(fd, argv, env);
}

/* Count execl's arguments (after `arg`, up to the NULL); -1 when more than
   fit an argv, like glibc (E2BIG). */
static long count_args(const char *arg, va_list ap)
{
    long n = 1;
    if (arg == NULL)
        return 0;
    while (va_arg(ap, const char *) != NULL)
        if (++n == INT_MAX)
            return -1;
    return n;
}

/* Fill argv[0..n] from arg and the va_list (argv[n] = NULL). */
static void fill_args(char **argv, long n, const char *arg, va_list ap)
{
    if (n > 0)
        argv[0] = (char *)arg;
    for (long i = 1; i < n; i++)
        argv[i] = va_arg(ap, char *);
    argv[n] = NULL;
}

/*
 * execl, execle and execlp: collect `arg` and the arguments after it (up to
 * the NULL; for execle, the envp after that) into an argv on the stack -- no
 * malloc -- then gate and call *real: real_execve, or real_execvpe for execlp
 * (read only after geco_gate(), which resolves them on a first exec). One
 * function does all of it because the array must live in the frame that
 * makes the call. More arguments than fit an argv: -1 with E2BIG before
 * anything else, like glibc. The caller's errno is restored before the
 * call-through, as in every wrapper.
 */
static int exec_list(execve_fn *real, int with_envp, const char *path, const char *arg,
                     va_list ap)
{
    int saved = errno;
    va_list count;
    va_copy(count, ap);
    long n = count_args(arg, count);
    va_end(count);
    if (n < 0) {
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    fill_args(argv, n, arg, ap);
    char *const *envp = environ;
    if (with_envp) {
        if (n > 0)
            (void)va_arg(ap, char *); /* the NULL that ends the arguments */
        envp = va_arg(ap, char *const *);
    }
    if (geco_gate(path, envp, &envp) != 0)
        return -1;
    if (*real == NULL)
        return missing();
    errno = saved;
    return (*real)(path, argv, envp);
}

GECO_EXPORT int execl(const char *path, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    int rc = exec_list(&real_execve, 0, path, arg, ap);
    va_end(ap);
    return rc;
}

GECO_EXPORT int execle(const char *path, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    int rc = exec_list(&real_execve, 1, path, arg, ap);
    va_end(ap);
    return rc;
}

GECO_EXPORT int execlp(const char *file, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    /* glibc's execlp is execvpe(file, argv, environ): same PATH search and
       ENOEXEC fallback to /bin/sh */
    int rc = exec_list(&real_execvpe, 0, file, arg, ap);
    va_end(ap);
    return rc;
}

/* posix_spawn, posix_spawnp, popen and system: asked about for ssh sessions only (in
   sge_execd they pass through, see the top of this file) */

/* posix_spawn and posix_spawnp: gate, then *real (read only after geco_gate(), which
   resolves it on a first call) */
static int spawn_through(spawn_fn *real, pid_t *pid, const char *path,
                         const posix_spawn_file_actions_t *actions,
                         const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    int saved = errno;
    char *const *env = envp;
    if (geco_gate(NULL, envp, &env) != 0)
        return EACCES;
    if (*real == NULL)
        return ENOSYS;
    errno = saved;
    return (*real)(pid, path, actions, attr, argv, env);
}

GECO_EXPORT int posix_spawn(pid_t *pid, const char *path,
                            const posix_spawn_file_actions_t *actions,
                            const posix_spawnattr_t *attr, char *const argv[],
                            char *const envp[])
{
    return spawn_through(&real_posix_spawn, pid, path, actions, attr, argv, envp);
}

GECO_EXPORT int posix_spawnp(pid_t *pid, const char *file,
                             const posix_spawn_file_actions_t *actions,
                             const posix_spawnattr_t *attr, char *const argv[],
                             char *const envp[])
{
    return spawn_through(&real_posix_spawnp, pid, file, actions, attr, argv, envp);
}

GECO_EXPORT FILE *popen(const char *command, const char *mode)
{
    int saved = errno;
    if (geco_gate(NULL, environ, NULL) != 0)
        return NULL;
    if (real_popen == NULL) {
        errno = ENOSYS;
        return NULL;
    }
    errno = saved;
    return real_popen(command, mode);
}

GECO_EXPORT int system(const char *command)
{
    int saved = errno;
    /* system(NULL) asks whether a shell exists: nothing runs */
    if (command != NULL && geco_gate(NULL, environ, NULL) != 0)
        return -1;
    if (real_system == NULL)
        return missing();
    errno = saved;
    return real_system(command);
}
