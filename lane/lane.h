/*
 * lane.h - what the fast lane's files share (private: geco_lane.h is the lane's interface,
 * the one geco/_lane_build.py declares to Python).
 *
 *   geco_lane.c   the lane's life (new, configure, stop, free), its clocks, and the
 *                 threads' accept and poll loop (geco_lane_run); start reading there
 *   serve.c       a connection read and served here from frame to ACK, or left to Python
 *   jobs.c        the published jobs: publish, withdraw, the journal window
 *   handoff.c     the queue of connections left to Python, its wake-up and the counters
 *   journal.c     a success's journal entry and gecod's stderr line for it
 *   replay.c      the replay cache (a ring of nonces), shared with Python's decoding
 *
 * The functions below are hidden: the extension exports only geco_lane.h's.
 */
#ifndef GECO_LANE_PRIVATE_H
#define GECO_LANE_PRIVATE_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include "geco_lane.h"

#define JOB_BUCKETS 1024
#define MAX_UIDS 64

/* A job's cgroup.procs files stay open while it is published: a move is one write per
   hierarchy, no path walk. Cgroups removed meanwhile (by anything but gecod's own job
   lock, which withdraws the job first) fail that write (ENODEV): Python then decides. */
#define MAX_TARGETS 16

struct job {
    struct job *next;
    uint64_t job, task;
    int procs[MAX_TARGETS], nprocs;
    const char *resources, *fields;
    int64_t res_mtime_ns;
    uint64_t res_ino;
    /* this window's successes: journaled one by one up to the lane's journal_burst, the
       rest held for Python's one summary of the job (geco_lane_window) */
    atomic_uint_fast64_t journaled, held;
    char strings[]; /* the two strings above, back to back */
};

struct queued {
    struct queued *next;
    geco_handoff_t h;
};

/* The nonces accepted within the window, in arrival order (a ring), found by a chained
   hash; the same rules as geco.wire.replay.ReplayCache (full of live nonces: refuse). Links
   are a slot + 1 (0: none), so every array starts as untouched zero pages (mmap): a
   cache sized for a minute of the busiest node costs memory only as it fills. The ring's
   head walks on forever, so the pages it leaves behind (every nonce there expired) are
   given back (MADV_DONTNEED: zero pages again): what the ring holds in memory is the
   window's nonces, never every nonce gecod ever saw (a node's months of requests would
   touch all of it, 28 MiB). The buckets are touched at random: a quarter of the
   capacity (chains of four when full, 1 MiB at the default) keeps that part small. */
struct replay {
    pthread_mutex_t mu;
    int64_t window_ns;
    uint32_t cap, nbuckets, head, count;
    uint8_t (*nonce)[GECO_NONCE_BYTES];
    int64_t *seen;
    uint32_t *chain;
    uint32_t *bucket;
};

struct geco_lane {
    int listen_fd, notify_fd, stop_fd, journal_fd;
    /* settings and jobs: the serving threads read, configure/publish/withdraw write
       (writers first, so a teardown's withdraw never starves under load) */
    pthread_rwlock_t lock;
    uint8_t key[GECO_KEY_BYTES];
    int64_t max_skew_ns;
    char spool_root[PATH_MAX];
    size_t spool_len;
    uint32_t uids[MAX_UIDS];
    int nuids, seed_lines;
    uint64_t journal_burst; /* successes journaled one by one per job and window */
    struct sockaddr_un journal; /* where entries go: journal_len 0 = nowhere */
    socklen_t journal_len;
    struct job *jobs[JOB_BUCKETS];
    pthread_mutex_t queue_lock;
    struct queued *head, *tail;
    int queued;
    atomic_uint_fast64_t served, drops;
    atomic_int changed;
    atomic_int_fast64_t notified_ms; /* when a change last woke Python (monotonic) */
    struct replay replay;
};

/* the clocks: CLOCK_REALTIME in ns (the replay window), CLOCK_MONOTONIC in seconds */
static inline int64_t lane_realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline double lane_monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#pragma GCC visibility push(hidden)


/* serve.c: read what is here of h's frame: 1 when more is to come, 0 when it is whole,
   bad, closed early or failed (then lane_complete) */
int lane_read_more(geco_handoff_t *h);
/* serve.c: serve q's whole frame here (q freed), or hand q off */
void lane_complete(geco_lane_t *lane, struct queued *q);

/* jobs.c: where job.task's entry is, or goes, in its bucket's chain (lane->lock held) */
struct job **lane_job_slot(geco_lane_t *lane, uint64_t job, uint64_t task);
/* jobs.c: close a job's cgroup.procs files and free it (NULL: nothing) */
void lane_job_free(struct job *j);

/* handoff.c: wake Python (notify_fd) */
void lane_notify(geco_lane_t *lane);
/* handoff.c: queue q for geco_lane_take and wake Python; closed and freed when the queue
   is full */
void lane_hand_off(geco_lane_t *lane, struct queued *q);

/* journal.c: a success's journal entry to `to` (to_len 0: none), and gecod's stderr line
   for it. journal_success keeps its name: it is the entry's CODE_FUNC. */
void journal_success(geco_lane_t *lane, const struct sockaddr_un *to, socklen_t to_len,
                     const geco_handoff_t *h, const geco_job_started_t *m,
                     const char *fields);
void lane_seed_line(const geco_handoff_t *h, const geco_job_started_t *m);

/* replay.c: the cache set up for window_ns and cap nonces (0, or -1), given back, and
   asked: 0 fresh (recorded now), 1 seen within the window, 2 full of live nonces */
int lane_replay_init(struct replay *r, int64_t window_ns, uint32_t cap);
void lane_replay_free(struct replay *r);
int lane_replay_check(struct replay *r, const uint8_t *nonce, int64_t now);

#pragma GCC visibility pop

#endif /* GECO_LANE_PRIVATE_H */
