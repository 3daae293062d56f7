/* Job payload for the quarantine tests: fork N children at once, as fast as the
 * kernel allows, then report. Each child sleeps, so a test can walk /proc while
 * they live; the parent waits for all of them.
 *
 *   forker N SECONDS
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static double now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec / 1e6;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 500;
    unsigned seconds = argc > 2 ? (unsigned)atoi(argv[2]) : 10;
    double start = now();
    int forked = 0;

    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            sleep(seconds);
            _exit(0);
        }
        if (pid > 0)
            forked++;
    }
    printf("forked %d children in %.1f ms, parent %d\n", forked, (now() - start) * 1000,
           (int)getpid());
    fflush(stdout);
    while (wait(NULL) > 0)
        ;
    return forked == n ? 0 : 1;
}
