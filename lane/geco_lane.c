/*
 * geco_lane.c - gecod's fast lane (see geco_lane.h and geco/daemon/fastlane.py): its life,
 * its clocks, and the threads that accept root's socket. Its other files, one job each,
 * are listed in lane.h; which requests it serves, and which it leaves to Python, in serve.c.
 *
 * Why C: a later task of a running job (a qrsh -inherit shepherd) costs the kernel a
 * socket round trip and a few cgroup writes, tens of microseconds; gecod's Python
 * server spent about half a millisecond of one core on it (profiled: logging, the
 * frame's objects, the loop), so 64 tasks at once queued for tens of milliseconds.
 * Here each lane thread serves such a request from accept to ACK without the GIL.
 */
#define _GNU_SOURCE

#include "lane.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#define ACCEPT_BATCH 64

/* -- the lane ------------------------------------------------------------------ */

geco_lane_t *geco_lane_new(int listen_fd, int notify_fd, int64_t replay_window_ns,
                           uint32_t replay_capacity)
{
    if (geco_proto_init() != 0 || replay_window_ns <= 0 || replay_capacity == 0
        || replay_capacity > (1u << 28)) {
        errno = EINVAL;
        return NULL;
    }
    geco_lane_t *lane = calloc(1, sizeof *lane);
    if (lane == NULL)
        return NULL;
    lane->listen_fd = listen_fd;
    lane->notify_fd = notify_fd;
    lane->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    lane->journal_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int ok = lane->stop_fd >= 0 && lane->journal_fd >= 0 && pthread_rwlock_init(&lane->lock, &attr) == 0
             && pthread_mutex_init(&lane->queue_lock, NULL) == 0
             && lane_replay_init(&lane->replay, replay_window_ns, replay_capacity) == 0;
    pthread_rwlockattr_destroy(&attr);
    if (!ok) {
        int saved = errno ? errno : ENOMEM;
        if (lane->stop_fd >= 0)
            close(lane->stop_fd);
        if (lane->journal_fd >= 0)
            close(lane->journal_fd);
        lane_replay_free(&lane->replay);
        free(lane);
        errno = saved;
        return NULL;
    }
    return lane;
}

int geco_lane_configure(geco_lane_t *lane, const uint8_t key[GECO_KEY_BYTES],
                        int64_t max_skew_ns, const char *spool_root, const uint32_t *uids,
                        int nuids, const char *journal, int seed_lines,
                        uint64_t journal_burst)
{
    size_t n = strlen(spool_root);
    while (n > 0 && spool_root[n - 1] == '/')
        n--;
    if (n + 2 > sizeof lane->spool_root || nuids < 0 || nuids > MAX_UIDS
        || strlen(journal) >= sizeof lane->journal.sun_path) {
        errno = EINVAL;
        return -1;
    }
    pthread_rwlock_wrlock(&lane->lock);
    memcpy(lane->key, key, GECO_KEY_BYTES);
    lane->max_skew_ns = max_skew_ns;
    memcpy(lane->spool_root, spool_root, n);
    lane->spool_root[n] = '/';
    lane->spool_root[n + 1] = '\0';
    lane->spool_len = n + 1;
    memcpy(lane->uids, uids, (size_t)nuids * sizeof *uids);
    lane->nuids = nuids;
    lane->seed_lines = seed_lines;
    lane->journal_burst = journal_burst;
    memset(&lane->journal, 0, sizeof lane->journal);
    lane->journal.sun_family = AF_UNIX;
    strcpy(lane->journal.sun_path, journal);
    lane->journal_len = journal[0] == '\0' ? 0
        : (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(journal));
    pthread_rwlock_unlock(&lane->lock);
    return 0;
}

/* Connections whose frame is not all here yet. A client sends right after connecting,
   but its process may not have run since: a lane thread watches a few for a moment,
   then leaves them to Python's state machine (with its own deadline). */
#define PENDING 32
#define PENDING_WAIT_MS 50

struct thread_state {
    struct queued *pending[PENDING];
    int64_t deadline_ms[PENDING];
    int npending;
};

static int64_t now_ms(void)
{
    return (int64_t)(lane_monotonic_s() * 1000.0);
}

static void accepted(geco_lane_t *lane, struct thread_state *t, int fd)
{
    struct queued *q = malloc(sizeof *q);
    if (q == NULL) {
        close(fd);
        return;
    }
    geco_handoff_t *h = &q->h;
    h->fd = fd;
    h->pidfd = -1;
    h->accepted = lane_monotonic_s();
    h->len = 0;
    h->recorded = h->died = 0;
    struct ucred uc;
    socklen_t l = sizeof uc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &l) != 0) {
        close(fd); /* as Python: nothing names the sender */
        free(q);
        return;
    }
    h->pid = uc.pid;
    h->uid = (int)uc.uid;
    h->gid = (int)uc.gid;
    /* pins the peer: "still alive" after the move means its pid was not reused */
    h->pidfd = (int)syscall(SYS_pidfd_open, uc.pid, 0);
    if (lane_read_more(h) && t->npending < PENDING) {
        t->pending[t->npending] = q;
        t->deadline_ms[t->npending++] = now_ms() + PENDING_WAIT_MS;
        return;
    }
    lane_complete(lane, q);
}

/* The pending connections with bytes, or past their moment. */
static void tend(geco_lane_t *lane, struct thread_state *t, const struct pollfd *ready)
{
    int64_t now = now_ms();
    int kept = 0;
    for (int i = 0; i < t->npending; i++) {
        struct queued *q = t->pending[i];
        int more = ready[i].revents == 0 || lane_read_more(&q->h);
        if (more && now < t->deadline_ms[i]) {
            t->pending[kept] = q;
            t->deadline_ms[kept++] = t->deadline_ms[i];
        } else {
            lane_complete(lane, q);
        }
    }
    t->npending = kept;
}

void geco_lane_run(geco_lane_t *lane)
{
    struct thread_state t = {.npending = 0};
    struct pollfd p[2 + PENDING];
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* gecod's loop takes the signals */
    for (;;) {
        p[0] = (struct pollfd){lane->listen_fd, POLLIN, 0};
        p[1] = (struct pollfd){lane->stop_fd, POLLIN, 0};
        int timeout = -1;
        int64_t now = now_ms();
        for (int i = 0; i < t.npending; i++) {
            p[2 + i] = (struct pollfd){t.pending[i]->h.fd, POLLIN, 0};
            int64_t left = t.deadline_ms[i] - now;
            if (timeout < 0 || left < timeout)
                timeout = left > 0 ? (int)left : 0;
        }
        if (poll(p, (nfds_t)(2 + t.npending), timeout) < 0 && errno != EINTR)
            break;
        if (p[1].revents != 0)
            break;
        tend(lane, &t, p + 2);
        if (!(p[0].revents & POLLIN))
            continue;
        for (int i = 0; i < ACCEPT_BATCH; i++) {
            int fd = accept4(lane->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0) {
                accepted(lane, &t, fd);
                continue;
            }
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* out of descriptors: pause rather than spin (as gecod's loop) */
                struct timespec pause = {0, 200 * 1000 * 1000};
                nanosleep(&pause, NULL);
            }
            if (errno != ECONNABORTED && errno != EINTR)
                break;
        }
    }
    for (int i = 0; i < t.npending; i++) /* stopping: Python answers them */
        lane_hand_off(lane, t.pending[i]);
}

void geco_lane_stop(geco_lane_t *lane)
{
    uint64_t one = 1;
    if (write(lane->stop_fd, &one, sizeof one) < 0) {
        /* the counter cannot be full: one write per lane */
    }
}

void geco_lane_free(geco_lane_t *lane)
{
    geco_handoff_t h;
    while (geco_lane_take(lane, &h)) {
        close(h.fd);
        if (h.pidfd >= 0)
            close(h.pidfd);
    }
    for (int b = 0; b < JOB_BUCKETS; b++) {
        for (struct job *j = lane->jobs[b], *next; j != NULL; j = next) {
            next = j->next;
            lane_job_free(j);
        }
    }
    close(lane->journal_fd);
    close(lane->stop_fd);
    sodium_memzero(lane->key, sizeof lane->key);
    lane_replay_free(&lane->replay);
    pthread_rwlock_destroy(&lane->lock);
    pthread_mutex_destroy(&lane->queue_lock);
    pthread_mutex_destroy(&lane->replay.mu);
    free(lane);
}
