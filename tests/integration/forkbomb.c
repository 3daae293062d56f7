/* Job payload for the fork-bomb test: a fork bomb that ends by itself.
 *
 *   forkbomb SECONDS CAP [STOPFILE]
 *
 * Every process forks as fast as the kernel lets it, and every child does the same,
 * until SECONDS have passed or STOPFILE exists (the test has seen what it looks for);
 * then each one waits for its children and exits, so the job ends on its own. A refused fork (EAGAIN: the job's task limit) is counted and
 * tried again after 1 ms. A counter shared by all of them stops forking at CAP
 * processes, so a node without a task limit is not taken down by its own test: the
 * report then shows no refused fork, and the test fails instead.
 *
 * The first process prints, when all of them have ended:
 *   forkbomb: peak P processes, R forks refused (EAGAIN), E other fork errors
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
    atomic_long live;
    atomic_long peak;
    atomic_long refused;
    atomic_long other;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: forkbomb SECONDS CAP [STOPFILE]\n");
        return 2;
    }
    double deadline = now() + atof(argv[1]);
    long cap = atol(argv[2]);
    const char *stop = argc == 4 ? argv[3] : NULL;
    struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("forkbomb: mmap");
        return 1;
    }
    atomic_store(&s->live, 1);
    atomic_store(&s->peak, 1);
    pid_t first = getpid();

    while (now() < deadline && !(stop && access(stop, F_OK) == 0)) {
        if (atomic_load(&s->live) >= cap) {
            usleep(10000);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0)
            continue; /* the child bombs on, from here */
        if (pid > 0) {
            long n = atomic_fetch_add(&s->live, 1) + 1;
            long peak = atomic_load(&s->peak);
            while (n > peak && !atomic_compare_exchange_weak(&s->peak, &peak, n))
                ;
            continue;
        }
        atomic_fetch_add(errno == EAGAIN ? &s->refused : &s->other, 1);
        usleep(1000);
    }
    while (wait(NULL) > 0 || errno == EINTR)
        ;
    if (getpid() != first) {
        atomic_fetch_sub(&s->live, 1);
        _exit(0);
    }
    printf("forkbomb: peak %ld processes, %ld forks refused (EAGAIN), %ld other fork errors\n",
           atomic_load(&s->peak), atomic_load(&s->refused), atomic_load(&s->other));
    return 0;
}
