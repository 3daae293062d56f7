/*
 * geco_job.h - a Grid Engine job's identity: its job and task ids as Grid Engine writes
 * them (the queue's $job_id $ja_task_id, JOB_ID and SGE_TASK_ID), and the spooled
 * `environment` file of its shepherd, which names them.
 *
 * The one C home of the rule; geco.jobkey.JobKey.from_sge is its Python twin, and both
 * are tested against tests/vectors/job_identity.json:
 *   job id   decimal digits only (no sign, blank or leading zero), 1..GECO_ID_MAX;
 *   task id  the same, or absent, "", "0" or "undefined": task 1 (not an array job:
 *            Grid Engine says $ja_task_id 0 and SGE_TASK_ID=undefined, and spools it
 *            as active_jobs/<job>.1);
 *   anything else is refused.
 *
 * Shared by the exec() preload, gecod's fast lane, the hook program and the PAM module:
 * it may run in sge_execd's forked child, so no malloc, no stdio, no locks, and buffers
 * on the stack.
 */
#ifndef GECO_JOB_H
#define GECO_JOB_H

#include <stddef.h>
#include <stdint.h>

/* 19 digits, as a geco.jobkey.JobKey: a key names files, and every id fits a uint64 */
#define GECO_ID_MAX 9999999999999999999ULL

/* The job id in s[0..n): 1..GECO_ID_MAX, or 0 when refused. */
uint64_t geco_job_id(const char *s, size_t n);

/* The task id in s[0..n) (s NULL: absent): 1..GECO_ID_MAX, or 0 when refused. */
uint64_t geco_task_id(const char *s, size_t n);

/* Both ids from NUL-terminated texts (NULL: absent; an absent job is refused).
   Returns 0 with *job and *task set, or -1 (both left alone). */
int geco_job_of(const char *job_text, const char *task_text, uint64_t *job, uint64_t *task);

/* Outcomes of reading the job id from an `environment` file. */
enum geco_env_result {
    GECO_ENV_OK = 0,
    GECO_ENV_E_OPEN = -1,     /* open() failed: sys_errno */
    GECO_ENV_E_READ = -2,     /* read() failed or not a regular file: sys_errno */
    GECO_ENV_E_NO_JOB = -3,   /* no JOB_ID= line */
    GECO_ENV_E_BAD_JOB = -4,  /* the last JOB_ID= line is refused by geco_job_id */
    GECO_ENV_E_BAD_TASK = -5, /* the last SGE_TASK_ID= line is refused by geco_task_id */
};

/*
 * Read JOB_ID= and SGE_TASK_ID= from the Grid Engine job `environment` file at
 * `path` (relative paths are relative to the cwd, i.e. the active_jobs dir). The last
 * line of each counts, as in sge_shepherd, which setenv()s the lines in order; no
 * SGE_TASK_ID= line means task 1.
 * Returns GECO_ENV_OK or a negative enum geco_env_result; *sys_errno is set for
 * E_OPEN/E_READ, else 0.
 */
int geco_job_from_environment(const char *path, uint64_t *job, uint64_t *task, int *sys_errno);
const char *geco_env_strerror(int result);

#endif /* GECO_JOB_H */
