/*
 * wrappers.c - the exported exec (and spawn, popen, system) wrappers: each saves errno,
 * asks geco_gate() (geco_preload.c), and calls the real function with the caller's
 * errno back, on the same argv and on envp or the environment the gate gave.
 *
 * Not covered in sge_execd (calls that never reach an exported exec symbol):
 * posix_spawn(), system(), popen() (glibc calls its internal execve; wrapped,
 * but asked about for ssh sessions only), execveat(), static binaries and raw
 * syscalls. sge_execd starts the shepherd with exec*(). In sshd: internal-sftp
 * and forwarded ports run no program (sshd's PAM module covers them).
 */
#define _GNU_SOURCE

#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "preload.h"

#define GECO_EXPORT __attribute__((visibility("default")))

/* execl, execle and execlp have no va_list twin to call through to; like
   glibc, the wrappers build argv on the stack and call execve/execvpe. */

/* Real function missing (a libc without it): fail like a kernel without the call. */
static int missing(void)
{
    errno = ENOSYS;
    return -1;
}

/* execve and execvpe (and execl, execle, execlp): gate on envp, then *real (read only
   after geco_gate(), which resolves it on a first exec) on the environment the gate gave */
static int exec_with_env(execve_fn *real, const char *path, char *const argv[],
                         char *const envp[])
{
    int saved = errno;
    char *const *env = envp;
    if (geco_gate(path, envp, &env) != 0)
        return -1;
    if (*real == NULL)
        return missing();
    errno = saved;
    return (*real)(path, argv, env);
}

/* execv and execvp: gate on the environment; when the gate gave another one, call
   *with_env (execve, execvpe) on it, else *plain on the caller's */
static int exec_environ(execve_fn *with_env, execv_fn *plain, const char *path,
                        char *const argv[])
{
    int saved = errno;
    char *const *env = NULL;
    if (geco_gate(path, environ, &env) != 0)
        return -1;
    if (env != NULL && *with_env != NULL) {
        errno = saved;
        return (*with_env)(path, argv, env);
    }
    if (*plain == NULL)
        return missing();
    errno = saved;
    return (*plain)(path, argv);
}

GECO_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    return exec_with_env(&real_execve, path, argv, envp);
}

GECO_EXPORT int execv(const char *path, char *const argv[])
{
    return exec_environ(&real_execve, &real_execv, path, argv);
}

GECO_EXPORT int execvp(const char *file, char *const argv[])
{
    /* the basename of the name searched in PATH is the program's basename */
    return exec_environ(&real_execvpe, &real_execvp, file, argv);
}

GECO_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    return exec_with_env(&real_execvpe, file, argv, envp);
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
 * malloc -- then exec_with_env() with *real: real_execve, or real_execvpe for
 * execlp. One function builds it because the array must live in a frame that
 * lasts through the call. More arguments than fit an argv: -1 with E2BIG
 * before anything else, like glibc. Nothing here sets errno before
 * exec_with_env() saves it: the caller's errno is restored before the
 * call-through, as in every wrapper.
 */
static int exec_list(execve_fn *real, int with_envp, const char *path, const char *arg,
                     va_list ap)
{
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
    return exec_with_env(real, path, argv, envp);
}

/* the body of a variadic wrapper: its va_list lives in its own frame */
#define EXEC_LIST(real, with_envp, path, arg)                              \
    do {                                                                   \
        va_list ap;                                                        \
        va_start(ap, arg);                                                 \
        int rc = exec_list(real, with_envp, path, arg, ap);                \
        va_end(ap);                                                        \
        return rc;                                                         \
    } while (0)

GECO_EXPORT int execl(const char *path, const char *arg, ...)
{
    EXEC_LIST(&real_execve, 0, path, arg);
}

GECO_EXPORT int execle(const char *path, const char *arg, ...)
{
    EXEC_LIST(&real_execve, 1, path, arg);
}

GECO_EXPORT int execlp(const char *file, const char *arg, ...)
{
    /* glibc's execlp is execvpe(file, argv, environ): same PATH search and
       ENOEXEC fallback to /bin/sh */
    EXEC_LIST(&real_execvpe, 0, file, arg);
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
