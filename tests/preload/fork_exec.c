/*
 * fork_exec TARGET - fork, and exec TARGET (execv) in the child.
 *
 * stdout: "parent=<pid>\n" then, after the child ended,
 * "child=<pid> exit=<status>\n" (exit=-1: killed by a signal). The quarantine
 * request must name the child, the process that execs, not the parent.
 */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        dprintf(2, "usage: fork_exec TARGET\n");
        return 2;
    }
    dprintf(1, "parent=%ld\n", (long)getpid());
    pid_t pid = fork();
    if (pid < 0)
        return 3;
    if (pid == 0) {
        char *args[] = {argv[1], NULL};
        execv(argv[1], args);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return 4;
    dprintf(1, "child=%ld exit=%d\n", (long)pid, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
