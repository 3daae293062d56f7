/*
 * geco_job.c - a Grid Engine job's identity and its spooled environment file (see
 * geco_job.h for the rule; geco.jobkey is its Python twin).
 */
#define _GNU_SOURCE
#include "geco_job.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ID_DIGITS 19 /* digits of GECO_ID_MAX */

uint64_t geco_job_id(const char *s, size_t n)
{
    uint64_t v = 0;
    if (n == 0 || n > ID_DIGITS || s[0] == '0')
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (uint64_t)(s[i] - '0'); /* 19 digits cannot overflow */
    }
    return v;
}

uint64_t geco_task_id(const char *s, size_t n)
{
    /* not an array job: absent, "" (nothing to read), $ja_task_id 0, SGE_TASK_ID=undefined */
    if (s == NULL || n == 0 || (n == 1 && s[0] == '0')
        || (n == 9 && memcmp(s, "undefined", 9) == 0))
        return 1;
    return geco_job_id(s, n);
}

int geco_job_of(const char *job_text, const char *task_text, uint64_t *job, uint64_t *task)
{
    uint64_t j = job_text != NULL ? geco_job_id(job_text, strlen(job_text)) : 0;
    uint64_t t = geco_task_id(task_text, task_text != NULL ? strlen(task_text) : 0);
    if (j == 0 || t == 0)
        return -1;
    *job = j;
    *task = t;
    return 0;
}

/* The last JOB_ID= or SGE_TASK_ID= line seen so far: its value's first bytes, and its
   length (SIZE_MAX: longer than any id, so refused if it stays the last). */
struct last_line {
    int seen;
    char value[ID_DIGITS];
    size_t len;
};

static void remember(struct last_line *l, const char *value, size_t n, int cut)
{
    l->seen = 1;
    l->len = cut || n > sizeof l->value ? SIZE_MAX : n;
    if (l->len != SIZE_MAX)
        memcpy(l->value, value, n);
}

/* One line of `environment` (its first `n` bytes; `cut` = it was longer). */
static void take_line(const char *line, size_t n, int cut, struct last_line *job,
                      struct last_line *task)
{
    if (n >= 7 && memcmp(line, "JOB_ID=", 7) == 0)
        remember(job, line + 7, n - 7, cut);
    else if (n >= 12 && memcmp(line, "SGE_TASK_ID=", 12) == 0)
        remember(task, line + 12, n - 12, cut);
}

int geco_job_from_environment(const char *path, uint64_t *job, uint64_t *task, int *sys_errno)
{
    /* The file is read in small chunks and only the first 64 bytes of each line are
       kept: both lines we need fit, the file may be any size, and the stack stays small
       even in a thread with a tiny stack. */
    char chunk[2048];
    char head[64];
    size_t hl = 0;
    int cut = 0, rc = GECO_ENV_OK, fd;
    struct last_line job_line = {0}, task_line = {0};
    struct stat st;

    *sys_errno = 0;
    /* O_NONBLOCK: a FIFO planted as `environment` must not hang the exec */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        *sys_errno = errno;
        rc = GECO_ENV_E_OPEN;
        goto cleanup;
    }
    if (fstat(fd, &st) != 0) {
        *sys_errno = errno;
        rc = GECO_ENV_E_READ;
        goto cleanup;
    }
    if (!S_ISREG(st.st_mode)) {
        *sys_errno = EINVAL;
        rc = GECO_ENV_E_READ;
        goto cleanup;
    }
    for (;;) {
        ssize_t got = read(fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            *sys_errno = errno;
            rc = GECO_ENV_E_READ;
            goto cleanup;
        }
        if (got == 0)
            break;
        for (ssize_t i = 0; i < got; i++) {
            if (chunk[i] == '\n') {
                take_line(head, hl, cut, &job_line, &task_line);
                hl = 0;
                cut = 0;
            } else if (hl < sizeof head) {
                head[hl++] = chunk[i];
            } else {
                cut = 1;
            }
        }
    }
    if (hl > 0) /* a last line without '\n' */
        take_line(head, hl, cut, &job_line, &task_line);

    uint64_t j = geco_job_id(job_line.value, job_line.len);
    uint64_t t = geco_task_id(task_line.seen ? task_line.value : NULL, task_line.len);
    rc = !job_line.seen ? GECO_ENV_E_NO_JOB
         : j == 0       ? GECO_ENV_E_BAD_JOB
         : t == 0       ? GECO_ENV_E_BAD_TASK
                        : GECO_ENV_OK;
    if (rc == GECO_ENV_OK) {
        *job = j;
        *task = t;
    }
cleanup:
    if (fd >= 0)
        close(fd);
    return rc;
}

const char *geco_env_strerror(int result)
{
    /* the refusals' words are geco.jobkey's (tests/vectors/job_identity.json); the
       results are 0 down, so the words are indexed by -result */
    static const char *const words[] = {
        [-GECO_ENV_OK] = "ok",
        [-GECO_ENV_E_OPEN] = "cannot open it",
        [-GECO_ENV_E_READ] = "cannot read it as a regular file",
        [-GECO_ENV_E_NO_JOB] = "it has no JOB_ID= line",
        [-GECO_ENV_E_BAD_JOB] = "JOB_ID must be a number from 1 to 9999999999999999999, digits "
                                "only, no leading zero",
        [-GECO_ENV_E_BAD_TASK] = "SGE_TASK_ID must be \"undefined\", 0 or a number from 1 to "
                                 "9999999999999999999, digits only, no leading zero",
    };
    return result <= 0 && (size_t)-result < sizeof words / sizeof words[0] ? words[-result]
                                                                           : "unknown error";
}
