/*
 * mt_exec MATCH PLAIN THREADS ROUNDS - exec under concurrency.
 *
 * THREADS threads each run ROUNDS times: fork, and in the child exec (execv)
 * MATCH on even rounds (sge_shepherd: quarantine request) or PLAIN on odd ones
 * (passed through); the parent thread waits for it. Meanwhile, in the same
 * process, one thread hammers malloc/free (so a fork often happens while the
 * malloc lock is held by another thread) and one calls execve() on a missing
 * path in a loop, checking that each failure reports ENOENT and that a
 * success-free wrapper call never disturbs its errno.
 *
 * stdout: "forks=<n> failed=<n> enoent=<n> bad_errno=<n>\n"; exit 0 when
 * every child exited 0 and every failing execve said ENOENT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *match_path, *plain_path;
static int rounds;
static atomic_int forks, failed, enoent, bad_errno, stop;

static void *forker(void *arg)
{
    (void)arg;
    for (int i = 0; i < rounds; i++) {
        const char *target = i % 2 == 0 ? match_path : plain_path;
        pid_t pid = fork();
        if (pid < 0) {
            atomic_fetch_add(&failed, 1);
            continue;
        }
        if (pid == 0) {
            char *args[] = {(char *)target, NULL};
            execv(target, args);
            _exit(127);
        }
        atomic_fetch_add(&forks, 1);
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            atomic_fetch_add(&failed, 1);
    }
    return NULL;
}

static void *allocator(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        void *p[64];
        for (int i = 0; i < 64; i++)
            p[i] = malloc((size_t)(16 + i * 97));
        for (int i = 0; i < 64; i++)
            free(p[i]);
    }
    return NULL;
}

static void *failing_exec(void *arg)
{
    (void)arg;
    char *args[] = {"missing", NULL};
    char *envs[] = {NULL};
    while (!atomic_load(&stop)) {
        errno = EDOM;
        int rc = execve("/nonexistent/geco-mt-test", args, envs);
        if (rc == -1 && errno == ENOENT)
            atomic_fetch_add(&enoent, 1);
        else
            atomic_fetch_add(&bad_errno, 1);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        dprintf(2, "usage: mt_exec MATCH PLAIN THREADS ROUNDS\n");
        return 2;
    }
    match_path = argv[1];
    plain_path = argv[2];
    int nthreads = atoi(argv[3]);
    rounds = atoi(argv[4]);
    pthread_t t[64], helpers[2];
    if (nthreads < 1 || nthreads > 64)
        return 2;
    pthread_create(&helpers[0], NULL, allocator, NULL);
    pthread_create(&helpers[1], NULL, failing_exec, NULL);
    for (int i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, forker, NULL);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(helpers[0], NULL);
    pthread_join(helpers[1], NULL);
    dprintf(1, "forks=%d failed=%d enoent=%d bad_errno=%d\n", atomic_load(&forks),
            atomic_load(&failed), atomic_load(&enoent), atomic_load(&bad_errno));
    return atomic_load(&failed) == 0 && atomic_load(&bad_errno) == 0 ? 0 : 1;
}
