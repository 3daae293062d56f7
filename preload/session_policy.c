/*
 * session_policy.c - what runs when gecod does not place an ssh session's process
 * (session_policy=; the admins; the bypass file).
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "preload.h"

/* The first bytes of a cgroup path that decide whether it is a job's: a job_cgroups prefix
   (JOB_CGROUP_MAX), '/', <job>.<task> (20 digits each at most), what follows. */
#define JOB_PATH_HEAD (JOB_CGROUP_MAX + 48)

/* Is the cgroup path (its first n bytes; cut: it goes on) one of geco's job cgroups or
   below one: a job_cgroups prefix, then a component that is exactly <digits>.<digits>?
   Returns the length of the path up to that component, 0 when it is not a job's. */
static size_t job_cgroup_path(const char *path, size_t n, int cut)
{
    for (unsigned i = 0; i < cfg.njob_cgroups; i++) {
        size_t at = strlen(cfg.job_cgroups[i]), digits;
        if (n <= at || memcmp(path, cfg.job_cgroups[i], at) != 0 || path[at] != '/')
            continue;
        for (digits = 0, at++; at < n && path[at] >= '0' && path[at] <= '9'; at++)
            digits++;
        if (digits == 0 || digits > 20 || at == n || path[at] != '.')
            continue;
        for (digits = 0, at++; at < n && path[at] >= '0' && path[at] <= '9'; at++)
            digits++;
        if (digits == 0 || digits > 20)
            continue;
        if (at < n ? path[at] == '/' : !cut)
            return at;
    }
    return 0;
}

/*
 * Does the kernel show this process inside one of geco's job cgroups? Any line of
 * /proc/self/cgroup counts ("<id>:<controllers>:<path>", v1 and v2 alike): only root
 * moves a process into a job cgroup (gecod, or PAM's helper deciding while gecod was
 * down), never the process's user. The paths are as sshd's cgroup namespace shows them.
 * Read in chunks, keeping JOB_PATH_HEAD bytes of each path: no malloc, no stdio.
 * Returns 1 with the job's cgroup in where[cap] (cap > JOB_PATH_HEAD), else 0 (not in one,
 * or the file could not be read: then it is not shown to be).
 */
static int in_job_cgroup(char *where, size_t cap)
{
    char chunk[1024], path[JOB_PATH_HEAD];
    size_t pl = 0, len = 0;
    unsigned colons = 0;
    int cut = 0, fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC | O_NOCTTY);

    if (fd < 0)
        return 0;
    while (len == 0) {
        ssize_t got = read(fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        for (ssize_t i = 0; i < got && len == 0; i++) {
            if (chunk[i] == '\n') {
                len = colons == 2 ? job_cgroup_path(path, pl, cut) : 0;
                pl = 0;
                colons = 0;
                cut = 0;
            } else if (colons < 2) {
                colons += chunk[i] == ':';
            } else if (pl < sizeof path) {
                path[pl++] = chunk[i];
            } else {
                cut = 1;
            }
        }
    }
    close(fd);
    if (len == 0 || len >= cap)
        return 0;
    memcpy(where, path, len);
    where[len] = '\0';
    return 1;
}

/* One of [ssh] admins or admin_groups, as rendered into session_admin_uids/gids: the real
   uid, or the real, effective or a supplementary gid. Up to 1024 supplementary groups are
   looked at (getgroups refuses a smaller array than the process's groups: then only the
   real and effective gids count). */
static int session_admin(void)
{
    gid_t groups[1024];
    uid_t uid = getuid();
    int n;

    for (unsigned i = 0; i < cfg.nadmin_uids; i++)
        if (cfg.admin_uids[i] == uid)
            return 1;
    if (cfg.nadmin_gids == 0)
        return 0;
    n = getgroups((int)(sizeof groups / sizeof groups[0]), groups);
    for (unsigned i = 0; i < cfg.nadmin_gids; i++) {
        if (cfg.admin_gids[i] == getgid() || cfg.admin_gids[i] == getegid())
            return 1;
        for (int g = 0; g < n; g++)
            if (cfg.admin_gids[i] == groups[g])
                return 1;
    }
    return 0;
}

/*
 * gecod did not place this session's process. Fail closed: a node whose PAM stack lacks
 * pam_geco would otherwise run the user's shell outside every job whenever the user
 * keeps gecod from answering (fills their own share of its public socket) or it is down.
 * In order:
 *   1. session_policy=allow: it runs where it is (the site chose so);
 *   2. session_policy=in-job: it runs when the kernel shows it in a job's cgroup already
 *      (PAM's helper adopted it; see in_job_cgroup());
 *   3. refuse and in-job: it runs for an admin (session_admin()) and while the bypass
 *      file exists, as PAM's helper lets them in (geco.hooks.pam);
 *   4. else it does not run.
 * Appends the rule that decided to l. Returns 1: go on, 0: refuse.
 */
int unplaced_may_run(line_t *l)
{
    static const char *const names[] = {"refuse", "in-job", "allow"};
    char where[JOB_PATH_HEAD + 1];
    struct stat st;
    int rc = 1;

    if (cfg.session_policy == SESSION_ALLOW) {
        put(l, "; it runs where it is");
    } else if (cfg.session_policy == SESSION_IN_JOB && in_job_cgroup(where, sizeof where)) {
        put(l, "; it runs where PAM put it, in job cgroup ");
        put(l, where);
    } else if (session_admin()) {
        put(l, "; it runs where it is, an admin's session");
    } else if (stat(cfg.session_bypass, &st) == 0) {
        put(l, "; it runs where it is: the bypass file ");
        put(l, cfg.session_bypass);
        put(l, " exists");
    } else {
        put(l, cfg.session_policy == SESSION_IN_JOB
                   ? "; refused: not in a job's cgroup, not an admin, no bypass file"
                   : "; refused: not an admin, no bypass file");
        rc = 0;
    }
    put(l, " (session_policy=");
    put(l, names[cfg.session_policy]);
    put(l, ")");
    return rc;
}
