/*
 * geco_lane.h - gecod's fast lane: JOB_STARTED for a later task of a job gecod already
 * contains, served in C threads on the privileged socket (geco/daemon/fastlane.py).
 *
 * The lane owns the accepting of root's socket. A request it can serve whole (a PE
 * task's shepherd of a published job: a verified frame, the kernel's word on the
 * sender, the task's spool dir and environment, the job's cgroups unchanged) is
 * answered here: the pid moved, the ACK sent, the success journaled. Everything else
 * (another type, a refusal, anything unsure) is handed to gecod's Python server with
 * the bytes read so far, which decides it exactly as without the lane.
 */
#ifndef GECO_LANE_H
#define GECO_LANE_H

#include <stdint.h>

#include "geco_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cffi: from here (geco/_lane_build.py declares what lies between these lines to Python) */
typedef struct geco_lane geco_lane_t;

/* A connection the lane leaves to Python. */
typedef struct {
    int fd;                 /* the accepted socket (non-blocking), owned by the taker */
    int pidfd;              /* pidfd of the peer, or -1; owned by the taker */
    int pid, uid, gid;      /* SO_PEERCRED */
    double accepted;        /* CLOCK_MONOTONIC seconds at accept */
    uint32_t len;           /* bytes read so far (at most one frame) */
    int recorded;           /* the frame's nonce is in the replay cache already */
    int died;               /* the pid was moved, then found dead: its pid may be reused */
    uint8_t buf[GECO_MAX_FRAME];
} geco_handoff_t;

/* A lane on the listening Unix socket listen_fd (non-blocking); notify_fd: an eventfd
   written when a handoff waits or a request changed the node's jobs. replay_window_ns:
   the replay cache's window (2 x max skew). NULL on failure (errno). */
geco_lane_t *geco_lane_new(int listen_fd, int notify_fd, int64_t replay_window_ns,
                           uint32_t replay_capacity);
/* Settings, replaceable at any time: the key, the clock's allowed skew, the execd
   spool dir as the kernel spells it, the uids that start jobs besides root, where
   journal entries go ("" none), whether a success is also a line on stderr (gecod's
   own stderr at info), and how many of a job's successes a window journals one by one
   (the rest are counted for geco_lane_window). */
int geco_lane_configure(geco_lane_t *lane, const uint8_t key[GECO_KEY_BYTES],
                        int64_t max_skew_ns, const char *spool_root, const uint32_t *uids,
                        int nuids, const char *journal, int seed_lines,
                        uint64_t journal_burst);
/* Serve job.task from now on. procs: the cgroup.procs files a move writes, in order,
   each NUL-terminated, an empty one last (opened here, kept open while published);
   resources: the job's resource file and its (mtime_ns, ino) when published, both 0 when
   it had none (a changed file may change the job's trace: then Python serves); fields:
   journal fields for a success ("KEY=value\n" lines). 0, or -1 (errno) */
int geco_lane_publish(geco_lane_t *lane, uint64_t job, uint64_t task, const char *procs,
                      const char *resources, int64_t res_mtime_ns, uint64_t res_ino,
                      const char *fields);
/* Serve job.task no more; returns once no lane thread is moving a process into it, with
   the successes of its window that were not journaled one by one. */
uint64_t geco_lane_withdraw(geco_lane_t *lane, uint64_t job, uint64_t task);
/* End the journal window of every published job: up to max jobs whose successes were not
   all journaled, into jobs/tasks/held; returns how many (the rest wait for the next). */
uint64_t geco_lane_window(geco_lane_t *lane, uint64_t *jobs, uint64_t *tasks, uint64_t *held,
                          uint64_t max);
/* A thread's body: accept and serve until geco_lane_stop. Several threads may run it. */
void geco_lane_run(geco_lane_t *lane);
void geco_lane_stop(geco_lane_t *lane);
/* The next handoff into *out: 1, or 0 when none waits. */
int geco_lane_take(geco_lane_t *lane, geco_handoff_t *out);
/* Requests served here, journal entries dropped (journald full), and whether a request
   changed the node's jobs since the last call (then cleared). */
uint64_t geco_lane_served(geco_lane_t *lane);
uint64_t geco_lane_journal_drops(geco_lane_t *lane);
int geco_lane_changed(geco_lane_t *lane);
/* The replay cache, shared with Python's decoding of the lane's socket: 0 fresh
   (recorded now), 1 seen within the window, 2 full of live nonces (refused). */
int geco_lane_replay_check(geco_lane_t *lane, const uint8_t nonce[GECO_NONCE_BYTES],
                           int64_t now_ns);
uint32_t geco_lane_replay_size(geco_lane_t *lane);
/* After every thread has returned from geco_lane_run: closes handoffs never taken. */
void geco_lane_free(geco_lane_t *lane);
/* cffi: to here */

#ifdef __cplusplus
}
#endif

#endif /* GECO_LANE_H */
