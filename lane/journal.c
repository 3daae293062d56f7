/*
 * journal.c - a success served by the lane, journaled as Python journals one (the same
 * fields, straight to journald's socket) and, when gecod's stderr is at info, its line.
 */
#define _GNU_SOURCE

#include "lane.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* gecod's own line for it on stderr, as geco.log.seed_line writes Python's */
void lane_seed_line(const geco_handoff_t *h, const geco_job_started_t *m)
{
    char stamp[40], line[512];
    struct tm tm;
    time_t now = time(NULL);
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S%z", &tm);
    int n = snprintf(line, sizeof line,
                     "%s [%d|INFO ]: (journal.c:%d) quarantined process %u into job %lu.%lu "
                     "(pid %d uid %d)\n", stamp, (int)getpid(), __LINE__, m->pid,
                     (unsigned long)m->job_id, (unsigned long)m->task_id, h->pid, h->uid);
    /* one write per line: whole lines, whatever else writes to stderr */
    if (n > 0 && (size_t)n < sizeof line && write(2, line, (size_t)n) < 0) {
        /* stderr gone: the journal has the entry */
    }
}

void journal_success(geco_lane_t *lane, const struct sockaddr_un *to, socklen_t to_len,
                     const geco_handoff_t *h, const geco_job_started_t *m,
                     const char *fields)
{
    if (to_len == 0)
        return;
    char entry[2048];
    int n = snprintf(entry, sizeof entry,
                     "MESSAGE=quarantined process %u into job %lu.%lu (pid %d uid %d)\n"
                     "PRIORITY=6\nSYSLOG_IDENTIFIER=gecod\nCODE_FILE=lane/journal.c\n"
                     "CODE_LINE=%d\nCODE_FUNC=%s\n"
                     "JOB_ID=%lu\nSGE_TASK_ID=%lu\nGECO_EVENT=quarantined\nPID=%u\n"
                     "PEER_PID=%d\nPEER_UID=%d\nREQUEST=JOB_STARTED\nLANE=root\n"
                     "ELAPSED_MS=%.1f\nCGROUP_CREATED=0\n%s",
                     m->pid, (unsigned long)m->job_id, (unsigned long)m->task_id, h->pid,
                     h->uid, __LINE__, __func__, (unsigned long)m->job_id,
                     (unsigned long)m->task_id, m->pid, h->pid, h->uid,
                     (lane_monotonic_s() - h->accepted) * 1000.0, fields);
    if (n <= 0 || (size_t)n >= sizeof entry)
        return;
    if (sendto(lane->journal_fd, entry, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL,
               (const struct sockaddr *)to, to_len) < 0
        && (errno == EAGAIN || errno == EWOULDBLOCK))
        atomic_fetch_add(&lane->drops, 1); /* never waits: journald full drops, counted */
}
