/*
 * shepherd_job [job] - a fake sge_shepherd, and the job it starts.
 *
 * Reports what this process carries: its environment and the files it has mapped.
 * As the shepherd (no argument) it then forks a child that execs this program again as
 * the job, with the shepherd's own environment (Open Cluster Scheduler's shepherd
 * passes its environment on to the job: INHERIT_ENV), and waits for it.
 *
 * stdout, one line each, <role> "shepherd" or "job":
 *   "<role> pid <pid>", "<role> env <string>" for each environment string,
 *   "<role> maps <path>" for each file mapped (/proc/self/maps, each path once).
 * Exit: 0 when the job exited 0, else 1 (3: this process could not report).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int report(const char *role)
{
    char *line = NULL, *seen[512];
    size_t cap = 0, nseen = 0;
    FILE *maps = fopen("/proc/self/maps", "r");

    if (maps == NULL)
        return 3;
    printf("%s pid %ld\n", role, (long)getpid());
    for (char **e = environ; *e != NULL; e++)
        printf("%s env %s\n", role, *e);
    while (getline(&line, &cap, maps) > 0) {
        char *path = strchr(line, '/');
        int known = 0;
        if (path == NULL)
            continue;
        path[strcspn(path, "\n")] = '\0';
        for (size_t i = 0; i < nseen && !known; i++)
            known = strcmp(seen[i], path) == 0;
        if (known || nseen == sizeof seen / sizeof seen[0])
            continue;
        seen[nseen++] = strdup(path);
        printf("%s maps %s\n", role, path);
    }
    fclose(maps);
    return fflush(stdout) == 0 ? 0 : 3;
}

int main(int argc, char **argv)
{
    int job = argc > 1 && strcmp(argv[1], "job") == 0, status;
    if (report(job ? "job" : "shepherd") != 0)
        return 3;
    if (job)
        return 0;
    pid_t pid = fork();
    if (pid < 0)
        return 3;
    if (pid == 0) {
        char *args[] = {"job", "job", NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    if (waitpid(pid, &status, 0) != pid)
        return 3;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
