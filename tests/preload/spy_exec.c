/*
 * spy_exec.so - a second preload, loaded AFTER libgeco_preload.so, so that
 * the "real" functions the wrapper calls through to are these. Each reports
 * on stderr what it received -- the caller's errno at entry and the argv/envp
 * pointers -- then calls the libc function with errno untouched.
 *   "spy <function> errno=<NAME> argv=<p> envp=<p>\n"  (envp=- for execv/execvp)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static void report(const char *fn, int err, const void *argv, const void *envp)
{
    const char *name = strerrorname_np(err);
    if (envp != NULL)
        dprintf(2, "spy %s errno=%s argv=%p envp=%p\n", fn, name ? name : "?", argv, envp);
    else
        dprintf(2, "spy %s errno=%s argv=%p envp=-\n", fn, name ? name : "?", argv);
}

int execve(const char *path, char *const argv[], char *const envp[])
{
    int err = errno;
    int (*real)(const char *, char *const[], char *const[]) = dlsym(RTLD_NEXT, "execve");
    report("execve", err, argv, envp);
    errno = err;
    return real(path, argv, envp);
}

int execv(const char *path, char *const argv[])
{
    int err = errno;
    int (*real)(const char *, char *const[]) = dlsym(RTLD_NEXT, "execv");
    report("execv", err, argv, NULL);
    errno = err;
    return real(path, argv);
}

int execvp(const char *file, char *const argv[])
{
    int err = errno;
    int (*real)(const char *, char *const[]) = dlsym(RTLD_NEXT, "execvp");
    report("execvp", err, argv, NULL);
    errno = err;
    return real(file, argv);
}

int execvpe(const char *file, char *const argv[], char *const envp[])
{
    int err = errno;
    int (*real)(const char *, char *const[], char *const[]) = dlsym(RTLD_NEXT, "execvpe");
    report("execvpe", err, argv, envp);
    errno = err;
    return real(file, argv, envp);
}

int fexecve(int fd, char *const argv[], char *const envp[])
{
    int err = errno;
    int (*real)(int, char *const[], char *const[]) = dlsym(RTLD_NEXT, "fexecve");
    report("fexecve", err, argv, envp);
    errno = err;
    return real(fd, argv, envp);
}
