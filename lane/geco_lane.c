/*
 * geco_lane.c - gecod's fast lane (see geco_lane.h and geco/daemon/fastlane.py).
 *
 * Why C: a later task of a running job (a qrsh -inherit shepherd) costs the kernel a
 * socket round trip and a few cgroup writes, tens of microseconds; gecod's Python
 * server spent about half a millisecond of one core on it (profiled: logging, the
 * frame's objects, the loop), so 64 tasks at once queued for tens of milliseconds.
 * Here each lane thread serves such a request from accept to ACK without the GIL.
 *
 * The rules are gecod's own (geco/daemon/quarantine.py, JOB_STARTED), applied to the
 * one case the lane serves; it never refuses anything itself. Whatever does not fit
 * that case exactly, or fails any check, goes to Python with the bytes read so far,
 * where it is decided, answered and journaled as without the lane:
 *   - a frame that is not a whole, verified JOB_STARTED (MAC, clock, payload);
 *   - a sender that is not the pid it names, or not root (real or effective) or an
 *     execd uid; a pid without a pidfd taken at accept;
 *   - a working directory other than a PE task dir of the named job in the execd
 *     spool, or whose environment file names another job (the master's shepherd is
 *     Python's: gecod watches it to end the job);
 *   - a job Python has not published (it published the job after serving one of its
 *     processes itself), or whose cgroups or resource file changed since;
 *   - a nonce already seen (the cache is the one Python's decoding uses);
 *   - a cgroup write that fails (recorded = 1: Python decides again, moves again).
 * Withdrawing a job (gecod's job lock: teardown, epilog, reaper) waits for the lane
 * threads inside it, so no move lands in cgroups being removed.
 */
#define _GNU_SOURCE

#include "geco_lane.h"
#include "geco_job.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#define JOB_BUCKETS 1024
#define MAX_UIDS 64
#define ACCEPT_BATCH 64
/* handoffs waiting for Python at most; more connections are closed (root's lane budget) */
#define MAX_QUEUED 1024

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

/* -- the replay cache ---------------------------------------------------------- */

static void *zero_pages(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void unmap(void *p, size_t bytes)
{
    if (p != NULL)
        munmap(p, bytes);
}

static uint32_t nonce_hash(const uint8_t *n, uint32_t nbuckets)
{
    uint32_t h;
    memcpy(&h, n, sizeof h); /* nonces are random: their bytes are the hash */
    return h & (nbuckets - 1);
}

static int replay_init(struct replay *r, int64_t window_ns, uint32_t cap)
{
    r->window_ns = window_ns;
    r->cap = cap;
    r->nbuckets = 1; /* chains of four nonces on average when full */
    while (r->nbuckets < cap / 4)
        r->nbuckets <<= 1;
    r->head = r->count = 0;
    r->nonce = zero_pages((size_t)cap * GECO_NONCE_BYTES);
    r->seen = zero_pages((size_t)cap * sizeof *r->seen);
    r->chain = zero_pages((size_t)cap * sizeof *r->chain);
    r->bucket = zero_pages((size_t)r->nbuckets * sizeof *r->bucket);
    if (!r->nonce || !r->seen || !r->chain || !r->bucket)
        return -1;
    return pthread_mutex_init(&r->mu, NULL) == 0 ? 0 : -1;
}

static void replay_free(struct replay *r)
{
    unmap(r->nonce, (size_t)r->cap * GECO_NONCE_BYTES);
    unmap(r->seen, (size_t)r->cap * sizeof *r->seen);
    unmap(r->chain, (size_t)r->cap * sizeof *r->chain);
    unmap(r->bucket, (size_t)r->nbuckets * sizeof *r->bucket);
}

/* Give back the pages of an array of `size`-byte slots that the ring's head has just
   left: slots [from, from + n) expired now (the ring may wrap), and with them the page
   they began in when its slots before `from` are free too (`free_before`: the free slots
   before `from`, which the tail fills next; a page with a live slot, the tail's on a
   nearly full ring, is kept). A syscall only when the head crosses a page. */
static void release_slots(void *base, size_t size, uint32_t cap, uint32_t from, uint32_t n,
                          uint32_t free_before)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), per = page / size;
    if (per == 0 || page % size != 0 || cap % per != 0)
        return; /* pages and slots do not line up: keep everything */
    /* unwrapped (shifted by cap): dead slots are [start, end), live ones outside */
    uint64_t head = (uint64_t)from + cap, end = head + n;
    uint64_t start = head - free_before, own_page = head / per * per;
    if (start < own_page)
        start = own_page; /* pages before the head's were given back before */
    uint64_t first = (start + per - 1) / per, last = end / per; /* whole pages only */
    uint64_t pages = cap / per;
    for (uint64_t p = first; p < last;) {
        uint64_t at = p % pages, run = last - p;
        if (run > pages - at)
            run = pages - at; /* up to the array's end; the rest wraps to its start */
        madvise((char *)base + at * page, run * page, MADV_DONTNEED);
        p += run;
    }
}

static void replay_drop_oldest(struct replay *r)
{
    uint32_t old = r->head, *link = &r->bucket[nonce_hash(r->nonce[old], r->nbuckets)];
    while (*link != old + 1)
        link = &r->chain[*link - 1];
    *link = r->chain[old];
    r->head = (r->head + 1) % r->cap;
    r->count--;
}

static int replay_check(struct replay *r, const uint8_t *nonce, int64_t now)
{
    pthread_mutex_lock(&r->mu);
    uint32_t head = r->head, dropped = 0;
    while (r->count > 0 && now - r->seen[r->head] > r->window_ns) {
        replay_drop_oldest(r);
        dropped++;
    }
    if (dropped > 0) {
        uint32_t free_before = r->cap - r->count - dropped; /* free before the drop */
        release_slots(r->nonce, GECO_NONCE_BYTES, r->cap, head, dropped, free_before);
        release_slots(r->seen, sizeof *r->seen, r->cap, head, dropped, free_before);
        release_slots(r->chain, sizeof *r->chain, r->cap, head, dropped, free_before);
    }
    uint32_t b = nonce_hash(nonce, r->nbuckets);
    int rc = 0;
    for (uint32_t link = r->bucket[b]; link != 0; link = r->chain[link - 1]) {
        if (memcmp(r->nonce[link - 1], nonce, GECO_NONCE_BYTES) == 0) {
            rc = 1;
            goto out;
        }
    }
    if (r->count >= r->cap) {
        rc = 2;
        goto out;
    }
    uint32_t slot = (r->head + r->count) % r->cap;
    memcpy(r->nonce[slot], nonce, GECO_NONCE_BYTES);
    r->seen[slot] = now;
    r->chain[slot] = r->bucket[b];
    r->bucket[b] = slot + 1;
    r->count++;
out:
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int geco_lane_replay_check(geco_lane_t *lane, const uint8_t nonce[GECO_NONCE_BYTES],
                           int64_t now_ns)
{
    return replay_check(&lane->replay, nonce, now_ns);
}

uint32_t geco_lane_replay_size(geco_lane_t *lane)
{
    pthread_mutex_lock(&lane->replay.mu);
    uint32_t n = lane->replay.count;
    pthread_mutex_unlock(&lane->replay.mu);
    return n;
}

/* -- the lane ------------------------------------------------------------------ */

static int64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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
             && replay_init(&lane->replay, replay_window_ns, replay_capacity) == 0;
    pthread_rwlockattr_destroy(&attr);
    if (!ok) {
        int saved = errno ? errno : ENOMEM;
        if (lane->stop_fd >= 0)
            close(lane->stop_fd);
        if (lane->journal_fd >= 0)
            close(lane->journal_fd);
        replay_free(&lane->replay);
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

static struct job **job_slot(geco_lane_t *lane, uint64_t job, uint64_t task)
{
    struct job **link = &lane->jobs[(job * 31 + task) % JOB_BUCKETS];
    while (*link != NULL && ((*link)->job != job || (*link)->task != task))
        link = &(*link)->next;
    return link;
}

static void job_free(struct job *j)
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
            job_free(j);
            errno = saved;
            return -1;
        }
        j->procs[j->nprocs++] = fd;
    }
    pthread_rwlock_wrlock(&lane->lock);
    struct job **link = job_slot(lane, job, task), *old = *link;
    j->next = old != NULL ? old->next : NULL;
    if (old != NULL) { /* published again: the same job, the same window */
        atomic_store(&j->journaled, atomic_load(&old->journaled));
        atomic_store(&j->held, atomic_load(&old->held));
    }
    *link = j;
    pthread_rwlock_unlock(&lane->lock);
    job_free(old);
    return 0;
}

uint64_t geco_lane_withdraw(geco_lane_t *lane, uint64_t job, uint64_t task)
{
    pthread_rwlock_wrlock(&lane->lock);
    struct job **link = job_slot(lane, job, task), *old = *link;
    if (old != NULL)
        *link = old->next;
    pthread_rwlock_unlock(&lane->lock);
    /* no thread holds it now: its count is final */
    uint64_t held = old != NULL ? atomic_load(&old->held) : 0;
    job_free(old);
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

static void notify(geco_lane_t *lane)
{
    uint64_t one = 1;
    if (write(lane->notify_fd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is full, so Python is woken anyway */
    }
}

/* Leave the connection to Python (q's owner from now on). */
static void hand_off(geco_lane_t *lane, struct queued *q)
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
    notify(lane);
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

/* -- the kernel's facts about the sender --------------------------------------- */

static int uid_allowed(const geco_lane_t *lane, uint32_t uid, int pid)
{
    if (uid == 0)
        return 1;
    for (int i = 0; i < lane->nuids; i++)
        if (lane->uids[i] == uid)
            return 1;
    /* sge_execd's child: real uid 0, effective uid the admin user (geco's
       _may_start_jobs): it can become root again at will */
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *u = strstr(buf, "\nUid:");
    return u != NULL && strtoul(u + 5, NULL, 10) == 0 && u[5] != '\0';
}

static int alive(int pidfd)
{
    return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0 || errno == EPERM;
}

/* 1 when cwd is <spool>/<host>/active_jobs/<key>/<pe task> (nothing empty in it) */
static int pe_task_dir(const geco_lane_t *lane, const char *cwd, const char *key)
{
    if (strncmp(cwd, lane->spool_root, lane->spool_len) != 0)
        return 0;
    const char *part[5];
    size_t len[5];
    int n = 0;
    const char *p = cwd + lane->spool_len;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t k = slash != NULL ? (size_t)(slash - p) : strlen(p);
        if (n == 5 || k == 0)
            return 0;
        part[n] = p;
        len[n++] = k;
        if (slash == NULL)
            break;
        p = slash + 1;
    }
    return n == 4 && len[1] == 11 && memcmp(part[1], "active_jobs", 11) == 0
           && len[2] == strlen(key) && memcmp(part[2], key, len[2]) == 0;
}

/* 1 when <dir>/environment names this job and task (geco_job.c's rule, as gecod's
   Python check); anything else is Python's to decide and say */
static int environment_names(const char *dir, uint64_t job, uint64_t task)
{
    char path[PATH_MAX + 16];
    uint64_t named_job = 0, named_task = 0;
    int sys_errno;
    if ((size_t)snprintf(path, sizeof path, "%s/environment", dir) >= sizeof path)
        return 0;
    return geco_job_from_environment(path, &named_job, &named_task, &sys_errno) == GECO_ENV_OK
           && named_job == job && named_task == task;
}

/* 1 when the resource file is as published (its trace setting unchanged) */
static int resources_unchanged(const struct job *j)
{
    struct stat st;
    if (stat(j->resources, &st) != 0)
        return errno == ENOENT && j->res_ino == 0;
    return (uint64_t)st.st_ino == j->res_ino
           && (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec == j->res_mtime_ns;
}

static int move(const struct job *j, const char *pid)
{
    size_t n = strlen(pid);
    for (int i = 0; i < j->nprocs; i++)
        if (write(j->procs[i], pid, n) != (ssize_t)n)
            return -1;
    return 0;
}

/* -- serving ------------------------------------------------------------------- */

/* gecod's own line for it on stderr, as geco.log.seed_line writes Python's */
static void seed_line(const geco_handoff_t *h, const geco_job_started_t *m)
{
    char stamp[40], line[512];
    struct tm tm;
    time_t now = time(NULL);
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S%z", &tm);
    int n = snprintf(line, sizeof line,
                     "%s [%d|INFO ]: (geco_lane.c:%d) quarantined process %u into job %lu.%lu "
                     "(pid %d uid %d)\n", stamp, (int)getpid(), __LINE__, m->pid,
                     (unsigned long)m->job_id, (unsigned long)m->task_id, h->pid, h->uid);
    /* one write per line: whole lines, whatever else writes to stderr */
    if (n > 0 && (size_t)n < sizeof line && write(2, line, (size_t)n) < 0) {
        /* stderr gone: the journal has the entry */
    }
}

static void journal_success(geco_lane_t *lane, const struct sockaddr_un *to, socklen_t to_len,
                            const geco_handoff_t *h, const geco_job_started_t *m,
                            const char *fields)
{
    if (to_len == 0)
        return;
    char entry[2048];
    int n = snprintf(entry, sizeof entry,
                     "MESSAGE=quarantined process %u into job %lu.%lu (pid %d uid %d)\n"
                     "PRIORITY=6\nSYSLOG_IDENTIFIER=gecod\nCODE_FILE=lane/geco_lane.c\n"
                     "CODE_LINE=%d\nCODE_FUNC=%s\n"
                     "JOB_ID=%lu\nSGE_TASK_ID=%lu\nGECO_EVENT=quarantined\nPID=%u\n"
                     "PEER_PID=%d\nPEER_UID=%d\nREQUEST=JOB_STARTED\nLANE=root\n"
                     "ELAPSED_MS=%.1f\nCGROUP_CREATED=0\n%s",
                     m->pid, (unsigned long)m->job_id, (unsigned long)m->task_id, h->pid,
                     h->uid, __LINE__, __func__, (unsigned long)m->job_id,
                     (unsigned long)m->task_id, m->pid, h->pid, h->uid,
                     (monotonic_s() - h->accepted) * 1000.0, fields);
    if (n <= 0 || (size_t)n >= sizeof entry)
        return;
    if (sendto(lane->journal_fd, entry, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL,
               (const struct sockaddr *)to, to_len) < 0
        && (errno == EAGAIN || errno == EWOULDBLOCK))
        atomic_fetch_add(&lane->drops, 1); /* never waits: journald full drops, counted */
}

static void finish(int fd, int pidfd)
{
    /* No drain before close: on a Unix stream socket the peer reads what is queued for it
       (the ACK) before the reset that unread bytes here would give it. */
    close(fd);
    if (pidfd >= 0)
        close(pidfd);
}

/* Serve a whole frame here: 1 when answered and closed, 0 to hand it to Python. */
static int serve(geco_lane_t *lane, geco_handoff_t *h)
{
    geco_job_started_t m;
    char key[48], cwd[PATH_MAX], link[64], pid[16], fields[1024];
    uint8_t ack[GECO_HEADER_BYTES + 40 + GECO_MAC_BYTES], secret[GECO_KEY_BYTES];
    int served = 0, seed = 0, journal_it = 0;
    struct sockaddr_un journal;
    socklen_t journal_len = 0;

    pthread_rwlock_rdlock(&lane->lock);
    if (h->pidfd < 0
        || geco_decode_job_started(h->buf, h->len, lane->key, 0, lane->max_skew_ns, &m) != 0
        || m.job_id < 1 || m.task_id < 1 || m.pid != (uint32_t)h->pid
        || !uid_allowed(lane, (uint32_t)h->uid, h->pid))
        goto out;
    snprintf(key, sizeof key, "%lu.%lu", (unsigned long)m.job_id, (unsigned long)m.task_id);
    snprintf(link, sizeof link, "/proc/%d/cwd", h->pid);
    ssize_t n = readlink(link, cwd, sizeof cwd - 1);
    if (n <= 0)
        goto out;
    cwd[n] = '\0';
    if (!pe_task_dir(lane, cwd, key) || !environment_names(cwd, m.job_id, m.task_id)
        || !alive(h->pidfd))
        goto out;
    struct job *j = *job_slot(lane, m.job_id, m.task_id);
    if (j == NULL || !resources_unchanged(j))
        goto out;
    if (replay_check(&lane->replay, geco_frame_nonce(h->buf), realtime_ns()) != 0)
        goto out; /* Python's decoding refuses it with the cache's own words */
    h->recorded = 1;
    snprintf(pid, sizeof pid, "%u", m.pid);
    if (move(j, pid) != 0)
        goto out;
    if (!alive(h->pidfd)) {
        h->died = 1;
        goto out;
    }
    snprintf(fields, sizeof fields, "%s", j->fields);
    memcpy(secret, lane->key, sizeof secret);
    /* copied under the lock: geco_lane_configure may change them meanwhile */
    journal = lane->journal;
    journal_len = lane->journal_len;
    seed = lane->seed_lines;
    journal_it = atomic_fetch_add(&j->journaled, 1) < lane->journal_burst;
    if (!journal_it)
        atomic_fetch_add(&j->held, 1);
    served = 1;
out:
    pthread_rwlock_unlock(&lane->lock);
    if (!served)
        return 0;
    if (journal_it) {
        journal_success(lane, &journal, journal_len, h, &m, fields);
        if (seed)
            seed_line(h, &m);
    }
    geco_ack_t reply = {m.job_id, m.task_id, GECO_OK, {0}};
    memcpy(reply.request_nonce, geco_frame_nonce(h->buf), GECO_NONCE_BYTES);
    long len = geco_encode_ack(ack, sizeof ack, secret, NULL, 0, &reply);
    sodium_memzero(secret, sizeof secret);
    atomic_fetch_add(&lane->served, 1);
    /* Python's status line follows changes within a second: woken at most that often */
    atomic_store(&lane->changed, 1);
    int64_t now_ms = (int64_t)(monotonic_s() * 1000), last = atomic_load(&lane->notified_ms);
    if (now_ms - last >= 1000 && atomic_compare_exchange_strong(&lane->notified_ms, &last, now_ms))
        notify(lane);
    if (len > 0)
        send(h->fd, ack, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
    finish(h->fd, h->pidfd);
    return 1;
}

/* The frame's length by its header: 0 while the header is not all here, -1 when it is bad
   (Python answers that). */
static long frame_bytes(const geco_handoff_t *h)
{
    if (h->len < GECO_HEADER_BYTES)
        return 0;
    long whole = geco_frame_length(h->buf);
    return whole < 0 ? -1 : whole;
}

/* Read what is here of the frame: 1 when more is to come, 0 when it is the lane's to
   serve or Python's to take (whole, bad, closed early, or failed). The first read asks
   for a whole JOB_STARTED, the lane's one request, so it comes in one recv; a client that
   sent a shorter frame and more bytes after it loses those (see complete()). */
static int read_more(geco_handoff_t *h)
{
    for (;;) {
        long whole = frame_bytes(h);
        if (whole < 0 || (whole > 0 && h->len >= (uint32_t)whole))
            return 0;
        size_t want = whole > 0 ? (size_t)whole - h->len
                      : h->len == 0 ? GECO_HEADER_BYTES + GECO_JOB_STARTED_BYTES + GECO_MAC_BYTES
                                    : GECO_HEADER_BYTES - h->len;
        ssize_t got = recv(h->fd, h->buf + h->len, want, MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        if (got <= 0)
            return 0; /* closed or failed: Python's state machine says so */
        h->len += (uint32_t)got;
    }
}

/* A connection whose frame has all come (or never will): served, or Python's. */
static void complete(geco_lane_t *lane, struct queued *q)
{
    long whole = frame_bytes(&q->h);
    if (whole > 0 && q->h.len == (uint32_t)whole && serve(lane, &q->h)) {
        free(q);
        return;
    }
    if (whole > 0 && q->h.len > (uint32_t)whole)
        q->h.len = (uint32_t)whole; /* Python reads one frame and leaves what follows */
    hand_off(lane, q);
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
    return (int64_t)(monotonic_s() * 1000.0);
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
    h->accepted = monotonic_s();
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
    if (read_more(h) && t->npending < PENDING) {
        t->pending[t->npending] = q;
        t->deadline_ms[t->npending++] = now_ms() + PENDING_WAIT_MS;
        return;
    }
    complete(lane, q);
}

/* The pending connections with bytes, or past their moment. */
static void tend(geco_lane_t *lane, struct thread_state *t, const struct pollfd *ready)
{
    int64_t now = now_ms();
    int kept = 0;
    for (int i = 0; i < t->npending; i++) {
        struct queued *q = t->pending[i];
        int more = ready[i].revents == 0 || read_more(&q->h);
        if (more && now < t->deadline_ms[i]) {
            t->pending[kept] = q;
            t->deadline_ms[kept++] = t->deadline_ms[i];
        } else {
            complete(lane, q);
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
        hand_off(lane, t.pending[i]);
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
            job_free(j);
        }
    }
    close(lane->journal_fd);
    close(lane->stop_fd);
    sodium_memzero(lane->key, sizeof lane->key);
    replay_free(&lane->replay);
    pthread_rwlock_destroy(&lane->lock);
    pthread_mutex_destroy(&lane->queue_lock);
    pthread_mutex_destroy(&lane->replay.mu);
    free(lane);
}
