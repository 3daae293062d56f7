/*
 * execd_exec VARIANT SHEPHERD [soge]
 *
 * Starts SHEPHERD as a Grid Engine execd does, with one exec function (execve, execv,
 * execvp, execvpe, execl, execle, execlp, fexecve) and the argv {"sge_shepherd-42",
 * "-bg"}. The environment is its own, LD_PRELOAD included, as Open Cluster Scheduler
 * 9.1's execd passes it (execlp: `environ`); with "soge", the same without its
 * LD_PRELOAD strings, as Son of Grid Engine 8.1.9's shepherd gets it. Variants without
 * an envp argument get it through `environ`.
 *
 * stdout: "execd pid <pid>\n" before the call; "rc=<value> errno=<NAME>\n" and exit 0
 * when the call returns.
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
    if (argc < 3 || argc > 4 || (argc == 4 && strcmp(argv[3], "soge") != 0)) {
        dprintf(2, "usage: execd_exec VARIANT SHEPHERD [soge]\n");
        return 2;
    }
    const char *variant = argv[1], *shepherd = argv[2];
    char *args[] = {"sge_shepherd-42", "-bg", NULL};
    size_t n = 0, kept = 0;
    while (environ[n] != NULL)
        n++;
    char *soge[n + 1];
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
            soge[kept++] = environ[i];
    soge[kept] = NULL;
    char **envp = argc == 4 ? soge : environ;
    int rc = 0;

    dprintf(1, "execd pid %ld\n", (long)getpid());
    environ = envp;
    if (strcmp(variant, "execve") == 0) {
        rc = execve(shepherd, args, envp);
    } else if (strcmp(variant, "execv") == 0) {
        rc = execv(shepherd, args);
    } else if (strcmp(variant, "execvp") == 0) {
        rc = execvp(shepherd, args);
    } else if (strcmp(variant, "execvpe") == 0) {
        rc = execvpe(shepherd, args, envp);
    } else if (strcmp(variant, "execl") == 0) {
        rc = execl(shepherd, args[0], args[1], (char *)NULL);
    } else if (strcmp(variant, "execle") == 0) {
        rc = execle(shepherd, args[0], args[1], (char *)NULL, envp);
    } else if (strcmp(variant, "execlp") == 0) {
        rc = execlp(shepherd, args[0], args[1], (char *)NULL);
    } else if (strcmp(variant, "fexecve") == 0) {
        rc = fexecve(open(shepherd, O_RDONLY | O_CLOEXEC), args, envp);
    } else {
        dprintf(2, "unknown variant %s\n", variant);
        return 2;
    }
    const char *name = strerrorname_np(errno);
    dprintf(1, "rc=%d errno=%s\n", rc, name != NULL ? name : "?");
    return 0;
}
