/*
 * serve.c - a connection the lane accepted: its frame read, then served here from the
 * checks to the ACK, or handed to Python.
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

#include "lane.h"
#include "geco_job.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sodium.h>

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
    struct job *j = *lane_job_slot(lane, m.job_id, m.task_id);
    if (j == NULL || !resources_unchanged(j))
        goto out;
    if (lane_replay_check(&lane->replay, geco_frame_nonce(h->buf), lane_realtime_ns()) != 0)
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
            lane_seed_line(h, &m);
    }
    geco_ack_t reply = {m.job_id, m.task_id, GECO_OK, {0}};
    memcpy(reply.request_nonce, geco_frame_nonce(h->buf), GECO_NONCE_BYTES);
    long len = geco_encode_ack(ack, sizeof ack, secret, NULL, 0, &reply);
    sodium_memzero(secret, sizeof secret);
    atomic_fetch_add(&lane->served, 1);
    /* Python's status line follows changes within a second: woken at most that often */
    atomic_store(&lane->changed, 1);
    int64_t now_ms = (int64_t)(lane_monotonic_s() * 1000), last = atomic_load(&lane->notified_ms);
    if (now_ms - last >= 1000 && atomic_compare_exchange_strong(&lane->notified_ms, &last, now_ms))
        lane_notify(lane);
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
   sent a shorter frame and more bytes after it loses those (see lane_complete()). */
int lane_read_more(geco_handoff_t *h)
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
void lane_complete(geco_lane_t *lane, struct queued *q)
{
    long whole = frame_bytes(&q->h);
    if (whole > 0 && q->h.len == (uint32_t)whole && serve(lane, &q->h)) {
        free(q);
        return;
    }
    if (whole > 0 && q->h.len > (uint32_t)whole)
        q->h.len = (uint32_t)whole; /* Python reads one frame and leaves what follows */
    lane_hand_off(lane, q);
}
