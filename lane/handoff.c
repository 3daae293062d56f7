/*
 * handoff.c - the connections the lane leaves to Python: queued for geco_lane_take, Python
 * woken through notify_fd; and the counters Python reads (served, drops, changed).
 */
#define _GNU_SOURCE

#include "lane.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* handoffs waiting for Python at most; more connections are closed (root's lane budget) */
#define MAX_QUEUED 1024

void lane_notify(geco_lane_t *lane)
{
    uint64_t one = 1;
    if (write(lane->notify_fd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is full, so Python is woken anyway */
    }
}

/* Leave the connection to Python (q's owner from now on). */
void lane_hand_off(geco_lane_t *lane, struct queued *q)
{
    pthread_mutex_lock(&lane->queue_lock);
    int full = lane->queued >= MAX_QUEUED;
    if (!full) {
        q->next = NULL;
        if (lane->tail != NULL)
            lane->tail->next = q;
        else
            lane->head = q;
        lane->tail = q;
        lane->queued++;
    }
    pthread_mutex_unlock(&lane->queue_lock);
    if (full) {
        /* gecod's loop is far behind: closed, as Python closes beyond its budget */
        close(q->h.fd);
        if (q->h.pidfd >= 0)
            close(q->h.pidfd);
        free(q);
        return;
    }
    lane_notify(lane);
}

int geco_lane_take(geco_lane_t *lane, geco_handoff_t *out)
{
    pthread_mutex_lock(&lane->queue_lock);
    struct queued *q = lane->head;
    if (q != NULL) {
        lane->head = q->next;
        if (lane->head == NULL)
            lane->tail = NULL;
        lane->queued--;
    }
    pthread_mutex_unlock(&lane->queue_lock);
    if (q == NULL)
        return 0;
    *out = q->h;
    free(q);
    return 1;
}

uint64_t geco_lane_served(geco_lane_t *lane)
{
    return atomic_load(&lane->served);
}

uint64_t geco_lane_journal_drops(geco_lane_t *lane)
{
    return atomic_load(&lane->drops);
}

int geco_lane_changed(geco_lane_t *lane)
{
    return atomic_exchange(&lane->changed, 0);
}
