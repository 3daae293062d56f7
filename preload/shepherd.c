/*
 * shepherd.c - sge_execd's gate: before it execs a program of exec_filter (sge_shepherd),
 * the process asks gecod to put itself into the job its spool dir's environment file
 * names (JOB_STARTED with its own pid; the exec keeps the pid), and execs only after the
 * verified ack, inside the job's mount namespace when it has one (join_mntns()). When
 * that fails, the policy decides (refuse_or_allow()).
 */
#define _GNU_SOURCE

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <unistd.h>

#include "geco_client.h"
#include "geco_job.h"
#include "geco_mntns.h"
#include "geco_proto.h"
#include "preload.h"

/* The errno of a refused exec (policy=refuse): "resource temporarily
   unavailable, try again later" is what a missing quarantine is. */
#define GECO_REFUSE_ERRNO EAGAIN
#define GECO_REFUSE_ERRNO_NAME "EAGAIN"

/* The quarantine request failed; `l` says why. Apply the policy. */
static int refuse_or_allow(line_t *l)
{
    if (cfg.policy_allow) {
        put(l, "; starting it without quarantine (policy=allow)");
        emit(4, l->buf, l->len);
        return 0;
    }
    put(l, "; exec refused (policy=refuse, errno " GECO_REFUSE_ERRNO_NAME ")");
    emit(3, l->buf, l->len);
    errno = GECO_REFUSE_ERRNO;
    return -1;
}

/* Into the job's mount namespace (its private /tmp and /dev/shm) when gecod made one:
   this process is single-threaded (execd's fork) and root, as setns needs. A job without
   a pin started without one (before [tmp] private): it runs as it began. */
static int join_mntns(const char *name, uint64_t job, uint64_t task, uint32_t pid)
{
    char buf[1024], path[PATH_MAX];
    line_t l = {buf, sizeof buf, 0};
    const char *step;

    if (geco_join_mntns(cfg.job_mntns, job, task, path, sizeof path, &step) >= 0)
        return 0;
    int err = errno;
    put_job(&l, name, job, task, pid);
    put(&l, ": cannot enter the job's private /tmp (");
    put(&l, step);
    put(&l, " ");
    put(&l, path);
    put(&l, "): ");
    put_errno(&l, err);
    return refuse_or_allow(&l);
}

/* Ask gecod to quarantine this process before it execs `name`. */
int quarantine(const char *name)
{
    char buf[1024], cwd[PATH_MAX];
    line_t l = {buf, sizeof buf, 0};
    uint32_t pid = (uint32_t)getpid();
    uint64_t job = 0, task = 0;
    int sys_errno = 0, r;
    geco_client_outcome_t out;

    r = geco_job_from_environment("environment", &job, &task, &sys_errno);
    if (r != GECO_ENV_OK) {
        put_job(&l, name, 0, 0, pid);
        put(&l, ": cannot tell its job: ");
        put(&l, getcwd(cwd, sizeof cwd) != NULL ? cwd : ".");
        put(&l, "/environment: ");
        put(&l, geco_env_strerror(r));
        if (sys_errno != 0) {
            put(&l, ": ");
            put_errno(&l, sys_errno);
        }
        return refuse_or_allow(&l);
    }
    r = geco_client_job_started(&cfg.addr, cfg.secret.key, cfg.timeout_ms, cfg.max_skew_ns, job, task,
                                pid, &out);
    if (r == GECO_CLIENT_OK)
        return join_mntns(name, job, task, pid);

    put_job(&l, name, job, task, pid);
    put(&l, ": quarantine by gecod at ");
    put(&l, cfg.socket_text);
    put(&l, " failed: ");
    switch (r) {
    case GECO_CLIENT_E_TIMEOUT:
        put(&l, "no reply within timeout_ms=");
        put_u64(&l, (uint64_t)cfg.timeout_ms);
        put(&l, " (waiting for ");
        put(&l, out.phase);
        put(&l, ")");
        break;
    case GECO_CLIENT_E_FRAME:
        put(&l, "reply rejected: ");
        put(&l, geco_strerror(out.proto_err));
        break;
    case GECO_CLIENT_E_STATUS:
        put(&l, "gecod answered ");
        put(&l, geco_status_name(out.status));
        put(&l, " (its journal says why)");
        break;
    case GECO_CLIENT_E_MISMATCH:
        put(&l, "the ack names job ");
        put_u64(&l, out.ack.job_id);
        put(&l, ".");
        put_u64(&l, out.ack.task_id);
        break;
    default:
        put(&l, geco_client_strresult(r));
        if (out.sys_errno != 0) {
            put(&l, ": ");
            put_errno(&l, out.sys_errno);
        }
        if (r == GECO_CLIENT_E_CONNECT
            && (out.sys_errno == ENOENT || out.sys_errno == ECONNREFUSED))
            put(&l, " (is gecod running?)");
        break;
    }
    if (out.attempts > 1) {
        put(&l, " (after ");
        put_u64(&l, out.attempts);
        put(&l, " attempts)");
    }
    return refuse_or_allow(&l);
}
