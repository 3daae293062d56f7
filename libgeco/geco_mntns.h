/*
 * geco_mntns.h - enter a job's mount namespace (its private /tmp and /dev/shm), as gecod
 * pinned it: <dir>/<job>.<task> (geco-mntns, geco/job/privatetmp.py).
 */
#ifndef GECO_MNTNS_H
#define GECO_MNTNS_H

#include <stddef.h>
#include <stdint.h>

/* Enter the namespace pinned at <dir>/<job>.<task> (written to path[0..pathlen)).
   The caller must be single-threaded and root, or able to become root again (its
   real or saved uid 0: sge_execd's children, whose effective uid is its admin user's);
   its working directory is kept (held open across setns, which moves it to the root,
   and entered again by that descriptor: never by its path, which inside may name a
   directory the job's owner made in the job's private /tmp; it stays the node's
   directory, where what the caller writes relative to it is meant to go).
   Returns 1 when entered, 0 when there is none (dir empty, no such pin: the job has no
   private /tmp), -1 on failure with errno set and *step naming the call that failed. */
int geco_join_mntns(const char *dir, uint64_t job, uint64_t task, char *path, size_t pathlen,
                    const char **step);

#endif /* GECO_MNTNS_H */
