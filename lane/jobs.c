/*
 * jobs.c - the jobs the lane serves: published and withdrawn by gecod's Python side, and
 * the journal window of each (how many successes were journaled one by one, how many held).
 */
#define _GNU_SOURCE

#include "lane.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct job **lane_job_slot(geco_lane_t *lane, uint64_t job, uint64_t task)
{
    struct job **link = &lane->jobs[(job * 31 + task) % JOB_BUCKETS];
    while (*link != NULL && ((*link)->job != job || (*link)->task != task))
        link = &(*link)->next;
    return link;
}

void lane_job_free(struct job *j)
{
    if (j == NULL)
        return;
    for (int i = 0; i < j->nprocs; i++)
        close(j->procs[i]);
    free(j);
}

int geco_lane_publish(geco_lane_t *lane, uint64_t job, uint64_t task, const char *procs,
                      const char *resources, int64_t res_mtime_ns, uint64_t res_ino,
                      const char *fields)
{
    size_t c = strlen(resources) + 1, d = strlen(fields) + 1;
    struct job *j = malloc(sizeof *j + c + d);
    if (j == NULL)
        return -1;
    j->job = job;
    j->task = task;
    j->nprocs = 0;
    j->res_mtime_ns = res_mtime_ns;
    j->res_ino = res_ino;
    j->resources = memcpy(j->strings, resources, c);
    j->fields = memcpy(j->strings + c, fields, d);
    atomic_init(&j->journaled, 0);
    atomic_init(&j->held, 0);
    for (const char *p = procs; *p != '\0'; p += strlen(p) + 1) {
        int fd = j->nprocs < MAX_TARGETS ? open(p, O_WRONLY | O_CLOEXEC) : -1;
        if (fd < 0) {
            int saved = j->nprocs < MAX_TARGETS ? errno : E2BIG;
            lane_job_free(j);
            errno = saved;
            return -1;
        }
        j->procs[j->nprocs++] = fd;
    }
    pthread_rwlock_wrlock(&lane->lock);
    struct job **link = lane_job_slot(lane, job, task), *old = *link;
    j->next = old != NULL ? old->next : NULL;
    if (old != NULL) { /* published again: the same job, the same window */
        atomic_store(&j->journaled, atomic_load(&old->journaled));
        atomic_store(&j->held, atomic_load(&old->held));
    }
    *link = j;
    pthread_rwlock_unlock(&lane->lock);
    lane_job_free(old);
    return 0;
}

uint64_t geco_lane_withdraw(geco_lane_t *lane, uint64_t job, uint64_t task)
{
    pthread_rwlock_wrlock(&lane->lock);
    struct job **link = lane_job_slot(lane, job, task), *old = *link;
    if (old != NULL)
        *link = old->next;
    pthread_rwlock_unlock(&lane->lock);
    /* no thread holds it now: its count is final */
    uint64_t held = old != NULL ? atomic_load(&old->held) : 0;
    lane_job_free(old);
    return held;
}

uint64_t geco_lane_window(geco_lane_t *lane, uint64_t *jobs, uint64_t *tasks, uint64_t *held,
                          uint64_t max)
{
    uint64_t n = 0;
    pthread_rwlock_rdlock(&lane->lock); /* serving goes on: the counts are atomic */
    for (int b = 0; b < JOB_BUCKETS && n < max; b++)
        for (struct job *j = lane->jobs[b]; j != NULL && n < max; j = j->next) {
            atomic_store(&j->journaled, 0);
            uint64_t h = atomic_exchange(&j->held, 0);
            if (h > 0) {
                jobs[n] = j->job;
                tasks[n] = j->task;
                held[n++] = h;
            }
        }
    pthread_rwlock_unlock(&lane->lock);
    return n;
}
