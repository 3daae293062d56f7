/*
 * exec_variant VARIANT TARGET PATHDIR [ptrs]
 *
 * Calls one exec function -- execve, execv, execvp, execvpe, execl, execle,
 * execlp, fexecve, or fexecve-deleted (TARGET unlinked between its open() and
 * the fexecve()) -- on TARGET ("NULL": a NULL path, execve/execv only) with
 * a fixed argv and environment full of odd entries (an empty string, one
 * without '=', one with a newline, PATH=PATHDIR). Variants without an envp
 * argument get the same environment through `environ`.
 *
 * stdout: "pid=<pid>\n" before the call; when the call returns,
 * "rc=<value> errno=<NAME>\n" and exit 0. errno is set to EDOM before the
 * call, so a wrapper that leaked its own errno into the real call (seen by
 * tests/preload/spy_exec.c) or into the failure would show.
 * With "ptrs": also "ptrs argv=<p> envp=<p>\n" (the arrays handed over).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv)
{
    if (argc < 4) {
        dprintf(2, "usage: exec_variant VARIANT TARGET PATHDIR [ptrs]\n");
        return 2;
    }
    const char *variant = argv[1];
    /* volatile: the compiler must not see a NULL flowing into a nonnull parameter */
    const char *volatile target = strcmp(argv[2], "NULL") == 0 ? NULL : argv[2];
    char pathvar[4096];
    snprintf(pathvar, sizeof pathvar, "PATH=%s", argv[3]);
    static char *args[] = {"argv0-of-target", "", "two words", "tab\there", "no=split", "last",
                           NULL};
    char *envs[] = {"A=1", "NOEQUALS", "", "B==x", "C=multi\nline", pathvar, "Z=", NULL};
    int rc = 0;

    dprintf(1, "pid=%ld\n", (long)getpid());
    if (argc > 4 && strcmp(argv[4], "ptrs") == 0)
        dprintf(1, "ptrs argv=%p envp=%p\n", (void *)args, (void *)envs);

    environ = envs;
    errno = EDOM;
    if (strcmp(variant, "execve") == 0) {
        rc = execve(target, args, envs);
    } else if (strcmp(variant, "execv") == 0) {
        rc = execv(target, args);
    } else if (strcmp(variant, "execvp") == 0) {
        rc = execvp(target, args);
    } else if (strcmp(variant, "execvpe") == 0) {
        rc = execvpe(target, args, envs);
    } else if (strcmp(variant, "execl") == 0) {
        rc = execl(target, args[0], args[1], args[2], args[3], args[4], args[5], (char *)NULL);
    } else if (strcmp(variant, "execle") == 0) {
        rc = execle(target, args[0], args[1], args[2], args[3], args[4], args[5], (char *)NULL,
                    envs);
    } else if (strcmp(variant, "execlp") == 0) {
        rc = execlp(target, args[0], args[1], args[2], args[3], args[4], args[5], (char *)NULL);
    } else if (strncmp(variant, "fexecve", 7) == 0) {
        int fd = open(target, O_RDONLY | O_CLOEXEC);
        if (strcmp(variant, "fexecve-deleted") == 0 && unlink(target) != 0)
            return 3;
        errno = EDOM;
        rc = fexecve(fd, args, envs);
    } else {
        dprintf(2, "unknown variant %s\n", variant);
        return 2;
    }
    int err = errno;
    const char *name = strerrorname_np(err);
    dprintf(1, "rc=%d errno=%s\n", rc, name != NULL ? name : "?");
    return 0;
}
